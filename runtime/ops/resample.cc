// The resampling family: interpolate (nearest, bilinear). In int8 it keeps its input's
// quantization parameters, as PyTorch's quantized upsample_nearest2d / upsample_bilinear2d do:
// nearest copies codes, bilinear interpolates codes (kernels/eager_resample.cc).
#include <cmath>

#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

Tensor run_interpolate(const OpCall& c) {
  const InterpolateParams& p = c.p<InterpolateParams>();
  if (p.mode == 0) return kernels::upsample_nearest2d(c.input(0), p.size[0], p.size[1], p.scale_h, p.scale_w);
  return kernels::upsample_bilinear2d(c.input(0), p.size[0], p.size[1], p.align_corners, p.scale_h, p.scale_w);
}

DimVector interpolate_sizes(const OpCall& c) {
  const Tensor& x = c.input(0);
  const InterpolateParams& p = c.p<InterpolateParams>();
  DBRQ_ENSURE(x.dim() == 4, ShapeError, "interpolate: input must be 4-D (N, C, H, W), got sizes ", x.shape_string());
  return {x.size(0), x.size(1), p.size[0], p.size[1]};
}

}  // namespace

Tensor interpolate(const Tensor& x, std::optional<std::array<int64_t, 2>> size,
                   std::optional<std::array<double, 2>> scale_factor, const std::string& mode,
                   std::optional<bool> align_corners) {
  check_defined("interpolate", "input", x);
  DBRQ_ENSURE(x.dim() == 4, ShapeError, "interpolate: input must be 4-D (N, C, H, W), got sizes ", x.shape_string());
  InterpolateParams p;
  if (mode == "nearest") {
    p.mode = 0;
    DBRQ_ENSURE(!align_corners.has_value(), ValueError,
                "interpolate: align_corners option can only be set with the interpolating mode \"bilinear\", got mode "
                "\"nearest\"");
  } else if (mode == "bilinear") {
    p.mode = 1;
    p.align_corners = align_corners.value_or(false);
  } else {
    DBRQ_THROW(ValueError, "interpolate: mode must be \"nearest\" or \"bilinear\", got \"", mode, "\"");
  }
  DBRQ_ENSURE(size.has_value() != scale_factor.has_value(), ValueError,
              size.has_value() ? "interpolate: only one of size or scale_factor should be defined"
                               : "interpolate: either size or scale_factor should be defined");
  if (size.has_value()) {
    DBRQ_ENSURE((*size)[0] >= 1 && (*size)[1] >= 1, ValueError, "interpolate: size must be >= 1, got (", (*size)[0],
                ", ", (*size)[1], ")");
    p.size = *size;
  } else {
    const auto& s = *scale_factor;
    for (int i = 0; i < 2; ++i) {
      DBRQ_ENSURE(std::isfinite(s[i]) && s[i] > 0.0, ValueError, "interpolate: scale_factor must be finite and > 0, got (",
                  s[0], ", ", s[1], ")");
      p.size[i] = static_cast<int64_t>(std::floor(static_cast<double>(x.size(2 + i)) * s[i]));
      DBRQ_ENSURE(p.size[i] >= 1, ShapeError, "interpolate: output size ", p.size[i], " (input ", x.size(2 + i),
                  " * scale_factor ", s[i], ") must be >= 1 (input sizes ", x.shape_string(), ")");
    }
    // With align_corners PyTorch's bilinear kernel ignores the factor ((in - 1) / (out - 1)).
    p.scale_h = s[0];
    p.scale_w = s[1];
  }
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kInterpolate, in, &p, run_interpolate);
}

namespace ops {

void register_resample_ops(OpRegistry& r) {
  OpDef& d = r.define(OpKind::kInterpolate, "interpolate").with_params<InterpolateParams>();
  d.run = run_interpolate;
  d.infer_sizes = interpolate_sizes;
  // int8: its eager kernel takes the u8 codes (with the call's parameters, so a size that follows
  // the image, e.g. size = the skip connection's, stays one record).
  d.role = QuantRole::kShare;
  d.params_in_identity = false;
}

}  // namespace ops
}  // namespace dbrq
