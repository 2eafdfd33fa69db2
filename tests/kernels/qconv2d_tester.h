// Builder-style tester of kernels::QConv2d against a naive convolution over the dequantized codes,
// after XNNPACK's operator testers:
//
//   QConv2dTester().batch(2).groups(4).input_zero_point(3).Test();
//
// The reference: integer accumulation of (x - x_zp) * w_code over the window (padding is a real
// zero: it contributes nothing), then in double real = acc * s_in * s_w[k] + bias[k]
// (+ the residual's real value), the post-op on real values, and quantization with round half to
// even. Weights are generated as integer codes times their scale, so quantizing them is exact and
// the kernel's s8 weights can be checked code for code. The output parameters are picked from the
// reference's real range (optionally narrowed so that both ends saturate). Tolerance: the gate of
// kernel_test_util.h (within 1 code, at most 1% off by one, and those only at near-ties of the
// reference: oneDNN requantizes in f32). Measured: every case matches code for code.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/int8.h"
#include "tests/kernels/kernel_test_util.h"

namespace dbrq::kernel_testing {

class QConv2dTester {
 public:
  QConv2dTester& batch(int64_t v) { batch_ = v; return *this; }
  QConv2dTester& input_size(int64_t h, int64_t w) { ih_ = h; iw_ = w; return *this; }
  QConv2dTester& group_input_channels(int64_t v) { cg_ = v; return *this; }
  QConv2dTester& group_output_channels(int64_t v) { kg_ = v; return *this; }
  QConv2dTester& groups(int64_t v) { groups_ = v; return *this; }
  QConv2dTester& kernel_size(int64_t r, int64_t s) { r_ = r; s_ = s; return *this; }
  QConv2dTester& stride(int64_t h, int64_t w) { stride_ = {h, w}; return *this; }
  QConv2dTester& padding(int64_t h, int64_t w) { padding_ = {h, w}; return *this; }
  QConv2dTester& dilation(int64_t h, int64_t w) { dilation_ = {h, w}; return *this; }
  QConv2dTester& bias(bool v) { bias_ = v; return *this; }
  QConv2dTester& per_channel(bool v) { per_channel_ = v; return *this; }
  QConv2dTester& post(Post v) { post_ = v; return *this; }
  // Adds a u8 residual through oneDNN's sum post-op: run(x, &residual, &out).
  QConv2dTester& residual(bool v) { residual_ = v; return *this; }
  QConv2dTester& residual_zero_point(int32_t v) { residual_zp_ = v; return *this; }
  QConv2dTester& input_zero_point(int32_t v) { input_zp_ = v; return *this; }
  QConv2dTester& input_scale(float v) { input_scale_ = v; return *this; }
  // Input layout: channels-last (what converted models pass) or NCHW-contiguous (reordered inside).
  QConv2dTester& channels_last(bool v) { channels_last_ = v; return *this; }
  // Writes into an empty_output() buffer (always on with a residual, as the tracer runs it).
  QConv2dTester& out_buffer(bool v) { out_buffer_ = v; return *this; }
  // Output parameters covering only the middle 60% of the real range: both ends saturate.
  QConv2dTester& saturate(bool v) { saturate_ = v; return *this; }
  QConv2dTester& seed(uint32_t v) { seed_ = v; return *this; }
  QConv2dTester& iterations(int v) { iterations_ = v; return *this; }

  int64_t output_height() const {
    return (ih_ + 2 * padding_[0] - dilation_[0] * (r_ - 1) - 1) / stride_[0] + 1;
  }
  int64_t output_width() const { return (iw_ + 2 * padding_[1] - dilation_[1] * (s_ - 1) - 1) / stride_[1] + 1; }

  std::string describe() const {
    std::ostringstream os;
    os << "qconv2d n" << batch_ << " " << cg_ * groups_ << "x" << ih_ << "x" << iw_ << " -> " << kg_ * groups_ << " g"
       << groups_ << " k" << r_ << "x" << s_ << " s" << stride_[0] << "," << stride_[1] << " p" << padding_[0] << ","
       << padding_[1] << " d" << dilation_[0] << "," << dilation_[1] << (bias_ ? " bias" : "")
       << (per_channel_ ? " perchan" : " pertensor") << " " << post_name(post_) << (residual_ ? " +res(zp" + std::to_string(residual_zp_) + ")" : "")
       << " zp" << input_zp_ << (channels_last_ ? " nhwc" : " nchw") << (saturate_ ? " sat" : "");
    return os.str();
  }

  void Test() const {
    for (int it = 0; it < iterations_; ++it) TestOnce(seed_ + static_cast<uint32_t>(it));
  }

  // A residual add with a post-op that needs real units (relu6, hardswish) is not fused: the
  // constructor must refuse it with a ValueError.
  void TestRejected() const {
    std::mt19937 rng(seed_);
    Data d = MakeData(rng);
    bool thrown = false;
    try {
      kernels::QConv2d conv(Options(d));
    } catch (const ValueError& e) {
      thrown = true;
      EXPECT_NE(std::string(e.what()).find("residual"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(thrown) << describe() << ": expected a ValueError";
  }

 private:
  struct Data {
    std::vector<int32_t> x, res;   // NCHW logical codes
    std::vector<int32_t> w;        // [K, Cg, R, S] s8 codes
    std::vector<float> w_scales;   // per output channel (all equal when per-tensor)
    std::vector<float> b;
    QuantParamsPtr src, sum, dst;
    std::vector<double> real;      // reference real outputs, NCHW
  };

  int64_t k() const { return kg_ * groups_; }
  int64_t c() const { return cg_ * groups_; }

  Data MakeData(std::mt19937& rng) const {
    Data d;
    d.x = random_codes(rng, batch_ * c() * ih_ * iw_);
    d.w = random_codes(rng, k() * cg_ * r_ * s_, -127, 127);
    const float per_tensor_scale = static_cast<float>(random_double(rng, 0.002, 0.01));
    d.w_scales.resize(static_cast<size_t>(k()));
    for (auto& s : d.w_scales) s = per_channel_ ? static_cast<float>(random_double(rng, 0.002, 0.01)) : per_tensor_scale;
    if (bias_) d.b = random_floats(rng, k(), -2.0, 2.0);
    d.src = QuantParams::per_tensor(input_scale_, input_zp_);
    const int64_t oh = output_height(), ow = output_width();
    const int64_t out_n = batch_ * k() * oh * ow;
    if (residual_) {
      d.sum = QuantParams::per_tensor(static_cast<float>(random_double(rng, 0.01, 0.04)), residual_zp_);
      d.res = random_codes(rng, out_n);
    }
    // The naive convolution.
    d.real.assign(static_cast<size_t>(out_n), 0.0);
    for (int64_t n = 0; n < batch_; ++n) {
      for (int64_t oc = 0; oc < k(); ++oc) {
        const int64_t g = oc / kg_;
        for (int64_t y = 0; y < oh; ++y) {
          for (int64_t xo = 0; xo < ow; ++xo) {
            int64_t acc = 0;
            for (int64_t ci = 0; ci < cg_; ++ci) {
              const int64_t ch = g * cg_ + ci;
              for (int64_t r = 0; r < r_; ++r) {
                const int64_t iy = y * stride_[0] - padding_[0] + r * dilation_[0];
                if (iy < 0 || iy >= ih_) continue;
                for (int64_t s = 0; s < s_; ++s) {
                  const int64_t ix = xo * stride_[1] - padding_[1] + s * dilation_[1];
                  if (ix < 0 || ix >= iw_) continue;
                  const int64_t xi = ((n * c() + ch) * ih_ + iy) * iw_ + ix;
                  const int64_t wi = ((oc * cg_ + ci) * r_ + r) * s_ + s;
                  acc += static_cast<int64_t>(d.x[xi] - input_zp_) * d.w[wi];
                }
              }
            }
            const int64_t oi = ((n * k() + oc) * oh + y) * ow + xo;
            double v = static_cast<double>(acc) * input_scale_ * d.w_scales[oc];
            if (bias_) v += d.b[oc];
            if (residual_) v += dequantize(d.res[oi], d.sum->scale(), residual_zp_);
            d.real[oi] = apply_post(post_, v);
          }
        }
      }
    }
    double lo = 0.0, hi = 0.0;
    for (double v : d.real) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    if (saturate_) {
      lo *= 0.6;
      hi *= 0.6;
    }
    d.dst = qparams_for_range(lo, hi);
    return d;
  }

  kernels::QConvOptions Options(const Data& d) const {
    kernels::QConvOptions o;
    o.params.stride = stride_;
    o.params.padding = padding_;
    o.params.dilation = dilation_;
    o.params.groups = groups_;
    std::vector<float> w(d.w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = static_cast<float>(d.w[i]) * d.w_scales[i / static_cast<size_t>(cg_ * r_ * s_)];
    }
    o.weight = make_f32({k(), cg_, r_, s_}, w);
    if (bias_) o.bias = make_f32({k()}, d.b);
    o.weight_qparams = per_channel_ ? QuantParams::per_channel(d.w_scales, std::vector<int32_t>(d.w_scales.size(), 0), 0)
                                    : QuantParams::per_tensor(d.w_scales[0], 0);
    o.src_qparams = d.src;
    o.dst_qparams = d.dst;
    o.post = post_ops(post_);
    o.sum_qparams = d.sum;
    return o;
  }

  void TestOnce(uint32_t seed) const {
    const std::string label = describe() + " seed " + std::to_string(seed);
    SCOPED_TRACE(label);
    std::mt19937 rng(seed);
    const Data d = MakeData(rng);
    kernels::QConv2d conv(Options(d));

    // The kept s8 weights are exactly the generated codes.
    const Tensor& qw = conv.quantized_weight();
    ASSERT_EQ(qw.dtype(), DType::kS8);
    ASSERT_EQ(qw.numel(), static_cast<int64_t>(d.w.size()));
    int64_t weight_mismatches = 0;
    for (int64_t i = 0; i < qw.numel(); ++i) weight_mismatches += qw.value_at(i) != d.w[static_cast<size_t>(i)];
    EXPECT_EQ(weight_mismatches, 0) << "quantized weight codes differ from the generated ones";

    const MemoryFormat fmt = channels_last_ ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
    const Tensor x = make_u8({batch_, c(), ih_, iw_}, d.x, d.src, fmt);
    const std::vector<int64_t> out_sizes = {batch_, k(), output_height(), output_width()};
    Tensor residual;
    // The residual in the other layout than the input, so the copy into the buffer is a reorder too.
    if (residual_) residual = make_u8(out_sizes, d.res, d.sum, channels_last_ ? MemoryFormat::kContiguous : fmt);

    Tensor y;
    if (out_buffer_ || residual_) {
      const Tensor out = conv.empty_output(x);
      y = conv.run(x, residual_ ? &residual : nullptr, &out);
      EXPECT_EQ(y.data_ptr(), out.data_ptr()) << "the result must be written into the given buffer";
    } else {
      y = conv.run(x);
    }
    ASSERT_EQ(sizes_of(y), out_sizes);
    ASSERT_EQ(y.dtype(), DType::kU8);
    EXPECT_TRUE(y.is_channels_last());
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *d.dst);

    const RefCodes ref = reference_codes(d.real, d.dst->scale(), d.dst->zero_point());
    const std::vector<int32_t> got = read_codes(y);
    expect_codes(label, got, ref.codes, &ref.unrounded);

    // A second run takes the cached primitive: same codes.
    if (!residual_) {
      const Tensor y2 = conv.run(x);
      EXPECT_EQ(read_codes(y2), got) << "second run (cached primitive) differs";
    }
    // The input was not modified.
    EXPECT_EQ(read_codes(x), d.x);
  }

  int64_t batch_ = 1, ih_ = 7, iw_ = 6, cg_ = 3, kg_ = 4, groups_ = 1, r_ = 3, s_ = 3;
  std::array<int64_t, 2> stride_ = {1, 1}, padding_ = {1, 1}, dilation_ = {1, 1};
  bool bias_ = true, per_channel_ = true, residual_ = false, channels_last_ = true, out_buffer_ = false,
       saturate_ = false;
  Post post_ = Post::kNone;
  int32_t input_zp_ = 0, residual_zp_ = 0;
  float input_scale_ = 0.02f;
  uint32_t seed_ = 1;
  int iterations_ = 1;
};

}  // namespace dbrq::kernel_testing
