// The real-valued activation functions, with PyTorch's formulas, in one place: the eager loops
// that oneDNN cannot run exactly as PyTorch does (hardswish, hardsigmoid), the 256-entry code tables
// of int8 activations, and the tests all use these.
//
//   float y = dbrq::kernels::math::hardswish(x);
//   float z = dbrq::kernels::eltwise_reference({dbrq::kernels::Eltwise::Alg::kElu, 1.f, 0.f}, x);
#pragma once

#include <algorithm>
#include <cmath>

namespace dbrq::kernels::math {

inline float relu(float x, float negative_slope = 0.f) { return x > 0.f ? x : x * negative_slope; }
inline float clip(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }
inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float tanh(float x) { return std::tanh(x); }
inline float silu(float x) { return x / (1.f + std::exp(-x)); }
// x * relu6(x + 3) / 6 and relu6(x + 3) / 6, evaluated as PyTorch's CPU kernels do.
inline float hardswish(float x) { return x * std::min(std::max(x + 3.f, 0.f), 6.f) / 6.f; }
inline float hardsigmoid(float x) { return std::min(std::max(x + 3.f, 0.f), 6.f) / 6.f; }
inline float gelu_erf(float x) { return 0.5f * x * (1.f + std::erf(x * 0.7071067811865476f)); }
inline float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x)));
}
inline float elu(float x, float alpha) { return x > 0.f ? x : alpha * std::expm1(x); }
// PyTorch's softplus: x where beta * x > threshold, else log1p(exp(beta * x)) / beta.
inline float softplus(float x, float beta, float threshold) {
  return x * beta > threshold ? x : std::log1p(std::exp(x * beta)) / beta;
}
// PyTorch's mish: x * tanh(softplus(x)) (beta 1, threshold 20).
inline float mish(float x) { return x * std::tanh(softplus(x, 1.f, 20.f)); }

}  // namespace dbrq::kernels::math
