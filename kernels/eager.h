// Eager kernels: what each op computes when nothing intercepts it. f32 compute on oneDNN
// primitives (cached by shape), plain loops for gathers and reshape-like ops; shape-only kernels
// (views, cat, pooling, copies) also take s8/u8 and keep quantization parameters.
//
//   dbrq::Tensor y = dbrq::kernels::conv2d(x, w, b, params, {dbrq::kernels::PostOp::relu()});
//
// Activations of 4-D ops come out channels-last (NHWC strides over NCHW sizes): consecutive convs,
// pools and elementwise ops then never reorder between each other.
#pragma once

#include <vector>

#include "core/op_params.h"
#include "core/tensor.h"

namespace dbrq::kernels {

// An elementwise step fused after a conv / linear / matmul.
struct PostOp {
  enum class Kind { kRelu, kClip, kHardswish, kSigmoid, kTanh, kGeluErf, kGeluTanh, kSilu, kLeakyRelu };
  Kind kind = Kind::kRelu;
  float alpha = 0.f, beta = 0.f;
  static PostOp relu() { return {Kind::kRelu, 0.f, 0.f}; }
  static PostOp clip(float lo, float hi) { return {Kind::kClip, lo, hi}; }
  static PostOp hardswish() { return {Kind::kHardswish, 0.f, 0.f}; }
};
using PostOps = std::vector<PostOp>;

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p, const PostOps& post = {});
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, const PostOps& post = {});
Tensor matmul(const Tensor& a, const Tensor& b);

enum class BinaryAlg { kAdd, kSub, kMul, kDiv };
Tensor binary(BinaryAlg alg, const Tensor& a, const Tensor& b);
// `scalar_first`: scalar OP x rather than x OP scalar.
Tensor binary_scalar(BinaryAlg alg, const Tensor& x, double scalar, bool scalar_first);
// a OP= b, writing into a's memory (b broadcast to a's sizes).
void binary_inplace(BinaryAlg alg, Tensor& a, const Tensor& b);
void binary_scalar_inplace(BinaryAlg alg, Tensor& a, double scalar);

enum class UnaryAlg { kRelu, kClip, kLeakyRelu, kSigmoid, kTanh, kHardsigmoid, kHardswish, kSilu, kGeluErf, kGeluTanh };
// alpha/beta: clip bounds or leaky slope.
Tensor unary(UnaryAlg alg, const Tensor& x, float alpha = 0.f, float beta = 0.f);
void unary_inplace(UnaryAlg alg, Tensor& x, float alpha = 0.f, float beta = 0.f);

Tensor softmax(const Tensor& x, int64_t dim, bool log);
Tensor layer_norm(const Tensor& x, IntArrayRef normalized_shape, const Tensor& weight, const Tensor& bias, double eps);
Tensor batch_norm(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& weight, const Tensor& bias,
                  double eps);

// Max pooling also takes s8/u8 (result keeps the input's quantization parameters).
Tensor max_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size);

// Over `dims` (empty: all dims).
Tensor mean(const Tensor& x, IntArrayRef dims, bool keepdim);
Tensor sum(const Tensor& x, IntArrayRef dims, bool keepdim);
Tensor std_dev(const Tensor& x, IntArrayRef dims, bool unbiased, bool keepdim);

Tensor cat(absl::Span<const Tensor* const> tensors, int64_t dim);
Tensor embedding(const Tensor& indices, const Tensor& weight);

// `x` itself when already in `format`, else a copy in it (never dispatches).
Tensor contiguous(const Tensor& x, MemoryFormat format = MemoryFormat::kContiguous);
// A copy with the given layout and dtype (reorder); quantized dtypes keep their parameters.
Tensor copy(const Tensor& x, MemoryFormat format, DType dtype);
// Writes src (broadcast to dst's sizes) into dst, converting dtype.
void copy_into(Tensor& dst, const Tensor& src);
void fill(Tensor& dst, double value);

// Affine quantization of f32 to s8/u8 (round half to even, saturate), per tensor or per channel.
Tensor quantize(const Tensor& x, const QuantParamsPtr& qparams, DType dtype);
Tensor dequantize(const Tensor& x);

}  // namespace dbrq::kernels
