#include "tracer/interceptor.h"

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "runtime/ops.h"
#include "tracer/executors.h"

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

QuantInterceptor::QuantInterceptor(std::shared_ptr<ModelQuantState> model, nn::Module& root)
    : model_(std::move(model)) {
  for (auto& [name, t] : root.named_parameters()) param_names_[t.storage().get()] = name;
}

QuantInterceptor& QuantInterceptor::of(const nn::Module& model, const char* what) {
  auto* i = quant_state_of(model) != nullptr ? dynamic_cast<QuantInterceptor*>(model.interceptor()) : nullptr;
  DBRQ_ENSURE(i != nullptr, UsageError, what, ": ", model.type_name(),
              " is not a prepared model; call dbrq::prepare(model, example_inputs) first");
  return *i;
}

void QuantInterceptor::convert(bool int8_outputs) {
  program_ = convert_model(*model_);
  int8_outputs_ = int8_outputs;
  model_->set_phase(Phase::kConverted);
}

std::string QuantInterceptor::weight_fqn(const Tensor& t) const {
  if (!t.defined()) return "";
  auto it = param_names_.find(t.storage().get());
  return it == param_names_.end() ? "" : it->second;
}

void QuantInterceptor::assign_ids(const OpCall& call) {
  for (const Tensor* t : call.inputs) {
    if (!t->defined()) continue;
    if (model_->tensor(t->trace_id()) != nullptr) continue;
    // First sight of a tensor made outside any op (model input, constant, parameter): an fp32
    // source. The id is written into the caller's Tensor object, which only the tracer reads.
    const int64_t id = ModelQuantState::new_tensor_id();
    const_cast<Tensor*>(t)->set_trace_id(id);
    model_->tensors()[id] = {t->dtype(), DType::kF32, -1};
  }
}

Tensor QuantInterceptor::on_op(const OpCall& call) {
  Frame* top = nullptr;
  Frame* owner = owner_frame(&top);
  switch (model_->phase()) {
    case Phase::kTracing:
      return trace_op(call, owner, top);
    case Phase::kCalibrating:
      return observe_op(call, owner, top);
    case Phase::kConverted:
      return convert_op(call, owner, top);
  }
  return located(call.kind, site_of(owner, top, -1), [&] { return run_fp32(call); });
}

namespace {

QTensorInfo info_of(const Tensor& t, ModelQuantState& m) {
  QTensorInfo i;
  i.id = t.trace_id();
  i.trace_dtype = t.dtype();
  if (const auto* r = m.tensor(i.id)) i.inf_dtype = r->inf_dtype;
  return i;
}

const LeafQuantInfo* leaf_of(const Frame* top) { return top != nullptr ? top->leaf : nullptr; }

}  // namespace

Tensor QuantInterceptor::trace_op(const OpCall& call, Frame* owner, Frame* top) {
  assign_ids(call);
  const LeafQuantInfo* leaf = leaf_of(top);
  QConfigPtr qconfig = owner != nullptr ? owner->state->seen_qconfig(call.kind, leaf) : nullptr;
  const OpDef& def = op_def(call.kind);
  Tensor out = located(call.kind, site_of(owner, top, qconfig != nullptr ? owner->cursor : -1),
                       [&] { return call.run(call); });
  const int64_t out_id = ModelQuantState::new_tensor_id();
  out.set_trace_id(out_id);
  model_->tensors()[out_id] = {out.dtype(), out.dtype(), -1};

  TraceEvent e;
  e.kind = TraceEvent::Kind::kOtherOp;
  const size_t n_act = def.activation_inputs(call.inputs.size());
  for (size_t i = 0; i < n_act && i < call.inputs.size(); ++i) {
    if (call.inputs[i]->defined()) e.inputs.push_back(call.inputs[i]->trace_id());
  }
  e.outputs.push_back(out_id);

  if (qconfig != nullptr) {
    AutoQuantizationState& s = *owner->state;
    if (owner->recording) {
      SeenOpInfo op;
      op.index = owner->cursor;
      op.kind = call.kind;
      op.fqn = leaf != nullptr ? leaf->fqn() : s.fqn();
      op.leaf = leaf != nullptr ? top->module : nullptr;
      op.qconfig = qconfig;
      for (size_t i = 0; i < n_act && i < call.inputs.size(); ++i) {
        if (call.inputs[i]->defined()) op.inputs.push_back(info_of(*call.inputs[i], *model_));
      }
      for (size_t i = n_act; i < call.inputs.size(); ++i) {
        op.weights.push_back({weight_fqn(*call.inputs[i]), *call.inputs[i]});
      }
      op.outputs.push_back(info_of(out, *model_));
      op.has_scalar = call.has_scalar;
      op.scalar = call.scalar;
      op.scalar_first = call.scalar_first;
      if (call.params != nullptr && def.copy_params != nullptr) op.params = def.copy_params(call.params);
      s.seen_ops().push_back(std::move(op));
      e.kind = TraceEvent::Kind::kSeenOp;
      e.state = &s;
      e.op_index = owner->cursor;
    } else {
      // A module called again during the trace: its ops were recorded on its first call.
      SeenOpInfo& op = self_located([&]() -> SeenOpInfo& {
        return s.validate_cur_op(owner->cursor, call.kind, leaf != nullptr ? top->module : nullptr, leaf);
      });
      e.kind = TraceEvent::Kind::kSeenOp;
      e.state = &s;
      e.op_index = op.index;
      // Later calls share the first call's record; their tensors alias its tensors.
      e.repeat = true;
    }
    ++owner->cursor;
  } else if (owner != nullptr && owner->recording) {
    owner->state->non_quant_ops().push_back(
        {call.kind, leaf != nullptr ? leaf->fqn() : owner->state->fqn(),
         model_->seen_kind(call.kind) ? "qconfig is None" : "no int8 kernel"});
  }
  model_->events().push_back(std::move(e));
  return out;
}

Tensor QuantInterceptor::observe_op(const OpCall& call, Frame* owner, Frame* top) {
  const LeafQuantInfo* leaf = leaf_of(top);
  QConfigPtr qconfig = owner != nullptr ? owner->state->seen_qconfig(call.kind, leaf) : nullptr;
  if (qconfig == nullptr) return located(call.kind, site_of(owner, top, -1), [&] { return run_fp32(call); });
  SeenOpInfo& op = self_located([&]() -> SeenOpInfo& {
    return owner->state->validate_cur_op(owner->cursor, call.kind, leaf != nullptr ? top->module : nullptr, leaf);
  });
  ++owner->cursor;
  const bool observe = model_->observers_enabled();
  auto observe_inputs = [&] {
    for (size_t k = 0; k < op.input_observers.size() && k < call.inputs.size(); ++k) {
      if (op.input_observers[k] >= 0) model_->observer(op.input_observers[k]).observe(*call.inputs[k]);
    }
  };
  return located(call.kind, site_of(owner, top, op.index), [&] {
    // The op runs before its inputs are observed, so an input it rejects is reported by the op
    // ("conv2d: input must have dtype f32") rather than by an observer. Each observer still sees
    // its tensors in the same order. An in-place op overwrites its input: observe that first.
    if (observe && call.inplace) observe_inputs();
    Tensor out = run_fp32(call);
    if (observe && !call.inplace) observe_inputs();
    if (observe && op.output_observer >= 0) model_->observer(op.output_observer).observe(out);
    return out;
  });
}

Tensor QuantInterceptor::convert_op(const OpCall& call, Frame* owner, Frame* top) {
  const LeafQuantInfo* leaf = leaf_of(top);
  QConfigPtr qconfig = owner != nullptr ? owner->state->seen_qconfig(call.kind, leaf) : nullptr;
  if (qconfig == nullptr) return located(call.kind, site_of(owner, top, -1), [&] { return run_fp32(call); });
  SeenOpInfo& op = self_located([&]() -> SeenOpInfo& {
    return owner->state->validate_cur_op(owner->cursor, call.kind, leaf != nullptr ? top->module : nullptr, leaf);
  });
  ++owner->cursor;
  const OpSite site = site_of(owner, top, op.index);
  ConvertedOp* exec = program_[op.program_index].get();
  if (__builtin_expect(probe_ != nullptr, 0)) {
    Tensor out = located(call.kind, site, [&] { return exec->run(call); });
    probe_(*owner->state, op, out);
    return out;
  }
  return located(call.kind, site, [&] { return exec->run(call); });
}

void QuantInterceptor::on_module_enter(nn::Module& module, absl::Span<Tensor* const> inputs) {
  Frame f;
  f.module = &module;
  f.owner = this;
  nn::ModuleExtension* ext = module.extension();
  if (dynamic_cast<NonTraceableInfo*>(ext) != nullptr) {
    // Module I/O hook: the subtree runs fp32, untraced, with interception suspended inside.
    f.fp32_region = true;
    if (model_->phase() != Phase::kTracing) {
      InterceptorScope none(nullptr);
      for (Tensor* t : inputs) {
        if (t->defined() && t->is_quantized()) *t = dequantize(*t);
      }
    }
    f.saved = detail::tls_interceptor;
    detail::tls_interceptor = nullptr;
    tls_stack.push_back(f);
    return;
  }
  if (auto* s = dynamic_cast<AutoQuantizationState*>(ext)) {
    f.state = s;
    f.recording = model_->phase() == Phase::kTracing && !s->recorded();
  } else if (auto* l = dynamic_cast<LeafQuantInfo*>(ext)) {
    f.leaf = l;
  }
  if (model_->phase() == Phase::kTracing) {
    for (Tensor* t : inputs) {
      if (!t->defined() || model_->tensor(t->trace_id()) != nullptr) continue;
      const int64_t id = ModelQuantState::new_tensor_id();
      t->set_trace_id(id);
      model_->tensors()[id] = {t->dtype(), DType::kF32, -1};
    }
  }
  const bool outermost = tls_stack.empty() || tls_stack.back().owner != this;
  tls_stack.push_back(f);
  if (outermost && model_->phase() == Phase::kCalibrating && model_->observers_enabled()) {
    save_calibration(*model_);
    tls_stack.back().snapshot = true;
  }
}

void QuantInterceptor::on_module_exit(nn::Module& module, absl::Span<Tensor* const> outputs) {
  DBRQ_CHECK(!tls_stack.empty() && tls_stack.back().module == &module, "module stack out of order");
  {
    // Validate while this module's frame is still on the stack: if it throws, on_module_unwind pops
    // exactly this frame (popping first made the unwind pop the callers' frames too).
    const Frame& top = tls_stack.back();
    if (!top.fp32_region && top.state != nullptr && !top.recording) {
      self_located([&] { top.state->validate_op_count(top.cursor); });
    }
  }
  Frame f = tls_stack.back();
  tls_stack.pop_back();
  if (f.snapshot) tls_snapshots.pop_back();  // the call succeeded: keep what the observers saw
  if (f.fp32_region) {
    detail::tls_interceptor = f.saved;
    if (model_->phase() == Phase::kTracing) {
      for (Tensor* t : outputs) {
        if (!t->defined()) continue;
        const int64_t id = ModelQuantState::new_tensor_id();
        t->set_trace_id(id);
        model_->tensors()[id] = {t->dtype(), DType::kF32, -1};
      }
    }
    return;
  }
  if (f.state != nullptr && f.recording) f.state->set_recorded();
  // A layer's output is its op's output, not a use of it; only non-leaf module outputs escape.
  if (model_->phase() == Phase::kTracing && f.leaf == nullptr) {
    TraceEvent e;
    e.kind = TraceEvent::Kind::kEscape;
    for (Tensor* t : outputs) {
      if (t->defined()) e.inputs.push_back(t->trace_id());
    }
    e.where = f.state != nullptr ? f.state->fqn() : module.type_name();
    if (!e.inputs.empty()) model_->events().push_back(std::move(e));
  }
  // The model's outputs are fp32 unless configured otherwise.
  const bool outermost = tls_stack.empty() || tls_stack.back().owner != this;
  if (outermost && !int8_outputs_ && model_->phase() == Phase::kConverted) {
    InterceptorScope none(nullptr);
    for (Tensor* t : outputs) {
      if (t->defined() && t->is_quantized()) *t = dequantize(*t);
    }
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

void QuantInterceptor::on_module_unwind(nn::Module& module) noexcept {
  // Pop this module's frame (and any frame left above it by a failure in a hook). When the frame
  // is not there (on_module_enter failed before pushing it, or on_module_exit after popping it),
  // pop nothing: the callers' frames must stay for a caller that catches the error and goes on.
  size_t depth = tls_stack.size();
  while (depth > 0 && tls_stack[depth - 1].module != &module) --depth;
  while (depth > 0 && tls_stack.size() >= depth) {
    Frame f = tls_stack.back();
    tls_stack.pop_back();
    if (f.fp32_region) detail::tls_interceptor = f.saved;
    if (f.snapshot) restore_calibration();
  }
  // Nothing of this thread is in flight any more: a fused conv whose add never ran is abandoned.
  if (tls_stack.empty()) drop_pending_on_this_thread();
}

}  // namespace dbrq::tracer
