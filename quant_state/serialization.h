// Saving and restoring calibration: the quant-state JSON document.
//
//   // after calibration:
//   dbrq::save_quant_state(*model, "resnet18.qstate.json");
//   // at deployment, in another process:
//   auto model = build_resnet18();  model->load_state_dict(weights);  model->eval();
//   dbrq::prepare(*model, {example}, dbrq::default_qconfig_mapping("onednn"));
//   dbrq::load_quant_state(*model, "resnet18.qstate.json");
//   dbrq::convert(*model);          // no calibration data needed; bit-identical to the original
//
// The document (format "dbrq.quant_state", version 3) holds the recorded program: per module with
// state (by fqn), every record (op kind, layer or module fqn, its portable identity: tag, producer
// tags, parameters, scalar, weights by fqn; where each input came from: another record or a named
// fp32 source; what the analysis made of it: role, fusion, observers), the ops left in fp32, and
// the paths the module's calls took (which records, how many calls). Then every observer slot:
// the record and input it belongs to, its root (sharing), spec, scale and zero point, and
// optionally the raw statistics so calibration can resume; with them also "inner_outputs", the
// observed outputs of records inside fused chains (ModelQuantState::inner_output_observer), so a
// merge or a later path that breaks such a chain starts from every call. "calibrated_values" holds
// a hash of the values calibration saw of each parameter and buffer that did not vary while
// calibrating (ModelQuantState::calibrated_values): convert raises UsageError when the loaded
// weights are not those (files without it, older ones, are not checked); a name the model does
// not have is a StateMismatchError, a malformed hash a FileFormatError. "varied_values" names the
// ones that varied while calibrating (ModelQuantState::varied_values): neither convert nor the
// converted model checks those. Each record carries a check of its
// content (see reseal_quant_state).
//
// Loading rebuilds the program from the file (so paths the example run did not take are there),
// after checking it completely: against the model's modules, layers, weights and qconfigs, that it
// covers every op the freshly prepared model ran (else "the file is missing a path"), and that this
// dbrq's analysis of its records gives the file's fusions and observers (on a scratch copy). Any
// difference is a StateMismatchError naming the module and op; malformed JSON is a FileFormatError;
// nothing is changed unless everything checks out.
#pragma once

#include <string>

#include "quant_state/auto_quant_state.h"
#include "quant_state/save_options.h"

namespace dbrq {

// The document for a calibrated (or converted) model's state.
std::string quant_state_to_json(const ModelQuantState& model, const std::string& model_type,
                                const SaveQuantStateOptions& options = {});
// Restores a document into a freshly prepared model's state. `source` names it in errors.
void quant_state_from_json(ModelQuantState& model, const std::string& model_type, const std::string& json,
                           const std::string& source = "<string>");

// Merges another replica's document (with statistics) into a calibrating model: records of paths
// only the replica took are added, observers of the same tensors merged (merge_calibration). The
// document is checked like a file (except that it need not cover `into`'s paths); `replica`, when
// given, supplies weights computed at run time, which no document holds.
void merge_quant_state(ModelQuantState& into, const std::string& model_type, const std::string& replica_json,
                       const std::string& source, ModelQuantState* replica = nullptr);

// Each record carries a check of its content (an edited or corrupt record is refused on load).
// For tools and tests that edit a document deliberately: the same document with every record's
// check recomputed. Throws FileFormatError for text that is not a quant-state document.
std::string reseal_quant_state(const std::string& json);

// Checks a document against a model's state without changing anything (same errors as loading).
void check_quant_state(ModelQuantState& model, const std::string& model_type, const std::string& json,
                       const std::string& source = "<string>");

}  // namespace dbrq
