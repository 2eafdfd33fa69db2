#include "quant_state/qconfig.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_join.h"
#include "runtime/op_registry.h"

namespace dbrq {

QConfigPtr QConfig::make(ObserverSpec activation, ObserverSpec weight) {
  auto q = std::make_shared<QConfig>();
  q->activation = std::move(activation);
  q->weight = std::move(weight);
  // Building the observers once validates the specs (dtype, scheme, arguments) up front.
  make_observer(q->activation);
  make_observer(q->weight);
  return q;
}

QConfigPtr QConfig::bf16() {
  auto q = std::make_shared<QConfig>();
  q->use_bf16 = true;
  return q;
}

std::string QConfig::to_string() const {
  if (use_bf16) return "QConfig(bf16)";
  return absl::StrCat("QConfig(activation=", activation.to_string(), ", weight=", weight.to_string(), ")");
}

QConfigPtr default_qconfig(const std::string& backend) {
  if (backend == "onednn" || backend == "qnnpack") {
    return QConfig::make(ObserverSpec::histogram(DType::kU8, false), ObserverSpec::per_channel_min_max());
  }
  if (backend == "x86" || backend == "fbgemm") {
    return QConfig::make(ObserverSpec::histogram(DType::kU8, true), ObserverSpec::per_channel_min_max());
  }
  DBRQ_THROW(ValueError, "unknown backend \"", backend, "\"; expected onednn, x86, fbgemm or qnnpack");
}

QConfigPtr default_dynamic_qconfig() {
  return QConfig::make(ObserverSpec::placeholder(DType::kU8), ObserverSpec::per_channel_min_max());
}

QConfigMapping& QConfigMapping::set_global(QConfigPtr qconfig) {
  global_ = std::move(qconfig);
  return *this;
}

namespace {

template <typename K>
void upsert(std::vector<std::pair<K, QConfigPtr>>& list, const K& key, QConfigPtr q) {
  for (auto& [k, v] : list) {
    if (k == key) {
      v = std::move(q);
      return;
    }
  }
  list.emplace_back(key, std::move(q));
}

std::string parent_name(const std::string& fqn) {
  const auto dot = fqn.rfind('.');
  return dot == std::string::npos ? "" : fqn.substr(0, dot);
}

std::string q_str(const QConfigPtr& q) { return q ? q->to_string() : "None"; }

}  // namespace

QConfigMapping& QConfigMapping::set_object_type(const std::string& module_type, QConfigPtr qconfig) {
  DBRQ_ENSURE(!module_type.empty(), ValueError, "set_object_type: module type name is empty");
  upsert(object_types_, module_type, std::move(qconfig));
  return *this;
}

QConfigMapping& QConfigMapping::set_object_type(OpKind op, QConfigPtr qconfig) {
  DBRQ_ENSURE(op != OpKind::kNumOpKinds, ValueError, "set_object_type: invalid op kind");
  upsert(op_types_, op, std::move(qconfig));
  return *this;
}

QConfigMapping& QConfigMapping::set_module_type_object_type(const std::string& module_type, OpKind op,
                                                            QConfigPtr qconfig) {
  DBRQ_ENSURE(!module_type.empty(), ValueError, "set_module_type_object_type: module type name is empty");
  DBRQ_ENSURE(op != OpKind::kNumOpKinds, ValueError, "set_module_type_object_type: invalid op kind");
  upsert(type_ops_, TypeOp{module_type, op}, std::move(qconfig));
  return *this;
}

QConfigMapping& QConfigMapping::set_module_name_regex(const std::string& regex, QConfigPtr qconfig) {
  std::regex compiled;
  try {
    compiled = std::regex(regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    DBRQ_THROW(ValueError, "set_module_name_regex: \"", regex, "\" is not a valid regular expression: ", e.what());
  }
  for (size_t i = 0; i < regexes_.size(); ++i) {
    if (regexes_[i].first == regex) {
      regexes_[i].second = std::move(qconfig);
      return *this;
    }
  }
  regexes_.emplace_back(regex, std::move(qconfig));
  compiled_.push_back(std::move(compiled));
  return *this;
}

QConfigMapping& QConfigMapping::set_module_name(const std::string& fqn, QConfigPtr qconfig) {
  upsert(module_names_, fqn, std::move(qconfig));
  return *this;
}

QConfigMapping& QConfigMapping::set_module_name_object_type_order(const std::string& fqn, OpKind op, int index,
                                                                  QConfigPtr qconfig) {
  DBRQ_ENSURE(op != OpKind::kNumOpKinds, ValueError, "set_module_name_object_type_order: invalid op kind");
  DBRQ_ENSURE(index >= 0, ValueError, "set_module_name_object_type_order: index must be >= 0, got ", index, " (",
              fqn.empty() ? "the root model" : fqn, ", ", op_name(op), ")");
  upsert(op_sites_, OpSite{fqn, op, index}, std::move(qconfig));
  return *this;
}

QConfigPtr QConfigMapping::module_qconfig(const std::string& type_name, const std::string& fqn, QConfigPtr fallback,
                                          OpKind op) const {
  // object type, then (object type, op), then regex, then module name (walking up the parents):
  // each later step wins.
  QConfigPtr q = std::move(fallback);
  for (auto& [t, v] : object_types_) {
    if (t == type_name) q = v;
  }
  for (auto& [to, v] : type_ops_) {
    if (to.op == op && to.module_type == type_name) q = v;
  }
  for (size_t i = 0; i < regexes_.size(); ++i) {
    if (std::regex_search(fqn, compiled_[i], std::regex_constants::match_continuous)) {
      q = regexes_[i].second;
      break;
    }
  }
  for (std::string name = fqn; !name.empty(); name = parent_name(name)) {
    for (auto& [n, v] : module_names_) {
      if (n == name) return v;
    }
  }
  return q;
}

QConfigPtr QConfigMapping::for_module(const std::string& type_name, const std::string& fqn) const {
  return module_qconfig(type_name, fqn, global_);
}

QConfigPtr QConfigMapping::for_op(OpKind op, const std::string& module_type, const std::string& module_fqn) const {
  QConfigPtr function_qconfig = global_;
  for (auto& [k, v] : op_types_) {
    if (k == op) function_qconfig = v;
  }
  return module_qconfig(module_type, module_fqn, function_qconfig, op);
}

QConfigPtr QConfigMapping::for_op(OpKind op, const std::string& module_type, const std::string& module_fqn,
                                  int index) const {
  for (auto& [site, v] : op_sites_) {
    if (site.op == op && site.index == index && site.module_fqn == module_fqn) return v;
  }
  return for_op(op, module_type, module_fqn);
}

void QConfigMapping::validate(nn::Module& model) const {
  std::set<std::string> names;
  for (auto& [fqn, m] : model.named_modules()) names.insert(fqn);
  std::vector<std::string> unknown;
  for (auto& [n, q] : module_names_) {
    if (!names.count(n)) unknown.push_back("\"" + n + "\"");
  }
  for (auto& [site, q] : op_sites_) {
    if (!names.count(site.module_fqn)) unknown.push_back("\"" + site.module_fqn + "\"");
  }
  DBRQ_ENSURE(unknown.empty(), ValueError, "QConfigMapping names module(s) ", absl::StrJoin(unknown, ", "),
              " that do not exist in the model (", model.type_name(), ")");
  // A user module class keeps its Impl suffix (DBRQ_MODULE(Fire) holds a FireImpl, type_name()
  // "FireImpl") while built-in holders are named as PyTorch's ("Conv2d"). set_object_type("Fire", q)
  // written after the holder's name would match nothing and leave the qconfig silently unapplied.
  // Names matching no module are fine otherwise (the default mapping lists layer classes a model
  // may not have).
  std::set<std::string> types;
  for (auto& [fqn, m] : model.named_modules()) types.insert(m->type_name());
  for (auto& [t, q] : object_types_) {
    DBRQ_ENSURE(types.count(t) || !types.count(t + "Impl"), ValueError, "QConfigMapping: set_object_type(\"", t,
                "\") matches no module of the model (", model.type_name(), "), which has modules of class ", t,
                "Impl, named \"", t, "Impl\": a user module is named after its class, not its holder. Write "
                "set_object_type<", t, ">(qconfig) or set_object_type(\"", t, "Impl\", qconfig)");
  }
  for (auto& [to, q] : type_ops_) {
    const std::string& t = to.module_type;
    DBRQ_ENSURE(types.count(t) || !types.count(t + "Impl"), ValueError,
                "QConfigMapping: set_module_type_object_type(\"", t, "\", ", op_name(to.op),
                ") matches no module of the model (", model.type_name(), "), which has modules of class ", t,
                "Impl, named \"", t, "Impl\": a user module is named after its class, not its holder. Write "
                "set_module_type_object_type<", t, ">(op, qconfig) or set_module_type_object_type(\"", t,
                "Impl\", op, qconfig)");
  }
}

std::string QConfigMapping::to_string() const {
  std::string s = absl::StrCat("QConfigMapping(global=", q_str(global_));
  for (auto& [t, q] : object_types_) absl::StrAppend(&s, ", object_type[", t, "]=", q_str(q));
  for (auto& [k, q] : op_types_) absl::StrAppend(&s, ", object_type[", op_name(k), "]=", q_str(q));
  for (auto& [to, q] : type_ops_) {
    absl::StrAppend(&s, ", module_type_object_type[", to.module_type, ", ", op_name(to.op), "]=", q_str(q));
  }
  for (auto& [r, q] : regexes_) absl::StrAppend(&s, ", module_name_regex[", r, "]=", q_str(q));
  for (auto& [n, q] : module_names_) absl::StrAppend(&s, ", module_name[", n, "]=", q_str(q));
  for (auto& [site, q] : op_sites_) {
    absl::StrAppend(&s, ", module_name_object_type_order[", site.module_fqn, ", ", op_name(site.op), ", ", site.index,
                    "]=", q_str(q));
  }
  return s + ")";
}

QConfigMapping default_qconfig_mapping(const std::string& backend) {
  QConfigPtr q = default_qconfig(backend);
  QConfigMapping m;
  m.set_global(q);
  // Fixed output ranges, as PyTorch's defaults ([0, 1) for sigmoid-like ops, [-1, 1) for tanh), for
  // the function and its layer class (softmax: the layer class only, as PyTorch 1.13 FX keys it on
  // nn.Softmax; OpDef::fixed_qparams_layer_only). Ordered by range, then op, as PyTorch lists them.
  std::vector<const OpDef*> fixed;
  for (const OpDef& d : op_registry().all()) {
    if (d.role == QuantRole::kFixedQParams) fixed.push_back(&d);
  }
  std::stable_sort(fixed.begin(), fixed.end(),
                   [](const OpDef* a, const OpDef* b) { return a->fixed_scale < b->fixed_scale; });
  for (const OpDef* d : fixed) {
    QConfigPtr f = QConfig::make(ObserverSpec::fixed(d->fixed_scale, d->fixed_zero_point), q->weight);
    if (!d->fixed_qparams_layer_only) m.set_object_type(d->kind, f);
    if (d->layer != nullptr) m.set_object_type(d->layer, f);
  }
  // nn::GRU / nn::LSTM: their weight products run int8, their gate arithmetic f32 (as PyTorch's
  // quantize_dynamic keeps it). Static u8 gates round every activation, sum and product of the
  // recurrence to 8 bits, and the errors compound over the steps: on the zoo's GRU classifier the
  // int8 gates cost 5-7 dB of output SQNR (docs/recurrent.md) for a few element-wise ops on
  // [batch, hidden] rows, which are no faster in int8. A hand-written cell (Linear layers and
  // functional gates in the user's own module) is not affected; its gates run int8.
  for (const char* rnn : {"GRU", "LSTM"}) {
    for (OpKind gate : {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kSigmoid, OpKind::kTanh}) {
      m.set_module_type_object_type(rnn, gate, nullptr);
    }
  }
  return m;
}

QConfigMapping transformer_qconfig_mapping(const std::string& backend) {
  QConfigMapping m = default_qconfig_mapping(backend);
  m.set_object_type(OpKind::kAdd, nullptr);
  const QConfigPtr observed = default_qconfig(backend);
  m.set_object_type(OpKind::kSoftmax, observed);
  m.set_object_type("Softmax", observed);
  return m;
}

QConfigMapping default_dynamic_qconfig_mapping() {
  QConfigPtr q = default_dynamic_qconfig();
  QConfigMapping m;
  for (const OpDef& d : op_registry().all()) {
    if (!d.dynamic) continue;
    m.set_object_type(d.kind, q);
    if (d.layer != nullptr) m.set_object_type(d.layer, q);
  }
  return m;
}

// ---------------------------------------------------------------------------------------------

BackendConfig& BackendConfig::set_op(BackendOpConfig config) {
  for (auto& o : ops_) {
    if (o.op == config.op) {
      o = std::move(config);
      return *this;
    }
  }
  ops_.push_back(std::move(config));
  return *this;
}

BackendConfig& BackendConfig::add_fusion_pattern(std::vector<OpKind> pattern) {
  DBRQ_ENSURE(pattern.size() >= 2, ValueError, "a fusion pattern needs at least two ops");
  fusion_patterns_.push_back(std::move(pattern));
  std::stable_sort(fusion_patterns_.begin(), fusion_patterns_.end(),
                   [](const auto& a, const auto& b) { return a.size() > b.size(); });
  return *this;
}

const BackendOpConfig* BackendConfig::op(OpKind kind) const {
  for (auto& o : ops_) {
    if (o.op == kind) return &o;
  }
  return nullptr;
}

QuantRole BackendConfig::role(OpKind kind) const {
  const BackendOpConfig* o = op(kind);
  return o == nullptr ? QuantRole::kNone : o->role;
}

std::string BackendConfig::unsupported_reason(OpKind kind, const QConfig& q) const {
  const BackendOpConfig* o = op(kind);
  if (o == nullptr) return absl::StrCat(op_name(kind), " has no int8 implementation in backend ", name_);
  const bool dynamic = q.is_dynamic();
  for (const DTypeConfig& d : o->dtype_configs) {
    if (d.is_dynamic != dynamic || d.input != q.activation.dtype) continue;
    if (o->role == QuantRole::kWeighted || (o->role == QuantRole::kMatmul && dynamic)) {
      if (d.weight != q.weight.dtype) continue;
      if (!is_symmetric(q.weight.qscheme)) {
        return absl::StrCat(op_name(kind), ": backend ", name_,
                            " needs symmetric weights (zero point 0), got qscheme ", qscheme_name(q.weight.qscheme));
      }
      // The kernels take one scale per output channel, the weight's dim 0 in the layout its
      // observer sees (a transposed conv's weight is given output-major). Scales along another
      // axis of a square weight would fit the vector and scale each output by another
      // channel's factor.
      if (is_per_channel(q.weight.qscheme) && q.weight.ch_axis != 0) {
        return absl::StrCat(op_name(kind), ": backend ", name_,
                            " needs per-channel weights along axis 0 (output channels), got ch_axis ", q.weight.ch_axis);
      }
    }
    return "";
  }
  return absl::StrCat(op_name(kind), ": backend ", name_, " has no ", dynamic ? "dynamic" : "static",
                      " int8 kernel for activation dtype ", dtype_name(q.activation.dtype), " and weight dtype ",
                      dtype_name(q.weight.dtype));
}

BackendConfig BackendConfig::onednn() {
  BackendConfig b("onednn");
  const DTypeConfig static_u8{DType::kU8, DType::kS8, DType::kU8, false};
  const DTypeConfig dynamic_u8{DType::kU8, DType::kS8, DType::kF32, true};
  const OpRegistry& ops = op_registry();
  for (const OpDef& d : ops.all()) {
    if (d.role == QuantRole::kNone) continue;
    BackendOpConfig c{d.kind, d.role, {static_u8}, {}};
    if (d.dynamic) c.dtype_configs.push_back(dynamic_u8);
    if (d.role == QuantRole::kFixedQParams) c.fixed_output = ObserverSpec::fixed(d.fixed_scale, d.fixed_zero_point);
    b.set_op(std::move(c));
  }

  // Fusion patterns: weighted op (+ folded batch norm) (+ residual add) (+ activation post-op), and
  // an activation after an int8 add or an int8 batch norm on its own.
  std::vector<OpKind> folds, residual_adds;
  for (const OpDef& d : ops.all()) {
    if (d.fold != nullptr) folds.push_back(d.kind);
    if (d.residual_add) residual_adds.push_back(d.kind);
  }
  auto activations_after = [&](uint8_t site) {
    std::vector<OpKind> out;
    for (const OpDef& d : ops.all()) {
      if (d.fuses_after & site) out.push_back(d.kind);
    }
    return out;
  };
  for (const OpDef& w : ops.all()) {
    if (w.role == QuantRole::kWeighted) {
      // A weighted op with no fusion site (prelu) ends every chain: nothing fuses after it and
      // batch norm does not fold into it.
      if (w.fusion_site == 0) continue;
      for (OpKind act : activations_after(w.fusion_site)) {
        b.add_fusion_pattern({w.kind, act});
        for (OpKind bn : folds) b.add_fusion_pattern({w.kind, bn, act});
      }
      for (OpKind bn : folds) b.add_fusion_pattern({w.kind, bn});
      if (!w.supports_residual) continue;
      for (OpKind add : residual_adds) {
        b.add_fusion_pattern({w.kind, add});
        for (OpKind bn : folds) b.add_fusion_pattern({w.kind, bn, add});
        for (OpKind act : activations_after(kAfterResidualAdd)) {
          b.add_fusion_pattern({w.kind, add, act});
          for (OpKind bn : folds) b.add_fusion_pattern({w.kind, bn, add, act});
        }
      }
    } else if (w.fusion_site != 0) {  // add -> relu, batch_norm -> relu
      for (OpKind act : activations_after(w.fusion_site)) b.add_fusion_pattern({w.kind, act});
    }
  }
  return b;
}

}  // namespace dbrq
