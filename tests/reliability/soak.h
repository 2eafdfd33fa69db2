// The memory soak: many inferences of a converted model, watching the process's resident memory.
//
//   dbrq::testing::SoakOptions o;            // small_cnn, 100,000 inferences after 2,000 warm-up
//   dbrq::testing::SoakResult r = dbrq::testing::run_soak(o);
//   std::cout << r.summary();                // "... VmRSS 41232 kB -> 41240 kB (+0.02%) ..."
//
// Every inference gets a fresh input tensor (as a server's requests would) of a batch size that
// cycles through `batch_sizes`. Resident memory (VmRSS from /proc/self/status) is read after the
// warm-up and then at evenly spaced points; growth is end versus after-warm-up. The output for one
// fixed input is checked bit-identical at the end.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dbrq::testing {

struct SoakOptions {
  std::string model = "small_cnn";  // a zoo model (tiny variant)
  int64_t iterations = 100000;      // inferences after the warm-up
  int64_t warmup = 2000;
  std::vector<int64_t> batch_sizes = {1, 2, 4, 1};
  int samples = 20;                 // RSS readings after the warm-up
};

struct SoakResult {
  int64_t rss_before_warmup_kb = 0;  // converted model built, nothing run yet
  int64_t rss_after_warmup_kb = 0;
  int64_t rss_end_kb = 0;
  int64_t rss_max_kb = 0;            // over the readings after the warm-up
  std::vector<std::pair<int64_t, int64_t>> trace;  // (inferences done, VmRSS kB)
  double growth_percent = 0.0;       // (end - after warm-up) / after warm-up
  double max_growth_percent = 0.0;   // (max - after warm-up) / after warm-up
  double seconds = 0.0;              // the measured iterations
  double us_per_inference = 0.0;
  bool output_stable = false;        // the fixed input's output is bit-identical at the end
  uint64_t allocator_bytes_cached = 0, allocator_bytes_in_use = 0;  // dbrq's caching allocator, at the end
  std::string summary() const;
};

// VmRSS of this process in kB (0 when /proc is unavailable).
int64_t vm_rss_kb();

SoakResult run_soak(const SoakOptions& options);

}  // namespace dbrq::testing
