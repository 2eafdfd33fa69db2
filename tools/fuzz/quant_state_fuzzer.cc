// libFuzzer target: the quant-state JSON reader (check_quant_state / quant_state_from_json) against
// a small prepared model, then convert and run what loaded (see fuzz_targets.h).
//   tools/fuzz/run.sh quant_state 600
#include "tools/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dbrq::set_log_level("error");  // expected warnings (NaN statistics, unsupported ops) are noise here
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dbrq::fuzz::run_quant_state_input(data, size);
  return 0;
}
