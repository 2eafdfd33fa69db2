#include "tracer/executors.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "runtime/ops.h"

namespace dbrq::tracer {

namespace {

// The last f32 tensor this thread quantized: an fp32 result feeding several int8 ops (the q, k
// and v projections after a layer norm) is quantized once, not once per consumer.
struct QuantizeMemo {
  Tensor source;  // keeps the storage alive, so its identity cannot be reused
  uint64_t version = 0;
  const QuantParams* want = nullptr;
  MemoryFormat format = MemoryFormat::kPreserve;
  Tensor result;
};
thread_local QuantizeMemo tls_memo;

Tensor quantize_memoized(const Tensor& t, const InputSpec& spec) {
  QuantizeMemo& m = tls_memo;
  if (m.want == spec.want.get() && m.format == spec.format && m.source.storage() == t.storage() &&
      m.source.storage_offset() == t.storage_offset() && m.source.sizes() == t.sizes() &&
      m.source.strides() == t.strides() && m.version == t.storage()->version()) {
    return m.result;
  }
  Tensor q = kernels::quantize_to(t, spec.want, DType::kU8, spec.format);
  m = QuantizeMemo{t, t.storage()->version(), spec.want.get(), spec.format, q};
  return q;
}

}  // namespace

Tensor prepare_input(const Tensor& t, const InputSpec& spec) {
  if (spec.want == nullptr) return t;
  if (t.dtype() == DType::kU8 && t.qparams_ptr() == spec.want) return t;  // the common case
  if (t.is_quantized()) {
    if (t.dtype() == DType::kU8 && !t.qparams()->is_per_channel()) {
      return *t.qparams() == *spec.want ? t.with_qparams(spec.want) : kernels::requantize(t, spec.want);
    }
    return kernels::quantize_to(kernels::dequantize(t), spec.want, DType::kU8, spec.format);
  }
  DBRQ_ENSURE(t.dtype() == DType::kF32, DTypeError, "int8 op: input has dtype ", dtype_name(t.dtype()),
              "; expected f32 or a quantized u8 tensor");
  return quantize_memoized(t, spec);
}

namespace {

bool same_conv_params(const Conv2dParams& a, const Conv2dParams& b) {
  return a.stride == b.stride && a.padding == b.padding && a.dilation == b.dilation && a.groups == b.groups;
}

// Convs whose result waits for their residual (conv -> add fusion), per calling thread.
struct Pending {
  Tensor input;
  Tensor output;
};
thread_local absl::flat_hash_map<const ConvExec*, Pending> tls_pending;

}  // namespace

void drop_pending_on_this_thread() noexcept { tls_pending.clear(); }

// ---------------------------------------------------------------------------------------------

ConvExec::ConvExec(Factory factory, Conv2dParams params, InputSpec input, const Tensor& weight, bool deferred)
    : factory_(std::move(factory)),
      params_(params),
      input_(std::move(input)),
      deferred_(deferred),
      kernel_(factory_()),
      weight_storage_(weight.storage().get()),
      weight_version_(weight.storage()->version()) {}

const kernels::QConv2d& ConvExec::kernel(const Tensor& weight) {
  std::lock_guard<std::mutex> lock(mu_);
  if (weight.storage().get() != weight_storage_ || weight.storage()->version() != weight_version_) {
    // The weights changed after convert (e.g. load_state_dict): quantize and pack them again.
    log()->warn("int8 conv2d: weights changed after convert; re-quantizing them");
    kernel_ = std::shared_ptr<kernels::QConv2d>(factory_());
    weight_storage_ = weight.storage().get();
    weight_version_ = weight.storage()->version();
  }
  return *kernel_;
}

Tensor ConvExec::run(const OpCall& call) {
  if (!same_conv_params(call.p<Conv2dParams>(), params_)) {
    DBRQ_THROW(ControlFlowError, "int8 conv2d: stride/padding/dilation/groups differ from the ones recorded by the "
               "first run; conv parameters must not change between calls");
  }
  const kernels::QConv2d& k = kernel(call.input(1));
  Tensor x = prepare_input(call.input(0), input_);
  if (!deferred_) return k.run(x);
  // conv -> add fusion: the residual is not known yet. Hand out the (unfilled) output; the add
  // fills it with the sum post-op.
  Tensor out = k.empty_output(x);
  tls_pending[this] = Pending{std::move(x), out};
  return out;
}

Tensor ConvExec::finish(const Tensor& pending, const Tensor& residual) {
  auto it = tls_pending.find(this);
  DBRQ_ENSURE(it != tls_pending.end() && it->second.output.storage() == pending.storage(), ControlFlowError,
              "fused conv2d + add: the add received a tensor that is not the fused conv's result (data flow changed "
              "since the first run)");
  Pending p = std::move(it->second);
  tls_pending.erase(it);
  std::shared_ptr<kernels::QConv2d> k;
  {
    std::lock_guard<std::mutex> lock(mu_);
    k = kernel_;
  }
  const Tensor r = prepare_input(residual, residual_);
  return k->run(p.input, &r, &p.output);
}

std::string ConvExec::describe() const { return kernel_->describe() + (deferred_ ? " (waits for its residual)" : ""); }

Tensor ResidualAddExec::run(const OpCall& call) {
  return base_->finish(call.input(1 - residual_input_), call.input(residual_input_));
}

// ---------------------------------------------------------------------------------------------

LinearExec::LinearExec(Factory factory, InputSpec input, const Tensor& weight, bool dynamic)
    : factory_(std::move(factory)),
      input_(std::move(input)),
      dynamic_(dynamic),
      kernel_(factory_()),
      weight_storage_(weight.storage().get()),
      weight_version_(weight.storage()->version()) {}

Tensor LinearExec::run(const OpCall& call) {
  std::shared_ptr<kernels::QLinear> k;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Tensor& w = call.input(1);
    if (w.storage().get() != weight_storage_ || w.storage()->version() != weight_version_) {
      log()->warn("int8 linear: weights changed after convert; re-quantizing them");
      kernel_ = std::shared_ptr<kernels::QLinear>(factory_());
      weight_storage_ = w.storage().get();
      weight_version_ = w.storage()->version();
    }
    k = kernel_;
  }
  return k->run(prepare_input(call.input(0), input_));
}

std::string LinearExec::describe() const { return kernel_->describe(); }

Tensor MatmulExec::run(const OpCall& call) {
  if (dynamic_) return kernel_.run(call.input(0), call.input(1));
  return kernel_.run(prepare_input(call.input(0), a_), prepare_input(call.input(1), b_));
}

// ---------------------------------------------------------------------------------------------

Tensor BinaryExec::run(const OpCall& call) {
  const Tensor a = prepare_input(call.input(0), a_);
  const Tensor b = prepare_input(call.input(1), b_);
  if (a.sizes() == b.sizes()) {
    return kind_ == OpKind::kAdd ? kernels::qadd(a, b, out_, relu_) : kernels::qmul(a, b, out_, relu_);
  }
  // Broadcasting: through fp32 (PyTorch's int8 add/mul do not broadcast either).
  Tensor r = kernels::binary(kind_ == OpKind::kAdd ? kernels::BinaryAlg::kAdd : kernels::BinaryAlg::kMul,
                             kernels::dequantize(a), kernels::dequantize(b));
  if (relu_) r = kernels::unary(kernels::UnaryAlg::kRelu, r);
  return kernels::quantize_to(r, out_, DType::kU8, MemoryFormat::kPreserve);
}

std::string BinaryExec::describe() const {
  return absl::StrCat("int8 ", op_name(kind_), relu_ ? "+relu" : "");
}

// ---------------------------------------------------------------------------------------------

ScalarExec::ScalarExec(OpKind kind, double scalar, QuantParamsPtr expected_in) : kind_(kind), scalar_(scalar), in_(expected_in) {
  out_ = derive(kind_, scalar_, *in_, &lut_, &identity_);
}

QuantParamsPtr ScalarExec::derive(OpKind kind, double c, const QuantParams& in, kernels::Lut* lut, bool* identity) {
  constexpr int64_t q_min = 0, q_max = 255;
  const double s = in.scale();
  const int64_t z = in.zero_point();
  *identity = true;
  for (int q = 0; q < 256; ++q) (*lut)[q] = static_cast<uint8_t>(q);
  if (kind == OpKind::kSub) c = -c;
  if (kind == OpKind::kDiv) c = 1.0 / c;
  if (kind == OpKind::kAdd || kind == OpKind::kSub) {
    // PyTorch's add_scalar: shift the zero point; saturate by rescaling when it leaves the range.
    const int64_t c_q = static_cast<int64_t>(std::nearbyint(c / s));
    double s_prime = s;
    int64_t z_prime = z - c_q;
    if (q_min > z - c_q) {
      s_prime = (static_cast<double>(q_max) - static_cast<double>(z - c_q)) / static_cast<double>(q_max - q_min) * s;
      z_prime = q_min;
    } else if (q_max < z - c_q) {
      s_prime = (static_cast<double>(z - c_q) - static_cast<double>(q_min)) / static_cast<double>(q_max - q_min) * s;
      z_prime = q_max;
    }
    if (s_prime != s) {
      *identity = false;
      const float multiplier = static_cast<float>(s / s_prime);
      for (int q = 0; q < 256; ++q) {
        const int32_t v = static_cast<int32_t>(q - z + c_q);
        const int32_t r = static_cast<int32_t>(std::nearbyint(static_cast<float>(v) * multiplier)) + static_cast<int32_t>(z_prime);
        (*lut)[q] = static_cast<uint8_t>(std::min(std::max(r, 0), 255));
      }
    }
    return QuantParams::per_tensor(static_cast<float>(s_prime), static_cast<int32_t>(z_prime));
  }
  // mul (and div by its reciprocal): PyTorch's mul_scalar.
  if (c > 0.0) return QuantParams::per_tensor(static_cast<float>(c * s), static_cast<int32_t>(z));
  *identity = false;
  if (c == 0.0) {
    lut->fill(0);
    return QuantParams::per_tensor(1.0f, 0);
  }
  for (int q = 0; q < 256; ++q) (*lut)[q] = static_cast<uint8_t>(q_max + q_min - q);
  return QuantParams::per_tensor(static_cast<float>(std::abs(c) * s), static_cast<int32_t>(q_max - (z - q_min)));
}

Tensor ScalarExec::run(const OpCall& call) {
  const Tensor& x = call.input(0);
  if (x.dtype() == DType::kU8 && x.qparams_ptr() == in_) {
    return identity_ ? x.with_qparams(out_) : kernels::apply_lut(x, lut_, out_);
  }
  if (x.dtype() == DType::kU8 && x.is_quantized() && !x.qparams()->is_per_channel()) {
    // Parameters other than expected: derive for these (rare; allocates).
    kernels::Lut lut;
    bool identity;
    QuantParamsPtr out = derive(kind_, scalar_, *x.qparams(), &lut, &identity);
    return identity ? x.with_qparams(out) : kernels::apply_lut(x, lut, out);
  }
  return run_fp32(call);
}

std::string ScalarExec::describe() const {
  return absl::StrCat("int8 ", op_name(kind_), " scalar (", identity_ ? "parameters only" : "code table", ")");
}

// ---------------------------------------------------------------------------------------------

Tensor CatExec::run(const OpCall& call) {
  absl::InlinedVector<Tensor, 8> prepared;
  absl::InlinedVector<const Tensor*, 8> ptrs;
  prepared.reserve(call.inputs.size());
  for (const Tensor* t : call.inputs) prepared.push_back(prepare_input(*t, InputSpec{shared_, MemoryFormat::kPreserve}));
  for (const Tensor& t : prepared) ptrs.push_back(&t);
  return kernels::cat(absl::MakeConstSpan(ptrs), call.p<DimParams>().dims[0]);
}

Tensor ShareExec::run(const OpCall& call) {
  const Tensor x = prepare_input(call.input(0), input_);
  switch (kind_) {
    case OpKind::kAvgPool2d:
      return kernels::qavg_pool2d(x, std::get<Pool2dParams>(params_));
    case OpKind::kAdaptiveAvgPool2d:
      return kernels::qadaptive_avg_pool2d(x, std::get<AdaptivePool2dParams>(params_).output_size);
    case OpKind::kMean: {
      const DimParams& p = std::get<DimParams>(params_);
      return kernels::qmean(x, p.dims, p.keepdim);
    }
    case OpKind::kRelu:
      return kernels::qclamp(x, 0.0, std::numeric_limits<double>::infinity());
    case OpKind::kRelu6:
    case OpKind::kHardtanh:
    case OpKind::kClamp: {
      const ActivationParams& p = std::get<ActivationParams>(params_);
      return kernels::qclamp(x, p.alpha, p.beta);
    }
    default: {
      // Shape ops, max pooling, dropout, identity: their eager kernels keep int8 and its parameters.
      const Tensor* in[] = {&x};
      OpCall c = call;
      c.inputs = absl::MakeConstSpan(in, 1);
      return c.run(c);
    }
  }
}

std::string ShareExec::describe() const { return absl::StrCat("int8 ", op_name(kind_), " (shares parameters)"); }

Tensor LutExec::run(const OpCall& call) {
  return kernels::apply_lut(prepare_input(call.input(0), input_), lut_, out_);
}

std::string LutExec::describe() const { return absl::StrCat("int8 ", op_name(kind_), " (256-entry table)"); }

Tensor SoftmaxExec::run(const OpCall& call) {
  return kernels::qsoftmax(prepare_input(call.input(0), input_), dim_, out_);
}

std::function<float(float)> elementwise_fn(OpKind kind, const OpParamsCopy& params) {
  switch (kind) {
    case OpKind::kSigmoid:
      return [](float x) { return 1.f / (1.f + std::exp(-x)); };
    case OpKind::kTanh:
      return [](float x) { return std::tanh(x); };
    case OpKind::kHardsigmoid:
      return [](float x) { return std::min(std::max(x + 3.f, 0.f), 6.f) / 6.f; };
    case OpKind::kHardswish:
      return [](float x) { return x * std::min(std::max(x + 3.f, 0.f), 6.f) / 6.f; };
    case OpKind::kSilu:
      return [](float x) { return x / (1.f + std::exp(-x)); };
    case OpKind::kLeakyRelu: {
      const float slope = static_cast<float>(std::get<ActivationParams>(params).alpha);
      return [slope](float x) { return x > 0.f ? x : x * slope; };
    }
    case OpKind::kGelu: {
      const bool tanh_approx = std::holds_alternative<ActivationParams>(params) &&
                               std::get<ActivationParams>(params).approximate_tanh;
      if (tanh_approx) {
        return [](float x) {
          const float k = 0.7978845608028654f;  // sqrt(2 / pi)
          return 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x)));
        };
      }
      return [](float x) { return 0.5f * x * (1.f + std::erf(x * 0.7071067811865476f)); };
    }
    default:
      DBRQ_CHECK(false, "no elementwise function for ", op_name(kind));
  }
  return nullptr;
}

}  // namespace dbrq::tracer
