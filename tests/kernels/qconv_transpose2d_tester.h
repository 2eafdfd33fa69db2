// Builder-style tester of kernels::QConvTranspose2d against a naive transposed convolution over
// the dequantized codes (the style of qconv2d_tester.h):
//
//   QConvTranspose2dTester().stride(2, 2).output_padding(1, 1).per_channel(true).Test();
//
// The reference scatters every input pixel: integer accumulation of (x - x_zp) * w_code into
// output (iy * stride - padding + r * dilation, ...), then in double real = acc * s_in * s_w[k] +
// bias[k], the post-op on real values, and quantization with round half to even. Weights are
// integer codes times their scale (output-major [K, C/groups, R, S], as the kernel takes them), so
// quantizing them is exact. Tolerance: kernel_test_util.h's gate (within 1 code, at most 1% off by
// one, only at near-ties).
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

class QConvTranspose2dTester {
 public:
  QConvTranspose2dTester& batch(int64_t v) { batch_ = v; return *this; }
  QConvTranspose2dTester& input_size(int64_t h, int64_t w) { ih_ = h; iw_ = w; return *this; }
  QConvTranspose2dTester& group_input_channels(int64_t v) { cg_ = v; return *this; }
  QConvTranspose2dTester& group_output_channels(int64_t v) { kg_ = v; return *this; }
  QConvTranspose2dTester& groups(int64_t v) { groups_ = v; return *this; }
  QConvTranspose2dTester& kernel_size(int64_t r, int64_t s) { r_ = r; s_ = s; return *this; }
  QConvTranspose2dTester& stride(int64_t h, int64_t w) { stride_ = {h, w}; return *this; }
  QConvTranspose2dTester& padding(int64_t h, int64_t w) { padding_ = {h, w}; return *this; }
  QConvTranspose2dTester& output_padding(int64_t h, int64_t w) { output_padding_ = {h, w}; return *this; }
  QConvTranspose2dTester& dilation(int64_t h, int64_t w) { dilation_ = {h, w}; return *this; }
  QConvTranspose2dTester& bias(bool v) { bias_ = v; return *this; }
  QConvTranspose2dTester& per_channel(bool v) { per_channel_ = v; return *this; }
  QConvTranspose2dTester& post(Post v) { post_ = v; return *this; }
  QConvTranspose2dTester& input_zero_point(int32_t v) { input_zp_ = v; return *this; }
  QConvTranspose2dTester& channels_last(bool v) { channels_last_ = v; return *this; }
  QConvTranspose2dTester& seed(uint32_t v) { seed_ = v; return *this; }

  int64_t output_height() const {
    return (ih_ - 1) * stride_[0] - 2 * padding_[0] + dilation_[0] * (r_ - 1) + output_padding_[0] + 1;
  }
  int64_t output_width() const {
    return (iw_ - 1) * stride_[1] - 2 * padding_[1] + dilation_[1] * (s_ - 1) + output_padding_[1] + 1;
  }

  std::string describe() const {
    std::ostringstream os;
    os << "qconv_transpose2d n" << batch_ << " " << c() << "x" << ih_ << "x" << iw_ << " -> " << k() << " g" << groups_
       << " k" << r_ << "x" << s_ << " s" << stride_[0] << "," << stride_[1] << " p" << padding_[0] << ","
       << padding_[1] << " op" << output_padding_[0] << "," << output_padding_[1] << " d" << dilation_[0] << ","
       << dilation_[1] << (bias_ ? " bias" : "") << (per_channel_ ? " perchan" : " pertensor") << " "
       << post_name(post_) << " zp" << input_zp_ << (channels_last_ ? " nhwc" : " nchw");
    return os.str();
  }

  void Test() const {
    const std::string label = describe();
    SCOPED_TRACE(label);
    std::mt19937 rng(seed_);
    const std::vector<int32_t> xs = random_codes(rng, batch_ * c() * ih_ * iw_);
    const std::vector<int32_t> ws = random_codes(rng, k() * cg_ * r_ * s_, -127, 127);
    const float per_tensor_scale = static_cast<float>(random_double(rng, 0.002, 0.01));
    std::vector<float> w_scales(static_cast<size_t>(k()));
    for (auto& s : w_scales) s = per_channel_ ? static_cast<float>(random_double(rng, 0.002, 0.01)) : per_tensor_scale;
    std::vector<float> b;
    if (bias_) b = random_floats(rng, k(), -2.0, 2.0);
    const QuantParamsPtr src = QuantParams::per_tensor(0.02f, input_zp_);

    // The naive transposed convolution: every input pixel scattered through the kernel.
    const int64_t oh = output_height(), ow = output_width();
    std::vector<int64_t> acc(static_cast<size_t>(batch_ * k() * oh * ow), 0);
    for (int64_t n = 0; n < batch_; ++n) {
      for (int64_t ch = 0; ch < c(); ++ch) {
        const int64_t g = ch / cg_, ci = ch % cg_;
        for (int64_t iy = 0; iy < ih_; ++iy) {
          for (int64_t ix = 0; ix < iw_; ++ix) {
            const int64_t xv = xs[static_cast<size_t>(((n * c() + ch) * ih_ + iy) * iw_ + ix)] - input_zp_;
            for (int64_t j = 0; j < kg_; ++j) {
              const int64_t oc = g * kg_ + j;
              for (int64_t r = 0; r < r_; ++r) {
                const int64_t oy = iy * stride_[0] - padding_[0] + r * dilation_[0];
                if (oy < 0 || oy >= oh) continue;
                for (int64_t s = 0; s < s_; ++s) {
                  const int64_t ox = ix * stride_[1] - padding_[1] + s * dilation_[1];
                  if (ox < 0 || ox >= ow) continue;
                  acc[static_cast<size_t>(((n * k() + oc) * oh + oy) * ow + ox)] +=
                      xv * ws[static_cast<size_t>(((oc * cg_ + ci) * r_ + r) * s_ + s)];
                }
              }
            }
          }
        }
      }
    }
    std::vector<double> real(acc.size());
    double lo = 0.0, hi = 0.0;
    for (size_t i = 0; i < acc.size(); ++i) {
      const size_t oc = (i / static_cast<size_t>(oh * ow)) % static_cast<size_t>(k());
      double v = static_cast<double>(acc[i]) * 0.02f * w_scales[oc];
      if (bias_) v += b[oc];
      real[i] = apply_post(post_, v);
      lo = std::min(lo, real[i]);
      hi = std::max(hi, real[i]);
    }
    const QuantParamsPtr dst = qparams_for_range(lo, hi);

    kernels::QConvTranspose2dOptions o;
    o.params.stride = stride_;
    o.params.padding = padding_;
    o.params.output_padding = output_padding_;
    o.params.dilation = dilation_;
    o.params.groups = groups_;
    std::vector<float> w(ws.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(ws[i]) * w_scales[i / static_cast<size_t>(cg_ * r_ * s_)];
    o.weight = make_f32({k(), cg_, r_, s_}, w);
    if (bias_) o.bias = make_f32({k()}, b);
    o.weight_qparams = per_channel_ ? QuantParams::per_channel(w_scales, std::vector<int32_t>(w_scales.size(), 0), 0)
                                    : QuantParams::per_tensor(w_scales[0], 0);
    o.src_qparams = src;
    o.dst_qparams = dst;
    o.post = post_ops(post_);
    kernels::QConvTranspose2d conv(std::move(o));

    const Tensor& qw = conv.quantized_weight();
    ASSERT_EQ(qw.dtype(), DType::kS8);
    int64_t weight_mismatches = 0;
    for (int64_t i = 0; i < qw.numel(); ++i) weight_mismatches += qw.value_at(i) != ws[static_cast<size_t>(i)];
    EXPECT_EQ(weight_mismatches, 0) << "quantized weight codes differ from the generated ones";

    const Tensor x = make_u8({batch_, c(), ih_, iw_}, xs, src,
                             channels_last_ ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous);
    const Tensor y = conv.run(x);
    ASSERT_EQ(sizes_of(y), (std::vector<int64_t>{batch_, k(), oh, ow}));
    ASSERT_EQ(y.dtype(), DType::kU8);
    EXPECT_TRUE(y.is_channels_last());
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *dst);
    const RefCodes ref = reference_codes(real, dst->scale(), dst->zero_point());
    const std::vector<int32_t> got = read_codes(y);
    expect_codes(label, got, ref.codes, &ref.unrounded);
    EXPECT_EQ(read_codes(conv.run(x)), got) << "second run (cached primitive) differs";
    EXPECT_EQ(read_codes(x), xs) << "the input was modified";
  }

 private:
  int64_t k() const { return kg_ * groups_; }
  int64_t c() const { return cg_ * groups_; }

  int64_t batch_ = 1, ih_ = 5, iw_ = 4, cg_ = 3, kg_ = 4, groups_ = 1, r_ = 3, s_ = 3;
  std::array<int64_t, 2> stride_ = {1, 1}, padding_ = {0, 0}, output_padding_ = {0, 0}, dilation_ = {1, 1};
  bool bias_ = true, per_channel_ = true, channels_last_ = true;
  Post post_ = Post::kNone;
  int32_t input_zp_ = 0;
  uint32_t seed_ = 1;
};

}  // namespace dbrq::kernel_testing
