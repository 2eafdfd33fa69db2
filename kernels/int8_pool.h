// Vectorized int8 average pooling of channels-last inputs (internal to kernels/): per output
// pixel, the window's pixels are summed as whole channel vectors (channels are consecutive in
// NHWC), then rounded as PyTorch's NHWC kernel does. qavg_pool2d (int8_elementwise.cc) calls it
// for channels-last inputs; every other layout keeps the strided scalar loop.
#pragma once

#include <cstdint>

#include "core/op_params.h"
#include "core/op_shapes.h"

namespace dbrq::kernels {

// src: u8 NHWC [g.n, g.h, g.w, g.c] (dense); dst: u8 NHWC [g.n, g.oh, g.ow, g.c]. Codes:
// acc = sum(q) - zp * count, out = saturate(round_half_even(float(acc) * (1.0f / divisor)) + zp),
// divisor = window size clipped to the padded input (count_include_pad) or to the input.
void qavg_pool2d_nhwc(const uint8_t* src, uint8_t* dst, const PoolGeometry& g, const Pool2dParams& p, int32_t zp);

}  // namespace dbrq::kernels
