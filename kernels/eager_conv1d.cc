// 1-D convolution and pooling as their 2-D kernels with H = 1: views that add or drop the unit
// height without copying (a channels-last 3-D tensor [N, C, L] with strides (L*C, 1, C) is the
// NHWC [N, C, 1, L] the 2-D kernels produce and prefer).
#include "core/op_shapes.h"
#include "kernels/eager.h"

namespace dbrq::kernels {

Tensor unit_height_view(const Tensor& x) {
  DBRQ_CHECK(x.dim() == 3, "unit_height_view needs a 3-D tensor");
  const int64_t sizes[] = {x.size(0), x.size(1), 1, x.size(2)};
  const int64_t strides[] = {x.stride(0), x.stride(1), x.stride(2) * x.size(2), x.stride(2)};
  return x.raw_as_strided(sizes, strides, x.storage_offset());
}

Tensor drop_unit_height(const Tensor& y) {
  DBRQ_CHECK(y.dim() == 4 && y.size(2) == 1, "drop_unit_height needs a [N, C, 1, L] tensor");
  const int64_t sizes[] = {y.size(0), y.size(1), y.size(3)};
  const int64_t strides[] = {y.stride(0), y.stride(1), y.stride(3)};
  return y.raw_as_strided(sizes, strides, y.storage_offset());
}

Conv2dParams conv1d_as_conv2d(const Conv1dParams& p) {
  Conv2dParams q;
  q.stride = {1, p.stride};
  q.padding = {0, p.padding};
  q.dilation = {1, p.dilation};
  q.groups = p.groups;
  return q;
}

Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv1dParams& p, const PostOps& post) {
  conv1d_geometry(x, w, b, p);  // 1-D messages before the 2-D kernel sees anything
  check_float("conv1d", "input", x);
  check_float("conv1d", "weight", w);
  if (b.defined()) check_float("conv1d", "bias", b);
  return drop_unit_height(conv2d(unit_height_view(x), unit_height_view(w), b, conv1d_as_conv2d(p), post));
}

// PyTorch runs conv1d as a conv2d over [N, C, 1, L] (view1d_as_2d), so its order is conv2d's.
Tensor conv1d_torch_order(const Tensor& x, const Tensor& w, const Tensor& b, const Conv1dParams& p) {
  conv1d_geometry(x, w, b, p);
  check_float("conv1d", "input", x);
  check_float("conv1d", "weight", w);
  if (b.defined()) check_float("conv1d", "bias", b);
  return drop_unit_height(conv2d_torch_order(unit_height_view(x), unit_height_view(w), b, conv1d_as_conv2d(p)));
}

}  // namespace dbrq::kernels
