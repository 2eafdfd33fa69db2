// A read-only view of what quantization recorded and decided for a prepared model: every seen op
// in the order the first run executed it, with its role, the dtypes it runs with, and after
// convert the quantization parameters of its inputs, output and (conv, linear) weights.
//
//   for (const dbrq::QuantizedOpInfo& op : dbrq::quantized_ops(*model)) {
//     std::cout << op.module << " #" << op.index << " " << op.op << ": " << op.executor << "\n";
//     if (op.weight_qparams) std::cout << "  weight scales: " << op.weight_qparams->scales.size() << "\n";
//   }
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "runtime/module.h"
#include "runtime/ops.h"

namespace dbrq {

struct QuantizedOpInfo {
  std::string module;       // fqn of the module whose forward ran it ("layer1.0"; "" for the model)
  std::string module_type;  // that module's class ("BasicBlock")
  int index = 0;            // position among that module's seen ops
  OpKind kind = OpKind::kNumOpKinds;
  std::string op;           // "conv2d"; on the first op of a fused chain, the chain ("conv2d+batch_norm+relu")
  std::string fqn;          // the layer that ran it ("layer1.0.conv1"), or the module for functional ops
  std::string role;         // quant_role_name: "weighted", "share", "lut", ..., "fp32"
  int fused_into = -1;      // index of the chain's first op when this op runs inside it, else -1
  // A functional op: its call's index among the module's calls of its kind, the address of
  // QConfigMapping::set_module_name_object_type_order(module, kind, order, ..); -1 for a layer's
  // op or one read from a quant-state file.
  int order = -1;
  bool dynamic = false;     // dynamic quantization (activation parameters per call)
  std::vector<DType> input_dtypes;  // activation inputs at inference (u8 when quantized)
  DType output_dtype = DType::kF32;
  // After convert (null before it, and for f32 tensors):
  std::vector<QuantParamsPtr> input_qparams;
  QuantParamsPtr output_qparams;
  QuantParamsPtr weight_qparams;  // conv / linear: of the s8 weights, batch norm folded in
  std::string executor;           // what runs it: "int8 conv2d [..]+relu", "fused into ...", "fp32 (...)"
};

// Throws UsageError when `model` is not prepared.
std::vector<QuantizedOpInfo> quantized_ops(const nn::Module& model);
// Distinct observers of a prepared model (one shared by several tensors counts once).
int num_observers(const nn::Module& model);
// Ops that calls of a converted model ran in fp32 because their path was never calibrated.
int64_t uncalibrated_ops(const nn::Module& model);

}  // namespace dbrq
