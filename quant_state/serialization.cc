#include "quant_state/serialization.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>

namespace dbrq {
namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "dbrq.quant_state";

// ---------------------------------------------------------------------------------------------
// Reading untrusted values. nlohmann's get<int>() silently truncates 4294967297 to 1, converts
// 1e300 to int with undefined behaviour, and get<float>() of 1e300 leaves float's range: numbers
// are read through these instead. A value of the wrong JSON type throws WrongType (reported as
// "malformed", like nlohmann's type errors); a number that does not fit throws ValueError
// (reported as "an invalid value").

struct WrongType : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string excerpt(const json& j) {
  std::string s = j.dump();
  if (s.size() > 40) s = s.substr(0, 40) + "...";
  return s;
}

template <typename T>
T get_integer(const json& j, const char* what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v <= static_cast<uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(v);
  } else if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
        (v < 0 || static_cast<uint64_t>(v) <= static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
      return static_cast<T>(v);
    }
  } else {
    throw WrongType(absl::StrCat(what, " must be an integer, got ", excerpt(j)));
  }
  DBRQ_THROW(ValueError, what, " ", j.dump(), " is out of range");
}

template <typename T>
std::vector<T> get_integers(const json& j, const char* what) {
  if (!j.is_array()) throw WrongType(absl::StrCat(what, " must be an array of integers, got ", excerpt(j)));
  std::vector<T> out;
  out.reserve(j.size());
  for (const json& v : j) out.push_back(get_integer<T>(v, what));
  return out;
}

double get_double(const json& j, const char* what) {
  if (!j.is_number()) throw WrongType(absl::StrCat(what, " must be a number, got ", excerpt(j)));
  const double v = j.get<double>();
  DBRQ_ENSURE(std::isfinite(v), ValueError, what, " must be finite, got ", j.dump());
  return v;
}

// A number dbrq keeps as a float: finite and within float's range.
float get_float(const json& j, const char* what) {
  const double v = get_double(j, what);
  DBRQ_ENSURE(std::abs(v) <= static_cast<double>(std::numeric_limits<float>::max()), ValueError, what, " ",
              j.dump(), " is outside the range of float");
  return static_cast<float>(v);
}

const json& get_array(const json& j, const char* what) {
  if (!j.is_array()) throw WrongType(absl::StrCat(what, " must be an array, got ", excerpt(j)));
  return j;
}

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
  s.ch_axis = get_integer<int64_t>(j.at("ch_axis"), "ch_axis");
  s.averaging_constant = get_double(j.at("averaging_constant"), "averaging_constant");
  s.bins = get_integer<int>(j.at("bins"), "bins");
  s.upsample_rate = get_integer<int>(j.at("upsample_rate"), "upsample_rate");
  s.percentile = get_double(j.at("percentile"), "percentile");
  s.torch_integer_edges = j.at("torch_integer_edges").get<bool>();
  s.fixed_scale = get_float(j.at("fixed_scale"), "fixed_scale");
  s.fixed_zero_point = get_integer<int32_t>(j.at("fixed_zero_point"), "fixed_zero_point");
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

// Parameters of observer `slot`, checked against the spec the model gave it (the file's spec equals
// it): what convert and the int8 kernels rely on, and what every observer produces. `where`
// ("quant state <file>") prefixes errors; at most `max_channels` per-channel values.
QuantParamsPtr qparams_from_json(const json& j, const ObserverSpec& spec, const std::string& where, size_t slot,
                                 size_t max_channels) {
  if (j.is_null()) return nullptr;
  DBRQ_ENSURE(spec.kind != ObserverKind::kPlaceholder, FileFormatError, where, ": observer ", slot,
              " is a dynamic (Placeholder) observer, whose \"qparams\" must be null");
  const json& scales_json = get_array(j.at("scales"), "scales");
  const json& zps_json = get_array(j.at("zero_points"), "zero_points");
  const int64_t axis = get_integer<int64_t>(j.at("axis"), "axis");
  const DType dtype = spec.dtype;
  const int32_t lo = dtype == DType::kU8 ? 0 : -128, hi = dtype == DType::kU8 ? 255 : 127;
  const std::vector<int32_t> zps = get_integers<int32_t>(zps_json, "zero point");
  for (int32_t zp : zps) {
    DBRQ_ENSURE(zp >= lo && zp <= hi, FileFormatError, where, ": observer ", slot, " has zero point ", zp,
                ", outside ", dtype_name(dtype), "'s range [", lo, ", ", hi, "]");
  }
  if (!is_per_channel(spec.qscheme)) {
    DBRQ_ENSURE(scales_json.size() == 1 && zps.size() == 1, FileFormatError, where, ": observer ", slot,
                ": per-tensor parameters need exactly one scale and zero point, got ", scales_json.size(), " and ",
                zps.size());
    DBRQ_ENSURE(axis == -1, FileFormatError, where, ": observer ", slot, " is per-tensor (",
                qscheme_name(spec.qscheme), "), its parameters need axis -1, got ", axis);
  } else {
    DBRQ_ENSURE(axis == spec.ch_axis, FileFormatError, where, ": observer ", slot, ": per-channel parameters need axis ",
                spec.ch_axis, " (the observer's ch_axis), got ", axis);
    DBRQ_ENSURE(scales_json.size() == zps.size() && !zps.empty() && zps.size() <= max_channels, FileFormatError, where,
                ": observer ", slot, ": per-channel parameters need as many zero points as scales (1 to ",
                max_channels, "), got ", scales_json.size(), " and ", zps.size());
  }
  std::vector<float> scales;
  scales.reserve(scales_json.size());
  for (const json& v : scales_json) {
    const float scale = get_float(v, "scale");
    // Observers never go below PyTorch's eps, and the int8 kernels divide by the scale.
    DBRQ_ENSURE(scale >= kScaleEps, FileFormatError, where, ": observer ", slot, " has scale ", scale,
                ", below the smallest scale an observer computes (", kScaleEps, ")");
    scales.push_back(scale);
  }
  if (spec.kind == ObserverKind::kFixedQParams) {
    DBRQ_ENSURE(scales[0] == spec.fixed_scale && zps[0] == spec.fixed_zero_point, FileFormatError, where,
                ": observer ", slot, " is FixedQParams(scale=", spec.fixed_scale, ", zero_point=", spec.fixed_zero_point,
                ") but the file gives scale ", scales[0], " and zero point ", zps[0]);
  }
  if (!is_per_channel(spec.qscheme)) return QuantParams::per_tensor(scales[0], zps[0]);
  return QuantParams::per_channel(std::move(scales), std::vector<int32_t>(zps), axis);
}

// Observer statistics, checked for what the observers' arithmetic assumes: float values, ordered
// ranges of finite width, non-negative histogram counts and counters, and at most max_values
// values per field. (The observer itself then checks field names and sizes.)
Observer::Stats stats_from_json(const json& j, const std::string& where, size_t slot, size_t max_values) {
  Observer::Stats st;
  const json& fields = j.at("fields");
  if (!fields.is_object()) throw WrongType(absl::StrCat("\"fields\" must be an object, got ", excerpt(fields)));
  for (auto it = fields.begin(); it != fields.end(); ++it) {
    const std::string& name = it.key();
    const json& values_json = get_array(it.value(), "an observer statistics field");
    DBRQ_ENSURE(values_json.size() <= max_values, FileFormatError, where, ": observer ", slot, " statistics field \"",
                name, "\" has ", values_json.size(), " values; this model's observer has at most ", max_values);
    const bool counts = name.find("histogram") != std::string::npos;
    std::vector<double> values;
    values.reserve(values_json.size());
    for (const json& v : values_json) {
      // Counts stay doubles (a long calibration puts more than 2^24 values in a bin); ranges are
      // floats in the observers.
      values.push_back(counts ? get_double(v, "an observer statistic") : get_float(v, "an observer statistic"));
      DBRQ_ENSURE(!counts || values.back() >= 0, FileFormatError, where, ": observer ", slot, " statistics field \"",
                  name, "\" has a negative count ", values.back());
    }
    st.fields.emplace_back(name, std::move(values));
  }
  auto field = [&](const char* name) -> const std::vector<double>* {
    for (const auto& [n, v] : st.fields) {
      if (n == name) return &v;
    }
    return nullptr;
  };
  for (const auto& [lo_name, hi_name] : {std::pair<const char*, const char*>{"min", "max"}, {"abs_min", "abs_max"}}) {
    const std::vector<double>*lo = field(lo_name), *hi = field(hi_name);
    if (lo == nullptr || hi == nullptr) continue;
    for (size_t c = 0; c < std::min(lo->size(), hi->size()); ++c) {
      const float a = static_cast<float>((*lo)[c]), b = static_cast<float>((*hi)[c]);
      DBRQ_ENSURE(a <= b && std::isfinite(b - a), FileFormatError, where, ": observer ", slot, " statistics: [", lo_name,
                  ", ", hi_name, "] = [", a, ", ", b, "] is not an ordered range of finite width");
    }
  }
  st.num_batches = get_integer<int64_t>(j.at("num_batches"), "num_batches");
  st.nan_count = get_integer<int64_t>(j.at("nan_count"), "nan_count");
  st.inf_count = get_integer<int64_t>(j.at("inf_count"), "inf_count");
  DBRQ_ENSURE(st.num_batches >= 0 && st.nan_count >= 0 && st.inf_count >= 0, FileFormatError, where, ": observer ",
              slot, " statistics have negative counters");
  return st;
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
      // An observer that saw nothing has no statistics to restore (its range would be written as
      // null, which no loader could read back): its slot keeps its fresh observer.
      if (options.include_observer_stats && slot.observer->has_data()) {
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

// Per-channel statistics and parameters are per channel of a tensor the trace does not record the
// sizes of: this bounds them (no layer has more channels).
constexpr size_t kMaxChannels = size_t{1} << 16;
// A document nests 6 levels deep (observers / slot / stats / fields / histogram).
constexpr int kMaxDepth = 16;

// How many values a slot's statistics field or parameter array may hold.
size_t max_slot_values(const ObserverSpec& spec) {
  if (is_per_channel(spec.qscheme)) return kMaxChannels;
  return static_cast<size_t>(std::max(spec.bins, 16));
}

// An upper bound (twice a generous count) of the JSON values, keys and containers in any document
// for this model: a document is parsed against it, so a hostile one cannot make the parser build a
// DOM (16 to 80 bytes per byte of JSON) much larger than the model's own state.
size_t max_document_values(ModelQuantState& model) {
  size_t n = 1024;
  for (const AutoQuantizationState* s : model.states()) {
    n += 64 + 16 * s->non_quant_ops().size();
    for (const SeenOpInfo& op : s->seen_ops()) {
      n += 128 + 8 * (op.inputs.size() + op.outputs.size()) +
           2 * (op.weights.size() + op.input_observers.size() + op.fusion.pattern.size());
    }
  }
  for (size_t i = 0; i < model.num_slots(); ++i) {
    n += 128;
    if (model.find(static_cast<int>(i)) == static_cast<int>(i)) {
      n += 4 * max_slot_values(model.slot(static_cast<int>(i)).observer->spec());
    }
  }
  return 2 * n;
}

// Parses a document and checks it against the model; returns what to apply, per slot.
std::vector<Loaded> parse_and_check(ModelQuantState& model, const std::string& model_type, const std::string& text,
                                    const std::string& source) {
  json doc;
  const size_t max_values = max_document_values(model);
  size_t values = 0;
  const json::parser_callback_t limit = [&](int depth, json::parse_event_t event, json&) {
    if (event == json::parse_event_t::object_end || event == json::parse_event_t::array_end) return true;
    if (depth > kMaxDepth) {
      DBRQ_THROW(FileFormatError, "quant state ", source, " nests deeper than ", kMaxDepth,
                 " levels; a quant-state document does not");
    }
    if (++values > max_values) {
      DBRQ_THROW(FileFormatError, "quant state ", source, " holds more than ", max_values,
                 " JSON values, more than any document for this model");
    }
    return true;
  };
  try {
    doc = json::parse(text, limit);
  } catch (const json::exception& e) {
    // nlohmann quotes the last token, which can be most of the document ("[[[[..."): keep it short.
    std::string what = e.what();
    if (what.size() > 300) what = what.substr(0, 300) + "...";
    DBRQ_THROW(FileFormatError, "quant state ", source, " is not valid JSON: ", what);
  }
  std::vector<Loaded> loaded(model.num_slots());
  const std::string where = "quant state " + source;
  try {
    DBRQ_ENSURE(doc.is_object() && doc.value("format", "") == kFormat, FileFormatError, "quant state ", source,
                " is not a dbrq quant-state document (format \"", kFormat, "\")");
    const int version = get_integer<int>(doc.at("version"), "version");
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
      const json& ops = get_array(m.at("seen_ops"), "seen_ops");
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
        if (get_integers<int>(fo.at("input_observers"), "input_observers") != op.input_observers ||
            get_integer<int>(fo.at("output_observer"), "output_observer") != op.output_observer) {
          mismatch(source, absl::StrCat("module \"", fqn, "\" op ", k, " (", op_name(op.kind), " ", op.fqn,
                                        "): observer placement differs"));
        }
      }
    }
    const json& slots = get_array(doc.at("observers"), "observers");
    if (slots.size() != model.num_slots()) {
      mismatch(source, absl::StrCat("the file has ", slots.size(), " observers, the model ", model.num_slots()));
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      const json& j = slots[i];
      const int root = model.find(static_cast<int>(i));
      if (get_integer<int>(j.at("root"), "root") != root) mismatch(source, absl::StrCat("observer ", i, " is shared differently"));
      if (root != static_cast<int>(i)) continue;
      const ObserverSpec spec = spec_from_json(j.at("observer"));
      ObserverSlot& slot = model.slot(root);
      if (spec != slot.observer->spec()) {
        mismatch(source, absl::StrCat("observer ", i, " (tensor of ", slot.owner, ") is ", spec.to_string(),
                                      " in the file but ", slot.observer->spec().to_string(), " in the model"));
      }
      loaded[i].qparams = qparams_from_json(j.at("qparams"), spec, where, i, max_slot_values(spec));
      if (j.contains("stats")) {
        Observer::Stats st = stats_from_json(j.at("stats"), where, i, max_slot_values(spec));
        // Validate by loading into a scratch observer first: the model is only touched once
        // everything has been checked.
        make_observer(spec)->load_stats(st);
        loaded[i].stats = std::move(st);
      }
    }
  } catch (const json::exception& e) {
    DBRQ_THROW(FileFormatError, "quant state ", source, " is malformed: ", e.what());
  } catch (const WrongType& e) {
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
