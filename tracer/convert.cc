#include "tracer/convert.h"

#include <cmath>
#include <map>
#include <unordered_map>

#include "kernels/eager.h"
#include "core/logging.h"
#include "tracer/executors.h"

namespace dbrq::tracer {
namespace {

// The tensors of a batch_norm seen op: running mean, running var, weight, bias.
struct BnTensors {
  Tensor mean, var, weight, bias;
  double eps;
};

BnTensors bn_of(const SeenOpInfo& bn) {
  BnTensors t;
  t.mean = bn.weights.at(0).tensor;
  t.var = bn.weights.at(1).tensor;
  t.weight = bn.weights.size() > 2 ? bn.weights[2].tensor : Tensor();
  t.bias = bn.weights.size() > 3 ? bn.weights[3].tensor : Tensor();
  t.eps = std::get<NormParams>(bn.params).eps;
  return t;
}

// Folds an inference batch norm into the preceding conv / linear weights, with PyTorch's
// fuse_conv_bn_weights float arithmetic: w * (gamma * rsqrt(var + eps)) per output channel and
// ((b - mean) * rsqrt(var + eps)) * gamma + beta.
void fold_bn(const Tensor& w, const Tensor& b, const BnTensors& bn, Tensor* w_out, Tensor* b_out) {
  const int64_t k = w.size(0);
  DBRQ_ENSURE(bn.mean.numel() == k, ShapeError, "batch_norm folding: ", bn.mean.numel(), " channels for a weight of ",
              k, " output channels");
  const Tensor wc = kernels::contiguous(w);
  Tensor nw = Tensor::empty(w.sizes(), DType::kF32);
  Tensor nb = Tensor::empty({k}, DType::kF32);
  const int64_t per = k == 0 ? 0 : w.numel() / k;
  const float* src = wc.data<float>();
  float* dst = nw.mutable_data<float>();
  const std::vector<float> mean = bn.mean.to_vector<float>(), var = bn.var.to_vector<float>();
  const std::vector<float> gamma = bn.weight.defined() ? bn.weight.to_vector<float>() : std::vector<float>(k, 1.f);
  const std::vector<float> beta = bn.bias.defined() ? bn.bias.to_vector<float>() : std::vector<float>(k, 0.f);
  const std::vector<float> bias = b.defined() ? b.to_vector<float>() : std::vector<float>(k, 0.f);
  float* bd = nb.mutable_data<float>();
  for (int64_t c = 0; c < k; ++c) {
    const float rsqrt = 1.f / std::sqrt(var[c] + static_cast<float>(bn.eps));
    const float mult = gamma[c] * rsqrt;
    for (int64_t i = 0; i < per; ++i) dst[c * per + i] = src[c * per + i] * mult;
    bd[c] = (bias[c] - mean[c]) * rsqrt * gamma[c] + beta[c];
  }
  *w_out = nw;
  *b_out = nb;
}

QuantParamsPtr weight_qparams(const QConfig& q, const Tensor& w) {
  std::unique_ptr<Observer> obs = make_observer(q.weight);
  obs->observe(w);
  return obs->calculate_qparams();
}

kernels::PostOps post_ops_for(const SeenOpInfo& base) {
  kernels::PostOps post;
  for (OpKind k : base.fusion.pattern) {
    if (k == OpKind::kRelu) post.push_back(kernels::PostOp::relu());
    if (k == OpKind::kRelu6) post.push_back(kernels::PostOp::clip(0.f, 6.f));
    if (k == OpKind::kHardswish) post.push_back(kernels::PostOp::hardswish());
    if (k == OpKind::kGelu) post.push_back({kernels::PostOp::Kind::kGeluErf, 0.f, 0.f});  // tanh form: see build_linear
  }
  return post;
}

class Converter {
 public:
  explicit Converter(ModelQuantState& m) : m_(m) {}

  void run() {
    for (auto& [state, index] : m_.execution_order()) {
      SeenOpInfo& op = state->seen_ops()[index];
      op.executor = build(*state, op);
    }
    summarize();
  }

 private:
  // Parameters of the int8 tensor `id`, computing its observer's on first use.
  QuantParamsPtr qparams_of(const AutoQuantizationState& s, const SeenOpInfo& op, int64_t id) {
    const ModelQuantState::TensorRecord* r = m_.tensor(id);
    DBRQ_CHECK(r != nullptr, "tensor t", id, " unknown to the model state");
    if (r->slot < 0) {
      auto it = derived_.find(id);
      DBRQ_CHECK(it != derived_.end(), "no parameters for tensor t", id);
      return it->second;
    }
    ObserverSlot& slot = m_.slot(r->slot);
    if (slot.qparams == nullptr) {
      const Observer& obs = *slot.observer;
      DBRQ_ENSURE(obs.has_data(), NotCalibratedError, "convert: no calibration data for tensor t", slot.tensor_id,
                  " used by ", op_name(op.kind), " (", op.fqn, ") in module \"", s.fqn(), "\", op ", op.index, ": its ",
                  observer_kind_name(obs.spec().kind), " observer saw ",
                  obs.nan_count() + obs.inf_count() == 0
                      ? std::string("nothing")
                      : absl::StrCat("no finite values (it skipped ", obs.nan_count(), " NaN and ", obs.inf_count(),
                                     " Inf)"),
                  ". Run the prepared model on calibration data (with observers enabled) before convert");
      slot.qparams = slot.observer->calculate_qparams();
    }
    return slot.qparams;
  }

  // The tensor a fused chain produces (its last op's output).
  int64_t chain_output(const AutoQuantizationState& s, const SeenOpInfo& base) {
    if (!base.fusion.fused()) return base.outputs[0].id;
    return s.seen_ops()[base.fusion.base + base.fusion.pattern.size() - 1].outputs[0].id;
  }

  InputSpec input_spec(const AutoQuantizationState& s, const SeenOpInfo& op, size_t k,
                       MemoryFormat fmt = MemoryFormat::kPreserve) {
    return InputSpec{qparams_of(s, op, op.inputs[k].id), fmt};
  }

  const SeenOpInfo* chain_member(const AutoQuantizationState& s, const SeenOpInfo& base, OpKind kind) {
    for (size_t p = 1; base.fusion.fused() && p < base.fusion.pattern.size(); ++p) {
      const SeenOpInfo& m = s.seen_ops()[base.fusion.base + p];
      if (m.kind == kind) return &m;
    }
    return nullptr;
  }

  std::unique_ptr<ConvertedOp> build(AutoQuantizationState& s, SeenOpInfo& op) {
    if (op.role == QuantRole::kNone) {
      return std::make_unique<Fp32Exec>(op.unsupported.empty() ? "not quantized" : op.unsupported);
    }
    if (op.fusion.fused() && op.fusion.position > 0) {
      SeenOpInfo& base = s.seen_ops()[op.fusion.base];
      if (op.fusion.residual_input >= 0) {
        auto* conv = dynamic_cast<ConvExec*>(base.executor.get());
        DBRQ_CHECK(conv != nullptr, "residual add fused into a non-conv op");
        conv->set_residual_spec(input_spec(s, op, op.fusion.residual_input));
        return std::make_unique<ResidualAddExec>(conv, op.fusion.residual_input, base.fusion.name());
      }
      return std::make_unique<FollowerExec>(base.fusion.name());
    }
    switch (op.role) {
      case QuantRole::kWeighted:
        return op.kind == OpKind::kConv2d ? build_conv(s, op) : build_linear(s, op);
      case QuantRole::kMatmul: {
        const bool dynamic = op.qconfig->is_dynamic();
        if (dynamic) return std::make_unique<MatmulExec>(InputSpec{}, InputSpec{}, nullptr, true);
        return std::make_unique<MatmulExec>(input_spec(s, op, 0), input_spec(s, op, 1),
                                            qparams_of(s, op, op.outputs[0].id), false);
      }
      case QuantRole::kBinary: {
        if (op.has_scalar) {
          auto e = std::make_unique<ScalarExec>(op.kind, op.scalar, qparams_of(s, op, op.inputs[0].id));
          derived_[op.outputs[0].id] = e->output();
          return e;
        }
        const bool relu = chain_member(s, op, OpKind::kRelu) != nullptr;
        return std::make_unique<BinaryExec>(op.kind, input_spec(s, op, 0), input_spec(s, op, 1),
                                            qparams_of(s, op, chain_output(s, op)), relu);
      }
      case QuantRole::kCat:
        return std::make_unique<CatExec>(qparams_of(s, op, op.outputs[0].id));
      case QuantRole::kShare: {
        InputSpec in = input_spec(s, op, 0);
        const ModelQuantState::TensorRecord* r = m_.tensor(op.outputs[0].id);
        if (r->slot < 0) derived_[op.outputs[0].id] = in.want;
        return std::make_unique<ShareExec>(op.kind, op.params, std::move(in));
      }
      case QuantRole::kLut:
      case QuantRole::kFixedQParams: {
        InputSpec in = input_spec(s, op, 0);
        QuantParamsPtr out = qparams_of(s, op, op.outputs[0].id);
        if (op.kind == OpKind::kSoftmax) {
          return std::make_unique<SoftmaxExec>(std::get<DimParams>(op.params).dims.at(0), std::move(in), out);
        }
        kernels::Lut lut = kernels::make_lut(*in.want, *out, elementwise_fn(op.kind, op.params));
        return std::make_unique<LutExec>(op.kind, std::move(in), out, lut);
      }
      case QuantRole::kNone:
        break;
    }
    return std::make_unique<Fp32Exec>("no int8 executor");
  }

  std::unique_ptr<ConvertedOp> build_conv(AutoQuantizationState& s, SeenOpInfo& op) {
    const Tensor weight = op.weights.at(0).tensor;
    const Tensor bias = op.weights.size() > 1 ? op.weights[1].tensor : Tensor();
    const SeenOpInfo* bn = chain_member(s, op, OpKind::kBatchNorm);
    const SeenOpInfo* add = chain_member(s, op, OpKind::kAdd);
    kernels::QConvOptions base;
    base.params = std::get<Conv2dParams>(op.params);
    base.src_qparams = qparams_of(s, op, op.inputs[0].id);
    base.dst_qparams = qparams_of(s, op, chain_output(s, op));
    base.post = post_ops_for(op);
    if (add != nullptr) base.sum_qparams = qparams_of(s, *add, add->inputs[add->fusion.residual_input].id);
    std::optional<BnTensors> bnt;
    if (bn != nullptr) bnt = bn_of(*bn);
    QConfigPtr qconfig = op.qconfig;
    // Builds the kernel from the layer's current weights (again if they change after convert).
    auto factory = [base, bnt, qconfig, weight, bias]() {
      kernels::QConvOptions o = base;
      o.weight = weight;
      o.bias = bias;
      if (bnt) fold_bn(weight, bias, *bnt, &o.weight, &o.bias);
      o.weight_qparams = weight_qparams(*qconfig, o.weight);
      return std::make_unique<kernels::QConv2d>(std::move(o));
    };
    return std::make_unique<ConvExec>(factory, base.params, InputSpec{base.src_qparams, MemoryFormat::kChannelsLast},
                                      weight, add != nullptr);
  }

  std::unique_ptr<ConvertedOp> build_linear(AutoQuantizationState& s, SeenOpInfo& op) {
    const Tensor weight = op.weights.at(0).tensor;
    const Tensor bias = op.weights.size() > 1 ? op.weights[1].tensor : Tensor();
    const bool dynamic = op.qconfig->is_dynamic();
    const SeenOpInfo* bn = chain_member(s, op, OpKind::kBatchNorm);
    kernels::QLinearOptions base;
    base.dynamic = dynamic;
    if (!dynamic) {
      base.src_qparams = qparams_of(s, op, op.inputs[0].id);
      base.dst_qparams = qparams_of(s, op, chain_output(s, op));
      base.post = post_ops_for(op);
      const SeenOpInfo* gelu = chain_member(s, op, OpKind::kGelu);
      if (gelu != nullptr && std::holds_alternative<ActivationParams>(gelu->params) &&
          std::get<ActivationParams>(gelu->params).approximate_tanh) {
        for (auto& p : base.post) {
          if (p.kind == kernels::PostOp::Kind::kGeluErf) p.kind = kernels::PostOp::Kind::kGeluTanh;
        }
      }
    }
    std::optional<BnTensors> bnt;
    if (bn != nullptr) bnt = bn_of(*bn);
    QConfigPtr qconfig = op.qconfig;
    auto factory = [base, bnt, qconfig, weight, bias]() {
      kernels::QLinearOptions o = base;
      o.weight = weight;
      o.bias = bias;
      if (bnt) fold_bn(weight, bias, *bnt, &o.weight, &o.bias);
      o.weight_qparams = weight_qparams(*qconfig, o.weight);
      return std::make_unique<kernels::QLinear>(std::move(o));
    };
    return std::make_unique<LinearExec>(factory, dynamic ? InputSpec{} : InputSpec{base.src_qparams}, weight, dynamic);
  }

  void summarize() {
    int int8 = 0, fused = 0, fp32 = 0;
    std::map<std::string, int> reasons;
    for (AutoQuantizationState* s : m_.states()) {
      for (const SeenOpInfo& op : s->seen_ops()) {
        if (op.executor == nullptr) continue;
        if (dynamic_cast<const Fp32Exec*>(op.executor.get()) != nullptr) {
          ++fp32;
          reasons[op.unsupported.empty() ? std::string(op_name(op.kind)) + ": int8 not applicable here" : op.unsupported]++;
        } else if (op.fusion.fused() && op.fusion.position > 0) {
          ++fused;
        } else {
          ++int8;
        }
      }
      for (const NonQuantOpInfo& o : s->non_quant_ops()) reasons[std::string(op_name(o.kind)) + ": " + o.reason]++;
    }
    std::string why;
    for (auto& [r, n] : reasons) absl::StrAppend(&why, why.empty() ? "" : "; ", r, " (x", n, ")");
    log()->info("convert: {} ops run int8 on oneDNN, {} more fused into them, {} seen ops stay fp32; fp32 because: {}",
                int8, fused, fp32, why.empty() ? "nothing" : why);
  }

  ModelQuantState& m_;
  std::unordered_map<int64_t, QuantParamsPtr> derived_;  // int8 tensors without a slot of their own
};

}  // namespace

void convert_model(ModelQuantState& model) {
  Converter c(model);
  try {
    c.run();
  } catch (...) {
    // Leave the model as it was: calibrating, with no half-built executors.
    for (AutoQuantizationState* s : model.states()) {
      for (SeenOpInfo& op : s->seen_ops()) op.executor.reset();
    }
    for (size_t i = 0; i < model.num_slots(); ++i) model.slot(static_cast<int>(i)).qparams.reset();
    throw;
  }
}

}  // namespace dbrq::tracer
