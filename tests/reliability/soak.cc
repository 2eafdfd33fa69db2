#include "tests/reliability/soak.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "dbrq.h"
#include "samples/zoo/zoo.h"
#include "tests/reliability/reliability_util.h"

namespace dbrq::testing {

int64_t vm_rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

std::string SoakResult::summary() const {
  std::ostringstream os;
  os << "VmRSS before warm-up " << rss_before_warmup_kb << " kB, after warm-up " << rss_after_warmup_kb << " kB, end "
     << rss_end_kb << " kB, max " << rss_max_kb << " kB; growth " << growth_percent << "% (max " << max_growth_percent
     << "%); " << us_per_inference << " us/inference over " << seconds << " s; output "
     << (output_stable ? "bit-identical" : "CHANGED") << " at the end; allocator cache " << allocator_bytes_cached
     << " B idle, " << allocator_bytes_in_use << " B in use\nVmRSS trace (inferences, kB):";
  for (const auto& [n, kb] : trace) os << " (" << n << ", " << kb << ")";
  return os.str();
}

SoakResult run_soak(const SoakOptions& o) {
  const zoo::ModelSpec& spec = zoo::find_model(o.model);
  manual_seed(1);
  std::shared_ptr<nn::Module> model = spec.make(zoo::Variant::kTiny);
  model->eval();
  auto input = [&](int64_t batch, uint64_t seed) { return spec.example_input(zoo::Variant::kTiny, batch, seed); };
  prepare(*model, {input(2, 1)});
  for (uint64_t seed = 10; seed < 18; ++seed) spec.run(*model, input(2, seed));
  convert(*model);
  const Tensor fixed = input(2, 99);

  SoakResult r;
  r.rss_before_warmup_kb = vm_rss_kb();
  const Tensor first = spec.run(*model, fixed);
  uint64_t seed = 1000;
  auto step = [&](int64_t i) {
    const int64_t batch = o.batch_sizes[static_cast<size_t>(i) % o.batch_sizes.size()];
    const Tensor y = spec.run(*model, input(batch, seed++));
    if (y.numel() == 0) std::abort();  // keeps the result used
  };
  for (int64_t i = 0; i < o.warmup; ++i) step(i);
  r.rss_after_warmup_kb = r.rss_max_kb = vm_rss_kb();
  r.trace.push_back({0, r.rss_after_warmup_kb});
  const int64_t every = std::max<int64_t>(1, o.iterations / std::max(1, o.samples));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.iterations; ++i) {
    step(i);
    if ((i + 1) % every == 0 || i + 1 == o.iterations) {
      const int64_t kb = vm_rss_kb();
      r.rss_max_kb = std::max(r.rss_max_kb, kb);
      if (r.trace.back().first != i + 1) r.trace.push_back({i + 1, kb});
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.us_per_inference = o.iterations > 0 ? 1e6 * r.seconds / static_cast<double>(o.iterations) : 0.0;
  r.rss_end_kb = r.trace.back().second;
  const double base = static_cast<double>(std::max<int64_t>(1, r.rss_after_warmup_kb));
  r.growth_percent = 100.0 * static_cast<double>(r.rss_end_kb - r.rss_after_warmup_kb) / base;
  r.max_growth_percent = 100.0 * static_cast<double>(r.rss_max_kb - r.rss_after_warmup_kb) / base;
  r.output_stable = bit_identical(spec.run(*model, fixed), first);
  const AllocatorStats a = allocator_stats();
  r.allocator_bytes_cached = a.bytes_cached;
  r.allocator_bytes_in_use = a.bytes_in_use;
  return r;
}

}  // namespace dbrq::testing
