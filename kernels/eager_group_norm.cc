// group_norm / instance_norm (f32): per sample and group, mean and biased variance over the
// group's channels and positions, then the per-channel affine.
#include <cmath>
#include <vector>

#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "kernels/loops.h"

namespace dbrq::kernels {

Tensor group_norm(const char* op, const Tensor& x_in, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_float(op, "input", x_in);
  DBRQ_ENSURE(x_in.dim() >= 2, ShapeError, op, ": input must have at least 2 dims (N, C, *), got sizes ",
              x_in.shape_string());
  const int64_t n = x_in.size(0), c = x_in.size(1);
  DBRQ_ENSURE(num_groups >= 1, ValueError, op, ": num_groups must be >= 1, got ", num_groups);
  DBRQ_ENSURE(c % num_groups == 0, ShapeError, op, ": ", c, " channels are not divisible into ", num_groups,
              " groups (input sizes ", x_in.shape_string(), ")");
  DBRQ_ENSURE(std::isfinite(eps) && eps >= 0.0, ValueError, op, ": eps must be finite and >= 0, got ", eps);
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&weight, "weight"}, {&bias, "bias"}}) {
    if (!t->defined()) continue;
    check_float(op, name, *t);
    DBRQ_ENSURE(t->dim() == 1 && t->size(0) == c, ShapeError, op, ": ", name, " must have sizes [", c, "], got ",
                t->shape_string());
  }
  const MemoryFormat f = x_in.dim() == 4 && x_in.is_channels_last() && !x_in.is_contiguous()
                             ? MemoryFormat::kChannelsLast
                             : MemoryFormat::kContiguous;
  const Tensor x = contiguous(x_in);  // NCHW order for the statistics
  Tensor y = Tensor::empty(x.sizes(), DType::kF32);
  if (x.numel() == 0) return f == MemoryFormat::kContiguous ? y : contiguous(y, f);
  const int64_t per_channel = x.numel() / (n * c), cg = c / num_groups, per_group = cg * per_channel;
  const std::vector<float> w = weight.defined() ? weight.to_vector<float>() : std::vector<float>(c, 1.f);
  const std::vector<float> b = bias.defined() ? bias.to_vector<float>() : std::vector<float>(c, 0.f);
  const float* src = x.raw_data<float>();
  float* dst = y.raw_mutable_data<float>();
  parallel_for(n * num_groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* s = src + i * per_group;
      float* d = dst + i * per_group;
      double sum = 0.0;
      for (int64_t k = 0; k < per_group; ++k) sum += s[k];
      const double mean = sum / static_cast<double>(per_group);
      double sq = 0.0;
      for (int64_t k = 0; k < per_group; ++k) sq += (s[k] - mean) * (s[k] - mean);
      const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(per_group) + eps);
      const int64_t g = i % num_groups;
      for (int64_t ci = 0; ci < cg; ++ci) {
        const int64_t ch = g * cg + ci;
        const double scale = rstd * w[static_cast<size_t>(ch)];
        const double shift = b[static_cast<size_t>(ch)] - mean * scale;
        const float* sc = s + ci * per_channel;
        float* dc = d + ci * per_channel;
        for (int64_t k = 0; k < per_channel; ++k) dc[k] = static_cast<float>(sc[k] * scale + shift);
      }
    }
  });
  return f == MemoryFormat::kContiguous ? y : contiguous(y, f);
}

}  // namespace dbrq::kernels
