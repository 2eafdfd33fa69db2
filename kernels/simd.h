// Vectorized inner loops for u8 quantization arithmetic. Every vector path computes exactly what
// its scalar twin does: multiply in f32, clamp in f32 (so huge values and NaN saturate instead of
// overflowing), round half to even.
//
// The default build (x86-64-v2, .bazelrc; --config=native is -march=native) must not assume AVX-512, so the
// AVX-512 loops are compiled with a target attribute in every build and chosen at run time: once
// per process, from the CPU (AVX512F + AVX512BW, and the OS saving the AVX-512 state:
// kernels/cpu_features.h), unless DBRQ_PORTABLE_KERNELS=1 is set or a test
// forces the portable loops (force_portable). The result is bit-identical either way
// (tests/kernels/simd_dispatch_test). oneDNN dispatches its own JIT code. Internal to kernels/.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "kernels/cpu_features.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define DBRQ_AVX512 1
#define DBRQ_TARGET_AVX512 __attribute__((target("avx512f,avx512bw")))
#endif

namespace dbrq::kernels::simd {

// Whether the CPU runs the AVX-512 loops (AVX512F and AVX512BW, with the OS's AVX-512 state
// enabled), detected once (kernels/cpu_features.h).
inline bool cpu_has_avx512() {
#ifdef DBRQ_AVX512
  return cpu_features().avx512;
#else
  return false;
#endif
}

// Tests (and DBRQ_PORTABLE_KERNELS=1) take the portable loops on any CPU.
inline std::atomic<bool>& portable_forced() {
  static std::atomic<bool> forced{[] {
    const char* v = std::getenv("DBRQ_PORTABLE_KERNELS");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }()};
  return forced;
}
inline void force_portable(bool on) { portable_forced().store(on, std::memory_order_relaxed); }

inline bool use_avx512() { return cpu_has_avx512() && !portable_forced().load(std::memory_order_relaxed); }

// The name of the loops in use: "avx512" or "portable".
inline const char* isa_name() { return use_avx512() ? "avx512" : "portable"; }

// u8 code of real value v: clamp(round(v * inv) + zp, 0, 255).
inline uint8_t quantize_one(float v, float inv, int32_t zp) {
  const float lo = static_cast<float>(-zp), hi = static_cast<float>(255 - zp);
  float r = v * inv;
  r = r > lo ? r : lo;  // NaN becomes lo, as _mm512_max_ps(r, lo) does
  r = r < hi ? r : hi;
  return static_cast<uint8_t>(static_cast<int32_t>(std::nearbyint(r)) + zp);
}

#ifdef DBRQ_AVX512
// The AVX-512 loops: each handles a prefix of whole vectors and returns where it stopped; the
// portable loop finishes from there. (GCC 12 reports its own intrinsics' deliberately undefined
// pass-through operands (`__m512 __Y = __Y`) as maybe uninitialized under a target attribute.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
namespace avx512 {

DBRQ_TARGET_AVX512 inline int64_t quantize_u8(const float* in, uint8_t* out, int64_t n, float inv, int32_t zp) {
  int64_t i = 0;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512 lo = _mm512_set1_ps(static_cast<float>(-zp)), hi = _mm512_set1_ps(static_cast<float>(255 - zp));
  const __m512i vzp = _mm512_set1_epi32(zp);
  for (; i + 16 <= n; i += 16) {
    // min/max take the bound when the value is NaN, like the scalar std::min/std::max order.
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(in + i), vinv);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vzp);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtusepi32_epi8(q));
  }
  return i;
}

DBRQ_TARGET_AVX512 inline int64_t dequantize_u8(const uint8_t* in, float* out, int64_t n, float scale, float fzp) {
  int64_t i = 0;
  const __m512 vs = _mm512_set1_ps(scale), vz = _mm512_set1_ps(fzp);
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_sub_ps(v, vz), vs));
  }
  return i;
}

DBRQ_TARGET_AVX512 inline int64_t shift_u8_to_s8(const uint8_t* in, int8_t* out, int64_t n) {
  int64_t i = 0;
  const __m512i top = _mm512_set1_epi8(static_cast<char>(0x80));
  for (; i + 64 <= n; i += 64) {
    _mm512_storeu_si512(out + i, _mm512_xor_si512(_mm512_loadu_si512(in + i), top));
  }
  return i;
}

DBRQ_TARGET_AVX512 inline int64_t dot_s16_u8(const int16_t* a, const uint8_t* b, int64_t n, int32_t b_zp,
                                              int32_t* sum) {
  int64_t i = 0;
  const __m512i vzp = _mm512_set1_epi16(static_cast<int16_t>(b_zp));
  __m512i acc = _mm512_setzero_si512();
  for (; i + 32 <= n; i += 32) {
    const __m512i vb = _mm512_sub_epi16(
        _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i))), vzp);
    acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_loadu_si512(a + i), vb));
  }
  *sum = _mm512_reduce_add_epi32(acc);
  return i;
}

DBRQ_TARGET_AVX512 inline int64_t qadd_u8(const uint8_t* a, const uint8_t* b, uint8_t* out, int64_t n, float sa,
                                           float pa, float sb, float pb, bool relu, float inv, int32_t zp) {
  int64_t i = 0;
  const __m512 vsa = _mm512_set1_ps(sa), vpa = _mm512_set1_ps(pa), vsb = _mm512_set1_ps(sb), vpb = _mm512_set1_ps(pb);
  const __m512 vinv = _mm512_set1_ps(inv), zero = _mm512_setzero_ps();
  const __m512 lo = _mm512_set1_ps(static_cast<float>(-zp)), hi = _mm512_set1_ps(static_cast<float>(255 - zp));
  const __m512i vzp = _mm512_set1_epi32(zp);
  for (; i + 16 <= n; i += 16) {
    __m512 fa = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))));
    __m512 fb = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i))));
    __m512 c = _mm512_add_ps(_mm512_fmadd_ps(vsa, fa, vpa), _mm512_fmadd_ps(vsb, fb, vpb));
    if (relu) c = _mm512_max_ps(c, zero);
    c = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(c, vinv), lo), hi);
    __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vzp);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtusepi32_epi8(q));
  }
  return i;
}

DBRQ_TARGET_AVX512 inline int64_t accumulate_u8(const uint8_t* in, int32_t* acc, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm512_storeu_si512(acc + i, _mm512_add_epi32(_mm512_loadu_si512(acc + i), v));
  }
  return i;
}

// out[i] = min(hi, max(lo, in[i])) with the second operand's value when unordered or equal (the
// instructions' own rule): NaN stays NaN and -0 stays -0, as PyTorch's clamp and relu.
DBRQ_TARGET_AVX512 inline int64_t clamp_f32(const float* in, float* out, int64_t n, float lo, float hi) {
  int64_t i = 0;
  const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, _mm512_min_ps(vhi, _mm512_max_ps(vlo, _mm512_loadu_ps(in + i))));
  }
  return i;
}

// Whether in[0, n) holds a NaN, for whole vectors of 16; *found is set when one does.
DBRQ_TARGET_AVX512 inline int64_t any_nan(const float* in, int64_t n, bool* found) {
  int64_t i = 0;
  __mmask16 m = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(in + i);
    m |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  *found = m != 0;
  return i;
}

// Running min and max of the finite values of in[0, n) (non-finite ones count as 0), folded into
// *mn and *mx. The exponent test is AVX512F (fpclass would need DQ).
DBRQ_TARGET_AVX512 inline int64_t minmax_finite(const float* in, int64_t n, float* mn, float* mx) {
  int64_t i = 0;
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  __m512 vmn = _mm512_set1_ps(*mn), vmx = _mm512_set1_ps(*mx);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(in + i);
    const __mmask16 finite =
        _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), exp_mask), exp_mask);
    const __m512 f = _mm512_maskz_mov_ps(finite, v);
    vmn = _mm512_min_ps(vmn, f);
    vmx = _mm512_max_ps(vmx, f);
  }
  *mn = _mm512_reduce_min_ps(vmn);
  *mx = _mm512_reduce_max_ps(vmx);
  return i;
}

// acc[ch] += sum over a rows x cols window of u8 pixels (pixel (r, c) at base + r * row_stride +
// c * col_stride, channels contiguous), for whole vectors of 16 channels: each block of sums stays
// in a register over the window.
DBRQ_TARGET_AVX512 inline int64_t window_sum_u8(const uint8_t* base, int64_t rows, int64_t cols, int64_t row_stride,
                                                 int64_t col_stride, int32_t* acc, int64_t c) {
  int64_t ch = 0;
  for (; ch + 16 <= c; ch += 16) {
    __m512i a = _mm512_loadu_si512(acc + ch);
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* px = base + r * row_stride + ch;
      for (int64_t q = 0; q < cols; ++q, px += col_stride) {
        a = _mm512_add_epi32(a, _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(px))));
      }
    }
    _mm512_storeu_si512(acc + ch, a);
  }
  return ch;
}

// out[i] = clamp(round(acc[i] * multiplier) + zp, 0, 255)
DBRQ_TARGET_AVX512 inline int64_t average_u8(const int32_t* acc, uint8_t* out, int64_t n, float multiplier,
                                              int32_t zp) {
  int64_t i = 0;
  const __m512 vm = _mm512_set1_ps(multiplier);
  const __m512i vzp = _mm512_set1_epi32(zp), zero = _mm512_setzero_si512(), top = _mm512_set1_epi32(255);
  for (; i + 16 <= n; i += 16) {
    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(acc + i)), vm);
    __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vzp);
    q = _mm512_min_epi32(_mm512_max_epi32(q, zero), top);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(q));
  }
  return i;
}

// dst[c * 16 + r] = src[r * ld + c] for r, c < 16: a 16x16 tile transposed in registers
// (interleave pairs of rows, then pairs of pairs, then gather the 128-bit lanes).
DBRQ_TARGET_AVX512 inline void transpose16(const float* src, int64_t ld, float* dst) {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = _mm512_loadu_ps(src + (2 * i) * ld), b = _mm512_loadu_ps(src + (2 * i + 1) * ld);
    t[2 * i] = _mm512_unpacklo_ps(a, b);  // per 128-bit lane q: a[4q] b[4q] a[4q+1] b[4q+1]
    t[2 * i + 1] = _mm512_unpackhi_ps(a, b);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + c], lane q: column 4q + c of rows 4i .. 4i+3
    const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
    const __m512 e = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), f = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    _mm512_storeu_ps(dst + c * 16, _mm512_shuffle_f32x4(a, e, 0x88));
    _mm512_storeu_ps(dst + (c + 8) * 16, _mm512_shuffle_f32x4(a, e, 0xDD));
    _mm512_storeu_ps(dst + (c + 4) * 16, _mm512_shuffle_f32x4(b, f, 0x88));
    _mm512_storeu_ps(dst + (c + 12) * 16, _mm512_shuffle_f32x4(b, f, 0xDD));
  }
}

// Sixteen output features of a linear layer summed in PyTorch's reference order (see
// dot16_unfused below): out[i * ldo + jj] = sum over l = 0..k-1, in order, of x[i * k + l] *
// w[jj * k + l], each product rounded before its add, for i < m and jj < 16. `panel` (k * 16
// floats) receives w's sixteen rows transposed (16x16 tiles in registers, a gather per column of
// the last partial tile), so each of the m rows then runs k vector steps.
DBRQ_TARGET_AVX512 __attribute__((optimize("-ffp-contract=off"))) inline void dot16_unfused(
    const float* x, int64_t m, int64_t k, const float* w, float* panel, float* out, int64_t ldo) {
  int64_t l = 0;
  for (; l + 16 <= k; l += 16) transpose16(w + l, k, panel + l * 16);
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(static_cast<int32_t>(k)));
  for (; l < k; ++l) _mm512_storeu_ps(panel + l * 16, _mm512_i32gather_ps(idx, w + l, 4));
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {  // four rows share each panel load
    const float *x0 = x + i * k, *x1 = x0 + k, *x2 = x1 + k, *x3 = x2 + k;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t l = 0; l < k; ++l) {
      const __m512 p = _mm512_loadu_ps(panel + l * 16);
      a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_set1_ps(x0[l]), p));
      a1 = _mm512_add_ps(a1, _mm512_mul_ps(_mm512_set1_ps(x1[l]), p));
      a2 = _mm512_add_ps(a2, _mm512_mul_ps(_mm512_set1_ps(x2[l]), p));
      a3 = _mm512_add_ps(a3, _mm512_mul_ps(_mm512_set1_ps(x3[l]), p));
    }
    _mm512_storeu_ps(out + i * ldo, a0);
    _mm512_storeu_ps(out + (i + 1) * ldo, a1);
    _mm512_storeu_ps(out + (i + 2) * ldo, a2);
    _mm512_storeu_ps(out + (i + 3) * ldo, a3);
  }
  for (; i < m; ++i) {
    const float* xi = x + i * k;
    __m512 a = _mm512_setzero_ps();
    for (int64_t l = 0; l < k; ++l) a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_set1_ps(xi[l]), _mm512_loadu_ps(panel + l * 16)));
    _mm512_storeu_ps(out + i * ldo, a);
  }
}

}  // namespace avx512
#pragma GCC diagnostic pop
#endif

// out[i] = quantize_one(in[i], inv, zp)
inline void quantize_u8(const float* in, uint8_t* out, int64_t n, float inv, int32_t zp) {
  int64_t i = 0;
#ifdef DBRQ_AVX512
  if (use_avx512()) i = avx512::quantize_u8(in, out, n, inv, zp);
#endif
  for (; i < n; ++i) out[i] = quantize_one(in[i], inv, zp);
}

// out[i] = in[i] clamped to [lo, hi] as PyTorch's clamp (relu: lo 0, hi +inf): NaN stays NaN,
// -0 stays -0 (x < lo only when strictly below; in place when out == in).
inline void clamp_f32(const float* in, float* out, int64_t n, float lo, float hi) {
  int64_t i = 0;
#ifdef DBRQ_AVX512
  if (use_avx512()) i = avx512::clamp_f32(in, out, n, lo, hi);
#endif
  for (; i < n; ++i) {
    const float v = lo > in[i] ? lo : in[i];
    out[i] = hi < v ? hi : v;
  }
}

// Whether in[0, n) holds a NaN.
inline bool any_nan(const float* in, int64_t n) {
  int64_t i = 0;
  bool found = false;
#ifdef DBRQ_AVX512
  if (use_avx512()) i = avx512::any_nan(in, n, &found);
#endif
  for (; i < n && !found; ++i) found = std::isnan(in[i]);
  return found;
}

// out[i] = (in[i] - zp) * scale
inline void dequantize_u8(const uint8_t* in, float* out, int64_t n, float scale, int32_t zp) {
  int64_t i = 0;
  const float fzp = static_cast<float>(zp);
#ifdef DBRQ_AVX512
  if (use_avx512()) i = avx512::dequantize_u8(in, out, n, scale, fzp);
#endif
  for (; i < n; ++i) out[i] = (static_cast<float>(in[i]) - fzp) * scale;
}

// out[i] = in[i] - 128 as s8 (u8 codes to s8 codes, exact: the top bit flips).
inline void shift_u8_to_s8(const uint8_t* in, int8_t* out, int64_t n) {
  int64_t i = 0;
#ifdef DBRQ_AVX512
  if (use_avx512()) i = avx512::shift_u8_to_s8(in, out, n);
#endif
  for (; i < n; ++i) out[i] = static_cast<int8_t>(in[i] ^ 0x80);
}

// sum_i a[i] * (b[i] - b_zp) in s32, a[i] and b[i] - b_zp within [-255, 255] (exact: products
// of pairs fit s32 for any n below 2^15).
inline int32_t dot_s16_u8(const int16_t* a, const uint8_t* b, int64_t n, int32_t b_zp) {
  int64_t i = 0;
  int32_t sum = 0;
#ifdef DBRQ_AVX512
  if (use_avx512()) i = avx512::dot_s16_u8(a, b, n, b_zp, &sum);
#endif
  for (; i < n; ++i) sum += a[i] * (static_cast<int32_t>(b[i]) - b_zp);
  return sum;
}

// PyTorch's quantized add: fma(sa, a, pa) + fma(sb, b, pb), optional relu, requantized.
inline uint8_t qadd_one(uint8_t a, uint8_t b, float sa, float pa, float sb, float pb, bool relu, float inv,
                        int32_t zp) {
  float c = std::fma(sa, static_cast<float>(a), pa) + std::fma(sb, static_cast<float>(b), pb);
  if (relu) c = std::max(c, 0.f);
  return quantize_one(c, inv, zp);
}

inline void qadd_u8(const uint8_t* a, const uint8_t* b, uint8_t* out, int64_t n, float sa, float pa, float sb,
                    float pb, bool relu, float inv, int32_t zp) {
  int64_t i = 0;
#ifdef DBRQ_AVX512
  if (use_avx512()) i = avx512::qadd_u8(a, b, out, n, sa, pa, sb, pb, relu, inv, zp);
#endif
  for (; i < n; ++i) out[i] = qadd_one(a[i], b[i], sa, pa, sb, pb, relu, inv, zp);
}

// acc[i] += in[i] (window sums of pooling; exact in s32).
inline void accumulate_u8(const uint8_t* in, int32_t* acc, int64_t n) {
  int64_t i = 0;
#ifdef DBRQ_AVX512
  if (use_avx512()) i = avx512::accumulate_u8(in, acc, n);
#endif
  for (; i < n; ++i) acc[i] += in[i];
}

// out[i * ldo + jj] = sum over l = 0..k-1, in order, of x[i * k + l] * w[jj * k + l], starting from
// 0, each product rounded before its add (never a fused multiply-add), for i < m and jj < nj <= 16:
// a reference BLAS's dot-product form, one output feature's sum independent of every other's.
// `panel` holds k * 16 floats of scratch. The AVX-512 path transposes the sixteen weight rows once
// and steps sixteen outputs per instruction; the result is the same bit for bit.
__attribute__((optimize("-ffp-contract=off"))) inline void dot16_unfused(const float* x, int64_t m, int64_t k,
                                                                       const float* w, int64_t nj, float* panel,
                                                                       float* out, int64_t ldo) {
#ifdef DBRQ_AVX512
  if (nj == 16 && k <= INT32_MAX / 16 && use_avx512()) {  // gather offsets are int32
    avx512::dot16_unfused(x, m, k, w, panel, out, ldo);
    return;
  }
#endif
  for (int64_t l = 0; l < k; ++l) {
    for (int64_t jj = 0; jj < 16; ++jj) panel[l * 16 + jj] = jj < nj ? w[jj * k + l] : 0.f;
  }
  for (int64_t i = 0; i < m; ++i) {
    float acc[16] = {};
    for (int64_t l = 0; l < k; ++l) {
      const float xl = x[i * k + l];
      for (int64_t jj = 0; jj < 16; ++jj) {  // lanes past nj compute and are dropped
        const float prod = xl * panel[l * 16 + jj];
        acc[jj] = acc[jj] + prod;
      }
    }
    for (int64_t jj = 0; jj < nj; ++jj) out[i * ldo + jj] = acc[jj];
  }
}

// The smallest and largest finite value of in[0, n), with 0 always in the range (non-finite
// values count as 0): the range of a dynamic quantization. A zero result is +0 on both paths.
inline void minmax_finite(const float* in, int64_t n, float* mn_out, float* mx_out) {
  float mn = 0.f, mx = 0.f;
  int64_t i = 0;
#ifdef DBRQ_AVX512
  if (use_avx512()) i = avx512::minmax_finite(in, n, &mn, &mx);
#endif
  for (; i < n; ++i) {
    const float v = std::isfinite(in[i]) ? in[i] : 0.f;
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  // min / max of +0 and -0 may return either: one answer for both paths.
  *mn_out = mn == 0.f ? 0.f : mn;
  *mx_out = mx == 0.f ? 0.f : mx;
}

// acc[ch] += the u8 pixels of a rows x cols window, channels contiguous (pixel (r, c) at
// base + r * row_stride + c * col_stride): the window sums of average pooling on NHWC (exact in s32).
inline void window_sum_u8(const uint8_t* base, int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
                          int32_t* acc, int64_t c) {
  int64_t ch = 0;
#ifdef DBRQ_AVX512
  if (use_avx512()) ch = avx512::window_sum_u8(base, rows, cols, row_stride, col_stride, acc, c);
#endif
  for (; ch < c; ++ch) {
    int32_t a = acc[ch];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t q = 0; q < cols; ++q) a += base[r * row_stride + q * col_stride + ch];
    }
    acc[ch] = a;
  }
}

// out[i] = clamp(round_half_even(float(acc[i]) * multiplier) + zp, 0, 255): a pooled mean's code.
inline uint8_t average_one(int32_t acc, float multiplier, int32_t zp) {
  const int32_t q = static_cast<int32_t>(std::nearbyint(static_cast<float>(acc) * multiplier)) + zp;
  return static_cast<uint8_t>(std::min(std::max(q, 0), 255));
}

inline void average_u8(const int32_t* acc, uint8_t* out, int64_t n, float multiplier, int32_t zp) {
  int64_t i = 0;
#ifdef DBRQ_AVX512
  if (use_avx512()) i = avx512::average_u8(acc, out, n, multiplier, zp);
#endif
  for (; i < n; ++i) out[i] = average_one(acc[i], multiplier, zp);
}

// out[i] = lut[in[i]]
inline void apply_lut_u8(const uint8_t* in, uint8_t* out, int64_t n, const uint8_t* lut) {
  for (int64_t i = 0; i < n; ++i) out[i] = lut[in[i]];
}

// c[j] = sum_l a[l] * (b[l * b_sk + j] - b_zp) for j < n, in s32 (exact: a[l] and b - b_zp within
// [-255, 255], k below 2^15): a row vector times a matrix whose rows run along N (the attention
// probabilities times the values in a one-token decoder step).
#ifdef DBRQ_AVX512
namespace avx512 {
// 16 u8 codes minus the zero point, as s32 (a function, not a lambda: a lambda loses the target).
DBRQ_TARGET_AVX512 inline __m512i u8x16_minus(const uint8_t* p, __m512i vzp) {
  return _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), vzp);
}
DBRQ_TARGET_AVX512 inline int64_t rowvec_s16_u8(const int16_t* a, const uint8_t* b, int64_t k, int64_t b_sk, int64_t n,
                                                 int32_t b_zp, int32_t* c) {
  const __m512i vzp = _mm512_set1_epi32(b_zp);
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t l = 0; l < k; ++l) {
      const __m512i va = _mm512_set1_epi32(a[l]);
      const uint8_t* br = b + l * b_sk + j;
      c0 = _mm512_add_epi32(c0, _mm512_mullo_epi32(va, u8x16_minus(br, vzp)));
      c1 = _mm512_add_epi32(c1, _mm512_mullo_epi32(va, u8x16_minus(br + 16, vzp)));
      c2 = _mm512_add_epi32(c2, _mm512_mullo_epi32(va, u8x16_minus(br + 32, vzp)));
      c3 = _mm512_add_epi32(c3, _mm512_mullo_epi32(va, u8x16_minus(br + 48, vzp)));
    }
    _mm512_storeu_si512(c + j, c0);
    _mm512_storeu_si512(c + j + 16, c1);
    _mm512_storeu_si512(c + j + 32, c2);
    _mm512_storeu_si512(c + j + 48, c3);
  }
  for (; j + 16 <= n; j += 16) {
    __m512i c0 = _mm512_setzero_si512();
    for (int64_t l = 0; l < k; ++l) {
      c0 = _mm512_add_epi32(c0, _mm512_mullo_epi32(_mm512_set1_epi32(a[l]), u8x16_minus(b + l * b_sk + j, vzp)));
    }
    _mm512_storeu_si512(c + j, c0);
  }
  return j;
}
}  // namespace avx512
#endif

inline void rowvec_s16_u8(const int16_t* a, const uint8_t* b, int64_t k, int64_t b_sk, int64_t n, int32_t b_zp,
                          int32_t* c) {
  int64_t j0 = 0;
#ifdef DBRQ_AVX512
  if (use_avx512()) j0 = avx512::rowvec_s16_u8(a, b, k, b_sk, n, b_zp, c);
#endif
  if (j0 >= n) return;
  for (int64_t j = j0; j < n; ++j) c[j] = 0;
  for (int64_t l = 0; l < k; ++l) {
    const int32_t av = a[l];
    const uint8_t* br = b + l * b_sk;
    for (int64_t j = j0; j < n; ++j) c[j] += av * (static_cast<int32_t>(br[j]) - b_zp);
  }
}

}  // namespace dbrq::kernels::simd
