// The matmul family: linear (weights) and matmul (two activations). linear runs in int8 as oneDNN
// matmul (kernels::QLinear; static, or dynamic with per-call input parameters); matmul of two
// activations as kernels::QMatmul (built by the tracer for QuantRole::kMatmul).
#include "core/op_shapes.h"
#include "kernels/bf16.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

Tensor run_linear(const OpCall& c) { return kernels::linear(c.input(0), c.input(1), c.input(2)); }
Tensor calibrate_linear(const OpCall& c) {
  return kernels::linear_torch_order(c.input(0), c.input(1), c.input(2));
}
Tensor run_matmul(const OpCall& c) { return kernels::matmul(c.input(0), c.input(1)); }
Tensor run_linear_bf16(const OpCall& c) { return kernels::linear_bf16(c.input(0), c.input(1), c.input(2)); }
Tensor run_matmul_bf16(const OpCall& c) { return kernels::matmul_bf16(c.input(0), c.input(1)); }

DimVector linear_sizes(const OpCall& c) { return linear_output_sizes(c.input(0), c.input(1), c.input(2)); }
DimVector matmul_sizes(const OpCall& c) {
  return matmul_shapes(c.input(0).sizes(), c.input(1).sizes()).out;
}

std::unique_ptr<kernels::QWeighted> make_qlinear(kernels::QWeightedOptions options, const void*) {
  return std::make_unique<kernels::QLinear>(std::move(options));
}

}  // namespace

Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias) {
  const Tensor* in[] = {&input, &weight, &bias};
  return ops::call(OpKind::kLinear, in, nullptr, run_linear);
}

Tensor matmul(const Tensor& input, const Tensor& other) {
  const Tensor* in[] = {&input, &other};
  return ops::call(OpKind::kMatmul, in, nullptr, run_matmul);
}

Tensor Tensor::matmul(const Tensor& other) const { return ::dbrq::matmul(*this, other); }

namespace ops {

void register_matmul_ops(OpRegistry& r) {
  OpDef& lin = r.define(OpKind::kLinear, "linear");
  lin.run = run_linear;
  lin.bf16_run = run_linear_bf16;
  lin.calibrate_run = calibrate_linear;
  lin.num_activation_inputs = 1;  // then weight, bias
  lin.infer_sizes = linear_sizes;
  lin.role = QuantRole::kWeighted;
  lin.dynamic = true;
  lin.layer = "Linear";
  lin.fusion_site = kAfterLinear;
  lin.int8_weighted = make_qlinear;

  OpDef& mm = r.define(OpKind::kMatmul, "matmul");
  mm.run = run_matmul;
  mm.bf16_run = run_matmul_bf16;
  mm.infer_sizes = matmul_sizes;
  mm.role = QuantRole::kMatmul;
  mm.dynamic = true;
}

}  // namespace ops
}  // namespace dbrq
