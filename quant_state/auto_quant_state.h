// Per-module quantization state (AutoQuantizationState) and the model-wide state it shares
// (ModelQuantState): the recorded program (every quantizeable op a module ran, on every path its
// calls took), where observers go, and what convert decided.
//
// prepare() attaches one AutoQuantizationState to every non-leaf module. A module's recorded ops
// (SeenOpInfo, "records") are identified by what they are, not by their position in a call: the op
// kind, the layer that runs it, its parameters and scalar (its "tag"), and where its inputs come
// from inside the module (see docs/control_flow.md). So a loop uses one record per op whatever its
// trip count, a branch adds the records of the ops only it runs, and a module called N times uses
// the same records each time. The first run records; a later calibrating
// call that runs an op no record matches records it too; analyze_program() then (re)computes
// fusions, which tensors are int8 at inference and where observers go, over every path seen.
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
//     paths: 1 (ops 0-5: 12 calls)
#pragma once

#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "quant_state/observers.h"
#include "quant_state/qconfig.h"
#include "runtime/module.h"
#include "runtime/op_registry.h"

namespace dbrq {

// A tensor as the recorded program sees it. `id` names its origin, model-wide: the output of a
// record, or an fp32 source (a model input, the output of an op that is not recorded).
struct QTensorInfo {
  int64_t id = 0;                 // the (first) origin
  DType trace_dtype = DType::kF32;
  DType inf_dtype = DType::kF32;  // what it is at inference: u8 when quantized
  std::vector<int64_t> more_ids;  // inputs: further origins seen on other paths or loop iterations
  size_t num_origins() const { return 1 + more_ids.size(); }
};

// Part of a registered parameter, not all of it (`w.narrow(0, 0, d)` of a packed qkv weight,
// `w.select(0, i)` of stacked experts): where the part lies in the parameter's storage. Two parts
// of one parameter are two weights, so they are two records.
struct WeightView {
  int64_t offset = 0;                   // elements from the start of the storage
  std::vector<int64_t> sizes, strides;  // in elements
  bool operator==(const WeightView& o) const {
    return offset == o.offset && sizes == o.sizes && strides == o.strides;
  }
};

struct WeightInfo {
  std::string fqn;    // registered parameter name ("layer1.0.conv1.weight"); "" for a computed tensor
  Tensor tensor;      // captured when recorded; shares storage with the parameter (undefined: absent)
  bool missing = false;  // a computed tensor of a record loaded from a file: taken from its next call
  bool has_view = false;  // `tensor` is `view` of parameter `fqn`, not all of it
  WeightView view;
};

// Membership in a fused chain (e.g. conv2d -> batch_norm -> relu).
struct FusionInfo {
  std::vector<OpKind> pattern;  // the whole chain
  std::vector<int> members;     // the chain's records (indices in the module's seen ops), base first
  int base = -1;                // index of the chain's first op (for a follower of several bases, the first)
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

// A read of a record's output by another record (the data flow the fusion analysis needs).
struct Consumer {
  int record = -1;  // global index (ModelQuantState::records())
  int input = -1;
  bool operator==(const Consumer& o) const { return record == o.record && input == o.input; }
};

// Producer tags of a record's activation inputs, as its module sees them (see SeenOpInfo::key).
using ProducerTags = absl::InlinedVector<int64_t, 4>;

// A record's tag: what an op is apart from its inputs, built from portable parts only (so it is the
// same in every process and quant-state files are checked against it). The tracer computes it for
// every op call: start from the kind and the layer running it (0 for a module's own functional
// op), then mix in the parameters' fingerprint (when OpDef::params_in_identity), the scalar, and
// for a functional op each weight's fqn fingerprint (1 for a computed or missing one).
uint64_t kind_fingerprint(OpKind kind);  // name_fingerprint(op_name(kind)), from a table
inline uint64_t tag_start(OpKind kind, uint64_t leaf_fqn_fingerprint) {
  return fingerprint_mix(fingerprint_mix(kFingerprintSeed, kind_fingerprint(kind)), leaf_fqn_fingerprint);
}
inline uint64_t tag_scalar(uint64_t h, double scalar, bool scalar_first) {
  uint64_t b;
  std::memcpy(&b, &scalar, sizeof(b));
  return fingerprint_mix(fingerprint_mix(h, b), scalar_first ? 1u : 0u);
}
// A functional op's weight in its tag: the parameter's fqn fingerprint (1 for a computed or
// missing weight), and where in the parameter a part of it lies.
inline uint64_t tag_weight(uint64_t h, uint64_t fqn_fingerprint, const WeightView* view) {
  h = fingerprint_mix(h, fqn_fingerprint);
  if (view == nullptr) return h;
  h = fingerprint_mix(fingerprint_mix(h, 0x7669657700000000ull), static_cast<uint64_t>(view->offset));
  for (size_t d = 0; d < view->sizes.size(); ++d) {
    h = fingerprint_mix(fingerprint_mix(h, static_cast<uint64_t>(view->sizes[d])), static_cast<uint64_t>(view->strides[d]));
  }
  return fingerprint_mix(h, view->sizes.size());
}
// Op tags have bit 63 set (never a module-input or child-output tag).
inline int64_t tag_finish(uint64_t h) { return static_cast<int64_t>(h | (uint64_t{1} << 63)); }

struct SeenOpInfo {
  int index = 0;                  // position in the module's records (creation order)
  int global_index = -1;          // position in ModelQuantState::records()
  OpKind kind = OpKind::kNumOpKinds;
  std::string fqn;                // leaf module ("layer1.0.conv1") or enclosing module for functional ops
  const nn::Module* leaf = nullptr;  // the leaf module that runs it
  // A functional op (leaf null): its call's index among the module call's calls of its kind when
  // it was recorded, as QConfigMapping::set_module_name_object_type_order addresses it (-1: a
  // layer's op, or read from a file).
  int order = -1;
  // Identity, inside the module: its tag (kind, layer, parameters, scalar, weights: what the op
  // is) and the producer tags of its activation inputs (the tag of the op that produced each: a
  // record's, an unrecorded op's, the module's input k, a child module's output j).
  int64_t tag = 0;
  ProducerTags producers;
  // The tag its output carries (Tensor::trace_id): `tag`, except for an op that only passes its
  // one input's values on (a view, contiguous, dropout, max pooling: OpDef::params_in_identity
  // false), whose output carries its tag mixed with its source's: the tag of the nearest producer
  // up its chain of such ops. So x.view(..).permute(..) of two different linears' outputs are
  // different tensors to their consumers, and a loop that views a loop-carried tensor still folds
  // (AutoQuantizationState::output_tag).
  int64_t out_tag = 0;
  // The OpIdentityScope salt the op ran under (0: none), part of `tag`: nn::GRU / nn::LSTM run each
  // layer and direction under its own, so their gate ops get records (and ranges) of their own.
  uint64_t identity_salt = 0;
  uint64_t params_fingerprint = 0;  // stable across processes (files)
  QConfigPtr qconfig;
  QuantRole role = QuantRole::kNone;  // as decided by the analysis (kNone: runs in fp32)
  std::vector<QTensorInfo> inputs;    // activation inputs
  std::vector<QTensorInfo> outputs;
  std::vector<WeightInfo> weights;    // conv/linear weight and bias; batch_norm mean, var, weight, bias
  bool has_scalar = false, scalar_first = false;
  double scalar = 0.0;
  // An add (or another residual-capable op) whose inputs had different sizes on some call
  // (conv(x) + t with t [N, C, 1, 1]): it broadcasts, which a fused residual cannot.
  bool broadcasts = false;
  OpParams params;                // stride, padding, dims, eps, ... as the first run passed them
  FusionInfo fusion;
  // Who reads the output (over every call recorded so far).
  std::vector<Consumer> consumers;
  bool read_by_fp32 = false;  // by an op that is not recorded
  bool escapes = false;       // returned from a (non-leaf) module
  bool read_twice = false;    // twice by one op (x + x)
  bool model_output = false;  // returned by the model's outermost call (read by the user)
  // Fusion across a module boundary (analysis, docs/architecture.md "Fusion across modules"): an
  // activation or a residual add recorded in another module that is the sole reader of this op's
  // output, on every path seen, runs inside this op's fused kernel as if both were in one module
  // (an add with the relu of its own module's chain, if it has one). `absorbs` is on the producer
  // (the last op of its module's chain, or an unfused op): the absorbed op's global index;
  // `absorbed_by` on the absorbed op: the producer's global index, and `absorbed_input` which of
  // its inputs reads the producer (an add's other input is the residual). -1: none.
  int absorbs = -1;
  int absorbed_by = -1;
  int absorbed_input = -1;
  // Observer slots (in ModelQuantState) this op feeds during calibration; -1 for none.
  std::vector<int> input_observers;  // per input: observed here (first consumer of an fp32 tensor)
  int output_observer = -1;          // observed at this op's output
  std::string unsupported;           // why a requested quantization was ignored (logged once)
  int program_index = -1;            // index of its executor in the converted program (= global_index)
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

// The distinct records one call of a module ran, and how many calls ran exactly those.
struct PathInfo {
  std::array<uint64_t, 4> mask{};  // record i is bit i (records beyond 256 share bits modulo 256)
  std::vector<int> records;        // in the order of the first call that took it
  int64_t calls = 0;
};

enum class Phase : uint8_t { kTracing, kCalibrating, kConverted };
const char* phase_name(Phase p);

class AutoQuantizationState;

struct ObserverSlot {
  std::unique_ptr<Observer> observer;
  int parent = -1;        // union-find: -1 for a root
  int64_t tensor_id = 0;  // the tensor (origin) the slot was created for
  std::string owner;      // fqn of the module whose op observes it (for printing)
  int record = -1;        // the record (global index) it belongs to
  int input = -1;         // that record's input it observes; -1: its output
  QuantParamsPtr qparams;  // computed by convert, or fixed by a loaded file
  bool frozen = false;     // qparams came from a file: convert keeps them, whatever the observer saw
  // Calibration saw +-inf here at least once per observed tensor on average (an additive -inf
  // mask), or a far group of low values in any tensor (the same mask written with a finite
  // stand-in such as -1e9: Observer::mask_count): int8 cannot hold the values, and convert runs
  // the ops reading or writing them fp32. Set from a quant-state file too (parameters-only files
  // have no statistics to tell; the file calls both "infinities").
  bool infinite = false;
  bool saw_infinities() const {
    return infinite ||
           (observer != nullptr && ((observer->inf_count() > 0 && observer->inf_count() >= observer->num_batches()) ||
                                    observer->mask_count() > 0));
  }
  // The tensor it observed last (storage id, version, offset, element count): several consumers
  // of one fp32 tensor feed its observer, which takes each tensor once (and a narrower view of
  // the same storage, cat({s.narrow(1, 0, 2), s}), is not the same tensor).
  struct Last {
    uint64_t call = 0;  // ModelQuantState::call_count() when observed
    uint64_t storage = 0;
    uint64_t version = 0;
    int64_t offset = -1;
    int64_t numel = -1;
    uint64_t consumer = 0;  // the record and input that observed it
    uint64_t hash = 0;      // of its values (an op's result only)
  } last;
  // Observes `t` unless it is the tensor observed last in this call (`call`), an op's result
  // unchanged since (a tensor no op made is observed every time).
  // `consumer` names the record input observing it: the same tensor seen by another consumer is
  // taken once; by the same consumer again (a loop's next iteration, the buffer possibly refilled
  // through a pointer no version sees) it is observed again, and so it is when its values changed.
  void observe_once(const Tensor& t, uint64_t call, uint64_t consumer);
};

// Model-wide quantization state shared by every module's AutoQuantizationState. Calibration of one
// model happens on one thread at a time; converted calls may run on several threads at once.
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
  // Strict control flow (PrepareOptions::strict_control_flow): one fixed op sequence per module.
  bool strict() const { return strict_; }
  void set_strict(bool on) { strict_ = on; }
  // PrepareOptions::float_outputs_for_float_readers: an int8 linear whose output no int8 op reads
  // writes f32 (trace_analysis.cc).
  bool float_outputs() const { return float_outputs_; }
  void set_float_outputs(bool on) { float_outputs_ = on; }

  // Ids of origins (record outputs and fp32 sources) are unique across the process, so a tensor
  // of another model is never mistaken for one of ours.
  static int64_t new_tensor_id();
  struct TensorRecord {
    DType trace_dtype = DType::kF32;
    DType inf_dtype = DType::kF32;
    int slot = -1;    // observer slot giving its qparams when int8
    int record = -1;  // the producing record (global index); -1: an fp32 source
    uint64_t source = 0;  // an fp32 source's portable name (see fp32_source_id)
  };
  std::unordered_map<int64_t, TensorRecord>& tensors() { return tensors_; }
  const TensorRecord* tensor(int64_t id) const;
  // An fp32 source (a model input, the output of an op that is not recorded, a constant) is named
  // by a portable 64-bit `source` (built from fqn and op fingerprints, the same in every process);
  // its origin id in this model is a function of it, so converted calls compute it without a
  // table, and a quant-state file names it by `source`. Bit 62 is set (record outputs are
  // counted from 1), bits 61 and 60 clear (see the tracer's kInnerFusedBit and kUncalibratedBit).
  int64_t fp32_source_id(uint64_t source) const {
    uint64_t h = (source ^ reinterpret_cast<uintptr_t>(this)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return static_cast<int64_t>((h & ((uint64_t{1} << 60) - 1)) | (uint64_t{1} << 62));
  }
  // The same, registering the source (while tracing or calibrating).
  int64_t add_fp32_source(uint64_t source);

  // Every record of every module, in creation order: (state, index in it).
  std::vector<std::pair<AutoQuantizationState*, int>>& records() { return records_; }
  // The same, under the name convert and printing use: the program's order.
  std::vector<std::pair<AutoQuantizationState*, int>>& execution_order() { return records_; }
  SeenOpInfo& record(int global_index);
  const SeenOpInfo& record(int global_index) const;
  // The module state holding a record.
  AutoQuantizationState& state_of(int global_index) { return *records_[static_cast<size_t>(global_index)].first; }
  const AutoQuantizationState& state_of(int global_index) const {
    return *records_[static_cast<size_t>(global_index)].first;
  }
  // The ops after `base` in the chain whose kernel `base` runs, in order: the rest of its module's
  // fused chain (SeenOpInfo::fusion), then the op the chain's last op absorbs from another module
  // (SeenOpInfo::absorbs) followed by that op's own chain. Empty when `base` runs alone.
  std::vector<const SeenOpInfo*> chain_after(const SeenOpInfo& base) const;

  // Observer slots with union-find sharing. A slot belongs to a record's output (input = -1) or
  // input; ensure_slot returns the existing one, so analysis can run again as paths are added.
  int new_slot(const ObserverSpec& spec, int64_t tensor_id, const std::string& owner);
  int ensure_slot(int record, int input, const ObserverSpec& spec, int64_t tensor_id, const std::string& owner);
  int find(int slot) const;
  // Makes two slots one, keeping a's observer and folding b's statistics into it.
  int unite(int a, int b);
  Observer& observer(int slot) { return *slots_[find(slot)].observer; }
  ObserverSlot& slot(int s) { return slots_[find(s)]; }
  // Slot s itself (its key: record, input), not its root.
  const ObserverSlot& slot_entry(int s) const { return slots_[static_cast<size_t>(s)]; }
  size_t num_slots() const { return slots_.size(); }
  // Empties the slot table and returns it: analysis builds the table afresh (so the same records
  // always give the same slots, whatever order their paths were found in) and carries the old
  // observers over by key (see analyze_program).
  std::vector<ObserverSlot> take_slots();

  // The output of a record that runs inside a fused chain but not at its end (the conv of a fused
  // conv + relu) has no slot: at convert nothing reads it. It is still observed while calibrating,
  // here, so that a later path which breaks the chain (the conv's output also read elsewhere)
  // gives the record's new output slot what every earlier call produced, not only the calls after
  // the break (analyze_program's carry-over). Saved in quant-state files with statistics, so
  // that merge_calibration carries it over too.
  Observer& inner_output_observer(int record, const ObserverSpec& spec);
  const std::map<int, std::unique_ptr<Observer>>& inner_outputs() const { return inner_outputs_; }
  // Hands out (and forgets) the record's inner-output observer; null if there is none.
  std::unique_ptr<Observer> take_inner_output_observer(int record);

  std::vector<AutoQuantizationState*>& states() { return states_; }

  // Counts the model's outermost calibrating calls (an observer takes one tensor once per call).
  uint64_t call_count() const { return calls_; }
  void count_call() { ++calls_; }
  void set_call_count(uint64_t calls) { calls_ = calls; }

  // The prepared model (set by prepare): quant-state files name layers and weights by fqn.
  nn::Module* root() const { return root_; }
  void set_root(nn::Module* root) { root_ = root; }

  // Forgets every record, tensor, slot and path, in this model and its modules' states (a
  // quant-state file's program replaces them).
  void clear_program();

  // Parameter or buffer name -> hash_bytes of the values calibration saw, for each one whose
  // values did not vary while calibrating (the tracer's QuantInterceptor keeps it): the ranges
  // downstream of them describe those values, so convert raises when one holds others by then.
  // Quant-state files carry it ("calibrated_values"): the deploy flow's convert checks that the
  // weights loaded are the ones the file was calibrated with.
  std::map<std::string, uint64_t>& calibrated_values() { return calibrated_values_; }
  const std::map<std::string, uint64_t>& calibrated_values() const { return calibrated_values_; }
  // The parameters and buffers whose values varied while calibrating (written by a calibrating
  // call, or between two: a running state, a mask set before each call). Neither convert nor
  // the converted model checks them; files carry them ("varied_values"), so a deployed copy does
  // not take the next mask for a changed weight.
  std::set<std::string>& varied_values() { return varied_values_; }
  const std::set<std::string>& varied_values() const { return varied_values_; }

  // The recorded program changed (a record or an edge was added) since the last analysis.
  bool dirty() const { return dirty_; }
  void set_dirty(bool on) { dirty_ = on; }

 private:
  QConfigMapping mapping_;
  BackendConfig backend_;
  std::array<bool, static_cast<size_t>(OpKind::kNumOpKinds)> seen_kind_{};
  Phase phase_ = Phase::kTracing;
  bool observers_enabled_ = true;
  bool strict_ = false;
  bool float_outputs_ = false;
  bool dirty_ = false;
  uint64_t calls_ = 0;
  nn::Module* root_ = nullptr;
  std::unordered_map<int64_t, TensorRecord> tensors_;
  std::vector<ObserverSlot> slots_;
  std::map<std::pair<int, int>, int> slot_index_;  // (record, input) -> slot
  std::map<int, std::unique_ptr<Observer>> inner_outputs_;  // record -> observer (see inner_output_observer)
  std::map<std::string, uint64_t> calibrated_values_;
  std::set<std::string> varied_values_;
  std::vector<std::pair<AutoQuantizationState*, int>> records_;
  std::vector<AutoQuantizationState*> states_;  // owned by their modules; fqn order
};

// Quantization facts about a leaf module (a layer), attached by prepare.
class LeafQuantInfo : public nn::ModuleExtension {
 public:
  LeafQuantInfo(std::string fqn, QConfigPtr qconfig)
      : fqn_(std::move(fqn)), fqn_fingerprint_(name_fingerprint(fqn_)), qconfig_(std::move(qconfig)) {}
  const std::string& fqn() const { return fqn_; }
  // name_fingerprint(fqn()): the layer in a record's identity, the same in every process.
  uint64_t fqn_fingerprint() const { return fqn_fingerprint_; }
  const QConfigPtr& qconfig() const { return qconfig_; }

 private:
  std::string fqn_;
  uint64_t fqn_fingerprint_;
  QConfigPtr qconfig_;
};

class AutoQuantizationState : public nn::ModuleExtension {
 public:
  AutoQuantizationState(std::string fqn, std::string type_name, std::shared_ptr<ModelQuantState> model);

  const std::string& fqn() const { return fqn_; }
  uint64_t fqn_fingerprint() const { return fqn_fingerprint_; }  // name_fingerprint(fqn())
  const std::string& type_name() const { return type_name_; }
  ModelQuantState& model() const { return *model_; }
  const std::shared_ptr<ModelQuantState>& model_ptr() const { return model_; }

  // Whether an op of `kind` run directly by this module (leaf == nullptr) or by the layer `leaf`
  // is a seen op: recorded and handled by convert. Returns its qconfig (null: not seen).
  // `order`: for a functional op, its index among this call's functional calls of `kind`
  // (QConfigMapping::set_module_name_object_type_order); -1 when not counted (no such entry).
  QConfigPtr seen_qconfig(OpKind kind, const LeafQuantInfo* leaf, int order = -1) const;
  // seen_qconfig(...) != nullptr, without copying the qconfig (every converted op asks).
  bool is_seen(OpKind kind, const LeafQuantInfo* leaf, int order = -1) const;
  // Whether the mapping marks the op QConfig::bf16() (it is then not a seen op: f32 boundaries).
  bool bf16_op(OpKind kind, const LeafQuantInfo* leaf, int order = -1) const;
  // Whether the mapping has call-site entries for functional ops of `kind` in this module (their
  // calls must then be counted to find their qconfig).
  bool has_call_sites(OpKind kind) const { return call_sites_[static_cast<size_t>(kind)]; }
  // Every qconfig a functional op of `kind` of this module can have: the module's for the kind,
  // then each call-site entry's (a record read from a file is checked against them).
  std::vector<QConfigPtr> functional_qconfigs(OpKind kind) const;

  bool recorded() const { return recorded_; }
  void set_recorded(bool on = true) { recorded_ = on; }
  // Records, in creation order (a deque: references stay valid as records are added).
  std::deque<SeenOpInfo>& seen_ops() { return seen_ops_; }
  const std::deque<SeenOpInfo>& seen_ops() const { return seen_ops_; }
  std::vector<NonQuantOpInfo>& non_quant_ops() { return non_quant_ops_; }
  const std::vector<NonQuantOpInfo>& non_quant_ops() const { return non_quant_ops_; }

  // The record of an op with tag `tag` and producer tags `producers`, or -1. `hint`: the record
  // expected (the one that followed the previous record last time), checked before the map.
  int find_record(int64_t tag, OpKind kind, const ProducerTags& producers, int hint) const;
  // Adds a record (index = its position) and indexes it; the caller fills the rest.
  SeenOpInfo& add_record(int64_t tag, OpKind kind, const ProducerTags& producers);
  // Removes the newest record (a failed call's; it must be the last one added).
  void remove_last_record();
  // The tag the output of an op with this identity carries (SeenOpInfo::out_tag). An op that
  // passes its source on mixes its tag with the source: the producer's source when the producer
  // is itself such an op of this module, else the producer. Reads only, so it is safe after
  // convert (an uncalibrated path); add_record remembers each pass-through output's source.
  int64_t output_tag(int64_t tag, OpKind kind, const ProducerTags& producers) const;
  // The record that followed `index` last time (a lookup hint; racy reads are fine).
  int next_hint(int index) const;
  void set_next_hint(int index, int next) const;

  // Strict control flow: the sequence of records of the module's first call, and the check of
  // each later call against it (ControlFlowError naming this module, the index, the recorded op
  // and the op seen). Allocates nothing unless it throws.
  std::vector<int>& first_sequence() { return first_sequence_; }
  void check_sequence(int cursor, OpKind kind, int64_t tag, const LeafQuantInfo* leaf_info);
  void check_sequence_end(int cursor) const;

  // Paths: the distinct sets of records calls of this module ran (thread-safe).
  void note_path(const std::array<uint64_t, 4>& mask, const std::vector<int>* records);
  std::vector<PathInfo> paths() const;
  void set_paths(std::vector<PathInfo> paths);

  std::string to_string(int indent = 0) const;

  // Forgets every record, note and path (see ModelQuantState::clear_program).
  void clear_program();

 private:
  struct Key {
    int64_t tag;
    OpKind kind;
    ProducerTags producers;
    bool operator==(const Key& o) const { return tag == o.tag && kind == o.kind && producers == o.producers; }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.tag, static_cast<int>(k.kind), k.producers);
    }
  };

  std::string fqn_;
  uint64_t fqn_fingerprint_;
  std::string type_name_;
  std::shared_ptr<ModelQuantState> model_;
  bool recorded_ = false;
  std::array<QConfigPtr, static_cast<size_t>(OpKind::kNumOpKinds)> functional_qconfig_;
  std::array<bool, static_cast<size_t>(OpKind::kNumOpKinds)> functional_seen_{};
  std::array<bool, static_cast<size_t>(OpKind::kNumOpKinds)> call_sites_{};
  std::deque<SeenOpInfo> seen_ops_;
  absl::flat_hash_map<Key, int> index_;
  static bool passes_source(OpKind kind, const ProducerTags& producers);
  int64_t source_of(int64_t producer) const;

  // Pass-through outputs' tags -> their source's tag (see output_tag).
  absl::flat_hash_map<int64_t, int64_t> pass_sources_;
  mutable std::deque<std::atomic<int>> next_hint_;
  std::vector<NonQuantOpInfo> non_quant_ops_;
  std::vector<int> first_sequence_;
  mutable std::mutex paths_mu_;
  std::vector<PathInfo> paths_;
};

// Whether the backend would record `kind` at all (quantizeable, or part of a fusion pattern).
bool is_seen_kind(const BackendConfig& backend, OpKind kind);

// Over every record and edge recorded so far: fusion discovery, inference dtypes, observer
// placement. Runs after the first (traced) call and again after a calibrating call that added
// records or edges; existing observers keep their statistics. Throws nothing for unsupported
// requests: those ops stay fp32 and get a logged warning (once).
void analyze_program(ModelQuantState& model);
// The origins of a record's input whose every value arrives at that input: made by one record,
// read by no other record input, neither returned from a module nor read by an op that is not
// recorded, with an observer slot of their own. What their observers saw belongs to the input's
// own observer once it has one (its second origin found by a later path, or by a replica):
// analyze_program seeds a new input observer from them, merge_calibration adds a replica's.
// Built once over the model's records and slots (valid while neither changes).
class SoleOrigins {
 public:
  explicit SoleOrigins(ModelQuantState& model);
  // Of record `g`'s (global index) input `k`.
  std::vector<int64_t> of(int g, size_t k) const;

 private:
  ModelQuantState& model_;
  std::map<int64_t, int> producers_, readers_;  // tensor id -> records making it, record inputs reading it
  std::map<int, int> members_;                  // slot root -> slots it unites
};
inline void analyze_trace(ModelQuantState& model) { analyze_program(model); }

// The AutoQuantizationState of a prepared module, or null.
AutoQuantizationState* quant_state_of(const nn::Module& m);

}  // namespace dbrq
