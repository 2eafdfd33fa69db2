// The full memory soak (docs/reliability.md): 100,000 inferences of the converted small CNN.
//
//   bazel run -c opt //tests/reliability:soak                          # defaults
//   bazel run -c opt //tests/reliability:soak -- --iterations=1000000 --model=resnet18
//
// Prints the VmRSS readings and exits 1 when resident memory grew by 1% or more after warm-up, or
// when the output for a fixed input changed.
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "tests/reliability/soak.h"

int main(int argc, char** argv) {
  dbrq::testing::SoakOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return a.compare(0, n, flag) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = value("--iterations=")) {
      o.iterations = std::atoll(v);
    } else if (const char* v = value("--warmup=")) {
      o.warmup = std::atoll(v);
    } else if (const char* v = value("--model=")) {
      o.model = v;
    } else if (const char* v = value("--samples=")) {
      o.samples = std::atoi(v);
    } else {
      std::cerr << "usage: soak [--iterations=N] [--warmup=N] [--model=small_cnn|resnet18|...] [--samples=N]\n";
      return 2;
    }
  }
  std::cout << "soak: " << o.model << " (tiny, converted), " << o.iterations << " inferences after " << o.warmup
            << " warm-up, batch sizes 1/2/4/1, a fresh input each time" << std::endl;
  const dbrq::testing::SoakResult r = dbrq::testing::run_soak(o);
  std::cout << r.summary() << std::endl;
  const bool ok = r.growth_percent < 1.0 && r.output_stable;
  std::cout << (ok ? "PASS" : "FAIL") << ": resident memory growth after warm-up " << r.growth_percent
            << "% (limit 1%)" << std::endl;
  return ok ? 0 : 1;
}
