// The conv family: conv2d, conv_transpose2d, conv1d. conv2d's int8 form is oneDNN's u8 x s8 convolution
// (kernels::QConv2d), which also fuses batch norm (folded), an activation and a residual add (sum
// post-op). conv_transpose2d's is oneDNN's u8 x s8 deconvolution (kernels::QConvTranspose2d), with
// folded batch norm and activations; conv1d's is QConv2d with H = 1 (kernels::QConv1d).
#include "core/op_shapes.h"
#include "kernels/bf16.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

Tensor run_conv2d(const OpCall& c) {
  return kernels::conv2d(c.input(0), c.input(1), c.input(2), c.p<Conv2dParams>());
}
Tensor run_conv2d_bf16(const OpCall& c) {
  return kernels::conv2d_bf16(c.input(0), c.input(1), c.input(2), c.p<Conv2dParams>());
}

Tensor calibrate_conv2d(const OpCall& c) {
  return kernels::conv2d_torch_order(c.input(0), c.input(1), c.input(2), c.p<Conv2dParams>());
}

DimVector conv2d_sizes(const OpCall& c) {
  const ConvGeometry g = conv2d_geometry(c.input(0), c.input(1), c.input(2), c.p<Conv2dParams>());
  return {g.n, g.k, g.oh, g.ow};
}

std::unique_ptr<kernels::QWeighted> make_qconv2d(kernels::QWeightedOptions options, const void* params) {
  kernels::QConvOptions o;
  static_cast<kernels::QWeightedOptions&>(o) = std::move(options);
  o.params = *static_cast<const Conv2dParams*>(params);
  return std::make_unique<kernels::QConv2d>(std::move(o));
}

Tensor run_conv_transpose2d(const OpCall& c) {
  return kernels::conv_transpose2d(c.input(0), c.input(1), c.input(2), c.p<ConvTranspose2dParams>());
}

DimVector conv_transpose2d_sizes(const OpCall& c) {
  const ConvGeometry g = conv_transpose2d_geometry(c.input(0), c.input(1), c.input(2), c.p<ConvTranspose2dParams>());
  return {g.n, g.k, g.oh, g.ow};
}

std::unique_ptr<kernels::QWeighted> make_qconv_transpose2d(kernels::QWeightedOptions options, const void* params) {
  kernels::QConvTranspose2dOptions o;
  static_cast<kernels::QWeightedOptions&>(o) = std::move(options);
  o.params = *static_cast<const ConvTranspose2dParams*>(params);
  return std::make_unique<kernels::QConvTranspose2d>(std::move(o));
}

Tensor conv_transpose2d_weight_output_major(const Tensor& w, const void* params) {
  return kernels::deconv_weight_output_major(w, static_cast<const ConvTranspose2dParams*>(params)->groups);
}

Tensor run_conv1d(const OpCall& c) {
  return kernels::conv1d(c.input(0), c.input(1), c.input(2), c.p<Conv1dParams>());
}

Tensor calibrate_conv1d(const OpCall& c) {
  return kernels::conv1d_torch_order(c.input(0), c.input(1), c.input(2), c.p<Conv1dParams>());
}

DimVector conv1d_sizes(const OpCall& c) {
  const ConvGeometry g = conv1d_geometry(c.input(0), c.input(1), c.input(2), c.p<Conv1dParams>());
  return {g.n, g.k, g.ow};
}

std::unique_ptr<kernels::QWeighted> make_qconv1d(kernels::QWeightedOptions options, const void* params) {
  kernels::QConv1dOptions o;
  static_cast<kernels::QWeightedOptions&>(o) = std::move(options);
  o.params = *static_cast<const Conv1dParams*>(params);
  return std::make_unique<kernels::QConv1d>(std::move(o));
}

}  // namespace

Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv1dParams& params) {
  const Tensor* in[] = {&input, &weight, &bias};
  return ops::call(OpKind::kConv1d, in, &params, run_conv1d);
}

Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                        const ConvTranspose2dParams& params) {
  const Tensor* in[] = {&input, &weight, &bias};
  return ops::call(OpKind::kConvTranspose2d, in, &params, run_conv_transpose2d);
}

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) {
  const Tensor* in[] = {&input, &weight, &bias};
  return ops::call(OpKind::kConv2d, in, &params, run_conv2d);
}

namespace ops {

void register_conv_ops(OpRegistry& r) {
  OpDef& d = r.define(OpKind::kConv2d, "conv2d").with_params<Conv2dParams>();
  d.run = run_conv2d;
  d.bf16_run = run_conv2d_bf16;
  d.calibrate_run = calibrate_conv2d;
  d.num_activation_inputs = 1;  // then weight, bias
  d.infer_sizes = conv2d_sizes;
  d.role = QuantRole::kWeighted;
  d.fusion_site = kAfterConv;
  d.int8_weighted = make_qconv2d;
  d.int8_input_format = MemoryFormat::kChannelsLast;  // oneDNN's int8 convolutions want NHWC
  d.supports_residual = true;

  OpDef& t = r.define(OpKind::kConvTranspose2d, "conv_transpose2d").with_params<ConvTranspose2dParams>();
  t.run = run_conv_transpose2d;
  t.num_activation_inputs = 1;  // then weight, bias
  t.infer_sizes = conv_transpose2d_sizes;
  t.role = QuantRole::kWeighted;
  t.fusion_site = kAfterConv;  // conv_transpose2d (+ batch_norm) (+ relu ...) is one int8 primitive
  t.int8_weighted = make_qconv_transpose2d;
  t.int8_weight_layout = conv_transpose2d_weight_output_major;  // BN folds and scales per output channel
  // [g][i][j] -> [g][j][i] per group is its own inverse.
  t.weight_from_int8_layout = conv_transpose2d_weight_output_major;
  t.int8_input_format = MemoryFormat::kChannelsLast;

  // conv1d: conv2d with H = 1 in both forms (conv1d (+ batch_norm) (+ relu ...) is one primitive).
  OpDef& c1 = r.define(OpKind::kConv1d, "conv1d").with_params<Conv1dParams>();
  c1.run = run_conv1d;
  c1.calibrate_run = calibrate_conv1d;
  c1.num_activation_inputs = 1;
  c1.infer_sizes = conv1d_sizes;
  c1.role = QuantRole::kWeighted;
  c1.fusion_site = kAfterConv;
  c1.int8_weighted = make_qconv1d;
}

}  // namespace ops
}  // namespace dbrq
