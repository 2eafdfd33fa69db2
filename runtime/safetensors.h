// Reading and writing the safetensors format, with the tensor names PyTorch uses, so a user runs
// `safetensors.torch.save_file(model.state_dict(), "w.safetensors")` (or our tools/ exporter) and
// loads the result here:
//
//   dbrq::NamedTensors w = dbrq::load_safetensors("resnet18.safetensors");
//   model->load_state_dict(w);                           // strict by default
//   dbrq::save_safetensors("out.safetensors", model->state_dict());
//
// Dtypes: F32, F16, BF16, I64, I32, U8, I8. F16 loads as f32 (dbrq has no f16 tensors); BF16
// loads as bf16 and load_state_dict converts it. Untrusted input is safe: a malformed file (bad
// header length, bad JSON, offsets out of range, truncated data, sizes that overflow) raises
// FileFormatError naming the file and the problem, and header sizes and allocations are capped.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "runtime/module.h"
#include "core/tensor.h"

namespace dbrq {

struct SafetensorsLimits {
  uint64_t max_header_bytes = 100ull << 20;   // the JSON header
  uint64_t max_total_bytes = 16ull << 30;     // all tensor data together
  size_t max_tensors = 1u << 20;
};

// Tensors in file order (by data offset). `source` names the data in error messages.
NamedTensors load_safetensors(const std::string& path, const SafetensorsLimits& limits = {});
NamedTensors parse_safetensors(std::string_view bytes, const std::string& source = "<buffer>",
                               const SafetensorsLimits& limits = {});
// The "__metadata__" string map of a file (empty when absent).
std::map<std::string, std::string> load_safetensors_metadata(const std::string& path);

// Writes tensors (any layout; stored contiguous) in the given order. Quantization parameters are
// not part of the format and are dropped. Throws IOError when the file cannot be written.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});
std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});

}  // namespace dbrq
