// The activation family: unary elementwise functions (relu, relu6, hardtanh, clamp, leaky_relu,
// sigmoid, tanh, hardsigmoid, hardswish, silu, gelu, elu) and the normalizing reductions softmax and
// log_softmax; issue 12's prelu, softplus and mish.
//
// Each unary activation is one kernels::Eltwise (oneDNN's vocabulary): that runs it eagerly, makes it
// a post-op when fused after a conv or linear, and (through kernels::eltwise_reference, PyTorch's
// formula) fills its int8 code table and is what the tests compare against. Its int8 form follows
// from its role: relu and the clamps keep their input's parameters (kShare, a clamp on codes);
// sigmoid-like ops have fixed output parameters; the rest go through a 256-entry table (kLut).
#include <cmath>
#include <limits>
#include <memory>
#include <utility>

#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

using kernels::Eltwise;

const ActivationParams& act(const void* p) { return *static_cast<const ActivationParams*>(p); }

// The eager kernel of every unary activation: its eltwise, out of place or in place.
Tensor run_activation(const OpCall& c) {
  const OpDef& d = op_def(c.kind);
  const Eltwise e = d.eltwise(c.params);
  // Checked here so the error names the op (relu6, hardtanh and clamp share oneDNN's clip).
  check_float(d.name, c.inplace ? "self" : "input", c.input(0));
  if (c.inplace) {
    Tensor& self = ops::mutable_self(c);
    kernels::eltwise_inplace(e, self);
    return self;
  }
  return kernels::eltwise(e, c.input(0));
}

DimVector same_sizes(const OpCall& c) {
  return DimVector(c.input(0).sizes().begin(), c.input(0).sizes().end());
}

Tensor unary_op(OpKind kind, const Tensor& x, const ActivationParams* p = nullptr) {
  const Tensor* in[] = {&x};
  return ops::call(kind, in, p, run_activation);
}

// int8 relu and the clamps: a clamp of the real values on the codes, same parameters.
Tensor int8_relu(const Tensor& x, const void*) { return kernels::qclamp(x, 0.0, std::numeric_limits<double>::infinity()); }
Tensor int8_clamp(const Tensor& x, const void* p) { return kernels::qclamp(x, act(p).alpha, act(p).beta); }

Tensor run_softmax(const OpCall& c) { return kernels::softmax(c.input(0), c.p<DimParams>().dims[0], false); }
Tensor run_log_softmax(const OpCall& c) { return kernels::softmax(c.input(0), c.p<DimParams>().dims[0], true); }
Tensor int8_softmax(const Tensor& x, const void* p, const QuantParamsPtr& out) {
  return kernels::qsoftmax(x, static_cast<const DimParams*>(p)->dims.at(0), out);
}

const ActivationParams kRelu6Params{0.0, 6.0, false};

Tensor run_prelu(const OpCall& c) {
  check_defined("prelu", "input", c.input(0));
  check_defined("prelu", "weight", c.input(1));
  return kernels::prelu(c.input(0), c.input(1));
}

std::unique_ptr<kernels::QWeighted> make_qprelu(kernels::QWeightedOptions o, const void*) {
  return std::make_unique<kernels::QPReLU>(std::move(o));
}

}  // namespace

Tensor relu(const Tensor& x) { return unary_op(OpKind::kRelu, x); }
Tensor relu6(const Tensor& x) { return unary_op(OpKind::kRelu6, x, &kRelu6Params); }

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

Tensor elu(const Tensor& x, double alpha) {
  const ActivationParams p{alpha, 0.0, false};
  return unary_op(OpKind::kElu, x, &p);
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

Tensor softplus(const Tensor& x, double beta, double threshold) {
  DBRQ_ENSURE(beta != 0.0 && std::isfinite(beta), ValueError, "softplus: beta must be nonzero and finite, got ", beta);
  DBRQ_ENSURE(!std::isnan(threshold), ValueError, "softplus: threshold must not be NaN");
  const ActivationParams p{beta, threshold, false};
  return unary_op(OpKind::kSoftplus, x, &p);
}

Tensor mish(const Tensor& x) { return unary_op(OpKind::kMish, x); }

Tensor prelu(const Tensor& x, const Tensor& weight) {
  const Tensor* in[] = {&x, &weight};
  return ops::call(OpKind::kPrelu, in, nullptr, run_prelu);
}

Tensor softmax(const Tensor& x, int64_t dim) {
  const Tensor* in[] = {&x};
  DimParams p;
  p.dims = {dim};
  return ops::call(OpKind::kSoftmax, in, &p, run_softmax);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  const Tensor* in[] = {&x};
  DimParams p;
  p.dims = {dim};
  return ops::call(OpKind::kLogSoftmax, in, &p, run_log_softmax);
}

Tensor& Tensor::relu_() { return ops::call_inplace(OpKind::kRelu, *this, nullptr, nullptr, 0.0, false, run_activation); }

Tensor& Tensor::clamp_(double min, double max) {
  DBRQ_ENSURE(min <= max, ValueError, "clamp_: min (", min, ") must be <= max (", max, ")");
  const ActivationParams p{min, max, false};
  return ops::call_inplace(OpKind::kClamp, *this, nullptr, &p, 0.0, false, run_activation);
}

Tensor Tensor::relu() const { return ::dbrq::relu(*this); }
Tensor Tensor::sigmoid() const { return ::dbrq::sigmoid(*this); }
Tensor Tensor::tanh() const { return ::dbrq::tanh(*this); }
Tensor Tensor::clamp(double min, double max) const { return ::dbrq::clamp(*this, min, max); }
Tensor Tensor::softmax(int64_t dim) const { return ::dbrq::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return ::dbrq::log_softmax(*this, dim); }

namespace ops {
namespace {

// A unary activation's common entries.
OpDef& define_activation(OpRegistry& r, OpKind kind, const char* name, Eltwise (*eltwise)(const void*),
                         QuantRole role) {
  OpDef& d = r.define(kind, name);
  d.run = run_activation;
  d.infer_sizes = same_sizes;
  d.eltwise = eltwise;
  d.role = role;
  return d;
}

void fixed_qparams(OpDef& d, float scale, int32_t zero_point, const char* layer) {
  d.role = QuantRole::kFixedQParams;
  d.fixed_scale = scale;
  d.fixed_zero_point = zero_point;
  d.layer = layer;
}

}  // namespace

void register_activation_ops(OpRegistry& r) {
  constexpr uint8_t kAnywhere = kAfterConv | kAfterLinear | kAfterResidualAdd | kAfterAdd | kAfterNorm;
  using A = Eltwise::Alg;
  OpDef& relu = define_activation(
      r, OpKind::kRelu, "relu", [](const void*) { return Eltwise::relu(); }, QuantRole::kShare);
  relu.int8_share = int8_relu;
  relu.fuses_after = kAnywhere;

  OpDef& relu6 = define_activation(
      r, OpKind::kRelu6, "relu6", [](const void*) { return Eltwise::clip(0.f, 6.f); }, QuantRole::kShare);
  relu6.with_params<ActivationParams>();
  relu6.int8_share = int8_clamp;
  relu6.fuses_after = kAfterConv;

  auto clip = [](const void* p) {
    return Eltwise::clip(static_cast<float>(act(p).alpha), static_cast<float>(act(p).beta));
  };
  for (auto [kind, name] : {std::pair{OpKind::kHardtanh, "hardtanh"}, std::pair{OpKind::kClamp, "clamp"}}) {
    OpDef& d = define_activation(r, kind, name, clip, QuantRole::kShare);
    d.with_params<ActivationParams>();
    d.int8_share = int8_clamp;
  }

  define_activation(
      r, OpKind::kLeakyRelu, "leaky_relu",
      [](const void* p) { return Eltwise{A::kRelu, static_cast<float>(act(p).alpha), 0.f}; }, QuantRole::kLut)
      .with_params<ActivationParams>();

  OpDef& sigmoid = define_activation(
      r, OpKind::kSigmoid, "sigmoid", [](const void*) { return Eltwise{A::kLogistic}; }, QuantRole::kLut);
  fixed_qparams(sigmoid, 1.f / 256.f, 0, "Sigmoid");

  OpDef& tanh = define_activation(
      r, OpKind::kTanh, "tanh", [](const void*) { return Eltwise{A::kTanh}; }, QuantRole::kLut);
  fixed_qparams(tanh, 2.f / 256.f, 128, "Tanh");

  OpDef& hardsigmoid = define_activation(
      r, OpKind::kHardsigmoid, "hardsigmoid", [](const void*) { return Eltwise{A::kHardsigmoid}; },
      QuantRole::kLut);
  fixed_qparams(hardsigmoid, 1.f / 256.f, 0, "Hardsigmoid");

  OpDef& hardswish = define_activation(
      r, OpKind::kHardswish, "hardswish", [](const void*) { return Eltwise::hardswish(); }, QuantRole::kLut);
  hardswish.fuses_after = kAfterConv;

  define_activation(
      r, OpKind::kSilu, "silu", [](const void*) { return Eltwise{A::kSwish, 1.f, 0.f}; }, QuantRole::kLut);

  OpDef& gelu = define_activation(
      r, OpKind::kGelu, "gelu",
      [](const void* p) { return Eltwise{p != nullptr && act(p).approximate_tanh ? A::kGeluTanh : A::kGeluErf}; },
      QuantRole::kLut);
  gelu.with_params<ActivationParams>();
  gelu.fuses_after = kAfterLinear;

  // oneDNN's elu post-op fuses it after a conv or linear; alone it runs int8 through a table.
  OpDef& elu = define_activation(
      r, OpKind::kElu, "elu",
      [](const void* p) { return Eltwise{A::kElu, static_cast<float>(act(p).alpha), 0.f}; }, QuantRole::kLut);
  elu.with_params<ActivationParams>();
  elu.fuses_after = kAfterConv | kAfterLinear;

  // Issue 12: softplus (PyTorch's beta / threshold: an eager loop, never a post-op) and mish, both
  // int8 through a table; prelu is weighted (its weight quantized like a conv's) and runs int8
  // through per-channel tables. Nothing fuses after prelu, and batch norm does not fold into it.
  define_activation(
      r, OpKind::kSoftplus, "softplus",
      [](const void* p) {
        return Eltwise{A::kSoftplus, static_cast<float>(act(p).alpha), static_cast<float>(act(p).beta)};
      },
      QuantRole::kLut)
      .with_params<ActivationParams>();
  define_activation(
      r, OpKind::kMish, "mish", [](const void*) { return Eltwise{A::kMish}; }, QuantRole::kLut);
  OpDef& prelu = r.define(OpKind::kPrelu, "prelu");
  prelu.run = run_prelu;
  prelu.infer_sizes = same_sizes;
  prelu.num_activation_inputs = 1;
  prelu.role = QuantRole::kWeighted;
  prelu.int8_weighted = make_qprelu;

  OpDef& softmax = r.define(OpKind::kSoftmax, "softmax").with_params<DimParams>();
  softmax.run = run_softmax;
  softmax.infer_sizes = same_sizes;
  fixed_qparams(softmax, 1.f / 256.f, 0, "Softmax");
  softmax.fixed_qparams_layer_only = true;
  softmax.int8_requant = int8_softmax;

  OpDef& log_softmax = r.define(OpKind::kLogSoftmax, "log_softmax").with_params<DimParams>();
  log_softmax.run = run_log_softmax;
  log_softmax.infer_sizes = same_sizes;
}

}  // namespace ops
}  // namespace dbrq
