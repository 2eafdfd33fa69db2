// bf16 as a middle precision between int8 and fp32: conv2d, linear and matmul on oneDNN's bf16
// primitives (AVX512_BF16 / AMX), with f32 at the boundaries. The f32 input is rounded to bf16
// (round to nearest even) inside, the weights once per (storage, version) into the primitive's
// bf16 layout, the bias stays f32, accumulation is f32 and the output is f32: neighbours of a bf16
// op see an ordinary f32 tensor.
//
//   if (dbrq::kernels::bf16_available()) y = dbrq::kernels::linear_bf16(x, w, b);
//   else                                 y = dbrq::kernels::linear(x, w, b);
//
// Availability is detected at run time (kernels/cpu_features.h: AVX512_BF16, or AMX-BF16, with the OS
// saving the AVX-512 (and tile) state). DBRQ_DISABLE_BF16=1 or
// force_bf16_unavailable(true) (tests) makes it report false, so callers take the fp32 path as on a
// CPU without bf16. Internal to kernels/; the tracer chooses, users ask dbrq::bf16_supported().
#pragma once

#include "core/op_params.h"
#include "core/tensor.h"

namespace dbrq::kernels {

// Whether the CPU has native bf16 dot products (AVX512_BF16 or AMX-BF16), detected once.
bool cpu_has_bf16();
// cpu_has_bf16() unless disabled by DBRQ_DISABLE_BF16=1 or force_bf16_unavailable(true).
bool bf16_available();
void force_bf16_unavailable(bool on);

// f32 in, f32 out; the arithmetic in bf16 x bf16 -> f32. Same shape rules and errors as the f32
// kernels (conv2d, linear, matmul in kernels/eager.h).
Tensor conv2d_bf16(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p);
Tensor linear_bf16(const Tensor& x, const Tensor& w, const Tensor& b);
Tensor matmul_bf16(const Tensor& a, const Tensor& b);

// The f32 value nearest to `v` that bf16 holds (round to nearest even; NaN stays NaN), as
// oneDNN's f32 -> bf16 conversion: for references in tests.
float round_to_bf16(float v);

}  // namespace dbrq::kernels
