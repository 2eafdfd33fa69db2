// Shape rules of the ops: validation with readable errors, and output sizes. Shared by the fp32
// kernels and the int8 kernels so both reject the same inputs with the same messages.
//
//   dbrq::ConvGeometry g = dbrq::conv2d_geometry(x, w, b, params);   // throws ShapeError
//   dbrq::Tensor y = dbrq::Tensor::empty({g.n, g.k, g.oh, g.ow}, ...);
#pragma once

#include <cstdint>
#include <vector>

#include "core/op_params.h"
#include "core/tensor.h"

namespace dbrq {

struct ConvGeometry {
  int64_t n, c, h, w;   // input
  int64_t k, r, s;      // output channels, kernel height, kernel width
  int64_t oh, ow;       // output spatial sizes
  int64_t groups;
};

// x: [N, C, H, W], w: [K, C/groups, R, S], b: undefined or [K].
ConvGeometry conv2d_geometry(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p);

// conv_transpose2d: x [N, C, H, W], w [C, K/groups, R, S] (PyTorch's layout), b: undefined or [K].
// g.c = C, g.k = K (output channels).
ConvGeometry conv_transpose2d_geometry(const Tensor& x, const Tensor& w, const Tensor& b,
                                       const ConvTranspose2dParams& p);

// conv1d: x [N, C, L], w [K, C/groups, R], b: undefined or [K]. Gives h = oh = 1, r = 1, s = R,
// w = L, ow = the output length (the conv2d it runs as).
ConvGeometry conv1d_geometry(const Tensor& x, const Tensor& w, const Tensor& b, const Conv1dParams& p);

// 1-D pooling of x [N, C, L] (op names it in errors): checks the 1-D arguments with 1-D messages
// and returns the Pool2dParams with H = 1 that it runs as.
Pool2dParams pool1d_params(const char* op, const Tensor& x, int64_t kernel_size, int64_t stride, int64_t padding,
                           int64_t dilation, bool ceil_mode, bool count_include_pad);

struct PoolGeometry {
  int64_t n, c, h, w, oh, ow;
  int64_t pad_bottom, pad_right;  // right/bottom padding that realizes ceil_mode
};
PoolGeometry pool2d_geometry(const char* op, const Tensor& x, const Pool2dParams& p);

// x: [..., in_features], w: [out, in], b: undefined or [out]. Returns the output sizes.
DimVector linear_output_sizes(const Tensor& x, const Tensor& w, const Tensor& b);
// The rows a linear computes: every dim of x but the last (not x.numel() / in_features, which is
// 0 / 0 for in_features 0).
int64_t linear_rows(const Tensor& x);

// NumPy broadcasting; `op` names the op in the error.
DimVector broadcast_shapes(const char* op, IntArrayRef a, IntArrayRef b);

struct MatmulShapes {
  DimVector a, b, out;  // a and b promoted to equal rank >= 2, batch dims broadcast
  bool squeeze_m = false, squeeze_n = false;  // 1-D operands: drop the added dim from out
};
MatmulShapes matmul_shapes(IntArrayRef a, IntArrayRef b);

// Resolves one -1 and checks the element count.
DimVector infer_reshape(IntArrayRef target, int64_t numel, IntArrayRef from);

// Checks that the tensors agree on every dim except `dim`, and returns the output sizes.
DimVector cat_output_sizes(absl::Span<const Tensor* const> tensors, int64_t dim);

void check_defined(const char* op, const char* arg, const Tensor& t);
void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected);
void check_float(const char* op, const char* arg, const Tensor& t);

}  // namespace dbrq
