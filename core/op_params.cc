#include "core/op_params.h"

namespace dbrq {

bool operator==(const Conv2dParams& a, const Conv2dParams& b) {
  return a.stride == b.stride && a.padding == b.padding && a.dilation == b.dilation && a.groups == b.groups;
}
bool operator==(const Pool2dParams& a, const Pool2dParams& b) {
  return a.kernel_size == b.kernel_size && a.stride == b.stride && a.padding == b.padding &&
         a.dilation == b.dilation && a.ceil_mode == b.ceil_mode && a.count_include_pad == b.count_include_pad;
}
bool operator==(const AdaptivePool2dParams& a, const AdaptivePool2dParams& b) {
  return a.output_size == b.output_size;
}
bool operator==(const NormParams& a, const NormParams& b) {
  return a.eps == b.eps && a.normalized_shape == b.normalized_shape;
}
bool operator==(const DimParams& a, const DimParams& b) {
  return a.dims == b.dims && a.keepdim == b.keepdim && a.unbiased == b.unbiased;
}
bool operator==(const ShapeParams& a, const ShapeParams& b) {
  return a.sizes == b.sizes && a.start == b.start && a.length == b.length;
}
bool operator==(const ActivationParams& a, const ActivationParams& b) {
  return a.alpha == b.alpha && a.beta == b.beta && a.approximate_tanh == b.approximate_tanh;
}
bool operator==(const DropoutParams& a, const DropoutParams& b) { return a.p == b.p && a.training == b.training; }
bool operator==(const ConvertParams& a, const ConvertParams& b) {
  return a.dtype == b.dtype && a.memory_format == b.memory_format && a.qparams == b.qparams && a.value == b.value;
}

}  // namespace dbrq
