// The quantization interceptor: one per prepared model, installed on the calling thread for the
// duration of a call of the model (or of any of its prepared submodules). It keeps the
// thread-local module call stack and routes each op and module call by the model's phase:
//
//   tracing      first run: record seen ops and tensor flow (observers untouched)
//   calibrating  validate each seen op against the record, feed observers, compute in fp32
//   converted    validate, then run the op's converted executor (int8 oneDNN primitives)
//
// Hooks, as in the define-by-run design: op hooks (a seen op inside a module with state), module
// I/O hooks (dtype changes at a module boundary: non-traceable modules get fp32 inputs; the model's
// outputs come back fp32) and arg-dequant hooks (any other op receiving int8 tensors gets them
// dequantized and runs in fp32).
//
// Everything per call lives on the calling thread's stack of frames, so a converted model can be
// called from several threads at once, and two threads can run two models in different phases.
//
// Errors say where they happened: a dbrq::Error thrown while an op runs gets the module and the op
// in front of its message ("in module \"layer1.0\" (BasicBlock), op 0 conv2d (layer1.0.conv1):
// conv2d: input has 5 channels ..."), once, however many modules it crosses; one thrown by a
// module's own code (outside any op) gets the module. After an exception the thread's frames are
// unwound and a calibrating call's observer statistics are restored to what they were before it,
// so the model computes and calibrates exactly as if the failed call had not happened.
#pragma once

#include <array>
#include <thread>
#include <atomic>
#include <functional>
#include <mutex>
#include <set>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "quant_state/auto_quant_state.h"
#include "runtime/dispatcher.h"
#include "runtime/module.h"
#include "tracer/convert.h"

namespace dbrq::tracer {

// Marks a module whose subtree stays fp32 and is not traced.
class NonTraceableInfo : public nn::ModuleExtension {
 public:
  // `state`: the subtree's parameters and buffers (checked for writes after convert).
  NonTraceableInfo(std::string fqn, std::vector<Tensor> state)
      : fqn_(std::move(fqn)), fqn_fingerprint_(name_fingerprint(fqn_)), state_(std::move(state)) {}
  const std::string& fqn() const { return fqn_; }
  uint64_t fqn_fingerprint() const { return fqn_fingerprint_; }
  const std::vector<Tensor>& state() const { return state_; }

 private:
  std::string fqn_;
  uint64_t fqn_fingerprint_;
  std::vector<Tensor> state_;
};

// One module call on the thread's stack.
struct Frame {
  nn::Module* module = nullptr;
  AutoQuantizationState* state = nullptr;   // non-leaf module with state
  const LeafQuantInfo* leaf = nullptr;      // layer
  int cursor = 0;                           // strict control flow: position in the first call's sequence
  bool recording = false;                   // strict control flow: this is the module's first call
  int last_record = -1;                     // the record the module ran last (a lookup hint)
  std::array<uint64_t, 4> path{};           // the records this call ran (PathInfo::mask)
  bool fp32_region = false;                 // non-traceable: interception suspended inside
  bool reads_uncalibrated = false;          // fp32 region after convert: an input came from an uncalibrated path
  Interceptor* saved = nullptr;             // the interceptor to restore after an fp32 region
  // fp32 region: each input as the caller holds it, as the subtree got it (dequantized after
  // convert) and that tensor's storage version then, so writes inside reach the caller.
  struct GivenInput {
    Tensor caller, given;
    uint64_t version = 0;
  };
  std::vector<GivenInput> given;
  const void* owner = nullptr;              // the QuantInterceptor that pushed the frame
  bool snapshot = false;                    // saved the observers' statistics (outermost calibrating call)
  size_t created_mark = 0;                  // outermost frame: records created before this call
  bool holds_calibration = false;           // outermost frame of a call before convert (enter_unconverted)
  // Functional calls of each op kind made directly by this call so far (counted while tracing and
  // calibrating, and after convert for kinds with call-site entries in the mapping).
  std::vector<std::pair<OpKind, int>> op_counts;
  int next_order(OpKind kind) {
    for (auto& [k, n] : op_counts) {
      if (k == kind) return n++;
    }
    op_counts.emplace_back(kind, 1);
    return 0;
  }
};

// One per prepared model; the prepared modules own it (Module::attach_interceptor), and it owns
// the model's converted program.
class QuantInterceptor : public Interceptor {
 public:
  QuantInterceptor(std::shared_ptr<ModelQuantState> model, nn::Module& root);
  // The interceptor of a prepared model; throws UsageError ("<what>: <Type> is not a prepared
  // model ...") otherwise.
  static QuantInterceptor& of(const nn::Module& model, const char* what);

  Tensor on_op(const OpCall& call) override;
  bool serves_only_its_modules() const override { return true; }
  void on_module_enter(nn::Module& module, absl::Span<Tensor* const> inputs) override;
  void on_module_exit(nn::Module& module, absl::Span<Tensor* const> outputs) override;
  void on_module_unwind(nn::Module& module) noexcept override;
  void on_module_error(nn::Module& module, const Error& error) override;

  ModelQuantState& model() { return *model_; }
  // The executor of a converted seen op (SeenOpInfo::program_index), or null (not converted, out
  // of range). For the ONNX exporter, which reads the weights a converted op runs with.
  ConvertedOp* executor(int program_index) const {
    if (program_index < 0 || static_cast<size_t>(program_index) >= program_.size()) return nullptr;
    return program_[static_cast<size_t>(program_index)].get();
  }

  // After convert: whether `t` is the output of a fused chain's inner op, which does not exist as
  // such (the tensor holds the chain's result, or nothing yet: a conv waiting for its residual
  // add). Such a tensor may leave a module whose chain continues in its caller (fusion across
  // modules, SeenOpInfo::absorbs).
  static bool is_inner_fused(const Tensor& t);

  // Converts the model (see convert_model) and switches it to the converted phase.
  void convert(bool int8_outputs);

  // Converts the model with an uncalibrated path raising instead of running in fp32.
  void set_strict_paths(bool on) { strict_paths_ = on; }
  // Ops converted calls ran in fp32 because their path was never calibrated.
  int64_t uncalibrated_ops() const { return uncalibrated_.load(std::memory_order_relaxed); }

  // Numeric comparison (compare_numerics) after convert: probes of the calls one thread makes
  // (other threads' calls of the model are not probed). `op` sees every quantizeable op's result
  // in the order the calls run (the record, or null for an op of a path never calibrated, run in
  // fp32; the layer's or module's fqn); `module` sees each call of a module with state when it
  // starts (exit false) and when it returns (exit true: the path it took, as PathInfo::mask, and
  // its outputs).
  struct Probes {
    std::function<void(const AutoQuantizationState&, const SeenOpInfo* op, OpKind, const std::string& fqn,
                       const Tensor& out)>
        op;
    std::function<void(const AutoQuantizationState&, bool exit, const std::array<uint64_t, 4>& path,
                       absl::Span<Tensor* const> outputs)>
        module;
  };
  // Probes for the calling thread's calls; `probes` must outlive them. False when another thread's
  // probes are set (one comparison at a time per model).
  bool set_probes(const Probes* probes) {
    const Probes* none = nullptr;
    if (!probes_.compare_exchange_strong(none, probes, std::memory_order_acq_rel)) return false;
    probe_thread_.store(std::this_thread::get_id(), std::memory_order_release);
    return true;
  }
  void clear_probes() {
    probes_.store(nullptr, std::memory_order_release);
    probe_thread_.store(std::thread::id(), std::memory_order_release);
  }

 private:
  // The probes, when this thread set them (one load when there are none). Another thread's are
  // never dereferenced, so clearing them cannot race with a probed call.
  const Probes* probe_of_this_thread() const {
    if (__builtin_expect(probes_.load(std::memory_order_relaxed) == nullptr, 1)) return nullptr;
    if (probe_thread_.load(std::memory_order_acquire) != std::this_thread::get_id()) return nullptr;
    return probes_.load(std::memory_order_acquire);
  }
  // The record of a seen op in `owner`'s module (creating it while tracing or calibrating), or
  // -1 after convert for an op on a path never calibrated.
  // `order`: a functional op's index among its module call's calls of its kind (-1: not counted).
  int find_or_record(const OpCall& call, Frame* owner, Frame* top, int64_t tag, const ProducerTags& producers,
                     int order);
  SeenOpInfo& record_op(const OpCall& call, Frame* owner, Frame* top, int64_t tag, const ProducerTags& producers, int order,
                        const QConfigPtr& qconfig);
  // What an op is, apart from its inputs: kind, layer, parameters, scalar, functional weights.
  int64_t op_tag(const OpCall& call, const LeafQuantInfo* leaf, const OpDef& def, size_t n_act, bool seen) const;
  // Data flow of a seen op's inputs into its record and their producers' (tracing, calibrating).
  void note_inputs(const OpCall& call, Frame* owner, SeenOpInfo& op);
  // An uncalibrated path after convert: fp32, logged once, counted (or ControlFlowError).
  Tensor run_uncalibrated(const OpCall& call, Frame* owner, Frame* top, const std::string& why);
  // Whether an activation input of `call` is the output of a calibrated record that runs fp32.
  bool after_fp32_record(const OpCall& call, size_t n_act) const;
  Tensor seen_op(const OpCall& call, Frame* owner, Frame* top, int order);
  // on_op's work for any op (on_op adds the in-place write-back after convert).
  Tensor run_op(const OpCall& call);
  Tensor other_op(const OpCall& call, Frame* owner, Frame* top, int order);
  // The producer tag of an activation input, part of its op's identity: the tag of the op or
  // module input that made it; for a parameter or buffer read as an activation, which one (so
  // matmul(h, wq) and matmul(h, wk) are two records with their own ranges, not one op run twice);
  // 0 for a tensor made outside the model's ops.
  int64_t producer_tag(const Tensor& t) const;
  // The origin id of an input as this model knows it (0: none).
  int64_t origin_of(const Tensor& t, AutoQuantizationState* state, int64_t tag, size_t k);
  void rollback_records(size_t mark) noexcept;
  // A functional op's weight as a record names it: the parameter or buffer (fqn "" when computed)
  // and, for a part of one (narrow, select, view), where the part lies.
  WeightInfo weight_info(const Tensor& t) const;

  std::shared_ptr<ModelQuantState> model_;
  struct Param {
    std::string fqn;       // parameter or buffer
    uint64_t fingerprint;  // name_fingerprint(fqn)
    Tensor tensor;         // as registered: a weight with other geometry is a part of it
  };
  // storage -> every parameter or buffer on it (usually one; a child may register a view of its
  // parent's parameter).
  std::unordered_map<const void*, std::vector<Param>> params_;
  // The registration a functional op's weight names: one with the weight's exact geometry, else
  // the largest one on its storage (a view is named as a part of it). Null for a computed tensor.
  const Param* param_of(const Tensor& w, bool* whole) const;
  // storage -> its storage version at convert, for every parameter and buffer that no call before
  // convert wrote (QuantInterceptor::convert). A converted op reading one as an activation
  // (matmul(x, w), x + pos_embedding) after it was written since runs fp32: its int8 range came
  // from calibration with the old values (seen_op).
  std::unordered_map<const void*, uint64_t> versions_at_convert_;
  // Every parameter and buffer storage, with its version when the current call before convert
  // began and when the last observed one ended, and whether its values varied while calibrating:
  // written by an observed call (a running state, a cache that forward writes), or between two (a
  // mask the application sets before each call). Calibration saw such a buffer change like any
  // activation, so it is not checked after convert. Other writes do not count: weights loaded
  // after prepare (before calibration, or with load_quant_state) are calibrated on what they hold.
  // Touched only by the thread holding the calibration guard (enter_unconverted / leave_unconverted).
  // Only calls that feed observers count (not prepare's example run, nor calls with observers
  // disabled). Also a hash of its values (every element any registration on it covers; named by
  // the largest registration, `name`) as the last observed call ended, kept in
  // ModelQuantState::calibrated_values while it does not vary (varied ones go to varied_values);
  // convert raises when the values differ by then (check_calibrated_values).
  struct StorageVersion {
    const Storage* storage;
    uint64_t at_call_start = 0, at_observed_end = 0;
    bool varies = false;
    std::string name;
    int64_t lo = 0, hi = 0;  // the element range the registrations cover
    size_t itemsize = 0;
    uint64_t hashed_version = ~uint64_t{0};  // version when hashed; none yet
    uint64_t hash = 0;
  };
  static uint64_t hash_values(const StorageVersion& v);
  void check_calibrated_values();
  std::vector<StorageVersion> storage_versions_;
  bool observed_once_ = false;  // an observed call ended
  // storage -> the module that owns the parameter directly (a layer's weight -> the layer).
  std::unordered_map<const void*, std::pair<const nn::Module*, std::string>> param_owners_;
  // A functional op running a layer's own computation on that layer's parameters outside the
  // layer's call (a built-in layer's forward called directly): raises when the layer's qconfig
  // differs from the one the op gets, warns once otherwise.
  void check_unregistered(const nn::Module& module) const;
  void check_parent_bypass(const std::string& fqn) const;
  void check_layer_bypass(const OpCall& call, const OpDef& def, const AutoQuantizationState& s,
                          const QConfigPtr& qconfig, size_t n_act);
  bool int8_outputs_ = false;  // the model's outputs stay int8 (default: dequantized to fp32)
  bool strict_paths_ = false;  // an uncalibrated path after convert raises
  ConvertedProgram program_;   // executors by SeenOpInfo::program_index, after convert
  // By program index: the parameters and buffers whose values the record's int8 kernel was built
  // from and calibrated downstream of (its weights, and those of the members of the chain it
  // runs: a folded batch norm's statistics), with their versions at convert; the ones whose
  // values varied while calibrating are left out. Written since, the record runs fp32 and the
  // model goes stale (seen_op). A version compare per entry: no lookup on the converted path.
  struct ParamVersion {
    const Storage* storage;
    uint64_t version;
  };
  std::vector<std::vector<ParamVersion>> kernel_params_;
  // The parameter of `list` written since convert (marking the model stale), or null.
  const Storage* written_kernel_param(const std::vector<ParamVersion>& list);
  std::atomic<int64_t> uncalibrated_{0};
  // Set (for good) when an op after convert reads a parameter or buffer written since convert
  // (written_since_convert): calibration no longer describes the model's values downstream of
  // it, so every later quantizeable op runs fp32 as an uncalibrated path (seen_op).
  std::atomic<bool> stale_{false};
  // The parameter or buffer storage `t` is on, when it was written since convert and its values
  // reach the ops after it as an activation; null otherwise. Also marks the model stale.
  const void* written_since_convert(const Tensor& t);
  // `reader` (an fp32 op, an untraced module) read parameter `written`, written since convert,
  // outside any int8 op: raises ControlFlowError under strict_paths, else warns once per parameter
  // (written_since_convert marked the model stale).
  void stale_read(const void* written, const std::string& reader);
  std::mutex warned_mu_;
  // Calls before convert (tracing, calibrating) record paths and feed observers without locks, so
  // they must not overlap: the thread whose call is in flight and how deep (its own nested calls).
  // Another thread's call raises UsageError instead of corrupting the records (a crash) or the
  // statistics (scales off in the last bits).
  void enter_unconverted();
  void leave_unconverted() noexcept;

 public:
  // Holds the model as a call before convert does, for an operation that rebuilds its records or
  // reads its observers (convert, load_quant_state, merge_calibration): UsageError ("`what`: X is
  // being called (on this thread or another); `advice`") while a call is in flight on any thread;
  // calls that start meanwhile raise. Undone by release_exclusive.
  void acquire_exclusive(const char* what, const char* advice);
  void release_exclusive() noexcept;
  // acquire_exclusive for as long as it lives.
  class ExclusiveHold {
   public:
    ExclusiveHold(QuantInterceptor& q, const char* what, const char* advice) : q_(q) {
      q_.acquire_exclusive(what, advice);
    }
    ~ExclusiveHold() { q_.release_exclusive(); }
    ExclusiveHold(const ExclusiveHold&) = delete;
    ExclusiveHold& operator=(const ExclusiveHold&) = delete;

   private:
    QuantInterceptor& q_;
  };

 private:
  struct UnconvertedHold {  // leaves on destruction unless owner is reset
    QuantInterceptor* owner = nullptr;
    ~UnconvertedHold() {
      if (owner != nullptr) owner->leave_unconverted();
    }
  };
  std::mutex unconverted_mu_;
  std::thread::id unconverted_thread_;
  int unconverted_depth_ = 0;
  std::set<std::pair<const void*, int>> warned_;  // (module state, op kind) said once
  std::atomic<const Probes*> probes_{nullptr};
  std::atomic<std::thread::id> probe_thread_{};
};

// Tags are portable: built from op names, fqns and parameter fingerprints (never addresses), so
// a record's identity is the same in every process and quant-state files store it as it is.
//
// The tag a tensor carries (Tensor::trace_id) for the enclosing module: where it was produced,
// seen from inside the module (records' producer tags). Op tags have bit 63 set, child-output
// tags bit 62 (and not 63), module-input tags are small.
int64_t module_input_tag(size_t k);
int64_t child_output_tag(uint64_t child_fqn_fingerprint, size_t j);
// name_fingerprint of the fqn of a prepared module (a module outside the prepared tree: its address).
uint64_t module_fingerprint(const nn::Module& module);

}  // namespace dbrq::tracer
