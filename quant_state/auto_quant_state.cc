#include "quant_state/auto_quant_state.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "absl/strings/str_join.h"

namespace dbrq {

std::string FusionInfo::name() const {
  std::vector<std::string> parts;
  for (OpKind k : pattern) parts.push_back(op_name(k));
  return absl::StrJoin(parts, "+");
}

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kTracing:
      return "tracing";
    case Phase::kCalibrating:
      return "calibrating";
    case Phase::kConverted:
      return "converted";
  }
  return "?";
}

bool is_seen_kind(const BackendConfig& backend, OpKind kind) {
  if (backend.role(kind) != QuantRole::kNone) return true;
  for (const auto& p : backend.fusion_patterns()) {
    if (std::find(p.begin(), p.end(), kind) != p.end()) return true;
  }
  return false;
}

ModelQuantState::ModelQuantState(QConfigMapping mapping, BackendConfig backend)
    : mapping_(std::move(mapping)), backend_(std::move(backend)) {
  for (size_t k = 0; k < seen_kind_.size(); ++k) seen_kind_[k] = is_seen_kind(backend_, static_cast<OpKind>(k));
}

int64_t ModelQuantState::new_tensor_id() {
  static std::atomic<int64_t> next{1};
  return next.fetch_add(1);
}

const ModelQuantState::TensorRecord* ModelQuantState::tensor(int64_t id) const {
  auto it = tensors_.find(id);
  return it == tensors_.end() ? nullptr : &it->second;
}

int ModelQuantState::new_slot(const ObserverSpec& spec, int64_t tensor_id, const std::string& owner) {
  ObserverSlot s;
  s.observer = make_observer(spec);
  s.tensor_id = tensor_id;
  s.owner = owner;
  slots_.push_back(std::move(s));
  return static_cast<int>(slots_.size()) - 1;
}

int ModelQuantState::find(int slot) const {
  while (slots_[slot].parent >= 0) slot = slots_[slot].parent;
  return slot;
}

int ModelQuantState::unite(int a, int b) {
  a = find(a);
  b = find(b);
  if (a == b) return a;
  // Keep the earlier slot: it belongs to the tensor produced first.
  if (b < a) std::swap(a, b);
  slots_[b].parent = a;
  slots_[b].observer.reset();
  return a;
}

AutoQuantizationState::AutoQuantizationState(std::string fqn, std::string type_name,
                                             std::shared_ptr<ModelQuantState> model)
    : fqn_(std::move(fqn)), type_name_(std::move(type_name)), model_(std::move(model)) {
  for (size_t k = 0; k < functional_qconfig_.size(); ++k) {
    const auto kind = static_cast<OpKind>(k);
    functional_qconfig_[k] = model_->mapping().for_op(kind, type_name_, fqn_);
    functional_seen_[k] = functional_qconfig_[k] != nullptr && model_->seen_kind(kind);
  }
}

QConfigPtr AutoQuantizationState::seen_qconfig(OpKind kind, const LeafQuantInfo* leaf) const {
  if (leaf != nullptr) return model_->seen_kind(kind) ? leaf->qconfig() : nullptr;
  const size_t k = static_cast<size_t>(kind);
  return functional_seen_[k] ? functional_qconfig_[k] : nullptr;
}

namespace {

std::string op_where(OpKind kind, const std::string& fqn) { return absl::StrCat(op_name(kind), " (", fqn, ")"); }

}  // namespace

SeenOpInfo& AutoQuantizationState::validate_cur_op(int cursor, OpKind kind, const nn::Module* leaf,
                                                   const LeafQuantInfo* leaf_info) {
  // The hot path of every converted call: compare, and build messages only when throwing.
  if (__builtin_expect(cursor < static_cast<int>(seen_ops_.size()), 1)) {
    SeenOpInfo& op = seen_ops_[cursor];
    if (__builtin_expect(op.kind == kind && op.leaf == leaf, 1)) return op;
  }
  const std::string seen = op_where(kind, leaf_info != nullptr ? leaf_info->fqn() : fqn_);
  DBRQ_ENSURE(cursor < static_cast<int>(seen_ops_.size()), ControlFlowError, "control flow changed in module \"",
              fqn_, "\" (", type_name_, "): op ", cursor, " is ", seen, " but the first run recorded only ",
              seen_ops_.size(), " quantizeable ops. Quantizeable ops must run in the same order on every call; "
              "data-dependent branches may only contain non-quantizeable ops");
  const SeenOpInfo& op = seen_ops_[cursor];
  DBRQ_THROW(ControlFlowError, "control flow changed in module \"", fqn_, "\" (", type_name_, "): op ", cursor,
             " was recorded as ", op_where(op.kind, op.fqn), " but this run called ", seen,
             ". Quantizeable ops must run in the same order on every call; data-dependent branches may only "
             "contain non-quantizeable ops");
}

void AutoQuantizationState::validate_op_count(int cursor) const {
  if (cursor == static_cast<int>(seen_ops_.size())) return;
  const SeenOpInfo& missing = seen_ops_[cursor];
  DBRQ_THROW(ControlFlowError, "control flow changed in module \"", fqn_, "\" (", type_name_, "): this call ran ",
             cursor, " of the ", seen_ops_.size(), " recorded quantizeable ops; op ", cursor, " (",
             op_where(missing.kind, missing.fqn), ") did not run");
}

namespace {

std::string tensor_list(const std::vector<QTensorInfo>& ts) {
  std::vector<std::string> parts;
  for (const QTensorInfo& t : ts) parts.push_back(absl::StrCat("t", t.id, ":", dtype_name(t.inf_dtype)));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

}  // namespace

std::string AutoQuantizationState::to_string(int indent) const {
  const std::string pad(indent, ' ');
  std::ostringstream os;
  os << pad << "AutoQuantizationState(fqn=\"" << fqn_ << "\")\n";
  if (!seen_ops_.empty()) os << pad << "  seen_ops:\n";
  // Width of the op-kind column, for alignment.
  size_t width = 0;
  for (const SeenOpInfo& op : seen_ops_) {
    if (op.fusion.fused() && op.fusion.position > 0) continue;
    width = std::max(width, op.display_kind().size());
  }
  std::vector<int> observed_here;
  for (const SeenOpInfo& op : seen_ops_) {
    for (int s : op.input_observers) {
      if (s >= 0) observed_here.push_back(s);
    }
    if (op.output_observer >= 0) observed_here.push_back(op.output_observer);
    // Fused followers are shown through their chain's base op.
    if (op.fusion.fused() && op.fusion.position > 0) continue;
    std::vector<QTensorInfo> outs = op.outputs;
    if (op.fusion.fused()) {
      const SeenOpInfo& last = seen_ops_[op.fusion.base + op.fusion.pattern.size() - 1];
      outs = last.outputs;
    }
    std::vector<QTensorInfo> ins = op.inputs;
    // A residual add in the chain contributes its other input.
    for (size_t p = 1; op.fusion.fused() && p < op.fusion.pattern.size(); ++p) {
      const SeenOpInfo& m = seen_ops_[op.fusion.base + p];
      if (m.fusion.residual_input >= 0) ins.push_back(m.inputs[m.fusion.residual_input]);
    }
    std::string kind = op.display_kind();
    kind.resize(width, ' ');
    os << pad << "    " << op.index << ": " << kind << "  in=" << tensor_list(ins);
    if (!op.weights.empty() && op_def(op.kind).int8_weighted != nullptr) {
      const bool quantized = op.role == QuantRole::kWeighted;
      os << " w=[" << (op.weights[0].fqn.empty() ? std::string("<computed>") : op.weights[0].fqn) << ":"
         << (quantized ? absl::StrCat(dtype_name(op.qconfig->weight.dtype), " ",
                                      is_per_channel(op.qconfig->weight.qscheme) ? "per-channel" : "per-tensor")
                       : std::string("f32"))
         << "]";
    }
    os << " out=" << tensor_list(outs);
    if (op.role == QuantRole::kNone) os << "  (fp32" << (op.unsupported.empty() ? "" : ": " + op.unsupported) << ")";
    if (op.qconfig && op.qconfig->is_dynamic()) os << "  (dynamic)";
    if (op.executor) os << "  -> " << op.executor->describe();
    os << "\n";
  }
  if (!observed_here.empty()) {
    os << pad << "  observers:";
    std::vector<int> seen;
    for (int s : observed_here) {
      const int root = model_->find(s);
      if (std::find(seen.begin(), seen.end(), root) != seen.end()) continue;
      seen.push_back(root);
      ObserverSlot& slot = model_->slot(root);
      os << " t" << slot.tensor_id << " " << (slot.observer ? slot.observer->describe() : "?");
      if (slot.qparams) os << "{" << slot.qparams->to_string() << "}";
    }
    os << "\n";
  }
  if (!non_quant_ops_.empty()) {
    std::map<std::string, int> counts;
    for (const NonQuantOpInfo& o : non_quant_ops_) counts[op_name(o.kind)]++;
    std::vector<std::string> parts;
    for (auto& [n, c] : counts) parts.push_back(c > 1 ? absl::StrCat(n, " x", c) : n);
    os << pad << "  fp32_ops: " << absl::StrJoin(parts, ", ") << "\n";
  }
  return os.str();
}

AutoQuantizationState* quant_state_of(const nn::Module& m) {
  return dynamic_cast<AutoQuantizationState*>(m.extension());
}

}  // namespace dbrq
