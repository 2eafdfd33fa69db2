// Op kinds and their non-tensor parameters, shared by the functional API, the kernels and the
// quantization tracer.
//
//   dbrq::Conv2dParams p;
//   p.stride = {2, 2};
//   p.padding = {3, 3};
//   dbrq::Tensor y = dbrq::conv2d(x, w, b, p);
//   std::cout << dbrq::op_name(dbrq::OpKind::kConv2d);   // "conv2d"
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dbrq {

// Every op that passes through the dispatcher. Names (op_name) follow PyTorch's functional names.
enum class OpKind : uint16_t {
  // compute ops with weights
  kConv2d,
  kLinear,
  kEmbedding,
  kBatchNorm,
  kLayerNorm,
  // matrix product of two activations
  kMatmul,
  // binary elementwise (tensor-tensor or tensor-scalar)
  kAdd,
  kSub,
  kMul,
  kDiv,
  // unary elementwise
  kRelu,
  kRelu6,
  kHardtanh,
  kLeakyRelu,
  kSigmoid,
  kTanh,
  kHardsigmoid,
  kHardswish,
  kSilu,
  kGelu,
  kClamp,
  // normalizing reductions
  kSoftmax,
  kLogSoftmax,
  // pooling
  kMaxPool2d,
  kAvgPool2d,
  kAdaptiveAvgPool2d,
  // reductions
  kMean,
  kSum,
  kStd,
  // joining and shape ops (int8 passes through the shape ops unchanged)
  kCat,
  kFlatten,
  kReshape,
  kPermute,
  kTranspose,
  kNarrow,
  kSelect,
  kUnsqueeze,
  kSqueeze,
  kContiguous,
  kDropout,
  kIdentity,
  // data movement
  kClone,
  kTo,
  kCopy,
  kFill,
  // explicit (de)quantization
  kQuantize,
  kDequantize,
  kNumOpKinds,
};

const char* op_name(OpKind kind);

struct Conv2dParams {
  std::array<int64_t, 2> stride = {1, 1};
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> dilation = {1, 1};
  int64_t groups = 1;
};

struct Pool2dParams {
  std::array<int64_t, 2> kernel_size = {1, 1};
  std::array<int64_t, 2> stride = {1, 1};  // PyTorch's default stride = kernel_size; set by callers
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> dilation = {1, 1};  // max pooling only
  bool ceil_mode = false;
  bool count_include_pad = true;  // average pooling only
};

struct AdaptivePool2dParams {
  std::array<int64_t, 2> output_size = {1, 1};
};

struct NormParams {
  double eps = 1e-5;
  std::vector<int64_t> normalized_shape;  // layer_norm only
};

struct DimParams {
  std::vector<int64_t> dims;  // softmax/cat/flatten/...: the dims the op works on
  bool keepdim = false;       // reductions
  bool unbiased = true;       // std
};

struct ShapeParams {
  std::vector<int64_t> sizes;  // reshape target (may contain one -1), permute order, ...
  int64_t start = 0;           // narrow / select / flatten start
  int64_t length = 0;          // narrow length / flatten end
};

struct ActivationParams {
  double alpha = 0.0;  // leaky_relu slope, hardtanh/clamp min
  double beta = 0.0;   // hardtanh/clamp max
  bool approximate_tanh = false;  // gelu
};

struct DropoutParams {
  double p = 0.5;
  bool training = false;
};

struct QuantParams;

struct ConvertParams {
  int dtype = 0;          // DType as int, for kTo / kQuantize
  int memory_format = 0;  // MemoryFormat as int, for kContiguous
  std::shared_ptr<const QuantParams> qparams;  // kQuantize
  double value = 0.0;     // kFill
};

}  // namespace dbrq
