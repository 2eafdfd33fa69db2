// libtorch's torch::nn::functional, so that a port that writes
//
//   namespace F = torch::nn::functional;
//   x = F::interpolate(x, F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kBilinear)
//                             .align_corners(false));
//   x = F::pad(x, F::PadFuncOptions({1, 1, 1, 1}).mode(torch::kReflect));
//
// compiles with `torch::` -> `dbrq::`. Every function here is the dispatched op of runtime/ops.h
// with the options unpacked (nothing is recorded or quantized differently from the plain call).
// Options libtorch has and dbrq cannot honour are refused with ValueError naming the option, never
// ignored: training-mode batch norm, in-place forms dbrq has no in-place op for, interpolate's
// recompute_scale_factor(true) and antialias(true). docs/porting_from_libtorch.md lists the names.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "runtime/nn.h"
#include "runtime/ops.h"

namespace dbrq {

// Modes of interpolate and pad (libtorch: torch::kBilinear, torch::kReflect, ...).
inline constexpr const char* kNearest = "nearest";
inline constexpr const char* kBilinear = "bilinear";
inline constexpr const char* kConstant = "constant";
inline constexpr const char* kReflect = "reflect";
inline constexpr const char* kReplicate = "replicate";

namespace nn::functional {

namespace detail {

// libtorch's ExpandingArray<2>: one value for both spatial dims, or one per dim.
struct Expanding2 {
  Expanding2(int64_t v) : value{v, v} {}                                   // NOLINT: implicit as libtorch's
  Expanding2(std::array<int64_t, 2> v) : value(v) {}                      // NOLINT
  Expanding2(std::initializer_list<int64_t> v) : value(from_list(v)) {}  // NOLINT
  std::array<int64_t, 2> value;

 private:
  static std::array<int64_t, 2> from_list(std::initializer_list<int64_t> v) {
    DBRQ_ENSURE(v.size() == 1 || v.size() == 2, ValueError, "expected 1 or 2 values (one per spatial dim), got ",
                v.size());
    return {*v.begin(), *(v.end() - 1)};
  }
};

inline void refuse_inplace(bool inplace, const char* fn) {
  DBRQ_ENSURE(!inplace, ValueError, "F::", fn,
              ": inplace(true) is not supported (dbrq has no in-place ", fn, "); write x = F::", fn, "(x, ...)");
}

}  // namespace detail

// ---- activations ----

struct ReLUFuncOptions {
  using Self = ReLUFuncOptions;
  ReLUFuncOptions(bool inplace = false) : inplace_(inplace) {}  // NOLINT
  DBRQ_OPTION(bool, inplace);
};
using ReLU6FuncOptions = ReLUFuncOptions;

struct HardtanhFuncOptions {
  using Self = HardtanhFuncOptions;
  DBRQ_OPTION(double, min_val) = -1.0;
  DBRQ_OPTION(double, max_val) = 1.0;
  DBRQ_OPTION(bool, inplace) = false;
};

struct LeakyReLUFuncOptions {
  using Self = LeakyReLUFuncOptions;
  DBRQ_OPTION(double, negative_slope) = 0.01;
  DBRQ_OPTION(bool, inplace) = false;
};

struct ELUFuncOptions {
  using Self = ELUFuncOptions;
  DBRQ_OPTION(double, alpha) = 1.0;
  DBRQ_OPTION(bool, inplace) = false;
};

using GELUFuncOptions = nn::GELUOptions;
using SoftplusFuncOptions = nn::SoftplusOptions;
using SoftmaxFuncOptions = nn::SoftmaxOptions;
using LogSoftmaxFuncOptions = nn::SoftmaxOptions;

// In place (inplace(true)) acts like x.relu_() on the caller's tensor: a named tensor is updated,
// as in libtorch. relu6 and hardtanh in place are x.clamp_(min, max).
inline Tensor relu(Tensor& input, const ReLUFuncOptions& o = {}) {
  return o.inplace() ? input.relu_() : dbrq::relu(input);
}
inline Tensor relu(Tensor&& input, const ReLUFuncOptions& o = {}) { return relu(input, o); }
inline Tensor relu(const Tensor& input, const ReLUFuncOptions& o = {}) {
  DBRQ_ENSURE(!o.inplace(), ValueError, "F::relu: inplace(true) on a const tensor");
  return dbrq::relu(input);
}
inline Tensor relu6(Tensor& input, const ReLU6FuncOptions& o = {}) {
  return o.inplace() ? input.clamp_(0.0, 6.0) : dbrq::relu6(input);
}
inline Tensor relu6(Tensor&& input, const ReLU6FuncOptions& o = {}) { return relu6(input, o); }
inline Tensor relu6(const Tensor& input, const ReLU6FuncOptions& o = {}) {
  DBRQ_ENSURE(!o.inplace(), ValueError, "F::relu6: inplace(true) on a const tensor");
  return dbrq::relu6(input);
}
inline Tensor hardtanh(Tensor& input, const HardtanhFuncOptions& o = {}) {
  return o.inplace() ? input.clamp_(o.min_val(), o.max_val()) : dbrq::hardtanh(input, o.min_val(), o.max_val());
}
inline Tensor hardtanh(Tensor&& input, const HardtanhFuncOptions& o = {}) { return hardtanh(input, o); }
inline Tensor hardtanh(const Tensor& input, const HardtanhFuncOptions& o = {}) {
  DBRQ_ENSURE(!o.inplace(), ValueError, "F::hardtanh: inplace(true) on a const tensor");
  return dbrq::hardtanh(input, o.min_val(), o.max_val());
}
inline Tensor leaky_relu(const Tensor& input, const LeakyReLUFuncOptions& o = {}) {
  detail::refuse_inplace(o.inplace(), "leaky_relu");
  return dbrq::leaky_relu(input, o.negative_slope());
}
inline Tensor elu(const Tensor& input, const ELUFuncOptions& o = {}) {
  detail::refuse_inplace(o.inplace(), "elu");
  return dbrq::elu(input, o.alpha());
}
inline Tensor gelu(const Tensor& input, const GELUFuncOptions& o = {}) { return dbrq::gelu(input, o.approximate()); }
inline Tensor silu(const Tensor& input) { return dbrq::silu(input); }
inline Tensor mish(const Tensor& input) { return dbrq::mish(input); }
inline Tensor hardswish(const Tensor& input) { return dbrq::hardswish(input); }
inline Tensor softplus(const Tensor& input, const SoftplusFuncOptions& o = {}) {
  return dbrq::softplus(input, o.beta(), o.threshold());
}
inline Tensor prelu(const Tensor& input, const Tensor& weight) { return dbrq::prelu(input, weight); }
inline Tensor softmax(const Tensor& input, const SoftmaxFuncOptions& o) { return dbrq::softmax(input, o.dim()); }
inline Tensor log_softmax(const Tensor& input, const LogSoftmaxFuncOptions& o) {
  return dbrq::log_softmax(input, o.dim());
}

// ---- pooling (square windows, as the layers'; stride 0: the kernel size) ----

using MaxPool2dFuncOptions = nn::MaxPool2dOptions;
using AvgPool2dFuncOptions = nn::AvgPool2dOptions;
using AdaptiveAvgPool2dFuncOptions = nn::AdaptiveAvgPool2dOptions;
using MaxPool1dFuncOptions = nn::MaxPool1dOptions;
using AvgPool1dFuncOptions = nn::AvgPool1dOptions;
using AdaptiveAvgPool1dFuncOptions = nn::AdaptiveAvgPool1dOptions;

inline Tensor max_pool2d(const Tensor& input, const MaxPool2dFuncOptions& o) {
  return dbrq::max_pool2d(input, o.kernel_size(), o.stride(), o.padding(), o.dilation(), o.ceil_mode());
}
inline Tensor avg_pool2d(const Tensor& input, const AvgPool2dFuncOptions& o) {
  return dbrq::avg_pool2d(input, o.kernel_size(), o.stride(), o.padding(), o.ceil_mode(), o.count_include_pad());
}
inline Tensor adaptive_avg_pool2d(const Tensor& input, const AdaptiveAvgPool2dFuncOptions& o) {
  return dbrq::adaptive_avg_pool2d(input, o.output_size());
}
inline Tensor max_pool1d(const Tensor& input, const MaxPool1dFuncOptions& o) {
  return dbrq::max_pool1d(input, o.kernel_size(), o.stride() == 0 ? std::nullopt : std::optional<int64_t>(o.stride()),
                          o.padding(), o.dilation(), o.ceil_mode());
}
inline Tensor avg_pool1d(const Tensor& input, const AvgPool1dFuncOptions& o) {
  return dbrq::avg_pool1d(input, o.kernel_size(), o.stride() == 0 ? std::nullopt : std::optional<int64_t>(o.stride()),
                          o.padding(), o.ceil_mode(), o.count_include_pad());
}
inline Tensor adaptive_avg_pool1d(const Tensor& input, const AdaptiveAvgPool1dFuncOptions& o) {
  return dbrq::adaptive_avg_pool1d(input, o.output_size());
}

// ---- dropout: libtorch's F::dropout defaults to training(true) (pass is_training()) ----

struct DropoutFuncOptions {
  using Self = DropoutFuncOptions;
  DBRQ_OPTION(double, p) = 0.5;
  DBRQ_OPTION(bool, training) = true;
  DBRQ_OPTION(bool, inplace) = false;
};

inline Tensor dropout(const Tensor& input, const DropoutFuncOptions& o = {}) {
  detail::refuse_inplace(o.inplace(), "dropout");
  return dbrq::dropout(input, o.p(), o.training());
}

// ---- normalizations ----

struct BatchNormFuncOptions {
  using Self = BatchNormFuncOptions;
  DBRQ_OPTION(Tensor, weight);
  DBRQ_OPTION(Tensor, bias);
  // PyTorch normalizes with the batch's statistics when training; dbrq runs inference only.
  DBRQ_OPTION(bool, training) = false;
  DBRQ_OPTION(double, momentum) = 0.1;
  DBRQ_OPTION(double, eps) = 1e-5;
};

inline Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                         const BatchNormFuncOptions& o = {}) {
  DBRQ_ENSURE(!o.training(), ValueError,
              "F::batch_norm: training(true) is not supported (it normalizes with the batch's statistics); dbrq "
              "runs inference with the running statistics");
  return dbrq::batch_norm(input, running_mean, running_var, o.weight(), o.bias(), o.eps());
}

struct LayerNormFuncOptions {
  using Self = LayerNormFuncOptions;
  LayerNormFuncOptions(std::vector<int64_t> normalized_shape)  // NOLINT
      : normalized_shape_(std::move(normalized_shape)) {}
  DBRQ_OPTION(std::vector<int64_t>, normalized_shape);
  DBRQ_OPTION(Tensor, weight);
  DBRQ_OPTION(Tensor, bias);
  DBRQ_OPTION(double, eps) = 1e-5;
};

inline Tensor layer_norm(const Tensor& input, const LayerNormFuncOptions& o) {
  return dbrq::layer_norm(input, o.normalized_shape(), o.weight(), o.bias(), o.eps());
}

struct GroupNormFuncOptions {
  using Self = GroupNormFuncOptions;
  GroupNormFuncOptions(int64_t num_groups) : num_groups_(num_groups) {}  // NOLINT
  DBRQ_OPTION(int64_t, num_groups);
  DBRQ_OPTION(Tensor, weight);
  DBRQ_OPTION(Tensor, bias);
  DBRQ_OPTION(double, eps) = 1e-5;
};

inline Tensor group_norm(const Tensor& input, const GroupNormFuncOptions& o) {
  return dbrq::group_norm(input, o.num_groups(), o.weight(), o.bias(), o.eps());
}

// use_input_stats(true) (the default): the input's own statistics; false: the running ones
// (which must be given), as PyTorch does.
struct InstanceNormFuncOptions {
  using Self = InstanceNormFuncOptions;
  DBRQ_OPTION(Tensor, running_mean);
  DBRQ_OPTION(Tensor, running_var);
  DBRQ_OPTION(Tensor, weight);
  DBRQ_OPTION(Tensor, bias);
  DBRQ_OPTION(bool, use_input_stats) = true;
  DBRQ_OPTION(double, momentum) = 0.1;
  DBRQ_OPTION(double, eps) = 1e-5;
};

inline Tensor instance_norm(const Tensor& input, const InstanceNormFuncOptions& o = {}) {
  if (o.use_input_stats()) return dbrq::instance_norm(input, o.weight(), o.bias(), o.eps());
  DBRQ_ENSURE(o.running_mean().defined() && o.running_var().defined(), ValueError,
              "F::instance_norm: use_input_stats(false) needs running_mean and running_var");
  return dbrq::batch_norm(input, o.running_mean(), o.running_var(), o.weight(), o.bias(), o.eps());
}

// ---- layers with weights ----

inline Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor()) {
  return dbrq::linear(input, weight, bias);
}

struct Conv2dFuncOptions {
  using Self = Conv2dFuncOptions;
  DBRQ_OPTION(Tensor, bias);
  DBRQ_OPTION(detail::Expanding2, stride) = 1;
  DBRQ_OPTION(detail::Expanding2, padding) = 0;
  DBRQ_OPTION(detail::Expanding2, dilation) = 1;
  DBRQ_OPTION(int64_t, groups) = 1;
};

inline Tensor conv2d(const Tensor& input, const Tensor& weight, const Conv2dFuncOptions& o = {}) {
  return dbrq::conv2d(input, weight, o.bias(),
                      Conv2dParams{o.stride().value, o.padding().value, o.dilation().value, o.groups()});
}

struct ConvTranspose2dFuncOptions {
  using Self = ConvTranspose2dFuncOptions;
  DBRQ_OPTION(Tensor, bias);
  DBRQ_OPTION(detail::Expanding2, stride) = 1;
  DBRQ_OPTION(detail::Expanding2, padding) = 0;
  DBRQ_OPTION(detail::Expanding2, output_padding) = 0;
  DBRQ_OPTION(detail::Expanding2, dilation) = 1;
  DBRQ_OPTION(int64_t, groups) = 1;
};

inline Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const ConvTranspose2dFuncOptions& o = {}) {
  return dbrq::conv_transpose2d(
      input, weight, o.bias(),
      ConvTranspose2dParams{o.stride().value, o.padding().value, o.output_padding().value, o.dilation().value,
                            o.groups()});
}

struct Conv1dFuncOptions {
  using Self = Conv1dFuncOptions;
  DBRQ_OPTION(Tensor, bias);
  DBRQ_OPTION(int64_t, stride) = 1;
  DBRQ_OPTION(int64_t, padding) = 0;
  DBRQ_OPTION(int64_t, dilation) = 1;
  DBRQ_OPTION(int64_t, groups) = 1;
};

inline Tensor conv1d(const Tensor& input, const Tensor& weight, const Conv1dFuncOptions& o = {}) {
  return dbrq::conv1d(input, weight, o.bias(), Conv1dParams{o.stride(), o.padding(), o.dilation(), o.groups()});
}

// ---- resampling and padding ----

// size / scale_factor: one value (both spatial dims) or one per spatial dim of the 4-D input.
struct InterpolateFuncOptions {
  using Self = InterpolateFuncOptions;
  DBRQ_OPTION(std::optional<std::vector<int64_t>>, size);
  DBRQ_OPTION(std::optional<std::vector<double>>, scale_factor);
  DBRQ_OPTION(std::string, mode) = kNearest;
  DBRQ_OPTION(std::optional<bool>, align_corners);
  // dbrq computes PyTorch's recompute_scale_factor=None / false result; true is refused.
  DBRQ_OPTION(std::optional<bool>, recompute_scale_factor);
  DBRQ_OPTION(bool, antialias) = false;
};

namespace detail {

template <typename T>
std::optional<std::array<T, 2>> spatial2(const std::optional<std::vector<T>>& v, const char* what) {
  if (!v) return std::nullopt;
  DBRQ_ENSURE(v->size() == 1 || v->size() == 2, ValueError, "F::interpolate: ", what,
              " must have 1 value or 2 (one per spatial dim of a 4-D input), got ", v->size());
  return std::array<T, 2>{v->front(), v->back()};
}

}  // namespace detail

inline Tensor interpolate(const Tensor& input, const InterpolateFuncOptions& o = {}) {
  DBRQ_ENSURE(!o.recompute_scale_factor().value_or(false), ValueError,
              "F::interpolate: recompute_scale_factor(true) is not supported (dbrq's output uses the given "
              "scale_factor, PyTorch's recompute_scale_factor=None)");
  DBRQ_ENSURE(!o.antialias(), ValueError, "F::interpolate: antialias(true) is not supported");
  return dbrq::interpolate(input, detail::spatial2(o.size(), "size"), detail::spatial2(o.scale_factor(), "scale_factor"),
                           o.mode(), o.align_corners());
}

struct PadFuncOptions {
  using Self = PadFuncOptions;
  PadFuncOptions(std::vector<int64_t> pad) : pad_(std::move(pad)) {}  // NOLINT
  DBRQ_OPTION(std::vector<int64_t>, pad);
  DBRQ_OPTION(std::string, mode) = kConstant;
  DBRQ_OPTION(double, value) = 0.0;
};

inline Tensor pad(const Tensor& input, const PadFuncOptions& o) { return dbrq::pad(input, o.pad(), o.mode(), o.value()); }

}  // namespace nn::functional
}  // namespace dbrq
