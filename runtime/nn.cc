#include "runtime/nn.h"

#include "runtime/ops/op_call.h"

#include <atomic>
#include <cmath>

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

namespace nn {

Conv2d::Conv2d(const Conv2dOptions& o) : Layer("Conv2d"), options_(o) {
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

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride, int64_t padding,
               int64_t dilation, int64_t groups, bool bias)
    : Conv2d(Conv2dOptions(in_channels, out_channels, kernel_size)
                 .stride(stride)
                 .padding(padding)
                 .dilation(dilation)
                 .groups(groups)
                 .bias(bias)) {}

std::string Conv2d::extra_repr() const {
  std::string s = absl::StrCat(options_.in_channels(), ", ", options_.out_channels(),
                               ", kernel_size=", pair(options_.kernel_size()), ", stride=", pair(params_.stride));
  if (params_.padding != std::array<int64_t, 2>{0, 0}) absl::StrAppend(&s, ", padding=", pair(params_.padding));
  if (params_.dilation != std::array<int64_t, 2>{1, 1}) absl::StrAppend(&s, ", dilation=", pair(params_.dilation));
  if (params_.groups != 1) absl::StrAppend(&s, ", groups=", params_.groups);
  if (!bias.defined()) absl::StrAppend(&s, ", bias=False");
  return s;
}

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias)
    : Layer("Linear"), in_features_(in_features), out_features_(out_features) {
  DBRQ_ENSURE(in_features >= 0 && out_features >= 0, ValueError, "Linear: feature counts must be >= 0, got ",
              in_features, " and ", out_features);
  weight = register_parameter("weight", init_uniform({out_features, in_features}, in_features));
  if (with_bias) bias = register_parameter("bias", init_uniform({out_features}, in_features));
}

std::string Linear::extra_repr() const {
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

template class BatchNormBase<BatchNorm2d>;
template class BatchNormBase<BatchNorm1d>;

LayerNorm::LayerNorm(std::vector<int64_t> normalized_shape, double eps, bool elementwise_affine)
    : Layer("LayerNorm"), normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  DBRQ_ENSURE(!normalized_shape_.empty(), ValueError, "LayerNorm: normalized_shape must not be empty");
  if (elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape_));
    bias = register_parameter("bias", zeros(normalized_shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  NormParams p;
  p.eps = eps_;
  p.normalized_shape.assign(normalized_shape_.begin(), normalized_shape_.end());
  return ops::layer_norm(x, p, weight, bias);
}

std::string LayerNorm::extra_repr() const {
  return absl::StrCat("(", absl::StrJoin(normalized_shape_, ", "), ",), eps=", eps_);
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : Layer("Embedding"), num_(num_embeddings), dim_(embedding_dim) {
  DBRQ_ENSURE(num_embeddings >= 1 && embedding_dim >= 1, ValueError,
              "Embedding: num_embeddings and embedding_dim must be >= 1, got ", num_embeddings, " and ", embedding_dim);
  weight = register_parameter("weight", randn({num_embeddings, embedding_dim}, next_seed()));
}

std::string Embedding::extra_repr() const { return absl::StrCat(num_, ", ", dim_); }

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

MaxPool2d::MaxPool2d(int64_t kernel_size, int64_t stride, int64_t padding, int64_t dilation, bool ceil_mode)
    : Layer("MaxPool2d"), params_(pool_params("MaxPool2d", kernel_size, stride, padding)) {
  params_.dilation = {dilation, dilation};
  params_.ceil_mode = ceil_mode;
}

Tensor MaxPool2d::forward(const Tensor& x) { return ops::max_pool2d(x, params_); }

std::string MaxPool2d::extra_repr() const {
  return absl::StrCat("kernel_size=", params_.kernel_size[0], ", stride=", params_.stride[0],
                      ", padding=", params_.padding[0], ", dilation=", params_.dilation[0],
                      ", ceil_mode=", params_.ceil_mode ? "True" : "False");
}

AvgPool2d::AvgPool2d(int64_t kernel_size, int64_t stride, int64_t padding, bool ceil_mode, bool count_include_pad)
    : Layer("AvgPool2d"), params_(pool_params("AvgPool2d", kernel_size, stride, padding)) {
  params_.ceil_mode = ceil_mode;
  params_.count_include_pad = count_include_pad;
}

Tensor AvgPool2d::forward(const Tensor& x) { return ops::avg_pool2d(x, params_); }

std::string AvgPool2d::extra_repr() const {
  return absl::StrCat("kernel_size=", params_.kernel_size[0], ", stride=", params_.stride[0],
                      ", padding=", params_.padding[0]);
}

std::string AdaptiveAvgPool2d::extra_repr() const { return absl::StrCat("output_size=", pair(output_size_)); }

Dropout::Dropout(double p) : Layer("Dropout"), p_(p) {
  DBRQ_ENSURE(p >= 0.0 && p <= 1.0, ValueError, "Dropout: probability must be in [0, 1], got ", p);
}

std::string Dropout::extra_repr() const { return absl::StrCat("p=", p_); }

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) : Sequential() {
  for (auto& m : modules) push_back(std::move(m));
}

Sequential::Sequential(std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules) : Sequential() {
  for (auto& [name, m] : named_modules) push_back(name, std::move(m));
}

namespace detail {

const std::shared_ptr<Module>& child_at(const Module& m, size_t i) {
  const auto& children = m.named_children();
  DBRQ_ENSURE(i < children.size(), IndexError, m.type_name(), ": index ", i, " is out of range for ", children.size(),
              " modules");
  return children[i].second;
}

}  // namespace detail

ModuleList::ModuleList(std::vector<std::shared_ptr<Module>> modules) : ModuleList() {
  for (auto& m : modules) push_back(std::move(m));
}

void ModuleList::push_back(std::shared_ptr<Module> module) { register_module(std::to_string(size()), std::move(module)); }

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const { return detail::child_at(*this, i); }

void ModuleDict::insert(const std::string& key, std::shared_ptr<Module> module) { register_module(key, std::move(module)); }

std::shared_ptr<Module> ModuleDict::operator[](const std::string& key) const {
  auto m = child(key);
  DBRQ_ENSURE(m != nullptr, IndexError, "ModuleDict: no module under key \"", key, "\"");
  return m;
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (auto& [n, m] : named_children()) out.push_back(n);
  return out;
}

}  // namespace nn
}  // namespace dbrq
