// The normalization family: batch_norm (inference, running statistics), layer_norm, group_norm and
// instance_norm. After a conv or linear, batch_norm is folded into their weights; on its own
// (pre-activation blocks: bn -> relu -> conv) it runs int8 as a per-channel multiply-add on codes,
// with a following relu fused. layer_norm, group_norm and instance_norm run int8 on an int8 input
// (QuantRole::kNormalize: statistics of the codes, PyTorch's quantized::layer_norm / group_norm /
// instance_norm arithmetic, kernels/int8_normalize.cc), with their own output observer.
#include "kernels/bn_fold.h"
#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

Tensor run_batch_norm(const OpCall& c) {
  return kernels::batch_norm(c.input(0), c.input(1), c.input(2), c.input(3), c.input(4), c.p<NormParams>().eps);
}

Tensor run_layer_norm(const OpCall& c) {
  const NormParams& np = c.p<NormParams>();
  return kernels::layer_norm(c.input(0), np.normalized_shape, c.input(1), c.input(2), np.eps);
}

DimVector same_sizes(const OpCall& c) {
  return DimVector(c.input(0).sizes().begin(), c.input(0).sizes().end());
}

// stats: running mean, running var, weight, bias as the op received them.
void fold_into_weights(const Tensor& w, const Tensor& b, absl::Span<const Tensor> stats, const void* params,
                       Tensor* w_out, Tensor* b_out) {
  kernels::BatchNormStats bn;
  bn.mean = stats.at(0);
  bn.var = stats.at(1);
  bn.weight = stats.size() > 2 ? stats[2] : Tensor();
  bn.bias = stats.size() > 3 ? stats[3] : Tensor();
  bn.eps = static_cast<const NormParams*>(params)->eps;
  kernels::fold_batch_norm(w, b, bn, w_out, b_out);
}

Tensor run_group_norm(const OpCall& c) {
  const GroupNormParams& p = c.p<GroupNormParams>();
  return kernels::group_norm("group_norm", c.input(0), p.num_groups, c.input(1), c.input(2), p.eps);
}

Tensor run_instance_norm(const OpCall& c) {
  const Tensor& x = c.input(0);
  const int64_t channels = x.defined() && x.dim() >= 2 ? x.size(1) : 1;
  return kernels::group_norm("instance_norm", x, channels, c.input(1), c.input(2), c.p<NormParams>().eps);
}

// stats: running mean, running var, weight, bias as the op received them.
std::shared_ptr<const kernels::QChannelAffine> int8_batch_norm(absl::Span<const Tensor> stats, const void* params,
                                                               const QuantParamsPtr& in, const QuantParamsPtr& out,
                                                               bool relu) {
  const Tensor none;
  auto at = [&](size_t i) -> const Tensor& { return i < stats.size() ? stats[i] : none; };
  const double eps = static_cast<const NormParams*>(params)->eps;
  return std::make_shared<const kernels::QChannelAffine>(
      kernels::batch_norm_affine(at(0), at(1), at(2), at(3), eps, in->scale(), out->scale()), in, out, relu);
}

Tensor int8_layer_norm(const Tensor& x, const OpCall& c, const QuantParamsPtr& out) {
  const NormParams& np = c.p<NormParams>();
  return kernels::qlayer_norm(x, np.normalized_shape, c.input(1), c.input(2), np.eps, out);
}

Tensor int8_group_norm(const Tensor& x, const OpCall& c, const QuantParamsPtr& out) {
  const GroupNormParams& p = c.p<GroupNormParams>();
  return kernels::qgroup_norm("group_norm", x, p.num_groups, c.input(1), c.input(2), p.eps, out);
}

Tensor int8_instance_norm(const Tensor& x, const OpCall& c, const QuantParamsPtr& out) {
  const int64_t channels = x.defined() && x.dim() >= 2 ? x.size(1) : 1;
  return kernels::qgroup_norm("instance_norm", x, channels, c.input(1), c.input(2), c.p<NormParams>().eps, out);
}

}  // namespace

Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps) {
  const Tensor* in[] = {&input, &weight, &bias};
  GroupNormParams p;
  p.num_groups = num_groups;
  p.eps = eps;
  return ops::call(OpKind::kGroupNorm, in, &p, run_group_norm);
}

Tensor instance_norm(const Tensor& input, const Tensor& weight, const Tensor& bias, double eps) {
  const Tensor* in[] = {&input, &weight, &bias};
  NormParams p;
  p.eps = eps;
  return ops::call(OpKind::kInstanceNorm, in, &p, run_instance_norm);
}

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, double eps) {
  const Tensor* in[] = {&input, &running_mean, &running_var, &weight, &bias};
  NormParams p;
  p.eps = eps;
  return ops::call(OpKind::kBatchNorm, in, &p, run_batch_norm);
}

Tensor layer_norm(const Tensor& input, std::vector<int64_t> normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  NormParams p;
  p.eps = eps;
  p.normalized_shape.assign(normalized_shape.begin(), normalized_shape.end());
  return ops::layer_norm(input, p, weight, bias);
}

namespace ops {

Tensor layer_norm(const Tensor& input, const NormParams& params, const Tensor& weight, const Tensor& bias) {
  const Tensor* in[] = {&input, &weight, &bias};
  return call(OpKind::kLayerNorm, in, &params, run_layer_norm);
}

void register_norm_ops(OpRegistry& r) {
  OpDef& bn = r.define(OpKind::kBatchNorm, "batch_norm").with_params<NormParams>();
  bn.run = run_batch_norm;
  bn.num_activation_inputs = 1;  // then running mean, running var, weight, bias
  bn.infer_sizes = same_sizes;
  bn.fold = fold_into_weights;
  bn.role = QuantRole::kChannelAffine;  // on its own; after a conv or linear it is folded instead
  bn.int8_affine = int8_batch_norm;
  bn.fusion_site = kAfterNorm;  // batch_norm -> relu, as PyTorch's quantized::batch_norm2d_relu

  OpDef& ln = r.define(OpKind::kLayerNorm, "layer_norm").with_params<NormParams>();
  ln.run = run_layer_norm;
  ln.num_activation_inputs = 1;  // then weight, bias
  ln.infer_sizes = same_sizes;
  ln.role = QuantRole::kNormalize;  // as FX 1.13's default (quantized::layer_norm)
  ln.int8_norm = int8_layer_norm;

  OpDef& gn = r.define(OpKind::kGroupNorm, "group_norm").with_params<GroupNormParams>();
  gn.run = run_group_norm;
  gn.num_activation_inputs = 1;  // then weight, bias
  gn.infer_sizes = same_sizes;
  gn.role = QuantRole::kNormalize;  // FX 1.13 keeps nn.GroupNorm fp32 (docs/int8_norms.md: why dbrq does not)
  gn.int8_norm = int8_group_norm;

  OpDef& in = r.define(OpKind::kInstanceNorm, "instance_norm").with_params<NormParams>();
  in.run = run_instance_norm;
  in.num_activation_inputs = 1;
  in.infer_sizes = same_sizes;
  in.role = QuantRole::kNormalize;  // as FX 1.13's default (quantized::instance_norm)
  in.int8_norm = int8_instance_norm;
}

}  // namespace ops
}  // namespace dbrq
