// Builder-style tester of the int8 batch norm on its own (kernels::QChannelAffine built from
// kernels::batch_norm_affine) against naive references:
//
//   QBatchNormTester().sizes({2, 40, 5, 5}).layout(Layout::kChannelsLast).relu(true).Test();
//
// Two references per run. (1) Real arithmetic in double: dequantize, (x - mean) / sqrt(var + eps)
// * weight + bias, relu, quantize; the gate of kernel_test_util.h (nothing more than 1 off, and
// off-by-one codes only at near-ties, where the kernel's f32 arithmetic may round the other way).
// (2) PyTorch 1.13's own formula, written out here: per-channel alpha / beta in float as its
// compute_fused_params, then round(fma(alpha, q - in_zp, beta)) + out_zp per element: the kernel
// must give exactly these codes whatever the layout and however many channels or positions fall
// into its vector loop or its scalar tail.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/int8.h"
#include "tests/kernels/kernel_test_util.h"

namespace dbrq::kernel_testing {

class QBatchNormTester {
 public:
  // [N, C], [N, C, L], [N, C, H, W] or [N, C, D, H, W]
  QBatchNormTester& sizes(std::vector<int64_t> v) { sizes_ = std::move(v); return *this; }
  QBatchNormTester& layout(Layout v) { layout_ = v; return *this; }
  QBatchNormTester& relu(bool v) { relu_ = v; return *this; }
  QBatchNormTester& affine(bool v) { affine_ = v; return *this; }
  QBatchNormTester& eps(double v) { eps_ = v; return *this; }
  QBatchNormTester& input_zero_point(int32_t v) { in_zp_ = v; return *this; }
  QBatchNormTester& seed(uint32_t v) { seed_ = v; return *this; }

  void Test() const {
    std::ostringstream os;
    os << "qbatch_norm [";
    for (size_t i = 0; i < sizes_.size(); ++i) os << (i ? ", " : "") << sizes_[i];
    os << "] " << layout_name(layout_) << (relu_ ? " relu" : "") << (affine_ ? "" : " no_affine") << " eps" << eps_
       << " zp" << in_zp_;
    const std::string label = os.str();
    SCOPED_TRACE(label);
    std::mt19937 rng(seed_);
    const int64_t c = sizes_.at(1), n = numel_of(sizes_), inner = n / (sizes_[0] * c);
    const std::vector<int32_t> codes = random_codes(rng, n);
    const std::vector<float> mean = random_floats(rng, c, -1.0, 1.0), var = random_floats(rng, c, 0.05, 3.0);
    const std::vector<float> w = random_floats(rng, c, -1.5, 1.5), b = random_floats(rng, c, -0.5, 0.5);
    const double in_scale = 0.031;
    const QuantParamsPtr in = QuantParams::per_tensor(static_cast<float>(in_scale), in_zp_);

    // (1) real values in double, and the output parameters an observer would pick for them.
    std::vector<double> real(static_cast<size_t>(n));
    double lo = 0, hi = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t ch = static_cast<size_t>((i / inner) % c);
      const double x = dequantize(codes[static_cast<size_t>(i)], static_cast<float>(in_scale), in_zp_);
      double y = (x - mean[ch]) / std::sqrt(static_cast<double>(var[ch]) + eps_);
      if (affine_) y = y * w[ch] + b[ch];
      if (relu_) y = std::max(y, 0.0);
      real[static_cast<size_t>(i)] = y;
      lo = std::min(lo, y);
      hi = std::max(hi, y);
    }
    const QuantParamsPtr out = qparams_for_range(lo, hi);
    const RefCodes ref = reference_codes(real, out->scale(), out->zero_point());

    const Tensor tw = affine_ ? make_f32({c}, w) : Tensor(), tb = affine_ ? make_f32({c}, b) : Tensor();
    const kernels::ChannelAffine a =
        kernels::batch_norm_affine(make_f32({c}, mean), make_f32({c}, var), tw, tb, eps_, in->scale(), out->scale());
    // (2) PyTorch's formula.
    ASSERT_EQ(a.alpha.size(), static_cast<size_t>(c));
    std::vector<float> alpha(static_cast<size_t>(c)), beta(static_cast<size_t>(c));
    for (size_t ch = 0; ch < static_cast<size_t>(c); ++ch) {
      const float inv_sigma = static_cast<float>(1.0 / std::sqrt(var[ch] + static_cast<float>(eps_)));
      const float wv = affine_ ? w[ch] : 1.f, bv = affine_ ? b[ch] : 0.f;
      alpha[ch] = static_cast<float>(inv_sigma * wv * (static_cast<double>(in->scale()) / out->scale()));
      beta[ch] = static_cast<float>((bv - mean[ch] * inv_sigma * wv) / static_cast<double>(out->scale()));
      EXPECT_EQ(a.alpha[ch], alpha[ch]) << "alpha of channel " << ch;
      EXPECT_EQ(a.beta[ch], beta[ch]) << "beta of channel " << ch;
    }
    std::vector<int32_t> exact(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const size_t ch = static_cast<size_t>((i / inner) % c);
      const float y = std::fma(alpha[ch], static_cast<float>(codes[static_cast<size_t>(i)] - in_zp_), beta[ch]);
      int64_t q = static_cast<int64_t>(std::nearbyint(y)) + out->zero_point();
      if (relu_) q = std::max<int64_t>(q, out->zero_point());
      exact[static_cast<size_t>(i)] = static_cast<int32_t>(std::min<int64_t>(std::max<int64_t>(q, 0), 255));
    }

    const kernels::QChannelAffine k(a, in, out, relu_);
    const Tensor x = make_u8(sizes_, codes, in, layout_);
    const Tensor y = k.run(x);
    ASSERT_EQ(sizes_of(y), sizes_);
    ASSERT_EQ(y.dtype(), DType::kU8);
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *out);
    if (layout_ == Layout::kChannelsLast) {
      EXPECT_TRUE(y.is_channels_last());
    }
    if (layout_ == Layout::kContiguous) {
      EXPECT_TRUE(y.is_contiguous());
    }
    const std::vector<int32_t> got = read_codes(y);
    expect_codes(label, got, ref.codes, &ref.unrounded);
    expect_codes_exact(label + " vs PyTorch's formula", got, exact);
  }

 private:
  std::vector<int64_t> sizes_ = {2, 24, 5, 7};
  Layout layout_ = Layout::kChannelsLast;
  bool relu_ = false;
  bool affine_ = true;
  double eps_ = 1e-5;
  int32_t in_zp_ = 128;
  uint32_t seed_ = 2024;
};

}  // namespace dbrq::kernel_testing
