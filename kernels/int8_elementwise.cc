// Int8 elementwise, pooling and (re)quantization kernels. The arithmetic mirrors PyTorch's
// quantized CPU kernels (FMA dequantization, reciprocal scales computed in double, round half to
// even) so converted models agree with PyTorch's onednn engine.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dnnl_utils.h"
#include "kernels/int8.h"
#include "kernels/int8_pool.h"
#include "kernels/loops.h"
#include "kernels/simd.h"
#include "core/op_shapes.h"

namespace dbrq::kernels {
namespace {

constexpr int64_t kGrain = 1 << 16;

// PyTorch passes 1.0 / scale computed in double to its vectorized quantizers.
inline float inverse(float scale) { return static_cast<float>(1.0 / static_cast<double>(scale)); }

inline uint8_t saturate_u8(int32_t v) { return static_cast<uint8_t>(std::min(std::max(v, 0), 255)); }

void check_u8(const char* op, const Tensor& x) {
  DBRQ_ENSURE(x.defined() && x.dtype() == DType::kU8 && x.is_quantized() && !x.qparams()->is_per_channel(),
              DTypeError, op, ": needs a per-tensor quantized u8 tensor, got ",
              x.defined() ? dtype_name(x.dtype()) : "undefined");
}

Tensor dense(const Tensor& t) {
  return t.is_non_overlapping_and_dense() ? t : copy(t, MemoryFormat::kContiguous, t.dtype());
}

}  // namespace

Tensor quantize_to(const Tensor& x_in, const QuantParamsPtr& qp, DType dtype, MemoryFormat format) {
  check_float("quantize", "input", x_in);
  DBRQ_ENSURE(qp != nullptr && !qp->is_per_channel() && dtype == DType::kU8, ValueError,
              "quantize_to: needs per-tensor parameters and dtype u8");
  Tensor dst = format == MemoryFormat::kPreserve || (format == MemoryFormat::kChannelsLast && x_in.dim() != 4)
                   ? Tensor::empty_like(x_in, DType::kU8)
                   : Tensor::empty(x_in.sizes(), DType::kU8, format);
  dst = dst.with_qparams(qp);
  const float inv = inverse(qp->scale());
  const int32_t zp = qp->zero_point();
  uint8_t* out = static_cast<uint8_t*>(dst.mutable_data_ptr());
  // One element order: the same strides, or both row-major (a dim of size 1 may have any stride,
  // e.g. [T, 1, C] transposed from a batch of one).
  if (x_in.is_non_overlapping_and_dense() &&
      (x_in.strides() == dst.strides() || (x_in.is_contiguous() && dst.is_contiguous()))) {
    const float* src = x_in.raw_data<float>();
    parallel_for(x_in.numel(), kGrain,
                 [&](int64_t lo, int64_t hi) { simd::quantize_u8(src + lo, out + lo, hi - lo, inv, zp); });
    return dst;
  }
  if (x_in.dim() == 4 && dst.is_channels_last() && x_in.is_contiguous()) {
    // NCHW f32 -> NHWC u8 in one pass (the first conv's input).
    const int64_t n = x_in.size(0), c = x_in.size(1), hw = x_in.size(2) * x_in.size(3);
    const float* src = x_in.raw_data<float>();
    parallel_for(n * hw, 1024, [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t b = p / hw, s = p % hw;
        const float* in = src + b * c * hw + s;
        uint8_t* o = out + p * c;
        for (int64_t ch = 0; ch < c; ++ch) o[ch] = simd::quantize_one(in[ch * hw], inv, zp);
      }
    });
    return dst;
  }
  Tensor tmp = quantize_to(contiguous(x_in), qp, dtype, MemoryFormat::kContiguous);
  copy_into(dst, tmp);
  return dst;
}

Tensor apply_lut(const Tensor& x_in, const Lut& lut, const QuantParamsPtr& out_qparams) {
  check_u8("lookup table", x_in);
  const Tensor x = dense(x_in);
  Tensor dst = Tensor::empty_like(x, DType::kU8).with_qparams(out_qparams);
  const uint8_t* src = x.raw_data<uint8_t>();
  uint8_t* out = dst.raw_mutable_data<uint8_t>();
  parallel_for(x.numel(), kGrain,
               [&](int64_t lo, int64_t hi) { simd::apply_lut_u8(src + lo, out + lo, hi - lo, lut.data()); });
  return dst;
}

Tensor requantize(const Tensor& x, const QuantParamsPtr& qparams) {
  check_u8("requantize", x);
  DBRQ_ENSURE(qparams != nullptr && !qparams->is_per_channel(), ValueError, "requantize: needs per-tensor parameters");
  if (*x.qparams() == *qparams) return x.with_qparams(qparams);
  // quantize(dequantize(q)) for each code. PyTorch's Tensor.dequantize() (what FX's dequantize ->
  // quantize_per_tensor pairs and its non-NHWC quantized cat run) computes (q - zp) * scale
  // without an FMA; with exact ties (e.g. 0.03 -> 0.04) the FMA form rounds the other way.
  Lut lut;
  const float s = x.q_scale(), zp_in = static_cast<float>(x.q_zero_point());
  const float inv = inverse(qparams->scale());
  for (int q = 0; q < 256; ++q) {
    const float v = (static_cast<float>(q) - zp_in) * s;
    // (saturated in float first: a scale ratio beyond int32 must not overflow the conversion)
    lut[q] = saturate_u8(static_cast<int32_t>(std::min(std::max(std::nearbyint(v * inv), -1024.0f), 1024.0f)) +
                         qparams->zero_point());
  }
  return apply_lut(x, lut, qparams);
}

namespace {

template <typename F>
Tensor binary_u8(const char* op, const Tensor& a_in, const Tensor& b_in, const QuantParamsPtr& out, F&& f) {
  check_u8(op, a_in);
  check_u8(op, b_in);
  DBRQ_ENSURE(a_in.sizes() == b_in.sizes(), ShapeError, op, ": int8 operands must have equal sizes, got ",
              a_in.shape_string(), " and ", b_in.shape_string());
  const Tensor a = dense(a_in);
  // Walk both operands in a's memory order.
  Tensor bb = b_in;
  if (bb.strides() != a.strides()) {
    bb = Tensor::empty_strided(a.sizes(), a.strides(), DType::kU8).with_qparams(b_in.qparams_ptr());
    copy_into(bb, b_in);
  }
  Tensor dst = Tensor::empty_strided(a.sizes(), a.strides(), DType::kU8).with_qparams(out);
  const uint8_t* pa = a.raw_data<uint8_t>();
  const uint8_t* pb = bb.raw_data<uint8_t>();
  uint8_t* po = dst.raw_mutable_data<uint8_t>();
  parallel_for(a.numel(), kGrain, [&](int64_t lo, int64_t hi) { f(pa + lo, pb + lo, po + lo, hi - lo); });
  return dst;
}

}  // namespace

Tensor qadd(const Tensor& a, const Tensor& b, const QuantParamsPtr& out, bool relu) {
  check_u8("quantized add", a);
  check_u8("quantized add", b);
  const float sa = a.q_scale(), sb = b.q_scale();
  const float pa = sa * -static_cast<float>(a.q_zero_point()), pb = sb * -static_cast<float>(b.q_zero_point());
  const float inv = inverse(out->scale());
  const int32_t zp = out->zero_point();
  return binary_u8("quantized add", a, b, out, [=](const uint8_t* x, const uint8_t* y, uint8_t* o, int64_t n) {
    simd::qadd_u8(x, y, o, n, sa, pa, sb, pb, relu, inv, zp);
  });
}

Tensor qmul(const Tensor& a, const Tensor& b, const QuantParamsPtr& out, bool relu) {
  check_u8("quantized mul", a);
  check_u8("quantized mul", b);
  const int32_t za = a.q_zero_point(), zb = b.q_zero_point(), zp = out->zero_point();
  const float multiplier = a.q_scale() * b.q_scale() * (1.0f / out->scale());
  return binary_u8("quantized mul", a, b, out, [=](const uint8_t* x, const uint8_t* y, uint8_t* o, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const int32_t c = (static_cast<int32_t>(x[i]) - za) * (static_cast<int32_t>(y[i]) - zb);
      int32_t q = static_cast<int32_t>(std::nearbyint(static_cast<float>(c) * multiplier)) + zp;
      if (relu) q = std::max(q, zp);
      o[i] = saturate_u8(q);
    }
  });
}

namespace {

// Sum of codes over a window of an NCHW-indexed u8 tensor, turned into a rounded mean the way
// PyTorch's quantized average pooling does. PyTorch has two kernels and picks by layout; their
// roundings differ on exact ties (even divisors), so dbrq picks the same way:
//   channels-last input (its NHWC kernel): acc = sum(q) - zp * count, out = round(acc * (1/divisor)) + zp
//   any other layout (its NCHW frame):    out = round(acc * float(1.0 / divisor) + zp)
inline uint8_t avg_code(int32_t acc, float multiplier, int32_t zp) {
  return saturate_u8(static_cast<int32_t>(std::nearbyint(static_cast<float>(acc) * multiplier)) + zp);
}

inline uint8_t avg_code_nchw(int32_t acc, float multiplier, int32_t zp) {
  return saturate_u8(static_cast<int32_t>(std::nearbyint(static_cast<float>(acc) * multiplier + static_cast<float>(zp))));
}

}  // namespace

Tensor qavg_pool2d(const Tensor& x, const Pool2dParams& p) {
  check_u8("quantized avg_pool2d", x);
  const PoolGeometry g = pool2d_geometry("quantized avg_pool2d", x, p);
  Tensor dst = Tensor::empty({g.n, g.c, g.oh, g.ow}, DType::kU8, x.suggest_memory_format()).with_qparams(x.qparams_ptr());
  const uint8_t* src = x.raw_data<uint8_t>();
  uint8_t* out = dst.raw_mutable_data<uint8_t>();
  const int32_t zp = x.q_zero_point();
  const bool nhwc = x.is_channels_last();  // which of PyTorch's two kernels this input would take
  if (nhwc && dst.is_channels_last()) {
    qavg_pool2d_nhwc(src, out, g, p, zp);  // vectorized over channels (int8_pool.cc)
    return dst;
  }
  const int64_t sn = x.stride(0), sc = x.stride(1), sh = x.stride(2), sw = x.stride(3);
  const int64_t dn = dst.stride(0), dc = dst.stride(1), dh = dst.stride(2), dw = dst.stride(3);
  parallel_for(g.n * g.oh, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t nh = lo; nh < hi; ++nh) {
      const int64_t b = nh / g.oh, oh = nh % g.oh;
      for (int64_t ow = 0; ow < g.ow; ++ow) {
        const AvgPoolWindow win = avg_pool_window(g, p, oh, ow);
        const int64_t h0 = win.h0, h1 = win.h1, w0 = win.w0, w1 = win.w1, count = win.count;
        const float multiplier = win.multiplier;
        for (int64_t c = 0; c < g.c; ++c) {
          int32_t acc = -zp * static_cast<int32_t>(count);
          for (int64_t y = h0; y < h1; ++y) {
            for (int64_t z = w0; z < w1; ++z) acc += src[b * sn + c * sc + y * sh + z * sw];
          }
          out[b * dn + c * dc + oh * dh + ow * dw] =
              nhwc ? avg_code(acc, multiplier, zp) : avg_code_nchw(acc, multiplier, zp);
        }
      }
    }
  });
  return dst;
}

Tensor qadaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> os) {
  check_u8("quantized adaptive_avg_pool2d", x);
  DBRQ_ENSURE(x.dim() == 4, ShapeError, "quantized adaptive_avg_pool2d: input must be 4-D, got ", x.shape_string());
  DBRQ_ENSURE(os[0] >= 1 && os[1] >= 1, ValueError, "adaptive_avg_pool2d: output_size must be >= 1");
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  Tensor dst = Tensor::empty({n, c, os[0], os[1]}, DType::kU8, x.suggest_memory_format()).with_qparams(x.qparams_ptr());
  const uint8_t* src = x.raw_data<uint8_t>();
  uint8_t* out = dst.raw_mutable_data<uint8_t>();
  const int32_t zp = x.q_zero_point();
  // PyTorch's NHWC kernel rounds the zero-point-free mean and adds zp back; its NCHW frame rounds
  // the mean of the raw codes (the output shares the input's parameters). They differ on ties.
  const bool nhwc = x.is_channels_last();
  const int64_t sn = x.stride(0), sc = x.stride(1), sh = x.stride(2), sw = x.stride(3);
  const int64_t dn = dst.stride(0), dc = dst.stride(1), dh = dst.stride(2), dw = dst.stride(3);
  parallel_for(n * os[0], 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<int32_t> acc;  // grow-only per worker: no allocation per call
    acc.resize(static_cast<size_t>(c));
    for (int64_t nh = lo; nh < hi; ++nh) {
      const int64_t b = nh / os[0], i = nh % os[0];
      const int64_t h0 = (i * h) / os[0], h1 = ((i + 1) * h + os[0] - 1) / os[0];
      for (int64_t j = 0; j < os[1]; ++j) {
        const int64_t w0 = (j * w) / os[1], w1 = ((j + 1) * w + os[1] - 1) / os[1];
        const int64_t count = (h1 - h0) * (w1 - w0);
        // NHWC: 1 / (kh * kw); NCHW: (1 / kh) / kw. Both in float; they differ for some windows (6 x 41).
        const float multiplier = nhwc ? 1.0f / static_cast<float>(count)
                                      : 1.0f / static_cast<float>(h1 - h0) / static_cast<float>(w1 - w0);
        // Sums per channel, walking the window pixel by pixel (channels innermost: contiguous in NHWC).
        std::fill(acc.begin(), acc.end(), nhwc ? -zp * static_cast<int32_t>(count) : 0);
        if (sc == 1) {
          // The whole window in one call (AVX-512 chosen at run time, sums kept in registers).
          simd::window_sum_u8(src + b * sn + h0 * sh + w0 * sw, h1 - h0, w1 - w0, sh, sw, acc.data(), c);
        } else {
          for (int64_t y = h0; y < h1; ++y) {
            for (int64_t z = w0; z < w1; ++z) {
              const uint8_t* px = src + b * sn + y * sh + z * sw;
              for (int64_t ch = 0; ch < c; ++ch) acc[static_cast<size_t>(ch)] += px[ch * sc];
            }
          }
        }
        uint8_t* o = out + b * dn + i * dh + j * dw;
        if (dc == 1) {
          simd::average_u8(acc.data(), o, c, multiplier, nhwc ? zp : 0);
        } else {
          for (int64_t ch = 0; ch < c; ++ch) {
            o[ch * dc] = avg_code(acc[static_cast<size_t>(ch)], multiplier, nhwc ? zp : 0);
          }
        }
      }
    }
  });
  return dst;
}

Tensor qmean(const Tensor& x, IntArrayRef dims, bool keepdim) {
  check_u8("quantized mean", x);
  // Mean of real values, requantized with the input's own parameters (the output shares them).
  Tensor real = dequantize(x);
  Tensor m = mean(real, dims, keepdim);
  return quantize_to(m, x.qparams_ptr(), DType::kU8, MemoryFormat::kPreserve);
}

Tensor qclamp(const Tensor& x, double lo, double hi) {
  check_u8("quantized clamp", x);
  const float s = x.q_scale();
  const int32_t zp = x.q_zero_point();
  // Saturated before the integer conversion: a finite bound beyond the codes (clamp(x, 0, 1e10),
  // FLT_MAX as "no bound") overflowed int32 (undefined; INT_MIN on x86, so every code became 0).
  auto code = [&](double v) -> int32_t {
    const float r = std::nearbyint(static_cast<float>(v) * (1.0f / s));  // +-inf beyond float's range
    if (!(r > -1024.0f)) return 0;                                      // (and NaN: no bound)
    if (!(r < 1024.0f)) return 255;
    return std::min(std::max(static_cast<int32_t>(r) + zp, 0), 255);
  };
  const int32_t qlo = code(lo), qhi = code(hi);
  Lut lut;
  for (int q = 0; q < 256; ++q) lut[q] = static_cast<uint8_t>(std::min(std::max(q, qlo), qhi));
  return apply_lut(x, lut, x.qparams_ptr());
}

Tensor qsoftmax(const Tensor& x, int64_t dim, const QuantParamsPtr& out) {
  check_u8("quantized softmax", x);
  Tensor real = dequantize(x);
  Tensor y = softmax(real, dim, false);
  return quantize_to(y, out, DType::kU8, MemoryFormat::kPreserve);
}

QPReLU::QPReLU(QWeightedOptions options) : o_(std::move(options)) {
  check_float("prelu", "weight", o_.weight);
  DBRQ_ENSURE(o_.weight.dim() <= 1 && o_.weight.numel() >= 1, ShapeError, "int8 prelu: weight must be 1-D, got sizes ",
              o_.weight.shape_string());
  DBRQ_ENSURE(o_.weight_qparams != nullptr && o_.src_qparams != nullptr && o_.dst_qparams != nullptr, ValueError,
              "int8 prelu: needs weight, input and output quantization parameters");
  DBRQ_ENSURE(!o_.src_qparams->is_per_channel() && !o_.dst_qparams->is_per_channel(), ValueError,
              "int8 prelu: input and output parameters must be per-tensor");
  for (int32_t zp : o_.weight_qparams->zero_points) {
    DBRQ_ENSURE(zp == 0, ValueError, "int8 prelu: weights must be symmetric (zero point 0), got zero point ", zp);
  }
  const Tensor w1 = o_.weight.dim() == 1 ? o_.weight : o_.weight.raw_as_strided({1}, {1}, o_.weight.storage_offset());
  qweight_ = quantize(w1, o_.weight_qparams, DType::kS8);
  const float i_s = o_.src_qparams->scale(), o_inv = 1.0f / o_.dst_qparams->scale();
  const int32_t i_zp = o_.src_qparams->zero_point(), o_zp = o_.dst_qparams->zero_point();
  const float pos = i_s * o_inv;
  const int64_t n = qweight_.numel();
  tables_.resize(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) {
    const bool pc = o_.weight_qparams->is_per_channel();
    const float w_s = pc ? o_.weight_qparams->scales[c] : o_.weight_qparams->scale();
    const int32_t qw = qweight_.raw_data<int8_t>()[c];
    const float neg = i_s * w_s * o_inv;  // PyTorch's multiplier, in its order
    for (int q = 0; q < 256; ++q) {
      const int32_t d = q - i_zp;
      const float y = d > 0 ? static_cast<float>(d) * pos : static_cast<float>(d * qw) * neg;
      const float r = std::nearbyint(y) + static_cast<float>(o_zp);
      tables_[c][q] = static_cast<uint8_t>(std::min(std::max(r, 0.f), 255.f));
    }
  }
}

Tensor QPReLU::run(const Tensor& x_in, const Tensor*, const Tensor*) const {
  check_u8("int8 prelu", x_in);
  const int64_t channels = x_in.dim() >= 2 ? x_in.size(1) : 1;
  const int64_t n = static_cast<int64_t>(tables_.size());
  DBRQ_ENSURE(n == 1 || n == channels, ShapeError, "prelu: weight has ", n, " elements but the input has ", channels,
              " channels (dim 1 of ", x_in.shape_string(), "); it needs 1 or ", channels);
  if (n == 1) return apply_lut(x_in, tables_[0], o_.dst_qparams);
  // Row-major or 4-D channels-last memory only, as the fp32 prelu.
  const Tensor x = x_in.dim() == 4 && x_in.is_channels_last() ? x_in : contiguous(x_in);
  Tensor dst = Tensor::empty_like(x, DType::kU8).with_qparams(o_.dst_qparams);
  const uint8_t* in = x.raw_data<uint8_t>();
  uint8_t* out = dst.raw_mutable_data<uint8_t>();
  const bool cl = x.dim() == 4 && !x.is_contiguous() && x.is_channels_last();
  int64_t inner = 1;
  for (int64_t d = 2; d < x.dim(); ++d) inner *= x.size(d);
  parallel_for(x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t c = cl ? i % channels : (i / inner) % channels;
      out[i] = tables_[static_cast<size_t>(c)][in[i]];
    }
  });
  return dst;
}

Tensor QPReLU::empty_output(const Tensor& x) const {
  return Tensor::empty_like(x, DType::kU8).with_qparams(o_.dst_qparams);
}

std::string QPReLU::describe() const {
  return absl::StrCat("int8 prelu (", tables_.size(), tables_.size() == 1 ? " table" : " per-channel tables", ")");
}

}  // namespace dbrq::kernels
