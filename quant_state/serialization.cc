#include "quant_state/serialization.h"

#include <nlohmann/json.hpp>

#include <optional>

namespace dbrq {
namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "dbrq.quant_state";

json spec_to_json(const ObserverSpec& s) {
  return json{{"kind", observer_kind_name(s.kind)},
              {"dtype", dtype_name(s.dtype)},
              {"qscheme", qscheme_name(s.qscheme)},
              {"reduce_range", s.reduce_range},
              {"ch_axis", s.ch_axis},
              {"averaging_constant", s.averaging_constant},
              {"bins", s.bins},
              {"upsample_rate", s.upsample_rate},
              {"percentile", s.percentile},
              {"torch_integer_edges", s.torch_integer_edges},
              {"fixed_scale", s.fixed_scale},
              {"fixed_zero_point", s.fixed_zero_point}};
}

ObserverSpec spec_from_json(const json& j) {
  ObserverSpec s;
  s.kind = observer_kind_from_name(j.at("kind").get<std::string>());
  s.dtype = dtype_from_name(j.at("dtype").get<std::string>());
  s.qscheme = qscheme_from_name(j.at("qscheme").get<std::string>());
  s.reduce_range = j.at("reduce_range").get<bool>();
  s.ch_axis = j.at("ch_axis").get<int64_t>();
  s.averaging_constant = j.at("averaging_constant").get<double>();
  s.bins = j.at("bins").get<int>();
  s.upsample_rate = j.at("upsample_rate").get<int>();
  s.percentile = j.at("percentile").get<double>();
  s.torch_integer_edges = j.at("torch_integer_edges").get<bool>();
  s.fixed_scale = j.at("fixed_scale").get<float>();
  s.fixed_zero_point = j.at("fixed_zero_point").get<int32_t>();
  return s;
}

json tensors_to_json(const std::vector<QTensorInfo>& ts) {
  json a = json::array();
  for (const QTensorInfo& t : ts) a.push_back({{"id", t.id}, {"dtype", dtype_name(t.inf_dtype)}});
  return a;
}

json qparams_to_json(const QuantParamsPtr& q) {
  if (q == nullptr) return nullptr;
  return json{{"scales", q->scales}, {"zero_points", q->zero_points}, {"axis", q->axis}};
}

QuantParamsPtr qparams_from_json(const json& j) {
  if (j.is_null()) return nullptr;
  auto scales = j.at("scales").get<std::vector<float>>();
  auto zps = j.at("zero_points").get<std::vector<int32_t>>();
  const int64_t axis = j.at("axis").get<int64_t>();
  if (axis < 0) {
    DBRQ_ENSURE(scales.size() == 1 && zps.size() == 1, FileFormatError,
                "per-tensor parameters need exactly one scale and zero point");
    return QuantParams::per_tensor(scales[0], zps[0]);
  }
  return QuantParams::per_channel(std::move(scales), std::move(zps), axis);
}

std::string qconfig_string(const QConfigPtr& q) { return q ? q->to_string() : "None"; }

json op_to_json(const SeenOpInfo& op) {
  json j{{"index", op.index},
         {"kind", op_name(op.kind)},
         {"fqn", op.fqn},
         {"role", quant_role_name(op.role)},
         {"qconfig", qconfig_string(op.qconfig)},
         {"inputs", tensors_to_json(op.inputs)},
         {"outputs", tensors_to_json(op.outputs)},
         {"input_observers", op.input_observers},
         {"output_observer", op.output_observer}};
  if (op.fusion.fused()) {
    std::vector<std::string> pattern;
    for (OpKind k : op.fusion.pattern) pattern.push_back(op_name(k));
    j["fusion"] = {{"pattern", pattern},
                   {"base", op.fusion.base},
                   {"position", op.fusion.position},
                   {"residual_input", op.fusion.residual_input}};
  }
  json weights = json::array();
  for (const WeightInfo& w : op.weights) weights.push_back(w.fqn);
  j["weights"] = weights;
  if (op.has_scalar) j["scalar"] = op.scalar;
  if (!op.unsupported.empty()) j["unsupported"] = op.unsupported;
  return j;
}

std::string fusion_name(const json& op) {
  if (!op.contains("fusion")) return "";
  std::string s;
  for (const auto& k : op["fusion"].at("pattern")) s += (s.empty() ? "" : "+") + k.get<std::string>();
  return s;
}

[[noreturn]] void mismatch(const std::string& source, const std::string& what) {
  throw StateMismatchError(absl::StrCat("quant state ", source, " does not match this model: ", what));
}

}  // namespace

std::string quant_state_to_json(const ModelQuantState& model_const, const std::string& model_type,
                                const SaveQuantStateOptions& options) {
  // Slots are resolved through union-find; the state is not modified.
  ModelQuantState& model = const_cast<ModelQuantState&>(model_const);
  json doc{{"format", kFormat},
           {"version", kQuantStateVersion},
           {"model_type", model_type},
           {"backend", model.backend().name()},
           {"phase", phase_name(model.phase())},
           {"qconfig_mapping", model.mapping().to_string()}};
  json modules = json::array();
  for (const AutoQuantizationState* s : model.states()) {
    json m{{"fqn", s->fqn()}, {"type", s->type_name()}};
    json ops = json::array();
    for (const SeenOpInfo& op : s->seen_ops()) ops.push_back(op_to_json(op));
    m["seen_ops"] = ops;
    json other = json::array();
    for (const NonQuantOpInfo& o : s->non_quant_ops()) {
      other.push_back({{"kind", op_name(o.kind)}, {"fqn", o.fqn}, {"reason", o.reason}});
    }
    m["non_quant_ops"] = other;
    modules.push_back(m);
  }
  doc["modules"] = modules;
  json slots = json::array();
  for (size_t i = 0; i < model.num_slots(); ++i) {
    const int root = model.find(static_cast<int>(i));
    json j{{"slot", i}, {"root", root}};
    if (root == static_cast<int>(i)) {
      ObserverSlot& slot = model.slot(root);
      j["tensor_id"] = slot.tensor_id;
      j["owner"] = slot.owner;
      j["observer"] = spec_to_json(slot.observer->spec());
      QuantParamsPtr qp = slot.qparams;
      if (qp == nullptr && slot.observer->has_data()) qp = slot.observer->calculate_qparams();
      j["qparams"] = qparams_to_json(qp);
      j["range"] = {slot.observer->min_val(), slot.observer->max_val()};
      if (options.include_observer_stats) {
        const Observer::Stats st = slot.observer->stats();
        json fields = json::object();
        for (auto& [name, values] : st.fields) fields[name] = values;
        j["stats"] = {{"fields", fields},
                      {"num_batches", st.num_batches},
                      {"nan_count", st.nan_count},
                      {"inf_count", st.inf_count}};
      }
    }
    slots.push_back(j);
  }
  doc["observers"] = slots;
  return doc.dump(1);
}

namespace {

struct Loaded {
  QuantParamsPtr qparams;
  std::optional<Observer::Stats> stats;
};

// Parses a document and checks it against the model; returns what to apply, per slot.
std::vector<Loaded> parse_and_check(ModelQuantState& model, const std::string& model_type, const std::string& text,
                                    const std::string& source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    DBRQ_THROW(FileFormatError, "quant state ", source, " is not valid JSON: ", e.what());
  }
  std::vector<Loaded> loaded(model.num_slots());
  try {
    DBRQ_ENSURE(doc.is_object() && doc.value("format", "") == kFormat, FileFormatError, "quant state ", source,
                " is not a dbrq quant-state document (format \"", kFormat, "\")");
    const int version = doc.at("version").get<int>();
    if (version != kQuantStateVersion) {
      mismatch(source, absl::StrCat("file version ", version, ", this dbrq reads version ", kQuantStateVersion));
    }
    const std::string file_type = doc.at("model_type").get<std::string>();
    if (file_type != model_type) mismatch(source, absl::StrCat("made for model ", file_type, ", this is ", model_type));
    const std::string backend = doc.at("backend").get<std::string>();
    if (backend != model.backend().name()) {
      mismatch(source, absl::StrCat("made for backend ", backend, ", this model uses ", model.backend().name()));
    }
    const json& modules = doc.at("modules");
    DBRQ_ENSURE(modules.is_array(), FileFormatError, "quant state ", source, ": \"modules\" must be an array");
    for (size_t i = 0; i < model.states().size() || i < modules.size(); ++i) {
      if (i >= modules.size()) mismatch(source, absl::StrCat("module \"", model.states()[i]->fqn(), "\" is not in the file"));
      const json& m = modules[i];
      const std::string fqn = m.at("fqn").get<std::string>();
      if (i >= model.states().size()) mismatch(source, absl::StrCat("the file has module \"", fqn, "\", the model does not"));
      const AutoQuantizationState& s = *model.states()[i];
      if (fqn != s.fqn()) {
        mismatch(source, absl::StrCat("module ", i, " is \"", fqn, "\" in the file but \"", s.fqn(), "\" in the model"));
      }
      const json& ops = m.at("seen_ops");
      for (size_t k = 0; k < s.seen_ops().size() || k < ops.size(); ++k) {
        if (k >= ops.size() || k >= s.seen_ops().size()) {
          mismatch(source, absl::StrCat("module \"", fqn, "\" has ", ops.size(), " quantizeable ops in the file and ",
                                        s.seen_ops().size(), " in the model (first difference at op ", k, ")"));
        }
        const json& fo = ops[k];
        const SeenOpInfo& op = s.seen_ops()[k];
        const std::string kind = fo.at("kind").get<std::string>(), ofqn = fo.at("fqn").get<std::string>();
        const std::string fusion = fusion_name(fo);
        const std::string model_fusion = op.fusion.fused() ? op.fusion.name() : "";
        if (kind != op_name(op.kind) || ofqn != op.fqn || fusion != model_fusion) {
          mismatch(source, absl::StrCat("module \"", fqn, "\" op ", k, ": the file has ", kind, " (", ofqn, ")",
                                        fusion.empty() ? "" : " fused as " + fusion, ", the model has ", op_name(op.kind),
                                        " (", op.fqn, ")", model_fusion.empty() ? "" : " fused as " + model_fusion));
        }
        const std::string q = fo.at("qconfig").get<std::string>();
        if (q != qconfig_string(op.qconfig)) {
          mismatch(source, absl::StrCat("module \"", fqn, "\" op ", k, " (", op_name(op.kind), " ", op.fqn,
                                        "): the file's qconfig is ", q, ", the model's is ", qconfig_string(op.qconfig)));
        }
        if (fo.at("input_observers").get<std::vector<int>>() != op.input_observers ||
            fo.at("output_observer").get<int>() != op.output_observer) {
          mismatch(source, absl::StrCat("module \"", fqn, "\" op ", k, " (", op_name(op.kind), " ", op.fqn,
                                        "): observer placement differs"));
        }
      }
    }
    const json& slots = doc.at("observers");
    if (slots.size() != model.num_slots()) {
      mismatch(source, absl::StrCat("the file has ", slots.size(), " observers, the model ", model.num_slots()));
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      const json& j = slots[i];
      const int root = model.find(static_cast<int>(i));
      if (j.at("root").get<int>() != root) mismatch(source, absl::StrCat("observer ", i, " is shared differently"));
      if (root != static_cast<int>(i)) continue;
      const ObserverSpec spec = spec_from_json(j.at("observer"));
      ObserverSlot& slot = model.slot(root);
      if (spec != slot.observer->spec()) {
        mismatch(source, absl::StrCat("observer ", i, " (tensor of ", slot.owner, ") is ", spec.to_string(),
                                      " in the file but ", slot.observer->spec().to_string(), " in the model"));
      }
      loaded[i].qparams = qparams_from_json(j.at("qparams"));
      if (j.contains("stats")) {
        Observer::Stats st;
        for (auto it = j["stats"].at("fields").begin(); it != j["stats"].at("fields").end(); ++it) {
          st.fields.emplace_back(it.key(), it.value().get<std::vector<double>>());
        }
        st.num_batches = j["stats"].at("num_batches").get<int64_t>();
        st.nan_count = j["stats"].at("nan_count").get<int64_t>();
        st.inf_count = j["stats"].at("inf_count").get<int64_t>();
        // Validate by loading into a scratch observer first: the model is only touched once
        // everything has been checked.
        make_observer(spec)->load_stats(st);
        loaded[i].stats = std::move(st);
      }
    }
  } catch (const json::exception& e) {
    DBRQ_THROW(FileFormatError, "quant state ", source, " is malformed: ", e.what());
  } catch (const ValueError& e) {
    DBRQ_THROW(FileFormatError, "quant state ", source, " has an invalid value: ", e.what());
  } catch (const DTypeError& e) {
    DBRQ_THROW(FileFormatError, "quant state ", source, " has an invalid value: ", e.what());
  }
  return loaded;
}

}  // namespace

void check_quant_state(ModelQuantState& model, const std::string& model_type, const std::string& json,
                       const std::string& source) {
  parse_and_check(model, model_type, json, source);
}

void quant_state_from_json(ModelQuantState& model, const std::string& model_type, const std::string& text,
                           const std::string& source) {
  const std::vector<Loaded> loaded = parse_and_check(model, model_type, text, source);
  for (size_t i = 0; i < loaded.size(); ++i) {
    if (model.find(static_cast<int>(i)) != static_cast<int>(i)) continue;
    ObserverSlot& slot = model.slot(static_cast<int>(i));
    if (loaded[i].stats) {
      slot.observer->load_stats(*loaded[i].stats);
      slot.qparams = nullptr;  // recomputed from the restored statistics at convert
    } else {
      slot.qparams = loaded[i].qparams;
    }
  }
}

}  // namespace dbrq
