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

// An elementwise function in oneDNN's vocabulary (its eltwise algorithms and their alpha / beta):
// what an activation op runs eagerly, and the post-op it becomes when fused after a conv or linear.
// Ops map to it in their OpDef (runtime/ops/activations.cc); kernels never see op kinds.
struct Eltwise {
  enum class Alg : uint8_t {
    kRelu,         // alpha: negative slope (0: relu; leaky_relu otherwise)
    kClip,         // clamp to [alpha, beta]
    kLogistic,     // sigmoid
    kTanh,
    kSwish,        // x * sigmoid(alpha * x); alpha = 1: silu
    kGeluErf,
    kGeluTanh,
    kHardswish,
    kHardsigmoid,  // no oneDNN 2.6 algorithm: eager loop only, never a post-op
    kElu,          // alpha
    kSoftplus,     // alpha: beta, beta: threshold (PyTorch's softplus); eager loop only, never a post-op
    kMish,         // x * tanh(softplus(x))
  };
  Alg alg = Alg::kRelu;
  float alpha = 0.f, beta = 0.f;
  static Eltwise relu() { return {Alg::kRelu, 0.f, 0.f}; }
  static Eltwise clip(float lo, float hi) { return {Alg::kClip, lo, hi}; }
  static Eltwise hardswish() { return {Alg::kHardswish, 0.f, 0.f}; }
  bool operator==(const Eltwise& o) const { return alg == o.alg && alpha == o.alpha && beta == o.beta; }
};
// "relu", "leaky_relu", "clip", "sigmoid", "gelu_tanh", ... (as describe() strings show them).
const char* eltwise_name(const Eltwise& e);
// The real-valued function (kernels/activation_math.h), e.g. for 256-entry code tables.
float eltwise_reference(const Eltwise& e, float x);

// Elementwise steps fused after a conv / linear (oneDNN post-ops).
using PostOp = Eltwise;
using PostOps = std::vector<Eltwise>;

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p, const PostOps& post = {});
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, const PostOps& post = {});
// A linear with in_features 0 (an empty sum): [m, n] rows of the bias (zeros without one), as
// PyTorch returns; the post-ops applied.
Tensor linear_bias_rows(int64_t m, int64_t n, const Tensor& b, const PostOps& post = {});
// The same functions computed in PyTorch 1.13's order of operations (Debian's build, which
// calibration must reproduce so observers see PyTorch FX's values): conv2d as ideep asks oneDNN for
// it (layouts chosen by oneDNN, training propagation); linear as the reference BLAS sums (each dot
// product over k in order, one rounding per step, then + bias). Slower; not for inference.
Tensor conv2d_torch_order(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p);
Tensor linear_torch_order(const Tensor& x, const Tensor& w, const Tensor& b);
Tensor conv1d_torch_order(const Tensor& x, const Tensor& w, const Tensor& b, const Conv1dParams& p);
// Transposed convolution (oneDNN deconvolution); w in PyTorch's [C, K/groups, R, S] layout.
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvTranspose2dParams& p,
                        const PostOps& post = {});
// PyTorch's transposed-conv weight [C, K/groups, R, S] as an output-major [K, C/groups, R, S] copy
// (what int8 deconvolution, batch-norm folding and per-channel quantization work on).
Tensor deconv_weight_output_major(const Tensor& w, int64_t groups);
// 1-D convolution and pooling run as their 2-D forms with H = 1 (kernels/eager_conv1d.cc):
// [N, C, L] <-> [N, C, 1, L] views (no copy; quantization parameters kept).
Tensor unit_height_view(const Tensor& x);
Tensor drop_unit_height(const Tensor& y);
Conv2dParams conv1d_as_conv2d(const Conv1dParams& p);
Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv1dParams& p, const PostOps& post = {});
// interpolate to [oh, ow] (kernels/eager_resample.cc), in x's layout. scale_* > 0: the scale
// factor the caller gave (PyTorch indexes with 1 / scale then), else in / out. Nearest takes f32,
// u8 or s8 (codes copied, parameters kept); bilinear f32 or quantized u8 (PyTorch's quantized
// kernel: same parameters out).
// Normalization over groups of channels (kernels/eager_group_norm.cc): x [N, C, *] f32, weight /
// bias undefined or [C]; `op` names the op in errors ("group_norm", "instance_norm"). Statistics
// accumulate in double; the output keeps x's layout.
Tensor group_norm(const char* op, const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps);
Tensor upsample_nearest2d(const Tensor& x, int64_t oh, int64_t ow, double scale_h, double scale_w);
Tensor upsample_bilinear2d(const Tensor& x, int64_t oh, int64_t ow, bool align_corners, double scale_h,
                           double scale_w);
Tensor matmul(const Tensor& a, const Tensor& b);

enum class BinaryAlg { kAdd, kSub, kMul, kDiv };
Tensor binary(BinaryAlg alg, const Tensor& a, const Tensor& b);
// `scalar_first`: scalar OP x rather than x OP scalar.
Tensor binary_scalar(BinaryAlg alg, const Tensor& x, double scalar, bool scalar_first);
// a OP= b, writing into a's memory (b broadcast to a's sizes).
void binary_inplace(BinaryAlg alg, Tensor& a, const Tensor& b);
void binary_scalar_inplace(BinaryAlg alg, Tensor& a, double scalar);

// Activations (f32): oneDNN's eltwise primitive, or PyTorch's formula where oneDNN differs.
Tensor eltwise(const Eltwise& e, const Tensor& x);
// PyTorch's prelu: x > 0 ? x : weight[c] * x, c the channel (dim 1; one weight for inputs under 2-D).
// weight: f32 with 1 or size(1) elements.
Tensor prelu(const Tensor& x, const Tensor& weight);
void eltwise_inplace(const Eltwise& e, Tensor& x);

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
// dequantize(x), computed on first access to the result's data (Tensor::empty_lazy). The codes
// must not change before then: reading a result whose codes were written since raises UsageError.
Tensor dequantize_lazy(const Tensor& x);

}  // namespace dbrq::kernels
