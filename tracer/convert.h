// convert(): from calibrated observers to int8 executors for every seen op.
//
// Runs once. In execution order it computes each int8 tensor's quantization parameters (observer
// slots, derived parameters of scalar ops, fixed parameters), quantizes and prepacks weights (with
// batch norm folded into the weighted op before it), and gives each seen op a ConvertedOp that at
// inference does only O(1) bookkeeping before running cached oneDNN primitives. What each op needs
// comes from its OpDef: nothing here names an op.
#pragma once

#include <memory>
#include <vector>

#include "quant_state/auto_quant_state.h"
#include "tracer/executors.h"

namespace dbrq::tracer {

// The executors of a converted model, indexed by SeenOpInfo::program_index.
using ConvertedProgram = std::vector<std::unique_ptr<ConvertedOp>>;

// Builds every seen op's executor and records what it chose in SeenOpInfo::executor. On failure
// (e.g. NotCalibratedError) the model state is left as it was and nothing is returned.
ConvertedProgram convert_model(ModelQuantState& model);

}  // namespace dbrq::tracer
