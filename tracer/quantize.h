// The public entry points of define-by-run quantization.
//
//   dbrq::prepare(*model, {example}, dbrq::default_qconfig_mapping("onednn"));
//   for (const auto& batch : calibration) (*model)(batch);   // observers record ranges
//   dbrq::convert(*model);                                   // int8 from now on
//   dbrq::Tensor y = (*model)(x);
//
// prepare() works in place on the user's module tree and runs the model once on the example
// inputs to record its quantizeable ops (tracing changes no observer). Calibration is calling the
// model, so it fits anywhere, including inside an evaluation loop; disable_observers() lets other
// calls run without recording (and with observers off a prepared model computes exactly what the
// fp32 model does). convert() turns observer statistics into quantization parameters once,
// quantizes and prepacks weights once, and from then on every call runs int8 oneDNN primitives.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "quant_state/qconfig.h"
#include "quant_state/save_options.h"
#include "runtime/module.h"

namespace dbrq {

struct PrepareOptions {
  // Module classes (type names, e.g. "Attention") and module fqns whose whole subtree stays fp32
  // and is not traced.
  std::vector<std::string> non_traceable_module_classes;
  std::vector<std::string> non_traceable_module_names;
  // One fixed op sequence per module: every call must run the quantizeable ops its first call ran,
  // in that order, or ControlFlowError is thrown (naming the module, the op index, the recorded op
  // and the op seen). Default: branches, loops and early exits each add their path
  // (docs/control_flow.md).
  bool strict_control_flow = false;
  // An int8 linear whose output only fp32 ops read (through dropout / reshape-like ops too), e.g.
  // the projection before a transformer's fp32 residual add and layer norm, writes f32 straight
  // from oneDNN instead of u8 that is dequantized right after: one rounding less, no output
  // observer. Worth 1.6 dB on the BERT encoder (docs/encoder_accuracy.md). Off by default: PyTorch
  // FX quantizes such outputs, and the default stays bit-exact with it. A quant-state file loads
  // only into a model prepared with the same setting.
  bool float_outputs_for_float_readers = false;
};

struct ConvertOptions {
  // Keep int8 tensors at the model's outputs instead of dequantizing them.
  bool int8_outputs = false;
  // An op on a path calibration never ran raises ControlFlowError instead of running in fp32
  // (which is logged once per module and op kind, and counted: uncalibrated_ops()).
  bool strict_paths = false;
};

// Prepares `model` in place and runs it once on `example_inputs` (1 to 4 tensors passed to its
// forward). Throws UsageError when already prepared, ValueError for a mapping naming unknown
// modules; an exception from the example run leaves the model unprepared.
void prepare(nn::Module& model, const std::vector<Tensor>& example_inputs,
             QConfigMapping qconfig_mapping = default_qconfig_mapping("onednn"),
             BackendConfig backend_config = BackendConfig::onednn(), const PrepareOptions& options = {});
// The same, with a callable that runs the model on example data (any forward signature).
void prepare(nn::Module& model, const std::function<void()>& run_example, QConfigMapping qconfig_mapping,
             BackendConfig backend_config = BackendConfig::onednn(), const PrepareOptions& options = {});

// Converts a prepared, calibrated model in place. Throws UsageError when not prepared or already
// converted, NotCalibratedError (naming module, op and tensor) when an observer has no data.
void convert(nn::Module& model, const ConvertOptions& options = {});

// Stop / resume feeding observers on calls of a prepared model. UsageError after convert.
void disable_observers(nn::Module& model);
void enable_observers(nn::Module& model);

bool is_prepared(const nn::Module& model);
bool is_converted(const nn::Module& model);

// Folds the calibration of `replica` (a separately prepared copy of the same model, with the same
// qconfig, calibrated on another shard of the data, e.g. on another thread or process) into
// `model`: paths only the replica took are added to `model`'s program, and observers of the same
// tensors merged (min/max exactly, histograms by re-binning). Throws StateMismatchError when the
// two were prepared differently, UsageError after convert.
void merge_calibration(nn::Module& model, const nn::Module& replica);

// Writes the calibration of a prepared (calibrated or converted) model as a versioned JSON file
// (see quant_state/serialization.h). Throws IOError when the file cannot be written.
void save_quant_state(const nn::Module& model, const std::string& path, const SaveQuantStateOptions& options = {});
// Restores a saved calibration into a freshly prepared model, so convert() needs no data.
// StateMismatchError names the first module / op that differs; FileFormatError for a malformed
// file; UsageError after convert. The model is unchanged when loading fails.
void load_quant_state(nn::Module& model, const std::string& path);

// Every module with state, in fqn order, printed as AutoQuantizationState blocks.
std::string quant_state_to_string(const nn::Module& model);

}  // namespace dbrq
