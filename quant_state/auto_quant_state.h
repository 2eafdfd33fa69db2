// Per-module quantization state (AutoQuantizationState) and the model-wide state it shares
// (ModelQuantState): what the first run recorded, where observers go, and what convert decided.
//
// prepare() attaches one AutoQuantizationState to every non-leaf module. The traced first run
// records, per module and in execution order, every quantizeable op it sees (SeenOpInfo) and the
// other ops; analyze_trace() then finds fusions, works out which tensors are int8 at inference and
// places observers. Later runs validate that the op at each position is the one recorded.
//
//   auto* state = dynamic_cast<dbrq::AutoQuantizationState*>(block->extension());
//   for (const dbrq::SeenOpInfo& op : state->seen_ops()) std::cout << op.index << " " << op.fqn;
//   std::cout << state->to_string();
//
//   AutoQuantizationState(fqn="layer1.0")
//     seen_ops:
//       0: conv2d+batch_norm+relu  in=[t3:u8] w=[layer1.0.conv1.weight:s8 per-channel] out=[t5:u8]
//       3: conv2d+batch_norm+add+relu  in=[t5:u8, t3:u8] w=[...] out=[t9:u8]
//     observers: t3 Histogram[min=-2.1 max=3.4] t9 Histogram[min=0 max=5.2]
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "quant_state/observers.h"
#include "quant_state/qconfig.h"
#include "runtime/module.h"
#include "runtime/op_registry.h"

namespace dbrq {

// A tensor as the trace saw it.
struct QTensorInfo {
  int64_t id = 0;                // model-wide tensor id, assigned by the trace
  DType trace_dtype = DType::kF32;
  DType inf_dtype = DType::kF32;  // what it is at inference: u8 when quantized
};

struct WeightInfo {
  std::string fqn;    // registered parameter name ("layer1.0.conv1.weight"); "" for a computed tensor
  Tensor tensor;      // captured at trace; shares storage with the parameter
};

// Membership in a fused chain (e.g. conv2d -> batch_norm -> relu).
struct FusionInfo {
  std::vector<OpKind> pattern;  // the whole chain
  int base = -1;                // index (in the module's seen ops) of the chain's first op
  int position = -1;            // this op's place in the chain; 0 is the base
  int residual_input = -1;      // for an add in the chain: which add input is the residual
  bool fused() const { return base >= 0; }
  std::string name() const;     // "conv2d+batch_norm+relu"
};

// What convert chose for a seen op. The executor itself belongs to the tracer; the recorded
// program keeps only this description (for printing and introspection).
struct ExecutorInfo {
  std::string description;  // "int8 conv2d [16, 16, 3, 3]+relu", "fused into ...", "fp32 (...)"
  bool fp32 = false;        // the op runs in fp32 after convert
  std::vector<QuantParamsPtr> input_qparams;  // per activation input: what it takes (null: f32)
  QuantParamsPtr output_qparams;              // null: f32 output (or fused: see the chain's base)
  QuantParamsPtr weight_qparams;              // weighted ops: of the s8 weights (batch norm folded)
  const std::string& describe() const { return description; }
};

struct SeenOpInfo {
  int index = 0;                  // position in the module's sequence of quantizeable ops
  OpKind kind = OpKind::kNumOpKinds;
  std::string fqn;                // leaf module ("layer1.0.conv1") or enclosing module for functional ops
  const nn::Module* leaf = nullptr;  // the leaf module that ran it (identity check on later runs)
  QConfigPtr qconfig;
  QuantRole role = QuantRole::kNone;  // as decided by the trace analysis (kNone: runs in fp32)
  std::vector<QTensorInfo> inputs;    // activation inputs
  std::vector<QTensorInfo> outputs;
  std::vector<WeightInfo> weights;    // conv/linear weight and bias; batch_norm mean, var, weight, bias
  bool has_scalar = false, scalar_first = false;
  double scalar = 0.0;
  OpParams params;                // stride, padding, dims, eps, ... as the first run passed them
  FusionInfo fusion;
  // Observer slots (in ModelQuantState) this op feeds during calibration; -1 for none.
  std::vector<int> input_observers;  // per input: observed here (first consumer of an fp32 tensor)
  int output_observer = -1;          // observed at this op's output
  std::string unsupported;           // why a requested quantization was ignored (logged once)
  int program_index = -1;         // position in the model's execution order (analyze_trace)
  std::unique_ptr<ExecutorInfo> executor;  // set by convert

  // "conv2d", or the fused chain's name on its base op.
  std::string display_kind() const { return fusion.fused() && fusion.position == 0 ? fusion.name() : op_name(kind); }
};

// An op that was not quantized (not quantizeable, qconfig null, or unsupported); not validated.
struct NonQuantOpInfo {
  OpKind kind;
  std::string fqn;
  std::string reason;
};

enum class Phase : uint8_t { kTracing, kCalibrating, kConverted };
const char* phase_name(Phase p);

class AutoQuantizationState;

// One event of the traced run, in execution order (used by analyze_trace).
struct TraceEvent {
  enum class Kind : uint8_t { kSeenOp, kOtherOp, kEscape } kind;
  AutoQuantizationState* state = nullptr;  // kSeenOp
  int op_index = -1;                       // kSeenOp
  std::vector<int64_t> inputs;             // tensor ids read
  std::vector<int64_t> outputs;            // tensor ids produced
  std::string where;                       // kEscape: the module whose output it is
  bool repeat = false;  // kSeenOp of a module's later call during the trace: aliases the recorded op
};

struct ObserverSlot {
  std::unique_ptr<Observer> observer;
  int parent = -1;        // union-find: -1 for a root
  int64_t tensor_id = 0;  // the tensor the slot was created for
  std::string owner;      // fqn of the module whose op observes it (for printing)
  QuantParamsPtr qparams;  // computed by convert
};

// Model-wide quantization state shared by every module's AutoQuantizationState.
class ModelQuantState {
 public:
  ModelQuantState(QConfigMapping mapping, BackendConfig backend);

  const QConfigMapping& mapping() const { return mapping_; }
  const BackendConfig& backend() const { return backend_; }
  Phase phase() const { return phase_; }
  void set_phase(Phase p) { phase_ = p; }
  // Whether ops of `kind` are recorded at all (see is_seen_kind); precomputed.
  bool seen_kind(OpKind kind) const { return seen_kind_[static_cast<size_t>(kind)]; }
  bool observers_enabled() const { return observers_enabled_; }
  void set_observers_enabled(bool on) { observers_enabled_ = on; }

  // Tensor ids are unique across the process, so a tensor traced by another model is never
  // mistaken for one of ours.
  static int64_t new_tensor_id();
  struct TensorRecord {
    DType trace_dtype = DType::kF32;
    DType inf_dtype = DType::kF32;
    int slot = -1;  // observer slot giving its qparams when int8
  };
  std::unordered_map<int64_t, TensorRecord>& tensors() { return tensors_; }
  const TensorRecord* tensor(int64_t id) const;

  // Observer slots with union-find sharing.
  int new_slot(const ObserverSpec& spec, int64_t tensor_id, const std::string& owner);
  int find(int slot) const;
  // Makes two slots one (keeps a's observer; b's spec must match a's kind or b is dropped).
  int unite(int a, int b);
  Observer& observer(int slot) { return *slots_[find(slot)].observer; }
  ObserverSlot& slot(int s) { return slots_[find(s)]; }
  size_t num_slots() const { return slots_.size(); }

  std::vector<TraceEvent>& events() { return events_; }
  // Seen ops in the order the first run executed them (kept after the trace events are dropped).
  std::vector<std::pair<AutoQuantizationState*, int>>& execution_order() { return execution_order_; }
  std::vector<AutoQuantizationState*>& states() { return states_; }

 private:
  QConfigMapping mapping_;
  BackendConfig backend_;
  std::array<bool, static_cast<size_t>(OpKind::kNumOpKinds)> seen_kind_{};
  Phase phase_ = Phase::kTracing;
  bool observers_enabled_ = true;
  std::unordered_map<int64_t, TensorRecord> tensors_;
  std::vector<ObserverSlot> slots_;
  std::vector<TraceEvent> events_;
  std::vector<std::pair<AutoQuantizationState*, int>> execution_order_;
  std::vector<AutoQuantizationState*> states_;  // owned by their modules; fqn order
};

// Quantization facts about a leaf module (a layer), attached by prepare.
class LeafQuantInfo : public nn::ModuleExtension {
 public:
  LeafQuantInfo(std::string fqn, QConfigPtr qconfig) : fqn_(std::move(fqn)), qconfig_(std::move(qconfig)) {}
  const std::string& fqn() const { return fqn_; }
  const QConfigPtr& qconfig() const { return qconfig_; }

 private:
  std::string fqn_;
  QConfigPtr qconfig_;
};

class AutoQuantizationState : public nn::ModuleExtension {
 public:
  AutoQuantizationState(std::string fqn, std::string type_name, std::shared_ptr<ModelQuantState> model);

  const std::string& fqn() const { return fqn_; }
  const std::string& type_name() const { return type_name_; }
  ModelQuantState& model() const { return *model_; }
  const std::shared_ptr<ModelQuantState>& model_ptr() const { return model_; }

  // Whether an op of `kind` run directly by this module (leaf == nullptr) or by the layer `leaf`
  // is a seen op: recorded, validated on later runs and handled by convert. Returns its qconfig
  // (null: not seen).
  QConfigPtr seen_qconfig(OpKind kind, const LeafQuantInfo* leaf) const;

  bool recorded() const { return recorded_; }
  void set_recorded() { recorded_ = true; }
  std::vector<SeenOpInfo>& seen_ops() { return seen_ops_; }
  const std::vector<SeenOpInfo>& seen_ops() const { return seen_ops_; }
  std::vector<NonQuantOpInfo>& non_quant_ops() { return non_quant_ops_; }
  const std::vector<NonQuantOpInfo>& non_quant_ops() const { return non_quant_ops_; }

  // The op about to run at `cursor` must be the one recorded there (run by `leaf`, or by this
  // module's own code when null); throws ControlFlowError naming this module, the index, the
  // recorded op and the op seen. Allocates nothing unless it throws.
  SeenOpInfo& validate_cur_op(int cursor, OpKind kind, const nn::Module* leaf, const LeafQuantInfo* leaf_info);
  // At the end of a call: every recorded op must have run.
  void validate_op_count(int cursor) const;

  std::string to_string(int indent = 0) const;

 private:
  std::string fqn_;
  std::string type_name_;
  std::shared_ptr<ModelQuantState> model_;
  bool recorded_ = false;
  std::array<QConfigPtr, static_cast<size_t>(OpKind::kNumOpKinds)> functional_qconfig_;
  std::array<bool, static_cast<size_t>(OpKind::kNumOpKinds)> functional_seen_{};
  std::vector<SeenOpInfo> seen_ops_;
  std::vector<NonQuantOpInfo> non_quant_ops_;
};

// Whether the backend would record `kind` at all (quantizeable, or part of a fusion pattern).
bool is_seen_kind(const BackendConfig& backend, OpKind kind);

// After the traced run: fusion discovery, inference dtypes, observer placement. Throws nothing for
// unsupported requests: those ops stay fp32 and get a logged warning.
void analyze_trace(ModelQuantState& model);

// The AutoQuantizationState of a prepared module, or null.
AutoQuantizationState* quant_state_of(const nn::Module& m);

}  // namespace dbrq
