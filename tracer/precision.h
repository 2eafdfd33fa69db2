// Whether QConfig::bf16() ops really compute in bf16 on this machine.
//
//   auto mapping = dbrq::default_qconfig_mapping("onednn");
//   mapping.set_module_name("head", dbrq::QConfig::bf16());   // conv2d / linear / matmul in bf16
//   if (!dbrq::bf16_supported()) std::cout << "no AVX512_BF16: the head runs fp32\n";
//
// Detected at run time from the CPU (AVX512_BF16 or AMX-BF16). DBRQ_DISABLE_BF16=1 in the
// environment, or force_bf16_fallback(true), makes dbrq behave as on a CPU without it (fp32),
// e.g. to compare the two or to test the fallback.
#pragma once

namespace dbrq {

bool bf16_supported();
// Affects converted models' next calls (the choice is made per call); false restores detection.
void force_bf16_fallback(bool on);

}  // namespace dbrq
