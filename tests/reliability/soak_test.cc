// A short version of the memory soak for CI (the full 100,000-inference run is
// //tests/reliability:soak; its numbers are in docs/reliability.md): resident memory after a
// warm-up must not grow by 1% or more over the following inferences, and the output for a fixed
// input must not change. Under AddressSanitizer the allocator quarantines freed memory, so RSS
// says nothing there; that build runs a few hundred inferences for LeakSanitizer and checks the
// output only.
#include <gtest/gtest.h>

#include <iostream>

#include "dbrq.h"
#include "tests/reliability/reliability_util.h"
#include "tests/reliability/soak.h"

namespace dbrq::testing {
namespace {

// One OpenMP thread per call: Bazel runs tests side by side on few cores, and OpenMP teams
// waiting for a descheduled member made inferences 100x slower there. Memory behaves the same.
class Soak : public ::testing::Test {
 protected:
  void SetUp() override { set_num_threads(1); }
};

TEST_F(Soak, SmallCnnResidentMemoryDoesNotGrowAfterWarmUp) {
  SoakOptions o;
  o.warmup = kUnderAsan ? 100 : 2000;
  o.iterations = kUnderAsan ? 300 : 20000;
  o.samples = 10;
  const SoakResult r = run_soak(o);
  std::cout << "[soak] small_cnn " << o.iterations << " inferences: " << r.summary() << std::endl;
  EXPECT_TRUE(r.output_stable);
  ASSERT_GT(r.rss_after_warmup_kb, 0) << "no /proc/self/status";
  if (!kUnderAsan) {
    EXPECT_LT(r.growth_percent, 1.0) << r.summary();
  }
}

TEST_F(Soak, ResNet18TinyResidentMemoryDoesNotGrowAfterWarmUp) {
  SoakOptions o;
  o.model = "resnet18";
  o.warmup = kUnderAsan ? 20 : 200;
  o.iterations = kUnderAsan ? 40 : 1000;
  o.samples = 10;
  const SoakResult r = run_soak(o);
  std::cout << "[soak] resnet18 " << o.iterations << " inferences: " << r.summary() << std::endl;
  EXPECT_TRUE(r.output_stable);
  if (!kUnderAsan) {
    EXPECT_LT(r.growth_percent, 1.0) << r.summary();
  }
}

}  // namespace
}  // namespace dbrq::testing
