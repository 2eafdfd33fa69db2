// Int8 kernels for converted models: oneDNN u8 x s8 convolution, inner product / matmul (static
// and dynamic), and the elementwise, pooling and (re)quantization kernels around them.
//
//   kernels::QConv2d::Options o;
//   o.params = conv_params;  o.weight = folded_w;  o.bias = folded_b;
//   o.weight_qparams = per_channel_s8;  o.src_qparams = in_qp;  o.dst_qparams = out_qp;
//   o.post = {kernels::PostOp::relu()};
//   kernels::QConv2d conv(std::move(o));          // quantizes and keeps the weights once
//   Tensor y = conv.run(x_u8);                    // primitive created once per input shape
//
// Numerics follow PyTorch's onednn quantized engine so results match it bit for bit: scales are
// combined in its reciprocal convention (op_scale = (1/out) / ((1/in) * (1/w))), the bias is f32 in
// accumulator units (b * (1/in) * (1/w)), the source zero point is applied by oneDNN (so padding is
// a real zero), rounding is half to even. Fused post-ops (relu, clip, hardswish) run on real
// values; a residual add runs through oneDNN's sum post-op.
//
// Primitives are cached per input shape and thread count (bounded); prepacked weights per weights
// layout. Kernel objects are immutable after construction and safe to run from several threads.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/eager.h"
#include "core/op_params.h"
#include "core/tensor.h"

namespace dbrq::kernels {

// The reciprocal-convention scales PyTorch's onednn backend feeds oneDNN, for bit-exact parity.
struct RequantScales {
  std::vector<float> bias_scales;  // (1/in) * (1/w[c]): f32 bias in accumulator units is b * this
  std::vector<float> op_scales;    // (1/out) / bias_scales[c]; or 1/bias... for real-valued outputs
};
// dst_scale <= 0 means "real-valued output" (op scale = 1 / bias scale).
RequantScales requant_scales(float src_scale, const std::vector<float>& weight_scales, float dst_scale);

class PrimitiveCacheImpl;  // per-kernel cache of primitives by shape (int8.cc)

// What every int8 weighted kernel (conv, linear) is built from. Weights are f32 with batch norm
// already folded; the kernel quantizes and keeps them once.
struct QWeightedOptions {
  Tensor weight;                 // f32: conv [K, C/groups, R, S], linear [N, K]
  Tensor bias;                   // f32 [K], or undefined
  QuantParamsPtr weight_qparams; // s8 symmetric, per-channel on axis 0 or per-tensor
  QuantParamsPtr src_qparams;    // u8 per-tensor; ignored when dynamic
  QuantParamsPtr dst_qparams;    // u8 per-tensor; null: f32 output (dynamic; static linear only)
  PostOps post;                  // on real values, before requantization
  QuantParamsPtr sum_qparams;    // set: a residual (u8, these params) is added before `post` (conv only)
  bool dynamic = false;          // quantize the input per call from its own range (linear only)
};

// An int8 weighted kernel, as the converted model runs it (the tracer's executor does not know
// which one it holds).
class QWeighted {
 public:
  virtual ~QWeighted() = default;
  // x: u8 with src_qparams (f32 or u8 when dynamic). residual / out: see QConv2d::run.
  virtual Tensor run(const Tensor& x, const Tensor* residual = nullptr, const Tensor* out = nullptr) const = 0;
  // An uninitialized output for input `x` (a residual add fills it later).
  virtual Tensor empty_output(const Tensor& x) const = 0;
  virtual const Tensor& quantized_weight() const = 0;
  virtual const QuantParamsPtr& weight_qparams() const = 0;
  virtual std::string describe() const = 0;
};

struct QConvOptions : QWeightedOptions {
  Conv2dParams params;
};

class QConv2d final : public QWeighted {
 public:
  explicit QConv2d(QConvOptions options);
  ~QConv2d() override;
  // x: u8 with src_qparams (reordered to channels-last when it is not). residual: u8 with
  // sum_qparams, same sizes as the output. Output: u8 channels-last with dst_qparams, written into
  // `out` when given (an empty_output() tensor).
  Tensor run(const Tensor& x, const Tensor* residual = nullptr, const Tensor* out = nullptr) const override;
  Tensor empty_output(const Tensor& x) const override;
  const Tensor& quantized_weight() const override { return qweight_; }
  const QuantParamsPtr& weight_qparams() const override { return o_.weight_qparams; }
  const QConvOptions& options() const { return o_; }
  std::string describe() const override;

 private:
  QConvOptions o_;
  Tensor qweight_;      // s8, plain layout
  Tensor bias_acc_;     // f32 bias in accumulator units
  std::vector<float> op_scales_;
  std::unique_ptr<PrimitiveCacheImpl> cache_;
};

using QLinearOptions = QWeightedOptions;

// prelu on int8: one 256-entry table per weight (channel), from the weight quantized to s8 with
// weight_qparams (symmetric, per-tensor or per-channel). The negative side is PyTorch's
// quantized::prelu arithmetic ((q - zp_x) * w_q times i_s * w_s * (1 / o_s), rounded to nearest);
// the positive side multiplies by exactly 1, where PyTorch uses 1.0 quantized with the weight's
// parameters (which saturates, wrongly, when the weight range excludes 1).
// weight: f32 [C] or [1]; bias and post ops unused.
class QPReLU final : public QWeighted {
 public:
  explicit QPReLU(QWeightedOptions options);
  // x: u8 with src_qparams, C channels in dim 1 (any C when there is one weight).
  Tensor run(const Tensor& x, const Tensor* residual = nullptr, const Tensor* out = nullptr) const override;
  Tensor empty_output(const Tensor& x) const override;
  const Tensor& quantized_weight() const override { return qweight_; }
  const QuantParamsPtr& weight_qparams() const override { return o_.weight_qparams; }
  std::string describe() const override;

 private:
  QWeightedOptions o_;
  Tensor qweight_;
  std::vector<std::array<uint8_t, 256>> tables_;  // one per weight element
};

// linear on int8: oneDNN matmul (it takes the source zero point, which inner product does not).
class QLinear final : public QWeighted {
 public:
  explicit QLinear(QLinearOptions options);
  ~QLinear() override;
  // Static: x u8 [..., K] with src_qparams -> u8 [..., N]. Dynamic: x f32 (or u8) -> f32. No
  // residual fusion (residual and out must be null).
  Tensor run(const Tensor& x, const Tensor* residual = nullptr, const Tensor* out = nullptr) const override;
  Tensor empty_output(const Tensor& x) const override;
  const Tensor& quantized_weight() const override { return qweight_; }
  const QuantParamsPtr& weight_qparams() const override { return o_.weight_qparams; }
  std::string describe() const override;
  // oneDNN primitives created so far (one per input shape and thread count; dynamic calls of one
  // shape share one, whatever their scales and zero points).
  size_t num_primitives() const;

 private:
  Tensor run_static(const Tensor& x, const QuantParams& src, const std::vector<float>& op_scales, const Tensor& bias,
                    const QuantParams* dst) const;
  QLinearOptions o_;
  Tensor qweight_;  // s8 [N, K]
  Tensor bias_acc_;
  std::vector<float> op_scales_;
  std::vector<float> weight_reciprocals_;  // dynamic: float(1.0 / weight scale) per output channel
  std::unique_ptr<PrimitiveCacheImpl> cache_;
};

// matmul of two u8 activations (batched, broadcasting): oneDNN matmul u8 x s8, the second operand
// shifted to s8 (q - 128, zero point - 128, exact), primitives in the process-wide cache. Static
// products of at most 2^17 multiply-adds (one query row against a key / value cache) run as plain
// s32 loops instead: there oneDNN's per-call setup costs more than the arithmetic. Dynamic: f32
// operands quantized per call.
class QMatmul {
 public:
  QMatmul(QuantParamsPtr a_qparams, QuantParamsPtr b_qparams, QuantParamsPtr dst_qparams, bool dynamic);
  ~QMatmul();
  Tensor run(const Tensor& a, const Tensor& b) const;
  std::string describe() const;

 private:
  QuantParamsPtr a_, b_, dst_;
  bool dynamic_;
};

// ---- transposed convolution (kernels/int8_deconv.cc) ----

struct QConvTranspose2dOptions : QWeightedOptions {
  // `weight` here is output-major, [K, C/groups, R, S] (deconv_weight_output_major of PyTorch's
  // [C, K/groups, R, S]), so batch-norm folding and per-channel parameters work on dim 0 as for
  // conv2d. weight_qparams: per-tensor, or per output channel on axis 0.
  ConvTranspose2dParams params;
};

// conv_transpose2d on int8: oneDNN's u8 x s8 deconvolution, with the numerics of QConv2d (PyTorch's
// onednn engine: reciprocal-convention scales, f32 bias in accumulator units, source zero point
// applied by oneDNN), fused activations as post-ops. No residual fusion.
class QConvTranspose2d final : public QWeighted {
 public:
  explicit QConvTranspose2d(QConvTranspose2dOptions options);
  ~QConvTranspose2d() override;
  // x: u8 with src_qparams -> u8 channels-last with dst_qparams. residual / out must be null.
  Tensor run(const Tensor& x, const Tensor* residual = nullptr, const Tensor* out = nullptr) const override;
  Tensor empty_output(const Tensor& x) const override;
  const Tensor& quantized_weight() const override { return qweight_; }
  const QuantParamsPtr& weight_qparams() const override { return o_.weight_qparams; }
  std::string describe() const override;

 private:
  QConvTranspose2dOptions o_;
  Tensor shape_weight_;  // an empty [C, K/groups, R, S] view for the shape rule (PyTorch's layout)
  Tensor qweight_;       // s8 [K, C/groups, R, S]
  Tensor bias_acc_;      // f32 bias in accumulator units
  std::vector<float> op_scales_;
  int64_t id_;           // distinguishes this kernel's primitives (scales are baked in) in the cache
};

// ---- 1-D convolution (kernels/int8_conv1d.cc) ----

struct QConv1dOptions : QWeightedOptions {
  Conv1dParams params;  // weight [K, C/groups, kL]
};

// conv1d on int8: QConv2d with H = 1 (weight [K, C/groups, 1, kL]), so numerics, fusions and
// primitive caching are conv2d's. Inputs [N, C, L] u8; outputs u8 [N, K, L'] channels-last
// (strides (L'*K, 1, K)). A residual add is fused as for conv2d (residual [N, K, L']).
class QConv1d final : public QWeighted {
 public:
  explicit QConv1d(QConv1dOptions options);
  ~QConv1d() override;
  Tensor run(const Tensor& x, const Tensor* residual = nullptr, const Tensor* out = nullptr) const override;
  Tensor empty_output(const Tensor& x) const override;
  const Tensor& quantized_weight() const override { return qweight_; }
  const QuantParamsPtr& weight_qparams() const override { return conv_->weight_qparams(); }
  std::string describe() const override;

 private:
  Conv1dParams params_;
  Tensor weight_;                  // f32 [K, C/groups, kL], for the shape rule
  std::unique_ptr<QConv2d> conv_;
  Tensor qweight_;                 // s8 [K, C/groups, kL] (a view of conv_'s)
};

// oneDNN primitives the process-wide primitive cache has created so far (its misses).
uint64_t primitives_created();

// Whether oneDNN's u8 x s8 kernels on this process's ISA (its effective one: the CPU, capped by
// ONEDNN_MAX_CPU_ISA) sum pairs of products into saturating 16 bits: without VNNI (AVX2, AVX-512
// before Cascade Lake) they use vpmaddubsw, and 255 * 127 * 2 exceeds 32767. Computed once.
bool int8_pairs_saturate();
// The weight parameters an int8 kernel quantizes with: `q` itself, or where pairs saturate the
// same with every scale doubled, so weight codes lie in [-64, 64] and no pair can (255 * 64 * 2
// = 32640). One bit of weight precision for exact sums.
QuantParamsPtr weight_qparams_for_isa(const QuantParamsPtr& q);

// ---- elementwise and data movement on u8 ----

// f32 -> u8/s8 (round half to even, saturate), written in `format` (kPreserve keeps x's layout).
Tensor quantize_to(const Tensor& x, const QuantParamsPtr& qparams, DType dtype, MemoryFormat format);
// u8 -> u8 with other parameters, through a 256-entry table (exactly quantize(dequantize(x))).
Tensor requantize(const Tensor& x, const QuantParamsPtr& qparams);

// A 256-entry table mapping u8 codes to u8 codes.
using Lut = std::array<uint8_t, 256>;
// Table of quantize(f(dequantize(q))) for every code q.
template <typename F>
Lut make_lut(const QuantParams& in, const QuantParams& out, F&& f);
Tensor apply_lut(const Tensor& x, const Lut& lut, const QuantParamsPtr& out_qparams);

// PyTorch's quantized add / mul (same sizes): dequantize with FMA, combine, requantize.
Tensor qadd(const Tensor& a, const Tensor& b, const QuantParamsPtr& out, bool relu);
Tensor qmul(const Tensor& a, const Tensor& b, const QuantParamsPtr& out, bool relu);

// PyTorch's quantized average pooling (sum of codes, rounded mean), output keeps x's parameters.
Tensor qavg_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor qadaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size);
// Mean over dims: of the real values (f32, oneDNN reduction), requantized with x's own parameters.
Tensor qmean(const Tensor& x, IntArrayRef dims, bool keepdim);
// clamp of real values [lo, hi] on codes (relu: lo = 0, hi = +inf), keeping x's parameters.
Tensor qclamp(const Tensor& x, double lo, double hi);
// softmax over `dim`: dequantize, f32 softmax, quantize to `out`.
Tensor qsoftmax(const Tensor& x, int64_t dim, const QuantParamsPtr& out);

}  // namespace dbrq::kernels

#include "kernels/int8_inl.h"

namespace dbrq::kernels {

// ---- per-channel affine on u8: batch norm on its own (not folded into a conv) ----
//
// PyTorch's quantized::batch_norm{1d,2d}(_relu): per channel c,
//   q_out = clamp(round_half_even(fma(alpha[c], q_in - in_zp, beta[c])) + out_zp, 0 (relu: out_zp), 255)
// with alpha and beta computed once from the statistics (batch_norm_affine).
//
//   kernels::QChannelAffine bn(kernels::batch_norm_affine(mean, var, w, b, eps, in->scale(), out->scale()),
//                              in, out, /*relu=*/true);
//   Tensor y = bn.run(x_u8);   // [N, C], [N, C, L] or [N, C, H, W]; keeps x's layout
struct ChannelAffine {
  std::vector<float> alpha;  // multiplies q_in - in_zp; output codes per input code
  std::vector<float> beta;   // in output codes
};

// alpha / beta as PyTorch 1.13's compute_fused_params: inv_sigma = 1 / sqrt(var + eps) in float,
// alpha = inv_sigma * weight * (in_scale / out_scale), beta = (bias - mean * inv_sigma * weight) /
// out_scale (scale ratios in double). weight / bias may be undefined (1 and 0). Throws ShapeError /
// DTypeError / ValueError for statistics that are not f32 [C] or non-positive scales.
ChannelAffine batch_norm_affine(const Tensor& mean, const Tensor& var, const Tensor& weight, const Tensor& bias,
                                double eps, float in_scale, float out_scale);

class QChannelAffine {
 public:
  // src / dst: u8 per-tensor parameters of the input and the output.
  QChannelAffine(ChannelAffine affine, QuantParamsPtr src, QuantParamsPtr dst, bool relu);
  // x: u8 with exactly src's parameters, channels on dim 1, 2 to 5 dims, any layout (channels-last
  // and row-major run without a copy). Output: u8 with dst's parameters, x's layout.
  Tensor run(const Tensor& x) const;
  int64_t channels() const { return static_cast<int64_t>(a_.alpha.size()); }
  bool relu() const { return relu_; }
  std::string describe() const;

 private:
  ChannelAffine a_;
  QuantParamsPtr src_, dst_;
  bool relu_;
};

}  // namespace dbrq::kernels

namespace dbrq::kernels {

// ---- layer / group / instance norm on u8 (kernels/int8_normalize.cc) ----
//
// PyTorch 1.13's quantized_normalize_kernel arithmetic (quantized::layer_norm, group_norm,
// instance_norm): per normalized row of N codes, the integer sums of q and q*q give
// mean / scale and var / scale^2 in f32, s = in_scale / sqrt(var * in_scale^2 + eps) (sqrt in
// double), then per element y = ((q - in_zp) - mean) * s * gamma + beta (layer norm, gamma / beta
// per element) or ((q - in_zp) - mean) * (s * gamma[c]) + beta[c] (group / instance norm, per
// channel), quantized to `out` (round half to even, saturating). AVX-512 and portable loops are
// bit-identical.
//
//   Tensor y = kernels::qlayer_norm(x_u8, {768}, gamma, beta, 1e-6, out_qparams);
//   Tensor z = kernels::qgroup_norm("group_norm", x_u8, 8, gamma, beta, 1e-5, out_qparams);
//
// x: u8 with per-tensor parameters, any layout (copied row-major when it is not); the output is
// row-major u8 with `out`'s parameters. Throws DTypeError for an x that is not quantized u8 or
// parameters that are not f32, ShapeError for sizes that do not fit, ValueError for a bad eps,
// num_groups or output parameters.
Tensor qlayer_norm(const Tensor& x, IntArrayRef normalized_shape, const Tensor& weight, const Tensor& bias,
                   double eps, const QuantParamsPtr& out);
// `op` names the op in errors ("group_norm", "instance_norm": num_groups = channels).
Tensor qgroup_norm(const char* op, const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                   double eps, const QuantParamsPtr& out);

}  // namespace dbrq::kernels
