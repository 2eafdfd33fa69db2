#include "quant_state/auto_quant_state.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "absl/hash/hash.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

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

uint64_t kind_fingerprint(OpKind kind) {
  static const auto table = [] {
    std::array<uint64_t, static_cast<size_t>(OpKind::kNumOpKinds)> t{};
    for (size_t k = 0; k < t.size(); ++k) t[k] = name_fingerprint(op_name(static_cast<OpKind>(k)));
    return t;
  }();
  return table[static_cast<size_t>(kind)];
}

int64_t ModelQuantState::new_tensor_id() {
  static std::atomic<int64_t> next{1};
  return next.fetch_add(1);
}

const ModelQuantState::TensorRecord* ModelQuantState::tensor(int64_t id) const {
  auto it = tensors_.find(id);
  return it == tensors_.end() ? nullptr : &it->second;
}

int64_t ModelQuantState::add_fp32_source(uint64_t source) {
  const int64_t id = fp32_source_id(source);
  TensorRecord r;
  r.source = source;
  tensors_.emplace(id, r);
  return id;
}

SeenOpInfo& ModelQuantState::record(int global_index) {
  auto& [state, index] = records_[static_cast<size_t>(global_index)];
  return state->seen_ops()[static_cast<size_t>(index)];
}

const SeenOpInfo& ModelQuantState::record(int global_index) const {
  const auto& [state, index] = records_[static_cast<size_t>(global_index)];
  return state->seen_ops()[static_cast<size_t>(index)];
}

std::vector<const SeenOpInfo*> ModelQuantState::chain_after(const SeenOpInfo& base) const {
  std::vector<const SeenOpInfo*> out;
  auto rest_of_chain = [&](const SeenOpInfo& head) {
    const AutoQuantizationState& s = state_of(head.global_index);
    for (size_t p = 1; head.fusion.fused() && p < head.fusion.members.size(); ++p) {
      out.push_back(&s.seen_ops()[static_cast<size_t>(head.fusion.members[p])]);
    }
  };
  rest_of_chain(base);
  const SeenOpInfo& last = out.empty() ? base : *out.back();
  if (last.absorbs >= 0) {
    const SeenOpInfo& a = record(last.absorbs);
    out.push_back(&a);
    rest_of_chain(a);
  }
  return out;
}

int ModelQuantState::ensure_slot(int record, int input, const ObserverSpec& spec, int64_t tensor_id,
                                 const std::string& owner) {
  auto it = slot_index_.find({record, input});
  if (it != slot_index_.end()) return it->second;
  const int s = new_slot(spec, tensor_id, owner);
  slots_[s].record = record;
  slots_[s].input = input;
  slot_index_.emplace(std::make_pair(record, input), s);
  return s;
}

void ModelQuantState::clear_program() {
  for (AutoQuantizationState* s : states_) s->clear_program();
  tensors_.clear();
  records_.clear();
  slots_.clear();
  slot_index_.clear();
  inner_outputs_.clear();
  calls_ = 0;
  dirty_ = false;
}

void AutoQuantizationState::clear_program() {
  recorded_ = false;
  seen_ops_.clear();
  index_.clear();
  pass_sources_.clear();
  next_hint_.clear();
  non_quant_ops_.clear();
  first_sequence_.clear();
  std::lock_guard<std::mutex> lock(paths_mu_);
  paths_.clear();
}

std::vector<ObserverSlot> ModelQuantState::take_slots() {
  std::vector<ObserverSlot> old = std::move(slots_);
  slots_.clear();
  slot_index_.clear();
  return old;
}

Observer& ModelQuantState::inner_output_observer(int record, const ObserverSpec& spec) {
  std::unique_ptr<Observer>& o = inner_outputs_[record];
  if (o == nullptr || !(o->spec() == spec)) o = make_observer(spec);
  return *o;
}

std::unique_ptr<Observer> ModelQuantState::take_inner_output_observer(int record) {
  auto it = inner_outputs_.find(record);
  if (it == inner_outputs_.end()) return nullptr;
  std::unique_ptr<Observer> o = std::move(it->second);
  inner_outputs_.erase(it);
  return o;
}

int ModelQuantState::new_slot(const ObserverSpec& spec, int64_t tensor_id, const std::string& owner) {
  ObserverSlot s;
  s.observer = make_observer(spec);
  s.tensor_id = tensor_id;
  s.owner = owner;
  slots_.push_back(std::move(s));
  return static_cast<int>(slots_.size()) - 1;
}

namespace {

// A hash of the tensor's values, for telling a refilled buffer from the same one (the geometry is
// compared apart): a dense tensor's memory as it lies, any other's elements in logical order. Read
// directly, never through the dispatcher (Tensor::contiguous is an op: called while calibrating it
// would be traced as one of the model's).
uint64_t values_hash(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0;
  if (t.is_non_overlapping_and_dense()) {
    return absl::Hash<absl::string_view>()(absl::string_view(static_cast<const char*>(t.data_ptr()),
                                                             static_cast<size_t>(t.numel()) * t.element_size()));
  }
  const std::vector<float> v = t.to_vector<float>();
  return absl::Hash<absl::string_view>()(
      absl::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
}

}  // namespace

void ObserverSlot::observe_once(const Tensor& t, uint64_t call, uint64_t consumer) {
  // Only an op's result (or a module input) is known to be the same tensor: a buffer no op made may
  // be refilled through a raw pointer without its version moving (forward filling one buffer per
  // loop iteration), and each refill must be observed. An op's result may be refilled that way too
  // (a clone's pointer, taken once): the values are compared as well, by their hash.
  const bool known = t.defined() && t.trace_id() != 0;
  const Last now{call,
                 t.defined() ? t.storage()->id() : 0,
                 t.defined() ? t.storage()->version() : 0,
                 t.storage_offset(),
                 t.defined() ? t.numel() : 0,
                 consumer,
                 known ? values_hash(t) : 0};
  if (known && now.call == last.call && now.storage == last.storage && now.version == last.version &&
      now.offset == last.offset && now.numel == last.numel && now.consumer != last.consumer &&
      now.hash == last.hash) {
    last.consumer = consumer;  // its next look at the same tensor is a new iteration's
    return;
  }
  observer->observe(t);
  last = now;
}

int ModelQuantState::find(int slot) const {
  while (slots_[slot].parent >= 0) slot = slots_[slot].parent;
  return slot;
}

int ModelQuantState::unite(int a, int b) {
  a = find(a);
  b = find(b);
  if (a == b) return a;
  // Keep the earlier slot: it belongs to the tensor produced first. What b saw so far (a path
  // found later can unite slots that already observed) goes into a.
  if (b < a) std::swap(a, b);
  if (slots_[b].observer && slots_[b].observer->has_data() && slots_[a].observer->spec().kind == slots_[b].observer->spec().kind) {
    slots_[a].observer->merge(*slots_[b].observer);
  }
  slots_[b].parent = a;
  slots_[b].observer.reset();
  return a;
}

AutoQuantizationState::AutoQuantizationState(std::string fqn, std::string type_name,
                                             std::shared_ptr<ModelQuantState> model)
    : fqn_(std::move(fqn)),
      fqn_fingerprint_(name_fingerprint(fqn_)),
      type_name_(std::move(type_name)),
      model_(std::move(model)) {
  for (size_t k = 0; k < functional_qconfig_.size(); ++k) {
    const auto kind = static_cast<OpKind>(k);
    functional_qconfig_[k] = model_->mapping().for_op(kind, type_name_, fqn_);
    functional_seen_[k] = functional_qconfig_[k] != nullptr && !functional_qconfig_[k]->is_bf16() && model_->seen_kind(kind);
  }
  for (const auto& [site, q] : model_->mapping().module_name_object_type_orders()) {
    if (site.module_fqn == fqn_) call_sites_[static_cast<size_t>(site.op)] = true;
  }
}

QConfigPtr AutoQuantizationState::seen_qconfig(OpKind kind, const LeafQuantInfo* leaf, int order) const {
  if (leaf != nullptr) {
    return model_->seen_kind(kind) && leaf->qconfig() != nullptr && !leaf->qconfig()->is_bf16() ? leaf->qconfig()
                                                                                                 : nullptr;
  }
  const size_t k = static_cast<size_t>(kind);
  if (order >= 0 && call_sites_[k]) {
    QConfigPtr q = model_->mapping().for_op(kind, type_name_, fqn_, order);
    return q != nullptr && !q->is_bf16() && model_->seen_kind(kind) ? q : nullptr;
  }
  return functional_seen_[k] ? functional_qconfig_[k] : nullptr;
}

bool AutoQuantizationState::is_seen(OpKind kind, const LeafQuantInfo* leaf, int order) const {
  if (leaf != nullptr) {
    const QConfigPtr& q = leaf->qconfig();
    return model_->seen_kind(kind) && q != nullptr && !q->is_bf16();
  }
  const size_t k = static_cast<size_t>(kind);
  if (order >= 0 && call_sites_[k]) return seen_qconfig(kind, leaf, order) != nullptr;
  return functional_seen_[k];
}

bool AutoQuantizationState::bf16_op(OpKind kind, const LeafQuantInfo* leaf, int order) const {
  if (leaf == nullptr && order >= 0 && call_sites_[static_cast<size_t>(kind)]) {
    QConfigPtr q = model_->mapping().for_op(kind, type_name_, fqn_, order);
    return q != nullptr && q->is_bf16();
  }
  const QConfigPtr& q = leaf != nullptr ? leaf->qconfig() : functional_qconfig_[static_cast<size_t>(kind)];
  return q != nullptr && q->is_bf16();
}

std::vector<QConfigPtr> AutoQuantizationState::functional_qconfigs(OpKind kind) const {
  std::vector<QConfigPtr> out = {functional_qconfig_[static_cast<size_t>(kind)]};
  for (const auto& [site, q] : model_->mapping().module_name_object_type_orders()) {
    if (site.module_fqn == fqn_ && site.op == kind) out.push_back(q);
  }
  return out;
}

namespace {

std::string op_where(OpKind kind, const std::string& fqn) { return absl::StrCat(op_name(kind), " (", fqn, ")"); }

}  // namespace

int AutoQuantizationState::find_record(int64_t tag, OpKind kind, const ProducerTags& producers, int hint) const {
  // The hot path of every converted call: the hint is almost always right (no hashing).
  if (hint >= 0 && hint < static_cast<int>(seen_ops_.size())) {
    const SeenOpInfo& h = seen_ops_[static_cast<size_t>(hint)];
    if (h.tag == tag && h.kind == kind && h.producers == producers) return hint;
  }
  auto it = index_.find(Key{tag, kind, producers});
  return it == index_.end() ? -1 : it->second;
}

SeenOpInfo& AutoQuantizationState::add_record(int64_t tag, OpKind kind, const ProducerTags& producers) {
  const int index = static_cast<int>(seen_ops_.size());
  seen_ops_.emplace_back();
  next_hint_.emplace_back(-1);
  SeenOpInfo& op = seen_ops_.back();
  op.index = index;
  op.kind = kind;
  op.tag = tag;
  op.producers = producers;
  op.out_tag = output_tag(tag, kind, producers);
  if (op.out_tag != tag) pass_sources_.emplace(op.out_tag, source_of(producers[0]));
  index_.emplace(Key{tag, kind, producers}, index);
  return op;
}

bool AutoQuantizationState::passes_source(OpKind kind, const ProducerTags& producers) {
  return producers.size() == 1 && !op_def(kind).params_in_identity;
}

int64_t AutoQuantizationState::source_of(int64_t producer) const {
  auto it = pass_sources_.find(producer);
  return it == pass_sources_.end() ? producer : it->second;
}

int64_t AutoQuantizationState::output_tag(int64_t tag, OpKind kind, const ProducerTags& producers) const {
  if (!passes_source(kind, producers)) return tag;
  return tag_finish(fingerprint_mix(static_cast<uint64_t>(tag), static_cast<uint64_t>(source_of(producers[0]))));
}

void AutoQuantizationState::remove_last_record() {
  DBRQ_CHECK(!seen_ops_.empty(), "no record to remove");
  const SeenOpInfo& op = seen_ops_.back();
  index_.erase(Key{op.tag, op.kind, op.producers});
  seen_ops_.pop_back();
  next_hint_.pop_back();
}

int AutoQuantizationState::next_hint(int index) const {
  return index >= 0 && index < static_cast<int>(next_hint_.size())
             ? next_hint_[static_cast<size_t>(index)].load(std::memory_order_relaxed)
             : -1;
}

void AutoQuantizationState::set_next_hint(int index, int next) const {
  if (index >= 0 && index < static_cast<int>(next_hint_.size())) {
    next_hint_[static_cast<size_t>(index)].store(next, std::memory_order_relaxed);
  }
}

void AutoQuantizationState::check_sequence(int cursor, OpKind kind, int64_t tag, const LeafQuantInfo* leaf_info) {
  if (__builtin_expect(cursor < static_cast<int>(first_sequence_.size()), 1)) {
    const SeenOpInfo& op = seen_ops_[static_cast<size_t>(first_sequence_[static_cast<size_t>(cursor)])];
    if (__builtin_expect(op.kind == kind && op.tag == tag, 1)) return;
  }
  const std::string seen = op_where(kind, leaf_info != nullptr ? leaf_info->fqn() : fqn_);
  DBRQ_ENSURE(cursor < static_cast<int>(first_sequence_.size()), ControlFlowError, "control flow changed in module \"",
              fqn_, "\" (", type_name_, "): op ", cursor, " is ", seen, " but the first run recorded only ",
              first_sequence_.size(), " quantizeable ops. With strict_control_flow, quantizeable ops must run in "
              "the same order on every call");
  const SeenOpInfo& op = seen_ops_[static_cast<size_t>(first_sequence_[static_cast<size_t>(cursor)])];
  DBRQ_THROW(ControlFlowError, "control flow changed in module \"", fqn_, "\" (", type_name_, "): op ", cursor,
             " was recorded as ", op_where(op.kind, op.fqn), " but this run called ", seen,
             ". With strict_control_flow, quantizeable ops must run in the same order on every call");
}

void AutoQuantizationState::check_sequence_end(int cursor) const {
  if (cursor == static_cast<int>(first_sequence_.size())) return;
  const SeenOpInfo& missing = seen_ops_[static_cast<size_t>(first_sequence_[static_cast<size_t>(cursor)])];
  DBRQ_THROW(ControlFlowError, "control flow changed in module \"", fqn_, "\" (", type_name_, "): this call ran ",
             cursor, " of the ", first_sequence_.size(), " recorded quantizeable ops; op ", cursor, " (",
             op_where(missing.kind, missing.fqn), ") did not run");
}

void AutoQuantizationState::note_path(const std::array<uint64_t, 4>& mask, const std::vector<int>* records) {
  std::lock_guard<std::mutex> lock(paths_mu_);
  for (PathInfo& p : paths_) {
    if (p.mask == mask) {
      ++p.calls;
      return;
    }
  }
  PathInfo p;
  p.mask = mask;
  if (records != nullptr) {
    p.records = *records;
  } else {
    for (size_t w = 0; w < mask.size(); ++w) {
      for (int b = 0; b < 64; ++b) {
        if (mask[w] >> b & 1) p.records.push_back(static_cast<int>(w * 64) + b);
      }
    }
  }
  p.calls = 1;
  paths_.push_back(std::move(p));
}

std::vector<PathInfo> AutoQuantizationState::paths() const {
  std::lock_guard<std::mutex> lock(paths_mu_);
  return paths_;
}

void AutoQuantizationState::set_paths(std::vector<PathInfo> paths) {
  std::lock_guard<std::mutex> lock(paths_mu_);
  paths_ = std::move(paths);
}

namespace {

std::string tensor_list(const std::vector<QTensorInfo>& ts) {
  std::vector<std::string> parts;
  for (const QTensorInfo& t : ts) {
    std::string ids = absl::StrCat("t", t.id);
    for (int64_t m : t.more_ids) absl::StrAppend(&ids, "|t", m);
    parts.push_back(absl::StrCat(ids, ":", dtype_name(t.inf_dtype)));
  }
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
    if (op.fusion.fused()) outs = seen_ops_[static_cast<size_t>(op.fusion.members.back())].outputs;
    std::vector<QTensorInfo> ins = op.inputs;
    // A residual add in the chain contributes its other input.
    for (size_t p = 1; op.fusion.fused() && p < op.fusion.members.size(); ++p) {
      const SeenOpInfo& m = seen_ops_[static_cast<size_t>(op.fusion.members[p])];
      if (m.fusion.residual_input >= 0) ins.push_back(m.inputs[static_cast<size_t>(m.fusion.residual_input)]);
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
  const std::vector<PathInfo> ps = paths();
  if (ps.size() > 1) {
    // Several paths: which records each ran, and how many calls took it.
    os << pad << "  paths:";
    for (const PathInfo& p : ps) {
      std::vector<std::string> ids;
      for (int r : p.records) ids.push_back(std::to_string(r));
      os << " [" << absl::StrJoin(ids, " ") << "] x" << p.calls << ";";
    }
    os << "\n";
  }
  return os.str();
}

AutoQuantizationState* quant_state_of(const nn::Module& m) {
  return dynamic_cast<AutoQuantizationState*>(m.extension());
}

}  // namespace dbrq
