// ONNX export of a converted model's recorded program: an ONNX QDQ graph (opset 17) that ONNX
// Runtime runs, with dbrq's quantization parameters.
//
//   dbrq::prepare(*model, {example}, dbrq::default_qconfig_mapping("onednn"));
//   for (auto& batch : calibration) (*model)(batch);
//   dbrq::convert(*model);
//   dbrq::export_onnx(*model, {example}, "model.onnx");
//
// The export runs the converted model once on `example_inputs` and writes the ops that call
// executes, in NCHW semantics whatever layout dbrq keeps activations in:
//   - every int8 tensor of dbrq is a QuantizeLinear -> DequantizeLinear pair with dbrq's scale and
//     zero point (u8); an int8 op is its float ONNX op between DequantizeLinear inputs and a
//     QuantizeLinear output (the QDQ form ONNX Runtime fuses into QLinearConv, QGemm, QLinearAdd,
//     QLinearConcat, QLinearGlobalAveragePool, ...);
//   - conv / linear weights are s8 initializers (batch norm folded in, exactly the codes dbrq runs)
//     with per-channel scales (DequantizeLinear axis 0), biases s32 with scale input x weight scale;
//   - fused chains become their ops in order (Conv -> Relu -> QuantizeLinear; Conv -> Add -> Relu
//     -> QuantizeLinear for a residual add); fp32 ops are plain float ops.
// Shapes are the example's (batch size included). A model with several control-flow paths
// exports the path `example_inputs` take. docs/onnx_export.md lists what maps to what.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "runtime/module.h"

namespace dbrq {

struct OnnxExportOptions {
  std::string graph_name = "dbrq";
  std::string doc_string;  // stored in the model
  // Also output, for each model output dbrq computes in fp32 from an int8 tensor (a final layer
  // norm, ...), that int8 tensor (dequantized) as "<output>_int8_input": for comparing another
  // runtime with dbrq at the last int8 tensor (tools/onnx/interop_check.sh).
  bool int8_inputs_of_fp32_outputs = false;
};

// What an export wrote.
struct OnnxExportSummary {
  int64_t nodes = 0;             // nodes in the graph
  int64_t quantize_nodes = 0;    // QuantizeLinear nodes (one per int8 tensor, plus requantizations)
  int64_t initializers = 0;
  int64_t bytes = 0;             // size of the serialized model
  // Per graph output: the scale of dbrq's int8 tensor it dequantizes (one quantization step), or 0
  // when dbrq computes it in fp32.
  std::vector<float> output_scales;
  std::vector<std::string> output_names;  // per graph output ("output_0", ...)
  // Per graph output: dbrq's value of it in the export's call (the int8 ones dequantized).
  std::vector<Tensor> output_values;
  // Modules (fqn) that have run more than one control-flow path (calibrated, or run fp32 after
  // convert): the graph holds only the path the example took through them (logged at warning level
  // too).
  std::vector<std::string> modules_with_other_paths;
};

// Writes `model` (prepared and converted) as an ONNX file at `path`, atomically (a temporary file
// next to it, renamed when complete: a failed export leaves no file behind).
// Throws UsageError when the model is not prepared or not converted, ValueError naming the op
// (and the layer or module running it) when an op the example runs has no ONNX form here, IOError
// when `path` cannot be written.
OnnxExportSummary export_onnx(nn::Module& model, const std::vector<Tensor>& example_inputs, const std::string& path,
                              const OnnxExportOptions& options = {});

// The same, returning the serialized ONNX ModelProto instead of writing a file.
std::string export_onnx_bytes(nn::Module& model, const std::vector<Tensor>& example_inputs,
                              const OnnxExportOptions& options = {}, OnnxExportSummary* summary = nullptr);

}  // namespace dbrq
