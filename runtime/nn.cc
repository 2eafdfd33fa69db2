#include "runtime/nn.h"

#include "runtime/init.h"
#include "runtime/ops/op_call.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dbrq {
namespace {

std::atomic<uint64_t> g_init_seed{0x6462727121ULL};

uint64_t next_seed() { return g_init_seed.fetch_add(0x9E3779B97F4A7C15ULL); }

// PyTorch's default for conv and linear: kaiming_uniform(a=sqrt(5)) for weights, which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for biases.
Tensor init_uniform(IntArrayRef sizes, int64_t fan_in) {
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  if (bound == 0.0) return zeros(sizes);
  return rand_uniform(sizes, -bound, bound, next_seed());
}

std::string pair(const std::array<int64_t, 2>& v) { return absl::StrCat("(", v[0], ", ", v[1], ")"); }

}  // namespace

void manual_seed(uint64_t seed) { g_init_seed.store(seed); }

namespace detail {
uint64_t next_init_seed() { return next_seed(); }
}  // namespace detail

namespace nn {

Conv2dImpl::Conv2dImpl(const Conv2dOptions& o) : Layer("Conv2d"), options_(o) {
  DBRQ_ENSURE(o.in_channels() >= 1 && o.out_channels() >= 1, ValueError,
              "Conv2d: in_channels and out_channels must be >= 1, got ", o.in_channels(), " and ", o.out_channels());
  DBRQ_ENSURE(o.groups() >= 1 && o.in_channels() % o.groups() == 0 && o.out_channels() % o.groups() == 0,
              ValueError, "Conv2d: in_channels (", o.in_channels(), ") and out_channels (", o.out_channels(),
              ") must be divisible by groups (", o.groups(), ")");
  DBRQ_ENSURE(o.kernel_size()[0] >= 1 && o.kernel_size()[1] >= 1, ValueError, "Conv2d: kernel_size must be >= 1, got ",
              pair(o.kernel_size()));
  params_.stride = o.stride();
  params_.padding = o.padding();
  params_.dilation = o.dilation();
  params_.groups = o.groups();
  const int64_t fan_in = o.in_channels() / o.groups() * o.kernel_size()[0] * o.kernel_size()[1];
  weight = register_parameter(
      "weight", init_uniform({o.out_channels(), o.in_channels() / o.groups(), o.kernel_size()[0], o.kernel_size()[1]},
                             fan_in));
  if (o.bias()) bias = register_parameter("bias", init_uniform({o.out_channels()}, fan_in));
}

Conv2dImpl::Conv2dImpl(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride, int64_t padding,
               int64_t dilation, int64_t groups, bool bias)
    : Conv2dImpl(Conv2dOptions(in_channels, out_channels, kernel_size)
                 .stride(stride)
                 .padding(padding)
                 .dilation(dilation)
                 .groups(groups)
                 .bias(bias)) {}

std::string Conv2dImpl::extra_repr() const {
  std::string s = absl::StrCat(options_.in_channels(), ", ", options_.out_channels(),
                               ", kernel_size=", pair(options_.kernel_size()), ", stride=", pair(params_.stride));
  if (params_.padding != std::array<int64_t, 2>{0, 0}) absl::StrAppend(&s, ", padding=", pair(params_.padding));
  if (params_.dilation != std::array<int64_t, 2>{1, 1}) absl::StrAppend(&s, ", dilation=", pair(params_.dilation));
  if (params_.groups != 1) absl::StrAppend(&s, ", groups=", params_.groups);
  if (!bias.defined()) absl::StrAppend(&s, ", bias=False");
  return s;
}

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool with_bias)
    : Layer("Linear"), in_features_(in_features), out_features_(out_features) {
  DBRQ_ENSURE(in_features >= 0 && out_features >= 0, ValueError, "Linear: feature counts must be >= 0, got ",
              in_features, " and ", out_features);
  weight = register_parameter("weight", init_uniform({out_features, in_features}, in_features));
  if (with_bias) bias = register_parameter("bias", init_uniform({out_features}, in_features));
}

PReLUImpl::PReLUImpl(int64_t num_parameters, double init) : Layer("PReLU"), num_parameters_(num_parameters) {
  DBRQ_ENSURE(num_parameters >= 1, ValueError, "PReLU: num_parameters must be >= 1, got ", num_parameters);
  weight = register_parameter("weight", full({num_parameters}, init));
}

std::string LinearImpl::extra_repr() const {
  return absl::StrCat("in_features=", in_features_, ", out_features=", out_features_,
                      ", bias=", bias.defined() ? "True" : "False");
}

template <typename Derived>
BatchNormBase<Derived>::BatchNormBase(std::string name, int64_t num_features, double eps, bool affine)
    : Layer<Derived>(std::move(name)), num_features_(num_features), eps_(eps) {
  DBRQ_ENSURE(num_features >= 1, ValueError, this->type_name(), ": num_features must be >= 1, got ", num_features);
  if (affine) {
    weight = this->register_parameter("weight", ones({num_features}));
    bias = this->register_parameter("bias", zeros({num_features}));
  }
  running_mean = this->register_buffer("running_mean", zeros({num_features}));
  running_var = this->register_buffer("running_var", ones({num_features}));
  num_batches_tracked = this->register_buffer("num_batches_tracked", zeros(IntArrayRef{}, DType::kS64));
}

template <typename Derived>
std::string BatchNormBase<Derived>::extra_repr() const {
  return absl::StrCat(num_features_, ", eps=", eps_);
}

template class BatchNormBase<BatchNorm2dImpl>;
template class BatchNormBase<BatchNorm1dImpl>;

LayerNormImpl::LayerNormImpl(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine)
    : Layer("LayerNorm"), normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  DBRQ_ENSURE(!normalized_shape_.empty(), ValueError, "LayerNorm: normalized_shape must not be empty");
  if (elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape_));
    bias = register_parameter("bias", zeros(normalized_shape_));
  }
}

Tensor LayerNormImpl::forward(const Tensor& x) {
  NormParams p;
  p.eps = eps_;
  p.normalized_shape.assign(normalized_shape_.begin(), normalized_shape_.end());
  return ops::layer_norm(x, p, weight, bias);
}

std::string LayerNormImpl::extra_repr() const {
  return absl::StrCat("(", absl::StrJoin(normalized_shape_, ", "), ",), eps=", eps_);
}

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim)
    : Layer("Embedding"), num_(num_embeddings), dim_(embedding_dim) {
  DBRQ_ENSURE(num_embeddings >= 1 && embedding_dim >= 1, ValueError,
              "Embedding: num_embeddings and embedding_dim must be >= 1, got ", num_embeddings, " and ", embedding_dim);
  weight = register_parameter("weight", randn({num_embeddings, embedding_dim}, next_seed()));
}

std::string EmbeddingImpl::extra_repr() const { return absl::StrCat(num_, ", ", dim_); }

namespace {

Pool2dParams pool_params(const char* name, int64_t kernel_size, int64_t stride, int64_t padding) {
  DBRQ_ENSURE(kernel_size >= 1, ValueError, name, ": kernel_size must be >= 1, got ", kernel_size);
  DBRQ_ENSURE(stride >= 0, ValueError, name, ": stride must be >= 0 (0: kernel_size), got ", stride);
  Pool2dParams p;
  p.kernel_size = {kernel_size, kernel_size};
  const int64_t s = stride == 0 ? kernel_size : stride;
  p.stride = {s, s};
  p.padding = {padding, padding};
  return p;
}

}  // namespace

MaxPool2dImpl::MaxPool2dImpl(int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation, bool ceil_mode)
    : Layer("MaxPool2d"), params_(pool_params("MaxPool2d", kernel_size, stride, padding)) {
  params_.dilation = {dilation, dilation};
  params_.ceil_mode = ceil_mode;
}

Tensor MaxPool2dImpl::forward(const Tensor& x) { return ops::max_pool2d(x, params_); }

std::string MaxPool2dImpl::extra_repr() const {
  return absl::StrCat("kernel_size=", params_.kernel_size[0], ", stride=", params_.stride[0],
                      ", padding=", params_.padding[0], ", dilation=", params_.dilation[0],
                      ", ceil_mode=", params_.ceil_mode ? "True" : "False");
}

AvgPool2dImpl::AvgPool2dImpl(int64_t kernel_size, int64_t stride, int64_t padding, bool ceil_mode, bool count_include_pad)
    : Layer("AvgPool2d"), params_(pool_params("AvgPool2d", kernel_size, stride, padding)) {
  params_.ceil_mode = ceil_mode;
  params_.count_include_pad = count_include_pad;
}

Tensor AvgPool2dImpl::forward(const Tensor& x) { return ops::avg_pool2d(x, params_); }

std::string AvgPool2dImpl::extra_repr() const {
  return absl::StrCat("kernel_size=", params_.kernel_size[0], ", stride=", params_.stride[0],
                      ", padding=", params_.padding[0]);
}

std::string AdaptiveAvgPool2dImpl::extra_repr() const { return absl::StrCat("output_size=", pair(output_size_)); }

// ---- spatial layers of issue 12 ----

ConvTranspose2dImpl::ConvTranspose2dImpl(const ConvTranspose2dOptions& o) : Layer("ConvTranspose2d"), options_(o) {
  DBRQ_ENSURE(o.in_channels() >= 1 && o.out_channels() >= 1, ValueError,
              "ConvTranspose2d: in_channels and out_channels must be >= 1, got ", o.in_channels(), " and ",
              o.out_channels());
  DBRQ_ENSURE(o.groups() >= 1 && o.in_channels() % o.groups() == 0 && o.out_channels() % o.groups() == 0,
              ValueError, "ConvTranspose2d: in_channels (", o.in_channels(), ") and out_channels (", o.out_channels(),
              ") must be divisible by groups (", o.groups(), ")");
  DBRQ_ENSURE(o.kernel_size()[0] >= 1 && o.kernel_size()[1] >= 1, ValueError,
              "ConvTranspose2d: kernel_size must be >= 1, got ", pair(o.kernel_size()));
  for (int i = 0; i < 2; ++i) {
    DBRQ_ENSURE(o.stride()[i] >= 1 && o.dilation()[i] >= 1 && o.padding()[i] >= 0, ValueError,
                "ConvTranspose2d: stride and dilation must be >= 1 and padding >= 0, got stride ", pair(o.stride()),
                ", dilation ", pair(o.dilation()), ", padding ", pair(o.padding()));
    DBRQ_ENSURE(o.output_padding()[i] >= 0 &&
                    (o.output_padding()[i] < o.stride()[i] || o.output_padding()[i] < o.dilation()[i]),
                ValueError, "ConvTranspose2d: output_padding must be >= 0 and smaller than either stride or ",
                "dilation, got output_padding ", pair(o.output_padding()), ", stride ", pair(o.stride()),
                ", dilation ", pair(o.dilation()));
  }
  params_.stride = o.stride();
  params_.padding = o.padding();
  params_.output_padding = o.output_padding();
  params_.dilation = o.dilation();
  params_.groups = o.groups();
  // PyTorch's fan_in of a transposed conv weight [in, out/g, kH, kW] is its dim 1 times the kernel.
  const int64_t fan_in = o.out_channels() / o.groups() * o.kernel_size()[0] * o.kernel_size()[1];
  weight = register_parameter(
      "weight", init_uniform({o.in_channels(), o.out_channels() / o.groups(), o.kernel_size()[0], o.kernel_size()[1]},
                             fan_in));
  if (o.bias()) bias = register_parameter("bias", init_uniform({o.out_channels()}, fan_in));
}

Conv1dImpl::Conv1dImpl(const Conv1dOptions& o) : Layer("Conv1d"), options_(o) {
  DBRQ_ENSURE(o.in_channels() >= 1 && o.out_channels() >= 1, ValueError,
              "Conv1d: in_channels and out_channels must be >= 1, got ", o.in_channels(), " and ", o.out_channels());
  DBRQ_ENSURE(o.groups() >= 1 && o.in_channels() % o.groups() == 0 && o.out_channels() % o.groups() == 0,
              ValueError, "Conv1d: in_channels (", o.in_channels(), ") and out_channels (", o.out_channels(),
              ") must be divisible by groups (", o.groups(), ")");
  DBRQ_ENSURE(o.kernel_size() >= 1, ValueError, "Conv1d: kernel_size must be >= 1, got ", o.kernel_size());
  DBRQ_ENSURE(o.stride() >= 1 && o.dilation() >= 1 && o.padding() >= 0, ValueError,
              "Conv1d: stride and dilation must be >= 1 and padding >= 0, got stride ", o.stride(), ", dilation ",
              o.dilation(), ", padding ", o.padding());
  params_.stride = o.stride();
  params_.padding = o.padding();
  params_.dilation = o.dilation();
  params_.groups = o.groups();
  const int64_t fan_in = o.in_channels() / o.groups() * o.kernel_size();
  weight = register_parameter("weight",
                              init_uniform({o.out_channels(), o.in_channels() / o.groups(), o.kernel_size()}, fan_in));
  if (o.bias()) bias = register_parameter("bias", init_uniform({o.out_channels()}, fan_in));
}

std::string Conv1dImpl::extra_repr() const {
  std::string s = absl::StrCat(options_.in_channels(), ", ", options_.out_channels(), ", kernel_size=(",
                               options_.kernel_size(), ",), stride=(", params_.stride, ",)");
  if (params_.padding != 0) absl::StrAppend(&s, ", padding=(", params_.padding, ",)");
  if (params_.dilation != 1) absl::StrAppend(&s, ", dilation=(", params_.dilation, ",)");
  if (params_.groups != 1) absl::StrAppend(&s, ", groups=", params_.groups);
  if (!bias.defined()) absl::StrAppend(&s, ", bias=False");
  return s;
}

namespace {

void check_pool1d_layer(const char* layer, int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation) {
  DBRQ_ENSURE(kernel_size >= 1 && stride >= 0 && dilation >= 1, ValueError, layer,
              ": kernel_size and dilation must be >= 1 and stride >= 0 (0: the kernel size), got kernel_size ",
              kernel_size, ", stride ", stride, ", dilation ", dilation);
  DBRQ_ENSURE(padding >= 0 && padding * 2 <= kernel_size, ValueError, layer,
              ": padding must be >= 0 and at most half the kernel size, got padding ", padding, " for kernel_size ",
              kernel_size);
}

}  // namespace

MaxPool1dImpl::MaxPool1dImpl(int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation, bool ceil_mode)
    : Layer("MaxPool1d"),
      kernel_size_(kernel_size),
      stride_(stride == 0 ? kernel_size : stride),
      padding_(padding),
      dilation_(dilation),
      ceil_mode_(ceil_mode) {
  check_pool1d_layer("MaxPool1d", kernel_size, stride, padding, dilation);
}

std::string MaxPool1dImpl::extra_repr() const {
  return absl::StrCat("kernel_size=", kernel_size_, ", stride=", stride_, ", padding=", padding_,
                      ", dilation=", dilation_, ", ceil_mode=", ceil_mode_ ? "True" : "False");
}

AvgPool1dImpl::AvgPool1dImpl(int64_t kernel_size, int64_t stride, int64_t padding, bool ceil_mode, bool count_include_pad)
    : Layer("AvgPool1d"),
      kernel_size_(kernel_size),
      stride_(stride == 0 ? kernel_size : stride),
      padding_(padding),
      ceil_mode_(ceil_mode),
      count_include_pad_(count_include_pad) {
  check_pool1d_layer("AvgPool1d", kernel_size, stride, padding, 1);
}

std::string AvgPool1dImpl::extra_repr() const {
  return absl::StrCat("kernel_size=(", kernel_size_, ",), stride=(", stride_, ",), padding=(", padding_, ",)");
}

AdaptiveAvgPool1dImpl::AdaptiveAvgPool1dImpl(int64_t output_size) : Layer("AdaptiveAvgPool1d"), output_size_(output_size) {
  DBRQ_ENSURE(output_size >= 1, ValueError, "AdaptiveAvgPool1d: output_size must be >= 1, got ", output_size);
}

namespace {

// Python's repr of a float: "2.0", "1.5".
std::string py_float(double v) {
  std::string s = absl::StrFormat("%.17g", v);
  if (static_cast<double>(std::stod(absl::StrFormat("%g", v))) == v) s = absl::StrFormat("%g", v);
  if (s.find_first_of(".einn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

UpsampleImpl::UpsampleImpl(const UpsampleOptions& o) : Layer("Upsample"), o_(o) {
  DBRQ_ENSURE(o.size().has_value() != o.scale_factor().has_value(), ValueError,
              o.size().has_value() ? "Upsample: only one of size or scale_factor should be defined"
                                   : "Upsample: either size or scale_factor should be defined");
  DBRQ_ENSURE(o.mode() == "nearest" || o.mode() == "bilinear", ValueError,
              "Upsample: mode must be \"nearest\" or \"bilinear\", got \"", o.mode(), "\"");
  DBRQ_ENSURE(!(o.mode() == "nearest" && o.align_corners().has_value()), ValueError,
              "Upsample: align_corners option can only be set with the interpolating mode \"bilinear\"");
  if (o.size()) {
    DBRQ_ENSURE((*o.size())[0] >= 1 && (*o.size())[1] >= 1, ValueError, "Upsample: size must be >= 1, got ",
                pair(*o.size()));
  } else {
    for (double f : *o.scale_factor()) {
      DBRQ_ENSURE(std::isfinite(f) && f > 0.0, ValueError, "Upsample: scale_factor must be finite and > 0, got ", f);
    }
  }
}

std::string UpsampleImpl::extra_repr() const {
  std::string s;
  if (o_.scale_factor()) {
    const auto& f = *o_.scale_factor();
    s = o_.scalar() ? "scale_factor=" + py_float(f[0])
                    : absl::StrCat("scale_factor=(", py_float(f[0]), ", ", py_float(f[1]), ")");
  } else {
    s = o_.scalar() ? absl::StrCat("size=", (*o_.size())[0]) : "size=" + pair(*o_.size());
  }
  return absl::StrCat(s, ", mode='", o_.mode(), "'");
}

GroupNormImpl::GroupNormImpl(int64_t num_groups, int64_t num_channels, double eps, bool affine)
    : Layer("GroupNorm"), num_groups_(num_groups), num_channels_(num_channels), eps_(eps) {
  DBRQ_ENSURE(num_groups >= 1 && num_channels >= 1 && num_channels % num_groups == 0, ValueError,
              "GroupNorm: num_channels (", num_channels, ") must be divisible by num_groups (", num_groups,
              "), both >= 1");
  if (affine) {
    weight = register_parameter("weight", full({num_channels}, 1.0));
    bias = register_parameter("bias", zeros({num_channels}));
  }
}

std::string GroupNormImpl::extra_repr() const {
  return absl::StrCat(num_groups_, ", ", num_channels_, ", eps=", eps_, ", affine=", weight.defined() ? "True" : "False");
}

InstanceNorm2dImpl::InstanceNorm2dImpl(int64_t num_features, double eps, double momentum, bool affine,
                               bool track_running_stats)
    : Layer("InstanceNorm2d"),
      num_features_(num_features),
      eps_(eps),
      momentum_(momentum),
      affine_(affine),
      track_running_stats_(track_running_stats) {
  DBRQ_ENSURE(num_features >= 1, ValueError, "InstanceNorm2d: num_features must be >= 1, got ", num_features);
  if (affine) {
    weight = register_parameter("weight", full({num_features}, 1.0));
    bias = register_parameter("bias", zeros({num_features}));
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({num_features}));
    running_var = register_buffer("running_var", full({num_features}, 1.0));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, DType::kS64));
  }
}

void refuse_training_mode_norm(const std::string& what) {
  DBRQ_THROW(UsageError, what,
             " called in training mode (a new module's default, as in libtorch), where PyTorch normalizes with the "
             "batch's statistics; dbrq normalizes with the running statistics only (inference): call eval() on the "
             "model before running it");
}

Tensor InstanceNorm2dImpl::forward(const Tensor& x) {
  DBRQ_ENSURE(x.defined() && (x.dim() == 3 || x.dim() == 4), ShapeError,
              "InstanceNorm2d: input must be 3-D or 4-D ((N,) C, H, W), got sizes ",
              x.defined() ? x.shape_string() : std::string("undefined"));
  const Tensor x4 = x.dim() == 3 ? x.unsqueeze(0) : x;
  DBRQ_ENSURE(x4.size(1) == num_features_, ShapeError, "InstanceNorm2d: expected ", num_features_,
              " channels, got input sizes ", x.shape_string());
  // With running statistics, PyTorch uses them in eval mode only; in training mode each instance's
  // own, as without them (the running ones are not updated here: no training).
  const bool running = track_running_stats_ && !is_training();
  const Tensor y = running ? batch_norm(x4, running_mean, running_var, weight, bias, eps_)
                           : instance_norm(x4, weight, bias, eps_);
  return x.dim() == 3 ? y.squeeze(0) : y;
}

std::string InstanceNorm2dImpl::extra_repr() const {
  return absl::StrCat(num_features_, ", eps=", eps_, ", momentum=", momentum_, ", affine=", affine_ ? "True" : "False",
                      ", track_running_stats=", track_running_stats_ ? "True" : "False");
}

std::string ConvTranspose2dImpl::extra_repr() const {
  std::string s = absl::StrCat(options_.in_channels(), ", ", options_.out_channels(),
                               ", kernel_size=", pair(options_.kernel_size()), ", stride=", pair(params_.stride));
  if (params_.padding != std::array<int64_t, 2>{0, 0}) absl::StrAppend(&s, ", padding=", pair(params_.padding));
  if (params_.output_padding != std::array<int64_t, 2>{0, 0}) {
    absl::StrAppend(&s, ", output_padding=", pair(params_.output_padding));
  }
  if (params_.dilation != std::array<int64_t, 2>{1, 1}) absl::StrAppend(&s, ", dilation=", pair(params_.dilation));
  if (params_.groups != 1) absl::StrAppend(&s, ", groups=", params_.groups);
  if (!bias.defined()) absl::StrAppend(&s, ", bias=False");
  return s;
}

DropoutImpl::DropoutImpl(double p) : Layer("Dropout"), p_(p) {
  DBRQ_ENSURE(p >= 0.0 && p <= 1.0, ValueError, "Dropout: probability must be in [0, 1], got ", p);
}

std::string DropoutImpl::extra_repr() const { return absl::StrCat("p=", p_); }

// ---- recurrent layers -------------------------------------------------------------------------

namespace detail {
namespace {

const char* mode_name(RNNMode m) { return m == RNNMode::kLSTM ? "LSTM" : "GRU"; }

std::string sizes_string(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

// Batch plumbing: sorting the sequences by length, the state buffers, writing each step's result
// into the output. It uses metadata-only views (raw_*, which never dispatch) and copy_ (an op no
// qconfig quantizes; it dequantizes an int8 source), so it adds nothing to a quantization state:
// the recorded program is the recurrence's arithmetic alone, the same ops with the same producers
// at every step, whatever the batch size, the layout and the pattern of lengths. (Shape ops such
// as select / narrow on these buffers would be recorded, and a chain of them over a buffer could
// share a record with the same chain over an int8 activation, whose converted executor returns an
// int8 copy instead of a view: a write through it would be lost.)

// t.select(dim, i) as a view (no dispatch).
Tensor raw_select(const Tensor& t, int64_t dim, int64_t i) {
  DimVector sizes, strides;
  for (int64_t k = 0; k < t.dim(); ++k) {
    if (k == dim) continue;
    sizes.push_back(t.size(k));
    strides.push_back(t.stride(k));
  }
  return t.raw_as_strided(sizes, strides, t.storage_offset() + i * t.stride(dim));
}

// t.unsqueeze(dim) as a view (no dispatch).
Tensor raw_unsqueeze(const Tensor& t, int64_t dim) {
  DimVector sizes(t.sizes().begin(), t.sizes().end()), strides(t.strides().begin(), t.strides().end());
  sizes.insert(sizes.begin() + dim, 1);
  strides.insert(strides.begin() + dim, dim < t.dim() ? t.stride(dim) * t.size(dim) : 1);
  return t.raw_as_strided(sizes, strides, t.storage_offset());
}

// Copies src's slices along dim 1 into dst's: dst[:, b] = src[:, from[b]] (from empty: the same b).
// Always through a view: a tensor copy_ wrote into carries copy_'s trace tag, and dst must not
// (the ops reading it must see the same producer whichever way it was filled).
void copy_sequences(const Tensor& dst, const Tensor& src, const std::vector<int64_t>& from) {
  if (from.empty()) {
    Tensor all = dst.raw_as_strided(dst.sizes(), dst.strides(), dst.storage_offset());
    all.copy_(src);
    return;
  }
  for (size_t b = 0; b < from.size(); ++b) {
    Tensor row = raw_select(dst, 1, static_cast<int64_t>(b));
    row.copy_(raw_select(src, 1, from[b]));
  }
}

// One GRU step from the precomputed input gates gi = W_i x + b_i and the hidden gates
// gh = W_h h + b_h ([B, 3H] each, r z n), in the order of PyTorch's GRUCell
// (aten/src/ATen/native/RNN.cpp), so fp32 results agree to rounding.
Tensor gru_step(const Tensor& gi, const Tensor& gh, const Tensor& h, int64_t hidden) {
  const Tensor rz = sigmoid(gh.narrow(1, 0, 2 * hidden) + gi.narrow(1, 0, 2 * hidden));
  const Tensor n = tanh(gi.narrow(1, 2 * hidden, hidden) + gh.narrow(1, 2 * hidden, hidden) * rz.narrow(1, 0, hidden));
  return (h - n) * rz.narrow(1, hidden, hidden) + n;
}

// One LSTM step (gates i f g o), as PyTorch's LSTMCell. Returns (h', c').
std::pair<Tensor, Tensor> lstm_step(const Tensor& gi, const Tensor& gh, const Tensor& c, int64_t hidden) {
  const Tensor gates = gh + gi;
  const Tensor i = sigmoid(gates.narrow(1, 0, hidden));
  const Tensor f = sigmoid(gates.narrow(1, hidden, hidden));
  const Tensor g = tanh(gates.narrow(1, 2 * hidden, hidden));
  const Tensor o = sigmoid(gates.narrow(1, 3 * hidden, hidden));
  Tensor c_next = f * c + i * g;
  Tensor h_next = o * tanh(c_next);
  return {std::move(h_next), std::move(c_next)};
}

}  // namespace

RNNImpl::RNNImpl(Module& self, RNNMode mode, const RNNOptions& o)
    : self_(self), mode_(mode), options_(o), gates_(mode == RNNMode::kLSTM ? 4 : 3) {
  const char* name = mode_name(mode);
  DBRQ_ENSURE(o.input_size() >= 1, ValueError, name, ": input_size must be >= 1, got ", o.input_size());
  DBRQ_ENSURE(o.hidden_size() >= 1, ValueError, name, ": hidden_size must be >= 1, got ", o.hidden_size());
  DBRQ_ENSURE(o.num_layers() >= 1, ValueError, name, ": num_layers must be >= 1, got ", o.num_layers());
  DBRQ_ENSURE(o.dropout() >= 0.0 && o.dropout() <= 1.0, ValueError, name,
              ": dropout must be a probability in [0, 1], got ", o.dropout());
  const int64_t h = o.hidden_size(), directions = o.bidirectional() ? 2 : 1;
  // PyTorch's order (and state_dict order): per layer, per direction: weight_ih, weight_hh,
  // bias_ih, bias_hh; every tensor U(-1/sqrt(hidden), 1/sqrt(hidden)).
  for (int64_t layer = 0; layer < o.num_layers(); ++layer) {
    for (int64_t d = 0; d < directions; ++d) {
      const std::string suffix = absl::StrCat("_l", layer, d == 1 ? "_reverse" : "");
      const int64_t in = layer == 0 ? o.input_size() : h * directions;
      RNNWeights w;
      w.weight_ih = self.register_parameter("weight_ih" + suffix, init_uniform({gates_ * h, in}, h));
      w.weight_hh = self.register_parameter("weight_hh" + suffix, init_uniform({gates_ * h, h}, h));
      if (o.bias()) {
        w.bias_ih = self.register_parameter("bias_ih" + suffix, init_uniform({gates_ * h}, h));
        w.bias_hh = self.register_parameter("bias_hh" + suffix, init_uniform({gates_ * h}, h));
      }
      cells_.push_back(std::move(w));
    }
  }
}

const RNNWeights& RNNImpl::weights(int64_t layer, int64_t direction) const {
  const int64_t directions = options_.bidirectional() ? 2 : 1;
  DBRQ_ENSURE(layer >= 0 && layer < options_.num_layers() && direction >= 0 && direction < directions, IndexError,
              mode_name(mode_), "::weights(", layer, ", ", direction, "): out of range for ", options_.num_layers(),
              " layer(s) and ", directions, " direction(s)");
  return cells_[static_cast<size_t>(layer * directions + direction)];
}

std::string RNNImpl::extra_repr() const {
  const RNNOptions& o = options_;
  std::string s = absl::StrCat(o.input_size(), ", ", o.hidden_size());
  if (o.num_layers() != 1) absl::StrAppend(&s, ", num_layers=", o.num_layers());
  if (!o.bias()) absl::StrAppend(&s, ", bias=False");
  if (o.batch_first()) absl::StrAppend(&s, ", batch_first=True");
  if (o.dropout() != 0.0) absl::StrAppend(&s, ", dropout=", o.dropout());
  if (o.bidirectional()) absl::StrAppend(&s, ", bidirectional=True");
  return s;
}

void RNNImpl::check_args(const Tensor& input, const Tensor& h0, const Tensor& c0,
                         const std::vector<int64_t>& lengths) const {
  const char* name = mode_name(mode_);
  const RNNOptions& o = options_;
  DBRQ_ENSURE(input.defined(), ValueError, name, ": input is undefined");
  DBRQ_ENSURE(input.dtype() == DType::kF32 || input.is_quantized(), DTypeError, name,
              ": input must have dtype f32, got ", dtype_name(input.dtype()));
  DBRQ_ENSURE(input.dim() == 2 || input.dim() == 3, ShapeError, name,
              ": expected input to be 2-D (unbatched: [T, input_size]) or 3-D (batched), got a ", input.dim(),
              "-D tensor ", input.shape_string());
  DBRQ_ENSURE(input.size(-1) == o.input_size(), ShapeError, name,
              ": input.size(-1) must be equal to input_size. Expected ", o.input_size(), ", got ", input.size(-1),
              " (input ", input.shape_string(), ")");
  const bool batched = input.dim() == 3;
  const int64_t t = batched && o.batch_first() ? input.size(1) : input.size(0);
  const int64_t b = batched ? input.size(o.batch_first() ? 0 : 1) : 1;
  DBRQ_ENSURE(t >= 1 && b >= 1, ShapeError, name, ": input ", input.shape_string(),
              " has no time steps or no sequences (sequence length ", t, ", batch ", b, ")");
  const int64_t layers = o.num_layers() * (o.bidirectional() ? 2 : 1);
  const std::vector<int64_t> expected =
      batched ? std::vector<int64_t>{layers, b, o.hidden_size()} : std::vector<int64_t>{layers, o.hidden_size()};
  auto check_state = [&](const Tensor& s, const char* which) {
    if (!s.defined()) return;
    DBRQ_ENSURE(s.dtype() == DType::kF32 || s.is_quantized(), DTypeError, name, ": ", which,
                " must have dtype f32, got ", dtype_name(s.dtype()));
    DBRQ_ENSURE(s.dim() == input.dim(), ShapeError, name, ": for ", batched ? "batched 3-D" : "unbatched 2-D",
                " input, ", which, " should also be ", input.dim(), "-D but got a ", s.dim(), "-D tensor ",
                s.shape_string());
    DBRQ_ENSURE(std::vector<int64_t>(s.sizes().begin(), s.sizes().end()) == expected, ShapeError, name, ": expected ",
                which, " of size ", sizes_string(expected), " (num_layers * num_directions, ", batched ? "batch, " : "",
                "hidden_size), got ", s.shape_string());
  };
  DBRQ_ENSURE(mode_ != RNNMode::kLSTM || h0.defined() == c0.defined(), ValueError, name,
              ": hx must hold both h0 and c0 (or be absent), but ", h0.defined() ? "hx[1] (c0)" : "hx[0] (h0)",
              " is undefined");
  check_state(h0, mode_ == RNNMode::kLSTM ? "hx[0] (h0)" : "hx");
  check_state(c0, "hx[1] (c0)");
  if (lengths.empty()) return;
  DBRQ_ENSURE(batched, ValueError, name, ": lengths need a batched (3-D) input, got ", input.shape_string());
  DBRQ_ENSURE(static_cast<int64_t>(lengths.size()) == b, ValueError, name, ": got ", lengths.size(),
              " lengths for a batch of ", b, " sequences");
  for (size_t i = 0; i < lengths.size(); ++i) {
    DBRQ_ENSURE(lengths[i] >= 1 && lengths[i] <= t, ValueError, name, ": lengths[", i, "] = ", lengths[i],
                " is out of range [1, ", t, "] (the input's sequence length)");
  }
}

std::tuple<Tensor, Tensor, Tensor> RNNImpl::forward(const Tensor& input, const Tensor& h0_in, const Tensor& c0_in,
                                                    const std::vector<int64_t>& lengths, bool training) const {
  check_args(input, h0_in, c0_in, lengths);
  const RNNOptions& o = options_;
  const bool lstm = mode_ == RNNMode::kLSTM;
  const bool batched = input.dim() == 3;
  const int64_t hidden = o.hidden_size(), layers = o.num_layers(), directions = o.bidirectional() ? 2 : 1;
  // Time-major [T, B, features] and [layers * D, B, hidden] views from here on.
  const Tensor x_in = !batched ? raw_unsqueeze(input, 1) : o.batch_first() ? input.raw_permute({1, 0, 2}) : input;
  const Tensor h0 = h0_in.defined() && !batched ? raw_unsqueeze(h0_in, 1) : h0_in;
  const Tensor c0 = c0_in.defined() && !batched ? raw_unsqueeze(c0_in, 1) : c0_in;
  const int64_t steps = x_in.size(0), batch = x_in.size(1);

  // Per-sequence lengths: the sequences sorted longest first (`order`, empty when already sorted),
  // so the ones still running at step t are the first running[t] rows, and each step computes only
  // those (PyTorch's packed sequences).
  std::vector<int64_t> order, running;
  if (!lengths.empty()) {
    order.resize(lengths.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
    if (std::is_sorted(order.begin(), order.end())) order.clear();
    running.assign(static_cast<size_t>(steps), 0);
    for (int64_t len : lengths) {
      for (int64_t t = 0; t < len; ++t) ++running[static_cast<size_t>(t)];
    }
  }

  // The first layer's input: time-major, contiguous f32, sequences in order: the input itself when
  // it already is that (as a fresh view, so every input reaches the first product alike), else a
  // copy.
  Tensor x;
  if (order.empty() && x_in.dtype() == DType::kF32 && !x_in.is_quantized() && x_in.is_contiguous()) {
    x = x_in.raw_as_strided(x_in.sizes(), x_in.strides(), x_in.storage_offset());
  } else {
    x = zeros({steps, batch, x_in.size(2)});
    copy_sequences(x, x_in, order);
  }
  // The states live in h_n / c_n: initial state first, each step's result written into the rows
  // of the sequences still running, so each one ends holding its state at its own end.
  Tensor h_n = zeros({layers * directions, batch, hidden});
  Tensor c_n = lstm ? zeros({layers * directions, batch, hidden}) : Tensor();
  if (h0.defined()) copy_sequences(h_n, h0, order);
  if (c0.defined()) copy_sequences(c_n, c0, order);

  for (int64_t layer = 0; layer < layers; ++layer) {
    // Zeros where a sequence has ended (what pad_packed_sequence gives).
    Tensor out = zeros({steps, batch, directions * hidden});
    for (int64_t d = 0; d < directions; ++d) {
      const int64_t index = layer * directions + d;
      const RNNWeights& w = cells_[static_cast<size_t>(index)];
      // The gate arithmetic is the same code for every layer and direction: without a scope of its
      // own, each later cell's gate ops would read producers tagged like the first cell's (an add's
      // tag is its kind) and share its records, under static int8 one range for all of them (layer 1's
      // state, half layer 0's range, lost 2-4 dB to it). Index 0 is no salt: a one-layer
      // unidirectional layer records what it always did.
      OpIdentityScope identity(static_cast<uint64_t>(index));
      // Every step's input projection in one matrix product ([T * B, in] x [in, gates * H]); the
      // loop then only multiplies the hidden state.
      const Tensor projected = linear(x, w.weight_ih, w.bias_ih);
      const Tensor h = raw_select(h_n, 0, index);
      const Tensor c = lstm ? raw_select(c_n, 0, index) : Tensor();
      const Tensor out_d = directions == 1 ? out : out.raw_narrow(2, d * hidden, hidden);
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t t = d == 0 ? s : steps - 1 - s;
        const int64_t n = running.empty() ? batch : running[static_cast<size_t>(t)];
        // The recorded ops of a step: the same at every step, for every n.
        const Tensor gi = projected.select(0, t).narrow(0, 0, n);
        Tensor h_run = h.raw_narrow(0, 0, n);
        const Tensor gh = linear(h_run, w.weight_hh, w.bias_hh);
        Tensor h_next;
        if (lstm) {
          Tensor c_run = c.raw_narrow(0, 0, n);
          Tensor c_next;
          std::tie(h_next, c_next) = lstm_step(gi, gh, c_run, hidden);
          c_run.copy_(c_next);
        } else {
          h_next = gru_step(gi, gh, h_run, hidden);
        }
        // Sequences that have ended (forward) or not started yet (reverse) keep their state.
        h_run.copy_(h_next);
        Tensor slot = raw_select(out_d, 0, t).raw_narrow(0, 0, n);
        slot.copy_(h_next);
      }
    }
    x = out;
    if (o.dropout() > 0.0 && training && layer + 1 < layers) x = dropout(x, o.dropout(), true);
  }

  if (!order.empty()) {
    // Back to the caller's order: result[:, order[i]] = sorted[:, i].
    std::vector<int64_t> inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
    auto unsort = [&](const Tensor& sorted) {
      Tensor result = zeros(sorted.sizes());
      copy_sequences(result, sorted, inverse);
      return result;
    };
    x = unsort(x);
    h_n = unsort(h_n);
    if (lstm) c_n = unsort(c_n);
  }
  if (!batched) {
    x = raw_select(x, 1, 0);
    h_n = raw_select(h_n, 1, 0);
    if (lstm) c_n = raw_select(c_n, 1, 0);
  } else if (o.batch_first()) {
    x = x.raw_permute({1, 0, 2});
  }
  return {x, h_n, c_n};
}

}  // namespace detail

LSTMImpl::LSTMImpl(const LSTMOptions& options) : CallableModule("LSTM"), impl_(*this, detail::RNNMode::kLSTM, options) {}

std::tuple<Tensor, std::tuple<Tensor, Tensor>> LSTMImpl::forward(const Tensor& input,
                                                             const std::optional<std::tuple<Tensor, Tensor>>& hx,
                                                             const std::vector<int64_t>& lengths) {
  auto [out, h, c] =
      impl_.forward(input, hx ? std::get<0>(*hx) : Tensor(), hx ? std::get<1>(*hx) : Tensor(), lengths, is_training());
  return {out, {h, c}};
}

GRUImpl::GRUImpl(const GRUOptions& options) : CallableModule("GRU"), impl_(*this, detail::RNNMode::kGRU, options) {}

std::tuple<Tensor, Tensor> GRUImpl::forward(const Tensor& input, const Tensor& hx, const std::vector<int64_t>& lengths) {
  auto [out, h, c] = impl_.forward(input, hx, Tensor(), lengths, is_training());
  return {out, h};
}

SequentialImpl::SequentialImpl(std::vector<std::shared_ptr<Module>> modules) : SequentialImpl() {
  for (auto& m : modules) push_back(std::move(m));
}

SequentialImpl::SequentialImpl(std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules) : SequentialImpl() {
  for (auto& [name, m] : named_modules) push_back(name, std::move(m));
}

FunctionalImpl::FunctionalImpl(Function function) : CallableModule("Functional"), function_(std::move(function)) {
  DBRQ_ENSURE(function_ != nullptr, ValueError, "Functional: the function is empty");
}

namespace detail {

const std::shared_ptr<Module>& child_at(const Module& m, size_t i) {
  const auto& children = m.named_children();
  DBRQ_ENSURE(i < children.size(), IndexError, m.type_name(), ": index ", i, " is out of range for ", children.size(),
              " modules");
  return children[i].second;
}

}  // namespace detail

ModuleListImpl::ModuleListImpl(std::vector<std::shared_ptr<Module>> modules) : ModuleListImpl() {
  for (auto& m : modules) push_back(std::move(m));
}

void ModuleListImpl::push_back(std::shared_ptr<Module> module) { register_module(std::to_string(size()), std::move(module)); }

const std::shared_ptr<Module>& ModuleListImpl::operator[](size_t i) const { return detail::child_at(*this, i); }

void ModuleDictImpl::insert(const std::string& key, std::shared_ptr<Module> module) { register_module(key, std::move(module)); }

std::shared_ptr<Module> ModuleDictImpl::operator[](const std::string& key) const {
  auto m = child(key);
  DBRQ_ENSURE(m != nullptr, IndexError, "ModuleDict: no module under key \"", key, "\"");
  return m;
}

std::vector<std::string> ModuleDictImpl::keys() const {
  std::vector<std::string> out;
  for (auto& [n, m] : named_children()) out.push_back(n);
  return out;
}

}  // namespace nn
}  // namespace dbrq
