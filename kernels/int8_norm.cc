// Int8 batch norm on its own: one fused multiply-add per element on codes, per-channel constants
// from the statistics (PyTorch's quantized::batch_norm arithmetic), vectorized over channels
// (channels-last: each pixel's C channels are consecutive) or over the positions of one channel
// (row-major [N, C, L] / [N, C, H, W]).
#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_shapes.h"
#include "kernels/int8.h"
#include "kernels/loops.h"
#include "kernels/simd.h"

namespace dbrq::kernels {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per task below which one thread runs

// One code: the scalar twin of the vector loops below (fma, clamp in f32, round half to even).
inline uint8_t affine_one(uint8_t q, float a, float b, float in_zp, float lo, float hi, int32_t out_zp) {
  float y = std::fma(a, static_cast<float>(q) - in_zp, b);
  y = y > lo ? y : lo;  // NaN becomes lo, as _mm512_max_ps(y, lo) does
  y = y < hi ? y : hi;
  return static_cast<uint8_t>(static_cast<int32_t>(std::nearbyint(y)) + out_zp);
}

struct Consts {
  float in_zp, lo, hi;
  int32_t out_zp;
};

#ifdef DBRQ_AVX512
// The AVX-512 loops (compiled for AVX-512 whatever the build targets, run when simd::use_avx512()):
// each handles whole vectors and returns where it stopped.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
DBRQ_TARGET_AVX512 inline void store16(uint8_t* out, __m512 y, __m512 lo, __m512 hi, __m512i vzp) {
  y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
  const __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vzp);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtusepi32_epi8(q));
}
DBRQ_TARGET_AVX512 inline __m512 load16(const uint8_t* in, __m512 in_zp) {
  return _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in)))),
                       in_zp);
}
DBRQ_TARGET_AVX512 int64_t affine_channels_avx512(const uint8_t* in, uint8_t* out, int64_t n, const float* alpha,
                                                  const float* beta, const Consts& k) {
  int64_t c = 0;
  const __m512 zin = _mm512_set1_ps(k.in_zp), lo = _mm512_set1_ps(k.lo), hi = _mm512_set1_ps(k.hi);
  const __m512i vzp = _mm512_set1_epi32(k.out_zp);
  for (; c + 16 <= n; c += 16) {
    const __m512 y = _mm512_fmadd_ps(_mm512_loadu_ps(alpha + c), load16(in + c, zin), _mm512_loadu_ps(beta + c));
    store16(out + c, y, lo, hi, vzp);
  }
  return c;
}
DBRQ_TARGET_AVX512 int64_t affine_positions_avx512(const uint8_t* in, uint8_t* out, int64_t n, float a, float b,
                                                   const Consts& k) {
  int64_t i = 0;
  const __m512 zin = _mm512_set1_ps(k.in_zp), lo = _mm512_set1_ps(k.lo), hi = _mm512_set1_ps(k.hi);
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  const __m512i vzp = _mm512_set1_epi32(k.out_zp);
  for (; i + 16 <= n; i += 16) store16(out + i, _mm512_fmadd_ps(va, load16(in + i, zin), vb), lo, hi, vzp);
  return i;
}
#pragma GCC diagnostic pop
#endif

// out[c] = affine(in[c]) with alpha[c], beta[c], c < n (one pixel's channels).
void affine_channels(const uint8_t* in, uint8_t* out, int64_t n, const float* alpha, const float* beta,
                     const Consts& k) {
  int64_t c = 0;
#ifdef DBRQ_AVX512
  if (simd::use_avx512()) c = affine_channels_avx512(in, out, n, alpha, beta, k);
#endif
  for (; c < n; ++c) out[c] = affine_one(in[c], alpha[c], beta[c], k.in_zp, k.lo, k.hi, k.out_zp);
}

// out[i] = affine(in[i]) with one alpha, beta (the positions of one channel).
void affine_positions(const uint8_t* in, uint8_t* out, int64_t n, float a, float b, const Consts& k) {
  int64_t i = 0;
#ifdef DBRQ_AVX512
  if (simd::use_avx512()) i = affine_positions_avx512(in, out, n, a, b, k);
#endif
  for (; i < n; ++i) out[i] = affine_one(in[i], a, b, k.in_zp, k.lo, k.hi, k.out_zp);
}

const float* f32_data(const Tensor& t, std::vector<float>* keep) {
  *keep = t.to_vector<float>();
  return keep->data();
}

}  // namespace

ChannelAffine batch_norm_affine(const Tensor& mean, const Tensor& var, const Tensor& weight, const Tensor& bias,
                                double eps, float in_scale, float out_scale) {
  const char* names[] = {"running_mean", "running_var", "weight", "bias"};
  const Tensor* ts[] = {&mean, &var, &weight, &bias};
  DBRQ_ENSURE(mean.defined() && var.defined(), ValueError,
              "quantized batch_norm: needs running_mean and running_var");
  const int64_t c = mean.numel();
  for (int i = 0; i < 4; ++i) {
    if (!ts[i]->defined()) continue;
    check_float("quantized batch_norm", names[i], *ts[i]);
    DBRQ_ENSURE(ts[i]->dim() == 1 && ts[i]->size(0) == c, ShapeError, "quantized batch_norm: ", names[i],
                " must have sizes [", c, "] (as running_mean), got ", ts[i]->shape_string());
  }
  DBRQ_ENSURE(eps >= 0, ValueError, "quantized batch_norm: eps must be >= 0, got ", eps);
  DBRQ_ENSURE(in_scale > 0 && out_scale > 0 && std::isfinite(in_scale) && std::isfinite(out_scale), ValueError,
              "quantized batch_norm: scales must be positive and finite, got input scale ", in_scale,
              " and output scale ", out_scale);
  std::vector<float> m, v, w, b;
  const float* pm = f32_data(mean, &m);
  const float* pv = f32_data(var, &v);
  const float* pw = weight.defined() ? f32_data(weight, &w) : nullptr;
  const float* pb = bias.defined() ? f32_data(bias, &b) : nullptr;
  const double in_s = in_scale, out_s = out_scale;
  ChannelAffine a;
  a.alpha.resize(static_cast<size_t>(c));
  a.beta.resize(static_cast<size_t>(c));
  for (int64_t i = 0; i < c; ++i) {
    const float inv_sigma = static_cast<float>(1.0 / std::sqrt(pv[i] + static_cast<float>(eps)));
    const float wv = pw != nullptr ? pw[i] : 1.f;
    const float bv = pb != nullptr ? pb[i] : 0.f;
    a.alpha[static_cast<size_t>(i)] = static_cast<float>(inv_sigma * wv * (in_s / out_s));
    a.beta[static_cast<size_t>(i)] = static_cast<float>((bv - pm[i] * inv_sigma * wv) / out_s);
  }
  return a;
}

QChannelAffine::QChannelAffine(ChannelAffine affine, QuantParamsPtr src, QuantParamsPtr dst, bool relu)
    : a_(std::move(affine)), src_(std::move(src)), dst_(std::move(dst)), relu_(relu) {
  DBRQ_ENSURE(a_.alpha.size() == a_.beta.size() && !a_.alpha.empty(), ValueError,
              "quantized channel affine: needs as many alphas as betas (at least one), got ", a_.alpha.size(), " and ",
              a_.beta.size());
  DBRQ_ENSURE(src_ != nullptr && dst_ != nullptr && !src_->is_per_channel() && !dst_->is_per_channel(), ValueError,
              "quantized channel affine: needs per-tensor input and output parameters");
}

Tensor QChannelAffine::run(const Tensor& x_in) const {
  DBRQ_ENSURE(x_in.defined() && x_in.dtype() == DType::kU8 && x_in.is_quantized() && !x_in.qparams()->is_per_channel(),
              DTypeError, "quantized batch_norm: needs a per-tensor quantized u8 tensor, got ",
              x_in.defined() ? dtype_name(x_in.dtype()) : "undefined",
              x_in.defined() && !x_in.is_quantized() ? " (not quantized)" : "");
  DBRQ_ENSURE(x_in.dim() >= 2 && x_in.dim() <= 5, ShapeError,
              "quantized batch_norm: input must have 2 to 5 dims (N, C, ...), got sizes ", x_in.shape_string());
  DBRQ_ENSURE(x_in.size(1) == channels(), ShapeError, "quantized batch_norm: input has ", x_in.size(1),
              " channels (sizes ", x_in.shape_string(), "), the statistics have ", channels());
  DBRQ_ENSURE(*x_in.qparams() == *src_, ValueError, "quantized batch_norm: input parameters ",
              x_in.qparams()->to_string(), " differ from the ones the kernel was built for, ", src_->to_string());
  // Channels innermost (channels-last, [N, C]) or row-major; anything else is copied row-major.
  const bool channels_inner = x_in.is_non_overlapping_and_dense() && x_in.stride(1) == 1;
  const Tensor x = channels_inner || x_in.is_contiguous() ? x_in : copy(x_in, MemoryFormat::kContiguous, DType::kU8);
  Tensor dst = Tensor::empty_like(x, DType::kU8).with_qparams(dst_);
  const int64_t n = x.numel(), c = channels();
  if (n == 0) return dst;
  const Consts k{static_cast<float>(src_->zero_point()),
                 relu_ ? 0.f : static_cast<float>(-dst_->zero_point()),
                 static_cast<float>(255 - dst_->zero_point()), dst_->zero_point()};
  const uint8_t* in = x.raw_data<uint8_t>();
  uint8_t* out = static_cast<uint8_t*>(dst.mutable_data_ptr());
  const float* alpha = a_.alpha.data();
  const float* beta = a_.beta.data();
  if (channels_inner) {
    parallel_for(n / c, std::max<int64_t>(1, kGrain / c), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) affine_channels(in + p * c, out + p * c, c, alpha, beta, k);
    });
  } else {
    const int64_t inner = n / (x.size(0) * c);  // positions of one (sample, channel)
    parallel_for(n / inner, std::max<int64_t>(1, kGrain / inner), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t ch = r % c;
        affine_positions(in + r * inner, out + r * inner, inner, alpha[ch], beta[ch], k);
      }
    });
  }
  return dst;
}

std::string QChannelAffine::describe() const {
  return absl::StrCat("int8 per-channel affine (", channels(), " channels", relu_ ? ", relu fused" : "", ")");
}

}  // namespace dbrq::kernels
