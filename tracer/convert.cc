#include "tracer/convert.h"

#include <map>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "kernels/eager.h"

namespace dbrq::tracer {
namespace {

QuantParamsPtr weight_qparams(const QConfig& q, const Tensor& w) {
  std::unique_ptr<Observer> obs = make_observer(q.weight);
  obs->observe(w);
  return obs->calculate_qparams();
}

// A chain member's recorded weights / statistics, as tensors.
std::vector<Tensor> tensors_of(const SeenOpInfo& op) {
  std::vector<Tensor> out;
  for (const WeightInfo& w : op.weights) out.push_back(w.tensor);
  return out;
}

class Converter {
 public:
  explicit Converter(ModelQuantState& m) : m_(m) {}

  ConvertedProgram run() {
    ConvertedProgram program(m_.execution_order().size());
    for (auto& [state, index] : m_.execution_order()) {
      SeenOpInfo& op = state->seen_ops()[index];
      program[op.program_index] = build(*state, op);
      // Built first all the same: the parameters it derives for its consumers stay the plan's.
      if (op.role != QuantRole::kNone && !(op.fusion.fused() && op.fusion.position > 0) && op.absorbs < 0 &&
          op.absorbed_by < 0 && chain_saw_infinities(op)) {
        program[op.program_index] = std::make_unique<Fp32Exec>(
            "saw +-inf, or a far negative group such as -1e9, while calibrating (an additive mask?), which int8 "
            "cannot hold");
      }
    }
    // What each op chose, for printing and introspection (every parameter is known by now).
    for (auto& [state, index] : m_.execution_order()) {
      SeenOpInfo& op = state->seen_ops()[index];
      ConvertedOp& e = *program[op.program_index];
      auto info = std::make_unique<ExecutorInfo>();
      info->description = e.describe();
      info->fp32 = e.is_fp32();
      if (!info->fp32) {
        for (size_t k = 0; k < op.inputs.size(); ++k) {
          info->input_qparams.push_back(op.inputs[k].num_origins() > 1 && op.input_observers[k] >= 0
                                            ? m_.slot(op.input_observers[k]).qparams
                                            : known_qparams(op.inputs[k]));
        }
        if (!op.outputs.empty()) info->output_qparams = known_qparams(op.outputs[0]);
      }
      if (auto* w = dynamic_cast<WeightedExec*>(&e)) info->weight_qparams = w->weight_qparams();
      op.executor = std::move(info);
    }
    summarize();
    return program;
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
    return slot_qparams(s, op, r->slot);
  }

  // A slot's parameters, from its observer on first use.
  QuantParamsPtr slot_qparams(const AutoQuantizationState& s, const SeenOpInfo& op, int slot_index) {
    ObserverSlot& slot = m_.slot(slot_index);
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

  // The parameters convert gave an int8 tensor; null for an f32 one.
  QuantParamsPtr known_qparams(const QTensorInfo& t) {
    if (t.inf_dtype != DType::kU8) return nullptr;
    const ModelQuantState::TensorRecord* r = m_.tensor(t.id);
    if (r != nullptr && r->slot >= 0) return m_.slot(r->slot).qparams;
    auto it = derived_.find(t.id);
    return it == derived_.end() ? nullptr : it->second;
  }

  // The tensor a fused chain produces (its last op's output).
  int64_t chain_output(const SeenOpInfo& base) {
    const std::vector<const SeenOpInfo*> f = m_.chain_after(base);
    return (f.empty() ? base : *f.back()).outputs[0].id;
  }

  // The parameters input k is brought to: its origin's, or (several origins: paths, loop
  // iterations) its own observer's.
  QuantParamsPtr input_qparams(const AutoQuantizationState& s, const SeenOpInfo& op, size_t k) {
    if (op.inputs[k].num_origins() > 1) {
      const int slot = op.input_observers[k];
      DBRQ_CHECK(slot >= 0, "input with several origins has no observer");
      return slot_qparams(s, op, slot);
    }
    return qparams_of(s, op, op.inputs[k].id);
  }

  InputSpec input_spec(const AutoQuantizationState& s, const SeenOpInfo& op, size_t k,
                       MemoryFormat fmt = MemoryFormat::kPreserve) {
    return InputSpec{input_qparams(s, op, k), fmt};
  }

  const AutoQuantizationState& state_of(const SeenOpInfo& op) { return m_.state_of(op.global_index); }

  // A residual add fused into the weighted op `base`'s kernel (in its module's chain, or absorbed
  // from another module): which of its inputs is the residual; -1 if `m` is not one.
  static int residual_of(const SeenOpInfo& m) {
    if (m.fusion.residual_input >= 0) return m.fusion.residual_input;
    if (m.absorbed_by >= 0 && op_def(m.kind).residual_add) return 1 - m.absorbed_input;
    return -1;
  }

  // The chain's activations, as post-ops in order.
  kernels::PostOps post_ops_of(const SeenOpInfo& base) {
    kernels::PostOps post;
    for (const SeenOpInfo* m : m_.chain_after(base)) {
      const OpDef& d = op_def(m->kind);
      if (d.eltwise != nullptr) post.push_back(d.eltwise(m->params.get()));
    }
    return post;
  }

  // +-inf in what calibration saw at an op's inputs or output: an additive attention mask of 0 /
  // -inf, and the scores it was added to. Observers skip infinities, so the mask's range was
  // [0, 0]; quantizing clamped -inf to a finite code and the mask vanished after convert (masked
  // keys got ordinary attention weights, no error). Such an op, and every op of its fused chain,
  // runs fp32; its consumers quantize its f32 output with the parameters they were converted
  // with. Only where at least one infinity per observed tensor was seen on average: a stray Inf in
  // calibration data (skipped, counted and warned about by its observer) does not count.
  bool saw_infinities(const SeenOpInfo& op) {
    auto bad = [&](int slot) { return slot >= 0 && m_.slot(slot).saw_infinities(); };
    auto bad_tensor = [&](int64_t id) {
      const ModelQuantState::TensorRecord* r = m_.tensor(id);
      return r != nullptr && bad(r->slot);
    };
    for (size_t k = 0; k < op.inputs.size(); ++k) {
      if (k < op.input_observers.size() && bad(op.input_observers[k])) return true;
      if (bad_tensor(op.inputs[k].id)) return true;
      for (const int64_t id : op.inputs[k].more_ids) {
        if (bad_tensor(id)) return true;
      }
    }
    return bad(op.output_observer) || (!op.outputs.empty() && bad_tensor(op.outputs[0].id));
  }
  bool chain_saw_infinities(const SeenOpInfo& base) {
    if (saw_infinities(base)) return true;
    if (!base.fusion.fused()) return false;
    for (const SeenOpInfo* m : m_.chain_after(base)) {
      if (saw_infinities(*m)) return true;
    }
    return false;
  }

  std::unique_ptr<ConvertedOp> build(AutoQuantizationState& s, SeenOpInfo& op) {
    if (op.role == QuantRole::kNone) {
      return std::make_unique<Fp32Exec>(op.unsupported.empty() ? "not quantized" : op.unsupported);
    }
    for (size_t i = 0; i < op.weights.size(); ++i) {
      // A weight computed at run time (not a parameter or buffer) of a record loaded from a
      // quant-state file: the file cannot hold it, and the model has not run the op since.
      DBRQ_ENSURE(!op.weights[i].missing, NotCalibratedError, "convert: ", op_name(op.kind), " (", op.fqn,
                  ") in module \"", s.fqn(), "\", op ", op.index, " takes a weight computed at run time (input ",
                  op.inputs.size() + i + 1,
                  ", not a parameter or buffer), which a quant-state file cannot hold, and the model has not run "
                  "it since loading. Run the prepared model once on an input that takes this path before convert");
    }
    const OpDef& def = op_def(op.kind);
    if (op.absorbed_by >= 0) {
      const SeenOpInfo& p = m_.record(op.absorbed_by);
      const AutoQuantizationState& ps = state_of(p);
      const SeenOpInfo& base = p.fusion.fused() ? ps.seen_ops()[static_cast<size_t>(p.fusion.base)] : p;
      std::string chain = base.fusion.fused() ? base.fusion.name() : op_name(base.kind);
      absl::StrAppend(&chain, "+", op.fusion.fused() ? op.fusion.name() : op_name(op.kind));
      std::string name = absl::StrCat(chain, " (", op_name(base.kind), " in module \"", ps.fqn(), "\")");
      if (const int r = residual_of(op); r >= 0) return std::make_unique<ResidualAddExec>(r, std::move(name));
      return std::make_unique<FollowerExec>(std::move(name));
    }
    if (op.fusion.fused() && op.fusion.position > 0) {
      SeenOpInfo& base = s.seen_ops()[op.fusion.base];
      // The kernel of whichever record of the weighted op fed it (a layer's records on several
      // paths may share the add) completes with the sum post-op.
      if (op.fusion.residual_input >= 0) return std::make_unique<ResidualAddExec>(op.fusion.residual_input, base.fusion.name());
      // A batch norm folded into the base's weights checks that each call hands the tensors it
      // was folded from.
      return std::make_unique<FollowerExec>(base.fusion.name(),
                                            def.fold != nullptr ? tensors_of(op) : std::vector<Tensor>{});
    }
    switch (op.role) {
      case QuantRole::kWeighted:
        return build_weighted(s, op, def);
      case QuantRole::kMatmul: {
        if (op.qconfig->is_dynamic()) return std::make_unique<MatmulExec>(InputSpec{}, InputSpec{}, nullptr, true);
        return std::make_unique<MatmulExec>(input_spec(s, op, 0), input_spec(s, op, 1),
                                            qparams_of(s, op, op.outputs[0].id), false);
      }
      case QuantRole::kBinary: {
        if (op.has_scalar) {
          ScalarAffine affine;
          DBRQ_CHECK(def.scalar_affine(op.scalar, op.scalar_first, &affine), "scalar op without int8 form");
          auto e = std::make_unique<ScalarExec>(op.kind, affine, qparams_of(s, op, op.inputs[0].id));
          derived_[op.outputs[0].id] = e->output();
          return e;
        }
        const kernels::PostOps post = post_ops_of(op);
        DBRQ_CHECK(post.empty() || (post.size() == 1 && post[0] == kernels::Eltwise::relu()),
                   "an int8 binary op fuses only relu");
        return std::make_unique<BinaryExec>(def, input_spec(s, op, 0), input_spec(s, op, 1),
                                            qparams_of(s, op, chain_output(op)), !post.empty());
      }
      case QuantRole::kCat:
        return std::make_unique<CatExec>(qparams_of(s, op, op.outputs[0].id));
      case QuantRole::kShare: {
        InputSpec in = input_spec(s, op, 0);
        const ModelQuantState::TensorRecord* r = m_.tensor(op.outputs[0].id);
        if (r->slot < 0) derived_[op.outputs[0].id] = in.want;
        return std::make_unique<ShareExec>(def, op.params, std::move(in));
      }
      case QuantRole::kLut:
      case QuantRole::kFixedQParams: {
        InputSpec in = input_spec(s, op, 0);
        QuantParamsPtr out = qparams_of(s, op, op.outputs[0].id);
        if (def.int8_requant != nullptr) return std::make_unique<RequantExec>(def, op.params, std::move(in), out);
        DBRQ_CHECK(def.eltwise != nullptr, op_name(op.kind), " has neither a code table nor an int8 kernel");
        const kernels::Eltwise e = def.eltwise(op.params.get());
        kernels::Lut lut = kernels::make_lut(*in.want, *out, [e](float x) { return kernels::eltwise_reference(e, x); });
        return std::make_unique<LutExec>(op.kind, std::move(in), out, lut);
      }
      case QuantRole::kChannelAffine: {
        const kernels::PostOps post = post_ops_of(op);
        DBRQ_CHECK(post.empty() || (post.size() == 1 && post[0] == kernels::Eltwise::relu()),
                   "an int8 channel affine op fuses only relu");
        DBRQ_CHECK(def.int8_affine != nullptr, op_name(op.kind), " has no int8 channel affine kernel");
        return std::make_unique<ChannelAffineExec>(def, op.params, input_spec(s, op, 0),
                                                   qparams_of(s, op, chain_output(op)), !post.empty(),
                                                   tensors_of(op));
      }
      case QuantRole::kNormalize: {
        DBRQ_CHECK(def.int8_norm != nullptr, op_name(op.kind), " has no int8 normalization kernel");
        return std::make_unique<NormExec>(def, input_spec(s, op, 0), qparams_of(s, op, op.outputs[0].id));
      }
      case QuantRole::kNone:
        break;
    }
    return std::make_unique<Fp32Exec>("no int8 executor");
  }

  // A weighted op with its chain: batch norm folded into the weights, activations as post-ops, a
  // residual add through the sum post-op.
  std::unique_ptr<ConvertedOp> build_weighted(AutoQuantizationState& s, SeenOpInfo& op, const OpDef& def) {
    const Tensor weight = op.weights.at(0).tensor;
    const Tensor bias = op.weights.size() > 1 ? op.weights[1].tensor : Tensor();
    const bool dynamic = op.qconfig->is_dynamic();
    kernels::QWeightedOptions base;
    base.dynamic = dynamic;
    struct Fold {
      FoldFn fn;
      std::vector<Tensor> stats;
      OpParams params;
    };
    std::vector<Fold> folds;
    bool deferred = false;
    InputSpec residual;  // of a residual add in the chain: the parameters its sum takes
    if (!dynamic) {
      base.src_qparams = input_qparams(s, op, 0);
      // An f32 output (PrepareOptions::float_outputs_for_float_readers): no destination parameters.
      if (op.outputs[0].inf_dtype != DType::kF32) base.dst_qparams = qparams_of(s, op, chain_output(op));
      base.post = post_ops_of(op);
    }
    for (const SeenOpInfo* m : m_.chain_after(op)) {
      const OpDef& md = op_def(m->kind);
      if (md.fold != nullptr) folds.push_back(Fold{md.fold, tensors_of(*m), m->params});
      if (const int r = residual_of(*m); r >= 0) {
        residual = input_spec(state_of(*m), *m, static_cast<size_t>(r));
        base.sum_qparams = residual.want;
        deferred = true;
      }
    }
    QConfigPtr qconfig = op.qconfig;
    OpParams params = op.params;
    WeightedFactory make = def.int8_weighted;
    auto layout = def.int8_weight_layout;
    // Builds the kernel from a call's weight and bias (at convert: the recorded ones; again when a
    // call hands others, see WeightedExec::kernel). Folded statistics are read when it runs.
    std::vector<Tensor> folded;
    for (const Fold& f : folds) folded.insert(folded.end(), f.stats.begin(), f.stats.end());
    auto factory = [base, folds, qconfig, params, make, layout](const Tensor& weight,
                                                               const Tensor& bias) -> std::shared_ptr<kernels::QWeighted> {
      kernels::QWeightedOptions o = base;
      o.weight = layout != nullptr ? layout(weight, params.get()) : weight;
      o.bias = bias;
      for (const Fold& f : folds) f.fn(o.weight, o.bias, f.stats, f.params.get(), &o.weight, &o.bias);
      o.weight_qparams = weight_qparams(*qconfig, o.weight);
      return make(std::move(o), params.get());
    };
    auto exec = std::make_unique<WeightedExec>(
        def, factory, op.params, dynamic ? InputSpec{} : InputSpec{base.src_qparams, def.int8_input_format}, weight,
        bias, std::move(folded), deferred);
    if (op.kind == OpKind::kLinear && !folds.empty()) exec->set_folded_into_linear();
    if (deferred) exec->set_residual_spec(std::move(residual));
    return exec;
  }

  void summarize() {
    int int8 = 0, fused = 0, fp32 = 0;
    std::map<std::string, int> reasons;
    for (AutoQuantizationState* s : m_.states()) {
      for (const SeenOpInfo& op : s->seen_ops()) {
        if (op.executor == nullptr) continue;
        if (op.executor->fp32) {
          ++fp32;
          reasons[op.unsupported.empty() ? std::string(op_name(op.kind)) + ": int8 not applicable here" : op.unsupported]++;
        } else if ((op.fusion.fused() && op.fusion.position > 0) || op.absorbed_by >= 0) {
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

ConvertedProgram convert_model(ModelQuantState& model) {
  Converter c(model);
  try {
    return c.run();
  } catch (...) {
    // Leave the model as it was: calibrating, with no half-recorded executors.
    for (AutoQuantizationState* s : model.states()) {
      for (SeenOpInfo& op : s->seen_ops()) op.executor.reset();
    }
    for (size_t i = 0; i < model.num_slots(); ++i) {
      ObserverSlot& slot = model.slot(static_cast<int>(i));
      if (!slot.frozen) slot.qparams.reset();  // a loaded file's parameters stay
    }
    throw;
  }
}

}  // namespace dbrq::tracer
