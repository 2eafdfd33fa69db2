#include "quant_state/serialization.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cerrno>
#include <map>
#include <tuple>
#include <utility>
#include <vector>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>

#include "absl/strings/str_join.h"

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
  if (j.contains("mask_count")) st.mask_count = get_integer<int64_t>(j.at("mask_count"), "mask_count");
  DBRQ_ENSURE(st.num_batches >= 0 && st.nan_count >= 0 && st.inf_count >= 0 && st.mask_count >= 0, FileFormatError, where, ": observer ",
              slot, " statistics have negative counters");
  return st;
}

// ---- portable values ------------------------------------------------------------------------

std::string hex64(uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t get_hex64(const json& j, const char* what) {
  if (!j.is_string()) throw WrongType(absl::StrCat(what, " must be a string \"0x\" + 16 hex digits, got ", excerpt(j)));
  const std::string& s = j.get_ref<const std::string&>();
  DBRQ_ENSURE(s.size() == 18 && s[0] == '0' && s[1] == 'x', ValueError, what, " ", excerpt(j),
              " is not \"0x\" followed by 16 hex digits");
  uint64_t v = 0;
  for (size_t i = 2; i < s.size(); ++i) {
    const char c = s[i];
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    DBRQ_ENSURE(d >= 0, ValueError, what, " ", excerpt(j), " is not \"0x\" followed by 16 (lowercase) hex digits");
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

bool get_bool(const json& j, const char* what) {
  if (!j.is_boolean()) throw WrongType(absl::StrCat(what, " must be true or false, got ", excerpt(j)));
  return j.get<bool>();
}

const std::string& get_string(const json& j, const char* what) {
  if (!j.is_string()) throw WrongType(absl::StrCat(what, " must be a string, got ", excerpt(j)));
  return j.get_ref<const std::string&>();
}

OpKind op_kind_from_name(const std::string& name) {
  for (size_t k = 0; k < static_cast<size_t>(OpKind::kNumOpKinds); ++k) {
    if (name == op_name(static_cast<OpKind>(k))) return static_cast<OpKind>(k);
  }
  DBRQ_THROW(ValueError, "unknown op kind \"", name, "\"");
}

std::string qconfig_string(const QConfigPtr& q) { return q ? q->to_string() : "None"; }

[[noreturn]] void mismatch(const std::string& source, const std::string& what) {
  throw StateMismatchError(absl::StrCat("quant state ", source, " does not match this model: ", what));
}

// ---- the document, parsed -------------------------------------------------------------------

// Where an input's value came from: record `record`'s output (global index), or an fp32 source.
struct FileOrigin {
  int record = -1;
  uint64_t source = 0;
  bool operator==(const FileOrigin& o) const { return record == o.record && source == o.source; }
};

struct FileInput {
  DType trace_dtype = DType::kF32;
  std::vector<FileOrigin> origins;
};

struct FileRecord {
  int module = -1;  // index in Document::modules
  int index = -1;   // in its module
  OpKind kind = OpKind::kNumOpKinds;
  std::string fqn;
  bool leaf = false;
  int64_t tag = 0;
  uint64_t salt = 0;  // OpIdentityScope; absent in the file when 0
  ProducerTags producers;
  OpParams params;
  uint64_t params_fingerprint = 0;
  bool has_scalar = false, scalar_first = false;
  double scalar = 0.0;
  bool broadcasts = false;  // absent when false
  std::vector<std::string> weights;  // "" for a computed tensor
  std::vector<bool> weight_absent;   // an optional input left out (no bias)
  std::vector<bool> weight_has_view;  // weights[i] is a part of the parameter (WeightView)
  std::vector<WeightView> weight_views;
  std::string qconfig;
  std::vector<FileInput> inputs;
  size_t num_outputs = 1;
  bool read_by_fp32 = false, escapes = false, read_twice = false;
  bool model_output = false;  // absent in the file when false
  std::string unsupported;
  // What the analysis decided, as the file says (checked against this dbrq's analysis).
  std::string role, fusion;
  int fusion_base = -1, fusion_position = -1, residual_input = -1;
  std::vector<int> input_observers;
  int output_observer = -1;
};

struct FileModule {
  std::string fqn, type;
  bool recorded = false;
  std::vector<int> records;  // global indices, in the module's order
  std::vector<NonQuantOpInfo> non_quant;
  std::vector<PathInfo> paths;  // records as the module's indices
  std::vector<int> first_sequence;
};

struct FileSlot {
  int record = -1, input = -1, root = -1;
  std::string owner;
  std::optional<ObserverSpec> spec;  // roots
  QuantParamsPtr qparams;
  bool frozen = false;  // qparams fixed by an earlier load: convert uses them, not the statistics
  bool infinite = false;  // ObserverSlot::infinite
  std::optional<Observer::Stats> stats;
};

// The observed output of a record inside a fused chain (ModelQuantState::inner_output_observer).
struct FileInner {
  int record = -1;  // global index in the document
  ObserverSpec spec;
  Observer::Stats stats;
};

struct Document {
  std::vector<FileModule> modules;
  std::vector<FileRecord> records;  // by global index
  std::vector<FileSlot> slots;
  std::vector<FileInner> inner;
  std::map<std::string, uint64_t> calibrated_values;  // ModelQuantState::calibrated_values
  std::set<std::string> varied_values;                // ModelQuantState::varied_values
  uint64_t calls = 0;
};

using RecordKey = std::tuple<int, int64_t, OpKind, ProducerTags>;
// Whether a part of a parameter read from a file lies inside the model's parameter `param`.
bool view_fits(const WeightView& v, const Tensor& param) {
  // [lo, hi]: the first and last element the geometry reaches; false when it is not a valid one
  // (negative, or overflowing: a crafted file).
  auto extent = [](int64_t offset, IntArrayRef sizes, IntArrayRef strides, int64_t* lo, int64_t* hi) {
    *lo = *hi = offset;
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] < 0 || strides[d] < 0) return false;
      if (sizes[d] == 0) return true;  // no elements
      int64_t span = 0;
      if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &span) || __builtin_add_overflow(*hi, span, hi)) {
        return false;
      }
    }
    return true;
  };
  int64_t lo, hi, plo, phi;
  if (!extent(v.offset, v.sizes, v.strides, &lo, &hi)) return false;
  if (!extent(param.storage_offset(), param.sizes(), param.strides(), &plo, &phi)) return false;
  return lo >= plo && hi <= phi;
}

RecordKey key_of(const FileRecord& r) { return {r.module, r.tag, r.kind, r.producers}; }

// A record's check: a fingerprint of everything else it holds (its JSON text, keys sorted), so an
// edit of any part a tag does not cover (a layer's weights, where inputs come from, the analysis)
// shows on load.
std::string record_check(const json& record) {
  if (!record.contains("check")) return hex64(name_fingerprint(record.dump()));
  json rest = record;
  rest.erase("check");
  return hex64(name_fingerprint(rest.dump()));
}

// ---- saving ---------------------------------------------------------------------------------

json qparams_to_json(const QuantParamsPtr& q) {
  if (q == nullptr) return nullptr;
  return json{{"scales", q->scales}, {"zero_points", q->zero_points}, {"axis", q->axis}};
}

json origin_to_json(ModelQuantState& model, int64_t id) {
  const ModelQuantState::TensorRecord* r = model.tensor(id);
  DBRQ_CHECK(r != nullptr, "origin ", id, " is not a tensor of this model");
  if (r->record >= 0) return json{{"op", r->record}};
  return json{{"source", hex64(r->source)}};
}

json stats_to_json(const Observer& o) {
  const Observer::Stats st = o.stats();
  json fields = json::object();
  for (auto& [name, values] : st.fields) fields[name] = values;
  json j = {{"fields", fields}, {"num_batches", st.num_batches}, {"nan_count", st.nan_count}, {"inf_count", st.inf_count}};
  if (st.mask_count != 0) j["mask_count"] = st.mask_count;  // absent in files from before it existed
  return j;
}

json op_to_json(ModelQuantState& model, const SeenOpInfo& op) {
  json j{{"index", op.index}, {"global", op.global_index}, {"kind", op_name(op.kind)}, {"fqn", op.fqn},
         {"leaf", op.leaf != nullptr}, {"tag", hex64(static_cast<uint64_t>(op.tag))}};
  // Only under an OpIdentityScope (nn::GRU / nn::LSTM layers after the first): other records, and
  // so the files of every other model, stay as they were.
  if (op.identity_salt != 0) j["salt"] = hex64(op.identity_salt);
  json producers = json::array();
  for (int64_t p : op.producers) producers.push_back(hex64(static_cast<uint64_t>(p)));
  j["producers"] = producers;
  const OpDef& def = op_def(op.kind);
  // Parameters outside an op's identity and without a portable form (contiguous's memory format)
  // play no part in the int8 program: the op runs with each call's own.
  if (!op.params.empty() && (def.params_to_fields != nullptr || def.params_in_identity)) {
    DBRQ_ENSURE(def.params_to_fields != nullptr, UsageError, "save_quant_state: ", op_name(op.kind),
                " has parameters without a portable form");
    json params = json::object();
    for (const auto& [name, values] : def.params_to_fields(op.params.get())) params[name] = values;
    j["params"] = params;
  }
  if (op.has_scalar) {
    j["scalar"] = op.scalar;
    j["scalar_first"] = op.scalar_first;
  }
  if (op.broadcasts) j["broadcasts"] = true;
  // A parameter's or buffer's name, "" for a computed tensor, null if absent; a part of a
  // parameter as {"of": name, "offset", "sizes", "strides"} (in elements).
  json weights = json::array();
  for (const WeightInfo& w : op.weights) {
    if (w.has_view) {
      weights.push_back({{"of", w.fqn}, {"offset", w.view.offset}, {"sizes", w.view.sizes}, {"strides", w.view.strides}});
    } else {
      weights.push_back(w.tensor.defined() || w.missing ? json(w.fqn) : json(nullptr));
    }
  }
  j["weights"] = weights;
  j["qconfig"] = qconfig_string(op.qconfig);
  json inputs = json::array();
  for (const QTensorInfo& t : op.inputs) {
    json origins = json::array({origin_to_json(model, t.id)});
    for (int64_t id : t.more_ids) origins.push_back(origin_to_json(model, id));
    inputs.push_back({{"dtype", dtype_name(t.inf_dtype)}, {"trace_dtype", dtype_name(t.trace_dtype)}, {"origins", origins}});
  }
  j["inputs"] = inputs;
  json outputs = json::array();
  for (const QTensorInfo& t : op.outputs) outputs.push_back({{"dtype", dtype_name(t.inf_dtype)}});
  j["outputs"] = outputs;
  j["read_by_fp32"] = op.read_by_fp32;
  j["escapes"] = op.escapes;
  j["read_twice"] = op.read_twice;
  // Only when true, so files of models that return no record's output directly are unchanged.
  if (op.model_output) j["model_output"] = true;
  j["role"] = quant_role_name(op.role);
  if (op.fusion.fused()) {
    std::vector<std::string> pattern;
    for (OpKind k : op.fusion.pattern) pattern.push_back(op_name(k));
    j["fusion"] = {{"pattern", pattern},
                   {"base", op.fusion.base},
                   {"position", op.fusion.position},
                   {"residual_input", op.fusion.residual_input}};
  }
  j["input_observers"] = op.input_observers;
  j["output_observer"] = op.output_observer;
  if (!op.unsupported.empty()) j["unsupported"] = op.unsupported;
  j["check"] = record_check(j);
  return j;
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
           {"qconfig_mapping", model.mapping().to_string()},
           {"calls", model.call_count()}};
  if (model.strict()) doc["strict"] = true;  // one op sequence per module (PrepareOptions::strict_control_flow)
  json modules = json::array();
  for (const AutoQuantizationState* s : model.states()) {
    json m{{"fqn", s->fqn()}, {"type", s->type_name()}, {"recorded", s->recorded()}};
    json ops = json::array();
    for (const SeenOpInfo& op : s->seen_ops()) ops.push_back(op_to_json(model, op));
    m["seen_ops"] = ops;
    json other = json::array();
    for (const NonQuantOpInfo& o : s->non_quant_ops()) {
      other.push_back({{"kind", op_name(o.kind)}, {"fqn", o.fqn}, {"reason", o.reason}});
    }
    m["non_quant_ops"] = other;
    json paths = json::array();
    for (const PathInfo& p : s->paths()) paths.push_back({{"ops", p.records}, {"calls", p.calls}});
    m["paths"] = paths;
    if (model.strict()) m["first_sequence"] = const_cast<AutoQuantizationState*>(s)->first_sequence();
    modules.push_back(m);
  }
  doc["modules"] = modules;
  json slots = json::array();
  for (size_t i = 0; i < model.num_slots(); ++i) {
    const int root = model.find(static_cast<int>(i));
    const ObserverSlot& e = model.slot_entry(static_cast<int>(i));
    json j{{"slot", i}, {"root", root}, {"record", e.record}, {"input", e.input}, {"owner", e.owner}};
    if (root == static_cast<int>(i)) {
      ObserverSlot& slot = model.slot(root);
      j["observer"] = spec_to_json(slot.observer->spec());
      QuantParamsPtr qp = slot.qparams;
      if (qp == nullptr && slot.observer->has_data()) qp = slot.observer->calculate_qparams();
      j["qparams"] = qparams_to_json(qp);
      // Parameters fixed by a loaded file stay fixed (convert uses them, not the statistics);
      // without statistics every file's parameters are.
      if (options.include_observer_stats && slot.frozen) j["frozen"] = true;
      // Infinities seen here (an additive -inf mask): convert runs its ops fp32, also from a file
      // without statistics.
      if (slot.saw_infinities()) j["infinities"] = true;
      // An observer that saw nothing has no statistics to restore (its range would be written as
      // null, which no loader could read back): its slot keeps its fresh observer. The range is
      // for readers of the file; only files with statistics have it (loading restores it, so a
      // file saved again is the same text).
      if (options.include_observer_stats && slot.observer->has_data()) {
        j["range"] = {slot.observer->min_val(), slot.observer->max_val()};
        j["stats"] = stats_to_json(*slot.observer);
      }
    }
    slots.push_back(j);
  }
  doc["observers"] = slots;
  // What the outputs of records inside fused chains were observed to be (inner_output_observer):
  // a merge whose union breaks such a chain starts the record's new output slot from them, as
  // analysis does when one process's path breaks it. Only in files with statistics, only when
  // there are any (other files are unchanged).
  if (options.include_observer_stats) {
    json inner = json::array();
    for (const auto& [record, o] : model.inner_outputs()) {
      if (o == nullptr || !o->has_data()) continue;
      inner.push_back({{"record", record}, {"observer", spec_to_json(o->spec())}, {"stats", stats_to_json(*o)}});
    }
    if (!inner.empty()) doc["inner_outputs"] = inner;
  }
  // The values of the parameters calibration saw (hashes): convert after loading the file checks
  // that the weights loaded are those (files from before these hashes are not checked).
  if (!model.calibrated_values().empty()) {
    json values = json::object();
    for (const auto& [name, hash] : model.calibrated_values()) values[name] = hex64(hash);
    doc["calibrated_values"] = values;
  }
  if (!model.varied_values().empty()) doc["varied_values"] = model.varied_values();
  return doc.dump(1);
}

namespace {

// Per-channel statistics and parameters are per channel of a tensor the trace does not record the
// sizes of: this bounds them (no layer has more channels).
constexpr size_t kMaxChannels = size_t{1} << 16;
// A document nests 6 levels deep (observers / slot / stats / fields / histogram).
constexpr int kMaxDepth = 16;
// A file may hold records of paths the example run did not take: up to this many times what the
// example run recorded plus the model's layers (a 3-way switch the example crosses once needs 3; a
// mixture of experts is covered by its layers). The bound only keeps a hostile document from
// building a DOM far larger than the model's state could need.
constexpr size_t kMaxPathGrowth = 16;

// How many values a slot's statistics field or parameter array may hold.
size_t max_slot_values(const ObserverSpec& spec) {
  if (is_per_channel(spec.qscheme)) return kMaxChannels;
  return static_cast<size_t>(std::max(spec.bins, 16));
}

// An upper bound of the JSON values, keys and containers in any document for this model: a
// document is parsed against it, so a hostile one cannot make the parser build a DOM (16 to 80
// bytes per byte of JSON) much larger than the model's own state could need.
size_t max_document_values(ModelQuantState& model) {
  size_t per_record = 256, records = 16, per_slot = 128;
  for (const AutoQuantizationState* s : model.states()) {
    for (const SeenOpInfo& op : s->seen_ops()) {
      per_record = std::max(per_record, 128 + 16 * (op.inputs.size() + op.weights.size() + op.producers.size()));
      ++records;
    }
  }
  if (model.root() != nullptr) records += model.root()->named_modules().size();
  for (size_t i = 0; i < model.num_slots(); ++i) {
    if (model.find(static_cast<int>(i)) == static_cast<int>(i)) {
      per_slot = std::max(per_slot, 128 + 2 * max_slot_values(model.slot(static_cast<int>(i)).observer->spec()));
    }
  }
  // A record is listed once, in each path that crosses it (64 values a path) and has at most one
  // observer of its own (its output; an input observer is the output of another record or of an
  // fp32 source).
  // (And at most one inner output observer.)
  return 1024 + kMaxPathGrowth * records * (per_record + 64 + 2 * per_slot);
}

json parse_limited(ModelQuantState& model, const std::string& text, const std::string& source) {
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
    return json::parse(text, limit);
  } catch (const json::exception& e) {
    // nlohmann quotes the last token, which can be most of the document ("[[[[..."): keep it short.
    std::string what = e.what();
    if (what.size() > 300) what = what.substr(0, 300) + "...";
    DBRQ_THROW(FileFormatError, "quant state ", source, " is not valid JSON: ", what);
  }
}

// The layer module named `fqn` and its quantization info, or null.
const nn::Module* leaf_module(ModelQuantState& model, const std::string& fqn) {
  if (model.root() == nullptr) return nullptr;
  const nn::Module* m = model.root()->find_module(fqn);
  return m != nullptr && dynamic_cast<const LeafQuantInfo*>(m->extension()) != nullptr ? m : nullptr;
}

std::string op_where(const FileModule& m, const FileRecord& r) {
  return absl::StrCat("module \"", m.fqn, "\" op ", r.index, " (", op_name(r.kind), " ", r.fqn, ")");
}

// Parses and checks everything that does not need the program rebuilt: the header, the modules
// (the model's, in its order), each record against this model's layers, weights and qconfigs, the
// observers' specs, parameters and statistics.
Document parse_document(ModelQuantState& model, const std::string& model_type, const json& doc,
                        const std::string& source) {
  Document d;
  const std::string where = "quant state " + source;
  DBRQ_ENSURE(doc.is_object() && doc.value("format", "") == kFormat, FileFormatError, "quant state ", source,
              " is not a dbrq quant-state document (format \"", kFormat, "\")");
  const int version = get_integer<int>(doc.at("version"), "version");
  if (version != kQuantStateVersion) {
    mismatch(source, absl::StrCat("file version ", version, ", this dbrq reads version ", kQuantStateVersion,
                                  version < kQuantStateVersion ? " (calibrate again and save with this dbrq)" : ""));
  }
  const std::string file_type = get_string(doc.at("model_type"), "model_type");
  if (file_type != model_type) mismatch(source, absl::StrCat("made for model ", file_type, ", this is ", model_type));
  const std::string backend = get_string(doc.at("backend"), "backend");
  if (backend != model.backend().name()) {
    mismatch(source, absl::StrCat("made for backend ", backend, ", this model uses ", model.backend().name()));
  }
  d.calls = get_integer<uint64_t>(doc.at("calls"), "calls");
  const json& modules = get_array(doc.at("modules"), "modules");
  const auto& states = model.states();
  for (size_t i = 0; i < states.size() || i < modules.size(); ++i) {
    if (i >= modules.size()) mismatch(source, absl::StrCat("module \"", states[i]->fqn(), "\" is not in the file"));
    const std::string fqn = get_string(modules[i].at("fqn"), "module fqn");
    if (i >= states.size()) mismatch(source, absl::StrCat("the file has module \"", fqn, "\", the model does not"));
    if (fqn != states[i]->fqn()) {
      mismatch(source, absl::StrCat("module ", i, " is \"", fqn, "\" in the file but \"", states[i]->fqn(), "\" in the model"));
    }
  }
  std::map<std::string, Tensor> tensor_names;  // the model's parameters and buffers
  if (model.root() != nullptr) {
    for (const auto& [name, t] : model.root()->state_dict()) tensor_names.emplace(name, t);
  }
  if (doc.contains("calibrated_values")) {
    const json& values = doc.at("calibrated_values");
    if (!values.is_object()) throw WrongType("calibrated_values must be an object, got " + excerpt(values));
    for (const auto& [name, hash] : values.items()) {
      if (tensor_names.count(name) == 0) {
        mismatch(source, absl::StrCat("the file has calibrated values of \"", name, "\", the model has no such parameter or buffer"));
      }
      d.calibrated_values[name] = get_hex64(hash, "a calibrated value's hash");
    }
  }
  if (doc.contains("varied_values")) {
    for (const json& j : get_array(doc.at("varied_values"), "varied_values")) {
      const std::string& name = get_string(j, "a varied value's name");
      if (tensor_names.count(name) == 0) {
        mismatch(source, absl::StrCat("the file has varied values of \"", name, "\", the model has no such parameter or buffer"));
      }
      d.varied_values.insert(name);
      d.calibrated_values.erase(name);
    }
  }
  // Records first (their global indices must cover 0..n-1 once), then each module's notes.
  size_t total = 0;
  for (const json& m : modules) total += get_array(m.at("seen_ops"), "seen_ops").size();
  d.records.resize(total);
  std::vector<bool> seen(total, false);
  d.modules.resize(modules.size());
  for (size_t mi = 0; mi < modules.size(); ++mi) {
    const json& mj = modules[mi];
    FileModule& fm = d.modules[mi];
    AutoQuantizationState& s = *states[mi];
    fm.fqn = s.fqn();
    fm.type = get_string(mj.at("type"), "module type");
    fm.recorded = get_bool(mj.at("recorded"), "recorded");
    const json& ops = mj.at("seen_ops");
    for (size_t k = 0; k < ops.size(); ++k) {
      const json& o = ops[k];
      DBRQ_ENSURE(o.is_object(), FileFormatError, where, ": module \"", fm.fqn, "\" op ", k, " is not an object");
      const std::string check = get_string(o.at("check"), "check");
      DBRQ_ENSURE(check == record_check(o), FileFormatError, where, ": module \"", fm.fqn, "\" op ", k,
                  " fails its check (", check, ", its content gives ", record_check(o),
                  "): the record was edited or is corrupt");
      const int g = get_integer<int>(o.at("global"), "global");
      DBRQ_ENSURE(g >= 0 && static_cast<size_t>(g) < total && !seen[static_cast<size_t>(g)], FileFormatError, where,
                  ": module \"", fm.fqn, "\" op ", k, " has global index ", g, ", not a free one in [0, ", total, ")");
      DBRQ_ENSURE(get_integer<int>(o.at("index"), "index") == static_cast<int>(k), FileFormatError, where,
                  ": module \"", fm.fqn, "\" op ", k, " says it is op ", o.at("index").dump());
      // A module's records were created in its order: global indices increase along it.
      DBRQ_ENSURE(fm.records.empty() || fm.records.back() < g, FileFormatError, where, ": module \"", fm.fqn,
                  "\" op ", k, " has global index ", g, ", before its op ", k - 1, "'s");
      seen[static_cast<size_t>(g)] = true;
      fm.records.push_back(g);
      FileRecord& r = d.records[static_cast<size_t>(g)];
      r.module = static_cast<int>(mi);
      r.index = static_cast<int>(k);
      r.kind = op_kind_from_name(get_string(o.at("kind"), "kind"));
      r.fqn = get_string(o.at("fqn"), "op fqn");
      r.leaf = get_bool(o.at("leaf"), "leaf");
      r.tag = static_cast<int64_t>(get_hex64(o.at("tag"), "tag"));
      for (const json& p : get_array(o.at("producers"), "producers")) {
        r.producers.push_back(static_cast<int64_t>(get_hex64(p, "producer tag")));
      }
      if (o.contains("salt")) r.salt = get_hex64(o.at("salt"), "salt");
      const OpDef& def = op_def(r.kind);
      if (o.contains("params")) {
        DBRQ_ENSURE(def.params_from_fields != nullptr, FileFormatError, where, ": ", op_where(fm, r),
                    " has parameters, which ", op_name(r.kind), " does not take");
        const json& pj = o.at("params");
        if (!pj.is_object()) throw WrongType(absl::StrCat("params must be an object, got ", excerpt(pj)));
        ParamFields fields;
        for (auto it = pj.begin(); it != pj.end(); ++it) {
          std::vector<double> values;
          for (const json& v : get_array(it.value(), "a parameter field")) values.push_back(get_double(v, "a parameter"));
          fields.emplace_back(it.key(), std::move(values));
        }
        r.params = def.params_from_fields(fields);
        r.params_fingerprint = def.params_fingerprint(r.params.get());
      }
      if (o.contains("broadcasts")) r.broadcasts = get_bool(o.at("broadcasts"), "broadcasts");
      if (o.contains("scalar")) {
        r.has_scalar = true;
        r.scalar = get_double(o.at("scalar"), "scalar");
        r.scalar_first = get_bool(o.at("scalar_first"), "scalar_first");
      }
      for (const json& w : get_array(o.at("weights"), "weights")) {
        r.weight_absent.push_back(w.is_null());
        r.weight_has_view.push_back(w.is_object());
        r.weight_views.emplace_back();
        if (w.is_object()) {
          WeightView& v = r.weight_views.back();
          r.weights.push_back(get_string(w.at("of"), "weight"));
          v.offset = get_integer<int64_t>(w.at("offset"), "weight offset");
          v.sizes = get_integers<int64_t>(w.at("sizes"), "weight sizes");
          v.strides = get_integers<int64_t>(w.at("strides"), "weight strides");
          DBRQ_ENSURE(!r.weights.back().empty() && v.sizes.size() == v.strides.size() && v.offset >= 0,
                      FileFormatError, where, ": ", op_where(fm, r), " has a part of a parameter with ",
                      v.sizes.size(), " sizes and ", v.strides.size(), " strides at offset ", v.offset,
                      " (of \"", r.weights.back(), "\")");
        } else {
          r.weights.push_back(w.is_null() ? std::string() : get_string(w, "weight"));
        }
      }
      r.qconfig = get_string(o.at("qconfig"), "qconfig");
      for (const json& in : get_array(o.at("inputs"), "inputs")) {
        FileInput fi;
        fi.trace_dtype = dtype_from_name(get_string(in.at("trace_dtype"), "trace_dtype"));
        for (const json& org : get_array(in.at("origins"), "origins")) {
          FileOrigin fo;
          if (org.contains("op")) {
            fo.record = get_integer<int>(org.at("op"), "origin op");
            DBRQ_ENSURE(fo.record >= 0 && static_cast<size_t>(fo.record) < total, FileFormatError, where, ": ",
                        op_where(fm, r), " reads the output of op ", fo.record, ", which the file does not have");
          } else {
            fo.source = get_hex64(org.at("source"), "origin source");
          }
          fi.origins.push_back(fo);
        }
        DBRQ_ENSURE(!fi.origins.empty(), FileFormatError, where, ": ", op_where(fm, r), " has an input with no origin");
        r.inputs.push_back(std::move(fi));
      }
      DBRQ_ENSURE(r.producers.size() == r.inputs.size(), FileFormatError, where, ": ", op_where(fm, r), " has ",
                  r.producers.size(), " producer tags for ", r.inputs.size(), " inputs");
      r.num_outputs = get_array(o.at("outputs"), "outputs").size();
      DBRQ_ENSURE(r.num_outputs == 1, FileFormatError, where, ": ", op_where(fm, r), " has ", r.num_outputs,
                  " outputs; recorded ops have one");
      r.read_by_fp32 = get_bool(o.at("read_by_fp32"), "read_by_fp32");
      r.escapes = get_bool(o.at("escapes"), "escapes");
      r.read_twice = get_bool(o.at("read_twice"), "read_twice");
      if (o.contains("model_output")) r.model_output = get_bool(o.at("model_output"), "model_output");
      if (o.contains("unsupported")) r.unsupported = get_string(o.at("unsupported"), "unsupported");
      r.role = get_string(o.at("role"), "role");
      if (o.contains("fusion")) {
        const json& f = o.at("fusion");
        for (const json& k2 : get_array(f.at("pattern"), "fusion pattern")) {
          r.fusion += (r.fusion.empty() ? "" : "+") + get_string(k2, "fusion pattern op");
        }
        r.fusion_base = get_integer<int>(f.at("base"), "fusion base");
        r.fusion_position = get_integer<int>(f.at("position"), "fusion position");
        r.residual_input = get_integer<int>(f.at("residual_input"), "residual_input");
      }
      r.input_observers = get_integers<int>(o.at("input_observers"), "input_observers");
      r.output_observer = get_integer<int>(o.at("output_observer"), "output_observer");

      // The tag is a function of what the record says it is: an edited kind, layer, salt,
      // parameter, scalar or weight shows.
      uint64_t h = tag_start(r.kind, r.leaf ? name_fingerprint(r.fqn) : 0);
      if (r.salt != 0) h = fingerprint_mix(h, r.salt);
      if (def.params_in_identity && !r.params.empty()) h = fingerprint_mix(h, r.params_fingerprint);
      if (r.has_scalar) h = tag_scalar(h, r.scalar, r.scalar_first);
      if (!r.leaf) {
        for (size_t i = 0; i < r.weights.size(); ++i) {
          h = tag_weight(h, r.weights[i].empty() ? 1u : name_fingerprint(r.weights[i]),
                         r.weight_has_view[i] ? &r.weight_views[i] : nullptr);
        }
      }
      DBRQ_ENSURE(tag_finish(h) == r.tag, FileFormatError, where, ": ", op_where(fm, r), " has tag ", hex64(r.tag),
                  ", but its kind, layer, parameters, scalar and weights give ",
                  hex64(static_cast<uint64_t>(tag_finish(h))), ": the record was edited or is corrupt");

      // Against this model: the layer, the weights, the qconfig.
      const nn::Module* leaf = nullptr;
      if (r.leaf) {
        leaf = leaf_module(model, r.fqn);
        if (leaf == nullptr) mismatch(source, absl::StrCat(op_where(fm, r), ": the model has no layer \"", r.fqn, "\""));
      } else if (r.fqn != fm.fqn) {
        mismatch(source, absl::StrCat(op_where(fm, r), ": a functional op of module \"", fm.fqn, "\" named \"", r.fqn, "\""));
      }
      const auto* info = leaf != nullptr ? dynamic_cast<const LeafQuantInfo*>(leaf->extension()) : nullptr;
      QConfigPtr q = s.seen_qconfig(r.kind, info);
      if (info == nullptr && r.qconfig != qconfig_string(q) && s.has_call_sites(r.kind)) {
        // A functional op with call-site entries: the file does not say which call it was; its
        // qconfig must be one the mapping gives a call of this kind here.
        for (const QConfigPtr& c : s.functional_qconfigs(r.kind)) {
          if (c != nullptr && !c->is_bf16() && r.qconfig == qconfig_string(c)) q = c;
        }
      }
      if (r.qconfig != qconfig_string(q)) {
        mismatch(source, absl::StrCat(op_where(fm, r), ": the file's qconfig is ", r.qconfig, ", the model's is ",
                                      qconfig_string(q)));
      }
      for (size_t i = 0; i < r.weights.size(); ++i) {
        const std::string& w = r.weights[i];
        if (w.empty()) continue;  // computed or absent (see rebuild)
        const auto t = tensor_names.find(w);
        if (t == tensor_names.end()) {
          mismatch(source, absl::StrCat(op_where(fm, r), ": the model has no parameter or buffer \"", w, "\""));
        }
        if (r.weight_has_view[i] && !view_fits(r.weight_views[i], t->second)) {
          mismatch(source, absl::StrCat(op_where(fm, r), ": its part of \"", w, "\" (offset ", r.weight_views[i].offset,
                                        ", sizes [", absl::StrJoin(r.weight_views[i].sizes, ", "),
                                        "]) lies outside the model's parameter of sizes ", t->second.shape_string()));
        }
      }
    }
  }
  for (size_t mi = 0; mi < modules.size(); ++mi) {
    const json& mj = modules[mi];
    FileModule& fm = d.modules[mi];
    const int n = static_cast<int>(fm.records.size());
    for (const json& o : get_array(mj.at("non_quant_ops"), "non_quant_ops")) {
      fm.non_quant.push_back({op_kind_from_name(get_string(o.at("kind"), "kind")), get_string(o.at("fqn"), "fqn"),
                              get_string(o.at("reason"), "reason")});
    }
    for (const json& p : get_array(mj.at("paths"), "paths")) {
      PathInfo path;
      path.records = get_integers<int>(p.at("ops"), "path ops");
      path.calls = get_integer<int64_t>(p.at("calls"), "path calls");
      for (int i : path.records) {
        DBRQ_ENSURE(i >= 0 && i < n, FileFormatError, where, ": a path of module \"", fm.fqn, "\" runs op ", i,
                    ", which the module does not have (", n, " ops)");
        path.mask[static_cast<size_t>(i / 64) % 4] |= uint64_t{1} << (i % 64);
      }
      DBRQ_ENSURE(path.calls >= 0, FileFormatError, where, ": a path of module \"", fm.fqn, "\" has ", path.calls,
                  " calls");
      fm.paths.push_back(std::move(path));
    }
    if (mj.contains("first_sequence")) {
      fm.first_sequence = get_integers<int>(mj.at("first_sequence"), "first_sequence");
      for (int i : fm.first_sequence) {
        DBRQ_ENSURE(i >= 0 && i < n, FileFormatError, where, ": the first call of module \"", fm.fqn, "\" runs op ", i,
                    ", which the module does not have");
      }
    }
  }
  // Observers: specs, parameters and statistics, checked for what convert and the observers
  // rely on. (Which records they belong to is checked against the analysis, see check_analysis.)
  const json& slots = get_array(doc.at("observers"), "observers");
  for (size_t i = 0; i < slots.size(); ++i) {
    const json& j = slots[i];
    FileSlot fs;
    fs.root = get_integer<int>(j.at("root"), "root");
    fs.record = get_integer<int>(j.at("record"), "record");
    fs.input = get_integer<int>(j.at("input"), "input");
    fs.owner = get_string(j.at("owner"), "owner");
    if (fs.root == static_cast<int>(i)) {
      const ObserverSpec spec = spec_from_json(j.at("observer"));
      fs.spec = spec;
      fs.qparams = qparams_from_json(j.at("qparams"), spec, where, i, max_slot_values(spec));
      if (j.contains("frozen")) fs.frozen = get_bool(j.at("frozen"), "frozen");
      if (j.contains("infinities")) fs.infinite = get_bool(j.at("infinities"), "infinities");
      DBRQ_ENSURE(!fs.frozen || fs.qparams != nullptr, FileFormatError, where, ": observer ", i,
                  " is frozen but has no parameters");
      if (j.contains("stats")) {
        Observer::Stats st = stats_from_json(j.at("stats"), where, i, max_slot_values(spec));
        // Validate by loading into a scratch observer: the model is only touched once everything
        // has been checked.
        make_observer(spec)->load_stats(st);
        fs.stats = std::move(st);
      }
    }
    d.slots.push_back(std::move(fs));
  }
  if (doc.contains("inner_outputs")) {
    const json& inner = get_array(doc.at("inner_outputs"), "inner_outputs");
    for (size_t i = 0; i < inner.size(); ++i) {
      const json& j = inner[i];
      FileInner fi;
      fi.record = get_integer<int>(j.at("record"), "record");
      DBRQ_ENSURE(fi.record >= 0 && fi.record < static_cast<int>(d.records.size()), FileFormatError, where,
                  ": inner output ", i, " is of record ", fi.record, "; the file has ", d.records.size());
      fi.spec = spec_from_json(j.at("observer"));
      fi.stats = stats_from_json(j.at("stats"), where, d.slots.size() + i, max_slot_values(fi.spec));
      make_observer(fi.spec)->load_stats(fi.stats);  // validated before the model is touched
      d.inner.push_back(std::move(fi));
    }
  }
  const int n_slots = static_cast<int>(d.slots.size());
  for (size_t i = 0; i < d.slots.size(); ++i) {
    const int root = d.slots[i].root;
    DBRQ_ENSURE(root >= 0 && root < n_slots && d.slots[static_cast<size_t>(root)].root == root, FileFormatError,
                where, ": observer ", i, " shares observer ", root, ", which is not an observer of its own");
  }
  for (const FileRecord& r : d.records) {
    for (int o : r.input_observers) {
      DBRQ_ENSURE(o >= -1 && o < n_slots, FileFormatError, where, ": ", op_where(d.modules[static_cast<size_t>(r.module)], r),
                  " has input observer ", o, "; the file has ", n_slots);
    }
    DBRQ_ENSURE(r.output_observer >= -1 && r.output_observer < n_slots, FileFormatError, where, ": ",
                op_where(d.modules[static_cast<size_t>(r.module)], r), " has output observer ", r.output_observer,
                "; the file has ", n_slots);
  }
  // Two records with one identity could never both be found.
  std::set<RecordKey> keys;
  for (const FileRecord& r : d.records) {
    DBRQ_ENSURE(keys.insert(key_of(r)).second, FileFormatError, where, ": ",
                op_where(d.modules[static_cast<size_t>(r.module)], r), " has the identity of an earlier record");
  }
  // A model prepared with strict_control_flow keeps one sequence per module, which only a file
  // saved in that mode has.
  if (model.strict() != (doc.contains("strict") && get_bool(doc.at("strict"), "strict"))) {
    mismatch(source, model.strict() ? "the model was prepared with strict_control_flow, the file was not"
                                    : "the file was saved with strict_control_flow, the model was not prepared with it");
  }
  return d;
}

// The model's current records (from its example run, or calibration so far), by key.
std::map<RecordKey, const SeenOpInfo*> live_records(ModelQuantState& model) {
  std::map<RecordKey, const SeenOpInfo*> out;
  for (size_t mi = 0; mi < model.states().size(); ++mi) {
    for (const SeenOpInfo& op : model.states()[mi]->seen_ops()) {
      out[{static_cast<int>(mi), op.tag, op.kind, op.producers}] = &op;
    }
  }
  return out;
}

// Every record the model has made must be in the file: the model ran it, so the file (made by a
// calibration of the same model) must cover it.
void check_covers(ModelQuantState& model, const Document& d, const std::string& source) {
  std::map<RecordKey, int> in_file;
  for (size_t g = 0; g < d.records.size(); ++g) in_file[key_of(d.records[g])] = static_cast<int>(g);
  for (size_t mi = 0; mi < model.states().size(); ++mi) {
    const AutoQuantizationState& s = *model.states()[mi];
    for (const SeenOpInfo& op : s.seen_ops()) {
      if (in_file.count({static_cast<int>(mi), op.tag, op.kind, op.producers}) != 0) continue;
      // Where the model's op sits in its module's records, the file's op at the same place (a
      // changed model usually departs there; a missing path as well).
      const FileModule& fm = d.modules[mi];
      std::string there;
      if (static_cast<size_t>(op.index) < fm.records.size()) {
        const FileRecord& r = d.records[static_cast<size_t>(fm.records[static_cast<size_t>(op.index)])];
        there = absl::StrCat(" (the file's op ", op.index, " there is ", op_name(r.kind), " (", r.fqn, "))");
      }
      mismatch(source, absl::StrCat("module \"", s.fqn(), "\" ran ", op_name(op.kind), " (", op.fqn,
                                    ") where the file has no record of it", there,
                                    ": the file is missing a path this model takes (calibrate with inputs that "
                                    "take it), or the model's code changed"));
    }
  }
}

// Rebuilds `model`'s recorded program from a document and analyzes it. `live` supplies computed
// weights (by key) that a file cannot hold. Checked documents only: nothing here throws for the
// document's content.
void rebuild(ModelQuantState& model, const Document& d, const std::map<RecordKey, const SeenOpInfo*>& live) {
  // Keep what the model's records captured before they go.
  std::map<RecordKey, std::vector<WeightInfo>> live_weights;
  for (const auto& [key, op] : live) live_weights[key] = op->weights;
  std::map<std::string, Tensor> named;
  if (model.root() != nullptr) {
    for (auto& [name, t] : model.root()->state_dict()) named.emplace(name, t);
  }
  model.clear_program();
  std::vector<int64_t> out_id(d.records.size());
  for (int64_t& id : out_id) id = ModelQuantState::new_tensor_id();
  for (size_t g = 0; g < d.records.size(); ++g) {
    const FileRecord& r = d.records[g];
    AutoQuantizationState& s = *model.states()[static_cast<size_t>(r.module)];
    SeenOpInfo& op = s.add_record(r.tag, r.kind, r.producers);
    op.identity_salt = r.salt;
    op.global_index = static_cast<int>(g);
    op.program_index = op.global_index;
    model.records().emplace_back(&s, op.index);
    op.fqn = r.fqn;
    op.leaf = r.leaf ? leaf_module(model, r.fqn) : nullptr;
    const auto* info = op.leaf != nullptr ? dynamic_cast<const LeafQuantInfo*>(op.leaf->extension()) : nullptr;
    op.qconfig = s.seen_qconfig(r.kind, info);
    if (info == nullptr && r.qconfig != qconfig_string(op.qconfig) && s.has_call_sites(r.kind)) {
      for (const QConfigPtr& c : s.functional_qconfigs(r.kind)) {  // checked above: one matches
        if (c != nullptr && !c->is_bf16() && r.qconfig == qconfig_string(c)) op.qconfig = c;
      }
    }
    for (const FileInput& fi : r.inputs) {
      QTensorInfo t;
      t.trace_dtype = fi.trace_dtype;
      for (size_t k = 0; k < fi.origins.size(); ++k) {
        const FileOrigin& o = fi.origins[k];
        const int64_t id = o.record >= 0 ? out_id[static_cast<size_t>(o.record)] : model.add_fp32_source(o.source);
        if (k == 0) {
          t.id = id;
        } else {
          t.more_ids.push_back(id);
        }
      }
      op.inputs.push_back(std::move(t));
    }
    QTensorInfo out;
    out.id = out_id[g];
    op.outputs.push_back(out);
    ModelQuantState::TensorRecord tr;
    tr.record = static_cast<int>(g);
    model.tensors()[out.id] = tr;
    const auto lw = live_weights.find(key_of(r));
    for (size_t i = 0; i < r.weights.size(); ++i) {
      WeightInfo w;
      w.fqn = r.weights[i];
      if (r.weight_absent[i]) {
        // no tensor
      } else if (!w.fqn.empty()) {
        w.tensor = named.at(w.fqn);
        if (r.weight_has_view[i]) {  // checked to lie inside the parameter (view_fits)
          w.has_view = true;
          w.view = r.weight_views[i];
          w.tensor = w.tensor.raw_as_strided(w.view.sizes, w.view.strides, w.view.offset);
        }
      } else if (lw != live_weights.end() && i < lw->second.size() && lw->second[i].tensor.defined()) {
        w.tensor = lw->second[i].tensor;
      } else {
        w.missing = true;  // computed at run time: from the op's next call, else convert says so
      }
      op.weights.push_back(std::move(w));
    }
    op.has_scalar = r.has_scalar;
    op.broadcasts = r.broadcasts;
    op.scalar = r.scalar;
    op.scalar_first = r.scalar_first;
    op.params = r.params;
    op.params_fingerprint = r.params_fingerprint;
    op.read_by_fp32 = r.read_by_fp32;
    op.escapes = r.escapes;
    op.read_twice = r.read_twice;
    op.model_output = r.model_output;
    op.unsupported = r.unsupported;
  }
  // Who reads each record's output.
  for (size_t g = 0; g < d.records.size(); ++g) {
    const FileRecord& r = d.records[g];
    for (size_t a = 0; a < r.inputs.size(); ++a) {
      for (const FileOrigin& o : r.inputs[a].origins) {
        if (o.record < 0) continue;
        std::vector<Consumer>& cs = model.record(o.record).consumers;
        const Consumer c{static_cast<int>(g), static_cast<int>(a)};
        if (std::find(cs.begin(), cs.end(), c) == cs.end()) cs.push_back(c);
      }
    }
  }
  for (size_t mi = 0; mi < d.modules.size(); ++mi) {
    const FileModule& fm = d.modules[mi];
    AutoQuantizationState& s = *model.states()[mi];
    s.set_recorded(fm.recorded);
    s.non_quant_ops() = fm.non_quant;
    s.first_sequence() = fm.first_sequence;
    s.set_paths(fm.paths);
    for (const PathInfo& p : fm.paths) {
      for (size_t i = 1; i < p.records.size(); ++i) s.set_next_hint(p.records[i - 1], p.records[i]);
    }
  }
  model.set_call_count(d.calls);
  analyze_program(model);
}

// What an analysis mismatch tells the user to do.
constexpr char kRecalibrate[] =
    "The file was written by a dbrq whose analysis differs (another version: fusion and observer placement "
    "change between versions, e.g. ops fused across modules), or for another backend configuration, or edited: "
    "calibrate again and save with this dbrq";

// This dbrq's analysis of the file's records must be what the file says (else the file was made
// by another version or backend configuration, or edited).
void check_analysis(ModelQuantState& model, const Document& d, const std::string& source) {
  for (size_t g = 0; g < d.records.size(); ++g) {
    const FileRecord& r = d.records[g];
    const SeenOpInfo& op = model.record(static_cast<int>(g));
    const FileModule& fm = d.modules[static_cast<size_t>(r.module)];
    const std::string fusion = op.fusion.fused() ? op.fusion.name() : "";
    if (r.fusion != fusion || (op.fusion.fused() && (r.fusion_base != op.fusion.base ||
                                                     r.fusion_position != op.fusion.position ||
                                                     r.residual_input != op.fusion.residual_input))) {
      mismatch(source, absl::StrCat(op_where(fm, r), ": the file has it ",
                                    r.fusion.empty() ? "unfused" : "fused as " + r.fusion, ", this model ",
                                    fusion.empty() ? "unfused" : "fused as " + fusion, ". ", kRecalibrate));
    }
    if (r.role != quant_role_name(op.role)) {
      mismatch(source, absl::StrCat(op_where(fm, r), ": the file runs it as ", r.role, ", this model as ",
                                    quant_role_name(op.role), ". ", kRecalibrate));
    }
    if (r.input_observers != op.input_observers || r.output_observer != op.output_observer) {
      auto slots = [](const std::vector<int>& in, int out) {
        return absl::StrCat("inputs [", absl::StrJoin(in, ", "), "], output ", out);
      };
      mismatch(source, absl::StrCat(op_where(fm, r), ": observer placement differs (the file observes ",
                                    slots(r.input_observers, r.output_observer), ", this dbrq's analysis of the same "
                                    "program ", slots(op.input_observers, op.output_observer), "; -1: none). ",
                                    kRecalibrate));
    }
  }
  if (d.slots.size() != model.num_slots()) {
    mismatch(source, absl::StrCat("the file has ", d.slots.size(), " observers, the model ", model.num_slots()));
  }
  for (size_t i = 0; i < d.slots.size(); ++i) {
    const FileSlot& fs = d.slots[i];
    const ObserverSlot& e = model.slot_entry(static_cast<int>(i));
    if (fs.root != model.find(static_cast<int>(i)) || fs.record != e.record || fs.input != e.input) {
      mismatch(source, absl::StrCat("observer ", i, " is shared differently"));
    }
    if (fs.spec && !(*fs.spec == model.slot(static_cast<int>(i)).observer->spec())) {
      mismatch(source, absl::StrCat("observer ", i, " (tensor of ", e.owner, ") is ", fs.spec->to_string(),
                                    " in the file but ", model.slot(static_cast<int>(i)).observer->spec().to_string(),
                                    " in the model"));
    }
  }
}

// A scratch copy of `model`'s modules (no records): where a document is rebuilt and analyzed
// before the model itself is touched.
struct Scratch {
  std::shared_ptr<ModelQuantState> model;
  std::vector<std::shared_ptr<AutoQuantizationState>> states;
};

Scratch scratch_of(ModelQuantState& model) {
  Scratch s;
  s.model = std::make_shared<ModelQuantState>(model.mapping(), model.backend());
  s.model->set_root(model.root());
  s.model->set_strict(model.strict());
  s.model->set_phase(model.phase());
  for (AutoQuantizationState* st : model.states()) {
    s.states.push_back(std::make_shared<AutoQuantizationState>(st->fqn(), st->type_name(), s.model));
    s.model->states().push_back(s.states.back().get());
  }
  return s;
}

template <typename F>
auto translate_errors(const std::string& source, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const json::exception& e) {
    DBRQ_THROW(FileFormatError, "quant state ", source, " is malformed: ", e.what());
  } catch (const WrongType& e) {
    DBRQ_THROW(FileFormatError, "quant state ", source, " is malformed: ", e.what());
  } catch (const ValueError& e) {
    DBRQ_THROW(FileFormatError, "quant state ", source, " has an invalid value: ", e.what());
  } catch (const DTypeError& e) {
    DBRQ_THROW(FileFormatError, "quant state ", source, " has an invalid value: ", e.what());
  }
}

// Parses and checks a document completely (including this dbrq's analysis of its records, on a
// scratch copy); the model is not changed.
Document checked_document(ModelQuantState& model, const std::string& model_type, const std::string& text,
                          const std::string& source) {
  const json doc = parse_limited(model, text, source);
  Document d = translate_errors(source, [&] { return parse_document(model, model_type, doc, source); });
  check_covers(model, d, source);
  Scratch scratch = scratch_of(model);
  rebuild(*scratch.model, d, live_records(model));
  check_analysis(*scratch.model, d, source);
  return d;
}

// Restores observers: each root gets the statistics (or frozen parameters) of the file's
// observers whose slots its members had. With one document and the same analysis that is one
// file observer per root, restored exactly; a merge may bring several, which are merged.
struct StatsSource {
  const Document* doc;
  std::vector<int> record_of;  // model's global index -> the document's (-1: not there)
};

void restore_observers(ModelQuantState& model, const std::vector<StatsSource>& sources) {
  // Model root -> (source, file root), found through each record's own observers: an fp32
  // tensor's observer is keyed by whichever consumer came first, which may differ between sources
  // (replicas prepared on examples that took different paths).
  std::map<int, std::vector<std::pair<size_t, int>>> from;
  auto add = [&](int model_slot, size_t k, int file_slot) {
    if (model_slot < 0 || file_slot < 0) return;
    const int root = sources[k].doc->slots[static_cast<size_t>(file_slot)].root;  // checked when parsed
    std::vector<std::pair<size_t, int>>& v = from[model.find(model_slot)];
    const std::pair<size_t, int> src{k, root};
    if (std::find(v.begin(), v.end(), src) == v.end()) v.push_back(src);
  };
  const SoleOrigins sole(model);
  for (size_t g = 0; g < model.records().size(); ++g) {
    const SeenOpInfo& op = model.record(static_cast<int>(g));
    for (size_t k = 0; k < sources.size(); ++k) {
      const int rec = sources[k].record_of[g];
      if (rec < 0) continue;
      const FileRecord& fr = sources[k].doc->records[static_cast<size_t>(rec)];
      for (size_t a = 0; a < op.input_observers.size() && a < fr.input_observers.size(); ++a) {
        add(op.input_observers[a], k, fr.input_observers[a]);
      }
      add(op.output_observer, k, fr.output_observer);
      // The model's input has an observer of its own (several origins) where this source's had
      // none (one origin there, taken with its parameters): the values that arrived there are in
      // the observers of its sole origins. Without them a replica that took one branch lost its
      // ranges to one that also took the other (2-5 dB against 36-39 dB;
      // PathsAfterConvert.AReplicaThatTookOneBranchKeepsItsRanges).
      for (size_t a = 0; a < op.input_observers.size(); ++a) {
        if (op.input_observers[a] < 0 || op.inputs[a].num_origins() < 2) continue;
        if (a < fr.input_observers.size() && fr.input_observers[a] >= 0) continue;
        for (const int64_t id : sole.of(static_cast<int>(g), a)) {
          const int producer = sources[k].record_of[static_cast<size_t>(model.tensor(id)->record)];
          if (producer >= 0) add(op.input_observers[a], k, sources[k].doc->records[static_cast<size_t>(producer)].output_observer);
        }
      }
    }
  }
  for (auto& [root, list] : from) {
    ObserverSlot& slot = model.slot(root);
    bool have_stats = false;
    QuantParamsPtr frozen, params_only;
    for (auto [k, fr] : list) {
      const FileSlot& fs = sources[k].doc->slots[static_cast<size_t>(fr)];
      if (!fs.spec || !(*fs.spec == slot.observer->spec())) continue;
      if (fs.frozen && frozen == nullptr) frozen = fs.qparams;
      if (fs.stats) {
        if (!have_stats) {
          slot.observer->load_stats(*fs.stats);
        } else {
          auto other = make_observer(*fs.spec);
          other->load_stats(*fs.stats);
          slot.observer->merge(*other);
        }
        have_stats = true;
      } else if (params_only == nullptr) {
        params_only = fs.qparams;
      }
    }
    for (auto [k, fr] : list) slot.infinite |= sources[k].doc->slots[static_cast<size_t>(fr)].infinite;
    // Frozen parameters stay frozen; a parameters-only file freezes its parameters; statistics
    // are turned into parameters at convert.
    slot.qparams = frozen != nullptr ? frozen : (have_stats ? nullptr : params_only);
    slot.frozen = slot.qparams != nullptr;
  }
}

// Restores the documents' inner output observers: into the record's output slot when the
// model's analysis gives it one (the union broke the chain), else into the record's own inner
// observer (still fused: kept for a later break). Several sources are merged.
void restore_inner_outputs(ModelQuantState& model, const std::vector<StatsSource>& sources) {
  auto into = [](Observer& o, const FileInner& fi) {
    if (!o.has_data()) {
      o.load_stats(fi.stats);
    } else {
      auto other = make_observer(fi.spec);
      other->load_stats(fi.stats);
      o.merge(*other);
    }
  };
  for (const StatsSource& src : sources) {
    std::map<int, int> model_of;  // document record -> model record
    for (size_t g = 0; g < src.record_of.size(); ++g) {
      if (src.record_of[g] >= 0) model_of[src.record_of[g]] = static_cast<int>(g);
    }
    for (const FileInner& fi : src.doc->inner) {
      auto it = model_of.find(fi.record);
      if (it == model_of.end()) continue;
      const SeenOpInfo& op = model.record(it->second);
      if (op.output_observer >= 0) {
        ObserverSlot& slot = model.slot(model.find(op.output_observer));
        if (slot.observer->spec() == fi.spec && !slot.frozen) into(*slot.observer, fi);
      } else {
        into(model.inner_output_observer(it->second, fi.spec), fi);
      }
    }
  }
}

}  // namespace

std::string reseal_quant_state(const std::string& text) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    DBRQ_THROW(FileFormatError, "reseal_quant_state: not valid JSON: ", e.what());
  }
  DBRQ_ENSURE(doc.is_object() && doc.contains("modules") && doc["modules"].is_array(), FileFormatError,
              "reseal_quant_state: not a quant-state document");
  for (json& m : doc["modules"]) {
    if (!m.is_object() || !m.contains("seen_ops") || !m["seen_ops"].is_array()) continue;
    for (json& op : m["seen_ops"]) {
      if (op.is_object()) op["check"] = record_check(op);
    }
  }
  return doc.dump(1);
}

void check_quant_state(ModelQuantState& model, const std::string& model_type, const std::string& json_text,
                       const std::string& source) {
  checked_document(model, model_type, json_text, source);
}

void quant_state_from_json(ModelQuantState& model, const std::string& model_type, const std::string& text,
                           const std::string& source) {
  const Document d = checked_document(model, model_type, text, source);
  rebuild(model, d, live_records(model));
  std::vector<int> identity(d.records.size());
  for (size_t g = 0; g < identity.size(); ++g) identity[g] = static_cast<int>(g);
  restore_observers(model, {StatsSource{&d, identity}});
  restore_inner_outputs(model, {StatsSource{&d, identity}});
  model.calibrated_values() = d.calibrated_values;  // the file's calibration, made with those values
  model.varied_values() = d.varied_values;
}

void merge_quant_state(ModelQuantState& into, const std::string& model_type, const std::string& replica_text,
                       const std::string& source, ModelQuantState* replica) {
  SaveQuantStateOptions with_stats;
  with_stats.include_observer_stats = true;
  const Document own = checked_document(into, model_type, quant_state_to_json(into, model_type, with_stats), "(model)");
  // The replica's records need not include ours (it may have taken other paths): no coverage check.
  const json doc = parse_limited(into, replica_text, source);
  const Document rep = translate_errors(source, [&] { return parse_document(into, model_type, doc, source); });
  // Computed weights (which no document holds) come from either model's records.
  std::map<RecordKey, const SeenOpInfo*> live = live_records(into);
  if (replica != nullptr) {
    for (const auto& [key, op] : live_records(*replica)) live.emplace(key, op);
  }
  {
    // This dbrq's analysis of the replica's records must be what its document says.
    Scratch scratch = scratch_of(into);
    rebuild(*scratch.model, rep, live);
    check_analysis(*scratch.model, rep, source);
  }
  // The union: ours in our order, then the replica's others in its order.
  Document merged;
  merged.modules = own.modules;
  merged.records = own.records;
  merged.calls = own.calls + rep.calls;
  // Replicas of one model calibrate the same weights: a replica calibrated with other values of a
  // parameter has ranges that describe another model. A buffer whose values differ between them
  // varied while calibrating (a mask set before each call, one call per replica); so did anything
  // either one saw vary.
  merged.varied_values = own.varied_values;
  merged.varied_values.insert(rep.varied_values.begin(), rep.varied_values.end());
  std::set<std::string> parameter_names;
  if (into.root() != nullptr) {
    for (const auto& [name, t] : into.root()->named_parameters()) parameter_names.insert(name);
  }
  for (const Document* d : {&own, &rep}) {
    for (const auto& [name, hash] : d->calibrated_values) {
      if (merged.varied_values.count(name) != 0) continue;
      const auto it = merged.calibrated_values.emplace(name, hash).first;
      if (it->second == hash) continue;
      if (parameter_names.count(name) == 0) {
        merged.calibrated_values.erase(it);
        merged.varied_values.insert(name);
        continue;
      }
      mismatch(source, absl::StrCat("the replica was calibrated with other values of \"", name,
                                    "\" than this model; replicas must hold the same weights"));
    }
  }
  std::map<RecordKey, int> index;
  for (size_t g = 0; g < merged.records.size(); ++g) index[key_of(merged.records[g])] = static_cast<int>(g);
  std::vector<int> rep_to_merged(rep.records.size());
  for (size_t g = 0; g < rep.records.size(); ++g) {
    const FileRecord& r = rep.records[g];
    auto it = index.find(key_of(r));
    if (it != index.end()) {
      rep_to_merged[g] = it->second;
      continue;
    }
    FileRecord copy = r;
    FileModule& fm = merged.modules[static_cast<size_t>(r.module)];
    copy.index = static_cast<int>(fm.records.size());
    const int mg = static_cast<int>(merged.records.size());
    fm.records.push_back(mg);
    merged.records.push_back(std::move(copy));
    index[key_of(r)] = mg;
    rep_to_merged[g] = mg;
  }
  auto remap = [&](FileOrigin o) {
    if (o.record >= 0) o.record = rep_to_merged[static_cast<size_t>(o.record)];
    return o;
  };
  std::vector<bool> added(merged.records.size(), false);
  for (size_t g = own.records.size(); g < merged.records.size(); ++g) added[g] = true;
  for (size_t g = 0; g < rep.records.size(); ++g) {
    const FileRecord& r = rep.records[g];
    FileRecord& m = merged.records[static_cast<size_t>(rep_to_merged[g])];
    for (size_t a = 0; a < r.inputs.size() && a < m.inputs.size(); ++a) {
      if (added[static_cast<size_t>(rep_to_merged[g])]) m.inputs[a].origins.clear();
      for (const FileOrigin& o : r.inputs[a].origins) {
        const FileOrigin n = remap(o);
        auto& os = m.inputs[a].origins;
        if (std::find(os.begin(), os.end(), n) == os.end()) os.push_back(n);
      }
    }
    m.read_by_fp32 = m.read_by_fp32 || r.read_by_fp32;
    m.escapes = m.escapes || r.escapes;
    m.read_twice = m.read_twice || r.read_twice;
    m.model_output = m.model_output || r.model_output;
  }
  for (size_t mi = 0; mi < merged.modules.size(); ++mi) {
    FileModule& fm = merged.modules[mi];
    const FileModule& rm = rep.modules[mi];
    fm.recorded = fm.recorded || rm.recorded;
    for (const NonQuantOpInfo& o : rm.non_quant) {
      bool have = false;
      for (const NonQuantOpInfo& x : fm.non_quant) have = have || (x.kind == o.kind && x.fqn == o.fqn && x.reason == o.reason);
      if (!have) fm.non_quant.push_back(o);
    }
    for (const PathInfo& p : rm.paths) {
      PathInfo q;
      q.calls = p.calls;
      for (int i : p.records) {
        const int local = merged.records[static_cast<size_t>(rep_to_merged[static_cast<size_t>(rep.modules[mi].records[static_cast<size_t>(i)])])].index;
        q.records.push_back(local);
        q.mask[static_cast<size_t>(local / 64) % 4] |= uint64_t{1} << (local % 64);
      }
      bool found = false;
      for (PathInfo& x : fm.paths) {
        if (x.mask == q.mask) {
          x.calls += q.calls;
          found = true;
        }
      }
      if (!found) fm.paths.push_back(std::move(q));
    }
  }
  {
    Scratch scratch = scratch_of(into);  // anything the union makes analysis throw, before `into` changes
    rebuild(*scratch.model, merged, live);
  }
  rebuild(into, merged, live);
  std::vector<int> own_of(merged.records.size(), -1), rep_of(merged.records.size(), -1);
  for (size_t g = 0; g < own.records.size(); ++g) own_of[g] = static_cast<int>(g);
  for (size_t g = 0; g < rep.records.size(); ++g) rep_of[static_cast<size_t>(rep_to_merged[g])] = static_cast<int>(g);
  restore_observers(into, {StatsSource{&own, own_of}, StatsSource{&rep, rep_of}});
  restore_inner_outputs(into, {StatsSource{&own, own_of}, StatsSource{&rep, rep_of}});
  into.calibrated_values() = merged.calibrated_values;
  into.varied_values() = merged.varied_values;
}

// ---------------------------------------------------------------------------------------------
// QConfigMapping documents.

namespace {

constexpr const char* kMappingFormat = "dbrq.qconfig_mapping";

json qconfig_to_json(const QConfigPtr& q) {
  if (q == nullptr) return nullptr;
  if (q->is_bf16()) return "bf16";
  return json{{"activation", spec_to_json(q->activation)}, {"weight", spec_to_json(q->weight)}};
}

QConfigPtr qconfig_from_json(const json& j) {
  if (j.is_null()) return nullptr;
  if (j.is_string()) {
    if (j.get<std::string>() == "bf16") return QConfig::bf16();
    throw WrongType(absl::StrCat("a qconfig must be null, \"bf16\" or an object, got ", excerpt(j)));
  }
  if (!j.is_object()) throw WrongType(absl::StrCat("a qconfig must be null, \"bf16\" or an object, got ", excerpt(j)));
  return QConfig::make(spec_from_json(j.at("activation")), spec_from_json(j.at("weight")));
}

json named_list(const std::vector<std::pair<std::string, QConfigPtr>>& list) {
  json a = json::array();
  for (const auto& [name, q] : list) a.push_back(json{{"name", name}, {"qconfig", qconfig_to_json(q)}});
  return a;
}

std::string read_whole_file(const std::string& path, const char* what) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  DBRQ_ENSURE(f != nullptr, IOError, "cannot open ", what, " ", path, ": ", std::strerror(errno));
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  DBRQ_ENSURE(!failed, IOError, "cannot read ", what, " ", path);
  return text;
}

}  // namespace

std::string qconfig_mapping_to_json(const QConfigMapping& mapping) {
  json doc;
  doc["format"] = kMappingFormat;
  doc["version"] = 1;
  doc["global"] = qconfig_to_json(mapping.global());
  doc["object_types"] = named_list(mapping.object_types());
  json ops = json::array();
  for (const auto& [kind, q] : mapping.op_types()) ops.push_back(json{{"op", op_name(kind)}, {"qconfig", qconfig_to_json(q)}});
  doc["op_types"] = ops;
  doc["module_name_regexes"] = named_list(mapping.module_name_regexes());
  doc["module_names"] = named_list(mapping.module_names());
  // Call-site entries exist since version 2; a mapping without them stays version 1 (readable by an
  // older dbrq, byte-identical to what it wrote). One with them must not reach a reader that would
  // drop them.
  if (!mapping.module_name_object_type_orders().empty()) {
    doc["version"] = 2;
    json sites = json::array();
    for (const auto& [site, q] : mapping.module_name_object_type_orders()) {
      sites.push_back(json{{"module_name", site.module_fqn}, {"op", op_name(site.op)}, {"index", site.index},
                           {"qconfig", qconfig_to_json(q)}});
    }
    doc["module_name_object_type_orders"] = sites;
  }
  // (module type, op) entries exist since version 3; the same rule.
  if (!mapping.module_type_object_types().empty()) {
    doc["version"] = 3;
    json entries = json::array();
    for (const auto& [to, q] : mapping.module_type_object_types()) {
      entries.push_back(json{{"module_type", to.module_type}, {"op", op_name(to.op)}, {"qconfig", qconfig_to_json(q)}});
    }
    doc["module_type_object_types"] = entries;
  }
  return doc.dump(1);
}

QConfigMapping qconfig_mapping_from_json(const std::string& text, const std::string& source) {
  const std::string where = absl::StrCat("qconfig mapping ", source);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    DBRQ_THROW(FileFormatError, where, " is not valid JSON: ", e.what());
  }
  try {
    DBRQ_ENSURE(doc.is_object() && doc.contains("format") && doc.at("format") == kMappingFormat, FileFormatError,
                where, " is not a dbrq qconfig mapping (no \"format\": \"", kMappingFormat, "\")");
    const int64_t version = get_integer<int64_t>(doc.at("version"), "version");
    DBRQ_ENSURE(version >= 1 && version <= 3, FileFormatError, where, " has version ", version,
                "; this dbrq reads versions 1 to 3");
    QConfigMapping m;
    auto op_kind = [&](const std::string& name, const char* field) {
      for (size_t k = 0; k < static_cast<size_t>(OpKind::kNumOpKinds); ++k) {
        if (name == op_name(static_cast<OpKind>(k))) return static_cast<OpKind>(k);
      }
      DBRQ_THROW(FileFormatError, where, ": unknown op \"", name, "\" in ", field);
    };
    m.set_global(qconfig_from_json(doc.at("global")));
    for (const json& e : get_array(doc.at("object_types"), "object_types")) {
      m.set_object_type(e.at("name").get<std::string>(), qconfig_from_json(e.at("qconfig")));
    }
    for (const json& e : get_array(doc.at("op_types"), "op_types")) {
      const std::string name = e.at("op").get<std::string>();
      OpKind kind = OpKind::kNumOpKinds;
      for (size_t k = 0; k < static_cast<size_t>(OpKind::kNumOpKinds); ++k) {
        if (name == op_name(static_cast<OpKind>(k))) kind = static_cast<OpKind>(k);
      }
      DBRQ_ENSURE(kind != OpKind::kNumOpKinds, FileFormatError, where, ": unknown op \"", name, "\" in op_types");
      m.set_object_type(kind, qconfig_from_json(e.at("qconfig")));
    }
    for (const json& e : get_array(doc.at("module_name_regexes"), "module_name_regexes")) {
      m.set_module_name_regex(e.at("name").get<std::string>(), qconfig_from_json(e.at("qconfig")));
    }
    for (const json& e : get_array(doc.at("module_names"), "module_names")) {
      m.set_module_name(e.at("name").get<std::string>(), qconfig_from_json(e.at("qconfig")));
    }
    DBRQ_ENSURE(version >= 2 || !doc.contains("module_name_object_type_orders"), FileFormatError, where,
                " has module_name_object_type_orders, which need version 2, but says version 1");
    DBRQ_ENSURE(version >= 3 || !doc.contains("module_type_object_types"), FileFormatError, where,
                " has module_type_object_types, which need version 3, but says version ", version);
    if (version >= 3) {
      for (const json& e : get_array(doc.at("module_type_object_types"), "module_type_object_types")) {
        m.set_module_type_object_type(e.at("module_type").get<std::string>(),
                                      op_kind(e.at("op").get<std::string>(), "module_type_object_types"),
                                      qconfig_from_json(e.at("qconfig")));
      }
    }
    if (version == 2 || (version >= 3 && doc.contains("module_name_object_type_orders"))) {
      for (const json& e : get_array(doc.at("module_name_object_type_orders"), "module_name_object_type_orders")) {
        m.set_module_name_object_type_order(e.at("module_name").get<std::string>(),
                                            op_kind(e.at("op").get<std::string>(), "module_name_object_type_orders"),
                                            get_integer<int>(e.at("index"), "index"), qconfig_from_json(e.at("qconfig")));
      }
    }
    return m;
  } catch (const FileFormatError&) {
    throw;
  } catch (const json::exception& e) {
    DBRQ_THROW(FileFormatError, where, " is malformed: ", e.what());
  } catch (const WrongType& e) {
    DBRQ_THROW(FileFormatError, where, " is malformed: ", e.what());
  } catch (const Error& e) {
    DBRQ_THROW(FileFormatError, where, " has an invalid value: ", e.what());
  }
}

void save_qconfig_mapping(const QConfigMapping& mapping, const std::string& path) {
  const std::string text = qconfig_mapping_to_json(mapping);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  DBRQ_ENSURE(f != nullptr, IOError, "cannot write qconfig mapping ", path, ": ", std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  DBRQ_ENSURE(ok && closed, IOError, "cannot write qconfig mapping ", path);
}

QConfigMapping load_qconfig_mapping(const std::string& path) {
  return qconfig_mapping_from_json(read_whole_file(path, "qconfig mapping"), path);
}

}  // namespace dbrq
