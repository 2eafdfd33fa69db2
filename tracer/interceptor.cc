#include "tracer/interceptor.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "runtime/ops.h"
#include "tracer/executors.h"
#include "tracer/fold_calibration.h"

namespace dbrq::tracer {
namespace {

// The module call stack of this thread (shared by every model; frames remember their owner).
thread_local std::vector<Frame> tls_stack;

// The observer statistics of a calibrating model as they were when this thread's outermost call
// of it began. A call that throws (a bad batch, a control-flow change) restores them, so it leaves
// no partial observations behind; a call that returns drops them. Calibration is not a hot path:
// copying the statistics costs far less than the forward pass.
struct CalibrationSnapshot {
  ModelQuantState* model = nullptr;
  std::vector<std::pair<int, Observer::Stats>> observers;  // root slot, its statistics
};
thread_local std::vector<CalibrationSnapshot> tls_snapshots;

void save_calibration(ModelQuantState& m) {
  CalibrationSnapshot snap;
  snap.model = &m;
  for (size_t i = 0; i < m.num_slots(); ++i) {
    const int s = static_cast<int>(i);
    if (m.find(s) == s) snap.observers.emplace_back(s, m.slot(s).observer->stats());
  }
  tls_snapshots.push_back(std::move(snap));
}

void restore_calibration() noexcept {
  const CalibrationSnapshot& snap = tls_snapshots.back();
  for (const auto& [s, stats] : snap.observers) snap.model->slot(s).observer->load_stats(stats);
  tls_snapshots.pop_back();
}

// The frame whose module owns ops running now: the top frame if it has state, or the nearest
// stateful frame under a leaf.
Frame* owner_frame(Frame** top) {
  if (tls_stack.empty()) {
    *top = nullptr;
    return nullptr;
  }
  *top = &tls_stack.back();
  for (auto it = tls_stack.rbegin(); it != tls_stack.rend(); ++it) {
    if (it->state != nullptr) return &*it;
    if (it->leaf == nullptr) return nullptr;  // a stateless non-leaf module owns it: no quantization
  }
  return nullptr;
}

// Where an op runs, captured before it runs (frame pointers into tls_stack are not kept).
struct OpSite {
  const AutoQuantizationState* state = nullptr;  // the module whose op it is (null: no state)
  const LeafQuantInfo* leaf = nullptr;           // the layer running it, if any
  const nn::Module* module = nullptr;            // the innermost module on the stack
  int index = -1;                                // seen-op index in `state`; -1: not a seen op
};

OpSite site_of(const Frame* owner, const Frame* top, int index) {
  OpSite s;
  s.state = owner != nullptr ? owner->state : nullptr;
  s.leaf = top != nullptr ? top->leaf : nullptr;
  s.module = top != nullptr ? top->module : nullptr;
  s.index = index;
  return s;
}

// "in module "layer1.0" (BasicBlock), op 0 conv2d (layer1.0.conv1): " for a seen op,
// "in module "" (Net), flatten (not quantized): " for another one. Only built when throwing.
std::string op_location(OpKind kind, const OpSite& site) {
  std::string where;
  if (site.state != nullptr) {
    where = absl::StrCat("in module \"", site.state->fqn(), "\" (", site.state->type_name(), "), ");
  } else if (site.module != nullptr) {
    // A module without quantization state (not part of the prepared model's tree).
    where = absl::StrCat("in a ", site.module->type_name(), " module, ");
  }
  const std::string op_fqn = site.leaf != nullptr ? site.leaf->fqn() : site.state != nullptr ? site.state->fqn() : "";
  if (site.index >= 0) {
    absl::StrAppend(&where, "op ", site.index, " ", op_name(kind), " (", op_fqn, "): ");
  } else if (site.leaf != nullptr) {
    absl::StrAppend(&where, op_name(kind), " (", op_fqn, ", not quantized): ");
  } else {
    absl::StrAppend(&where, op_name(kind), " (not quantized): ");
  }
  return where;
}

// Runs `f`, adding the op's location to a dbrq::Error that has none yet. Costs nothing unless `f`
// throws.
template <typename F>
Tensor located(OpKind kind, const OpSite& site, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    if (e.has_location()) throw;
    e.rethrow_with_location(op_location(kind, site));
  }
}

// The op-sequence checks (validate_cur_op, validate_op_count) name the module and the op in their
// messages already: mark them located so that no module adds itself in front.
template <typename F>
decltype(auto) self_located(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    if (e.has_location()) throw;
    e.rethrow_with_location("");
  }
}

}  // namespace

namespace {

// Whether `w` covers exactly what `param` does (the same elements in the same places).
bool same_geometry(const Tensor& w, const Tensor& param) {
  return w.storage_offset() == param.storage_offset() && w.sizes() == param.sizes() && w.strides() == param.strides();
}

WeightView view_of(const Tensor& w) {
  WeightView v;
  v.offset = w.storage_offset();
  v.sizes.assign(w.sizes().begin(), w.sizes().end());
  v.strides.assign(w.strides().begin(), w.strides().end());
  return v;
}

}  // namespace

int64_t QuantInterceptor::op_tag(const OpCall& call, const LeafQuantInfo* leaf, const OpDef& def, size_t n_act,
                                 bool seen) const {
  uint64_t h = tag_start(call.kind, leaf != nullptr ? leaf->fqn_fingerprint() : 0);
  if (const uint64_t salt = op_identity_salt(); salt != 0) h = fingerprint_mix(h, salt);
  // Parameters and scalars identify a recorded op whose int8 form is built from them; an op that
  // is not recorded is only ever a producer, and its parameters may vary with a loop's index.
  if (seen && def.params_in_identity && call.params != nullptr && def.params_fingerprint != nullptr) {
    h = fingerprint_mix(h, def.params_fingerprint(call.params));
  }
  if (seen && call.has_scalar) h = tag_scalar(h, call.scalar, call.scalar_first);
  if (leaf == nullptr) {
    // A functional op with weights: which parameters (a computed weight is "computed").
    for (size_t i = n_act; i < call.inputs.size(); ++i) {
      const Tensor& w = *call.inputs[i];
      bool whole = false;
      const Param* p = param_of(w, &whole);
      if (p == nullptr) {
        h = tag_weight(h, 1u, nullptr);
      } else if (whole) {
        h = tag_weight(h, p->fingerprint, nullptr);
      } else {
        const WeightView v = view_of(w);
        h = tag_weight(h, p->fingerprint, &v);
      }
    }
  }
  return tag_finish(h);
}

int64_t module_input_tag(size_t k) { return static_cast<int64_t>(k) + 1; }
int64_t child_output_tag(uint64_t child_fqn_fingerprint, size_t j) {
  const uint64_t h = fingerprint_mix(child_fqn_fingerprint, j);
  return static_cast<int64_t>((h & ((uint64_t{1} << 62) - 1)) | (uint64_t{1} << 62));
}

uint64_t module_fingerprint(const nn::Module& module) {
  const nn::ModuleExtension* ext = module.extension();
  if (auto* s = dynamic_cast<const AutoQuantizationState*>(ext)) return s->fqn_fingerprint();
  if (auto* l = dynamic_cast<const LeafQuantInfo*>(ext)) return l->fqn_fingerprint();
  if (auto* n = dynamic_cast<const NonTraceableInfo*>(ext)) return n->fqn_fingerprint();
  return reinterpret_cast<uintptr_t>(&module);
}

namespace {

// Records created by the current outermost call on this thread (undone if the call fails).
thread_local std::vector<std::pair<AutoQuantizationState*, int>> tls_created;

std::vector<int64_t> origins_of(const QTensorInfo& t) {
  std::vector<int64_t> ids = {t.id};
  ids.insert(ids.end(), t.more_ids.begin(), t.more_ids.end());
  return ids;
}

// After convert, the output of a fused chain's inner op (a conv whose relu runs in its kernel)
// does not exist: the tensor holds the chain's result, or nothing yet (a conv waiting for its
// residual add). Such tensors carry this bit in their origin, so a path never calibrated that
// reads one is caught without a table lookup.
constexpr int64_t kInnerFusedBit = int64_t{1} << 61;

// After convert, a value computed on a path never calibrated (run_uncalibrated) carries this bit in
// its origin, and so does every value computed from it: by fp32 ops, untraced modules, a child
// module (whose outputs keep their origin). An int8 op reading one runs fp32 as well: its ranges
// were calibrated on other values (`h = use_b ? relu(b(x)) : relu(a(x)); head(h)` calibrated with a
// only: both relus have one tag, and head quantized b's values into a's range). Fp32 source ids
// keep the bit clear (ModelQuantState::fp32_source_id), record output ids are counted from 1.
constexpr int64_t kUncalibratedBit = int64_t{1} << 60;

bool uncalibrated_value(const Tensor& t) { return t.defined() && (t.trace_origin() & kUncalibratedBit) != 0; }

// Whether a seen op's output, after convert, is a fused chain's inner tensor (see kInnerFusedBit).
bool inner_output(const SeenOpInfo& op) {
  return (op.fusion.fused() && op.fusion.position + 1 < static_cast<int>(op.fusion.members.size())) ||
         (op.absorbs >= 0 && op.role != QuantRole::kNone);
}

// Whether an input of the call is a fused chain's inner tensor (it exists only in the kernel).
bool reads_inner_fused(const OpCall& call) {
  return std::any_of(call.inputs.begin(), call.inputs.end(), [](const Tensor* t) {
    return t->defined() && (t->trace_origin() & kInnerFusedBit) != 0;
  });
}

// Mixed into the producer tag of a parameter or buffer read as an activation (producer_tag).
constexpr uint64_t kParameterProducerSalt = 0x706172616d206173ull;

// Mixed into the model's input tags: the model's inputs as fp32 sources.
constexpr uint64_t kModelInputSalt = 0x6d6f64656c20696eull;

[[noreturn]] void throw_reads_inner(const std::string& who, const SeenOpInfo& p) {
  DBRQ_THROW(ControlFlowError, "an uncalibrated path (", who, ") reads the output of ", op_name(p.kind), " (", p.fqn,
             "), which after convert runs fused as ", p.fusion.name(), " and has no output of its own; calibrate this "
             "path before convert");
}

// Whether an input arrives from where calibration saw it come from.
bool expected_origin(const QTensorInfo& in, int64_t origin) {
  return origin == in.id || std::find(in.more_ids.begin(), in.more_ids.end(), origin) != in.more_ids.end();
}

}  // namespace

QuantInterceptor::QuantInterceptor(std::shared_ptr<ModelQuantState> model, nn::Module& root)
    : model_(std::move(model)) {
  for (auto& [name, t] : root.state_dict()) {  // parameters and buffers (batch norm statistics)
    t.storage()->mark_model_state();
    auto& regs = params_[t.storage().get()];
    if (regs.empty()) {
      storage_versions_.emplace_back();
      storage_versions_.back().storage = t.storage().get();
    }
    regs.push_back(Param{name, name_fingerprint(name), t});
  }
  for (StorageVersion& v : storage_versions_) {  // named by its largest registration
    int64_t largest = -1;
    v.lo = std::numeric_limits<int64_t>::max();
    v.hi = 0;
    for (const Param& p : params_.at(v.storage)) {
      if (p.tensor.numel() > largest) {
        largest = p.tensor.numel();
        v.name = p.fqn;
      }
      v.itemsize = p.tensor.element_size();
      if (p.tensor.numel() == 0) continue;
      int64_t end = p.tensor.storage_offset() + 1;
      for (int64_t d = 0; d < p.tensor.dim(); ++d) end += (p.tensor.size(d) - 1) * std::abs(p.tensor.stride(d));
      v.lo = std::min(v.lo, p.tensor.storage_offset());
      v.hi = std::max(v.hi, end);
    }
    if (v.hi <= v.lo) v.lo = v.hi = 0;
  }
  for (const auto& [fqn, m] : root.named_modules()) {
    for (auto& [name, t] : m->named_parameters(/*recurse=*/false)) {
      if (t.defined()) param_owners_[t.storage().get()] = {m, fqn};
    }
  }
}

bool QuantInterceptor::is_inner_fused(const Tensor& t) {
  return t.defined() && (t.trace_origin() & kInnerFusedBit) != 0;
}

QuantInterceptor& QuantInterceptor::of(const nn::Module& model, const char* what) {
  auto* i = quant_state_of(model) != nullptr ? dynamic_cast<QuantInterceptor*>(model.interceptor()) : nullptr;
  DBRQ_ENSURE(i != nullptr, UsageError, what, ": ", model.type_name(),
              " is not a prepared model; call dbrq::prepare(model, example_inputs) first");
  return *i;
}

void QuantInterceptor::acquire_exclusive(const char* what, const char* advice) {
  std::lock_guard<std::mutex> lock(unconverted_mu_);
  const nn::Module* root = model_->root();
  DBRQ_ENSURE(unconverted_depth_ == 0, UsageError, what, ": ",
              root != nullptr ? root->type_name() : std::string("the model"),
              " is being called (on this thread or another); ", advice);
  unconverted_depth_ = 1;
  unconverted_thread_ = std::this_thread::get_id();
}

void QuantInterceptor::release_exclusive() noexcept {
  std::lock_guard<std::mutex> lock(unconverted_mu_);
  unconverted_depth_ = 0;
  unconverted_thread_ = std::thread::id();
}

void QuantInterceptor::convert(bool int8_outputs) {
  // Not while a call before convert is in flight (its thread is writing records and observers
  // that convert reads), and once: calls that start meanwhile raise (enter_unconverted).
  ExclusiveHold hold(*this, "convert", "convert between calls, once calibration is done");
  {
    const nn::Module* root = model_->root();
    DBRQ_ENSURE(model_->phase() != Phase::kConverted, UsageError, "convert: ",
                root != nullptr ? root->type_name() : std::string("the model"),
                " is already converted; convert once per prepared model");
  }
  check_calibrated_values();
  program_ = convert_model(*model_);
  // All but the ones whose values varied while calibrating (StorageVersion): those are activations
  // calibration saw change. Parameters loaded after prepare (the deploy flow: prepare,
  // load_state_dict, load_quant_state, convert) are checked from their loaded version.
  for (const StorageVersion& v : storage_versions_) {
    if (!v.varies) versions_at_convert_[v.storage] = v.storage->version();
  }
  kernel_params_.assign(program_.size(), {});
  for (size_t g = 0; g < model_->records().size(); ++g) {
    const SeenOpInfo& op = model_->record(static_cast<int>(g));
    if (op.program_index < 0 || op.executor == nullptr) continue;
    std::vector<ParamVersion>& list = kernel_params_[static_cast<size_t>(op.program_index)];
    auto add = [&](const SeenOpInfo& o) {
      for (const WeightInfo& w : o.weights) {
        const auto it = w.tensor.defined() ? versions_at_convert_.find(w.tensor.storage().get()) : versions_at_convert_.end();
        if (it == versions_at_convert_.end()) continue;
        const auto* st = static_cast<const Storage*>(it->first);
        if (std::none_of(list.begin(), list.end(), [&](const ParamVersion& p) { return p.storage == st; })) {
          list.push_back({st, it->second});
        }
      }
    };
    add(op);
    if (!op.fusion.fused() || op.fusion.position == 0) {
      for (const SeenOpInfo* m : model_->chain_after(op)) add(*m);
    }
  }
  int8_outputs_ = int8_outputs;
  model_->set_phase(Phase::kConverted);
}

// Throws what Storage::data() throws (a lazy fill that fails, superseded contents).
uint64_t QuantInterceptor::hash_values(const StorageVersion& v) {
  if (v.hi == v.lo) return hash_bytes(nullptr, 0);
  const char* base = static_cast<const char*>(v.storage->data());
  return hash_bytes(base + v.lo * static_cast<int64_t>(v.itemsize), static_cast<size_t>(v.hi - v.lo) * v.itemsize);
}

// The ranges calibration recorded downstream of a parameter describe the values it had then.
// Weights loaded after calibrating (or other weights than a loaded quant-state file's) would be
// quantized anew at convert while every activation range after them stays the old one: clipped
// or coarse, with no error. Values that varied while calibrating (a training loop's weights, a
// mask set before each call) are not checked: calibration saw them change.
void QuantInterceptor::check_calibrated_values() {
  // Values a quant-state file (or merged replicas) saw vary are exempt here too, and after convert.
  for (StorageVersion& v : storage_versions_) v.varies |= model_->varied_values().count(v.name) != 0;
  const auto& calibrated = model_->calibrated_values();
  // Only calibrated ranges depend on the values (a model quantized dynamically only has none).
  bool static_ranges = false;
  for (size_t g = 0; g < model_->records().size() && !static_ranges; ++g) {
    const SeenOpInfo& op = model_->record(static_cast<int>(g));
    static_ranges = op.role != QuantRole::kNone && op.qconfig != nullptr && !op.qconfig->is_dynamic();
  }
  if (calibrated.empty() || !static_ranges) return;
  std::vector<std::string> changed;
  for (const StorageVersion& v : storage_versions_) {
    const auto it = v.varies ? calibrated.end() : calibrated.find(v.name);
    if (it == calibrated.end()) continue;
    // Not written since this process hashed it (also: written through a pointer taken before,
    // which no version sees; calibration saw those values).
    if (v.hashed_version == v.storage->version() && v.hash == it->second) continue;
    bool same = false;
    try {
      same = hash_values(v) == it->second;
    } catch (const Error&) {  // contents that cannot be read are not the ones calibration saw
    }
    if (!same) changed.push_back("\"" + v.name + "\"");
  }
  if (changed.empty()) return;
  std::string names = changed[0];
  for (size_t i = 1; i < std::min<size_t>(changed.size(), 3); ++i) names += (i + 1 == changed.size() ? " and " : ", ") + changed[i];
  if (changed.size() > 3) names += " and " + std::to_string(changed.size() - 3) + " more";
  DBRQ_THROW(UsageError, "convert: ", changed.size() == 1 ? "parameter " : "parameters ", names,
             changed.size() == 1 ? " holds" : " hold",
             " other values than calibration saw (written after the last calibrating call, or not the weights the "
             "loaded quant-state file was calibrated with): the int8 ranges after ",
             changed.size() == 1 ? "it" : "them",
             " describe the old values. Load the weights first, then calibrate (or load the quant-state file made "
             "with them)");
}

const QuantInterceptor::Param* QuantInterceptor::param_of(const Tensor& w, bool* whole) const {
  *whole = false;
  auto it = w.defined() ? params_.find(w.storage().get()) : params_.end();
  if (it == params_.end()) return nullptr;
  // Exact matches: the last registration (state_dict order), as one name per storage always was.
  const Param* exact = nullptr;
  const Param* largest = nullptr;
  for (const Param& p : it->second) {
    if (same_geometry(w, p.tensor)) exact = &p;
    if (largest == nullptr || p.tensor.numel() > largest->tensor.numel()) largest = &p;
  }
  *whole = exact != nullptr;
  return exact != nullptr ? exact : largest;
}

WeightInfo QuantInterceptor::weight_info(const Tensor& t) const {
  WeightInfo w;
  w.tensor = t;
  bool whole = false;
  const Param* p = param_of(t, &whole);
  if (p == nullptr) return w;
  w.fqn = p->fqn;
  if (!whole) {
    w.has_view = true;
    w.view = view_of(t);
  }
  return w;
}

int64_t QuantInterceptor::origin_of(const Tensor& t, AutoQuantizationState* state, int64_t tag, size_t k) {
  const int64_t o = t.trace_origin();
  if (o != 0 && model_->tensor(o) != nullptr) return o;
  // A parameter or buffer used as an activation: an fp32 source of its own, whichever op reads it.
  if (const int64_t p = t.trace_id() == 0 ? producer_tag(t) : 0; p != 0) {
    return model_->add_fp32_source(fingerprint_mix(static_cast<uint64_t>(p), state->fqn_fingerprint()));
  }
  // Made outside any op of this model (a constant, another model's tensor): an fp32 source of its
  // own at this input.
  return model_->add_fp32_source(fingerprint_mix(fingerprint_mix(static_cast<uint64_t>(tag), k), state->fqn_fingerprint()));
}

void QuantInterceptor::stale_read(const void* written, const std::string& reader) {
  const std::string why = absl::StrCat("reads parameter \"", params_.at(written).front().fqn,
                                       "\", written since convert, and the int8 ops after it were calibrated on its old "
                                       "values (calibrate again with the new ones: prepare, calibrate, convert)");
  if (strict_paths_) DBRQ_THROW(ControlFlowError, "uncalibrated path after convert: ", why);
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(warned_mu_);
    first = warned_.insert({written, -1}).second;
  }
  if (first) log()->warn("{}: {}; the model's quantizeable ops run in fp32 from now on", reader, why);
}

const Storage* QuantInterceptor::written_kernel_param(const std::vector<ParamVersion>& list) {
  for (const ParamVersion& p : list) {
    if (__builtin_expect(p.storage->version() != p.version, 0)) {
      stale_.store(true, std::memory_order_relaxed);
      return p.storage;
    }
  }
  return nullptr;
}

const void* QuantInterceptor::written_since_convert(const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::kF32 || !t.storage()->model_state()) return nullptr;
  const auto it = versions_at_convert_.find(t.storage().get());
  if (it == versions_at_convert_.end() || it->second == t.storage()->version()) return nullptr;
  stale_.store(true, std::memory_order_relaxed);
  return it->first;
}

int64_t QuantInterceptor::producer_tag(const Tensor& t) const {
  const int64_t id = t.trace_id();
  if (__builtin_expect(id != 0, 1)) return id;
  if (!t.defined() || !t.storage()->model_state()) return 0;  // not a parameter or buffer
  bool whole = false;
  const Param* p = param_of(t, &whole);
  if (p == nullptr) return 0;
  const WeightView v = whole ? WeightView{} : view_of(t);
  const uint64_t h = tag_weight(kParameterProducerSalt, p->fingerprint, whole ? nullptr : &v);
  return static_cast<int64_t>((h & ((uint64_t{1} << 61) - 1)) | (uint64_t{1} << 61));
}

Tensor QuantInterceptor::on_op(const OpCall& call) {
  if (__builtin_expect(!call.inplace, 1) || model_->phase() != Phase::kConverted) return run_op(call);
  // In place after convert: what the op computed must reach every tensor sharing the storage.
  Tensor out = run_op(call);
  const int64_t id = out.trace_id(), origin = out.trace_origin();
  const bool withheld = out.value_withheld();
  Tensor r;
  try {
    r = write_back_inplace(call.input(0), std::move(out), call.kind);
  } catch (const Error& e) {
    Frame* top = nullptr;
    const Frame* owner = owner_frame(&top);
    if (e.has_location() || owner == nullptr) throw;
    e.rethrow_with_location(absl::StrCat("in module \"", owner->state->fqn(), "\" (", owner->state->type_name(), "): "));
  }
  // The tensor written back into is the op's output: its tags, not its input's.
  r.set_trace_id(id);
  r.set_trace_origin(origin);
  r.set_value_withheld(withheld);
  return r;
}

Tensor QuantInterceptor::run_op(const OpCall& call) {
  Frame* top = nullptr;
  Frame* owner = owner_frame(&top);
  if (owner == nullptr) return located(call.kind, site_of(owner, top, -1), [&] { return run_fp32(call); });
  const LeafQuantInfo* leaf = top != nullptr ? top->leaf : nullptr;
  // A functional op's index among this call's calls of its kind: its address in the mapping's
  // call-site entries (set_module_name_object_type_order), and kept in its record for tools.
  const int order = leaf == nullptr && (model_->phase() != Phase::kConverted || owner->state->has_call_sites(call.kind))
                        ? owner->next_order(call.kind)
                        : -1;
  if (!owner->state->is_seen(call.kind, leaf, order)) return other_op(call, owner, top, order);
  return seen_op(call, owner, top, order);
}

// An op that is not recorded: fp32 (int8 arguments dequantized). Its output carries its site, so
// the records reading it know where it came from.
Tensor QuantInterceptor::other_op(const OpCall& call, Frame* owner, Frame* top, int order) {
  const LeafQuantInfo* leaf = top->leaf;
  const OpDef& def = op_def(call.kind);
  const int64_t tag = op_tag(call, leaf, def, def.activation_inputs(call.inputs.size()), false);
  const Phase phase = model_->phase();
  if (phase != Phase::kConverted) {
    // What it reads is read by something other than a record: no fusion may hide it.
    for (const Tensor* t : call.inputs) {
      if (!t->defined()) continue;
      const ModelQuantState::TensorRecord* r = model_->tensor(t->trace_origin());
      if (r != nullptr && r->record >= 0) {
        SeenOpInfo& p = model_->record(r->record);
        if (!p.read_by_fp32) {
          p.read_by_fp32 = true;
          model_->set_dirty(true);
        }
      }
    }
    if (phase == Phase::kTracing && owner->recording) {
      owner->state->non_quant_ops().push_back(
          {call.kind, leaf != nullptr ? leaf->fqn() : owner->state->fqn(),
           !model_->seen_kind(call.kind)           ? "no int8 kernel"
           : owner->state->bf16_op(call.kind, leaf, order) ? "qconfig is bf16"
                                                    : "qconfig is None"});
    }
  } else {
    // After convert, an fp32 op reading a fused chain's inner tensor would read the chain's result.
    for (const Tensor* t : call.inputs) {
      if (t->defined() && (t->trace_origin() & kInnerFusedBit) != 0) {
        const ModelQuantState::TensorRecord* r = model_->tensor(t->trace_origin() & ~kInnerFusedBit);
        if (r != nullptr && r->record >= 0) throw_reads_inner(op_name(call.kind), model_->record(r->record));
      }
    }
    // An fp32 op reading a parameter written since convert (x * exp(log_scale), a layer norm's
    // weight): its output reaches int8 ops calibrated on the old values. They run fp32 from now on.
    for (const Tensor* t : call.inputs) {
      if (const void* written = written_since_convert(*t); __builtin_expect(written != nullptr, 0)) {
        located(call.kind, site_of(owner, top, -1), [&] {
          stale_read(written, absl::StrCat(op_name(call.kind), " (module \"", owner->state->fqn(), "\")"));
          return Tensor();
        });
      }
    }
  }
  // A QConfig::bf16() op computes in bf16 once converted (calibration observes the fp32 model).
  const bool bf16 = phase == Phase::kConverted && owner->state->bf16_op(call.kind, leaf, order);
  Tensor out = located(call.kind, site_of(owner, top, -1), [&] { return bf16 ? run_bf16(call) : run_fp32(call); });
  out.set_trace_id(tag);
  const uint64_t source = fingerprint_mix(static_cast<uint64_t>(tag), owner->state->fqn_fingerprint());
  if (phase != Phase::kConverted) {
    out.set_trace_origin(model_->add_fp32_source(source));
  } else {
    const bool uncalibrated = std::any_of(call.inputs.begin(), call.inputs.end(),
                                          [](const Tensor* t) { return uncalibrated_value(*t); });
    out.set_trace_origin(model_->fp32_source_id(source) | (uncalibrated ? kUncalibratedBit : 0));
  }
  return out;
}

SeenOpInfo& QuantInterceptor::record_op(const OpCall& call, Frame* owner, Frame* top, int64_t tag,
                                        const ProducerTags& producers, int order, const QConfigPtr& qconfig) {
  AutoQuantizationState& s = *owner->state;
  const LeafQuantInfo* leaf = top->leaf;
  const OpDef& def = op_def(call.kind);
  const size_t n_act = def.activation_inputs(call.inputs.size());
  if (leaf == nullptr && n_act < call.inputs.size()) check_layer_bypass(call, def, s, qconfig, n_act);
  SeenOpInfo& op = s.add_record(tag, call.kind, producers);
  op.identity_salt = op_identity_salt();
  op.global_index = static_cast<int>(model_->records().size());
  op.program_index = op.global_index;
  model_->records().emplace_back(&s, op.index);
  tls_created.emplace_back(&s, op.index);
  op.fqn = leaf != nullptr ? leaf->fqn() : s.fqn();
  op.leaf = leaf != nullptr ? top->module : nullptr;
  op.order = leaf != nullptr ? -1 : order;
  op.qconfig = qconfig;
  for (size_t i = 0; i < n_act; ++i) {
    const Tensor& t = *call.inputs[i];
    if (!t.defined()) continue;
    QTensorInfo in;
    in.id = origin_of(t, &s, tag, i);
    in.trace_dtype = t.dtype();
    op.inputs.push_back(in);
  }
  for (size_t i = n_act; i < call.inputs.size(); ++i) op.weights.push_back(weight_info(*call.inputs[i]));
  QTensorInfo out;
  out.id = ModelQuantState::new_tensor_id();
  op.outputs.push_back(out);
  ModelQuantState::TensorRecord r;
  r.record = op.global_index;
  model_->tensors()[out.id] = r;
  op.has_scalar = call.has_scalar;
  op.scalar = call.scalar;
  op.scalar_first = call.scalar_first;
  if (call.params != nullptr && def.copy_params != nullptr) op.params = def.copy_params(call.params);
  if (call.params != nullptr && def.params_fingerprint != nullptr) op.params_fingerprint = def.params_fingerprint(call.params);
  model_->set_dirty(true);
  return op;
}

namespace {

// Whether a layer of class `type` runs op `kind` in its forward: the OpDef's layer when it names
// one, else the op's name matched against the class ("conv2d" - "Conv2d", "conv_transpose2d" -
// "ConvTranspose2d", "batch_norm" - "BatchNorm2d"): lowercase, underscores dropped, a prefix.
bool layer_runs(const OpDef& def, OpKind kind, const std::string& type) {
  if (def.layer != nullptr) return type == def.layer;
  auto norm = [](const std::string& v) {
    std::string o;
    for (char c : v) {
      if (c != '_') o.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
    return o;
  };
  const std::string op = norm(op_name(kind)), cls = norm(type);
  return !op.empty() && cls.compare(0, op.size(), op) == 0;
}

}  // namespace

void QuantInterceptor::check_layer_bypass(const OpCall& call, const OpDef& def, const AutoQuantizationState& s,
                                          const QConfigPtr& qconfig, size_t n_act) {
  for (size_t i = n_act; i < call.inputs.size(); ++i) {
    const Tensor& w = *call.inputs[i];
    if (!w.defined()) continue;
    auto it = param_owners_.find(w.storage().get());
    if (it == param_owners_.end() || !layer_runs(def, call.kind, it->second.first->type_name())) continue;
    const nn::Module& layer = *it->second.first;
    const std::string& fqn = it->second.second;
    const auto* info = dynamic_cast<const LeafQuantInfo*>(layer.extension());
    const QConfigPtr& own = info != nullptr ? info->qconfig() : nullptr;
    const std::string what = absl::StrCat(
        op_name(call.kind), " in module \"", s.fqn(), "\" (", s.type_name(), ") runs on the parameters of layer \"",
        fqn, "\" (", layer.type_name(), ") outside that layer's call (layer->forward(x) on a built-in layer is a "
        "direct call): dbrq records it as a functional op of \"", s.fqn(), "\"");
    const bool same = (own == nullptr && qconfig == nullptr) ||
                      (own != nullptr && qconfig != nullptr && *own == *qconfig);
    DBRQ_ENSURE(same, UsageError, what, ", so the qconfig set for the layer (", own ? own->to_string() : "None",
                ") would not apply (it gets ", qconfig ? qconfig->to_string() : "None",
                "). Call the layer as (*layer)(x) or layer(x), not layer->forward(x)");
    std::lock_guard<std::mutex> lock(warned_mu_);
    if (warned_.insert({&layer, -1 - static_cast<int>(call.kind)}).second) {
      log()->warn("{}; its qconfig is the same here, but call the layer as (*layer)(x) so that per-layer settings "
                  "apply to it",
                  what);
    }
    return;
  }
}

void QuantInterceptor::note_inputs(const OpCall& call, Frame* owner, SeenOpInfo& op) {
  const size_t n_act = op_def(call.kind).activation_inputs(call.inputs.size());
  if (!op.broadcasts && op_def(call.kind).residual_add && n_act >= 2 && call.inputs.size() >= 2 &&
      call.inputs[0]->defined() && call.inputs[1]->defined() && call.inputs[0]->sizes() != call.inputs[1]->sizes()) {
    op.broadcasts = true;
    model_->set_dirty(true);
  }
  int64_t seen_ids[8];
  size_t n_seen = 0;
  for (size_t i = 0, a = 0; i < n_act && i < call.inputs.size(); ++i) {
    const Tensor& t = *call.inputs[i];
    if (!t.defined() || a >= op.inputs.size()) continue;
    QTensorInfo& in = op.inputs[a];
    const int64_t id = origin_of(t, owner->state, op.tag, i);
    if (id != in.id && std::find(in.more_ids.begin(), in.more_ids.end(), id) == in.more_ids.end()) {
      in.more_ids.push_back(id);
      model_->set_dirty(true);
    }
    if (in.trace_dtype != t.dtype() && t.dtype() == DType::kF32) in.trace_dtype = t.dtype();
    const ModelQuantState::TensorRecord* r = model_->tensor(id);
    if (r != nullptr && r->record >= 0) {
      SeenOpInfo& p = model_->record(r->record);
      const Consumer c{op.global_index, static_cast<int>(a)};
      if (std::find(p.consumers.begin(), p.consumers.end(), c) == p.consumers.end()) {
        p.consumers.push_back(c);
        model_->set_dirty(true);
      }
      // A batch norm normalizes dim 1; a linear's output features are its last dim, the same dim
      // only on 2-D tensors. On more dims the batch norm must not fold into the linear (it would
      // scale the wrong axis, silently when the sizes agree): the linear's output counts as read
      // outside a chain, so no fusion takes it.
      if (a == 0 && op_def(call.kind).fold != nullptr && p.kind == OpKind::kLinear && t.dim() != 2 &&
          !p.read_by_fp32) {
        p.read_by_fp32 = true;
        model_->set_dirty(true);
      }
      for (size_t j = 0; j < n_seen && j < 8; ++j) {
        if (seen_ids[j] == id && !p.read_twice) {
          p.read_twice = true;
          model_->set_dirty(true);
        }
      }
      if (n_seen < 8) seen_ids[n_seen++] = id;
    }
    ++a;
  }
}

int QuantInterceptor::find_or_record(const OpCall& call, Frame* owner, Frame* top, int64_t tag,
                                     const ProducerTags& producers, int order) {
  AutoQuantizationState& s = *owner->state;
  int r = s.find_record(tag, call.kind, producers, s.next_hint(owner->last_record));
  if (r < 0 && model_->phase() != Phase::kConverted) {
    QConfigPtr qconfig = s.seen_qconfig(call.kind, top->leaf, order);
    r = record_op(call, owner, top, tag, producers, order, qconfig).index;
  }
  return r;
}

Tensor QuantInterceptor::run_uncalibrated(const OpCall& call, Frame* owner, Frame* top, const std::string& why) {
  AutoQuantizationState& s = *owner->state;
  const std::string where = absl::StrCat("module \"", s.fqn(), "\" (", s.type_name(), "), ", op_name(call.kind), " (",
                                         top->leaf != nullptr ? top->leaf->fqn() : s.fqn(), ")");
  if (strict_paths_) {
    DBRQ_THROW(ControlFlowError, "uncalibrated path after convert: ", where, " ", why,
               ". Calibrate this path before convert, or convert without ConvertOptions::strict_paths to run it in "
               "fp32");
  }
  uncalibrated_.fetch_add(1, std::memory_order_relaxed);
  for (const Tensor* t : call.inputs) written_since_convert(*t);  // fp32 too, but its readers may not be
  {
    std::lock_guard<std::mutex> lock(warned_mu_);
    if (warned_.insert({&s, static_cast<int>(call.kind)}).second) {
      log()->warn("uncalibrated path after convert: {} {}; it runs in fp32 (int8 inputs dequantized)", where, why);
    }
  }
  // An fp32 run reading a fused chain's inner tensor would read the chain's result.
  for (const Tensor* t : call.inputs) {
    if (t->defined() && (t->trace_origin() & kInnerFusedBit) != 0) {
      const ModelQuantState::TensorRecord* r = model_->tensor(t->trace_origin() & ~kInnerFusedBit);
      if (r != nullptr && r->record >= 0) throw_reads_inner(where, model_->record(r->record));
    }
  }
  Tensor out = located(call.kind, site_of(owner, top, -1), [&] { return run_fp32(call); });
  const OpDef& def = op_def(call.kind);
  const size_t n_act = def.activation_inputs(call.inputs.size());
  ProducerTags producers;
  for (size_t i = 0; i < n_act && i < call.inputs.size(); ++i) {
    if (call.inputs[i]->defined()) producers.push_back(producer_tag(*call.inputs[i]));
  }
  out.set_trace_id(s.output_tag(op_tag(call, top->leaf, def, n_act, true), call.kind, producers));
  out.set_trace_origin(kUncalibratedBit);
  if (const Probes* p = probe_of_this_thread()) p->op(s, nullptr, call.kind, top->leaf != nullptr ? top->leaf->fqn() : s.fqn(), out);
  return out;
}

bool QuantInterceptor::after_fp32_record(const OpCall& call, size_t n_act) const {
  for (size_t i = 0; i < n_act && i < call.inputs.size(); ++i) {
    const int64_t o = call.inputs[i]->defined() ? call.inputs[i]->trace_origin() : 0;
    if (o == 0 || (o & (kInnerFusedBit | kUncalibratedBit)) != 0) continue;
    const ModelQuantState::TensorRecord* r = model_->tensor(o);
    if (r != nullptr && r->record >= 0) {
      const SeenOpInfo& p = model_->record(r->record);
      if (p.executor != nullptr && p.executor->fp32 && p.fusion.fused()) return true;
    }
  }
  return false;
}

Tensor QuantInterceptor::seen_op(const OpCall& call, Frame* owner, Frame* top, int order) {
  AutoQuantizationState& s = *owner->state;
  const LeafQuantInfo* leaf = top->leaf;
  const OpDef& def = op_def(call.kind);
  const size_t n_act = def.activation_inputs(call.inputs.size());
  const int64_t tag = op_tag(call, leaf, def, n_act, true);
  ProducerTags producers;
  bool reads_uncalibrated = false;
  for (size_t i = 0; i < n_act && i < call.inputs.size(); ++i) {
    if (call.inputs[i]->defined()) producers.push_back(producer_tag(*call.inputs[i]));
    reads_uncalibrated |= uncalibrated_value(*call.inputs[i]);
  }
  const Phase phase = model_->phase();
  int r = -1;
  if (model_->strict() && !owner->recording) {
    // One fixed sequence: the op at this position is the record the first call ran there.
    self_located([&] { s.check_sequence(owner->cursor, call.kind, tag, leaf); });
    r = s.first_sequence()[static_cast<size_t>(owner->cursor++)];
  } else {
    r = find_or_record(call, owner, top, tag, producers, order);
  }
  if (model_->strict() && owner->recording && r >= 0) s.first_sequence().push_back(r);
  if (r < 0) return run_uncalibrated(call, owner, top, "was never run while calibrating");
  if (__builtin_expect(reads_uncalibrated, 0) && phase == Phase::kConverted) {
    return run_uncalibrated(call, owner, top, "reads a value computed on a path never calibrated");
  }
  if (owner->last_record >= 0 && s.next_hint(owner->last_record) != r) s.set_next_hint(owner->last_record, r);
  owner->last_record = r;
  owner->path[static_cast<size_t>(r / 64) % 4] |= uint64_t{1} << (r % 64);
  SeenOpInfo& op = s.seen_ops()[static_cast<size_t>(r)];
  const OpSite where = site_of(owner, top, op.index);
  Tensor out;
  bool fp32_member = false;  // a fused chain's member computing in fp32 (after_fp32_record)
  if (phase == Phase::kConverted) {
    // An input from elsewhere than calibration saw is fine (it is brought to the parameters the
    // op was converted with), except a fused chain's inner tensor, which does not exist.
    for (size_t i = 0, a = 0; i < n_act && i < call.inputs.size(); ++i) {
      const Tensor& t = *call.inputs[i];
      if (!t.defined()) continue;
      const int64_t o = t.trace_origin();
      if (__builtin_expect((o & kInnerFusedBit) != 0, 0) && a < op.inputs.size() &&
          !expected_origin(op.inputs[a], o & ~kInnerFusedBit)) {
        const ModelQuantState::TensorRecord* pr = model_->tensor(o & ~kInnerFusedBit);
        if (pr != nullptr && pr->record >= 0) throw_reads_inner(op_name(call.kind), model_->record(pr->record));
      }
      ++a;
    }
    // A parameter or buffer read as an activation (matmul(x, w), x + pos_embedding) and written
    // since convert (load_state_dict, copy_, an in-place op): its int8 range and the op's output
    // range were calibrated on the old values, and would clip the new ones. The op runs fp32, as
    // an uncalibrated path (weighted ops re-quantize their weights instead: WeightedExec::kernel).
    // (A dynamic op takes its ranges per call; an fp32 op has none.)
    // (A dynamic or fp32 op computes right, but still marks the model stale for the ops after it.)
    const bool calibrated_ranges = !op.executor->fp32 && !(op.qconfig != nullptr && op.qconfig->is_dynamic());
    for (size_t i = 0; i < n_act && i < call.inputs.size(); ++i) {
      const void* written = written_since_convert(*call.inputs[i]);
      if (__builtin_expect(written == nullptr, 1) || !calibrated_ranges) continue;
      const std::string why = absl::StrCat("reads parameter \"", params_.at(written).front().fqn,
                                           "\", written since convert; calibration saw its old values (calibrate "
                                           "again with the new ones: prepare, calibrate, convert)");
      // An op completing a fused chain (the residual add of conv + add) cannot run apart from
      // the kernel that computed the rest of it.
      if (reads_inner_fused(call)) {
        located(call.kind, where, [&]() -> Tensor {
          DBRQ_THROW(ControlFlowError, why, "; it completes the fused ", op.fusion.name(),
                     ", which cannot run in fp32 apart from its kernel");
        });
      }
      return run_uncalibrated(call, owner, top, why);
    }
    // Its kernel's own weights (or a fused member's: a folded batch norm's statistics) written
    // since convert: re-quantizing them would be right for the weights, but the op's output range
    // and every range after it were calibrated on the old ones (load_state_dict of other weights
    // after convert: clipped, no error). It runs fp32 (the members of its chain follow), and so
    // does every quantizeable op after it. Weights computed per call are not parameters: their
    // kernels re-quantize them (WeightedExec::kernel).
    if (const auto& kp = kernel_params_[static_cast<size_t>(op.program_index)]; __builtin_expect(!kp.empty(), 0)) {
      if (const Storage* written = written_kernel_param(kp); __builtin_expect(written != nullptr, 0) && calibrated_ranges) {
        return run_uncalibrated(call, owner, top,
                                absl::StrCat("reads parameter \"", params_.at(written).front().fqn,
                                             "\", written since convert; calibration saw its old values (calibrate "
                                             "again with the new ones: prepare, calibrate, convert)"));
      }
    }
    // The same for a layer whose weight member was given another tensor since convert
    // (`conv->weight = w * 4`: no version moves, the convert-time storage is unchanged). Its
    // kernel re-quantized the new weights, with a warning, while the ranges after it stayed the
    // old weights'.
    // The same values in another tensor are no change (compared per call while it lasts). A fused
    // chain's later member (a batch norm folded into the conv) is checked by the chain's kernel.
    for (size_t k = 0; k < op.weights.size() && n_act + k < call.inputs.size() && op.fusion.position <= 0; ++k) {
      const WeightInfo& w = op.weights[k];
      const Tensor& t = *call.inputs[n_act + k];
      if (__builtin_expect(w.fqn.empty() || !w.tensor.defined() || !t.defined() || t.storage() == w.tensor.storage(), 1) ||
          !calibrated_ranges || same_bits(t, w.tensor)) {
        continue;
      }
      stale_.store(true, std::memory_order_relaxed);
      return run_uncalibrated(call, owner, top,
                              absl::StrCat("reads parameter \"", w.fqn, "\", replaced by another tensor since convert; "
                                           "calibration saw the old one (calibrate again with the new one: prepare, "
                                           "calibrate, convert)"));
    }
    // After such a read every op runs fp32: the values downstream of the parameter left the ranges
    // calibration saw (and a later call's ops may read them through the module's state).
    if (__builtin_expect(stale_.load(std::memory_order_relaxed), 0) && calibrated_ranges) {
      if (!reads_inner_fused(call)) {
        return run_uncalibrated(call, owner, top,
                                "runs after a parameter written since convert was read; calibration saw its old values "
                                "(calibrate again with the new ones: prepare, calibrate, convert)");
      }
      // Completing a chain whose base ran int8 before the read: a unary member (the relu of
      // conv + relu) computes nothing and the chain's result does not depend on the parameter; a
      // member with another operand (the residual add) would quantize that operand, which may.
      if (n_act > 1) {
        located(call.kind, where, [&]() -> Tensor {
          DBRQ_THROW(ControlFlowError, "it completes the fused ", op.fusion.name(),
                     " whose int8 kernel started before a parameter written since convert was read, and its other "
                     "operand may depend on that parameter; calibration saw the parameter's old values (calibrate "
                     "again with the new ones: prepare, calibrate, convert). The model's later calls run fp32");
        });
      }
    }
    // A fused chain's later member computes nothing of its own: its base's kernel did. When the
    // base ran fp32 (above), no input carries the chain's inner tensor, and it must compute.
    // When the base is a calibrated record that runs fp32 after convert (one relu after two calls
    // of a batch norm, one of whose inputs is never int8: the chain was fused with the other), it
    // computes in fp32, as calibration observed it.
    if (__builtin_expect(op.fusion.fused() && op.fusion.position > 0, 0) && !op.executor->fp32 &&
        !reads_inner_fused(call)) {
      if (!after_fp32_record(call, n_act)) {
        return run_uncalibrated(call, owner, top, "follows the base of its fused chain, which ran fp32");
      }
      fp32_member = true;
    }
    // An activation or add fused across a module boundary (SeenOpInfo::absorbed_by) passes on
    // (or completes) what its producer's kernel computed. Handed any other tensor there (a path
    // never calibrated in which the module before returned something else), it must compute
    // itself: fp32, as uncalibrated.
    if (__builtin_expect(op.absorbed_by >= 0, 0) && op.role != QuantRole::kNone &&
        [&] {
          const size_t k = static_cast<size_t>(op.absorbed_input);
          return k >= n_act || k >= call.inputs.size() ||
                 (call.inputs[k]->trace_origin() & ~kInnerFusedBit) != model_->record(op.absorbed_by).outputs[0].id;
        }()) {
      return run_uncalibrated(call, owner, top, "reads another tensor than the one calibration saw it fused with");
    }
    ConvertedOp* exec = program_[static_cast<size_t>(op.program_index)].get();
    out = located(call.kind, where, [&] { return fp32_member ? run_fp32(call) : exec->run(call); });
    // An inner output's storage holds the chain's result (or nothing yet): user code reading it
    // raises (unless the chain runs fp32, unfused). A chain's last op returns its predecessor's
    // tensor: the chain's result, readable again.
    out.set_value_withheld(inner_output(op) && !op.executor->fp32 && !fp32_member);
    if (const Probes* p = probe_of_this_thread()) p->op(s, &op, call.kind, op.fqn, out);
  } else {
    note_inputs(call, owner, op);
    // A record loaded from a quant-state file gets the weights a file cannot hold (computed at
    // run time) from its first call.
    for (size_t k = 0; k < op.weights.size() && n_act + k < call.inputs.size(); ++k) {
      if (op.weights[k].missing) {
        op.weights[k].tensor = *call.inputs[n_act + k];
        op.weights[k].missing = false;
      }
    }
    const bool observe = phase == Phase::kCalibrating && model_->observers_enabled();
    auto observe_inputs = [&] {
      for (size_t k = 0; k < op.input_observers.size() && k < call.inputs.size(); ++k) {
        if (op.input_observers[k] >= 0) {
          model_->slot(op.input_observers[k]).observe_once(*call.inputs[k], model_->call_count(),
                                                           static_cast<uint64_t>(op.global_index) << 8 | k);
        }
      }
    };
    out = located(call.kind, where, [&] {
      // The op runs before its inputs are observed, so an input it rejects is reported by the op
      // ("conv2d: input must have dtype f32") rather than by an observer. Each observer still sees
      // its tensors in the same order. An in-place op overwrites its input: observe that first.
      if (observe && call.inplace) observe_inputs();
      // Observed calls compute as PyTorch FX's prepared model does (fold_calibration.h); with
      // observers off the model computes exactly the fp32 model.
      Tensor o = observe ? run_observed(s, op, call) : run_fp32(call);
      if (observe && !call.inplace) observe_inputs();
      if (observe && op.output_observer >= 0) model_->observer(op.output_observer).observe(o);
      // An inner output of a fused chain (or a chain that absorbed another module's activation):
      // kept in case a later path breaks the chain.
      if (observe && op.output_observer < 0 && op.qconfig != nullptr &&
          ((op.fusion.fused() && op.fusion.position + 1 < static_cast<int>(op.fusion.members.size())) ||
           (op.absorbs >= 0 && op.role != QuantRole::kNone))) {
        model_->inner_output_observer(op.global_index, op.qconfig->activation).observe(o);
      }
      return o;
    });
  }
  out.set_trace_id(op.out_tag);
  // (An fp32 record's output is its own: the chain it is a base of runs int8 only from other bases.)
  const bool inner = phase == Phase::kConverted && inner_output(op) && !op.executor->fp32 && !fp32_member;
  out.set_trace_origin(op.outputs[0].id | (inner ? kInnerFusedBit : 0));
  return out;
}

// A module called from inside the prepared model that prepare did not see (every module of the
// tree has an extension; non-traceable subtrees run with interception suspended): it is not
// registered in the model. With parameters that is a bug, never a choice: typically a holder member
// assigned a new module after register_module, which (as in libtorch) leaves the registered module
// in the model. The call would run weights that state_dict, load_state_dict and the quantization
// state never see, and silently in fp32. Parameter-free modules built in forward (a temporary
// nn::ReLU()) run fp32, as before.
void QuantInterceptor::check_unregistered(const nn::Module& module) const {
  if (module.named_parameters().empty() && module.named_buffers().empty()) return;
  std::string caller = "?";
  for (auto it = tls_stack.rbegin(); it != tls_stack.rend(); ++it) {
    if (it->state != nullptr) {
      caller = absl::StrCat("\"", it->state->fqn(), "\" (", it->state->type_name(), ")");
      break;
    }
  }
  DBRQ_THROW(UsageError, "a ", module.type_name(), " module with parameters was called from module ", caller,
             ", but it is not part of the prepared model: it is not registered in it. A holder member assigned a "
             "new module after register_module (`fc = register_module(\"fc\", ...); fc = nn::Linear(...)`) calls "
             "the new, unregistered module while the model keeps the registered one, as in libtorch: its weights "
             "are not in state_dict / load_state_dict and it cannot be quantized. Register the module that "
             "forward calls (assign the holder, then register it; or replace_module)");
}

// A module of the tree entered while its parent user module is not being called: the parent's
// forward ran as a direct call (`m->as<Block>()->forward(x)`, `list->at<Block>(i)->forward(x)`
// return the Impl, whose forward is the body), so the parent's own ops are recorded in the caller
// under the caller's qconfig. Refused when the parent's qconfig differs (a qconfig set for it would
// silently not apply), as check_layer_bypass does for layers. Containers that are iterated rather
// than called (ModuleList, ModuleDict, Sequential) are not parents in this sense.
void QuantInterceptor::check_parent_bypass(const std::string& fqn) const {
  const size_t dot = fqn.rfind('.');
  if (dot == std::string::npos || fqn.empty()) return;
  const std::string parent = fqn.substr(0, dot);
  const AutoQuantizationState* owner = nullptr;
  for (auto it = tls_stack.rbegin(); it != tls_stack.rend(); ++it) {
    if (it->owner != this) break;
    if (it->state == nullptr) continue;
    if (it->state->fqn() == parent) return;
    if (owner == nullptr) owner = it->state;
  }
  if (owner == nullptr || model_->root() == nullptr) return;
  const nn::Module* p = model_->root()->find_module(parent);
  if (p == nullptr || p->is_leaf()) return;
  const std::string& type = p->type_name();
  if (type == "ModuleList" || type == "ModuleDict" || type == "Sequential") return;
  const QConfigPtr own = model_->mapping().for_module(type, parent);
  const QConfigPtr got = model_->mapping().for_module(owner->type_name(), owner->fqn());
  const bool same = (own == nullptr && got == nullptr) || (own != nullptr && got != nullptr && *own == *got);
  DBRQ_ENSURE(same, UsageError, "module \"", fqn, "\" runs inside module \"", owner->fqn(), "\" (",
              owner->type_name(), ") while its parent \"", parent, "\" (", type,
              ") is not being called: the parent's forward was called directly (m->as<X>()->forward(x), "
              "list->at<X>(i)->forward(x) or a std::shared_ptr<XImpl>'s ->forward(x) run the body outside the hooks), "
              "so its ops would be recorded in \"", owner->fqn(), "\" and the qconfig set for \"", parent, "\" (",
              own ? own->to_string() : "None", ") would not apply (they get ", got ? got->to_string() : "None",
              "). Call the module through its holder or its call operator: (*m->as<X>())(x), m->forward_unary(x)");
}

void QuantInterceptor::enter_unconverted() {
  std::lock_guard<std::mutex> lock(unconverted_mu_);
  const std::thread::id me = std::this_thread::get_id();
  if (unconverted_depth_ > 0 && unconverted_thread_ != me) {
    const nn::Module* root = model_->root();
    DBRQ_THROW(UsageError, root != nullptr ? root->type_name() : std::string("the model"),
               " is called from two threads at once before convert: tracing and calibration record paths and feed "
               "observers without locks, one call at a time. Calibrate from one thread, or give each thread a replica "
               "(prepare it, calibrate it) and fold them into one with merge_calibration; converted models may be "
               "called from any number of threads");
  }
  unconverted_thread_ = me;
  if (unconverted_depth_++ == 0) {
    // Written between two observed calls: calibration saw it change (a mask set before each call,
    // a training step). Writes around calls that observe nothing do not count.
    const bool observing = model_->phase() == Phase::kCalibrating && model_->observers_enabled();
    for (StorageVersion& v : storage_versions_) {
      v.at_call_start = v.storage->version();
      if (observing && observed_once_ && !v.varies && v.at_call_start != v.at_observed_end) v.varies = true;
    }
  }
}

void QuantInterceptor::leave_unconverted() noexcept {
  std::lock_guard<std::mutex> lock(unconverted_mu_);
  if (--unconverted_depth_ == 0) {
    unconverted_thread_ = std::thread::id();
    // Also after a failed call: what it wrote, forward wrote.
    const bool observed = model_->phase() == Phase::kCalibrating && model_->observers_enabled();
    if (!observed) return;
    observed_once_ = true;
    auto& calibrated = model_->calibrated_values();
    for (StorageVersion& v : storage_versions_) {
      const uint64_t end = v.storage->version();
      v.at_observed_end = end;
      v.varies |= end != v.at_call_start;  // written by the call: a running state, a cache
      try {
        if (v.varies) {
          calibrated.erase(v.name);
          model_->varied_values().insert(v.name);
        } else {  // (hashed again only when written: a file's values loaded meanwhile give way)
          if (v.hashed_version != end) v.hash = hash_values(v);
          v.hashed_version = end;
          calibrated[v.name] = v.hash;
        }
      } catch (...) {  // unreadable contents (or no memory): not checked
        calibrated.erase(v.name);
        v.hashed_version = ~uint64_t{0};
      }
    }
  }
}

void QuantInterceptor::on_module_enter(nn::Module& module, absl::Span<Tensor* const> inputs) {
  Frame f;
  f.module = &module;
  f.owner = this;
  nn::ModuleExtension* ext = module.extension();
  const bool outermost = tls_stack.empty() || tls_stack.back().owner != this;
  const Phase phase = model_->phase();
  // Before anything of the model's state is touched; the frame takes it over once pushed.
  UnconvertedHold hold;
  if (outermost && phase != Phase::kConverted) {
    enter_unconverted();
    hold.owner = this;
    f.holds_calibration = true;
  }
  if (ext == nullptr && !outermost) check_unregistered(module);
  if (!outermost && phase == Phase::kTracing) {
    if (auto* l = dynamic_cast<LeafQuantInfo*>(ext)) {
      check_parent_bypass(l->fqn());
    } else if (auto* st = dynamic_cast<AutoQuantizationState*>(ext)) {
      check_parent_bypass(st->fqn());
    }
  }
  if (outermost) {
    // The model's inputs are fp32 sources, the same on every call.
    for (size_t k = 0; k < inputs.size(); ++k) {
      Tensor* t = inputs[k];
      if (!t->defined()) continue;
      const uint64_t source = fingerprint_mix(static_cast<uint64_t>(module_input_tag(k)), kModelInputSalt);
      t->set_trace_origin(phase != Phase::kConverted ? model_->add_fp32_source(source) : model_->fp32_source_id(source));
    }
    f.created_mark = tls_created.size();
    if (phase == Phase::kCalibrating) model_->count_call();
  }
  if (auto* untraced = dynamic_cast<NonTraceableInfo*>(ext)) {
    // Module I/O hook: the subtree runs fp32, untraced, with interception suspended inside.
    f.fp32_region = true;
    if (phase == Phase::kConverted) {
      f.reads_uncalibrated = std::any_of(inputs.begin(), inputs.end(), [](const Tensor* t) { return uncalibrated_value(*t); });
    }
    // Its parameters and buffers are read where no op is seen: one written since convert reaches
    // the int8 ops after the subtree with values calibration never saw.
    if (phase == Phase::kConverted) {
      for (const Tensor& t : untraced->state()) {
        if (const void* written = written_since_convert(t); __builtin_expect(written != nullptr, 0)) {
          self_located([&] { stale_read(written, absl::StrCat("the untraced module \"", untraced->fqn(), "\"")); });
        }
      }
    }
    // The subtree reads its inputs outside any record: no fusion may hide them (and after
    // convert, a fused chain's inner tensor is not there to read).
    for (Tensor* t : inputs) {
      if (!t->defined()) continue;
      const int64_t o = t->trace_origin();
      if (phase != Phase::kConverted) {
        const ModelQuantState::TensorRecord* r = model_->tensor(o);
        if (r != nullptr && r->record >= 0 && !model_->record(r->record).read_by_fp32) {
          model_->record(r->record).read_by_fp32 = true;
          model_->set_dirty(true);
        }
      } else if ((o & kInnerFusedBit) != 0) {
        const ModelQuantState::TensorRecord* r = model_->tensor(o & ~kInnerFusedBit);
        if (r != nullptr && r->record >= 0) {
          self_located([&] {
            throw_reads_inner(absl::StrCat("the untraced module ", module.type_name()), model_->record(r->record));
          });
        }
      }
    }
    {
      InterceptorScope none(nullptr);
      for (Tensor* t : inputs) {
        if (!t->defined()) continue;
        if (phase == Phase::kTracing) continue;  // nothing observes or is int8 yet
        Tensor caller = *t;
        if (t->is_quantized()) *t = dequantize(*t);
        f.given.push_back({std::move(caller), *t, t->storage()->version()});
      }
    }
    f.saved = detail::tls_interceptor;
    detail::tls_interceptor = nullptr;
    tls_stack.push_back(f);
    hold.owner = nullptr;
    return;
  }
  if (auto* s = dynamic_cast<AutoQuantizationState*>(ext)) {
    f.state = s;
    f.recording = !s->recorded();
    // Inside the module, its inputs are "input k", wherever the caller got them from: a module's
    // records do not depend on where it is called from.
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (inputs[k]->defined()) inputs[k]->set_trace_id(module_input_tag(k));
    }
    if (phase == Phase::kConverted) {
      if (const Probes* p = probe_of_this_thread()) p->module(*s, false, f.path, {});
    }
  } else if (auto* l = dynamic_cast<LeafQuantInfo*>(ext)) {
    f.leaf = l;
  }
  tls_stack.push_back(f);
  hold.owner = nullptr;
  if (outermost && phase == Phase::kCalibrating && model_->observers_enabled()) {
    save_calibration(*model_);
    tls_stack.back().snapshot = true;
  }
}

void QuantInterceptor::on_module_exit(nn::Module& module, absl::Span<Tensor* const> outputs) {
  DBRQ_CHECK(!tls_stack.empty() && tls_stack.back().module == &module, "module stack out of order");
  {
    // Checked while this module's frame is still on the stack: if it throws, on_module_unwind pops
    // exactly this frame.
    const Frame& top = tls_stack.back();
    if (!top.fp32_region && top.state != nullptr && model_->strict() && !top.recording) {
      self_located([&] { top.state->check_sequence_end(top.cursor); });
    }
    // The model's outputs are read by the user. While tracing and calibrating that is a reader
    // outside the records (no fusion across modules may hide such a tensor); after convert, an
    // uncalibrated path returning a fused chain's inner tensor would hand out the chain's result
    // (a conv's output with its relu applied) or an unfilled tensor (a conv waiting for its add).
    const bool outermost_call = tls_stack.size() == 1 || tls_stack[tls_stack.size() - 2].owner != this;
    if (outermost_call && !top.fp32_region) {
      for (Tensor* t : outputs) {
        if (!t->defined()) continue;
        const int64_t o = t->trace_origin();
        if (model_->phase() != Phase::kConverted) {
          const ModelQuantState::TensorRecord* r = model_->tensor(o);
          if (r != nullptr && r->record >= 0 && !model_->record(r->record).model_output) {
            model_->record(r->record).model_output = true;
            model_->set_dirty(true);
          }
        } else if ((o & kInnerFusedBit) != 0) {
          const ModelQuantState::TensorRecord* r = model_->tensor(o & ~kInnerFusedBit);
          if (r != nullptr && r->record >= 0) {
            self_located([&] { throw_reads_inner("the model's output", model_->record(r->record)); });
          }
        } else if (t->value_withheld()) {
          // The same, reached through a raw view (Tensor::raw_view: no trace origin, so the records
          // did not see it escape while calibrating). Its lazily dequantized copy would have read
          // the storage directly: the chain's result.
          self_located([&] { (void)t->data_ptr(); });
        }
      }
    }
  }
  Frame f = tls_stack.back();
  tls_stack.pop_back();
  UnconvertedHold hold;  // released when this function returns: after the analysis below
  if (f.holds_calibration) hold.owner = this;
  const Phase phase = model_->phase();
  const bool outermost = tls_stack.empty() || tls_stack.back().owner != this;
  if (f.fp32_region) {
    detail::tls_interceptor = f.saved;
    // An input the subtree wrote in place (x.mul_(2) in an untraced module): in fp32 the caller's
    // tensor changes with it. While calibrating, the observer of its values sees what was written
    // too (the ops after the subtree read them). After convert the subtree wrote a dequantized
    // copy: the values go back into the caller's codes (write_back_inplace: as codes when they fit
    // the calibrated range, else the storage is superseded and a later read raises).
    for (Frame::GivenInput& g : f.given) {
      if (g.given.storage()->version() == g.version) continue;
      if (phase == Phase::kConverted) {
        if (g.caller.storage() != g.given.storage()) {
          InterceptorScope none(nullptr);
          write_back_inplace(g.caller, g.given, OpKind::kCopy);
        }
      } else if (phase == Phase::kCalibrating && model_->observers_enabled()) {
        const ModelQuantState::TensorRecord* r = model_->tensor(g.caller.trace_origin());
        Observer* o = r != nullptr && r->slot >= 0 ? model_->slot(r->slot).observer.get() : nullptr;
        if (o != nullptr) o->observe(g.given);
      }
    }
    f.given.clear();
    for (size_t j = 0; j < outputs.size(); ++j) {
      Tensor* t = outputs[j];
      if (!t->defined()) continue;
      const int64_t tag = child_output_tag(module_fingerprint(module), j);
      t->set_trace_id(tag);
      const uint64_t source = static_cast<uint64_t>(tag);
      t->set_trace_origin(phase != Phase::kConverted ? model_->add_fp32_source(source)
                                                     : model_->fp32_source_id(source) |
                                                           (f.reads_uncalibrated ? kUncalibratedBit : 0));
    }
  } else if (f.leaf == nullptr) {
    if (f.state != nullptr) {
      if (f.recording) f.state->set_recorded();
      f.state->note_path(f.path, nullptr);
      if (phase == Phase::kConverted) {
        if (const Probes* p = probe_of_this_thread()) p->module(*f.state, true, f.path, outputs);
      }
    }
    // A non-leaf module's outputs escape it: no fusion may hide them. For the caller they are
    // "output j of this module".
    for (size_t j = 0; j < outputs.size(); ++j) {
      Tensor* t = outputs[j];
      if (!t->defined()) continue;
      if (phase != Phase::kConverted) {
        const ModelQuantState::TensorRecord* r = model_->tensor(t->trace_origin());
        if (r != nullptr && r->record >= 0) {
          SeenOpInfo& p = model_->record(r->record);
          if (!p.escapes) {
            p.escapes = true;
            model_->set_dirty(true);
          }
        }
      }
      t->set_trace_id(child_output_tag(f.state != nullptr ? f.state->fqn_fingerprint() : module_fingerprint(module), j));
    }
  }
  if (!outermost) return;
  // No model call of this thread is in flight: a fused conv whose add never ran (its result was
  // dropped unread) is abandoned, and the memoized input quantization is forgotten.
  if (tls_stack.empty()) drop_call_state_on_this_thread();
  if (f.snapshot) tls_snapshots.pop_back();  // the call succeeded: keep what the observers saw
  tls_created.resize(f.created_mark);        // and the records it added
  // Folded results no batch norm took; only when no call of another model is in flight either (a
  // model called from another's forward, between its conv and batch norm, kept the outer one's).
  if (tls_stack.empty()) drop_folds_on_this_thread();
  // A path added while calibrating: placement, fusions and observers over every path so far.
  if (phase == Phase::kCalibrating && model_->dirty()) analyze_program(*model_);
  // The model's outputs are fp32 unless configured otherwise.
  if (!int8_outputs_ && phase == Phase::kConverted) {
    InterceptorScope none(nullptr);
    dequantize_returned_outputs(outputs);
  }
}

void QuantInterceptor::on_module_error(nn::Module& module, const Error& error) {
  // Errors from ops are located where the op runs; this is for a module's own code (a check in
  // a user's forward, Tensor::size on a wrong-rank input, ...). Modules outside the prepared tree
  // have no name; the next enclosing one will say where.
  nn::ModuleExtension* ext = module.extension();
  if (auto* s = dynamic_cast<AutoQuantizationState*>(ext)) {
    error.rethrow_with_location(absl::StrCat("in module \"", s->fqn(), "\" (", s->type_name(), "): "));
  }
  if (auto* l = dynamic_cast<LeafQuantInfo*>(ext)) {
    error.rethrow_with_location(absl::StrCat("in module \"", l->fqn(), "\" (", module.type_name(), "): "));
  }
  if (auto* n = dynamic_cast<NonTraceableInfo*>(ext)) {
    error.rethrow_with_location(absl::StrCat("in module \"", n->fqn(), "\" (", module.type_name(), ", not traced): "));
  }
}

void QuantInterceptor::rollback_records(size_t mark) noexcept {
  // Newest first: each is the last record of its module and of the model.
  while (tls_created.size() > mark) {
    auto [state, index] = tls_created.back();
    tls_created.pop_back();
    SeenOpInfo& op = state->seen_ops()[static_cast<size_t>(index)];
    const int g = op.global_index;
    for (const QTensorInfo& in : op.inputs) {
      for (int64_t id : origins_of(in)) {
        const ModelQuantState::TensorRecord* r = model_->tensor(id);
        if (r == nullptr || r->record < 0 || r->record == g) continue;
        auto& cs = model_->record(r->record).consumers;
        cs.erase(std::remove_if(cs.begin(), cs.end(), [g](const Consumer& c) { return c.record == g; }), cs.end());
      }
    }
    for (const QTensorInfo& o : op.outputs) model_->tensors().erase(o.id);
    std::vector<int>& seq = state->first_sequence();
    seq.erase(std::remove(seq.begin(), seq.end(), index), seq.end());
    state->remove_last_record();
    model_->records().pop_back();
  }
}

void QuantInterceptor::on_module_unwind(nn::Module& module) noexcept {
  // Pop this module's frame (and any frame left above it by a failure in a hook). When the frame
  // is not there (on_module_enter failed before pushing it, or on_module_exit after popping it),
  // pop nothing: the callers' frames must stay for a caller that catches the error and goes on.
  // Released last, after the rollback below.
  absl::InlinedVector<QuantInterceptor*, 2> holds;
  size_t depth = tls_stack.size();
  while (depth > 0 && tls_stack[depth - 1].module != &module) --depth;
  while (depth > 0 && tls_stack.size() >= depth) {
    Frame f = tls_stack.back();
    tls_stack.pop_back();
    if (f.holds_calibration) holds.push_back(static_cast<QuantInterceptor*>(const_cast<void*>(f.owner)));
    if (f.fp32_region) detail::tls_interceptor = f.saved;
    if (f.snapshot) restore_calibration();
    const bool outermost = tls_stack.empty() || tls_stack.back().owner != this;
    // A failed call leaves no trace: the records it added go too.
    if (outermost && f.owner == this) rollback_records(f.created_mark);
  }
  // Nothing of this thread is in flight any more: a fused conv whose add never ran is abandoned
  // (and the memoized input quantization forgotten).
  if (tls_stack.empty()) {
    drop_call_state_on_this_thread();
    drop_folds_on_this_thread();
  }
  for (QuantInterceptor* q : holds) q->leave_unconverted();
}

}  // namespace dbrq::tracer
