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

#include <functional>
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
  explicit NonTraceableInfo(std::string fqn) : fqn_(std::move(fqn)) {}
  const std::string& fqn() const { return fqn_; }

 private:
  std::string fqn_;
};

// One module call on the thread's stack.
struct Frame {
  nn::Module* module = nullptr;
  AutoQuantizationState* state = nullptr;   // non-leaf module with state
  const LeafQuantInfo* leaf = nullptr;      // layer
  int cursor = 0;                           // next seen-op index in `state`
  bool recording = false;                   // tracing this module's first call
  bool fp32_region = false;                 // non-traceable: interception suspended inside
  Interceptor* saved = nullptr;             // the interceptor to restore after an fp32 region
  const void* owner = nullptr;              // the QuantInterceptor that pushed the frame
  bool snapshot = false;                    // saved the observers' statistics (outermost calibrating call)
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
  void on_module_enter(nn::Module& module, absl::Span<Tensor* const> inputs) override;
  void on_module_exit(nn::Module& module, absl::Span<Tensor* const> outputs) override;
  void on_module_unwind(nn::Module& module) noexcept override;
  void on_module_error(nn::Module& module, const Error& error) override;

  ModelQuantState& model() { return *model_; }

  // Converts the model (see convert_model) and switches it to the converted phase.
  void convert(bool int8_outputs);

  // Sees every seen op's result after convert (numeric comparison). Not for concurrent calls.
  using Probe = std::function<void(const AutoQuantizationState&, const SeenOpInfo&, const Tensor&)>;
  void set_probe(Probe probe) { probe_ = std::move(probe); }

 private:
  Tensor trace_op(const OpCall& call, Frame* owner, Frame* top);
  Tensor observe_op(const OpCall& call, Frame* owner, Frame* top);
  Tensor convert_op(const OpCall& call, Frame* owner, Frame* top);
  void assign_ids(const OpCall& call);
  std::string weight_fqn(const Tensor& t) const;

  std::shared_ptr<ModelQuantState> model_;
  std::unordered_map<const void*, std::string> param_names_;  // storage -> parameter fqn
  bool int8_outputs_ = false;  // the model's outputs stay int8 (default: dequantized to fp32)
  ConvertedProgram program_;   // executors by SeenOpInfo::program_index, after convert
  Probe probe_;
};

}  // namespace dbrq::tracer
