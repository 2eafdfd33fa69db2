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
// The document (format "dbrq.quant_state", version 1) holds, per module with state (by fqn), every
// seen op (index, op kind, fqn, role, fusion, input/output tensor ids and inference dtypes, the
// observer slots it feeds, its qconfig) and the non-quantizeable ops; then every observer slot
// (spec, owner, tensor id, scale and zero point, and optionally the raw statistics so calibration
// can resume). Loading checks the structure against the freshly traced model and fails with a
// StateMismatchError naming the first mismatching module and op; malformed JSON raises
// FileFormatError and never leaves the model half-loaded.
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

// Checks a document against a model's state without changing anything (same errors as loading).
void check_quant_state(ModelQuantState& model, const std::string& model_type, const std::string& json,
                       const std::string& source = "<string>");

}  // namespace dbrq
