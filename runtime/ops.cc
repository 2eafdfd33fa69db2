// Functional ops and Tensor's dispatching methods: each builds an OpCall and dispatches it; the
// `run` functions here are what executes when nothing intercepts.
#include "runtime/ops.h"

#include <cstring>
#include <random>

#include "kernels/eager.h"
#include "runtime/dispatcher.h"
#include "core/op_shapes.h"

namespace dbrq {

namespace detail {

bool names_an_op(const Error& e) {
  // "conv2d: ...", "int8 conv2d: ...", "slice: ...": a lower-case identifier (optionally after
  // "int8 ") followed by a colon. "dim 5 is out of range ..." is not.
  const char* m = e.what();
  if (std::strncmp(m, "int8 ", 5) == 0) m += 5;
  const char* p = m;
  while ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_') ++p;
  return p != m && *p == ':';
}

}  // namespace detail

namespace {

template <size_t N>
Tensor call(OpKind kind, const Tensor* const (&in)[N], const void* params, OpFn run) {
  OpCall c;
  c.kind = kind;
  c.inputs = absl::MakeConstSpan(in, N);
  c.params = params;
  c.run = run;
  return dispatch(c);
}

Tensor call_scalar(OpKind kind, const Tensor& x, double scalar, bool scalar_first, OpFn run) {
  const Tensor* in[] = {&x};
  OpCall c;
  c.kind = kind;
  c.inputs = absl::MakeConstSpan(in, 1);
  c.scalar = scalar;
  c.has_scalar = true;
  c.scalar_first = scalar_first;
  c.run = run;
  return dispatch(c);
}

// Runs an in-place op and rebinds `self` to its result (an interceptor may hand back a different
// tensor, e.g. f32 for an int8 input it had to dequantize).
Tensor& call_inplace(OpKind kind, Tensor& self, const Tensor* other, const void* params, double scalar,
                     bool has_scalar, OpFn run) {
  const Tensor* in[] = {&self, other};
  OpCall c;
  c.kind = kind;
  c.inputs = absl::MakeConstSpan(in, other != nullptr ? 2 : 1);
  c.params = params;
  c.scalar = scalar;
  c.has_scalar = has_scalar;
  c.inplace = true;
  c.run = run;
  // Always rebind: besides new storage, the result may carry a new trace id or parameters.
  self = dispatch(c);
  return self;
}

Tensor& mutable_self(const OpCall& c) { return const_cast<Tensor&>(*c.inputs[0]); }

kernels::BinaryAlg binary_alg(OpKind k) {
  switch (k) {
    case OpKind::kSub:
      return kernels::BinaryAlg::kSub;
    case OpKind::kMul:
      return kernels::BinaryAlg::kMul;
    case OpKind::kDiv:
      return kernels::BinaryAlg::kDiv;
    default:
      return kernels::BinaryAlg::kAdd;
  }
}

Tensor run_binary(const OpCall& c) {
  if (c.has_scalar) return kernels::binary_scalar(binary_alg(c.kind), c.input(0), c.scalar, c.scalar_first);
  return kernels::binary(binary_alg(c.kind), c.input(0), c.input(1));
}

Tensor run_binary_inplace(const OpCall& c) {
  Tensor& self = mutable_self(c);
  if (c.has_scalar) {
    kernels::binary_scalar_inplace(binary_alg(c.kind), self, c.scalar);
  } else {
    kernels::binary_inplace(binary_alg(c.kind), self, c.input(1));
  }
  return self;
}

Tensor binary_op(OpKind kind, const Tensor& a, const Tensor& b) {
  const Tensor* in[] = {&a, &b};
  return call(kind, in, nullptr, run_binary);
}

// Unary activations share one run function; ActivationParams carries their constants.
kernels::UnaryAlg unary_alg(const OpCall& c) {
  switch (c.kind) {
    case OpKind::kRelu:
      return kernels::UnaryAlg::kRelu;
    case OpKind::kRelu6:
    case OpKind::kHardtanh:
    case OpKind::kClamp:
      return kernels::UnaryAlg::kClip;
    case OpKind::kLeakyRelu:
      return kernels::UnaryAlg::kLeakyRelu;
    case OpKind::kSigmoid:
      return kernels::UnaryAlg::kSigmoid;
    case OpKind::kTanh:
      return kernels::UnaryAlg::kTanh;
    case OpKind::kHardsigmoid:
      return kernels::UnaryAlg::kHardsigmoid;
    case OpKind::kHardswish:
      return kernels::UnaryAlg::kHardswish;
    case OpKind::kSilu:
      return kernels::UnaryAlg::kSilu;
    case OpKind::kGelu:
      return c.params != nullptr && c.p<ActivationParams>().approximate_tanh ? kernels::UnaryAlg::kGeluTanh
                                                                             : kernels::UnaryAlg::kGeluErf;
    default:
      DBRQ_CHECK(false, "not a unary op: ", op_name(c.kind));
  }
  return kernels::UnaryAlg::kRelu;
}

Tensor run_unary(const OpCall& c) {
  const ActivationParams p = c.params != nullptr ? c.p<ActivationParams>() : ActivationParams{};
  // Checked here so the error names the op (relu6 and clamp share the kernel's clip algorithm).
  check_float(op_name(c.kind), c.inplace ? "self" : "input", c.input(0));
  if (c.inplace) {
    Tensor& self = mutable_self(c);
    kernels::unary_inplace(unary_alg(c), self, static_cast<float>(p.alpha), static_cast<float>(p.beta));
    return self;
  }
  return kernels::unary(unary_alg(c), c.input(0), static_cast<float>(p.alpha), static_cast<float>(p.beta));
}

Tensor unary_op(OpKind kind, const Tensor& x, const ActivationParams* p = nullptr) {
  const Tensor* in[] = {&x};
  return call(kind, in, p, run_unary);
}

std::array<int64_t, 2> default_stride(const std::vector<int64_t>& stride, std::array<int64_t, 2> kernel,
                                      const char* op) {
  if (stride.empty()) return kernel;
  DBRQ_ENSURE(stride.size() == 2, ValueError, op, ": stride must have 2 values or none, got ",
              shape_to_string(stride));
  return {stride[0], stride[1]};
}

// ---- shape ops: views that work for every dtype and keep quantization parameters ----

void check_not_per_channel(const char* op, const Tensor& x) {
  DBRQ_ENSURE(!(x.is_quantized() && x.qparams()->is_per_channel()), DTypeError, op,
              ": per-channel quantized tensors cannot be reshaped; dequantize first");
}

Tensor reshape_impl(const Tensor& x, IntArrayRef target_in) {
  check_defined("reshape", "input", x);
  const std::vector<int64_t> target = infer_reshape(target_in, x.numel(), x.sizes());
  if (IntArrayRef(target) == x.sizes()) return x.raw_as_strided(x.sizes(), x.strides(), x.storage_offset());
  check_not_per_channel("reshape", x);
  Tensor v = x.raw_view(target);
  if (v.defined()) return v;
  return kernels::copy(x, MemoryFormat::kContiguous, x.dtype()).raw_view(target);
}

Tensor run_reshape(const OpCall& c) { return reshape_impl(c.input(0), c.p<ShapeParams>().sizes); }

Tensor run_view(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("view", "input", x);
  const std::vector<int64_t> target = infer_reshape(c.p<ShapeParams>().sizes, x.numel(), x.sizes());
  check_not_per_channel("view", x);
  Tensor v = x.raw_view(target);
  if (!v.defined() && x.dim() == 4 && x.is_channels_last()) {
    // dbrq keeps conv and pooling activations channels-last; the tensor the user holds is NCHW and
    // view() must mean what it means on NCHW. Its memory cannot be viewed that way, so view reads
    // it through a row-major copy, like reshape (writes to the result do not reach x).
    return kernels::copy(x, MemoryFormat::kContiguous, x.dtype()).raw_view(target);
  }
  DBRQ_ENSURE(v.defined(), ShapeError, "view: sizes ", shape_to_string(target), " are not compatible with the strides of a tensor of sizes ",
              x.shape_string(), "; use reshape()");
  return v;
}

Tensor run_flatten(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("flatten", "input", x);
  const ShapeParams& p = c.p<ShapeParams>();
  if (x.dim() == 0) return reshape_impl(x, {1});
  const int64_t start = x.wrap_dim(p.start), end = x.wrap_dim(p.length);
  DBRQ_ENSURE(start <= end, ValueError, "flatten: start_dim (", p.start, ") must not come after end_dim (", p.length, ")");
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < start; ++d) sizes.push_back(x.size(d));
  int64_t m = 1;
  for (int64_t d = start; d <= end; ++d) m *= x.size(d);
  sizes.push_back(m);
  for (int64_t d = end + 1; d < x.dim(); ++d) sizes.push_back(x.size(d));
  return reshape_impl(x, sizes);
}

Tensor run_permute(const OpCall& c) {
  check_defined("permute", "input", c.input(0));
  return c.input(0).raw_permute(c.p<ShapeParams>().sizes);
}

Tensor run_transpose(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("transpose", "input", x);
  const ShapeParams& p = c.p<ShapeParams>();
  const int64_t a = x.wrap_dim(p.start), b = x.wrap_dim(p.length);
  std::vector<int64_t> dims(x.dim());
  for (int64_t d = 0; d < x.dim(); ++d) dims[d] = d;
  std::swap(dims[a], dims[b]);
  return x.raw_permute(dims);
}

Tensor run_narrow(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("narrow", "input", x);
  const ShapeParams& p = c.p<ShapeParams>();
  const int64_t d = x.wrap_dim(p.sizes.at(0));
  const int64_t step = p.sizes.at(1);
  DBRQ_ENSURE(step >= 1, ValueError, "slice: step must be >= 1, got ", step);
  Tensor n = x.raw_narrow(d, p.start, p.length);
  if (step == 1) return n;
  std::vector<int64_t> sizes(n.sizes().begin(), n.sizes().end()), strides(n.strides().begin(), n.strides().end());
  sizes[d] = (p.length + step - 1) / step;
  strides[d] *= step;
  Tensor s = n.raw_as_strided(sizes, strides, n.storage_offset());
  if (n.is_quantized() && n.qparams()->axis == d) {
    // Per-channel parameters: keep those of the channels the step keeps.
    auto q = std::make_shared<QuantParams>(*n.qparams());
    q->scales.clear();
    q->zero_points.clear();
    for (int64_t i = 0; i < p.length; i += step) {
      q->scales.push_back(n.qparams()->scales[i]);
      q->zero_points.push_back(n.qparams()->zero_points[i]);
    }
    s = s.with_qparams(std::move(q));
  }
  return s;
}

Tensor run_select(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("select", "input", x);
  const ShapeParams& p = c.p<ShapeParams>();
  DBRQ_ENSURE(x.dim() >= 1, ShapeError, "select: cannot select from a 0-D tensor");
  const int64_t d = x.wrap_dim(p.sizes.at(0));
  int64_t i = p.start;
  DBRQ_ENSURE(i >= -x.size(d) && i < x.size(d), IndexError, "select: index ", i, " is out of range for dim ", d,
              " of size ", x.size(d));
  if (i < 0) i += x.size(d);
  std::vector<int64_t> sizes, strides;
  for (int64_t k = 0; k < x.dim(); ++k) {
    if (k == d) continue;
    sizes.push_back(x.size(k));
    strides.push_back(x.stride(k));
  }
  check_not_per_channel("select", x);
  return x.raw_as_strided(sizes, strides, x.storage_offset() + i * x.stride(d));
}

Tensor run_unsqueeze(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("unsqueeze", "input", x);
  int64_t d = c.p<ShapeParams>().start;
  const int64_t n = x.dim() + 1;
  DBRQ_ENSURE(d >= -n && d < n, IndexError, "unsqueeze: dim ", d, " is out of range for a ", x.dim(), "-D tensor");
  if (d < 0) d += n;
  check_not_per_channel("unsqueeze", x);
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end()), strides(x.strides().begin(), x.strides().end());
  const int64_t st = d < x.dim() ? x.stride(d) * x.size(d) : 1;
  sizes.insert(sizes.begin() + d, 1);
  strides.insert(strides.begin() + d, st);
  return x.raw_as_strided(sizes, strides, x.storage_offset());
}

Tensor run_squeeze(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("squeeze", "input", x);
  const int64_t d = x.wrap_dim(c.p<ShapeParams>().start);
  if (x.size(d) != 1) return x.raw_as_strided(x.sizes(), x.strides(), x.storage_offset());
  check_not_per_channel("squeeze", x);
  std::vector<int64_t> sizes, strides;
  for (int64_t k = 0; k < x.dim(); ++k) {
    if (k == d) continue;
    sizes.push_back(x.size(k));
    strides.push_back(x.stride(k));
  }
  return x.raw_as_strided(sizes, strides, x.storage_offset());
}

Tensor run_contiguous(const OpCall& c) {
  const auto format = static_cast<MemoryFormat>(c.p<ConvertParams>().memory_format);
  const Tensor& x = c.input(0);
  check_defined("contiguous", "input", x);
  return kernels::contiguous(x, format);
}

Tensor run_identity(const OpCall& c) {
  check_defined("identity", "input", c.input(0));
  return c.input(0);
}

Tensor run_dropout(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("dropout", "input", x);
  const DropoutParams& p = c.p<DropoutParams>();
  DBRQ_ENSURE(p.p >= 0.0 && p.p <= 1.0, ValueError, "dropout: probability must be in [0, 1], got ", p.p);
  if (!p.training || p.p == 0.0) return x;
  check_float("dropout", "input", x);
  // Training mode: zero with probability p, scale the rest by 1/(1-p).
  thread_local std::mt19937_64 gen(0x5eed);
  std::bernoulli_distribution keep(1.0 - p.p);
  Tensor out = kernels::copy(x, MemoryFormat::kContiguous, DType::kF32);
  float* d = out.mutable_data<float>();
  const float scale = p.p < 1.0 ? static_cast<float>(1.0 / (1.0 - p.p)) : 0.f;
  for (int64_t i = 0; i < out.numel(); ++i) d[i] = keep(gen) ? d[i] * scale : 0.f;
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// compute ops

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) {
  const Tensor* in[] = {&input, &weight, &bias};
  return call(OpKind::kConv2d, in, &params, [](const OpCall& c) {
    return kernels::conv2d(c.input(0), c.input(1), c.input(2), c.p<Conv2dParams>());
  });
}

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  const Tensor* in[] = {&input, &weight, &bias};
  return call(OpKind::kLinear, in, nullptr,
              [](const OpCall& c) { return kernels::linear(c.input(0), c.input(1), c.input(2)); });
}

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  const Tensor* in[] = {&indices, &weight};
  return call(OpKind::kEmbedding, in, nullptr,
              [](const OpCall& c) { return kernels::embedding(c.input(0), c.input(1)); });
}

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, double eps) {
  const Tensor* in[] = {&input, &running_mean, &running_var, &weight, &bias};
  NormParams p;
  p.eps = eps;
  return call(OpKind::kBatchNorm, in, &p, [](const OpCall& c) {
    return kernels::batch_norm(c.input(0), c.input(1), c.input(2), c.input(3), c.input(4), c.p<NormParams>().eps);
  });
}

Tensor layer_norm(const Tensor& input, std::vector<int64_t> normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  const Tensor* in[] = {&input, &weight, &bias};
  NormParams p;
  p.eps = eps;
  p.normalized_shape = std::move(normalized_shape);
  return call(OpKind::kLayerNorm, in, &p, [](const OpCall& c) {
    const NormParams& np = c.p<NormParams>();
    return kernels::layer_norm(c.input(0), np.normalized_shape, c.input(1), c.input(2), np.eps);
  });
}

Tensor matmul(const Tensor& input, const Tensor& other) {
  const Tensor* in[] = {&input, &other};
  return call(OpKind::kMatmul, in, nullptr, [](const OpCall& c) { return kernels::matmul(c.input(0), c.input(1)); });
}

// ---------------------------------------------------------------------------------------------
// binary

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(OpKind::kAdd, a, b); }
Tensor add(const Tensor& a, double b) { return call_scalar(OpKind::kAdd, a, b, false, run_binary); }
Tensor add(double a, const Tensor& b) { return call_scalar(OpKind::kAdd, b, a, true, run_binary); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(OpKind::kSub, a, b); }
Tensor sub(const Tensor& a, double b) { return call_scalar(OpKind::kSub, a, b, false, run_binary); }
Tensor sub(double a, const Tensor& b) { return call_scalar(OpKind::kSub, b, a, true, run_binary); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(OpKind::kMul, a, b); }
Tensor mul(const Tensor& a, double b) { return call_scalar(OpKind::kMul, a, b, false, run_binary); }
Tensor mul(double a, const Tensor& b) { return call_scalar(OpKind::kMul, b, a, true, run_binary); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(OpKind::kDiv, a, b); }
Tensor div(const Tensor& a, double b) { return call_scalar(OpKind::kDiv, a, b, false, run_binary); }
Tensor div(double a, const Tensor& b) { return call_scalar(OpKind::kDiv, b, a, true, run_binary); }

// ---------------------------------------------------------------------------------------------
// activations

Tensor relu(const Tensor& x) { return unary_op(OpKind::kRelu, x); }

Tensor relu6(const Tensor& x) {
  static const ActivationParams p{0.0, 6.0, false};
  return unary_op(OpKind::kRelu6, x, &p);
}

Tensor hardtanh(const Tensor& x, double min_val, double max_val) {
  DBRQ_ENSURE(min_val <= max_val, ValueError, "hardtanh: min_val (", min_val, ") must be <= max_val (", max_val, ")");
  const ActivationParams p{min_val, max_val, false};
  return unary_op(OpKind::kHardtanh, x, &p);
}

Tensor clamp(const Tensor& x, double min_val, double max_val) {
  DBRQ_ENSURE(min_val <= max_val, ValueError, "clamp: min (", min_val, ") must be <= max (", max_val, ")");
  const ActivationParams p{min_val, max_val, false};
  return unary_op(OpKind::kClamp, x, &p);
}

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  const ActivationParams p{negative_slope, 0.0, false};
  return unary_op(OpKind::kLeakyRelu, x, &p);
}

Tensor sigmoid(const Tensor& x) { return unary_op(OpKind::kSigmoid, x); }
Tensor tanh(const Tensor& x) { return unary_op(OpKind::kTanh, x); }
Tensor hardsigmoid(const Tensor& x) { return unary_op(OpKind::kHardsigmoid, x); }
Tensor hardswish(const Tensor& x) { return unary_op(OpKind::kHardswish, x); }
Tensor silu(const Tensor& x) { return unary_op(OpKind::kSilu, x); }

Tensor gelu(const Tensor& x, const std::string& approximate) {
  DBRQ_ENSURE(approximate == "none" || approximate == "tanh", ValueError,
              "gelu: approximate must be \"none\" or \"tanh\", got \"", approximate, "\"");
  const ActivationParams p{0.0, 0.0, approximate == "tanh"};
  return unary_op(OpKind::kGelu, x, &p);
}

Tensor softmax(const Tensor& x, int64_t dim) {
  const Tensor* in[] = {&x};
  DimParams p;
  p.dims = {dim};
  return call(OpKind::kSoftmax, in, &p,
              [](const OpCall& c) { return kernels::softmax(c.input(0), c.p<DimParams>().dims[0], false); });
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  const Tensor* in[] = {&x};
  DimParams p;
  p.dims = {dim};
  return call(OpKind::kLogSoftmax, in, &p,
              [](const OpCall& c) { return kernels::softmax(c.input(0), c.p<DimParams>().dims[0], true); });
}

// ---------------------------------------------------------------------------------------------
// pooling

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel_size, std::vector<int64_t> stride,
                  std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, bool ceil_mode) {
  Pool2dParams p;
  p.kernel_size = kernel_size;
  p.stride = default_stride(stride, kernel_size, "max_pool2d");
  p.padding = padding;
  p.dilation = dilation;
  p.ceil_mode = ceil_mode;
  const Tensor* in[] = {&x};
  return call(OpKind::kMaxPool2d, in, &p,
              [](const OpCall& c) { return kernels::max_pool2d(c.input(0), c.p<Pool2dParams>()); });
}

Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel_size, std::vector<int64_t> stride,
                  std::array<int64_t, 2> padding, bool ceil_mode, bool count_include_pad) {
  Pool2dParams p;
  p.kernel_size = kernel_size;
  p.stride = default_stride(stride, kernel_size, "avg_pool2d");
  p.padding = padding;
  p.ceil_mode = ceil_mode;
  p.count_include_pad = count_include_pad;
  const Tensor* in[] = {&x};
  return call(OpKind::kAvgPool2d, in, &p,
              [](const OpCall& c) { return kernels::avg_pool2d(c.input(0), c.p<Pool2dParams>()); });
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size) {
  AdaptivePool2dParams p;
  p.output_size = output_size;
  const Tensor* in[] = {&x};
  return call(OpKind::kAdaptiveAvgPool2d, in, &p, [](const OpCall& c) {
    return kernels::adaptive_avg_pool2d(c.input(0), c.p<AdaptivePool2dParams>().output_size);
  });
}

// ---------------------------------------------------------------------------------------------
// reductions

Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  DimParams p;
  p.dims = std::move(dims);
  p.keepdim = keepdim;
  const Tensor* in[] = {&x};
  return call(OpKind::kMean, in, &p, [](const OpCall& c) {
    return kernels::mean(c.input(0), c.p<DimParams>().dims, c.p<DimParams>().keepdim);
  });
}

Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  DimParams p;
  p.dims = std::move(dims);
  p.keepdim = keepdim;
  const Tensor* in[] = {&x};
  return call(OpKind::kSum, in, &p, [](const OpCall& c) {
    return kernels::sum(c.input(0), c.p<DimParams>().dims, c.p<DimParams>().keepdim);
  });
}

Tensor std(const Tensor& x, std::vector<int64_t> dims, bool unbiased, bool keepdim) {
  DimParams p;
  p.dims = std::move(dims);
  p.keepdim = keepdim;
  p.unbiased = unbiased;
  const Tensor* in[] = {&x};
  return call(OpKind::kStd, in, &p, [](const OpCall& c) {
    const DimParams& dp = c.p<DimParams>();
    return kernels::std_dev(c.input(0), dp.dims, dp.unbiased, dp.keepdim);
  });
}

// ---------------------------------------------------------------------------------------------
// joining and shape ops

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  absl::InlinedVector<const Tensor*, 8> in;
  in.reserve(tensors.size());
  for (const Tensor& t : tensors) in.push_back(&t);
  DimParams p;
  p.dims = {dim};
  OpCall c;
  c.kind = OpKind::kCat;
  c.inputs = absl::MakeConstSpan(in);
  c.params = &p;
  c.run = [](const OpCall& call) { return kernels::cat(call.inputs, call.p<DimParams>().dims[0]); };
  return dispatch(c);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  ShapeParams p;
  p.start = start_dim;
  p.length = end_dim;
  const Tensor* in[] = {&x};
  return call(OpKind::kFlatten, in, &p, run_flatten);
}

Tensor reshape(const Tensor& x, std::vector<int64_t> sizes) {
  ShapeParams p;
  p.sizes = std::move(sizes);
  const Tensor* in[] = {&x};
  return call(OpKind::kReshape, in, &p, run_reshape);
}

Tensor permute(const Tensor& x, std::vector<int64_t> dims) {
  ShapeParams p;
  p.sizes = std::move(dims);
  const Tensor* in[] = {&x};
  return call(OpKind::kPermute, in, &p, run_permute);
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  ShapeParams p;
  p.start = dim0;
  p.length = dim1;
  const Tensor* in[] = {&x};
  return call(OpKind::kTranspose, in, &p, run_transpose);
}

Tensor dropout(const Tensor& x, double p, bool training) {
  DropoutParams dp;
  dp.p = p;
  dp.training = training;
  const Tensor* in[] = {&x};
  return call(OpKind::kDropout, in, &dp, run_dropout);
}

Tensor identity(const Tensor& x) {
  const Tensor* in[] = {&x};
  return call(OpKind::kIdentity, in, nullptr, run_identity);
}

// ---------------------------------------------------------------------------------------------
// quantization

namespace {

Tensor quantize_op(const Tensor& x, QuantParamsPtr qparams, DType dtype) {
  ConvertParams p;
  p.dtype = static_cast<int>(dtype);
  p.qparams = std::move(qparams);
  const Tensor* in[] = {&x};
  return call(OpKind::kQuantize, in, &p, [](const OpCall& c) {
    const ConvertParams& cp = c.p<ConvertParams>();
    return kernels::quantize(c.input(0), cp.qparams, static_cast<DType>(cp.dtype));
  });
}

}  // namespace

Tensor quantize_per_tensor(const Tensor& x, float scale, int32_t zero_point, DType dtype) {
  return quantize_op(x, QuantParams::per_tensor(scale, zero_point), dtype);
}

Tensor quantize_per_channel(const Tensor& x, std::vector<float> scales, std::vector<int32_t> zero_points, int64_t axis,
                            DType dtype) {
  check_defined("quantize_per_channel", "input", x);
  return quantize_op(x, QuantParams::per_channel(std::move(scales), std::move(zero_points), x.wrap_dim(axis)), dtype);
}

Tensor dequantize(const Tensor& x) {
  const Tensor* in[] = {&x};
  return call(OpKind::kDequantize, in, nullptr, [](const OpCall& c) { return kernels::dequantize(c.input(0)); });
}

// ---------------------------------------------------------------------------------------------
// Tensor's dispatching methods

Tensor Tensor::reshape(IntArrayRef sizes) const { return dbrq::reshape(*this, std::vector<int64_t>(sizes.begin(), sizes.end())); }

Tensor Tensor::view(IntArrayRef sizes) const {
  ShapeParams p;
  p.sizes.assign(sizes.begin(), sizes.end());
  const Tensor* in[] = {this};
  return call(OpKind::kReshape, in, &p, run_view);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const { return dbrq::flatten(*this, start_dim, end_dim); }
Tensor Tensor::permute(IntArrayRef dims) const { return dbrq::permute(*this, std::vector<int64_t>(dims.begin(), dims.end())); }
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const { return dbrq::transpose(*this, dim0, dim1); }

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  ShapeParams p;
  p.sizes = {dim, 1};
  p.start = start;
  p.length = length;
  const Tensor* in[] = {this};
  return call(OpKind::kNarrow, in, &p, run_narrow);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  check_defined("slice", "input", *this);
  const int64_t d = wrap_dim(dim), n = size(d);
  // Python slicing: clamp to [0, n], negative values count from the end.
  auto clamp_index = [n](int64_t i) { return std::min(std::max(i < 0 ? i + n : i, int64_t{0}), n); };
  const int64_t s = clamp_index(start), e = std::max(clamp_index(end), s);
  ShapeParams p;
  p.sizes = {d, step};
  p.start = s;
  p.length = e - s;
  const Tensor* in[] = {this};
  return call(OpKind::kNarrow, in, &p, run_narrow);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  ShapeParams p;
  p.sizes = {dim};
  p.start = index;
  const Tensor* in[] = {this};
  return call(OpKind::kSelect, in, &p, run_select);
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  ShapeParams p;
  p.start = dim;
  const Tensor* in[] = {this};
  return call(OpKind::kUnsqueeze, in, &p, run_unsqueeze);
}

Tensor Tensor::squeeze(int64_t dim) const {
  ShapeParams p;
  p.start = dim;
  const Tensor* in[] = {this};
  return call(OpKind::kSqueeze, in, &p, run_squeeze);
}

Tensor Tensor::contiguous(MemoryFormat format) const {
  ConvertParams p;
  p.memory_format = static_cast<int>(format);
  const Tensor* in[] = {this};
  return call(OpKind::kContiguous, in, &p, run_contiguous);
}

Tensor Tensor::clone() const {
  const Tensor* in[] = {this};
  return call(OpKind::kClone, in, nullptr, [](const OpCall& c) {
    check_defined("clone", "input", c.input(0));
    return kernels::copy(c.input(0), MemoryFormat::kPreserve, c.input(0).dtype());
  });
}

Tensor Tensor::to(DType dtype) const {
  ConvertParams p;
  p.dtype = static_cast<int>(dtype);
  const Tensor* in[] = {this};
  return call(OpKind::kTo, in, &p, [](const OpCall& c) {
    const Tensor& x = c.input(0);
    check_defined("to", "input", x);
    const auto target = static_cast<DType>(c.p<ConvertParams>().dtype);
    DBRQ_ENSURE(!x.is_quantized() || target == x.dtype(), DTypeError, "to(", dtype_name(target),
                "): the tensor is quantized (", dtype_name(x.dtype()), ", ", x.qparams()->to_string(),
                "); use dequantize() to get real values");
    if (target == x.dtype()) return x;
    return kernels::copy(x, MemoryFormat::kPreserve, target);
  });
}

Tensor Tensor::dequantize() const { return dbrq::dequantize(*this); }

Tensor& Tensor::add_(const Tensor& other) {
  return call_inplace(OpKind::kAdd, *this, &other, nullptr, 0.0, false, run_binary_inplace);
}
Tensor& Tensor::add_(double other) { return call_inplace(OpKind::kAdd, *this, nullptr, nullptr, other, true, run_binary_inplace); }
Tensor& Tensor::sub_(const Tensor& other) {
  return call_inplace(OpKind::kSub, *this, &other, nullptr, 0.0, false, run_binary_inplace);
}
Tensor& Tensor::sub_(double other) { return call_inplace(OpKind::kSub, *this, nullptr, nullptr, other, true, run_binary_inplace); }
Tensor& Tensor::mul_(const Tensor& other) {
  return call_inplace(OpKind::kMul, *this, &other, nullptr, 0.0, false, run_binary_inplace);
}
Tensor& Tensor::mul_(double other) { return call_inplace(OpKind::kMul, *this, nullptr, nullptr, other, true, run_binary_inplace); }
Tensor& Tensor::div_(double other) { return call_inplace(OpKind::kDiv, *this, nullptr, nullptr, other, true, run_binary_inplace); }
Tensor& Tensor::relu_() { return call_inplace(OpKind::kRelu, *this, nullptr, nullptr, 0.0, false, run_unary); }

Tensor& Tensor::clamp_(double min, double max) {
  DBRQ_ENSURE(min <= max, ValueError, "clamp_: min (", min, ") must be <= max (", max, ")");
  const ActivationParams p{min, max, false};
  return call_inplace(OpKind::kClamp, *this, nullptr, &p, 0.0, false, run_unary);
}

Tensor& Tensor::copy_(const Tensor& src) {
  return call_inplace(OpKind::kCopy, *this, &src, nullptr, 0.0, false, [](const OpCall& c) {
    Tensor& self = mutable_self(c);
    kernels::copy_into(self, c.input(1));
    return self;
  });
}

Tensor& Tensor::fill_(double value) {
  ConvertParams p;
  p.value = value;
  return call_inplace(OpKind::kFill, *this, nullptr, &p, 0.0, false, [](const OpCall& c) {
    Tensor& self = mutable_self(c);
    kernels::fill(self, c.p<ConvertParams>().value);
    return self;
  });
}

}  // namespace dbrq
