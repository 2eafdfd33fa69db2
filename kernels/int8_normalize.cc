// Int8 layer / group / instance norm on u8 codes, with PyTorch 1.13's quantized_normalize_kernel
// arithmetic (kernels/int8.h states it). Two passes per normalized row: exact integer sums of q and
// q*q (the statistics), then one f32 expression per element, quantized. The AVX-512 loop and the
// portable loop evaluate the same f32 operations in the same order (no FMA: the build is ISO C++,
// so GCC does not contract), hence bit-identical (tests/kernels/int8_normalize_test.cc).
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "kernels/loops.h"
#include "kernels/simd.h"

namespace dbrq::kernels {
namespace {

// Per row: what the second pass needs.
struct RowStats {
  float mean;   // mean(q) - in_zp: mean of the real values / in_scale
  float scale;  // in_scale / sqrt(var(real) + eps)
};

// Output constants.
struct OutK {
  float inv;     // 1 / out_scale, in f32 as PyTorch's quantize
  float lo, hi;  // -out_zp, 255 - out_zp: the clamp before rounding
  int32_t zp;
};

inline uint8_t quantize_code(float y, const OutK& k) {
  float r = y * k.inv;
  r = r > k.lo ? r : k.lo;  // NaN becomes lo, as _mm512_max_ps(r, lo) does
  r = r < k.hi ? r : k.hi;
  return static_cast<uint8_t>(static_cast<int32_t>(std::nearbyint(r)) + k.zp);
}

void sums_portable(const uint8_t* x, int64_t n, int64_t* sum, int64_t* sum_sq) {
  int64_t s = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = x[i];
    s += v;
    s2 += v * v;
  }
  *sum = s;
  *sum_sq = s2;
}

#ifdef DBRQ_AVX512
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// Sums of q and q*q over whole 32-code blocks; returns where it stopped. 32-bit lanes take at
// most 2 * 255^2 per block and are flushed to 64 bits every 4096 blocks (at most 5.3e8 per lane).
DBRQ_TARGET_AVX512 int64_t sums_avx512(const uint8_t* x, int64_t n, int64_t* sum, int64_t* sum_sq) {
  int64_t i = 0, s = 0, s2 = 0;
  const __m512i zero = _mm512_setzero_si512();
  while (i + 32 <= n) {
    __m512i acc_sq = _mm512_setzero_si512();
    __m512i acc = _mm512_setzero_si512();
    for (int blocks = 0; blocks < 4096 && i + 32 <= n; ++blocks, i += 32) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
      const __m512i w = _mm512_cvtepu8_epi16(raw);
      acc_sq = _mm512_add_epi32(acc_sq, _mm512_madd_epi16(w, w));
      acc = _mm512_add_epi64(acc, _mm512_sad_epu8(_mm512_zextsi256_si512(raw), zero));
    }
    // 16 lanes of up to 5.3e8 overflow a 32-bit total: add them in 64 bits.
    s2 += _mm512_reduce_add_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(acc_sq))) +
          _mm512_reduce_add_epi64(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(acc_sq, 1)));
    // Lanes 4..7 sum the zero upper half.
    s += _mm512_reduce_add_epi64(acc);
  }
  *sum = s;
  *sum_sq = s2;
  return i;
}

DBRQ_TARGET_AVX512 inline __m512 centered16(const uint8_t* x, __m512 in_zp, __m512 mean) {
  const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
  return _mm512_sub_ps(_mm512_sub_ps(q, in_zp), mean);
}

DBRQ_TARGET_AVX512 inline void store16(uint8_t* out, __m512 y, const OutK& k) {
  __m512 r = _mm512_mul_ps(y, _mm512_set1_ps(k.inv));
  r = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(k.lo)), _mm512_set1_ps(k.hi));
  const __m512i q =
      _mm512_add_epi32(_mm512_cvt_roundps_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), _mm512_set1_epi32(k.zp));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtusepi32_epi8(q));
}

// Layer norm: ((q - zp - mean) * s) * gamma[i] + beta[i].
DBRQ_TARGET_AVX512 int64_t layer_row_avx512(const uint8_t* x, uint8_t* y, int64_t n, float in_zp, RowStats st,
                                            const float* gamma, const float* beta, const OutK& k) {
  int64_t i = 0;
  const __m512 vzp = _mm512_set1_ps(in_zp), vmean = _mm512_set1_ps(st.mean), vs = _mm512_set1_ps(st.scale);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_mul_ps(centered16(x + i, vzp, vmean), vs);
    store16(y + i, _mm512_add_ps(_mm512_mul_ps(v, _mm512_loadu_ps(gamma + i)), _mm512_loadu_ps(beta + i)), k);
  }
  return i;
}

// Group norm, one channel: (q - zp - mean) * g + b.
DBRQ_TARGET_AVX512 int64_t channel_avx512(const uint8_t* x, uint8_t* y, int64_t n, float in_zp, float mean, float g,
                                          float b, const OutK& k) {
  int64_t i = 0;
  const __m512 vzp = _mm512_set1_ps(in_zp), vmean = _mm512_set1_ps(mean), vg = _mm512_set1_ps(g),
               vb = _mm512_set1_ps(b);
  for (; i + 16 <= n; i += 16) store16(y + i, _mm512_add_ps(_mm512_mul_ps(centered16(x + i, vzp, vmean), vg), vb), k);
  return i;
}
#pragma GCC diagnostic pop
#endif

RowStats row_stats(const uint8_t* x, int64_t n, int32_t in_zp, float in_scale, double eps) {
  int64_t sum = 0, sum_sq = 0, i = 0;
#ifdef DBRQ_AVX512
  if (simd::use_avx512()) i = sums_avx512(x, n, &sum, &sum_sq);
#endif
  int64_t s = 0, s2 = 0;
  sums_portable(x + i, n - i, &s, &s2);
  sum += s;
  sum_sq += s2;
  // As PyTorch: f32 mean and variance of the codes, clamped at 0; sqrt of (f32 + eps) in double.
  const float fn = static_cast<float>(n);
  const float mean_shifted = static_cast<float>(sum) / fn;
  const float mean = mean_shifted - static_cast<float>(in_zp);
  const float var = std::max(static_cast<float>(sum_sq) / fn - mean_shifted * mean_shifted, 0.0f);
  const float var_real = var * in_scale * in_scale;
  const float s_div_std = static_cast<float>(in_scale / std::sqrt(static_cast<double>(var_real) + eps));
  return RowStats{mean, s_div_std};
}

void layer_row(const uint8_t* x, uint8_t* y, int64_t n, float in_zp, RowStats st, const float* gamma,
               const float* beta, const OutK& k) {
  int64_t i = 0;
#ifdef DBRQ_AVX512
  if (simd::use_avx512()) i = layer_row_avx512(x, y, n, in_zp, st, gamma, beta, k);
#endif
  for (; i < n; ++i) {
    const float v = ((static_cast<float>(x[i]) - in_zp) - st.mean) * st.scale;
    y[i] = quantize_code(v * gamma[i] + beta[i], k);
  }
}

void channel_row(const uint8_t* x, uint8_t* y, int64_t n, float in_zp, float mean, float g, float b, const OutK& k) {
  int64_t i = 0;
#ifdef DBRQ_AVX512
  if (simd::use_avx512()) i = channel_avx512(x, y, n, in_zp, mean, g, b, k);
#endif
  for (; i < n; ++i) y[i] = quantize_code(((static_cast<float>(x[i]) - in_zp) - mean) * g + b, k);
}

void check_input(const char* op, const Tensor& x) {
  DBRQ_ENSURE(x.defined() && x.dtype() == DType::kU8 && x.is_quantized() && !x.qparams()->is_per_channel(),
              DTypeError, "quantized ", op, ": needs a per-tensor quantized u8 input, got ",
              x.defined() ? dtype_name(x.dtype()) : "undefined",
              x.defined() && x.dtype() == DType::kU8 && !x.is_quantized() ? " (not quantized)" : "",
              x.defined() && x.is_quantized() && x.qparams()->is_per_channel() ? " (per-channel)" : "");
}

OutK out_constants(const char* op, const QuantParamsPtr& out, double eps) {
  DBRQ_ENSURE(out != nullptr && !out->is_per_channel(), ValueError, "quantized ", op,
              ": needs per-tensor output parameters");
  const float s = out->scale();
  const int32_t zp = out->zero_point();
  DBRQ_ENSURE(s > 0 && std::isfinite(s) && zp >= 0 && zp <= 255, ValueError, "quantized ", op,
              ": output scale must be positive and finite and the zero point in [0, 255] (u8), got ",
              out->to_string());
  DBRQ_ENSURE(std::isfinite(eps) && eps >= 0.0, ValueError, "quantized ", op, ": eps must be finite and >= 0, got ",
              eps);
  return OutK{1.0f / s, static_cast<float>(-zp), static_cast<float>(255 - zp), zp};
}

// A 1-D float parameter (a norm's weight or bias) as a pointer: the tensor's own memory when it is
// contiguous (no copy per call: a decoder step runs 9 layer norms), else a copy; `fill` repeated
// when it is undefined.
class FloatParam {
 public:
  FloatParam(const Tensor& t, int64_t n, float fill) {
    if (t.defined() && t.dtype() == DType::kF32 && t.is_contiguous()) {
      kept_ = t;
      ptr_ = t.raw_data<float>();
    } else {
      copy_ = t.defined() ? t.to_vector<float>() : std::vector<float>(static_cast<size_t>(n), fill);
      ptr_ = copy_.data();
    }
  }
  const float* data() const { return ptr_; }
  float operator[](size_t i) const { return ptr_[i]; }

 private:
  Tensor kept_;
  std::vector<float> copy_;
  const float* ptr_ = nullptr;
};

// x as row-major codes (a copy when it is not), keeping its parameters.
Tensor row_major(const Tensor& x) {
  return x.is_contiguous() ? x : contiguous(x).with_qparams(x.qparams_ptr());
}

}  // namespace

Tensor qlayer_norm(const Tensor& x_in, IntArrayRef normalized_shape, const Tensor& weight, const Tensor& bias,
                   double eps, const QuantParamsPtr& out) {
  check_input("layer_norm", x_in);
  const int64_t nd = static_cast<int64_t>(normalized_shape.size());
  DBRQ_ENSURE(nd >= 1 && nd <= x_in.dim(), ShapeError, "quantized layer_norm: normalized_shape ",
              shape_to_string(normalized_shape), " does not fit input sizes ", x_in.shape_string());
  int64_t n = 1;
  for (int64_t i = 0; i < nd; ++i) {
    DBRQ_ENSURE(x_in.size(x_in.dim() - nd + i) == normalized_shape[i], ShapeError,
                "quantized layer_norm: input sizes ", x_in.shape_string(), " do not end with normalized_shape ",
                shape_to_string(normalized_shape));
    n *= normalized_shape[i];
  }
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    const char* name = t == &weight ? "weight" : "bias";
    check_float("quantized layer_norm", name, *t);
    DBRQ_ENSURE(t->sizes() == normalized_shape, ShapeError, "quantized layer_norm: ", name, " must have sizes ",
                shape_to_string(normalized_shape), ", got ", t->shape_string());
  }
  const OutK k = out_constants("layer_norm", out, eps);
  const Tensor x = row_major(x_in);
  Tensor y = Tensor::empty(x.sizes(), DType::kU8).with_qparams(out);
  if (x.numel() == 0) return y;
  const FloatParam g(weight, n, 1.f), b(bias, n, 0.f);
  const float in_scale = x.qparams()->scale();
  const int32_t in_zp = x.qparams()->zero_point();
  const uint8_t* src = x.raw_data<uint8_t>();
  uint8_t* dst = static_cast<uint8_t*>(y.mutable_data_ptr());
  const int64_t m = x.numel() / n;
  parallel_for(m, std::max<int64_t>(1, (1 << 14) / n), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const RowStats st = row_stats(src + r * n, n, in_zp, in_scale, eps);
      layer_row(src + r * n, dst + r * n, n, static_cast<float>(in_zp), st, g.data(), b.data(), k);
    }
  });
  return y;
}

Tensor qgroup_norm(const char* op, const Tensor& x_in, int64_t num_groups, const Tensor& weight, const Tensor& bias,
                   double eps, const QuantParamsPtr& out) {
  check_input(op, x_in);
  DBRQ_ENSURE(x_in.dim() >= 2, ShapeError, "quantized ", op, ": input must have at least 2 dims (N, C, *), got sizes ",
              x_in.shape_string());
  const int64_t c = x_in.size(1);
  DBRQ_ENSURE(num_groups >= 1, ValueError, "quantized ", op, ": num_groups must be >= 1, got ", num_groups);
  DBRQ_ENSURE(c % num_groups == 0, ShapeError, "quantized ", op, ": ", c, " channels are not divisible into ",
              num_groups, " groups (input sizes ", x_in.shape_string(), ")");
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    const char* name = t == &weight ? "weight" : "bias";
    const std::string where = absl::StrCat("quantized ", op);
    check_float(where.c_str(), name, *t);
    DBRQ_ENSURE(t->dim() == 1 && t->size(0) == c, ShapeError, "quantized ", op, ": ", name, " must have sizes [", c,
                "], got ", t->shape_string());
  }
  const OutK k = out_constants(op, out, eps);
  const bool channels_last = x_in.dim() == 4 && x_in.is_channels_last() && !x_in.is_contiguous();
  const Tensor x = row_major(x_in);
  Tensor y = Tensor::empty(x.sizes(), DType::kU8).with_qparams(out);
  if (x.numel() == 0) return y;
  const int64_t batch = x.size(0), per_channel = x.numel() / (batch * c), cg = c / num_groups;
  const int64_t per_group = cg * per_channel;
  const FloatParam g(weight, c, 1.f), b(bias, c, 0.f);
  const float in_scale = x.qparams()->scale();
  const int32_t in_zp = x.qparams()->zero_point();
  const uint8_t* src = x.raw_data<uint8_t>();
  uint8_t* dst = static_cast<uint8_t*>(y.mutable_data_ptr());
  parallel_for(batch * num_groups, std::max<int64_t>(1, (1 << 14) / per_group), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const uint8_t* s = src + r * per_group;
      uint8_t* d = dst + r * per_group;
      const RowStats st = row_stats(s, per_group, in_zp, in_scale, eps);
      for (int64_t ci = 0; ci < cg; ++ci) {
        const size_t ch = static_cast<size_t>((r * cg + ci) % c);
        channel_row(s + ci * per_channel, d + ci * per_channel, per_channel, static_cast<float>(in_zp), st.mean,
                    st.scale * g[ch], b[ch], k);
      }
    }
  });
  return channels_last ? contiguous(y, MemoryFormat::kChannelsLast).with_qparams(out) : y;
}

}  // namespace dbrq::kernels
