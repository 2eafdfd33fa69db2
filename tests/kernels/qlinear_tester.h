// Builder-style tester of kernels::QLinear against a naive matrix product over the dequantized
// codes:
//
//   QLinearTester().batch_dims({2, 3}).input_channels(17).output_channels(5).post(Post::kRelu).Test();
//   QLinearTester().dynamic(true).per_channel(false).Test();
//
// Static: x u8 [..., K] -> u8 [..., N]. Reference in double: acc = sum_k (x - x_zp) * w_code,
// real = acc * s_in * s_w[n] + bias[n], the post-op, quantization with round half to even; checked
// with the u8 gate of kernel_test_util.h.
//
// Static with f32 output (float_output: no destination parameters, the linear of a transformer
// recipe that only fp32 ops read): x u8 [..., K] -> f32 [..., N], the same real values as the
// static reference before quantization, post-op included, within the dynamic tolerance below.
//
// Dynamic: x f32 [..., K] (or an already quantized u8 tensor) -> f32 [..., N]. The reference
// quantizes x from its own range as the kernel documents it (u8, range widened to include 0,
// scale = (max - min) / 255, zero point = round(-min / scale)) and then computes
// acc * s_in * s_w[n] + bias[n] in double. Tolerance, per element, relative to the magnitude of the
// terms before cancellation |acc| * s_in * s_w[n] + |bias[n]|: 1e-6. The accumulation is exact
// (s32); what remains are the f32 roundings of the reciprocal scales (1/s_in, 1/s_w, their product,
// its reciprocal), of the bias in accumulator units and of the final multiply-add: at most ~8
// roundings of 2^-24 each, i.e. < 5e-7. A second, independent check compares with the f32 product
// of the unquantized input: the error must be within what rounding the input explains,
// 0.5 * s_in * sum_k |w[n, k]| (plus the same 1e-6 margin).
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

class QLinearTester {
 public:
  QLinearTester& batch_dims(std::vector<int64_t> v) { batch_dims_ = std::move(v); return *this; }
  QLinearTester& input_channels(int64_t v) { k_ = v; return *this; }
  QLinearTester& output_channels(int64_t v) { n_ = v; return *this; }
  QLinearTester& bias(bool v) { bias_ = v; return *this; }
  QLinearTester& per_channel(bool v) { per_channel_ = v; return *this; }
  QLinearTester& post(Post v) { post_ = v; return *this; }
  QLinearTester& input_zero_point(int32_t v) { input_zp_ = v; return *this; }
  QLinearTester& dynamic(bool v) { dynamic_ = v; return *this; }
  // Dynamic mode with an input that is already u8 (used as it comes).
  QLinearTester& quantized_input(bool v) { quantized_input_ = v; return *this; }
  QLinearTester& saturate(bool v) { saturate_ = v; return *this; }
  QLinearTester& float_output(bool v) { float_output_ = v; return *this; }
  QLinearTester& seed(uint32_t v) { seed_ = v; return *this; }
  QLinearTester& iterations(int v) { iterations_ = v; return *this; }
  // Runs one kernel object on this many different inputs (dynamic: each with its own range, so
  // its own scale and zero point, all served by one primitive that must not keep stale values).
  QLinearTester& calls(int v) { calls_ = v; return *this; }

  static constexpr double kDynamicTolerance = 1e-6;

  std::string describe() const {
    std::ostringstream os;
    os << (dynamic_ ? "dynamic qlinear [" : "qlinear [");
    for (int64_t d : batch_dims_) os << d << ",";
    os << k_ << "] -> " << n_ << (bias_ ? " bias" : "") << (per_channel_ ? " perchan" : " pertensor") << " "
       << post_name(post_) << " zp" << input_zp_ << (quantized_input_ ? " u8in" : "") << (saturate_ ? " sat" : "")
       << (float_output_ ? " f32out" : "");
    return os.str();
  }

  void Test() const {
    for (int it = 0; it < iterations_; ++it) TestOnce(seed_ + static_cast<uint32_t>(it));
  }

 private:
  // One call's input and its reference.
  struct Call {
    std::vector<int32_t> xq;  // codes (given, or the reference's dynamic quantization of xf)
    std::vector<float> xf;    // dynamic f32 input
    float s_in = 0.f;
    int32_t zp_in = 0;
    std::vector<double> real, bound, unquantized, rounding;
  };

  void TestOnce(uint32_t seed) const {
    const std::string label = describe() + " seed " + std::to_string(seed);
    SCOPED_TRACE(label);
    std::mt19937 rng(seed);
    const int64_t m = numel_of(batch_dims_);
    std::vector<int64_t> in_sizes = batch_dims_, out_sizes = batch_dims_;
    in_sizes.push_back(k_);
    out_sizes.push_back(n_);

    // Weights: integer codes times their scale (exact to quantize).
    const std::vector<int32_t> wq = random_codes(rng, n_ * k_, -127, 127);
    std::vector<float> w_scales(static_cast<size_t>(n_));
    const float one_scale = static_cast<float>(random_double(rng, 0.002, 0.02));
    for (auto& s : w_scales) s = per_channel_ ? static_cast<float>(random_double(rng, 0.002, 0.02)) : one_scale;
    std::vector<float> w(wq.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(wq[i]) * w_scales[i / static_cast<size_t>(k_)];
    std::vector<float> b;
    if (bias_) b = random_floats(rng, n_, -2.0, 2.0);

    kernels::QLinearOptions o;
    o.weight = make_f32({n_, k_}, w);
    if (bias_) o.bias = make_f32({n_}, b);
    o.weight_qparams = per_channel_ ? QuantParams::per_channel(w_scales, std::vector<int32_t>(w_scales.size(), 0), 0)
                                    : QuantParams::per_tensor(one_scale, 0);
    o.dynamic = dynamic_;

    // Static calls share the converted input parameters; dynamic ones each have their own range.
    const float static_scale = static_cast<float>(random_double(rng, 0.01, 0.03));
    std::vector<Call> calls(static_cast<size_t>(calls_));
    for (Call& c : calls) {
      if (dynamic_ && !quantized_input_) {
        const double spread = random_double(rng, 0.5, 2.0), shift = random_double(rng, -1.0, 1.0);
        c.xf = random_floats(rng, m * k_, spread * (shift - 1.5), spread * (shift + 1.5));
        double mn = 0.0, mx = 0.0;
        for (float v : c.xf) {
          mn = std::min(mn, static_cast<double>(v));
          mx = std::max(mx, static_cast<double>(v));
        }
        const double scale = std::max((mx - mn) / 255.0, 1e-8);
        c.s_in = static_cast<float>(scale);
        c.zp_in = static_cast<int32_t>(std::min(std::max(std::nearbyint(-mn / scale), 0.0), 255.0));
        c.xq.resize(c.xf.size());
        for (size_t i = 0; i < c.xf.size(); ++i) c.xq[i] = quantize_u8(c.xf[i], c.s_in, c.zp_in);
      } else {
        c.s_in = dynamic_ ? static_cast<float>(random_double(rng, 0.01, 0.03)) : static_scale;
        c.zp_in = input_zp_;
        c.xq = random_codes(rng, m * k_);
      }
      // The naive product.
      const size_t out_n = static_cast<size_t>(m * n_);
      c.real.resize(out_n);
      c.bound.resize(out_n);
      c.unquantized.resize(out_n);
      c.rounding.resize(out_n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n_; ++j) {
          int64_t acc = 0;
          double exact = 0.0, wsum = 0.0;
          for (int64_t l = 0; l < k_; ++l) {
            acc += static_cast<int64_t>(c.xq[i * k_ + l] - c.zp_in) * wq[j * k_ + l];
            if (!c.xf.empty()) exact += static_cast<double>(c.xf[i * k_ + l]) * w[j * k_ + l];
            wsum += std::abs(static_cast<double>(w[j * k_ + l]));
          }
          const double bj = bias_ ? b[j] : 0.0;
          const size_t oi = static_cast<size_t>(i * n_ + j);
          c.real[oi] = apply_post(dynamic_ ? Post::kNone : post_, static_cast<double>(acc) * c.s_in * w_scales[j] + bj);
          c.bound[oi] = std::abs(static_cast<double>(acc)) * c.s_in * w_scales[j] + std::abs(bj) + 1e-30;
          c.unquantized[oi] = exact + bj;
          c.rounding[oi] = 0.5 * c.s_in * wsum + kDynamicTolerance * c.bound[oi];
        }
      }
    }

    if (!dynamic_) {
      double lo = 0.0, hi = 0.0;
      for (const Call& c : calls) {
        for (double v : c.real) {
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
      }
      if (saturate_) {
        lo *= 0.6;
        hi *= 0.6;
      }
      o.src_qparams = QuantParams::per_tensor(static_scale, input_zp_);
      if (!float_output_) o.dst_qparams = qparams_for_range(lo, hi);
      o.post = post_ops(post_);
    }
    const QuantParamsPtr dst = o.dst_qparams;
    kernels::QLinear linear(std::move(o));

    for (size_t ci = 0; ci < calls.size(); ++ci) {
      const Call& c = calls[ci];
      const std::string call_label = calls.size() > 1 ? label + " call " + std::to_string(ci) : label;
      SCOPED_TRACE(call_label);
      const Tensor x = c.xf.empty() ? make_u8(in_sizes, c.xq, QuantParams::per_tensor(c.s_in, c.zp_in))
                                    : make_f32(in_sizes, c.xf);
      const Tensor y = linear.run(x);
      ASSERT_EQ(sizes_of(y), out_sizes);
      if (!dynamic_ && !float_output_) {
        ASSERT_EQ(y.dtype(), DType::kU8);
        ASSERT_TRUE(y.is_quantized());
        EXPECT_EQ(*y.qparams(), *dst);
        const RefCodes ref = reference_codes(c.real, dst->scale(), dst->zero_point());
        expect_codes(call_label, read_codes(y), ref.codes, &ref.unrounded);
        continue;
      }
      ASSERT_EQ(y.dtype(), DType::kF32);
      EXPECT_FALSE(y.is_quantized());
      const std::vector<float> got = read_floats(y);
      expect_floats(call_label, got, c.real, c.bound, kDynamicTolerance);
      if (!c.xf.empty()) {
        // Independent of the reference's choice of parameters: the error against the unquantized
        // product is what rounding the input to its own scale explains.
        expect_floats(call_label + " vs f32", got, c.unquantized, c.rounding, 1.0);
      }
    }
    // Dynamic: scales and zero points are runtime arguments. Static: fixed for every call. Either
    // way every call of one shape shares a primitive.
    if (dynamic_ || float_output_) {
      EXPECT_EQ(linear.num_primitives(), 1u);
    }
  }

  std::vector<int64_t> batch_dims_ = shape_of({3});
  int64_t k_ = 19, n_ = 7;
  bool bias_ = true, per_channel_ = true, dynamic_ = false, quantized_input_ = false, saturate_ = false,
       float_output_ = false;
  Post post_ = Post::kNone;
  int32_t input_zp_ = 0;
  uint32_t seed_ = 1;
  int iterations_ = 1;
  int calls_ = 2;
};

}  // namespace dbrq::kernel_testing
