// analyze_program: from the recorded program (every record and the data flow between records seen
// on any path) to fusions, inference dtypes and observer placement. Runs after the first (traced)
// call and again after a calibrating call that found a new path; it recomputes everything from the
// records, and observer slots are found again by their owner, so observers keep what they saw.
#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "core/logging.h"
#include "quant_state/auto_quant_state.h"

namespace dbrq {
namespace {

using Record = ModelQuantState::TensorRecord;

class Analyzer {
 public:
  explicit Analyzer(ModelQuantState& m) : m_(m) {}

  void run() {
    std::vector<ObserverSlot> old = m_.take_slots();
    reset();
    for (AutoQuantizationState* s : m_.states()) discover_fusions(*s);
    discover_cross_module();
    infer_dtypes();
    if (m_.float_outputs()) demote_unread_outputs();
    for (size_t g = 0; g < m_.records().size(); ++g) place(static_cast<int>(g));
    for (size_t g = 0; g < m_.records().size(); ++g) unite_arrivals(static_cast<int>(g));
    carry_over(old);
  }

 private:
  SeenOpInfo& rec_op(int g) { return m_.record(g); }
  AutoQuantizationState& state_of(int g) { return m_.state_of(g); }
  Record& rec(int64_t id) { return m_.tensors()[id]; }

  static std::vector<int64_t> origins(const QTensorInfo& t) {
    std::vector<int64_t> ids = {t.id};
    ids.insert(ids.end(), t.more_ids.begin(), t.more_ids.end());
    return ids;
  }

  void reset() {
    for (auto& [id, r] : m_.tensors()) {
      r.inf_dtype = DType::kF32;
      r.slot = -1;
    }
    for (auto& [s, i] : m_.records()) {
      SeenOpInfo& op = s->seen_ops()[static_cast<size_t>(i)];
      op.role = QuantRole::kNone;
      op.fusion = FusionInfo{};
      op.absorbs = -1;
      op.absorbed_by = -1;
      op.absorbed_input = -1;
      op.input_observers.assign(op.inputs.size(), -1);
      op.output_observer = -1;
      for (QTensorInfo& t : op.inputs) t.inf_dtype = DType::kF32;
      for (QTensorInfo& t : op.outputs) t.inf_dtype = DType::kF32;
    }
  }

  bool quantizable(const SeenOpInfo& op) const {
    return op.qconfig != nullptr && !op.qconfig->is_dynamic() &&
           m_.backend().unsupported_reason(op.kind, *op.qconfig).empty();
  }

  // The one record that reads `op`'s output, when nothing else does (no op that is not recorded,
  // no module boundary, one read).
  const Consumer* sole_consumer(const SeenOpInfo& op) const {
    if (op.outputs.size() != 1 || op.consumers.size() != 1 || op.read_by_fp32 || op.escapes || op.read_twice) {
      return nullptr;
    }
    return &op.consumers[0];
  }

  // Chains the backend fuses, in each module: a chain A -> B -> ... of records where each one is
  // the only reader of the one before. A follower reached from several records (a loop: the same
  // layer's first-iteration and later records feed one record) joins when every record feeding it
  // is such a predecessor.
  void discover_fusions(AutoQuantizationState& s) {
    auto& ops = s.seen_ops();
    for (size_t i = 0; i < ops.size(); ++i) {
      // An op with a scalar operand (x + 0.5) runs on its own kernel (ScalarExec), which has no
      // post-ops: as a chain's base, its relu would be dropped.
      if (ops[i].fusion.fused() || !quantizable(ops[i]) || ops[i].has_scalar) continue;
      for (const auto& pattern : m_.backend().fusion_patterns()) {
        if (pattern[0] != ops[i].kind) continue;
        std::vector<int> chain = {static_cast<int>(i)};
        std::vector<int> residual = {-1};
        bool ok = true;
        for (size_t p = 1; p < pattern.size() && ok; ++p) {
          const SeenOpInfo& cur = ops[static_cast<size_t>(chain.back())];
          const Consumer* c = sole_consumer(cur);
          ok = c != nullptr && &state_of(c->record) == &s;
          if (!ok) break;
          SeenOpInfo& n = rec_op(c->record);
          ok = n.kind == pattern[p] && n.qconfig != nullptr && !n.has_scalar &&
               (!n.fusion.fused() || (n.fusion.pattern == pattern && n.fusion.position == static_cast<int>(p)));
          if (!ok) break;
          // A batch norm folds into the weights only when its statistics and affine parameters are
          // the model's own tensors: computed ones (`batch_norm(y, mean, var * s, ...)`) may change
          // from call to call, which folded weights cannot follow. It runs on its own (int8 on the
          // call's statistics), as calibration computes it.
          if (op_def(n.kind).fold != nullptr) {
            for (const WeightInfo& w : n.weights) ok = ok && (w.fqn != "" || (!w.tensor.defined() && !w.missing));
            if (!ok) break;
          }
          const int pos = c->input;
          // The chain tensor must be the first input of a batch_norm / activation; for an add it
          // may be either, the other one being the residual.
          const bool residual_add = op_def(n.kind).residual_add;
          ok = pos >= 0 && (residual_add || pos == 0);
          // A member another chain reached already (a loop's iterations) is shared only when
          // reached at the same input: with both operands of an add made by conv chains
          // (bn1(conv1(x)) + bn2(conv2(x))), the second chain's output is the first one's
          // residual, and completing the add from it would read an output never computed.
          ok = ok && (!n.fusion.fused() || !residual_add || n.fusion.residual_input == 1 - pos);
          // A fused residual has the chain output's sizes: an add that broadcasts its other
          // operand (conv(x) + a per-channel shift) runs on its own.
          ok = ok && !(residual_add && n.broadcasts);
          if (!ok) break;
          // Every record feeding that input must be a predecessor like `cur`.
          for (int64_t id : origins(n.inputs[static_cast<size_t>(pos)])) {
            const Record* r = m_.tensor(id);
            if (r == nullptr || r->record < 0) {
              ok = false;
              break;
            }
            const SeenOpInfo& pred = rec_op(r->record);
            const Consumer* pc = sole_consumer(pred);
            ok = &state_of(r->record) == &s && pred.kind == pattern[p - 1] && pc != nullptr &&
                 pc->record == c->record && pc->input == pos;
            if (!ok) break;
          }
          if (!ok) break;
          chain.push_back(n.index);
          residual.push_back(residual_add ? 1 - pos : -1);
        }
        if (!ok) continue;
        for (size_t p = 0; p < chain.size(); ++p) {
          SeenOpInfo& op = ops[static_cast<size_t>(chain[p])];
          if (p > 0 && op.fusion.fused()) continue;  // a follower another chain already reached
          op.fusion.pattern = pattern;
          op.fusion.members = chain;
          op.fusion.base = chain[0];
          op.fusion.position = static_cast<int>(p);
          op.fusion.residual_input = residual[p];
        }
        break;
      }
    }
  }

  // The base of the chain whose last op (or only op) is record `g`.
  const SeenOpInfo& chain_base(int g) {
    const SeenOpInfo& p = rec_op(g);
    if (!p.fusion.fused()) return p;
    return state_of(g).seen_ops()[static_cast<size_t>(p.fusion.base)];
  }

  // Fusion across a module boundary. A chain (or a lone op) that ends in one module and whose
  // output is returned to another module, where an activation or a residual add reads it, fuses
  // that op as if both were in one module (DenseNet: norm5 in the `features` Sequential, F.relu in
  // the root's forward; MobileNetV2: `x + conv(x)`, the Sequential `conv` ending in conv + batch
  // norm; `relu(x + body(x))`: the add with its relu). Sound only when, over every path seen:
  //  - the absorbed op is the producer's only reader: one consumer record, no op that is not
  //    recorded (read_by_fp32: an fp32 op, an untraced module), not read twice, not a model
  //    output (model_output: the user reads it);
  //  - the absorbed op reads nothing else at that input (one origin), so it always follows;
  //  - the backend fuses the chain extended by the absorbed op and, for an add, by the relu its
  //    own module fused after it (a pattern of BackendConfig).
  // Activations: only relu, as the ONNX exporter writes the activation as its own node after the
  // chain's quantize, which is exact for relu (a quantize with zero point 0 already clamps at 0)
  // but would clip the input of an activation with negative outputs (hardswish, gelu,
  // leaky_relu). An add is written as the residual add of the chain (a pending weighted result).
  // After convert, a path never calibrated that reads the producer's output elsewhere is caught
  // by the inner-tensor checks of the interceptor (ControlFlowError, never a wrong value), and an
  // absorbed op handed another tensor computes itself, in fp32 (the interceptor checks the origin).
  void discover_cross_module() {
    const auto& patterns = m_.backend().fusion_patterns();
    for (auto& [cs, ci] : m_.records()) {
      SeenOpInfo& c = cs->seen_ops()[static_cast<size_t>(ci)];
      const bool add = op_def(c.kind).residual_add;
      if (c.qconfig == nullptr || c.has_scalar || c.inputs.empty() || !(add || c.kind == OpKind::kRelu)) continue;
      // An activation on its own; an add may start its module's chain (add + relu).
      if (c.fusion.fused() && (!add || c.fusion.position != 0)) continue;
      if (add && (c.inputs.size() != 2 || !quantizable(c) || c.broadcasts)) continue;
      for (size_t pos = 0; pos < (add ? 2u : 1u); ++pos) {
        if (c.inputs[pos].num_origins() != 1) continue;
        const Record* r = m_.tensor(c.inputs[pos].id);
        if (r == nullptr || r->record < 0) continue;
        const int pg = r->record;
        SeenOpInfo& p = rec_op(pg);
        if (&state_of(pg) == cs || p.absorbs >= 0 || !quantizable(p) || p.has_scalar) continue;
        if (p.outputs.size() != 1 || p.consumers.size() != 1 || p.read_by_fp32 || p.read_twice || p.model_output) {
          continue;
        }
        if (!(p.consumers[0] == Consumer{c.global_index, static_cast<int>(pos)})) continue;
        // The producer ends its module's chain (the last member), or is not in one.
        if (p.fusion.fused() && p.index != p.fusion.members.back()) continue;
        std::vector<OpKind> chain = p.fusion.fused() ? p.fusion.pattern : std::vector<OpKind>{p.kind};
        if (p.fusion.fused() && p.fusion.residual_input >= 0) continue;  // a chain with its add already
        const SeenOpInfo& base = chain_base(pg);
        if (!quantizable(base) || base.has_scalar) continue;
        if (c.fusion.fused()) {
          chain.insert(chain.end(), c.fusion.pattern.begin(), c.fusion.pattern.end());
        } else {
          chain.push_back(c.kind);
        }
        if (std::find(patterns.begin(), patterns.end(), chain) == patterns.end()) continue;
        p.absorbs = c.global_index;
        c.absorbed_by = pg;
        c.absorbed_input = static_cast<int>(pos);
        break;
      }
    }
  }

  bool any_input_u8(const SeenOpInfo& op, size_t k) {
    if (k >= op.inputs.size()) return false;
    for (int64_t id : origins(op.inputs[k])) {
      if (rec(id).inf_dtype == DType::kU8) return true;
    }
    return false;
  }

  void warn_unsupported(AutoQuantizationState& s, SeenOpInfo& op, const std::string& reason) {
    if (op.unsupported == reason) return;  // said once per record, not at every analysis
    op.unsupported = reason;
    log()->warn("quantization of {} at {} (module \"{}\", op {}) ignored: {}", op_name(op.kind), op.fqn, s.fqn(),
                op.index, reason);
  }

  // The role a record runs with and whether its output is u8, given its inputs' dtypes.
  QuantRole role_of(SeenOpInfo& op, bool* out_u8) {
    *out_u8 = false;
    AutoQuantizationState& s = state_of(op.global_index);
    if (op.absorbed_by >= 0) {
      // Runs inside the kernel of its producer's chain, in another module: like a follower.
      const SeenOpInfo& base = chain_base(op.absorbed_by);
      if (base.role == QuantRole::kNone) return QuantRole::kNone;
      *out_u8 = !(base.qconfig && base.qconfig->is_dynamic());
      return m_.backend().role(base.kind);
    }
    if (op.fusion.fused() && op.fusion.position > 0) {
      const SeenOpInfo& base = s.seen_ops()[static_cast<size_t>(op.fusion.base)];
      // A base that stays fp32 (an int8 batch norm or add whose input is fp32) keeps its chain fp32.
      if (base.role == QuantRole::kNone) return QuantRole::kNone;
      const QuantRole r = m_.backend().role(base.kind);
      *out_u8 = !(base.qconfig && base.qconfig->is_dynamic());
      return r;
    }
    const QuantRole role = m_.backend().role(op.kind);
    if (role == QuantRole::kNone) return QuantRole::kNone;
    const std::string reason = m_.backend().unsupported_reason(op.kind, *op.qconfig);
    if (!reason.empty()) {
      warn_unsupported(s, op, reason);
      return QuantRole::kNone;
    }
    const bool dynamic = op.qconfig->is_dynamic();
    switch (role) {
      case QuantRole::kWeighted:
      case QuantRole::kMatmul:
        *out_u8 = !dynamic && float_out_.count(op.global_index) == 0;
        return role;
      case QuantRole::kBinary:
        if (op.has_scalar) {
          // x + c, x * c, x - c, x / c keep int8 with parameters derived from x's (one origin:
          // derived once); c - x and c / x do not.
          const OpDef& d = op_def(op.kind);
          ScalarAffine affine;
          if (!any_input_u8(op, 0) || op.inputs[0].num_origins() != 1 || d.scalar_affine == nullptr ||
              !d.scalar_affine(op.scalar, op.scalar_first, &affine)) {
            return QuantRole::kNone;
          }
          *out_u8 = true;
          return role;
        }
        if (op_def(op.kind).int8_binary == nullptr) return QuantRole::kNone;  // sub, div of two tensors
        *out_u8 = true;
        return role;
      case QuantRole::kCat:
        *out_u8 = true;
        return role;
      case QuantRole::kShare:
      case QuantRole::kLut:
      case QuantRole::kFixedQParams:
      case QuantRole::kChannelAffine:
      case QuantRole::kNormalize:
        if (!any_input_u8(op, 0)) return QuantRole::kNone;
        *out_u8 = true;
        return role;
      case QuantRole::kNone:
        break;
    }
    return QuantRole::kNone;
  }

  // Roles and output dtypes to a fixed point: an op that passes int8 through (a reshape, a clamp)
  // is int8 when its input is, and on a path added later that input may come from a record created
  // after it (a loop's back edge).
  void infer_dtypes() {
    for (bool changed = true; changed;) {
      changed = false;
      for (auto& [s, i] : m_.records()) {
        SeenOpInfo& op = s->seen_ops()[static_cast<size_t>(i)];
        bool u8 = false;
        const QuantRole role = role_of(op, &u8);
        const DType dt = u8 ? DType::kU8 : DType::kF32;
        if (role != op.role || (!op.outputs.empty() && op.outputs[0].inf_dtype != dt)) changed = true;
        op.role = role;
        for (QTensorInfo& o : op.outputs) {
          o.inf_dtype = dt;
          rec(o.id).inf_dtype = dt;
        }
      }
    }
  }

  // Whether a u8 output of `op` would be read as u8 by some int8 op: directly, or through ops that
  // pass int8 through (dropout, reshape, x * c) whose own output is so read. A module's returned
  // tensor counts as read (its readers are outside the module). Cycles (a loop's back edge through
  // pass-through ops only) count as not read.
  bool u8_output_read(const SeenOpInfo& op, std::set<int>& visiting) {
    if (op.escapes || op.outputs.size() != 1 || op.fusion.fused()) return true;
    if (!visiting.insert(op.global_index).second) return false;
    for (const Consumer& c : op.consumers) {
      const SeenOpInfo& r = rec_op(c.record);
      if (r.fusion.fused() || r.absorbed_by >= 0) return true;
      switch (r.role) {
        case QuantRole::kNone:
          break;
        case QuantRole::kShare:
          if (u8_output_read(r, visiting)) return true;
          break;
        case QuantRole::kBinary:
          if (!r.has_scalar || u8_output_read(r, visiting)) return true;
          break;
        default:
          return true;
      }
    }
    return false;
  }

  // PrepareOptions::float_outputs_for_float_readers: int8 linears (unfused, static) whose output
  // no int8 op reads write f32; the pass-through ops after them then run fp32 too.
  void demote_unread_outputs() {
    float_out_.clear();
    for (auto& [s, i] : m_.records()) {
      const SeenOpInfo& op = s->seen_ops()[static_cast<size_t>(i)];
      if (op.kind != OpKind::kLinear || op.role != QuantRole::kWeighted || op.qconfig->is_dynamic()) continue;
      std::set<int> visiting;
      if (!u8_output_read(op, visiting)) float_out_.insert(op.global_index);
    }
    if (!float_out_.empty()) infer_dtypes();
  }

  // The op consumes input k as u8. One origin: an int8 one is taken as it is; an fp32 one is
  // quantized with one observer for the tensor, fed by every quantizing consumer (each consumer may
  // run on a path the others do not; the observer takes a tensor once per call, see
  // ObserverSlot::last). Several origins (paths, loop iterations): the input has its own observer,
  // and every arrival is brought to its parameters.
  void require_u8(int g, size_t k) {
    SeenOpInfo& op = rec_op(g);
    QTensorInfo& in = op.inputs[k];
    in.inf_dtype = DType::kU8;
    const std::string& owner = state_of(g).fqn();
    if (in.num_origins() > 1) {
      op.input_observers[k] = m_.ensure_slot(g, static_cast<int>(k), input_spec(op), in.id, owner);
      return;
    }
    Record& r = rec(in.id);
    if (r.inf_dtype == DType::kU8) return;
    if (r.slot < 0) r.slot = m_.ensure_slot(g, static_cast<int>(k), input_spec(op), in.id, owner);
    op.input_observers[k] = r.slot;
  }

  // The spec of an observer an op places at its input: its qconfig's activation, except where that
  // is the op's own fixed output range (sigmoid, tanh, softmax under the default mapping). Such an
  // input is observed as a producer's output would be: with the mapping's global activation spec
  // (min-max if the mapping has none). Observing it with the fixed spec quantized the input into
  // the output's range ([0, 1) for sigmoid) and clipped it.
  ObserverSpec input_spec(const SeenOpInfo& op) const {
    if (op.qconfig->activation.kind != ObserverKind::kFixedQParams) return op.qconfig->activation;
    const QConfigPtr global = m_.mapping().global();
    if (global != nullptr && global->activation.kind != ObserverKind::kFixedQParams) return global->activation;
    return ObserverSpec::min_max();
  }

  void set_output(SeenOpInfo& op, DType dt, int slot) {
    for (QTensorInfo& o : op.outputs) {
      o.inf_dtype = dt;
      Record& r = rec(o.id);
      r.inf_dtype = dt;
      r.slot = slot;
    }
  }

  // Placement, in creation order (a producer's placement comes before its consumers' on the
  // paths that created them).
  void place(int g) {
    SeenOpInfo& op = rec_op(g);
    AutoQuantizationState& s = state_of(g);
    if (op.role == QuantRole::kNone) return set_output(op, DType::kF32, -1);
    const std::string& owner = s.fqn();
    if (op.absorbed_by >= 0) {
      // Fused across a module boundary: the chain's output, observed here (or at the end of this
      // op's own chain: an add's relu). An add's other input is the residual, brought to u8.
      const SeenOpInfo& base = chain_base(op.absorbed_by);
      const size_t k = static_cast<size_t>(op.absorbed_input);
      op.inputs[k].inf_dtype = rec(op.inputs[k].id).inf_dtype;
      if (op_def(op.kind).residual_add) require_u8(g, 1 - k);
      if (base.qconfig && base.qconfig->is_dynamic()) return set_output(op, DType::kF32, -1);
      const int slot = rec(base.outputs[0].id).slot;
      set_output(op, DType::kU8, slot);
      if (!op.fusion.fused()) op.output_observer = slot;
      return;
    }
    if (op.fusion.fused() && op.fusion.position > 0) {
      // A follower runs inside its base's fused kernel: its output is the chain's output.
      const SeenOpInfo& base = s.seen_ops()[static_cast<size_t>(op.fusion.base)];
      if (op.fusion.residual_input >= 0) require_u8(g, static_cast<size_t>(op.fusion.residual_input));
      if (base.qconfig && base.qconfig->is_dynamic()) return set_output(op, DType::kF32, -1);
      const int slot = rec(base.outputs[0].id).slot;
      set_output(op, DType::kU8, slot);
      if (op.index == op.fusion.members.back() && op.absorbs < 0) op.output_observer = slot;
      return;
    }
    switch (op.role) {
      case QuantRole::kWeighted:
      case QuantRole::kMatmul:
        if (op.qconfig->is_dynamic()) return set_output(op, DType::kF32, -1);  // parameters per call
        require_u8(g, 0);
        if (op.role == QuantRole::kMatmul) require_u8(g, 1);
        if (float_out_.count(g) != 0) return set_output(op, DType::kF32, -1);  // f32 from oneDNN
        return new_output(g);
      case QuantRole::kBinary:
        if (op.has_scalar) {
          op.inputs[0].inf_dtype = DType::kU8;
          return set_output(op, DType::kU8, -1);  // parameters derived at convert
        }
        require_u8(g, 0);
        require_u8(g, 1);
        return new_output(g);
      case QuantRole::kCat: {
        // The int8 inputs observed like the cat's own output share one range (no requantization).
        // Another kind of range is not united: a fixed one (sigmoid's [0, 1) in 1/256 steps) would
        // clip every other input to [0, 1), and an observer of another kind cannot take the
        // other's statistics. Such an input is observed into the shared range and brought to it.
        // (All of them int8 with one kind of range, two sigmoids say: united as they are, exact.)
        const ObserverSpec* common = nullptr;
        bool alike = true;
        for (const QTensorInfo& in : op.inputs) {
          for (int64_t id : origins(in)) {
            const Record& r = rec(id);
            if (r.inf_dtype != DType::kU8 || r.slot < 0) {
              alike = false;
            } else if (common == nullptr) {
              common = &m_.observer(r.slot).spec();
            } else {
              alike = alike && m_.observer(r.slot).spec() == *common;
            }
          }
        }
        const ObserverSpec spec = alike && common != nullptr ? *common : op.qconfig->activation;
        auto unitable = [&](const Record& r) {
          return r.inf_dtype == DType::kU8 && r.slot >= 0 && m_.observer(r.slot).spec() == spec;
        };
        int shared = -1;
        for (const QTensorInfo& in : op.inputs) {
          for (int64_t id : origins(in)) {
            Record& r = rec(id);
            if (unitable(r)) shared = shared < 0 ? m_.find(r.slot) : m_.unite(shared, r.slot);
          }
        }
        if (shared < 0) shared = m_.ensure_slot(g, -1, op.qconfig->activation, op.outputs[0].id, owner);
        for (size_t k = 0; k < op.inputs.size(); ++k) {
          bool all_shared = true;
          for (int64_t id : origins(op.inputs[k])) {
            const Record& r = rec(id);
            all_shared = all_shared && unitable(r) && m_.find(r.slot) == m_.find(shared);
          }
          if (!all_shared) op.input_observers[k] = shared;
          op.inputs[k].inf_dtype = DType::kU8;
        }
        return set_output(op, DType::kU8, shared);
      }
      case QuantRole::kShare: {
        op.inputs[0].inf_dtype = DType::kU8;
        if (op.inputs[0].num_origins() == 1) return set_output(op, DType::kU8, rec(op.inputs[0].id).slot);
        // Several origins: its own parameters, observed at its input.
        const int slot = m_.ensure_slot(g, 0, input_spec(op), op.inputs[0].id, owner);
        op.input_observers[0] = slot;
        return set_output(op, DType::kU8, slot);
      }
      case QuantRole::kLut:
      case QuantRole::kChannelAffine:
      case QuantRole::kNormalize:
        require_u8(g, 0);
        return new_output(g);
      case QuantRole::kFixedQParams: {
        require_u8(g, 0);
        const BackendOpConfig* cfg = m_.backend().op(op.kind);
        // The fixed range is a default, not a requirement: the int8 kernels (code tables, qsoftmax)
        // take any output parameters, so a calibrating observer in the op's qconfig observes the
        // output instead (attention probabilities in 1/256 steps cost the BERT encoder 2 dB,
        // docs/encoder_accuracy.md).
        const ObserverKind kind = op.qconfig->activation.kind;
        if (kind != ObserverKind::kFixedQParams && kind != ObserverKind::kPlaceholder) return new_output(g);
        const ObserverSpec spec = kind == ObserverKind::kFixedQParams ? op.qconfig->activation : *cfg->fixed_output;
        const int slot = m_.ensure_slot(g, -1, spec, op.outputs[0].id, owner);
        return set_output(op, DType::kU8, slot);
      }
      case QuantRole::kNone:
        break;
    }
    set_output(op, DType::kF32, -1);
  }

  // An input with several origins has its own observer, and every arrival is brought to its
  // parameters. When one arrival is the record's own output (a loop's back edge onto itself,
  // `z = z + y` repeated), that output is united with the input instead: one range for the
  // loop-carried tensor and no requantization per iteration. Arrivals from other records keep
  // their own ranges (uniting them would cost every one of them resolution). Done once every
  // output has its slot (a back edge comes from a record placed later).
  void unite_arrivals(int g) {
    SeenOpInfo& op = rec_op(g);
    if (op.fusion.fused()) return;
    for (size_t k = 0; k < op.inputs.size() && k < op.input_observers.size(); ++k) {
      if (op.input_observers[k] < 0 || op.inputs[k].num_origins() < 2) continue;
      for (int64_t id : origins(op.inputs[k])) {
        const Record& r = rec(id);
        if (r.record != g || r.inf_dtype != DType::kU8 || r.slot < 0) continue;
        if (m_.observer(op.input_observers[k]).spec() == m_.observer(r.slot).spec()) {
          m_.unite(op.input_observers[k], r.slot);
        }
      }
    }
  }

  // A fresh output observer, observed where the op's (or its fused chain's) result is produced.
  void new_output(int g) {
    SeenOpInfo& op = rec_op(g);
    AutoQuantizationState& s = state_of(g);
    // Named after the tensor users see, and owned by the op producing it: the end of the fused
    // chain, if any (chains of a loop's iterations ending in one record share it).
    const SeenOpInfo& base = op.fusion.fused() ? s.seen_ops()[static_cast<size_t>(op.fusion.base)] : op;
    const std::vector<const SeenOpInfo*> after = m_.chain_after(base);  // may end in another module
    const SeenOpInfo* last = after.empty() ? &base : after.back();
    const int slot = m_.ensure_slot(last->global_index, -1, op.qconfig->activation, last->outputs[0].id,
                                    state_of(last->global_index).fqn());
    set_output(op, DType::kU8, slot);
    if (!op.fusion.fused() && op.absorbs < 0) op.output_observer = slot;  // else the chain's last op observes
  }

  // What the previous analysis's observers saw goes to the new slots with the same keys (record,
  // input). A new shared observer whose members had several observers before (a path added a
  // cat or a loop that unites them) gets them merged; an old observer whose members are now
  // apart goes to each. Parameters frozen by a parameters-only quant-state file stay frozen.
  void carry_over(std::vector<ObserverSlot>& old) {
    if (old.empty()) return;
    auto old_root = [&](int i) {
      while (old[static_cast<size_t>(i)].parent >= 0) i = old[static_cast<size_t>(i)].parent;
      return i;
    };
    std::map<std::pair<int, int>, int> old_by_key;
    for (size_t i = 0; i < old.size(); ++i) old_by_key[{old[i].record, old[i].input}] = old_root(static_cast<int>(i));
    // New root -> the old roots of its members, in slot order.
    std::map<int, std::vector<int>> sources;
    for (size_t i = 0; i < m_.num_slots(); ++i) {
      const ObserverSlot& n = m_.slot_entry(static_cast<int>(i));
      auto it = old_by_key.find({n.record, n.input});
      if (it == old_by_key.end()) continue;
      std::vector<int>& v = sources[m_.find(static_cast<int>(i))];
      if (std::find(v.begin(), v.end(), it->second) == v.end()) v.push_back(it->second);
    }
    std::map<int, int> moved_to;
    for (auto& [root, from] : sources) {
      ObserverSlot& n = m_.slot(root);
      bool first = true;
      for (int o : from) {
        ObserverSlot& os = old[static_cast<size_t>(o)];
        const Observer* src = os.observer != nullptr ? os.observer.get() : nullptr;
        if (src == nullptr && moved_to.count(o) != 0) src = m_.slot(moved_to[o]).observer.get();
        if (src == nullptr || !(src->spec() == n.observer->spec())) continue;
        n.infinite = n.infinite || os.infinite;
        if (first) {
          if (os.observer != nullptr) {
            n.observer = std::move(os.observer);
            moved_to[o] = root;
          } else if (src->has_data()) {
            n.observer->load_stats(src->stats());
          }
          n.qparams = os.qparams;
          n.frozen = os.frozen;
          n.last = os.last;
          first = false;
        } else if (src->has_data()) {
          n.observer->merge(*src);
          n.qparams = nullptr;  // several frozen parameter sets cannot be one
          n.frozen = false;
        }
      }
    }
    // An input slot new to this analysis (the record's input has a second origin: a branch or a
    // loop iteration found by this call) starts from what its origins' observers saw: until now
    // every arrival was one of them, taken with their parameters. Without this it saw only the
    // calls after the new path was found, and the earlier path's values were clipped to the new
    // one's range after convert (1.4 dB; PathsAfterConvert.ABranchFoundLateKeepsTheRangesOfTheOneBefore).
    // Only from an observer whose every value arrived here (SoleOrigins). Otherwise the observer
    // saw values that never arrive here (a folded loop's output also feeds the loop's next
    // iteration), which would widen the range, and a replica that found the path later than
    // another would no longer merge into what one process calibrates
    // (ControlFlowState.MergedReplicasMatchOneProcess). Such an input still starts empty when its
    // second origin is found late (docs/control_flow.md).
    const SoleOrigins sole(m_);
    for (size_t i = 0; i < m_.num_slots(); ++i) {
      const ObserverSlot& n = m_.slot_entry(static_cast<int>(i));
      if (n.input < 0 || n.record < 0 || old_by_key.count({n.record, n.input}) != 0) continue;
      const int root = m_.find(static_cast<int>(i));
      std::set<int> taken = {root};
      for (const int64_t id : sole.of(n.record, static_cast<size_t>(n.input))) {
        const int from = m_.find(m_.tensor(id)->slot);
        if (!taken.insert(from).second) continue;
        const Observer* src = m_.slot(from).observer.get();
        ObserverSlot& dst = m_.slot(root);
        if (src == nullptr || !src->has_data() || !(src->spec() == dst.observer->spec())) continue;
        if (dst.observer->has_data()) {
          dst.observer->merge(*src);
        } else {
          dst.observer->load_stats(src->stats());
        }
      }
    }
    // An output slot new to this analysis, of a record that ran inside a fused chain until now
    // (the chain broke on a new path): it starts from what that inner output was observed to be
    // on every earlier call. Without this it saw only the calls after the break: conv + relu
    // calibrated on large inputs, then broken by a path of small ones, clipped the conv's output
    // to the small range (2 dB SQNR; tests/quant/fusion_break_test.cc).
    // The same for a chain that absorbed an activation of another module (discover_cross_module):
    // its output slot may exist already, but while absorbed nothing fed it. The inner observer is
    // fed only while the record has no output observer of its own, so merging never counts a
    // call twice.
    for (size_t i = 0; i < m_.num_slots(); ++i) {
      const ObserverSlot& n = m_.slot_entry(static_cast<int>(i));
      if (n.input != -1 || n.record < 0) continue;
      const int own = m_.record(n.record).output_observer;
      if (own < 0 || m_.find(own) != m_.find(static_cast<int>(i))) continue;  // still inside a chain
      std::unique_ptr<Observer> inner = m_.take_inner_output_observer(n.record);
      ObserverSlot& root = m_.slot(static_cast<int>(i));
      if (inner == nullptr || !inner->has_data() || !(inner->spec() == root.observer->spec())) continue;
      if (root.observer->has_data()) {
        root.observer->merge(*inner);
      } else {
        root.observer = std::move(inner);
      }
    }
  }

  ModelQuantState& m_;
  std::set<int> float_out_;  // records (global index) of int8 linears writing f32
};

}  // namespace

SoleOrigins::SoleOrigins(ModelQuantState& model) : model_(model) {
  for (const auto& [st, i] : model.records()) {
    const SeenOpInfo& o = st->seen_ops()[static_cast<size_t>(i)];
    ++producers_[o.outputs[0].id];
    for (const QTensorInfo& in : o.inputs) {
      ++readers_[in.id];
      for (const int64_t id : in.more_ids) ++readers_[id];
    }
  }
  for (size_t j = 0; j < model.num_slots(); ++j) ++members_[model.find(static_cast<int>(j))];
}

std::vector<int64_t> SoleOrigins::of(int g, size_t k) const {
  const SeenOpInfo& op = model_.record(g);
  if (k >= op.inputs.size()) return {};
  auto count = [](const std::map<int64_t, int>& m, int64_t id) {
    auto it = m.find(id);
    return it == m.end() ? 0 : it->second;
  };
  std::vector<int64_t> ids = {op.inputs[k].id};
  ids.insert(ids.end(), op.inputs[k].more_ids.begin(), op.inputs[k].more_ids.end());
  std::vector<int64_t> sole;
  for (const int64_t id : ids) {
    const ModelQuantState::TensorRecord* r = model_.tensor(id);
    if (r == nullptr || r->slot < 0 || r->record < 0 || count(producers_, id) != 1 || count(readers_, id) != 1) continue;
    const SeenOpInfo& p = model_.record(r->record);
    if (p.escapes || p.read_by_fp32 || p.model_output) continue;
    if (members_.at(model_.find(r->slot)) == 1) sole.push_back(id);
  }
  return sole;
}

void analyze_program(ModelQuantState& model) {
  Analyzer(model).run();
  model.set_dirty(false);
}

}  // namespace dbrq
