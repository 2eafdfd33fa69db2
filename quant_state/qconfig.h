// What to quantize and how: QConfig (observer specs for activations and weights), QConfigMapping
// (which parts of a model get which QConfig, with PyTorch FX's precedence) and BackendConfig (what
// the oneDNN backend can run in int8, and which op chains it fuses).
//
//   auto mapping = dbrq::default_qconfig_mapping("onednn");          // histogram u8 / per-channel s8
//   mapping.set_module_name("classifier", nullptr);                   // keep the head in fp32
//   mapping.set_object_type(dbrq::OpKind::kAdd, nullptr);             // and every functional add
//   mapping.set_module_name_regex("layer4\\..*", dbrq::QConfig::make(
//       dbrq::ObserverSpec::min_max(), dbrq::ObserverSpec::per_channel_min_max()));
//
// Precedence (highest first), as in PyTorch FX: one functional call site (module name, op, index:
// set_module_name_object_type_order), then module name (exact, then each parent name), then the
// first matching module-name regex, then object type, then global. For a functional op the object
// type is the op (OpKind); for a layer call it is the layer class ("Conv2d"). A null QConfig keeps
// that part in fp32.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "quant_state/observers.h"
#include "runtime/module.h"
#include "core/op_params.h"
#include "runtime/quant_role.h"

namespace dbrq {

struct QConfig {
  ObserverSpec activation;
  ObserverSpec weight;

  // Not int8 at all: the op keeps f32 tensors at its boundaries and, after convert, computes in
  // bf16 on oneDNN's bf16 primitives when the CPU has AVX512_BF16 (dbrq::bf16_supported()), in fp32
  // otherwise. conv2d, linear and matmul have bf16 kernels; other ops under this marker run fp32.
  // Set it like a null QConfig: per op type, layer type or module (docs/autotune.md).
  bool use_bf16 = false;

  static std::shared_ptr<const QConfig> make(ObserverSpec activation, ObserverSpec weight);
  // The bf16 marker ("QConfig(bf16)").
  static std::shared_ptr<const QConfig> bf16();
  bool is_bf16() const { return use_bf16; }
  // Dynamic quantization: activation parameters computed from each call's data.
  bool is_dynamic() const { return activation.kind == ObserverKind::kPlaceholder; }
  bool operator==(const QConfig& o) const {
    return use_bf16 == o.use_bf16 && activation == o.activation && weight == o.weight;
  }
  std::string to_string() const;
};
using QConfigPtr = std::shared_ptr<const QConfig>;

// Histogram u8 activations, per-channel symmetric s8 weights (PyTorch's onednn default).
QConfigPtr default_qconfig(const std::string& backend = "onednn");
// Dynamic u8 activations, per-channel symmetric s8 weights, for linear and matmul.
QConfigPtr default_dynamic_qconfig();

class QConfigMapping {
 public:
  QConfigMapping& set_global(QConfigPtr qconfig);
  // A layer or user module class by its type name ("Conv2d", "BasicBlock").
  QConfigMapping& set_object_type(const std::string& module_type, QConfigPtr qconfig);
  // The same by class: a module class or its holder (set_object_type<nn::Conv2d>, <nn::Conv2dImpl>
  // and <Fire> for DBRQ_MODULE(Fire) name the modules' type_name(): "Conv2d", "Conv2d", "FireImpl").
  template <typename M>
  QConfigMapping& set_object_type(QConfigPtr qconfig) {
    return set_object_type(nn::detail::module_type_name<M>(), std::move(qconfig));
  }
  // A functional op, wherever it is called.
  QConfigMapping& set_object_type(OpKind op, QConfigPtr qconfig);
  // A functional op called directly in the forward of modules of one class, e.g. the gate
  // arithmetic of every GRU layer: set_module_type_object_type("GRU", OpKind::kMul, nullptr). It
  // wins over set_object_type(op) and set_object_type(module_type); module names, regexes and call
  // sites win over it, including a module name set for an ancestor (set_module_name("encoder", q)
  // applies q to everything under "encoder", the gates of a GRU inside it too: add the
  // (module type, op) entries again under a module name of the GRU itself to keep them).
  QConfigMapping& set_module_type_object_type(const std::string& module_type, OpKind op, QConfigPtr qconfig);
  template <typename M>
  QConfigMapping& set_module_type_object_type(OpKind op, QConfigPtr qconfig) {
    return set_module_type_object_type(nn::detail::module_type_name<M>(), op, std::move(qconfig));
  }
  // Matched at the start of the module's fully qualified name (Python's re.match). First match wins.
  QConfigMapping& set_module_name_regex(const std::string& regex, QConfigPtr qconfig);
  // An exact fully qualified module name; applies to the whole subtree unless a descendant has
  // its own entry.
  QConfigMapping& set_module_name(const std::string& fqn, QConfigPtr qconfig);
  // One functional call site, as PyTorch FX's set_module_name_object_type_order: the `index`-th
  // call (0-based, in forward order, counted per call of the module) of functional op `op` made
  // directly in the forward of the module at exactly `fqn` ("" is the root model; ops inside child
  // modules or layers are not counted). Highest precedence. E.g. the second matmul of an attention
  // block: set_module_name_object_type_order("encoder.0.attn", OpKind::kMatmul, 1, QConfig::bf16()).
  // A loop calling the op counts each iteration. ValueError for a negative index or an invalid op.
  QConfigMapping& set_module_name_object_type_order(const std::string& fqn, OpKind op, int index, QConfigPtr qconfig);

  // QConfig for a module call (a layer, or a user module as a whole).
  QConfigPtr for_module(const std::string& type_name, const std::string& fqn) const;
  // QConfig for a functional op called from the forward of a module of `module_type` at `module_fqn`.
  QConfigPtr for_op(OpKind op, const std::string& module_type, const std::string& module_fqn) const;
  // The same for its `index`-th call in that module's forward: the call-site entry when there is
  // one, else for_op.
  QConfigPtr for_op(OpKind op, const std::string& module_type, const std::string& module_fqn, int index) const;

  // Checks the mapping against a model: every module-name entry must name an existing module.
  // Throws ValueError listing the unknown names.
  void validate(nn::Module& model) const;

  QConfigPtr global() const { return global_; }
  const std::vector<std::pair<std::string, QConfigPtr>>& object_types() const { return object_types_; }
  const std::vector<std::pair<OpKind, QConfigPtr>>& op_types() const { return op_types_; }
  struct TypeOp {
    std::string module_type;
    OpKind op = OpKind::kNumOpKinds;
    bool operator==(const TypeOp& o) const { return module_type == o.module_type && op == o.op; }
  };
  const std::vector<std::pair<TypeOp, QConfigPtr>>& module_type_object_types() const { return type_ops_; }
  const std::vector<std::pair<std::string, QConfigPtr>>& module_name_regexes() const { return regexes_; }
  const std::vector<std::pair<std::string, QConfigPtr>>& module_names() const { return module_names_; }
  struct OpSite {
    std::string module_fqn;
    OpKind op = OpKind::kNumOpKinds;
    int index = 0;
    bool operator==(const OpSite& o) const { return module_fqn == o.module_fqn && op == o.op && index == o.index; }
  };
  const std::vector<std::pair<OpSite, QConfigPtr>>& module_name_object_type_orders() const { return op_sites_; }
  std::string to_string() const;

 private:
  // `op`: a functional op's kind (module_type_object_types apply), kNumOpKinds for a module call.
  QConfigPtr module_qconfig(const std::string& type_name, const std::string& fqn, QConfigPtr fallback,
                            OpKind op = OpKind::kNumOpKinds) const;

  QConfigPtr global_;
  std::vector<std::pair<std::string, QConfigPtr>> object_types_;
  std::vector<std::pair<OpKind, QConfigPtr>> op_types_;
  std::vector<std::pair<TypeOp, QConfigPtr>> type_ops_;
  std::vector<std::pair<std::string, QConfigPtr>> regexes_;
  std::vector<std::regex> compiled_;
  std::vector<std::pair<std::string, QConfigPtr>> module_names_;
  std::vector<std::pair<OpSite, QConfigPtr>> op_sites_;
};

// The default mapping for a backend: "onednn" (dbrq's backend); also accepts "x86"/"fbgemm" and
// "qnnpack" for their PyTorch defaults. Throws ValueError for other names. As PyTorch 1.13 FX's:
// the global QConfig, fixed output ranges for sigmoid, hardsigmoid and tanh (function and layer)
// and for the nn::Softmax layer (a functional softmax's output is observed), and the gate
// arithmetic of nn::GRU / nn::LSTM kept fp32.
QConfigMapping default_qconfig_mapping(const std::string& backend = "onednn");
// Dynamic quantization of linear and matmul only; everything else fp32.
QConfigMapping default_dynamic_qconfig_mapping();
// For transformer encoders / decoders (post- or pre-LayerNorm): the backend's default, except
//   - add stays fp32: the residual stream (and the layer norm it feeds) keeps f32 values; a u8
//     residual stream rounded at every layer cost the BERT encoder 16 dB;
//   - softmax's output is observed (the default activation observer) for the nn::Softmax layer too
//     (the default observes the functional softmax's, as PyTorch FX; the layer's has the fixed 1/256
//     steps, which flatten attention probabilities of long sequences: 2 dB on the BERT encoder).
// Use it with PrepareOptions::float_outputs_for_float_readers (the projections before the fp32
// adds then write f32). Evidence and limits: docs/encoder_accuracy.md.
QConfigMapping transformer_qconfig_mapping(const std::string& backend = "onednn");

// A QConfigMapping as a JSON document (format "dbrq.qconfig_mapping", version 1): global, object
// types (layer classes and functional ops by name), module-name regexes and module names in their
// order (version 2 when it has call-site entries, set_module_name_object_type_order; 1 otherwise:
// a reader without them must not drop them silently), each QConfig as null (fp32), "bf16" (QConfig::bf16()) or its two observer specs. The
// document written for a mapping reads back into an equal mapping (same entries, same qconfigs),
// so a tuned mapping can be shipped next to its quant-state file: prepare needs it to build the
// same observers. Reading throws FileFormatError naming `source` for anything malformed.
// (Defined in quant_state/serialization.cc.)
std::string qconfig_mapping_to_json(const QConfigMapping& mapping);
QConfigMapping qconfig_mapping_from_json(const std::string& text, const std::string& source = "<string>");
// The same through files; IOError when unreadable / unwritable.
void save_qconfig_mapping(const QConfigMapping& mapping, const std::string& path);
QConfigMapping load_qconfig_mapping(const std::string& path);

// One supported input/weight/output dtype combination.
struct DTypeConfig {
  DType input = DType::kU8;
  DType weight = DType::kS8;
  DType output = DType::kU8;
  bool is_dynamic = false;
};

struct BackendOpConfig {
  OpKind op;
  QuantRole role;
  std::vector<DTypeConfig> dtype_configs;
  std::optional<ObserverSpec> fixed_output;  // kFixedQParams
};

class BackendConfig {
 public:
  explicit BackendConfig(std::string name) : name_(std::move(name)) {}
  // oneDNN 2.6 on x86: u8 activations, s8 weights (per-tensor or per-channel), no reduced range
  // needed with VNNI/AMX. Built from the op registry: every op's role, and the chains its OpDefs
  // say can fuse (a weighted op, batch norm folded, a residual add, an activation as post-op).
  static BackendConfig onednn();

  BackendConfig& set_op(BackendOpConfig config);
  BackendConfig& add_fusion_pattern(std::vector<OpKind> pattern);

  const std::string& name() const { return name_; }
  const BackendOpConfig* op(OpKind kind) const;
  QuantRole role(OpKind kind) const;
  // Empty when the backend can run `kind` with `qconfig`; otherwise why not (for the warning).
  std::string unsupported_reason(OpKind kind, const QConfig& qconfig) const;
  // Chains the backend fuses, longest first.
  const std::vector<std::vector<OpKind>>& fusion_patterns() const { return fusion_patterns_; }

 private:
  std::string name_;
  std::vector<BackendOpConfig> ops_;
  std::vector<std::vector<OpKind>> fusion_patterns_;
};

}  // namespace dbrq
