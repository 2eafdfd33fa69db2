// The portable loops of kernels/simd.h against its AVX-512 loops: bit-identical results for every
// function, on lengths around the vector widths (tails), on every rounding tie, and on values that
// saturate (huge, +-inf, NaN). The default build (x86-64-v2; --config=native is -march=native) picks the
// AVX-512 loops at run time; a CPU without AVX-512 (or DBRQ_PORTABLE_KERNELS=1) runs the portable
// ones. The int8 model-level check (a converted CNN bit-identical both ways) is in
// tests/int8/int8_e2e_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/simd.h"

namespace dbrq::kernels::simd {
namespace {

class SimdDispatch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512: only the portable loops exist";
  }
  void TearDown() override { force_portable(false); }
  std::mt19937 rng_{1234};
  const std::vector<int64_t> lengths_ = {0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 1000, 4099};
};

TEST(SimdDispatchSwitch, ForcingThePortableLoopsIsObservable) {
  force_portable(true);
  EXPECT_STREQ(isa_name(), "portable");
  EXPECT_FALSE(use_avx512());
  force_portable(false);
  EXPECT_STREQ(isa_name(), cpu_has_avx512() ? "avx512" : "portable");
}

std::vector<float> floats(std::mt19937& rng, int64_t n, float inv) {
  std::uniform_real_distribution<float> u(-300.f, 300.f);
  std::vector<float> v(static_cast<size_t>(n));
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 3e38f, -3e38f, 0.f, -0.f};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i % 11;
    if (k < 7) {
      v[static_cast<size_t>(i)] = specials[k];
    } else if (k == 7) {
      // an exact tie after scaling: (m + 0.5) / inv
      v[static_cast<size_t>(i)] = (static_cast<float>(static_cast<int>(u(rng)) % 200) + 0.5f) / inv;
    } else {
      v[static_cast<size_t>(i)] = u(rng) / inv * 0.01f;
    }
  }
  return v;
}

TEST_F(SimdDispatch, QuantizeIsBitIdentical) {
  for (int64_t n : lengths_) {
    for (int32_t zp : {0, 3, 128, 255}) {
      const float inv = 1.f / 0.0371f;
      const std::vector<float> in = floats(rng_, n, inv);
      std::vector<uint8_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      force_portable(false);
      quantize_u8(in.data(), a.data(), n, inv, zp);
      force_portable(true);
      quantize_u8(in.data(), b.data(), n, inv, zp);
      EXPECT_EQ(a, b) << "n=" << n << " zp=" << zp;
    }
  }
}

TEST_F(SimdDispatch, DequantizeIsBitIdentical) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t n : lengths_) {
    std::vector<uint8_t> in(static_cast<size_t>(n));
    for (auto& x : in) x = static_cast<uint8_t>(byte(rng_));
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    force_portable(false);
    dequantize_u8(in.data(), a.data(), n, 0.0123f, 77);
    force_portable(true);
    dequantize_u8(in.data(), b.data(), n, 0.0123f, 77);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::memcmp(&a[static_cast<size_t>(i)], &b[static_cast<size_t>(i)], sizeof(float)), 0) << "n=" << n << " i=" << i;
    }
  }
}

TEST_F(SimdDispatch, ShiftAndDotAreBitIdentical) {
  std::uniform_int_distribution<int> byte(0, 255), s16(-255, 255);
  for (int64_t n : lengths_) {
    std::vector<uint8_t> u(static_cast<size_t>(n));
    std::vector<int16_t> w(static_cast<size_t>(n));
    for (auto& x : u) x = static_cast<uint8_t>(byte(rng_));
    for (auto& x : w) x = static_cast<int16_t>(s16(rng_));
    std::vector<int8_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    force_portable(false);
    shift_u8_to_s8(u.data(), a.data(), n);
    const int32_t da = dot_s16_u8(w.data(), u.data(), n, 131);
    force_portable(true);
    shift_u8_to_s8(u.data(), b.data(), n);
    const int32_t db = dot_s16_u8(w.data(), u.data(), n, 131);
    EXPECT_EQ(a, b) << "n=" << n;
    EXPECT_EQ(da, db) << "n=" << n;
    int64_t ref = 0;
    for (int64_t i = 0; i < n; ++i) ref += w[static_cast<size_t>(i)] * (static_cast<int64_t>(u[static_cast<size_t>(i)]) - 131);
    EXPECT_EQ(da, ref) << "n=" << n;
  }
}

// A row vector times a matrix with rows along N (probabilities times values in attention): the
// portable and AVX-512 loops equal an s64 reference, for widths around 16 and 64 (tails), row
// strides wider than the width, and the extremes (-255 x (0 - 255)) at the longest rows.
TEST_F(SimdDispatch, RowVectorTimesRowsIsBitIdentical) {
  std::uniform_int_distribution<int> byte(0, 255), s16(-255, 255);
  for (int64_t n : {1, 15, 16, 17, 48, 63, 64, 65, 80, 130}) {
    for (int64_t k : {0, 1, 7, 129}) {
      for (bool extreme : {false, true}) {
        const int64_t stride = n + 3;
        std::vector<uint8_t> b(static_cast<size_t>(std::max<int64_t>(k * stride, 1)));
        std::vector<int16_t> a(static_cast<size_t>(k));
        for (auto& x : b) x = extreme ? 0 : static_cast<uint8_t>(byte(rng_));
        for (auto& x : a) x = extreme ? -255 : static_cast<int16_t>(s16(rng_));
        std::vector<int32_t> fast(static_cast<size_t>(n), -1), portable(static_cast<size_t>(n), -1);
        force_portable(false);
        rowvec_s16_u8(a.data(), b.data(), k, stride, n, 255, fast.data());
        force_portable(true);
        rowvec_s16_u8(a.data(), b.data(), k, stride, n, 255, portable.data());
        EXPECT_EQ(fast, portable) << "n=" << n << " k=" << k;
        for (int64_t j = 0; j < n; ++j) {
          int64_t ref = 0;
          for (int64_t l = 0; l < k; ++l) {
            ref += a[static_cast<size_t>(l)] * (static_cast<int64_t>(b[static_cast<size_t>(l * stride + j)]) - 255);
          }
          ASSERT_EQ(fast[static_cast<size_t>(j)], ref) << "n=" << n << " k=" << k << " j=" << j;
        }
      }
    }
  }
}

TEST_F(SimdDispatch, QuantizedAddIsBitIdentical) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t n : lengths_) {
    for (bool relu : {false, true}) {
      std::vector<uint8_t> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      for (auto& v : x) v = static_cast<uint8_t>(byte(rng_));
      for (auto& v : y) v = static_cast<uint8_t>(byte(rng_));
      std::vector<uint8_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
      const float sa = 0.02f, pa = -0.02f * 100, sb = 0.05f, pb = -0.05f * 7, inv = 1.f / 0.06f;
      force_portable(false);
      qadd_u8(x.data(), y.data(), a.data(), n, sa, pa, sb, pb, relu, inv, 64);
      force_portable(true);
      qadd_u8(x.data(), y.data(), b.data(), n, sa, pa, sb, pb, relu, inv, 64);
      EXPECT_EQ(a, b) << "n=" << n << " relu=" << relu;
    }
  }
}

TEST_F(SimdDispatch, AccumulateIsBitIdentical) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t n : lengths_) {
    std::vector<uint8_t> x(static_cast<size_t>(n));
    for (auto& v : x) v = static_cast<uint8_t>(byte(rng_));
    // Start from large and negative sums (the zero-point offset of a pooling window).
    std::vector<int32_t> a(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) a[static_cast<size_t>(i)] = static_cast<int32_t>(i * 7919 % 100003) - 50000;
    std::vector<int32_t> b = a;
    ref = a;
    for (int64_t i = 0; i < n; ++i) ref[static_cast<size_t>(i)] += x[static_cast<size_t>(i)];
    force_portable(false);
    accumulate_u8(x.data(), a.data(), n);
    force_portable(true);
    accumulate_u8(x.data(), b.data(), n);
    EXPECT_EQ(a, ref) << "n=" << n;
    EXPECT_EQ(b, ref) << "n=" << n;
  }
}

// dot16_unfused (linear_torch_order's inner kernel): each output the in-order sum of rounded
// products, from 0. Against a scalar reference (volatile: no fusing or reordering) on both paths,
// bit for bit, with k around the 16x16 tile (the last columns come from gathers), every row count
// of the four-row loop and its tail, fewer than 16 outputs (the portable loop on both paths), and
// values whose products overflow, vanish or are NaN in a few outputs.
TEST_F(SimdDispatch, InOrderDotProductsAreBitIdentical) {
  for (int64_t k : {1, 15, 16, 17, 31, 32, 33, 100}) {
    for (int64_t m : {1, 3, 4, 5, 9}) {
      for (int64_t nj : {16, 5}) {
        std::normal_distribution<float> normal(0.f, 3.f);
        std::vector<float> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(16 * k));
        for (float& v : x) v = normal(rng_);
        for (float& v : w) v = normal(rng_);
        for (size_t i = 0; i < w.size(); i += 7) w[i] = 1e-30f;  // products below the smallest normal
        // A few outputs see a special value; the others stay finite, so a wrong lane shows.
        const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(), 3e38f, -0.f};
        x[static_cast<size_t>((m - 1) * k + k / 2)] = specials[static_cast<size_t>(k % 5)];
        w[static_cast<size_t>(3 * k)] = specials[static_cast<size_t>(m % 5)];
        w[static_cast<size_t>(9 * k + k - 1)] = 3e38f;
        std::vector<float> want(static_cast<size_t>(m * 16), -1.f);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < nj; ++j) {
            volatile float acc = 0.f;
            for (int64_t l = 0; l < k; ++l) {
              volatile float prod = x[static_cast<size_t>(i * k + l)] * w[static_cast<size_t>(j * k + l)];
              acc = acc + prod;
            }
            want[static_cast<size_t>(i * 16 + j)] = acc;
          }
        }
        for (bool portable : {false, true}) {
          force_portable(portable);
          std::vector<float> got(static_cast<size_t>(m * 16), -1.f), panel(static_cast<size_t>(k * 16));
          dot16_unfused(x.data(), m, k, w.data(), nj, panel.data(), got.data(), 16);
          // Bit for bit, except that a NaN's sign and payload are not defined: C++ lets the compiler
          // commute `acc + prod`, and x86 returns the first operand's NaN when both are NaN.
          for (size_t q = 0; q < got.size(); ++q) {
            const bool same = std::memcmp(&got[q], &want[q], 4) == 0 || (std::isnan(got[q]) && std::isnan(want[q]));
            ASSERT_TRUE(same) << (portable ? "portable" : "avx512") << " k=" << k << " m=" << m << " nj=" << nj
                              << " at " << q << ": " << got[q] << " vs " << want[q];
          }
        }
      }
    }
  }
}

TEST_F(SimdDispatch, MinMaxFiniteIsBitIdentical) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : lengths_) {
    // floats(): NaN, +-inf and +-3e38 among ordinary values; non-finite ones must not count.
    std::vector<float> x = floats(rng_, n, 0.37f);
    float ref_mn = 0.f, ref_mx = 0.f;
    for (float v : x) {
      if (!std::isfinite(v)) continue;
      ref_mn = v < ref_mn ? v : ref_mn;
      ref_mx = v > ref_mx ? v : ref_mx;
    }
    float a_mn, a_mx, b_mn, b_mx;
    force_portable(false);
    minmax_finite(x.data(), n, &a_mn, &a_mx);
    force_portable(true);
    minmax_finite(x.data(), n, &b_mn, &b_mx);
    EXPECT_EQ(a_mn, ref_mn) << "avx512 n=" << n;
    EXPECT_EQ(a_mx, ref_mx) << "avx512 n=" << n;
    EXPECT_EQ(std::memcmp(&a_mn, &b_mn, 4), 0) << "n=" << n << ": " << a_mn << " vs " << b_mn;
    EXPECT_EQ(std::memcmp(&a_mx, &b_mx, 4), 0) << "n=" << n << ": " << a_mx << " vs " << b_mx;
  }
  // Only -0, NaN and inf, all in the vector part: the range is [+0, +0] on both paths.
  std::vector<float> z(32, -0.f);
  z[3] = nan;
  z[20] = -inf;
  z[21] = inf;
  for (bool portable : {false, true}) {
    force_portable(portable);
    float mn = 1.f, mx = 1.f;
    minmax_finite(z.data(), 32, &mn, &mx);
    EXPECT_EQ(mn, 0.f);
    EXPECT_EQ(mx, 0.f);
    EXPECT_FALSE(std::signbit(mn)) << (portable ? "portable" : "avx512");
    EXPECT_FALSE(std::signbit(mx)) << (portable ? "portable" : "avx512");
  }
  // Small positive and negative values only in the tail after the vectors.
  std::vector<float> t(19, 0.f);
  t[17] = -2.5f;
  t[18] = 4.f;
  for (bool portable : {false, true}) {
    force_portable(portable);
    float mn, mx;
    minmax_finite(t.data(), 19, &mn, &mx);
    EXPECT_EQ(mn, -2.5f);
    EXPECT_EQ(mx, 4.f);
  }
}

// clamp_f32 (relu, relu6, hardtanh, clamp): bit-identical on both paths, NaN kept, -0 kept, as
// PyTorch's clamp; any_nan finds a NaN in the vector part and in the tail.
TEST_F(SimdDispatch, ClampAndAnyNanAreBitIdentical) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n : lengths_) {
    const std::vector<float> x = floats(rng_, n, 0.37f);  // NaN, +-inf, +-3e38, +-0 among them
    for (auto [lo, hi] : {std::pair<float, float>{0.f, inf}, {0.f, 6.f}, {-1.f, 1.f}, {-0.5f, 0.8f}}) {
      std::vector<float> a(x.size()), b(x.size());
      force_portable(false);
      clamp_f32(x.data(), a.data(), n, lo, hi);
      force_portable(true);
      clamp_f32(x.data(), b.data(), n, lo, hi);
      ASSERT_TRUE(a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0)
          << "n=" << n << " [" << lo << ", " << hi << "]";
      for (size_t i = 0; i < x.size(); ++i) {
        if (std::isnan(x[i])) {
          EXPECT_TRUE(std::isnan(a[i])) << i;
        } else if (x[i] == 0.f && lo == 0.f) {
          EXPECT_EQ(std::signbit(a[i]), std::signbit(x[i])) << i;  // relu(-0) = -0, as torch.relu
        } else {
          EXPECT_EQ(a[i], std::min(std::max(x[i], lo), hi)) << i;
        }
      }
    }
    bool has_nan = false;
    for (float v : x) has_nan |= std::isnan(v);
    for (bool portable : {false, true}) {
      force_portable(portable);
      EXPECT_EQ(any_nan(x.data(), n), has_nan) << "n=" << n;
    }
  }
  std::vector<float> t(35, 1.f);
  for (size_t at : {size_t{3}, size_t{20}, size_t{34}}) {  // vector part, second vector, tail
    std::vector<float> u = t;
    u[at] = std::numeric_limits<float>::quiet_NaN();
    for (bool portable : {false, true}) {
      force_portable(portable);
      EXPECT_TRUE(any_nan(u.data(), 35)) << at;
      EXPECT_FALSE(any_nan(t.data(), 35));
    }
  }
}

TEST_F(SimdDispatch, WindowSumAndAverageAreBitIdentical) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t c : lengths_) {
    if (c > 200) continue;
    // An NHWC image of 5 x 6 pixels with c channels; windows of every size and position.
    const int64_t h = 5, w = 6, row = w * c;
    std::vector<uint8_t> img(static_cast<size_t>(h * row));
    for (auto& v : img) v = static_cast<uint8_t>(byte(rng_));
    for (int64_t r0 = 0; r0 < h; r0 += 2) {
      for (int64_t rows = 1; r0 + rows <= h; rows += 2) {
        for (int64_t cols : {int64_t{1}, int64_t{4}, w}) {
          std::vector<int32_t> ref(static_cast<size_t>(c), -128 * static_cast<int32_t>(rows * cols));
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t q = 0; q < cols; ++q) {
              for (int64_t ch = 0; ch < c; ++ch) ref[static_cast<size_t>(ch)] += img[static_cast<size_t>((r0 + r) * row + q * c + ch)];
            }
          }
          std::vector<int32_t> a(static_cast<size_t>(c), -128 * static_cast<int32_t>(rows * cols)), b = a;
          force_portable(false);
          window_sum_u8(img.data() + r0 * row, rows, cols, row, c, a.data(), c);
          force_portable(true);
          window_sum_u8(img.data() + r0 * row, rows, cols, row, c, b.data(), c);
          EXPECT_EQ(a, ref) << "c=" << c << " rows=" << rows << " cols=" << cols;
          EXPECT_EQ(b, ref) << "c=" << c << " rows=" << rows << " cols=" << cols;
        }
      }
    }
  }
  // Averages: ties of every parity (sums k + 0.5 after scaling by 1/2, 1/4), saturation both ways.
  for (int64_t n : lengths_) {
    std::vector<int32_t> acc(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) acc[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37) % 2000) - 1000;
    for (float mult : {0.5f, 0.25f, 1.f / 3.f, 1.f / 9.f}) {
      for (int32_t zp : {0, 7, 128, 255}) {
        std::vector<uint8_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          const int32_t q = static_cast<int32_t>(std::nearbyint(static_cast<float>(acc[static_cast<size_t>(i)]) * mult)) + zp;
          ref[static_cast<size_t>(i)] = static_cast<uint8_t>(q < 0 ? 0 : q > 255 ? 255 : q);
        }
        force_portable(false);
        average_u8(acc.data(), a.data(), n, mult, zp);
        force_portable(true);
        average_u8(acc.data(), b.data(), n, mult, zp);
        EXPECT_EQ(a, ref) << "avx512 n=" << n << " mult=" << mult << " zp=" << zp;
        EXPECT_EQ(b, ref) << "portable n=" << n << " mult=" << mult << " zp=" << zp;
      }
    }
  }
}

}  // namespace
}  // namespace dbrq::kernels::simd
