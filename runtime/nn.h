// Built-in layers and containers, with PyTorch's parameter names (so torchvision state dicts
// load unchanged) and PyTorch's default initialization. As in libtorch, each module class XImpl has
// a holder X (end of this file):
//
//   dbrq::nn::Conv2d conv(dbrq::nn::Conv2dOptions(3, 64, 7).stride(2).padding(3).bias(false));
//   dbrq::nn::Sequential head(dbrq::nn::AdaptiveAvgPool2d(1), dbrq::nn::Flatten(1), dbrq::nn::Linear(512, 1000));
//   dbrq::Tensor y = head(conv(x));               // or head->forward(conv->forward(x)): the same hooked calls
//   auto raw = std::make_shared<dbrq::nn::Conv2dImpl>(3, 64, 7);   // without a holder: call as (*raw)(x)
//
// Layers are leaves for quantization (their ops belong to the enclosing user module);
// Sequential, ModuleList, ModuleDict and the recurrent LSTM and GRU are not (docs/recurrent.md).
// dbrq is an inference runtime: train() only changes Dropout (and LSTM / GRU dropout between
// layers); BatchNorm always uses its running statistics.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/module.h"
#include "runtime/ops.h"

namespace dbrq {

// Seeds the generator behind default parameter initialization.
void manual_seed(uint64_t seed);

namespace nn {

// A layer: a leaf module.
template <typename Derived>
class Layer : public CallableModule<Derived> {
 public:
  bool is_leaf() const override { return true; }

 protected:
  explicit Layer(std::string name) : CallableModule<Derived>(std::move(name)) {}
};

#define DBRQ_OPTION(Type, name)          \
  Self& name(Type v) {                   \
    name##_ = std::move(v);              \
    return *this;                        \
  }                                      \
  const Type& name() const { return name##_; } \
  Type name##_

using Int2 = std::array<int64_t, 2>;

struct Conv2dOptions {
  using Self = Conv2dOptions;
  Conv2dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_({kernel_size, kernel_size}) {}
  Conv2dOptions(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  DBRQ_OPTION(int64_t, in_channels);
  DBRQ_OPTION(int64_t, out_channels);
  DBRQ_OPTION(Int2, kernel_size);
  Self& stride(int64_t s) { return stride(std::array<int64_t, 2>{s, s}); }
  Self& padding(int64_t p) { return padding(std::array<int64_t, 2>{p, p}); }
  Self& dilation(int64_t d) { return dilation(std::array<int64_t, 2>{d, d}); }
  DBRQ_OPTION(Int2, stride) = {1, 1};
  DBRQ_OPTION(Int2, padding) = {0, 0};
  DBRQ_OPTION(Int2, dilation) = {1, 1};
  DBRQ_OPTION(int64_t, groups) = 1;
  DBRQ_OPTION(bool, bias) = true;
};

// Options of the other layers, as libtorch's (`BatchNorm2dOptions(64).eps(1e-3)`); each layer takes
// its options object as well as its positional arguments. Options dbrq cannot honour at inference
// are refused by the layer's constructor (BatchNorm's track_running_stats(false)).
struct LinearOptions {
  using Self = LinearOptions;
  LinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  DBRQ_OPTION(int64_t, in_features);
  DBRQ_OPTION(int64_t, out_features);
  DBRQ_OPTION(bool, bias) = true;
};

struct BatchNormOptions {
  using Self = BatchNormOptions;
  BatchNormOptions(int64_t num_features) : num_features_(num_features) {}  // NOLINT: implicit as libtorch's
  DBRQ_OPTION(int64_t, num_features);
  DBRQ_OPTION(double, eps) = 1e-5;
  // Only training updates the running statistics with it; kept for ports and printing.
  DBRQ_OPTION(double, momentum) = 0.1;
  DBRQ_OPTION(bool, affine) = true;
  DBRQ_OPTION(bool, track_running_stats) = true;
};
using BatchNorm1dOptions = BatchNormOptions;
using BatchNorm2dOptions = BatchNormOptions;

// Options of the 1-D and 2-D pools, one type per dimension as libtorch's MaxPoolOptions<D>:
// square windows (the layers' int arguments); stride 0: the kernel size.
template <int D>
struct MaxPoolOptions {
  using Self = MaxPoolOptions;
  MaxPoolOptions(int64_t kernel_size) : kernel_size_(kernel_size) {}  // NOLINT
  DBRQ_OPTION(int64_t, kernel_size);
  DBRQ_OPTION(int64_t, stride) = 0;
  DBRQ_OPTION(int64_t, padding) = 0;
  DBRQ_OPTION(int64_t, dilation) = 1;
  DBRQ_OPTION(bool, ceil_mode) = false;
};
using MaxPool1dOptions = MaxPoolOptions<1>;
using MaxPool2dOptions = MaxPoolOptions<2>;

template <int D>
struct AvgPoolOptions {
  using Self = AvgPoolOptions;
  AvgPoolOptions(int64_t kernel_size) : kernel_size_(kernel_size) {}  // NOLINT
  DBRQ_OPTION(int64_t, kernel_size);
  DBRQ_OPTION(int64_t, stride) = 0;
  DBRQ_OPTION(int64_t, padding) = 0;
  DBRQ_OPTION(bool, ceil_mode) = false;
  DBRQ_OPTION(bool, count_include_pad) = true;
};
using AvgPool1dOptions = AvgPoolOptions<1>;
using AvgPool2dOptions = AvgPoolOptions<2>;

struct AdaptiveAvgPool2dOptions {
  using Self = AdaptiveAvgPool2dOptions;
  AdaptiveAvgPool2dOptions(int64_t output_size) : output_size_({output_size, output_size}) {}  // NOLINT
  AdaptiveAvgPool2dOptions(Int2 output_size) : output_size_(output_size) {}                     // NOLINT
  DBRQ_OPTION(Int2, output_size);
};

struct LayerNormOptions {
  using Self = LayerNormOptions;
  LayerNormOptions(std::vector<int64_t> normalized_shape) : normalized_shape_(std::move(normalized_shape)) {}  // NOLINT
  DBRQ_OPTION(std::vector<int64_t>, normalized_shape);
  DBRQ_OPTION(double, eps) = 1e-5;
  DBRQ_OPTION(bool, elementwise_affine) = true;
};

struct EmbeddingOptions {
  using Self = EmbeddingOptions;
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  DBRQ_OPTION(int64_t, num_embeddings);
  DBRQ_OPTION(int64_t, embedding_dim);
};

struct DropoutOptions {
  using Self = DropoutOptions;
  DropoutOptions(double p = 0.5) : p_(p) {}  // NOLINT
  DBRQ_OPTION(double, p);
};

struct LeakyReLUOptions {
  using Self = LeakyReLUOptions;
  DBRQ_OPTION(double, negative_slope) = 0.01;
};

struct ELUOptions {
  using Self = ELUOptions;
  DBRQ_OPTION(double, alpha) = 1.0;
};

struct HardtanhOptions {
  using Self = HardtanhOptions;
  DBRQ_OPTION(double, min_val) = -1.0;
  DBRQ_OPTION(double, max_val) = 1.0;
};

struct SoftmaxOptions {
  using Self = SoftmaxOptions;
  SoftmaxOptions(int64_t dim) : dim_(dim) {}  // NOLINT
  DBRQ_OPTION(int64_t, dim);
};

struct FlattenOptions {
  using Self = FlattenOptions;
  DBRQ_OPTION(int64_t, start_dim) = 1;
  DBRQ_OPTION(int64_t, end_dim) = -1;
};

struct GELUOptions {
  using Self = GELUOptions;
  DBRQ_OPTION(std::string, approximate) = "none";
};

class Conv2dImpl : public Layer<Conv2dImpl> {
 public:
  explicit Conv2dImpl(const Conv2dOptions& options);
  Conv2dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1, int64_t padding = 0,
         int64_t dilation = 1, int64_t groups = 1, bool bias = true);
  Tensor forward(const Tensor& x) { return conv2d(x, weight, bias, params_); }
  const Conv2dParams& params() const { return params_; }
  const Conv2dOptions& options() const { return options_; }
  std::string extra_repr() const override;

  Tensor weight;  // [out, in/groups, kH, kW]
  Tensor bias;    // [out], or undefined

 private:
  Conv2dOptions options_;
  Conv2dParams params_;
};

class LinearImpl : public Layer<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias = true);
  explicit LinearImpl(const LinearOptions& o) : LinearImpl(o.in_features(), o.out_features(), o.bias()) {}
  Tensor forward(const Tensor& x) { return linear(x, weight, bias); }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  std::string extra_repr() const override;

  Tensor weight;  // [out, in]
  Tensor bias;    // [out], or undefined

 private:
  int64_t in_features_, out_features_;
};

// Throws UsageError for a batch norm called in training mode (a new module's default, as in
// libtorch), where PyTorch would use the batch's statistics: dbrq has no training-mode batch norm,
// and running it silently as inference computed another function than the libtorch model it was
// ported from. `what`: the layer's type name.
void refuse_training_mode_norm(const std::string& what);

// Normalizes over dim 1 with running statistics (eval mode only: refuse_training_mode_norm).
// BatchNorm1d takes [N, C] or [N, C, L].
template <typename Derived>
class BatchNormBase : public Layer<Derived> {
 public:
  Tensor forward(const Tensor& x) {
    if (this->is_training()) refuse_training_mode_norm(this->type_name());
    return batch_norm(x, running_mean, running_var, weight, bias, eps_);
  }
  int64_t num_features() const { return num_features_; }
  double eps() const { return eps_; }
  std::string extra_repr() const override;

  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 protected:
  BatchNormBase(std::string name, int64_t num_features, double eps, bool affine);
  BatchNormBase(std::string name, const BatchNormOptions& o)
      : BatchNormBase(checked_running_stats(name, o), o.num_features(), o.eps(), o.affine()) {}

 private:
  // dbrq always normalizes with the running statistics (PyTorch without them uses the batch's).
  static std::string checked_running_stats(std::string name, const BatchNormOptions& o) {
    DBRQ_ENSURE(o.track_running_stats(), ValueError, name,
                ": track_running_stats(false) is not supported (dbrq normalizes with running statistics at inference)");
    return name;
  }

 private:
  int64_t num_features_;
  double eps_;
};

class BatchNorm2dImpl : public BatchNormBase<BatchNorm2dImpl> {
 public:
  explicit BatchNorm2dImpl(int64_t num_features, double eps = 1e-5, bool affine = true)
      : BatchNormBase("BatchNorm2d", num_features, eps, affine) {}
  explicit BatchNorm2dImpl(const BatchNormOptions& o) : BatchNormBase("BatchNorm2d", o) {}
};

class BatchNorm1dImpl : public BatchNormBase<BatchNorm1dImpl> {
 public:
  explicit BatchNorm1dImpl(int64_t num_features, double eps = 1e-5, bool affine = true)
      : BatchNormBase("BatchNorm1d", num_features, eps, affine) {}
  explicit BatchNorm1dImpl(const BatchNormOptions& o) : BatchNormBase("BatchNorm1d", o) {}
};

class LayerNormImpl : public Layer<LayerNormImpl> {
 public:
  explicit LayerNormImpl(std::vector<int64_t> normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  explicit LayerNormImpl(const LayerNormOptions& o) : LayerNormImpl(o.normalized_shape(), o.eps(), o.elementwise_affine()) {}
  explicit LayerNormImpl(int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true)
      : LayerNormImpl(std::vector<int64_t>{normalized_size}, eps, elementwise_affine) {}
  Tensor forward(const Tensor& x);
  std::string extra_repr() const override;

  Tensor weight, bias;

 private:
  std::vector<int64_t> normalized_shape_;
  double eps_;
};

class EmbeddingImpl : public Layer<EmbeddingImpl> {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim);
  explicit EmbeddingImpl(const EmbeddingOptions& o) : EmbeddingImpl(o.num_embeddings(), o.embedding_dim()) {}
  Tensor forward(const Tensor& indices) { return embedding(indices, weight); }
  std::string extra_repr() const override;

  Tensor weight;  // [num_embeddings, embedding_dim], N(0, 1) initialized like PyTorch

 private:
  int64_t num_, dim_;
};

class ReLUImpl : public Layer<ReLUImpl> {
 public:
  ReLUImpl() : Layer("ReLU") {}
  Tensor forward(const Tensor& x) { return relu(x); }
};

class ReLU6Impl : public Layer<ReLU6Impl> {
 public:
  ReLU6Impl() : Layer("ReLU6") {}
  Tensor forward(const Tensor& x) { return relu6(x); }
};

class HardtanhImpl : public Layer<HardtanhImpl> {
 public:
  explicit HardtanhImpl(double min_val = -1.0, double max_val = 1.0) : Layer("Hardtanh"), min_(min_val), max_(max_val) {}
  explicit HardtanhImpl(const HardtanhOptions& o) : HardtanhImpl(o.min_val(), o.max_val()) {}
  Tensor forward(const Tensor& x) { return hardtanh(x, min_, max_); }

 private:
  double min_, max_;
};

class LeakyReLUImpl : public Layer<LeakyReLUImpl> {
 public:
  explicit LeakyReLUImpl(double negative_slope = 0.01) : Layer("LeakyReLU"), slope_(negative_slope) {}
  explicit LeakyReLUImpl(const LeakyReLUOptions& o) : LeakyReLUImpl(o.negative_slope()) {}
  Tensor forward(const Tensor& x) { return leaky_relu(x, slope_); }

 private:
  double slope_;
};

class ELUImpl : public Layer<ELUImpl> {
 public:
  explicit ELUImpl(double alpha = 1.0) : Layer("ELU"), alpha_(alpha) {}
  explicit ELUImpl(const ELUOptions& o) : ELUImpl(o.alpha()) {}
  Tensor forward(const Tensor& x) { return elu(x, alpha_); }
  std::string extra_repr() const override { return absl::StrCat("alpha=", alpha_); }

 private:
  double alpha_;
};

struct PReLUOptions {
  using Self = PReLUOptions;
  DBRQ_OPTION(int64_t, num_parameters) = 1;
  DBRQ_OPTION(double, init) = 0.25;
};

struct SoftplusOptions {
  using Self = SoftplusOptions;
  DBRQ_OPTION(double, beta) = 1.0;
  DBRQ_OPTION(double, threshold) = 20.0;
};

// weight: num_parameters values (1, or the input's channels), initialized to `init`.
class PReLUImpl : public Layer<PReLUImpl> {
 public:
  explicit PReLUImpl(int64_t num_parameters = 1, double init = 0.25);
  explicit PReLUImpl(const PReLUOptions& o) : PReLUImpl(o.num_parameters(), o.init()) {}
  Tensor forward(const Tensor& x) { return prelu(x, weight); }
  int64_t num_parameters() const { return num_parameters_; }
  std::string extra_repr() const override { return absl::StrCat("num_parameters=", num_parameters_); }

  Tensor weight;  // [num_parameters]

 private:
  int64_t num_parameters_;
};

class SoftplusImpl : public Layer<SoftplusImpl> {
 public:
  explicit SoftplusImpl(double beta = 1.0, double threshold = 20.0)
      : Layer("Softplus"), beta_(beta), threshold_(threshold) {}
  explicit SoftplusImpl(const SoftplusOptions& o) : SoftplusImpl(o.beta(), o.threshold()) {}
  Tensor forward(const Tensor& x) { return softplus(x, beta_, threshold_); }
  std::string extra_repr() const override { return absl::StrCat("beta=", beta_, ", threshold=", threshold_); }

 private:
  double beta_, threshold_;
};

class MishImpl : public Layer<MishImpl> {
 public:
  MishImpl() : Layer("Mish") {}
  Tensor forward(const Tensor& x) { return mish(x); }
};

class HardswishImpl : public Layer<HardswishImpl> {
 public:
  HardswishImpl() : Layer("Hardswish") {}
  Tensor forward(const Tensor& x) { return hardswish(x); }
};

class HardsigmoidImpl : public Layer<HardsigmoidImpl> {
 public:
  HardsigmoidImpl() : Layer("Hardsigmoid") {}
  Tensor forward(const Tensor& x) { return hardsigmoid(x); }
};

class SigmoidImpl : public Layer<SigmoidImpl> {
 public:
  SigmoidImpl() : Layer("Sigmoid") {}
  Tensor forward(const Tensor& x) { return sigmoid(x); }
};

class TanhImpl : public Layer<TanhImpl> {
 public:
  TanhImpl() : Layer("Tanh") {}
  Tensor forward(const Tensor& x) { return tanh(x); }
};

class GELUImpl : public Layer<GELUImpl> {
 public:
  explicit GELUImpl(std::string approximate = "none") : Layer("GELU"), approximate_(std::move(approximate)) {}
  explicit GELUImpl(const GELUOptions& o) : GELUImpl(o.approximate()) {}
  Tensor forward(const Tensor& x) { return gelu(x, approximate_); }

 private:
  std::string approximate_;
};

class SiLUImpl : public Layer<SiLUImpl> {
 public:
  SiLUImpl() : Layer("SiLU") {}
  Tensor forward(const Tensor& x) { return silu(x); }
};

class SoftmaxImpl : public Layer<SoftmaxImpl> {
 public:
  explicit SoftmaxImpl(int64_t dim) : Layer("Softmax"), dim_(dim) {}
  explicit SoftmaxImpl(const SoftmaxOptions& o) : SoftmaxImpl(o.dim()) {}
  Tensor forward(const Tensor& x) { return softmax(x, dim_); }

 private:
  int64_t dim_;
};

class MaxPool2dImpl : public Layer<MaxPool2dImpl> {
 public:
  // stride 0: the kernel size (PyTorch's default).
  explicit MaxPool2dImpl(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0, int64_t dilation = 1,
                     bool ceil_mode = false);
  explicit MaxPool2dImpl(const MaxPool2dOptions& o)
      : MaxPool2dImpl(o.kernel_size(), o.stride(), o.padding(), o.dilation(), o.ceil_mode()) {}
  Tensor forward(const Tensor& x);
  const Pool2dParams& params() const { return params_; }
  std::string extra_repr() const override;

 private:
  Pool2dParams params_;
};

class AvgPool2dImpl : public Layer<AvgPool2dImpl> {
 public:
  explicit AvgPool2dImpl(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0, bool ceil_mode = false,
                     bool count_include_pad = true);
  explicit AvgPool2dImpl(const AvgPool2dOptions& o)
      : AvgPool2dImpl(o.kernel_size(), o.stride(), o.padding(), o.ceil_mode(), o.count_include_pad()) {}
  Tensor forward(const Tensor& x);
  const Pool2dParams& params() const { return params_; }
  std::string extra_repr() const override;

 private:
  Pool2dParams params_;
};

class AdaptiveAvgPool2dImpl : public Layer<AdaptiveAvgPool2dImpl> {
 public:
  explicit AdaptiveAvgPool2dImpl(int64_t output_size) : AdaptiveAvgPool2dImpl({output_size, output_size}) {}
  explicit AdaptiveAvgPool2dImpl(std::array<int64_t, 2> output_size)
      : Layer("AdaptiveAvgPool2d"), output_size_(output_size) {}
  explicit AdaptiveAvgPool2dImpl(const AdaptiveAvgPool2dOptions& o) : AdaptiveAvgPool2dImpl(o.output_size()) {}
  Tensor forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size_); }
  std::string extra_repr() const override;

 private:
  std::array<int64_t, 2> output_size_;
};

// ---- spatial layers of issue 12: transposed conv, 1-D conv and pooling, upsampling, group norms ----

struct ConvTranspose2dOptions {
  using Self = ConvTranspose2dOptions;
  ConvTranspose2dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_({kernel_size, kernel_size}) {}
  ConvTranspose2dOptions(int64_t in_channels, int64_t out_channels, std::array<int64_t, 2> kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  DBRQ_OPTION(int64_t, in_channels);
  DBRQ_OPTION(int64_t, out_channels);
  DBRQ_OPTION(Int2, kernel_size);
  Self& stride(int64_t s) { return stride(std::array<int64_t, 2>{s, s}); }
  Self& padding(int64_t p) { return padding(std::array<int64_t, 2>{p, p}); }
  Self& output_padding(int64_t p) { return output_padding(std::array<int64_t, 2>{p, p}); }
  Self& dilation(int64_t d) { return dilation(std::array<int64_t, 2>{d, d}); }
  DBRQ_OPTION(Int2, stride) = {1, 1};
  DBRQ_OPTION(Int2, padding) = {0, 0};
  DBRQ_OPTION(Int2, output_padding) = {0, 0};
  DBRQ_OPTION(int64_t, groups) = 1;
  DBRQ_OPTION(bool, bias) = true;
  DBRQ_OPTION(Int2, dilation) = {1, 1};
};

// nn.ConvTranspose2d: weight [in, out/groups, kH, kW] (PyTorch's layout and names).
class ConvTranspose2dImpl : public Layer<ConvTranspose2dImpl> {
 public:
  explicit ConvTranspose2dImpl(const ConvTranspose2dOptions& options);
  Tensor forward(const Tensor& x) { return conv_transpose2d(x, weight, bias, params_); }
  const ConvTranspose2dParams& params() const { return params_; }
  const ConvTranspose2dOptions& options() const { return options_; }
  std::string extra_repr() const override;

  Tensor weight;  // [in, out/groups, kH, kW]
  Tensor bias;    // [out], or undefined

 private:
  ConvTranspose2dOptions options_;
  ConvTranspose2dParams params_;
};

struct Conv1dOptions {
  using Self = Conv1dOptions;
  Conv1dOptions(int64_t in_channels, int64_t out_channels, int64_t kernel_size)
      : in_channels_(in_channels), out_channels_(out_channels), kernel_size_(kernel_size) {}
  DBRQ_OPTION(int64_t, in_channels);
  DBRQ_OPTION(int64_t, out_channels);
  DBRQ_OPTION(int64_t, kernel_size);
  DBRQ_OPTION(int64_t, stride) = 1;
  DBRQ_OPTION(int64_t, padding) = 0;
  DBRQ_OPTION(int64_t, dilation) = 1;
  DBRQ_OPTION(int64_t, groups) = 1;
  DBRQ_OPTION(bool, bias) = true;
};

// nn.Conv1d: weight [out, in/groups, kL].
class Conv1dImpl : public Layer<Conv1dImpl> {
 public:
  explicit Conv1dImpl(const Conv1dOptions& options);
  Tensor forward(const Tensor& x) { return conv1d(x, weight, bias, params_); }
  const Conv1dParams& params() const { return params_; }
  const Conv1dOptions& options() const { return options_; }
  std::string extra_repr() const override;

  Tensor weight;  // [out, in/groups, kL]
  Tensor bias;    // [out], or undefined

 private:
  Conv1dOptions options_;
  Conv1dParams params_;
};

struct AdaptiveAvgPool1dOptions {
  using Self = AdaptiveAvgPool1dOptions;
  AdaptiveAvgPool1dOptions(int64_t output_size) : output_size_(output_size) {}  // NOLINT
  DBRQ_OPTION(int64_t, output_size);
};

class MaxPool1dImpl : public Layer<MaxPool1dImpl> {
 public:
  // stride 0: the kernel size (PyTorch's default).
  explicit MaxPool1dImpl(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0, int64_t dilation = 1,
                     bool ceil_mode = false);
  explicit MaxPool1dImpl(const MaxPool1dOptions& o)
      : MaxPool1dImpl(o.kernel_size(), o.stride(), o.padding(), o.dilation(), o.ceil_mode()) {}
  Tensor forward(const Tensor& x) { return max_pool1d(x, kernel_size_, stride_, padding_, dilation_, ceil_mode_); }
  std::string extra_repr() const override;

 private:
  int64_t kernel_size_, stride_, padding_, dilation_;
  bool ceil_mode_;
};

class AvgPool1dImpl : public Layer<AvgPool1dImpl> {
 public:
  explicit AvgPool1dImpl(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0, bool ceil_mode = false,
                     bool count_include_pad = true);
  explicit AvgPool1dImpl(const AvgPool1dOptions& o)
      : AvgPool1dImpl(o.kernel_size(), o.stride(), o.padding(), o.ceil_mode(), o.count_include_pad()) {}
  Tensor forward(const Tensor& x) {
    return avg_pool1d(x, kernel_size_, stride_, padding_, ceil_mode_, count_include_pad_);
  }
  std::string extra_repr() const override;

 private:
  int64_t kernel_size_, stride_, padding_;
  bool ceil_mode_, count_include_pad_;
};

class AdaptiveAvgPool1dImpl : public Layer<AdaptiveAvgPool1dImpl> {
 public:
  explicit AdaptiveAvgPool1dImpl(int64_t output_size);
  explicit AdaptiveAvgPool1dImpl(const AdaptiveAvgPool1dOptions& o) : AdaptiveAvgPool1dImpl(o.output_size()) {}
  Tensor forward(const Tensor& x) { return adaptive_avg_pool1d(x, output_size_); }
  std::string extra_repr() const override { return absl::StrCat("output_size=", output_size_); }

 private:
  int64_t output_size_;
};

// nn.Upsample: exactly one of size / scale_factor (a single value or one per spatial dim).
struct UpsampleOptions {
  using Self = UpsampleOptions;
  Self& size(int64_t s) { return size(Int2{s, s}, true); }
  Self& size(Int2 s, bool scalar = false) {
    size_ = s;
    scalar_ = scalar;
    return *this;
  }
  Self& scale_factor(double f) { return scale_factor(std::array<double, 2>{f, f}, true); }
  Self& scale_factor(std::array<double, 2> f, bool scalar = false) {
    scale_factor_ = f;
    scalar_ = scalar;
    return *this;
  }
  // libtorch's forms: a std::vector (size(std::vector<int64_t>({h, w}))) or a braced list, of one
  // value or one per spatial dim.
  Self& size(const std::vector<int64_t>& s) { return size(two(s, "size"), s.size() == 1); }
  Self& size(std::initializer_list<int64_t> s) { return size(std::vector<int64_t>(s)); }
  Self& scale_factor(const std::vector<double>& f) { return scale_factor(two(f, "scale_factor"), f.size() == 1); }
  Self& scale_factor(std::initializer_list<double> f) { return scale_factor(std::vector<double>(f)); }
  Self& mode(std::string m) {
    mode_ = std::move(m);
    return *this;
  }
  Self& align_corners(bool a) {
    align_corners_ = a;
    return *this;
  }
  const std::optional<Int2>& size() const { return size_; }
  const std::optional<std::array<double, 2>>& scale_factor() const { return scale_factor_; }
  const std::string& mode() const { return mode_; }
  const std::optional<bool>& align_corners() const { return align_corners_; }
  bool scalar() const { return scalar_; }  // given as one value (printing)

 private:
  template <typename T>
  static std::array<T, 2> two(const std::vector<T>& v, const char* what) {
    DBRQ_ENSURE(v.size() == 1 || v.size() == 2, ValueError, "Upsample: ", what,
                " must have 1 value or 2 (one per spatial dim), got ", v.size());
    return {v.front(), v.back()};
  }
  std::optional<Int2> size_;
  std::optional<std::array<double, 2>> scale_factor_;
  std::string mode_ = "nearest";
  std::optional<bool> align_corners_;
  bool scalar_ = false;
};

class UpsampleImpl : public Layer<UpsampleImpl> {
 public:
  explicit UpsampleImpl(const UpsampleOptions& options);
  Tensor forward(const Tensor& x) {
    return interpolate(x, o_.size(), o_.scale_factor(), o_.mode(), o_.align_corners());
  }
  const UpsampleOptions& options() const { return o_; }
  std::string extra_repr() const override;

 private:
  UpsampleOptions o_;
};

struct GroupNormOptions {
  using Self = GroupNormOptions;
  GroupNormOptions(int64_t num_groups, int64_t num_channels) : num_groups_(num_groups), num_channels_(num_channels) {}
  DBRQ_OPTION(int64_t, num_groups);
  DBRQ_OPTION(int64_t, num_channels);
  DBRQ_OPTION(double, eps) = 1e-5;
  DBRQ_OPTION(bool, affine) = true;
};

// libtorch's InstanceNormOptions (PyTorch's defaults: affine and track_running_stats off).
struct InstanceNormOptions {
  using Self = InstanceNormOptions;
  InstanceNormOptions(int64_t num_features) : num_features_(num_features) {}  // NOLINT
  DBRQ_OPTION(int64_t, num_features);
  DBRQ_OPTION(double, eps) = 1e-5;
  // Only training updates the running statistics with it; kept for ports and printing.
  DBRQ_OPTION(double, momentum) = 0.1;
  DBRQ_OPTION(bool, affine) = false;
  DBRQ_OPTION(bool, track_running_stats) = false;
};
using InstanceNorm2dOptions = InstanceNormOptions;

// nn.GroupNorm: weight (ones) and bias (zeros) [C] when affine.
class GroupNormImpl : public Layer<GroupNormImpl> {
 public:
  GroupNormImpl(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true);
  explicit GroupNormImpl(const GroupNormOptions& o) : GroupNormImpl(o.num_groups(), o.num_channels(), o.eps(), o.affine()) {}
  Tensor forward(const Tensor& x) { return group_norm(x, num_groups_, weight, bias, eps_); }
  std::string extra_repr() const override;

  Tensor weight, bias;

 private:
  int64_t num_groups_, num_channels_;
  double eps_;
};

// nn.InstanceNorm2d (PyTorch's defaults: affine=false, track_running_stats=false, so the input's
// own statistics always). With track_running_stats the running statistics are used (dbrq runs
// inference: they are never updated).
class InstanceNorm2dImpl : public Layer<InstanceNorm2dImpl> {
 public:
  explicit InstanceNorm2dImpl(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = false,
                          bool track_running_stats = false);
  explicit InstanceNorm2dImpl(const InstanceNorm2dOptions& o)
      : InstanceNorm2dImpl(o.num_features(), o.eps(), o.momentum(), o.affine(), o.track_running_stats()) {}
  Tensor forward(const Tensor& x);
  std::string extra_repr() const override;

  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  int64_t num_features_;
  double eps_, momentum_;
  bool affine_, track_running_stats_;
};

class FlattenImpl : public Layer<FlattenImpl> {
 public:
  explicit FlattenImpl(int64_t start_dim = 1, int64_t end_dim = -1) : Layer("Flatten"), start_(start_dim), end_(end_dim) {}
  explicit FlattenImpl(const FlattenOptions& o) : FlattenImpl(o.start_dim(), o.end_dim()) {}
  Tensor forward(const Tensor& x) { return flatten(x, start_, end_); }

 private:
  int64_t start_, end_;
};

class DropoutImpl : public Layer<DropoutImpl> {
 public:
  explicit DropoutImpl(double p = 0.5);
  explicit DropoutImpl(const DropoutOptions& o) : DropoutImpl(o.p()) {}
  Tensor forward(const Tensor& x) { return dropout(x, p_, this->is_training()); }
  std::string extra_repr() const override;

 private:
  double p_;
};

class IdentityImpl : public Layer<IdentityImpl> {
 public:
  IdentityImpl() : Layer("Identity") {}
  Tensor forward(const Tensor& x) { return identity(x); }
};

// ---- recurrent layers -------------------------------------------------------------------------

// Options of LSTM and GRU, as PyTorch's constructor arguments.
struct RNNOptions {
  using Self = RNNOptions;
  RNNOptions(int64_t input_size, int64_t hidden_size) : input_size_(input_size), hidden_size_(hidden_size) {}
  DBRQ_OPTION(int64_t, input_size);
  DBRQ_OPTION(int64_t, hidden_size);
  DBRQ_OPTION(int64_t, num_layers) = 1;
  DBRQ_OPTION(bool, bias) = true;
  // [B, T, features] instead of [T, B, features] for the input and the output (not the states).
  DBRQ_OPTION(bool, batch_first) = false;
  // Dropout on each layer's output except the last, in training mode only.
  DBRQ_OPTION(double, dropout) = 0.0;
  DBRQ_OPTION(bool, bidirectional) = false;
};
using LSTMOptions = RNNOptions;
using GRUOptions = RNNOptions;

// The parameters of one layer and direction (PyTorch's weight_ih_l{k}[_reverse], ...).
struct RNNWeights {
  Tensor weight_ih;  // [gates * hidden, input_size (layer 0) or D * hidden]
  Tensor weight_hh;  // [gates * hidden, hidden]
  Tensor bias_ih;    // [gates * hidden], or undefined without bias
  Tensor bias_hh;
};

namespace detail {

enum class RNNMode { kLSTM, kGRU };

// What LSTM and GRU share: options, parameters under PyTorch's names, argument checks and the
// layer / direction / time loops (nn.cc).
//
// LSTM and GRU are not leaves: like Sequential (and unlike Linear) they are modules written with
// the functional API, so their ops are recorded in their own quantization state. Their matrix
// products are functional linear calls on their registered weights, which is what the dynamic
// mapping (default_dynamic_qconfig_mapping: linear -> dynamic) quantizes; the gate arithmetic is
// ordinary elementwise ops. The batch plumbing (sorting packed sequences by length, the state
// buffers, writing each step into the output) goes through metadata-only views and copy_, which
// record nothing, so every batch size, layout and pattern of lengths runs the same recorded ops.
// docs/recurrent.md explains the choice.
class RNNImpl {
 public:
  RNNImpl(Module& self, RNNMode mode, const RNNOptions& options);
  // Returns output (in the input's layout), h_n and, for LSTM, c_n. h0 / c0 undefined: zeros.
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& input, const Tensor& h0, const Tensor& c0,
                                             const std::vector<int64_t>& lengths, bool training) const;
  const RNNOptions& options() const { return options_; }
  const RNNWeights& weights(int64_t layer, int64_t direction) const;
  std::string extra_repr() const;

 private:
  // Checks the arguments (ShapeError / DTypeError / ValueError naming the module type).
  void check_args(const Tensor& input, const Tensor& h0, const Tensor& c0, const std::vector<int64_t>& lengths) const;
  Module& self_;
  RNNMode mode_;
  RNNOptions options_;
  int64_t gates_;                  // 4 (LSTM: i, f, g, o) or 3 (GRU: r, z, n)
  std::vector<RNNWeights> cells_;  // layer * directions + direction
};

}  // namespace detail

// A multi-layer LSTM with PyTorch's semantics and parameter names (weight_ih_l0, weight_hh_l0,
// bias_ih_l0, bias_hh_l0, ..._reverse), gate order i, f, g, o:
//
//   dbrq::nn::LSTM lstm(dbrq::nn::LSTMOptions(32, 64).num_layers(2).batch_first(true));
//   auto [out, state] = lstm(x);                        // x [B, T, 32] -> out [B, T, 64]
//   auto [h_n, c_n] = state;                               // [2, B, 64] each
//   auto [out2, state2] = lstm(x, std::make_tuple(h0, c0));
//   auto [out3, state3] = lstm(x, std::nullopt, lengths);   // per-sequence lengths (packed)
//
// input: [T, B, input_size] ([B, T, input_size] with batch_first), or [T, input_size] unbatched.
// hx: (h0, c0), each [num_layers * D, B, hidden_size] ([num_layers * D, hidden_size] unbatched;
// D = 2 when bidirectional); zeros when absent. lengths (batched input only): B values in [1, T];
// sequence b's recurrence runs over its first lengths[b] steps only (both directions), its output
// is zero beyond them and h_n / c_n hold its state at its own end, as PyTorch's GRU / LSTM on a
// pack_padded_sequence(..., enforce_sorted=False) followed by pad_packed_sequence.
// Returns (output [T, B, D * hidden_size] in the input's layout, (h_n, c_n)).
class LSTMImpl : public CallableModule<LSTMImpl> {
 public:
  explicit LSTMImpl(const LSTMOptions& options);
  LSTMImpl(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1)
      : LSTMImpl(LSTMOptions(input_size, hidden_size).num_layers(num_layers)) {}
  std::tuple<Tensor, std::tuple<Tensor, Tensor>> forward(
      const Tensor& input, const std::optional<std::tuple<Tensor, Tensor>>& hx = std::nullopt,
      const std::vector<int64_t>& lengths = {});
  const LSTMOptions& options() const { return impl_.options(); }
  const RNNWeights& weights(int64_t layer, int64_t direction = 0) const { return impl_.weights(layer, direction); }
  std::string extra_repr() const override { return impl_.extra_repr(); }

 private:
  detail::RNNImpl impl_;
};

// A multi-layer GRU with PyTorch's semantics and parameter names, gate order r, z, n:
//   r = sigmoid(W_ir x + b_ir + W_hr h + b_hr),  z = sigmoid(W_iz x + b_iz + W_hz h + b_hz),
//   n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),  h' = (1 - z) * n + z * h.
//
//   dbrq::nn::GRU gru(dbrq::nn::GRUOptions(32, 64).bidirectional(true));
//   auto [out, h_n] = gru(x);                  // x [T, B, 32] -> out [T, B, 128], h_n [2, B, 64]
//   auto [out2, h2] = gru(x, h0, lengths);
//
// Arguments and results as LSTM's, with one state tensor.
class GRUImpl : public CallableModule<GRUImpl> {
 public:
  explicit GRUImpl(const GRUOptions& options);
  GRUImpl(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1)
      : GRUImpl(GRUOptions(input_size, hidden_size).num_layers(num_layers)) {}
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const Tensor& hx = Tensor(),
                                     const std::vector<int64_t>& lengths = {});
  const GRUOptions& options() const { return impl_.options(); }
  const RNNWeights& weights(int64_t layer, int64_t direction = 0) const { return impl_.weights(layer, direction); }
  std::string extra_repr() const override { return impl_.extra_repr(); }

 private:
  detail::RNNImpl impl_;
};

namespace detail {
const std::shared_ptr<Module>& child_at(const Module& m, size_t i);
}  // namespace detail

// Calls its children in order, each with the previous one's output. The base of Sequential and of
// user classes that are a Sequential with extra behaviour (libtorch's `struct X : SequentialImpl`):
//
//   struct DenseLayer : dbrq::nn::SequentialBase<DenseLayer> {
//     DenseLayer() { push_back(bn); push_back(relu); push_back(conv); }
//     dbrq::Tensor forward(const dbrq::Tensor& x) { return dbrq::cat({x, SequentialBase::forward(x)}, 1); }
//   };
//
// Calling a DenseLayer runs DenseLayer::forward; without one, the chain. Sequential itself is
// final: `struct X : Sequential { forward(..) }` would compile yet always run Sequential::forward.
template <typename Derived>
class SequentialBase : public CallableModule<Derived> {
 public:
  void push_back(std::shared_ptr<Module> module) { push_back(std::to_string(size()), std::move(module)); }
  void push_back(const std::string& name, std::shared_ptr<Module> module) {
    this->register_module(name, std::move(module));
  }
  Tensor forward(Tensor x) {
    for (auto& [name, m] : this->named_children()) x = m->forward_unary(x);
    return x;
  }
  size_t size() const { return this->named_children().size(); }
  bool is_empty() const { return size() == 0; }
  const std::shared_ptr<Module>& operator[](size_t i) const { return detail::child_at(*this, i); }
  // The i-th child as class M (a module class or its holder: at<nn::Conv2d> gives a Conv2dImpl);
  // ValueError when it is another class.
  template <typename M>
  std::shared_ptr<detail::ImplOfT<M>> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<detail::ImplOfT<M>>((*this)[i]);
    DBRQ_ENSURE(m != nullptr, ValueError, this->type_name(), "::at(", i, "): child is a ", (*this)[i]->type_name(),
                ", not a ", detail::module_type_name<M>());
    return m;
  }
  // libtorch's names for the same: ptr(i) is operator[], ptr<M>(i) is at<M>(i).
  const std::shared_ptr<Module>& ptr(size_t i) const { return (*this)[i]; }
  template <typename M>
  std::shared_ptr<detail::ImplOfT<M>> ptr(size_t i) const {
    return at<M>(i);
  }

 protected:
  SequentialBase() = default;
  explicit SequentialBase(std::string type_name) : CallableModule<Derived>(std::move(type_name)) {}
};

namespace detail {
template <typename T>
struct IsNamedItem : std::false_type {};
template <typename S, typename M>
struct IsNamedItem<std::pair<S, M>>
    : std::bool_constant<std::is_convertible_v<S, std::string> && std::is_convertible_v<M, std::shared_ptr<Module>>> {};
// An argument of Sequential(a, b, c): a module pointer, a holder, or a (name, module) pair.
template <typename T>
constexpr bool is_sequential_item() {
  using D = std::decay_t<T>;
  return std::is_convertible_v<const D&, std::shared_ptr<Module>> || IsNamedItem<D>::value;
}
}  // namespace detail

class SequentialImpl : public SequentialBase<SequentialImpl> {
 public:
  SequentialImpl() : SequentialBase("Sequential") {}
  explicit SequentialImpl(std::vector<std::shared_ptr<Module>> modules);  // named "0", "1", ...
  explicit SequentialImpl(std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules);
  // libtorch's variadic form: Sequential(conv, std::make_shared<ReLU>(), Fire(64, 16)), each a
  // std::shared_ptr to a module, a holder (DBRQ_MODULE) or a (name, module) pair; unnamed ones are
  // named by their position ("0", "1", ...).
  template <typename First, typename... Rest,
            typename = std::enable_if_t<detail::is_sequential_item<First>() &&
                                        (detail::is_sequential_item<Rest>() && ...)>>
  explicit SequentialImpl(First&& first, Rest&&... rest) : SequentialImpl() {
    add_item(first);
    (add_item(rest), ...);
  }

 private:
  template <typename T>
  void add_item(const T& item) {
    if constexpr (detail::IsNamedItem<T>::value) {
      push_back(std::string(item.first), std::shared_ptr<Module>(item.second));
    } else {
      push_back(std::shared_ptr<Module>(item));
    }
  }
};

// Wraps a function of one tensor as a module, to put it in a Sequential (libtorch's
// nn::Functional). Extra arguments are bound after the tensor:
//
//   Sequential(conv, Functional(dbrq::relu), Functional(dbrq::leaky_relu, 0.2),
//              Functional([](const Tensor& x) { return dbrq::max_pool2d(x, 3, 2, 1); }));
//
// Not a layer: the ops it runs are recorded in its own quantization state like any user module's,
// so a function of several ops works as well as one op.
class FunctionalImpl : public CallableModule<FunctionalImpl> {
 public:
  using Function = std::function<Tensor(const Tensor&)>;
  explicit FunctionalImpl(Function function);
  template <typename F, typename A, typename... More>
  FunctionalImpl(F function, A arg, More... more)
      : FunctionalImpl(Function([function, arg, more...](const Tensor& x) -> Tensor { return function(x, arg, more...); })) {}
  Tensor forward(const Tensor& x) { return function_(x); }

 private:
  Function function_;
};

// Holds modules for the user's forward to iterate; not callable itself.
class ModuleListImpl : public Module {
 public:
  ModuleListImpl() : Module("ModuleList", typeid(ModuleListImpl)) {}
  explicit ModuleListImpl(std::vector<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return named_children().size(); }
  bool is_empty() const { return size() == 0; }
  const std::shared_ptr<Module>& operator[](size_t i) const;
  // As SequentialBase::at / ptr.
  template <typename M>
  std::shared_ptr<detail::ImplOfT<M>> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<detail::ImplOfT<M>>((*this)[i]);
    DBRQ_ENSURE(m != nullptr, ValueError, "ModuleList::at(", i, "): child is a ", (*this)[i]->type_name(), ", not a ",
                detail::module_type_name<M>());
    return m;
  }
  const std::shared_ptr<Module>& ptr(size_t i) const { return (*this)[i]; }
  template <typename M>
  std::shared_ptr<detail::ImplOfT<M>> ptr(size_t i) const {
    return at<M>(i);
  }
  // Iterates over the modules (not the names).
  class Iterator {
   public:
    using Inner = std::vector<std::pair<std::string, std::shared_ptr<Module>>>::const_iterator;
    explicit Iterator(Inner it) : it_(it) {}
    const std::shared_ptr<Module>& operator*() const { return it_->second; }
    Iterator& operator++() {
      ++it_;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return it_ != o.it_; }

   private:
    Inner it_;
  };
  Iterator begin() const { return Iterator(named_children().begin()); }
  Iterator end() const { return Iterator(named_children().end()); }
};

// Named modules in insertion order; not callable itself.
class ModuleDictImpl : public Module {
 public:
  ModuleDictImpl() : Module("ModuleDict", typeid(ModuleDictImpl)) {}
  void insert(const std::string& key, std::shared_ptr<Module> module);
  bool contains(const std::string& key) const { return child(key) != nullptr; }
  std::shared_ptr<Module> operator[](const std::string& key) const;
  std::vector<std::string> keys() const;
  size_t size() const { return named_children().size(); }
};

// Holders of the built-in modules, libtorch's names: `nn::Conv2d conv{nullptr};`,
// `conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(3, 64, 3).stride(2)));`, `conv(x)`,
// `conv->forward(x)` (both the hooked call), `conv->weight`. The module classes are the XImpl
// above; std::make_shared<nn::Conv2dImpl>(...) makes one without a holder (docs/porting_from_libtorch.md).
DBRQ_MODULE(Conv2d);
DBRQ_MODULE(Linear);
DBRQ_MODULE(BatchNorm2d);
DBRQ_MODULE(BatchNorm1d);
DBRQ_MODULE(LayerNorm);
DBRQ_MODULE(Embedding);
DBRQ_MODULE(ReLU);
DBRQ_MODULE(ReLU6);
DBRQ_MODULE(Hardtanh);
DBRQ_MODULE(LeakyReLU);
DBRQ_MODULE(ELU);
DBRQ_MODULE(PReLU);
DBRQ_MODULE(Softplus);
DBRQ_MODULE(Mish);
DBRQ_MODULE(Hardswish);
DBRQ_MODULE(Hardsigmoid);
DBRQ_MODULE(Sigmoid);
DBRQ_MODULE(Tanh);
DBRQ_MODULE(GELU);
DBRQ_MODULE(SiLU);
DBRQ_MODULE(Softmax);
DBRQ_MODULE(MaxPool2d);
DBRQ_MODULE(AvgPool2d);
DBRQ_MODULE(AdaptiveAvgPool2d);
DBRQ_MODULE(ConvTranspose2d);
DBRQ_MODULE(Conv1d);
DBRQ_MODULE(MaxPool1d);
DBRQ_MODULE(AvgPool1d);
DBRQ_MODULE(AdaptiveAvgPool1d);
DBRQ_MODULE(Upsample);
DBRQ_MODULE(GroupNorm);
DBRQ_MODULE(InstanceNorm2d);
DBRQ_MODULE(Flatten);
DBRQ_MODULE(Dropout);
DBRQ_MODULE(Identity);
DBRQ_MODULE(LSTM);
DBRQ_MODULE(GRU);
DBRQ_MODULE(Sequential);
DBRQ_MODULE(Functional);
DBRQ_MODULE(ModuleList);
DBRQ_MODULE(ModuleDict);

// DBRQ_OPTION stays defined: runtime/functional.h's FuncOptions use it too.

}  // namespace nn
}  // namespace dbrq
