// The functional op API. Every function here (and every operator overload) passes through the
// dispatcher, so a prepared or converted model sees it.
//
//   using namespace dbrq;
//   Tensor y = relu(conv2d(x, w, b, Conv2dParams{{2, 2}, {1, 1}}));
//   Tensor z = y + 1.0;                   // tensor-scalar
//   Tensor s = softmax(matmul(q, k.transpose(-2, -1)) / 8.0, -1);
//   Tensor p = cat({a, b}, 1);
//
// Semantics follow PyTorch's functions of the same name. Inputs are f32 unless stated; 4-D conv
// and pooling outputs are channels-last (see tensor.h). Errors: ShapeError, DTypeError,
// ValueError, IndexError with the op's name and the offending sizes or values.
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

#include <optional>

#include "core/op_params.h"
#include "core/tensor.h"

namespace dbrq {

// Every op that passes through the dispatcher, one per function below (tensor methods such as
// reshape and view dispatch as these too). Names (op_name) follow PyTorch's functional names;
// everything else about an op is in its OpDef (runtime/op_registry.h).
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
  kElu,
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
  // op families of issue 12 (appended so earlier kinds keep their numbers)
  kStack,     // joins like cat (one observer shared by the inputs and the output)
  kExpand,    // shape ops: int8 passes through unchanged
  kRepeat,
  kPad,
  kPrelu,     // weighted: int8 through per-channel code tables (kernels::QPReLU)
  kSoftplus,  // activations through 256-entry tables in int8
  kMish,
  kWhere,     // fp32 math (int8 arguments dequantized)
  kPow,
  kSqrt,
  kExp,
  kMax,          // indexing (int8 on codes); max(x, dim) dispatches kMax (values) then kArgmax (indices)
  kArgmax,
  kTopk,         // topk dispatches kTopk (values) then kTopkIndices
  kTopkIndices,
  kIndexSelect,
  kGather,
  // spatial ops of issue 12 (appended: earlier kinds keep their numbers)
  kConvTranspose2d,
  kConv1d,
  kMaxPool1d,
  kAvgPool1d,
  kAdaptiveAvgPool1d,
  kInterpolate,
  kGroupNorm,
  kInstanceNorm,
  kNumOpKinds,
};

// "conv2d", "relu", ...
const char* op_name(OpKind kind);

// ---- compute ops with weights ----
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              const Conv2dParams& params = {});
// Transposed convolution, as F.conv_transpose2d: weight [in_channels, out_channels/groups, kH, kW].
Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                        const ConvTranspose2dParams& params = {});
// 1-D convolution, as F.conv1d: input [N, C, L], weight [out_channels, in_channels/groups, kL].
Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), const Conv1dParams& params = {});
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());
Tensor embedding(const Tensor& indices, const Tensor& weight);
// Inference batch normalization over dim 1 with running statistics.
Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor layer_norm(const Tensor& input, std::vector<int64_t> normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// ---- products ----
Tensor matmul(const Tensor& input, const Tensor& other);  // batched, broadcasting, 1-D promotion

// ---- binary elementwise (NumPy broadcasting) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor add(double a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, double b);
Tensor sub(double a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, double b);
Tensor mul(double a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, double b);
Tensor div(double a, const Tensor& b);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator+(double a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
inline Tensor operator-(double a, const Tensor& b) { return sub(a, b); }
inline Tensor operator-(const Tensor& a) { return mul(a, -1.0); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return div(a, b); }
inline Tensor operator/(double a, const Tensor& b) { return div(a, b); }
inline Tensor& operator+=(Tensor& a, const Tensor& b) { return a.add_(b); }
inline Tensor& operator+=(Tensor& a, double b) { return a.add_(b); }
inline Tensor& operator-=(Tensor& a, const Tensor& b) { return a.sub_(b); }
inline Tensor& operator-=(Tensor& a, double b) { return a.sub_(b); }
inline Tensor& operator*=(Tensor& a, const Tensor& b) { return a.mul_(b); }
inline Tensor& operator*=(Tensor& a, double b) { return a.mul_(b); }
inline Tensor& operator/=(Tensor& a, double b) { return a.div_(b); }

// ---- activations ----
Tensor relu(const Tensor& x);
Tensor relu6(const Tensor& x);
Tensor hardtanh(const Tensor& x, double min_val = -1.0, double max_val = 1.0);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor hardsigmoid(const Tensor& x);
Tensor hardswish(const Tensor& x);
Tensor silu(const Tensor& x);
// approximate: "none" (erf) or "tanh".
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
Tensor clamp(const Tensor& x, double min_val, double max_val);
// x for x > 0, alpha * (exp(x) - 1) otherwise.
Tensor elu(const Tensor& x, double alpha = 1.0);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// x > 0 ? x : weight[c] * x, c the channel (dim 1); weight has 1 or size(1) elements. Converted:
// int8 with the weight quantized by the qconfig's weight observer (per-channel code tables).
Tensor prelu(const Tensor& x, const Tensor& weight);
// log1p(exp(beta * x)) / beta, and x where beta * x > threshold. beta must be nonzero and finite.
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
// x * tanh(softplus(x)).
Tensor mish(const Tensor& x);

// ---- pooling ----
// stride defaults to kernel_size (pass an empty list).
Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel_size, std::vector<int64_t> stride = {},
                  std::array<int64_t, 2> padding = {0, 0}, std::array<int64_t, 2> dilation = {1, 1},
                  bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel_size, std::vector<int64_t> stride = {},
                  std::array<int64_t, 2> padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size);
// Square windows given as ints, as PyTorch's `max_pool2d(x, 3, 2, 1)`; stride 0: the kernel size.
inline Tensor max_pool2d(const Tensor& x, int64_t kernel_size, int64_t stride = 0, int64_t padding = 0,
                         int64_t dilation = 1, bool ceil_mode = false) {
  return max_pool2d(x, std::array<int64_t, 2>{kernel_size, kernel_size},
                    stride == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{stride, stride},
                    std::array<int64_t, 2>{padding, padding}, std::array<int64_t, 2>{dilation, dilation}, ceil_mode);
}
inline Tensor avg_pool2d(const Tensor& x, int64_t kernel_size, int64_t stride = 0, int64_t padding = 0,
                         bool ceil_mode = false, bool count_include_pad = true) {
  return avg_pool2d(x, std::array<int64_t, 2>{kernel_size, kernel_size},
                    stride == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{stride, stride},
                    std::array<int64_t, 2>{padding, padding}, ceil_mode, count_include_pad);
}
inline Tensor adaptive_avg_pool2d(const Tensor& x, int64_t output_size) {
  return adaptive_avg_pool2d(x, std::array<int64_t, 2>{output_size, output_size});
}

// 1-D pooling of [N, C, L] (F.max_pool1d, ...); stride defaults to kernel_size.
Tensor max_pool1d(const Tensor& x, int64_t kernel_size, std::optional<int64_t> stride = std::nullopt,
                  int64_t padding = 0, int64_t dilation = 1, bool ceil_mode = false);
Tensor avg_pool1d(const Tensor& x, int64_t kernel_size, std::optional<int64_t> stride = std::nullopt,
                  int64_t padding = 0, bool ceil_mode = false, bool count_include_pad = true);
Tensor adaptive_avg_pool1d(const Tensor& x, int64_t output_size);

// ---- group normalizations (fp32 also in converted models: int8 arguments are dequantized) ----
// F.group_norm: input [N, C, *], weight / bias undefined or [C].
Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// F.instance_norm with the input's own statistics (use_input_stats): group_norm with C groups.
Tensor instance_norm(const Tensor& input, const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                     double eps = 1e-5);

// ---- resampling ----
// F.interpolate of a 4-D [N, C, H, W] tensor: exactly one of size / scale_factor; mode "nearest"
// or "bilinear"; align_corners only with "bilinear" (default false). The output size from a scale
// factor is floor(in * scale_factor), and the factor itself drives the source index (PyTorch's
// recompute_scale_factor=None). In int8 (converted models) the output keeps the input's parameters.
Tensor interpolate(const Tensor& x, std::optional<std::array<int64_t, 2>> size,
                   std::optional<std::array<double, 2>> scale_factor = std::nullopt,
                   const std::string& mode = "nearest", std::optional<bool> align_corners = std::nullopt);

// ---- reductions (dims empty: all dims) ----
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor std(const Tensor& x, std::vector<int64_t> dims = {}, bool unbiased = true, bool keepdim = false);

// ---- joining and shape ops (int8 tensors pass through these unchanged) ----
// `tensors`: a braced list ({a, b}) or any contiguous container of tensors (no copy is made).
Tensor cat(absl::Span<const Tensor> tensors, int64_t dim = 0);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor reshape(const Tensor& x, std::vector<int64_t> sizes);
Tensor permute(const Tensor& x, std::vector<int64_t> dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor dropout(const Tensor& x, double p = 0.5, bool training = false);
Tensor identity(const Tensor& x);
// Joins tensors of equal sizes along a new dim `dim` (in [-(x.dim()+1), x.dim()]). Converted: int8
// like cat, every input brought to the output's parameters.
Tensor stack(absl::Span<const Tensor> tensors, int64_t dim = 0);
// x.squeeze(): drops every size-1 dim; x.squeeze(dim) / x.unsqueeze(dim) as the Tensor methods.
Tensor squeeze(const Tensor& x);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor unsqueeze(const Tensor& x, int64_t dim);
// A view with size-1 dims broadcast to `sizes` (stride 0; -1 keeps a dim; new leading dims may be
// added). Like PyTorch, writing through the result is not supported.
Tensor expand(const Tensor& x, std::vector<int64_t> sizes);
// A copy tiled `repeats[i]` times along each dim (repeats may have more dims than x: leading ones).
Tensor repeat(const Tensor& x, std::vector<int64_t> repeats);
// F.pad: `pads` pairs (left, right) from the last dim backwards, as many as x has dims (negative
// values crop in constant mode). reflect / replicate pad the last 1, 2 or 3 dims of a (C,) or
// (N, C,) tensor, as PyTorch does; reflect needs each pad < that dim's size. A quantized input
// keeps its parameters; constant mode fills with the code of `value`.
enum class PadMode { kConstant = 0, kReflect = 1, kReplicate = 2 };
Tensor pad(const Tensor& x, std::vector<int64_t> pads, PadMode mode = PadMode::kConstant, double value = 0.0);
// "constant", "reflect", "replicate" (ValueError otherwise; "circular" is not supported).
Tensor pad(const Tensor& x, std::vector<int64_t> pads, const std::string& mode, double value = 0.0);

// ---- math (fp32; NumPy broadcasting; converted models run them in fp32) ----
// condition ? input : other, elementwise. dbrq has no bool dtype: condition is a mask of any
// unquantized u8, s8, s32, s64 or f32 tensor, nonzero meaning true.
Tensor where(const Tensor& condition, const Tensor& input, const Tensor& other);
Tensor where(const Tensor& condition, const Tensor& input, double other);
Tensor where(const Tensor& condition, double input, const Tensor& other);
Tensor pow(const Tensor& x, double exponent);
Tensor pow(double base, const Tensor& exponent);
Tensor pow(const Tensor& x, const Tensor& exponent);
Tensor sqrt(const Tensor& x);
Tensor exp(const Tensor& x);

// ---- indexing (fp32 values; indices are s64, PyTorch's int64; converted models run them in fp32) ----
// Values and indices of the maximum along dim (the first on ties; NaN counts as the largest).
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
// The k largest (or smallest) along dim, values and indices; always sorted (sorted=false allowed).
std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true);
// index: 1-D s64 (or s32). Any element dtype; quantized inputs keep their parameters.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[i][j][k] = x[index[i][j][k]][j][k] for dim 0, etc.; index: s64 (or s32), x's rank.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

// ---- quantization ----
// Affine quantization (round half to even, saturate) to u8 or s8.
Tensor quantize_per_tensor(const Tensor& x, float scale, int32_t zero_point, DType dtype);
Tensor quantize_per_channel(const Tensor& x, std::vector<float> scales, std::vector<int32_t> zero_points,
                            int64_t axis, DType dtype);
Tensor dequantize(const Tensor& x);

}  // namespace dbrq
