// Builder-style tester of kernels::QMatmul (product of two activations) against a naive batched,
// broadcasting matrix product over the dequantized codes:
//
//   QMatmulTester().a_shape({2, 1, 3, 4}).b_shape({3, 4, 5}).a_zero_point(3).Test();
//   QMatmulTester().dynamic(true).Test();
//
// Shapes follow NumPy's matmul: 1-D operands are promoted (and the added dim dropped from the
// result), batch dims broadcast. Static: u8 x u8 -> u8, reference real = acc * s_a * s_b with
// acc = sum (a - a_zp) * (b - b_zp) in integers, quantized with round half to even; the u8 gate of
// kernel_test_util.h. Dynamic: f32 operands quantized per call from their own ranges (u8, range
// widened to include 0, scale = (max - min) / 255, zero point = round(-min / scale)) -> f32, with
// the tolerance of qlinear_tester.h (1e-6 of |acc| * s_a * s_b: exact s32 accumulation, a few
// f32 roundings of the reciprocal scales and of the final multiply), and a second check against the
// unquantized f32 product within what the operands' rounding explains:
// sum_l |a| s_b / 2 + |b| s_a / 2 + s_a s_b / 4.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/int8.h"
#include "tests/kernels/kernel_test_util.h"

namespace dbrq::kernel_testing {

class QMatmulTester {
 public:
  QMatmulTester& a_shape(std::vector<int64_t> v) { a_shape_ = std::move(v); return *this; }
  QMatmulTester& b_shape(std::vector<int64_t> v) { b_shape_ = std::move(v); return *this; }
  QMatmulTester& a_zero_point(int32_t v) { a_zp_ = v; return *this; }
  QMatmulTester& b_zero_point(int32_t v) { b_zp_ = v; return *this; }
  QMatmulTester& dynamic(bool v) { dynamic_ = v; return *this; }
  // b stored with its last two dims transposed (k.transpose(-2, -1) in attention).
  QMatmulTester& transposed_b(bool v) { transposed_b_ = v; return *this; }
  QMatmulTester& saturate(bool v) { saturate_ = v; return *this; }
  QMatmulTester& seed(uint32_t v) { seed_ = v; return *this; }
  QMatmulTester& iterations(int v) { iterations_ = v; return *this; }

  static constexpr double kDynamicTolerance = 1e-6;

  std::string describe() const {
    std::ostringstream os;
    os << (dynamic_ ? "dynamic qmatmul " : "qmatmul ") << shape_to_string(a_shape_) << " x "
       << shape_to_string(b_shape_) << (transposed_b_ ? "(T)" : "") << " zp" << a_zp_ << "," << b_zp_
       << (saturate_ ? " sat" : "");
    return os.str();
  }

  void Test() const {
    for (int it = 0; it < iterations_; ++it) TestOnce(seed_ + static_cast<uint32_t>(it));
  }

 private:
  struct Operand {
    std::vector<int32_t> q;
    std::vector<float> f;
    float scale = 0.f;
    int32_t zp = 0;
  };

  static Operand make_operand(std::mt19937& rng, int64_t n, bool dynamic, int32_t zp) {
    Operand o;
    if (dynamic) {
      const double spread = random_double(rng, 0.5, 2.0), shift = random_double(rng, -1.0, 1.0);
      o.f = random_floats(rng, n, spread * (shift - 1.5), spread * (shift + 1.5));
      double mn = 0.0, mx = 0.0;
      for (float v : o.f) {
        mn = std::min(mn, static_cast<double>(v));
        mx = std::max(mx, static_cast<double>(v));
      }
      const double scale = std::max((mx - mn) / 255.0, 1e-8);
      o.scale = static_cast<float>(scale);
      o.zp = static_cast<int32_t>(std::min(std::max(std::nearbyint(-mn / scale), 0.0), 255.0));
      o.q.resize(o.f.size());
      for (size_t i = 0; i < o.f.size(); ++i) o.q[i] = quantize_u8(o.f[i], o.scale, o.zp);
    } else {
      o.scale = static_cast<float>(random_double(rng, 0.01, 0.05));
      o.zp = zp;
      o.q = random_codes(rng, n);
    }
    return o;
  }

  void TestOnce(uint32_t seed) const {
    const std::string label = describe() + " seed " + std::to_string(seed);
    SCOPED_TRACE(label);
    std::mt19937 rng(seed);
    const Operand a = make_operand(rng, numel_of(a_shape_), dynamic_, a_zp_);
    const Operand b = make_operand(rng, numel_of(b_shape_), dynamic_, b_zp_);

    // NumPy matmul shapes.
    std::vector<int64_t> a2 = a_shape_, b2 = b_shape_;
    const bool squeeze_m = a2.size() == 1, squeeze_n = b2.size() == 1;
    if (squeeze_m) a2.insert(a2.begin(), 1);
    if (squeeze_n) b2.push_back(1);
    const int64_t m = a2[a2.size() - 2], k = a2.back(), n = b2.back();
    ASSERT_EQ(b2[b2.size() - 2], k) << "bad test shapes";
    const size_t rank = std::max(a2.size(), b2.size()) - 2;
    std::vector<int64_t> batch(rank), a_batch(rank, 1), b_batch(rank, 1);
    for (size_t i = 0; i < a2.size() - 2; ++i) a_batch[rank - (a2.size() - 2) + i] = a2[i];
    for (size_t i = 0; i < b2.size() - 2; ++i) b_batch[rank - (b2.size() - 2) + i] = b2[i];
    for (size_t i = 0; i < rank; ++i) {
      ASSERT_TRUE(a_batch[i] == b_batch[i] || a_batch[i] == 1 || b_batch[i] == 1) << "bad test shapes";
      batch[i] = std::max(a_batch[i], b_batch[i]);
    }
    std::vector<int64_t> out_sizes = batch;
    if (!squeeze_m) out_sizes.push_back(m);
    if (!squeeze_n) out_sizes.push_back(n);

    // The naive product.
    const int64_t nb = numel_of(batch);
    std::vector<double> real(static_cast<size_t>(nb * m * n)), bound(real.size()), exact(real.size()),
        rounding(real.size());
    for (int64_t bi = 0; bi < nb; ++bi) {
      // Offsets of this batch entry in a and b (broadcast dims read index 0).
      int64_t rest = bi, a_off = 0, b_off = 0, a_stride = 1, b_stride = 1;
      for (size_t d = rank; d-- > 0;) {
        const int64_t idx = rest % batch[d];
        rest /= batch[d];
        if (a_batch[d] != 1) a_off += idx * a_stride;
        if (b_batch[d] != 1) b_off += idx * b_stride;
        a_stride *= a_batch[d];
        b_stride *= b_batch[d];
      }
      a_off *= m * k;
      b_off *= k * n;
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          int64_t acc = 0;
          double e = 0.0, r = 0.0;
          for (int64_t l = 0; l < k; ++l) {
            const size_t ai = static_cast<size_t>(a_off + i * k + l), bj = static_cast<size_t>(b_off + l * n + j);
            acc += static_cast<int64_t>(a.q[ai] - a.zp) * (b.q[bj] - b.zp);
            if (dynamic_) {
              e += static_cast<double>(a.f[ai]) * b.f[bj];
              r += std::abs(static_cast<double>(a.f[ai])) * b.scale / 2 + std::abs(static_cast<double>(b.f[bj])) * a.scale / 2 +
                   static_cast<double>(a.scale) * b.scale / 4;
            }
          }
          const size_t oi = static_cast<size_t>((bi * m + i) * n + j);
          real[oi] = static_cast<double>(acc) * a.scale * b.scale;
          bound[oi] = std::abs(real[oi]) + 1e-30;
          exact[oi] = e;
          rounding[oi] = r + kDynamicTolerance * bound[oi];
        }
      }
    }

    QuantParamsPtr a_qp = QuantParams::per_tensor(a.scale, a.zp), b_qp = QuantParams::per_tensor(b.scale, b.zp), dst;
    if (!dynamic_) {
      double lo = 0.0, hi = 0.0;
      for (double v : real) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      if (saturate_) {
        lo *= 0.6;
        hi *= 0.6;
      }
      dst = qparams_for_range(lo, hi);
    }
    kernels::QMatmul mm(dynamic_ ? nullptr : a_qp, dynamic_ ? nullptr : b_qp, dst, dynamic_);
    Tensor ta, tb;
    if (dynamic_) {
      ta = make_f32(a_shape_, a.f);
      tb = make_f32(b_shape_, b.f);
    } else {
      ta = make_u8(a_shape_, a.q, a_qp);
      tb = transposed_b_ && b_shape_.size() >= 2 ? make_u8_transposed(b_shape_, b.q, b_qp) : make_u8(b_shape_, b.q, b_qp);
    }
    const Tensor y = mm.run(ta, tb);
    ASSERT_EQ(sizes_of(y), out_sizes);
    if (!dynamic_) {
      ASSERT_EQ(y.dtype(), DType::kU8);
      ASSERT_TRUE(y.is_quantized());
      EXPECT_EQ(*y.qparams(), *dst);
      const RefCodes ref = reference_codes(real, dst->scale(), dst->zero_point());
      const std::vector<int32_t> got = read_codes(y);
      expect_codes(label, got, ref.codes, &ref.unrounded);
      EXPECT_EQ(read_codes(mm.run(ta, tb)), got) << "second run (cached primitive) differs";
      // The operands are not modified (b is shifted to s8 into a copy).
      EXPECT_EQ(read_codes(tb), b.q);
      return;
    }
    ASSERT_EQ(y.dtype(), DType::kF32);
    const std::vector<float> got = read_floats(y);
    expect_floats(label, got, real, bound, kDynamicTolerance);
    expect_floats(label + " vs f32", got, exact, rounding, 1.0);
  }

  std::vector<int64_t> a_shape_ = shape_of({3, 4}), b_shape_ = shape_of({4, 5});
  int32_t a_zp_ = 0, b_zp_ = 0;
  bool dynamic_ = false, transposed_b_ = false, saturate_ = false;
  uint32_t seed_ = 1;
  int iterations_ = 1;
};

}  // namespace dbrq::kernel_testing
