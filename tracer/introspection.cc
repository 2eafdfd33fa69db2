#include "tracer/introspection.h"

#include "tracer/interceptor.h"

namespace dbrq {

std::vector<QuantizedOpInfo> quantized_ops(const nn::Module& model) {
  ModelQuantState& m = tracer::QuantInterceptor::of(model, "quantized_ops").model();
  std::vector<QuantizedOpInfo> out;
  for (const auto& [state, index] : m.execution_order()) {
    const SeenOpInfo& op = state->seen_ops()[index];
    QuantizedOpInfo i;
    i.module = state->fqn();
    i.module_type = state->type_name();
    i.index = op.index;
    i.kind = op.kind;
    i.op = op.display_kind();
    i.fqn = op.fqn;
    i.order = op.order;
    i.role = quant_role_name(op.role);
    if (op.fusion.fused() && op.fusion.position > 0) i.fused_into = op.fusion.base;
    i.dynamic = op.qconfig != nullptr && op.qconfig->is_dynamic();
    for (const QTensorInfo& t : op.inputs) i.input_dtypes.push_back(t.inf_dtype);
    if (!op.outputs.empty()) i.output_dtype = op.outputs[0].inf_dtype;
    if (op.executor != nullptr) {
      i.input_qparams = op.executor->input_qparams;
      i.output_qparams = op.executor->output_qparams;
      i.weight_qparams = op.executor->weight_qparams;
      i.executor = op.executor->description;
    }
    out.push_back(std::move(i));
  }
  return out;
}

int num_observers(const nn::Module& model) {
  ModelQuantState& m = tracer::QuantInterceptor::of(model, "num_observers").model();
  int n = 0;
  for (size_t i = 0; i < m.num_slots(); ++i) n += m.find(static_cast<int>(i)) == static_cast<int>(i);
  return n;
}

int64_t uncalibrated_ops(const nn::Module& model) {
  return tracer::QuantInterceptor::of(model, "uncalibrated_ops").uncalibrated_ops();
}

}  // namespace dbrq
