// analyze_trace: turns the events of the traced first run into fusions, inference dtypes and
// observer placement. Everything here runs once, at prepare time.
#include <algorithm>
#include <map>
#include <set>

#include "quant_state/auto_quant_state.h"
#include "core/logging.h"

namespace dbrq {
namespace {

using Record = ModelQuantState::TensorRecord;

struct OpRef {
  AutoQuantizationState* state;
  int index;
  SeenOpInfo& op() const { return state->seen_ops()[index]; }
};

class Analyzer {
 public:
  explicit Analyzer(ModelQuantState& m) : m_(m) {}

  void run() {
    index_events();
    for (AutoQuantizationState* s : m_.states()) discover_fusions(*s);
    for (const TraceEvent& e : m_.events()) infer(e);
  }

 private:
  void index_events() {
    for (size_t i = 0; i < m_.events().size(); ++i) {
      const TraceEvent& e = m_.events()[i];
      for (int64_t id : e.inputs) consumers_[id].push_back(static_cast<int>(i));
      if (e.kind == TraceEvent::Kind::kSeenOp && !e.repeat) {
        for (int64_t id : e.outputs) producer_[id] = OpRef{e.state, e.op_index};
      }
    }
  }

  // The single op (in the same module state) that reads `id`, when it is the only reader.
  const TraceEvent* sole_consumer(int64_t id, const AutoQuantizationState* state) const {
    auto it = consumers_.find(id);
    if (it == consumers_.end() || it->second.size() != 1) return nullptr;
    const TraceEvent& e = m_.events()[it->second[0]];
    if (e.kind != TraceEvent::Kind::kSeenOp || e.state != state) return nullptr;
    // An op reading the same tensor twice (x + x) is two reads.
    if (std::count(e.inputs.begin(), e.inputs.end(), id) != 1) return nullptr;
    return &e;
  }

  bool quantizable(const SeenOpInfo& op) const {
    return op.qconfig != nullptr && !op.qconfig->is_dynamic() &&
           m_.backend().unsupported_reason(op.kind, *op.qconfig).empty();
  }

  void discover_fusions(AutoQuantizationState& s) {
    auto& ops = s.seen_ops();
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].fusion.fused() || !quantizable(ops[i])) continue;
      for (const auto& pattern : m_.backend().fusion_patterns()) {
        if (pattern[0] != ops[i].kind) continue;
        std::vector<int> chain = {static_cast<int>(i)};
        std::vector<int> residual = {-1};
        bool ok = true;
        for (size_t p = 1; p < pattern.size() && ok; ++p) {
          const SeenOpInfo& cur = ops[chain.back()];
          const TraceEvent* next = cur.outputs.size() == 1 ? sole_consumer(cur.outputs[0].id, &s) : nullptr;
          ok = next != nullptr && next->op_index > chain.back();
          if (!ok) break;
          SeenOpInfo& n = ops[next->op_index];
          ok = n.kind == pattern[p] && !n.fusion.fused() && n.qconfig != nullptr && !n.has_scalar;
          if (!ok) break;
          // The chain tensor must be the first input of a batch_norm / activation; for an add it
          // may be either, the other one being the residual.
          int pos = -1;
          for (size_t k = 0; k < n.inputs.size(); ++k) {
            if (n.inputs[k].id == cur.outputs[0].id) pos = static_cast<int>(k);
          }
          const bool residual_add = op_def(n.kind).residual_add;
          ok = pos >= 0 && (residual_add || pos == 0);
          if (!ok) break;
          chain.push_back(next->op_index);
          residual.push_back(residual_add ? 1 - pos : -1);
        }
        if (!ok) continue;
        // batch_norm after linear must be 1-d (BatchNorm1d on [N, C]).
        for (size_t p = 0; p < chain.size(); ++p) {
          SeenOpInfo& op = ops[chain[p]];
          op.fusion.pattern = pattern;
          op.fusion.base = chain[0];
          op.fusion.position = static_cast<int>(p);
          op.fusion.residual_input = residual[p];
        }
        break;
      }
    }
  }

  Record& rec(int64_t id) { return m_.tensors()[id]; }

  // The op consumes input k as u8: an fp32 arrival is quantized there, observed at its first
  // quantizing consumer.
  void require_u8(AutoQuantizationState& s, SeenOpInfo& op, size_t k) {
    QTensorInfo& in = op.inputs[k];
    Record& r = rec(in.id);
    in.inf_dtype = DType::kU8;
    if (r.inf_dtype == DType::kU8) return;
    if (r.slot < 0) {
      r.slot = m_.new_slot(op.qconfig->activation, in.id, s.fqn());
      op.input_observers[k] = r.slot;
    }
  }

  void set_output(SeenOpInfo& op, DType dt, int slot) {
    for (QTensorInfo& o : op.outputs) {
      o.inf_dtype = dt;
      Record& r = rec(o.id);
      r.inf_dtype = dt;
      r.slot = slot;
    }
  }

  void fp32(SeenOpInfo& op) {
    op.role = QuantRole::kNone;
    set_output(op, DType::kF32, -1);
  }

  bool input_is_u8(const SeenOpInfo& op, size_t k) {
    return k < op.inputs.size() && rec(op.inputs[k].id).inf_dtype == DType::kU8;
  }

  void warn_unsupported(AutoQuantizationState& s, SeenOpInfo& op, const std::string& reason) {
    op.unsupported = reason;
    log()->warn("quantization of {} at {} (module \"{}\", op {}) ignored: {}", op_name(op.kind), op.fqn, s.fqn(),
                op.index, reason);
  }

  void infer(const TraceEvent& e) {
    if (e.kind == TraceEvent::Kind::kOtherOp) {
      for (int64_t id : e.outputs) rec(id).inf_dtype = DType::kF32;
      return;
    }
    if (e.kind != TraceEvent::Kind::kSeenOp) return;
    AutoQuantizationState& s = *e.state;
    SeenOpInfo& op = s.seen_ops()[e.op_index];
    if (e.repeat) {
      // Same record, new tensors: they are what the recorded op's tensors are.
      for (size_t j = 0; j < e.outputs.size() && j < op.outputs.size(); ++j) rec(e.outputs[j]) = rec(op.outputs[j].id);
      return;
    }
    op.program_index = static_cast<int>(m_.execution_order().size());
    m_.execution_order().emplace_back(&s, e.op_index);
    op.input_observers.assign(op.inputs.size(), -1);
    for (QTensorInfo& in : op.inputs) in.inf_dtype = rec(in.id).inf_dtype;

    if (op.fusion.fused() && op.fusion.position > 0) {
      // A follower runs inside its base's fused kernel: its output is the chain's output.
      SeenOpInfo& base = s.seen_ops()[op.fusion.base];
      if (op.fusion.residual_input >= 0) require_u8(s, op, op.fusion.residual_input);
      op.role = base.role;
      const int last = op.fusion.base + static_cast<int>(op.fusion.pattern.size()) - 1;
      const int slot = rec(base.outputs[0].id).slot;
      set_output(op, DType::kU8, slot);
      if (e.op_index == last) op.output_observer = slot;
      return;
    }

    QuantRole role = m_.backend().role(op.kind);
    if (role == QuantRole::kNone) return fp32(op);
    const std::string reason = m_.backend().unsupported_reason(op.kind, *op.qconfig);
    if (!reason.empty()) {
      warn_unsupported(s, op, reason);
      return fp32(op);
    }
    const bool dynamic = op.qconfig->is_dynamic();
    op.role = role;
    switch (role) {
      case QuantRole::kWeighted:
      case QuantRole::kMatmul:
        if (dynamic) {
          // Activation parameters come from each call's data; the output stays fp32.
          return set_output(op, DType::kF32, -1);
        }
        require_u8(s, op, 0);
        if (role == QuantRole::kMatmul) require_u8(s, op, 1);
        return new_output(s, op);
      case QuantRole::kBinary:
        if (op.has_scalar) {
          // x + c, x * c, x - c, x / c keep int8 with parameters derived from x's; c - x and c / x
          // do not.
          const OpDef& d = op_def(op.kind);
          ScalarAffine affine;
          if (!input_is_u8(op, 0) || d.scalar_affine == nullptr || !d.scalar_affine(op.scalar, op.scalar_first, &affine)) {
            return fp32(op);
          }
          op.inputs[0].inf_dtype = DType::kU8;
          return set_output(op, DType::kU8, -1);  // parameters derived at convert
        }
        if (op_def(op.kind).int8_binary == nullptr) return fp32(op);  // sub, div of two tensors
        require_u8(s, op, 0);
        require_u8(s, op, 1);
        return new_output(s, op);
      case QuantRole::kCat: {
        int shared = -1;
        for (size_t k = 0; k < op.inputs.size(); ++k) {
          Record& r = rec(op.inputs[k].id);
          if (r.inf_dtype == DType::kU8 && r.slot >= 0) shared = shared < 0 ? m_.find(r.slot) : m_.unite(shared, r.slot);
        }
        if (shared < 0) shared = m_.new_slot(op.qconfig->activation, op.outputs[0].id, s.fqn());
        for (size_t k = 0; k < op.inputs.size(); ++k) {
          Record& r = rec(op.inputs[k].id);
          if (!(r.inf_dtype == DType::kU8 && r.slot >= 0)) op.input_observers[k] = shared;
          op.inputs[k].inf_dtype = DType::kU8;
        }
        return set_output(op, DType::kU8, shared);
      }
      case QuantRole::kShare:
        if (!input_is_u8(op, 0)) return fp32(op);
        op.inputs[0].inf_dtype = DType::kU8;
        return set_output(op, DType::kU8, rec(op.inputs[0].id).slot);
      case QuantRole::kLut:
        if (!input_is_u8(op, 0)) return fp32(op);
        op.inputs[0].inf_dtype = DType::kU8;
        return new_output(s, op);
      case QuantRole::kFixedQParams: {
        if (!input_is_u8(op, 0)) return fp32(op);
        op.inputs[0].inf_dtype = DType::kU8;
        const BackendOpConfig* cfg = m_.backend().op(op.kind);
        const ObserverSpec spec =
            op.qconfig->activation.kind == ObserverKind::kFixedQParams ? op.qconfig->activation : *cfg->fixed_output;
        const int slot = m_.new_slot(spec, op.outputs[0].id, s.fqn());
        return set_output(op, DType::kU8, slot);
      }
      case QuantRole::kNone:
        break;
    }
    fp32(op);
  }

  // A fresh output observer, observed where the op's (or its fused chain's) result is produced.
  void new_output(AutoQuantizationState& s, SeenOpInfo& op) {
    // Named after the tensor users see: the end of the fused chain, if any.
    int64_t id = op.outputs[0].id;
    if (op.fusion.fused()) id = s.seen_ops()[op.fusion.base + op.fusion.pattern.size() - 1].outputs[0].id;
    const int slot = m_.new_slot(op.qconfig->activation, id, s.fqn());
    set_output(op, DType::kU8, slot);
    if (!op.fusion.fused()) op.output_observer = slot;  // else the chain's last op observes
  }

  ModelQuantState& m_;
  std::map<int64_t, std::vector<int>> consumers_;
  std::map<int64_t, OpRef> producer_;
};

}  // namespace

void analyze_trace(ModelQuantState& model) { Analyzer(model).run(); }

}  // namespace dbrq
