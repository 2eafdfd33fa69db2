#include "tracer/convert.h"

namespace dbrq::tracer {

void convert_model(ModelQuantState& model) { DBRQ_THROW(UsageError, "convert: not built yet"); }

}  // namespace dbrq::tracer
