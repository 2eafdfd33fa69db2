// Quantization parameter math: quantized ranges and scale / zero-point from observed ranges,
// computed exactly as PyTorch's observers do (float32 arithmetic, round half to even).
//
//   auto qp = dbrq::calculate_qparams({-1.f}, {3.f}, dbrq::DType::kU8, dbrq::QScheme::kPerTensorAffine,
//                                     /*reduce_range=*/false);
//   // qp->scale() == 4/255, qp->zero_point() == 64
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace dbrq {

enum class QScheme : uint8_t {
  kPerTensorAffine,
  kPerTensorSymmetric,
  kPerChannelAffine,
  kPerChannelSymmetric,
};

const char* qscheme_name(QScheme s);
QScheme qscheme_from_name(const std::string& name);  // throws ValueError
inline bool is_per_channel(QScheme s) { return s == QScheme::kPerChannelAffine || s == QScheme::kPerChannelSymmetric; }
inline bool is_symmetric(QScheme s) { return s == QScheme::kPerTensorSymmetric || s == QScheme::kPerChannelSymmetric; }

struct QuantRange {
  int32_t min, max;
};
// [0, 255] for u8 and [-128, 127] for s8; halved ([0, 127], [-64, 63]) with reduce_range.
QuantRange quant_range(DType dtype, bool reduce_range);

// Scale and zero point for each (min, max) pair (one pair per tensor, or one per channel along
// `axis`). Ranges are widened to include 0. Empty or inverted ranges throw NotCalibratedError.
QuantParamsPtr calculate_qparams(const std::vector<float>& min_vals, const std::vector<float>& max_vals, DType dtype,
                                 QScheme qscheme, bool reduce_range, int64_t axis = 0);

// PyTorch's eps floor for scales: torch.finfo(torch.float32).eps.
inline constexpr float kScaleEps = 1.1920928955078125e-07f;

}  // namespace dbrq
