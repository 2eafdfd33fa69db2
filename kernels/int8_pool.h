// Vectorized int8 average pooling of channels-last inputs (internal to kernels/): per output
// pixel, the window's pixels are summed as whole channel vectors (channels are consecutive in
// NHWC), then rounded as PyTorch's NHWC kernel does. qavg_pool2d (int8_elementwise.cc) calls it
// for channels-last inputs; every other layout keeps the strided scalar loop.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/op_params.h"
#include "core/op_shapes.h"

namespace dbrq::kernels {

// src: u8 NHWC [g.n, g.h, g.w, g.c] (dense); dst: u8 NHWC [g.n, g.oh, g.ow, g.c]. Codes:
// acc = sum(q) - zp * count, out = saturate(round_half_even(float(acc) * (1.0f / divisor)) + zp),
// divisor = window size clipped to the padded input (count_include_pad) or to the input.
// One output pixel's window as PyTorch's quantized avg_pool2d computes it: rows [h0, h1) and
// columns [w0, w1) of the input (clipped to it), `count` = its pixels, and the reciprocal of the
// divisor (the window clipped to the padded input with count_include_pad, else `count`).
struct AvgPoolWindow {
  int64_t h0, h1, w0, w1, count;
  float multiplier;
};
inline AvgPoolWindow avg_pool_window(const PoolGeometry& g, const Pool2dParams& p, int64_t oh, int64_t ow) {
  AvgPoolWindow win;
  int64_t h0 = oh * p.stride[0] - p.padding[0], w0 = ow * p.stride[1] - p.padding[1];
  int64_t h1 = std::min(h0 + p.kernel_size[0], g.h + p.padding[0]);
  int64_t w1 = std::min(w0 + p.kernel_size[1], g.w + p.padding[1]);
  const int64_t pool_size = (h1 - h0) * (w1 - w0);
  win.h0 = std::max<int64_t>(h0, 0);
  win.w0 = std::max<int64_t>(w0, 0);
  win.h1 = std::min(h1, g.h);
  win.w1 = std::min(w1, g.w);
  win.count = (win.h1 - win.h0) * (win.w1 - win.w0);
  const int64_t divisor = p.count_include_pad ? pool_size : win.count;
  win.multiplier = 1.0f / static_cast<float>(divisor);
  return win;
}

void qavg_pool2d_nhwc(const uint8_t* src, uint8_t* dst, const PoolGeometry& g, const Pool2dParams& p, int32_t zp);

}  // namespace dbrq::kernels
