#include "kernels/int8_pool.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/loops.h"
#include "kernels/simd.h"

namespace dbrq::kernels {
namespace {

inline uint8_t avg_code(int32_t acc, float multiplier, int32_t zp) {
  const int32_t q = static_cast<int32_t>(std::nearbyint(static_cast<float>(acc) * multiplier)) + zp;
  return static_cast<uint8_t>(std::min(std::max(q, 0), 255));
}

#ifdef DBRQ_AVX512
// The AVX-512 loops (compiled for AVX-512 whatever the build targets, run when simd::use_avx512()):
// each handles whole vectors of channels and returns where it stopped.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// a[ch] += px[ch]
DBRQ_TARGET_AVX512 int64_t accumulate_avx512(int32_t* a, const uint8_t* px, int64_t c) {
  int64_t ch = 0;
  for (; ch + 16 <= c; ch += 16) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(px + ch)));
    _mm512_storeu_si512(a + ch, _mm512_add_epi32(_mm512_loadu_si512(a + ch), v));
  }
  return ch;
}
// o[ch] = avg_code(a[ch], multiplier, zp)
DBRQ_TARGET_AVX512 int64_t average_avx512(const int32_t* a, uint8_t* o, int64_t c, float multiplier, int32_t zp) {
  int64_t ch = 0;
  const __m512 vm = _mm512_set1_ps(multiplier);
  const __m512i vzp = _mm512_set1_epi32(zp), zero = _mm512_setzero_si512(), top = _mm512_set1_epi32(255);
  for (; ch + 16 <= c; ch += 16) {
    const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(a + ch)), vm);
    __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vzp);
    q = _mm512_min_epi32(_mm512_max_epi32(q, zero), top);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + ch), _mm512_cvtepi32_epi8(q));
  }
  return ch;
}
#pragma GCC diagnostic pop
#endif

}  // namespace

void qavg_pool2d_nhwc(const uint8_t* src, uint8_t* dst, const PoolGeometry& g, const Pool2dParams& p, int32_t zp) {
  const int64_t c = g.c;
  const bool avx512 = simd::use_avx512();
  parallel_for(g.n * g.oh, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<int32_t> acc;  // grow-only per worker: no allocation per call
    acc.resize(static_cast<size_t>(c));
    for (int64_t nh = lo; nh < hi; ++nh) {
      const int64_t b = nh / g.oh, oh = nh % g.oh;
      for (int64_t ow = 0; ow < g.ow; ++ow) {
        const AvgPoolWindow win = avg_pool_window(g, p, oh, ow);
        const int64_t h0 = win.h0, h1 = win.h1, w0 = win.w0, w1 = win.w1, count = win.count;
        const float multiplier = win.multiplier;
        const int32_t start = -zp * static_cast<int32_t>(count);
        int32_t* a = acc.data();
        std::fill(acc.begin(), acc.end(), start);
        for (int64_t y = h0; y < h1; ++y) {
          for (int64_t x = w0; x < w1; ++x) {
            const uint8_t* px = src + ((b * g.h + y) * g.w + x) * c;
            int64_t ch = 0;
#ifdef DBRQ_AVX512
            if (avx512) ch = accumulate_avx512(a, px, c);
#endif
            for (; ch < c; ++ch) a[ch] += px[ch];
          }
        }
        uint8_t* o = dst + ((b * g.oh + oh) * g.ow + ow) * c;
        int64_t ch = 0;
#ifdef DBRQ_AVX512
        if (avx512) ch = average_avx512(a, o, c, multiplier, zp);
#endif
        for (; ch < c; ++ch) o[ch] = avg_code(a[ch], multiplier, zp);
      }
    }
  });
}

}  // namespace dbrq::kernels
