#include "quant_state/qparams.h"

#include <algorithm>
#include <cmath>

namespace dbrq {

const char* qscheme_name(QScheme s) {
  switch (s) {
    case QScheme::kPerTensorAffine:
      return "per_tensor_affine";
    case QScheme::kPerTensorSymmetric:
      return "per_tensor_symmetric";
    case QScheme::kPerChannelAffine:
      return "per_channel_affine";
    case QScheme::kPerChannelSymmetric:
      return "per_channel_symmetric";
  }
  return "?";
}

QScheme qscheme_from_name(const std::string& name) {
  for (QScheme s : {QScheme::kPerTensorAffine, QScheme::kPerTensorSymmetric, QScheme::kPerChannelAffine,
                    QScheme::kPerChannelSymmetric}) {
    if (name == qscheme_name(s)) return s;
  }
  DBRQ_THROW(ValueError, "unknown qscheme \"", name,
             "\"; expected per_tensor_affine, per_tensor_symmetric, per_channel_affine or per_channel_symmetric");
}

QuantRange quant_range(DType dtype, bool reduce_range) {
  DBRQ_ENSURE(is_quantized_dtype(dtype), DTypeError, "quantized dtype must be u8 or s8, got ", dtype_name(dtype));
  if (dtype == DType::kU8) return reduce_range ? QuantRange{0, 127} : QuantRange{0, 255};
  return reduce_range ? QuantRange{-64, 63} : QuantRange{-128, 127};
}

QuantParamsPtr calculate_qparams(const std::vector<float>& min_vals, const std::vector<float>& max_vals, DType dtype,
                                 QScheme qscheme, bool reduce_range, int64_t axis) {
  DBRQ_ENSURE(!min_vals.empty() && min_vals.size() == max_vals.size(), ValueError,
              "calculate_qparams: need equally many min and max values, got ", min_vals.size(), " and ",
              max_vals.size());
  const QuantRange r = quant_range(dtype, reduce_range);
  std::vector<float> scales(min_vals.size());
  std::vector<int32_t> zps(min_vals.size());
  for (size_t i = 0; i < min_vals.size(); ++i) {
    const float lo = min_vals[i], hi = max_vals[i];
    DBRQ_ENSURE(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, NotCalibratedError,
                "calculate_qparams: range [", lo, ", ", hi, "]", min_vals.size() > 1 ? absl::StrCat(" of channel ", i) : "",
                " is empty or not finite (no calibration data was observed?)");
    // Mirrors torch.ao.quantization.observer._calculate_qparams in float32.
    const float min_neg = std::min(lo, 0.f), max_pos = std::max(hi, 0.f);
    if (is_symmetric(qscheme)) {
      const float m = std::max(-min_neg, max_pos);
      scales[i] = std::max(m / (static_cast<float>(r.max - r.min) / 2.f), kScaleEps);
      zps[i] = dtype == DType::kU8 ? (reduce_range ? 64 : 128) : 0;
    } else {
      const float scale = std::max((max_pos - min_neg) / static_cast<float>(r.max - r.min), kScaleEps);
      const int32_t zp = r.min - static_cast<int32_t>(std::nearbyint(min_neg / scale));
      scales[i] = scale;
      zps[i] = std::min(std::max(zp, r.min), r.max);
    }
  }
  if (!is_per_channel(qscheme)) {
    DBRQ_ENSURE(scales.size() == 1, ValueError, "calculate_qparams: per-tensor scheme with ", scales.size(),
                " ranges");
    return QuantParams::per_tensor(scales[0], zps[0]);
  }
  return QuantParams::per_channel(std::move(scales), std::move(zps), axis);
}

}  // namespace dbrq
