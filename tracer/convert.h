// convert(): from calibrated observers to int8 executors for every seen op.
//
// Runs once. In execution order it computes each int8 tensor's quantization parameters (observer
// slots, derived parameters of scalar ops, fixed parameters), quantizes and prepacks weights (with
// batch norm folded into conv / linear), and gives each seen op a ConvertedOp that at inference
// does only O(1) bookkeeping before running cached oneDNN primitives.
#pragma once

#include "quant_state/auto_quant_state.h"

namespace dbrq::tracer {

void convert_model(ModelQuantState& model);

}  // namespace dbrq::tracer
