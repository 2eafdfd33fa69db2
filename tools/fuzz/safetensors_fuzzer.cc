// libFuzzer target: dbrq::parse_safetensors on untrusted bytes (see fuzz_targets.h).
//   tools/fuzz/run.sh safetensors 600
#include "tools/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dbrq::set_log_level("error");  // expected warnings (NaN statistics, unsupported ops) are noise here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dbrq::fuzz::run_safetensors_input(data, size);
  return 0;
}
