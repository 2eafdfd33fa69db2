// Batch-norm folding: an inference batch norm after a conv or linear becomes part of its weights
// and bias, with PyTorch's fuse_conv_bn_weights float arithmetic (so folded int8 weights match
// PyTorch's bit for bit).
//
//   dbrq::kernels::BatchNormStats bn{mean, var, gamma, beta, 1e-5};
//   dbrq::Tensor w2, b2;
//   dbrq::kernels::fold_batch_norm(conv_w, conv_b, bn, &w2, &b2);
#pragma once

#include "core/tensor.h"

namespace dbrq::kernels {

struct BatchNormStats {
  Tensor mean, var;     // [K] running statistics
  Tensor weight, bias;  // [K] affine parameters, or undefined (1 and 0)
  double eps = 1e-5;
};

// w * (gamma * rsqrt(var + eps)) per output channel (dim 0); ((b - mean) * rsqrt(var + eps)) * gamma
// + beta (fuse_conv_bn_weights), or for a 2-D (linear) weight (b - mean) * (gamma * rsqrt(var + eps))
// + beta (fuse_linear_bn_weights). `b` may be undefined (0). Throws ShapeError when the channel
// counts differ.
void fold_batch_norm(const Tensor& w, const Tensor& b, const BatchNormStats& bn, Tensor* w_out, Tensor* b_out);

}  // namespace dbrq::kernels
