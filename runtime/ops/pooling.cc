// The pooling family: max_pool2d, avg_pool2d, adaptive_avg_pool2d, and their 1-D forms (the 2-D
// kernels on [N, C, 1, L] views). In int8 all of them keep their
// input's quantization parameters: max pooling on codes is exact (its eager kernel takes u8);
// average pooling rounds the mean of codes as PyTorch's quantized kernels do.
#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

std::array<int64_t, 2> default_stride(const std::vector<int64_t>& stride, std::array<int64_t, 2> kernel,
                                      const char* op) {
  if (stride.empty()) return kernel;
  DBRQ_ENSURE(stride.size() == 2, ValueError, op, ": stride must have 2 values or none, got ",
              shape_to_string(stride));
  return {stride[0], stride[1]};
}

Tensor run_max_pool2d(const OpCall& c) { return kernels::max_pool2d(c.input(0), c.p<Pool2dParams>()); }
Tensor run_avg_pool2d(const OpCall& c) { return kernels::avg_pool2d(c.input(0), c.p<Pool2dParams>()); }
Tensor run_adaptive_avg_pool2d(const OpCall& c) {
  return kernels::adaptive_avg_pool2d(c.input(0), c.p<AdaptivePool2dParams>().output_size);
}

template <const char* kName>
DimVector pool2d_sizes(const OpCall& c) {
  const PoolGeometry g = pool2d_geometry(kName, c.input(0), c.p<Pool2dParams>());
  return {g.n, g.c, g.oh, g.ow};
}
constexpr char kMaxPool[] = "max_pool2d";
constexpr char kAvgPool[] = "avg_pool2d";

DimVector adaptive_sizes(const OpCall& c) {
  const Tensor& x = c.input(0);
  const auto& out = c.p<AdaptivePool2dParams>().output_size;
  DBRQ_ENSURE(x.dim() == 4, ShapeError, "adaptive_avg_pool2d: input must be 4-D, got ", x.shape_string());
  return {x.size(0), x.size(1), out[0], out[1]};
}

Tensor int8_avg_pool2d(const Tensor& x, const void* p) {
  return kernels::qavg_pool2d(x, *static_cast<const Pool2dParams*>(p));
}
Tensor int8_adaptive_avg_pool2d(const Tensor& x, const void* p) {
  return kernels::qadaptive_avg_pool2d(x, static_cast<const AdaptivePool2dParams*>(p)->output_size);
}

// 1-D pooling: the 2-D kernels on [N, C, 1, L] views.
Tensor run_max_pool1d(const OpCall& c) {
  return kernels::drop_unit_height(kernels::max_pool2d(kernels::unit_height_view(c.input(0)), c.p<Pool2dParams>()));
}
Tensor run_avg_pool1d(const OpCall& c) {
  return kernels::drop_unit_height(kernels::avg_pool2d(kernels::unit_height_view(c.input(0)), c.p<Pool2dParams>()));
}
Tensor run_adaptive_avg_pool1d(const OpCall& c) {
  return kernels::drop_unit_height(kernels::adaptive_avg_pool2d(kernels::unit_height_view(c.input(0)),
                                                                c.p<AdaptivePool2dParams>().output_size));
}
template <const char* kName>
DimVector pool1d_sizes(const OpCall& c) {
  const Tensor& x = c.input(0);
  DBRQ_ENSURE(x.dim() == 3, ShapeError, kName, ": input must be 3-D (N, C, L), got sizes ", x.shape_string());
  const PoolGeometry g = pool2d_geometry(kName, kernels::unit_height_view(x), c.p<Pool2dParams>());
  return {g.n, g.c, g.ow};
}
constexpr char kMaxPool1d[] = "max_pool1d";
constexpr char kAvgPool1d[] = "avg_pool1d";
DimVector adaptive1d_sizes(const OpCall& c) {
  const Tensor& x = c.input(0);
  DBRQ_ENSURE(x.dim() == 3, ShapeError, "adaptive_avg_pool1d: input must be 3-D (N, C, L), got sizes ",
              x.shape_string());
  return {x.size(0), x.size(1), c.p<AdaptivePool2dParams>().output_size[1]};
}
Tensor int8_avg_pool1d(const Tensor& x, const void* p) {
  return kernels::drop_unit_height(
      kernels::qavg_pool2d(kernels::unit_height_view(x), *static_cast<const Pool2dParams*>(p)));
}
Tensor int8_adaptive_avg_pool1d(const Tensor& x, const void* p) {
  return kernels::drop_unit_height(kernels::qadaptive_avg_pool2d(
      kernels::unit_height_view(x), static_cast<const AdaptivePool2dParams*>(p)->output_size));
}

}  // namespace

Tensor max_pool1d(const Tensor& x, int64_t kernel_size, std::optional<int64_t> stride, int64_t padding,
                  int64_t dilation, bool ceil_mode) {
  const Pool2dParams p =
      pool1d_params("max_pool1d", x, kernel_size, stride.value_or(kernel_size), padding, dilation, ceil_mode, true);
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kMaxPool1d, in, &p, run_max_pool1d);
}

Tensor avg_pool1d(const Tensor& x, int64_t kernel_size, std::optional<int64_t> stride, int64_t padding,
                  bool ceil_mode, bool count_include_pad) {
  const Pool2dParams p = pool1d_params("avg_pool1d", x, kernel_size, stride.value_or(kernel_size), padding, 1,
                                       ceil_mode, count_include_pad);
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kAvgPool1d, in, &p, run_avg_pool1d);
}

Tensor adaptive_avg_pool1d(const Tensor& x, int64_t output_size) {
  check_defined("adaptive_avg_pool1d", "input", x);
  DBRQ_ENSURE(x.dim() == 3, ShapeError, "adaptive_avg_pool1d: input must be 3-D (N, C, L), got sizes ",
              x.shape_string());
  DBRQ_ENSURE(output_size >= 1, ValueError, "adaptive_avg_pool1d: output_size must be >= 1, got ", output_size);
  AdaptivePool2dParams p;
  p.output_size = {1, output_size};
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kAdaptiveAvgPool1d, in, &p, run_adaptive_avg_pool1d);
}

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel_size, std::vector<int64_t> stride,
                  std::array<int64_t, 2> padding, std::array<int64_t, 2> dilation, bool ceil_mode) {
  Pool2dParams p;
  p.kernel_size = kernel_size;
  p.stride = default_stride(stride, kernel_size, "max_pool2d");
  p.padding = padding;
  p.dilation = dilation;
  p.ceil_mode = ceil_mode;
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kMaxPool2d, in, &p, run_max_pool2d);
}

Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel_size, std::vector<int64_t> stride,
                  std::array<int64_t, 2> padding, bool ceil_mode, bool count_include_pad) {
  Pool2dParams p;
  p.kernel_size = kernel_size;
  p.stride = default_stride(stride, kernel_size, "avg_pool2d");
  p.padding = padding;
  p.ceil_mode = ceil_mode;
  p.count_include_pad = count_include_pad;
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kAvgPool2d, in, &p, run_avg_pool2d);
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size) {
  AdaptivePool2dParams p;
  p.output_size = output_size;
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kAdaptiveAvgPool2d, in, &p, run_adaptive_avg_pool2d);
}

namespace ops {

Tensor max_pool2d(const Tensor& x, const Pool2dParams& params) {
  const Tensor* in[] = {&x};
  return call(OpKind::kMaxPool2d, in, &params, run_max_pool2d);
}

Tensor avg_pool2d(const Tensor& x, const Pool2dParams& params) {
  const Tensor* in[] = {&x};
  return call(OpKind::kAvgPool2d, in, &params, run_avg_pool2d);
}

void register_pooling_ops(OpRegistry& r) {
  OpDef& mx = r.define(OpKind::kMaxPool2d, "max_pool2d").with_params<Pool2dParams>();
  mx.run = run_max_pool2d;
  mx.infer_sizes = pool2d_sizes<kMaxPool>;
  mx.role = QuantRole::kShare;
  mx.params_in_identity = false;  // int8 through its eager kernel, with the call's parameters

  OpDef& avg = r.define(OpKind::kAvgPool2d, "avg_pool2d").with_params<Pool2dParams>();
  avg.run = run_avg_pool2d;
  avg.infer_sizes = pool2d_sizes<kAvgPool>;
  avg.role = QuantRole::kShare;
  avg.int8_share = int8_avg_pool2d;

  OpDef& ad = r.define(OpKind::kAdaptiveAvgPool2d, "adaptive_avg_pool2d").with_params<AdaptivePool2dParams>();
  ad.run = run_adaptive_avg_pool2d;
  ad.infer_sizes = adaptive_sizes;
  ad.role = QuantRole::kShare;
  ad.int8_share = int8_adaptive_avg_pool2d;

  // 1-D pooling: the 2-D kernels with H = 1, int8 included.
  OpDef& mx1 = r.define(OpKind::kMaxPool1d, "max_pool1d").with_params<Pool2dParams>();
  mx1.run = run_max_pool1d;
  mx1.infer_sizes = pool1d_sizes<kMaxPool1d>;
  mx1.role = QuantRole::kShare;
  mx1.params_in_identity = false;

  OpDef& avg1 = r.define(OpKind::kAvgPool1d, "avg_pool1d").with_params<Pool2dParams>();
  avg1.run = run_avg_pool1d;
  avg1.infer_sizes = pool1d_sizes<kAvgPool1d>;
  avg1.role = QuantRole::kShare;
  avg1.int8_share = int8_avg_pool1d;

  OpDef& ad1 = r.define(OpKind::kAdaptiveAvgPool1d, "adaptive_avg_pool1d").with_params<AdaptivePool2dParams>();
  ad1.run = run_adaptive_avg_pool1d;
  ad1.infer_sizes = adaptive1d_sizes;
  ad1.role = QuantRole::kShare;
  ad1.int8_share = int8_adaptive_avg_pool1d;
}

}  // namespace ops
}  // namespace dbrq
