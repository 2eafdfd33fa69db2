// The bodies of dbrq's fuzz targets, shared by the libFuzzer binaries (tools/fuzz/*_fuzzer.cc,
// built with clang by tools/fuzz/run.sh) and by the corpus replay / regression tests in
// tests/reliability (built by Bazel with gcc, also under ASan + UBSan).
//
//   dbrq::fuzz::run_safetensors_input(data, size);   // parse_safetensors on untrusted bytes
//   dbrq::fuzz::run_quant_state_input(data, size);   // quant_state_from_json / check_quant_state
//
// A target returns normally when the input is accepted or rejected with a dbrq::Error. Anything
// else is a finding: a crash or sanitizer report, any other exception (std::bad_alloc,
// nlohmann::json::exception, std::out_of_range, ...), or a broken invariant, which aborts through
// DBRQ_FUZZ_CHECK with a message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dbrq.h"

namespace dbrq::fuzz {

// The small model the quant-state target loads documents into: conv + bn + relu (fused), a conv
// whose output is added to its input (residual fusion), flatten, linear, and a sigmoid (fixed
// output parameters) added back: [N, 3, 4, 4] -> [N, 5].
struct TinyNet : nn::CallableModule<TinyNet> {
  TinyNet();
  Tensor forward(const Tensor& x);
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<nn::BatchNorm2dImpl> bn;
  std::shared_ptr<nn::ReLUImpl> relu;
  std::shared_ptr<nn::Conv2dImpl> conv2;
  std::shared_ptr<nn::LinearImpl> fc;
};

// Fixed weights (seeded) and non-trivial batch-norm statistics, in eval mode.
std::shared_ptr<TinyNet> make_tiny_net();
// Deterministic N(0, 1) input, [batch, 3, 4, 4].
Tensor tiny_input(int64_t batch, uint64_t seed);
// The qconfig mappings the quant-state target prepares TinyNet with: 0 = default ("onednn",
// 2048-bin histogram activations), 1 = MinMax activations, 2 = dynamic, 3 = 32-bin histogram
// activations (small documents that still carry histograms). Weights: per-channel MinMax.
constexpr int kNumMappings = 4;
QConfigMapping tiny_mapping(int which);
// A TinyNet prepared with tiny_mapping(which) (example input tiny_input(2, 0)), not calibrated.
std::shared_ptr<TinyNet> prepared_tiny_net(int which);
// A calibrated TinyNet's quant-state document (valid input for the quant-state target).
std::string tiny_quant_state(int which, bool include_observer_stats);

// Limits the safetensors target parses with (small, so the limit paths are reachable).
SafetensorsLimits fuzz_safetensors_limits();

void run_safetensors_input(const uint8_t* data, size_t size);
void run_quant_state_input(const uint8_t* data, size_t size);

}  // namespace dbrq::fuzz
