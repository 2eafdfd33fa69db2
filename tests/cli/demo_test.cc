// The main demo end to end, as tools/run_demo.sh runs it: bundled digits weights and data,
// prepare -> calibrate -> save -> convert -> evaluate -> report, with its files in --out_dir.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "tests/cli/subprocess.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using dbrq::testing::RunResult;

RunResult demo(const std::vector<std::string>& args) {
  return dbrq::testing::run_binary(dbrq::testing::runfile("samples/demo/demo"), args);
}

TEST(Demo, DigitsEndToEnd) {
  const std::string dir = dbrq::testing::temp_path("demo_out");
  const RunResult r = demo({"--out_dir=" + dir, "--iters=5"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int step = 1; step <= 9; ++step) EXPECT_THAT(r.out, HasSubstr("[" + std::to_string(step) + "/9]"));
  EXPECT_THAT(r.out, HasSubstr("calibration split 256 images, held-back test split 360 images"));
  EXPECT_THAT(r.out, HasSubstr("latency, 1 image (median)"));
  EXPECT_THAT(r.out, HasSubstr("output SQNR int8 vs fp32"));
  // Accuracy of the trained model, fp32 and int8, on the held-back split.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("top-1 accuracy +([0-9.]+)% +([0-9.]+)%"))) << r.out;
  EXPECT_GE(std::stod(m[1]), 95.0);
  EXPECT_GE(std::stod(m[2]), 95.0);
  // Progress bars went to stderr as plain lines (not a terminal).
  EXPECT_THAT(r.err, HasSubstr("calibrating: 8/8 batches (100%)"));
  EXPECT_THAT(r.err, Not(HasSubstr("\r")));

  EXPECT_THAT(dbrq::testing::read_file(dir + "/digits_small_cnn.qstate.json"), HasSubstr("\"dbrq.quant_state\""));
  EXPECT_THAT(dbrq::testing::read_file(dir + "/digits_small_cnn.report.html"), HasSubstr("<svg"));
  EXPECT_THAT(dbrq::testing::read_file(dir + "/digits_small_cnn.report.csv"), HasSubstr("module_fqn,index,op"));
}

TEST(Demo, AnyZooModelBehindAFlag) {
  const std::string dir = dbrq::testing::temp_path("demo_zoo");
  const RunResult r = demo({"--model=resnet18", "--variant=tiny", "--out_dir=" + dir, "--iters=2", "--batch_size=2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("resnet18 (tiny)"));
  EXPECT_THAT(r.out, HasSubstr("output SQNR int8 vs fp32"));
  EXPECT_TRUE(dbrq::testing::file_exists(dir + "/resnet18.qstate.json"));
}

TEST(Demo, HelpAndUsageErrors) {
  RunResult r = demo({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--out_dir"));
  r = demo({"--bogus=1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown flag --bogus"));
  r = demo({"--model=nope"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown model"));
}

}  // namespace
