#include "kernels/bn_fold.h"

#include <cmath>
#include <vector>

#include "kernels/eager.h"

namespace dbrq::kernels {

void fold_batch_norm(const Tensor& w, const Tensor& b, const BatchNormStats& bn, Tensor* w_out, Tensor* b_out) {
  const int64_t k = w.size(0);
  DBRQ_ENSURE(bn.mean.numel() == k, ShapeError, "batch_norm folding: ", bn.mean.numel(), " channels for a weight of ",
              k, " output channels");
  const Tensor wc = contiguous(w);
  Tensor nw = Tensor::empty(w.sizes(), DType::kF32);
  Tensor nb = Tensor::empty({k}, DType::kF32);
  const int64_t per = k == 0 ? 0 : w.numel() / k;
  const float* src = wc.raw_data<float>();
  float* dst = nw.raw_mutable_data<float>();
  const std::vector<float> mean = bn.mean.to_vector<float>(), var = bn.var.to_vector<float>();
  const std::vector<float> gamma = bn.weight.defined() ? bn.weight.to_vector<float>() : std::vector<float>(k, 1.f);
  const std::vector<float> beta = bn.bias.defined() ? bn.bias.to_vector<float>() : std::vector<float>(k, 0.f);
  const std::vector<float> bias = b.defined() ? b.to_vector<float>() : std::vector<float>(k, 0.f);
  float* bd = nb.raw_mutable_data<float>();
  // A linear's weight is 2-D: PyTorch folds it with fuse_linear_bn_weights, whose bias multiplies
  // by gamma * rsqrt in one step; convs (3-D, 4-D) with fuse_conv_bn_weights, by rsqrt then gamma.
  const bool linear = w.dim() == 2;
  for (int64_t c = 0; c < k; ++c) {
    const float rsqrt = 1.f / std::sqrt(var[c] + static_cast<float>(bn.eps));
    const float mult = gamma[c] * rsqrt;
    for (int64_t i = 0; i < per; ++i) dst[c * per + i] = src[c * per + i] * mult;
    bd[c] = linear ? (bias[c] - mean[c]) * mult + beta[c] : (bias[c] - mean[c]) * rsqrt * gamma[c] + beta[c];
  }
  *w_out = nw;
  *b_out = nb;
}

}  // namespace dbrq::kernels
