// Beyond the public API: the recorded program and model-wide state of a prepared model, for
// dbrq's own tests, fuzzers and tools (never for samples or user code, which use dbrq.h and its
// read-only view, tracer/introspection.h).
//
//   dbrq::ModelQuantState& m = dbrq::model_quant_state(*model);
//   for (dbrq::AutoQuantizationState* s : m.states()) std::cout << s->to_string();
#pragma once

#include "quant_state/auto_quant_state.h"
#include "quant_state/serialization.h"
#include "runtime/op_registry.h"
#include "runtime/module.h"

namespace dbrq {

// The model-wide state of a prepared model; throws UsageError when not prepared.
ModelQuantState& model_quant_state(const nn::Module& model);

}  // namespace dbrq
