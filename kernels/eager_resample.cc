// interpolate (upsample_nearest2d / upsample_bilinear2d) on f32 and u8, with PyTorch 1.13's index
// and weight arithmetic (ATen/native/UpSample.h): source indices and lambdas in float, nearest as
// floor(dst * scale) (scale = 1 / scale_factor when one was given, else in / out), bilinear source
// (dst + 0.5) * scale - 0.5 clamped at 0, or dst * (in - 1) / (out - 1) with align_corners. On u8
// (quantized::upsample_bilinear2d): interpolate the codes in float, subtract the zero point, round
// half to even, add it back: the output keeps the input's parameters.
//
// Float contraction is off in this file: PyTorch's reference loops multiply and add separately.
#pragma GCC optimize("fp-contract=off")

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/eager.h"
#include "kernels/loops.h"

namespace dbrq::kernels {
namespace {

float compute_scale(int64_t in, int64_t out, bool align_corners, double scale_factor) {
  if (align_corners) return out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.f;
  return scale_factor > 0. ? static_cast<float>(1.0 / scale_factor) : static_cast<float>(in) / static_cast<float>(out);
}

// floor(dst * scale), scale = 1 / scale_factor when one was given: PyTorch 1.13's float kernel on
// NCHW inputs of more than one channel and its quantized kernel (any layout). Its channels-last
// float kernel copies when out == in and halves when out == 2 * in whatever the scale factor, so
// with scale_factor (1.1, 2.0) on 5 x 5 rows come out [0, 1, 2, 3, 4] there but [0, 0, 1, 2, 3]
// here and in the NCHW kernel a libtorch model runs. Without a scale factor both forms agree.
int64_t nearest_index(int64_t dst, int64_t in, int64_t out, double scale_factor) {
  const float scale = scale_factor > 0. ? static_cast<float>(1.0 / scale_factor)
                                         : static_cast<float>(in) / static_cast<float>(out);
  return std::min(static_cast<int64_t>(std::floor(static_cast<float>(dst) * scale)), in - 1);
}

struct Linear1d {
  int64_t i0, step;  // the second tap is i0 + step (step 0 at the last input)
  float l0, l1;
};

std::vector<Linear1d> linear_taps(int64_t in, int64_t out, bool align_corners, double scale_factor) {
  std::vector<Linear1d> taps(static_cast<size_t>(out));
  if (in == out) {
    // A dimension that keeps its size is copied, whatever scale factor gave that size (PyTorch
    // 1.13's float kernel: interpolate([1, 1, 5, 5], scale_factor (1.1, 2.0)) leaves H as it is;
    // 1 / 1.1 would shift every row). PyTorch's quantized kernel resamples it with 1 / 1.1 all
    // the same; dbrq's u8 path follows the float function the int8 model approximates.
    for (int64_t o = 0; o < out; ++o) taps[static_cast<size_t>(o)] = {o, 0, 1.f, 0.f};
    return taps;
  }
  const float scale = compute_scale(in, out, align_corners, scale_factor);
  for (int64_t o = 0; o < out; ++o) {
    float real = align_corners ? scale * static_cast<float>(o)
                               : std::max(scale * (static_cast<float>(o) + 0.5f) - 0.5f, 0.f);
    const int64_t i0 = static_cast<int64_t>(real);
    const float l1 = real - static_cast<float>(i0);
    taps[static_cast<size_t>(o)] = {i0, i0 < in - 1 ? 1 : 0, 1.f - l1, l1};
  }
  return taps;
}

// Strides of a tensor in its own dense layout (NCHW or NHWC), element units.
struct Layout4 {
  int64_t n, c, h, w;
};
Layout4 layout_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

MemoryFormat format_of(const Tensor& x) {
  return x.is_channels_last() && !x.is_contiguous() ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
}

template <typename T, typename F>
void for_each_output(const Tensor& src, Tensor& dst, F&& value) {
  const int64_t n = dst.size(0), c = dst.size(1), oh = dst.size(2), ow = dst.size(3);
  const Layout4 si = layout_of(src), so = layout_of(dst);
  const T* in = src.raw_data<T>();
  T* out = dst.raw_mutable_data<T>();
  parallel_for(n * oh, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i / oh, y = i % oh;
      for (int64_t x = 0; x < ow; ++x) {
        for (int64_t ch = 0; ch < c; ++ch) {
          out[b * so.n + ch * so.c + y * so.h + x * so.w] = value(in + b * si.n + ch * si.c, si, y, x);
        }
      }
    }
  });
}

}  // namespace

Tensor upsample_nearest2d(const Tensor& x_in, int64_t oh, int64_t ow, double scale_h, double scale_w) {
  DBRQ_CHECK(x_in.dim() == 4, "upsample_nearest2d needs a 4-D tensor");
  const MemoryFormat f = format_of(x_in);
  const Tensor x = contiguous(x_in, f);
  const int64_t ih = x.size(2), iw = x.size(3);
  Tensor dst = Tensor::empty({x.size(0), x.size(1), oh, ow}, x.dtype(), f);
  if (x.is_quantized()) dst = dst.with_qparams(x.qparams_ptr());
  if (dst.numel() == 0) return dst;
  std::vector<int64_t> hi(static_cast<size_t>(oh)), wi(static_cast<size_t>(ow));
  for (int64_t y = 0; y < oh; ++y) hi[static_cast<size_t>(y)] = nearest_index(y, ih, oh, scale_h);
  for (int64_t v = 0; v < ow; ++v) wi[static_cast<size_t>(v)] = nearest_index(v, iw, ow, scale_w);
  auto pick = [&](const auto* plane, const Layout4& s, int64_t y, int64_t v) {
    return plane[hi[static_cast<size_t>(y)] * s.h + wi[static_cast<size_t>(v)] * s.w];
  };
  if (x.dtype() == DType::kF32) {
    for_each_output<float>(x, dst, pick);
  } else if (x.dtype() == DType::kU8) {
    for_each_output<uint8_t>(x, dst, pick);
  } else if (x.dtype() == DType::kS8) {
    for_each_output<int8_t>(x, dst, pick);
  } else {
    DBRQ_THROW(DTypeError, "interpolate: input must have dtype f32, u8 or s8, got ", dtype_name(x.dtype()));
  }
  return dst;
}

Tensor upsample_bilinear2d(const Tensor& x_in, int64_t oh, int64_t ow, bool align_corners, double scale_h,
                           double scale_w) {
  DBRQ_CHECK(x_in.dim() == 4, "upsample_bilinear2d needs a 4-D tensor");
  const bool quantized = x_in.dtype() == DType::kU8;
  DBRQ_ENSURE(x_in.dtype() == DType::kF32 || (quantized && x_in.is_quantized()), DTypeError,
              "interpolate (bilinear): input must have dtype f32 or be a quantized u8 tensor, got ",
              dtype_name(x_in.dtype()));
  const MemoryFormat f = format_of(x_in);
  const Tensor x = contiguous(x_in, f);
  const int64_t ih = x.size(2), iw = x.size(3);
  Tensor dst = Tensor::empty({x.size(0), x.size(1), oh, ow}, x.dtype(), f);
  if (quantized) dst = dst.with_qparams(x.qparams_ptr());
  if (dst.numel() == 0) return dst;
  if (ih == oh && iw == ow) {  // PyTorch copies
    copy_into(dst, x);
    return dst;
  }
  const std::vector<Linear1d> th = linear_taps(ih, oh, align_corners, scale_h);
  const std::vector<Linear1d> tw = linear_taps(iw, ow, align_corners, scale_w);
  if (!quantized) {
    for_each_output<float>(x, dst, [&](const float* p, const Layout4& s, int64_t y, int64_t v) {
      const Linear1d& a = th[static_cast<size_t>(y)];
      const Linear1d& b = tw[static_cast<size_t>(v)];
      const float* r0 = p + a.i0 * s.h + b.i0 * s.w;
      const float* r1 = r0 + a.step * s.h;
      return a.l0 * (b.l0 * r0[0] + b.l1 * r0[b.step * s.w]) + a.l1 * (b.l0 * r1[0] + b.l1 * r1[b.step * s.w]);
    });
    return dst;
  }
  const float zp = static_cast<float>(x.q_zero_point());
  for_each_output<uint8_t>(x, dst, [&](const uint8_t* p, const Layout4& s, int64_t y, int64_t v) {
    const Linear1d& a = th[static_cast<size_t>(y)];
    const Linear1d& b = tw[static_cast<size_t>(v)];
    const uint8_t* r0 = p + a.i0 * s.h + b.i0 * s.w;
    const uint8_t* r1 = r0 + a.step * s.h;
    const float result = a.l0 * (b.l0 * static_cast<float>(r0[0]) + b.l1 * static_cast<float>(r0[b.step * s.w])) +
                         a.l1 * (b.l0 * static_cast<float>(r1[0]) + b.l1 * static_cast<float>(r1[b.step * s.w])) - zp;
    const float q = std::nearbyint(result) + zp;
    return static_cast<uint8_t>(std::min(255.f, std::max(0.f, q)));
  });
  return dst;
}

}  // namespace dbrq::kernels
