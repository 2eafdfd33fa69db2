#pragma once

#include <algorithm>
#include <cmath>

namespace dbrq::kernels {

template <typename F>
Lut make_lut(const QuantParams& in, const QuantParams& out, F&& f) {
  Lut lut;
  const float s = in.scale(), inv = 1.0f / out.scale();
  // PyTorch's quantized activations (sigmoid, tanh, hardswish, leaky_relu, gelu, ...) dequantize
  // in their vector loops as fma(scale, q, scale * -zp); (q - zp) * scale rounds differently on
  // exact ties.
  const float premul = s * -static_cast<float>(in.zero_point());
  const int32_t zp_out = out.zero_point();
  for (int q = 0; q < 256; ++q) {
    const float x = std::fma(s, static_cast<float>(q), premul);
    const float y = static_cast<float>(f(x));
    const float r = std::nearbyint(y * inv);
    // Saturate in float first: f may return +-inf (or huge values) for extreme codes.
    const float c = std::min(std::max(r + static_cast<float>(zp_out), 0.f), 255.f);
    lut[q] = std::isnan(c) ? static_cast<uint8_t>(zp_out) : static_cast<uint8_t>(c);
  }
  return lut;
}

}  // namespace dbrq::kernels
