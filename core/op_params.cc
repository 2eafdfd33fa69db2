#include "core/op_params.h"

namespace dbrq {

const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::kConv2d: return "conv2d";
    case OpKind::kLinear: return "linear";
    case OpKind::kEmbedding: return "embedding";
    case OpKind::kBatchNorm: return "batch_norm";
    case OpKind::kLayerNorm: return "layer_norm";
    case OpKind::kMatmul: return "matmul";
    case OpKind::kAdd: return "add";
    case OpKind::kSub: return "sub";
    case OpKind::kMul: return "mul";
    case OpKind::kDiv: return "div";
    case OpKind::kRelu: return "relu";
    case OpKind::kRelu6: return "relu6";
    case OpKind::kHardtanh: return "hardtanh";
    case OpKind::kLeakyRelu: return "leaky_relu";
    case OpKind::kSigmoid: return "sigmoid";
    case OpKind::kTanh: return "tanh";
    case OpKind::kHardsigmoid: return "hardsigmoid";
    case OpKind::kHardswish: return "hardswish";
    case OpKind::kSilu: return "silu";
    case OpKind::kGelu: return "gelu";
    case OpKind::kClamp: return "clamp";
    case OpKind::kSoftmax: return "softmax";
    case OpKind::kLogSoftmax: return "log_softmax";
    case OpKind::kMaxPool2d: return "max_pool2d";
    case OpKind::kAvgPool2d: return "avg_pool2d";
    case OpKind::kAdaptiveAvgPool2d: return "adaptive_avg_pool2d";
    case OpKind::kMean: return "mean";
    case OpKind::kSum: return "sum";
    case OpKind::kStd: return "std";
    case OpKind::kCat: return "cat";
    case OpKind::kFlatten: return "flatten";
    case OpKind::kReshape: return "reshape";
    case OpKind::kPermute: return "permute";
    case OpKind::kTranspose: return "transpose";
    case OpKind::kNarrow: return "narrow";
    case OpKind::kSelect: return "select";
    case OpKind::kUnsqueeze: return "unsqueeze";
    case OpKind::kSqueeze: return "squeeze";
    case OpKind::kContiguous: return "contiguous";
    case OpKind::kDropout: return "dropout";
    case OpKind::kIdentity: return "identity";
    case OpKind::kClone: return "clone";
    case OpKind::kTo: return "to";
    case OpKind::kCopy: return "copy_";
    case OpKind::kFill: return "fill_";
    case OpKind::kQuantize: return "quantize";
    case OpKind::kDequantize: return "dequantize";
    case OpKind::kNumOpKinds: break;
  }
  return "unknown_op";
}

}  // namespace dbrq
