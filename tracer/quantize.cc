#include "tracer/quantize.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/logging.h"
#include "tracer/convert.h"
#include "tracer/interceptor.h"
#include "tracer/internal.h"

namespace dbrq {
namespace {

std::string print_state(const nn::Module& m, int indent) {
  const AutoQuantizationState* s = quant_state_of(m);
  return s == nullptr ? "" : s->to_string(indent);
}

bool matches_any(const std::vector<std::string>& list, const std::string& s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

void detach(nn::Module& model) {
  for (auto& [fqn, m] : model.named_modules()) {
    m->set_extension(nullptr);
    m->set_interceptor(nullptr);
  }
}

tracer::QuantInterceptor& interceptor_of(const nn::Module& model, const char* what) {
  return tracer::QuantInterceptor::of(model, what);
}

void log_prepare_summary(ModelQuantState& m) {
  int ops = 0, quantized = 0, fused_chains = 0, fp32 = 0;
  for (AutoQuantizationState* s : m.states()) {
    for (const SeenOpInfo& op : s->seen_ops()) {
      ++ops;
      if (op.role != QuantRole::kNone) ++quantized;
      if (op.fusion.fused() && op.fusion.position == 0) ++fused_chains;
    }
    fp32 += static_cast<int>(s->non_quant_ops().size());
  }
  log()->info("prepare: {} modules with state, {} quantizeable ops recorded ({} to run int8, {} fused chains), "
              "{} other ops stay fp32, {} observers",
              m.states().size(), ops, quantized, fused_chains, fp32, m.num_slots());
}

void do_prepare(nn::Module& model, const std::function<void()>& run, QConfigMapping mapping, BackendConfig backend,
                const PrepareOptions& options) {
  DBRQ_ENSURE(!is_prepared(model), UsageError, "prepare: ", model.type_name(),
              " is already prepared; prepare a freshly built model");
  DBRQ_ENSURE(!model.is_leaf(), UsageError, "prepare: ", model.type_name(),
              " is a built-in layer; prepare the module that contains it (or wrap it in a Sequential)");
  mapping.validate(model);
  // A module of another prepared model (a backbone shared by two models): preparing it again would
  // replace that model's state on it, and that model would run this one's records and kernels.
  for (auto& [fqn, m] : model.named_modules()) {
    DBRQ_ENSURE(m->extension() == nullptr && m->interceptor() == nullptr, UsageError, "prepare: module \"", fqn,
                "\" (", m->type_name(), ") of ", model.type_name(), " is part of another prepared model; a module "
                "belongs to one prepared model: give this model its own instance, or call the prepared one from "
                "forward without registering it (it then runs as its own model)");
  }
  for (const std::string& n : options.non_traceable_module_names) {
    DBRQ_ENSURE(model.find_module(n) != nullptr, ValueError, "prepare: non-traceable module \"", n,
                "\" does not exist in ", model.type_name());
  }
  nn::set_module_print_hook(print_state);
  auto state = std::make_shared<ModelQuantState>(std::move(mapping), std::move(backend));
  // The prepared modules own the interceptor; it owns the model's executors after convert.
  auto interceptor = std::make_shared<tracer::QuantInterceptor>(state, model);

  // Attach state to non-leaf modules and qconfigs to layers; non-traceable subtrees get a marker
  // on their root and nothing below.
  std::vector<std::string> skipped_prefixes;
  // A module registered under two names (the same holder registered twice, as libtorch allows) is
  // one object with one extension: it gets the state of the name seen first, and a qconfig set for
  // the other name would silently not apply (or replace the first one's). Refused when the two
  // names' qconfigs differ; otherwise the module is prepared once, under its first name.
  std::map<const nn::Module*, std::string> first_name;
  for (auto& [fqn, m] : model.named_modules()) {
    auto [it, inserted] = first_name.emplace(m, fqn);
    if (inserted) continue;
    const QConfigPtr a = state->mapping().for_module(m->type_name(), it->second);
    const QConfigPtr b = state->mapping().for_module(m->type_name(), fqn);
    const bool same = (a == nullptr && b == nullptr) || (a != nullptr && b != nullptr && *a == *b);
    DBRQ_ENSURE(same, UsageError, "prepare: the module \"", it->second, "\" (", m->type_name(),
                ") is also registered as \"", fqn, "\", and the qconfig mapping gives the two names different "
                "qconfigs (", a ? a->to_string() : "None", " and ", b ? b->to_string() : "None",
                "), which one module cannot have: register two modules, or give both names the same qconfig");
  }
  std::set<const nn::Module*> attached;
  for (auto& [fqn, m] : model.named_modules()) {
    if (!attached.insert(m).second) continue;  // a second name of a shared module (checked above)
    bool inside_skipped = false;
    for (const std::string& p : skipped_prefixes) {
      if (fqn.rfind(p + ".", 0) == 0) inside_skipped = true;
    }
    if (inside_skipped) continue;
    if (!fqn.empty() && (matches_any(options.non_traceable_module_classes, m->type_name()) ||
                         matches_any(options.non_traceable_module_names, fqn))) {
      std::vector<Tensor> state;
      for (auto& [name, t] : m->state_dict()) state.push_back(t);
      m->set_extension(std::make_shared<tracer::NonTraceableInfo>(fqn, std::move(state)));
      skipped_prefixes.push_back(fqn);
      continue;
    }
    if (m->is_leaf()) {
      m->set_extension(std::make_shared<LeafQuantInfo>(fqn, state->mapping().for_module(m->type_name(), fqn)));
      continue;
    }
    auto s = std::make_shared<AutoQuantizationState>(fqn, m->type_name(), state);
    state->states().push_back(s.get());
    m->set_extension(std::move(s));
    m->attach_interceptor(interceptor);
  }
  state->set_phase(Phase::kTracing);
  state->set_strict(options.strict_control_flow);
  state->set_float_outputs(options.float_outputs_for_float_readers);
  state->set_root(&model);
  try {
    InterceptorScope scope(interceptor.get());
    run();
  } catch (const Error& e) {
    detach(model);
    e.rethrow_with_context("prepare: the example run failed: ");
  } catch (...) {
    detach(model);
    throw;
  }
  analyze_program(*state);
  state->set_phase(Phase::kCalibrating);
  log_prepare_summary(*state);
}

}  // namespace

void prepare(nn::Module& model, const std::vector<Tensor>& example_inputs, QConfigMapping qconfig_mapping,
             BackendConfig backend_config, const PrepareOptions& options) {
  DBRQ_ENSURE(!example_inputs.empty(), ValueError, "prepare: example_inputs is empty; pass the tensors forward takes");
  do_prepare(
      model, [&] { model.forward_tensors(example_inputs); }, std::move(qconfig_mapping), std::move(backend_config),
      options);
}

void prepare(nn::Module& model, const std::function<void()>& run_example, QConfigMapping qconfig_mapping,
             BackendConfig backend_config, const PrepareOptions& options) {
  DBRQ_ENSURE(run_example != nullptr, ValueError, "prepare: run_example is empty");
  do_prepare(model, run_example, std::move(qconfig_mapping), std::move(backend_config), options);
}

void convert(nn::Module& model, const ConvertOptions& options) {
  tracer::QuantInterceptor& interceptor = interceptor_of(model, "convert");
  ModelQuantState& m = interceptor.model();
  DBRQ_ENSURE(m.phase() != Phase::kConverted, UsageError, "convert: ", model.type_name(),
              " is already converted; convert once per prepared model");
  interceptor.set_strict_paths(options.strict_paths);
  interceptor.convert(options.int8_outputs);
}

void disable_observers(nn::Module& model) {
  ModelQuantState& m = interceptor_of(model, "disable_observers").model();
  DBRQ_ENSURE(m.phase() != Phase::kConverted, UsageError,
              "disable_observers: the model is already converted; observers are gone after convert");
  m.set_observers_enabled(false);
}

void enable_observers(nn::Module& model) {
  ModelQuantState& m = interceptor_of(model, "enable_observers").model();
  DBRQ_ENSURE(m.phase() != Phase::kConverted, UsageError,
              "enable_observers: the model is already converted; calibration must happen before convert");
  m.set_observers_enabled(true);
}

bool is_prepared(const nn::Module& model) { return quant_state_of(model) != nullptr; }

bool is_converted(const nn::Module& model) {
  return is_prepared(model) && interceptor_of(model, "is_converted").model().phase() == Phase::kConverted;
}

ModelQuantState& model_quant_state(const nn::Module& model) {
  return interceptor_of(model, "model_quant_state").model();
}

using ExclusiveHold = tracer::QuantInterceptor::ExclusiveHold;

void merge_calibration(nn::Module& model, const nn::Module& replica) {
  ModelQuantState& into = interceptor_of(model, "merge_calibration").model();
  ModelQuantState& from = interceptor_of(replica, "merge_calibration").model();
  DBRQ_ENSURE(&into != &from, UsageError, "merge_calibration: the replica is the model itself");
  // Neither may be mid-call: the merge rebuilds the model's records and reads the replica's
  // observers, which a calibrating call writes without locks.
  constexpr const char* kAdvice = "merge replicas once their calibrating calls have returned";
  ExclusiveHold hold_model(interceptor_of(model, "merge_calibration"), "merge_calibration", kAdvice);
  ExclusiveHold hold_replica(interceptor_of(replica, "merge_calibration"), "merge_calibration", kAdvice);
  DBRQ_ENSURE(into.phase() == Phase::kCalibrating && from.phase() == Phase::kCalibrating, UsageError,
              "merge_calibration: both models must be prepared and not yet converted");
  // Through the replica's quant-state document: same modules, layers and qconfigs, checked like
  // a file; paths only the replica took are added, observers of the same tensors merged.
  SaveQuantStateOptions with_stats;
  with_stats.include_observer_stats = true;
  const std::string replica_doc = quant_state_to_json(from, replica.type_name(), with_stats);
  merge_quant_state(into, model.type_name(), replica_doc, "(replica " + replica.type_name() + ")", &from);
}

void save_quant_state(const nn::Module& model, const std::string& path, const SaveQuantStateOptions& options) {
  const std::string text = quant_state_to_json(model_quant_state(model), model.type_name(), options);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  DBRQ_ENSURE(f.good(), IOError, "save_quant_state: cannot open \"", path, "\" for writing");
  f << text;
  f.flush();
  DBRQ_ENSURE(f.good(), IOError, "save_quant_state: failed writing \"", path, "\"");
}

void load_quant_state(nn::Module& model, const std::string& path) {
  ModelQuantState& m = interceptor_of(model, "load_quant_state").model();
  // It rebuilds the records that a call in flight is using.
  ExclusiveHold hold(interceptor_of(model, "load_quant_state"), "load_quant_state", "load calibration between calls");
  DBRQ_ENSURE(m.phase() != Phase::kConverted, UsageError,
              "load_quant_state: the model is already converted; load the calibration into a freshly prepared model");
  std::ifstream f(path, std::ios::binary);
  DBRQ_ENSURE(f.good(), IOError, "load_quant_state: cannot open \"", path, "\" for reading");
  std::ostringstream ss;
  ss << f.rdbuf();
  quant_state_from_json(m, model.type_name(), ss.str(), "\"" + path + "\"");
}

std::string quant_state_to_string(const nn::Module& model) {
  ModelQuantState& m = model_quant_state(model);
  std::ostringstream os;
  for (AutoQuantizationState* s : m.states()) os << s->to_string();
  return os.str();
}

}  // namespace dbrq
