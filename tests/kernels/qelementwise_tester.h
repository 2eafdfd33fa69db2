// Builder-style testers of the int8 elementwise kernels of kernels/int8.h against naive references
// in double over the dequantized codes:
//
//   QuantizeTester().sizes({2, 3, 4, 5}).zero_point(7).input_layout(Layout::kChannelsLast).Test();
//   RequantizeTester().input_qparams(0.03f, 10).output_qparams(0.05f, 128).Test();
//   LutTester().function(LutTester::Fn::kTanh).Test();
//   QBinaryTester().op(QBinaryTester::Op::kMul).relu(true).Test();
//   QClampTester().range(-0.5, 1.0).Test();
//   QSoftmaxTester().sizes({2, 3, 4, 5}).dim(1).Test();
//
// Every reference is: dequantize each code ((q - zp) * scale, in double), apply the op's
// real-valued definition in double, quantize with round half to even and saturate. Results pass
// the u8 gate of kernel_test_util.h (within 1 code, at most 1% off by one and only at near-ties:
// the kernels compute in f32, with PyTorch's FMA dequantization and reciprocal scales, so a real
// value within a few f32 ulps of a rounding boundary may round to the neighbour). Cases whose ties
// are exact on both sides (power-of-two scales) must match code for code; requantize with decimal
// scale ratios that make exact real ties is checked against the kernel's documented f32 formula
// (see RequantizeTester::Test).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/int8.h"
#include "tests/kernels/kernel_test_util.h"

namespace dbrq::kernel_testing {

inline std::string sizes_string(const std::vector<int64_t>& sizes) { return shape_to_string(sizes); }

// ---------------------------------------------------------------------------------------------
// quantize_to: f32 -> u8.

class QuantizeTester {
 public:
  QuantizeTester& sizes(std::vector<int64_t> v) { sizes_ = std::move(v); return *this; }
  QuantizeTester& scale(float v) { scale_ = v; return *this; }
  QuantizeTester& zero_point(int32_t v) { zp_ = v; return *this; }
  QuantizeTester& input_layout(Layout v) { input_layout_ = v; return *this; }
  QuantizeTester& format(MemoryFormat v) { format_ = v; return *this; }
  // Inputs exactly halfway between two codes (scale must be a power of two so that both the
  // kernel's f32 and the reference's double arithmetic are exact): round half to even, exactly.
  QuantizeTester& ties(bool v) { ties_ = v; return *this; }
  // Values beyond the representable range, and +-infinity: saturation.
  QuantizeTester& out_of_range(bool v) { out_of_range_ = v; return *this; }
  QuantizeTester& seed(uint32_t v) { seed_ = v; return *this; }

  void Test() const {
    std::ostringstream os;
    os << "quantize_to " << sizes_string(sizes_) << " " << layout_name(input_layout_) << " -> format "
       << static_cast<int>(format_) << " s" << scale_ << " zp" << zp_ << (ties_ ? " ties" : "")
       << (out_of_range_ ? " saturating" : "");
    const std::string label = os.str();
    SCOPED_TRACE(label);
    std::mt19937 rng(seed_);
    const int64_t n = numel_of(sizes_);
    std::vector<float> x;
    if (ties_) {
      // (k + 1/2) * scale for integer k: exact halves in code units.
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = static_cast<int64_t>(std::uniform_int_distribution<int>(-zp_ - 5, 255 - zp_ + 4)(rng));
        x.push_back(static_cast<float>((static_cast<double>(k) + 0.5) * scale_));
      }
    } else {
      const double lo = -static_cast<double>(zp_) * scale_, hi = (255.0 - zp_) * scale_;
      const double margin = out_of_range_ ? 0.5 * (hi - lo) : 0.0;
      x = random_floats(rng, n, lo - margin, hi + margin);
      if (out_of_range_ && n >= 4) {
        x[0] = std::numeric_limits<float>::infinity();
        x[1] = -std::numeric_limits<float>::infinity();
        x[2] = 1e30f;
        x[3] = -1e30f;
      }
    }
    // The input in its layout: written through strides like the u8 tensors.
    Tensor xt;
    {
      Tensor shape = empty_u8(sizes_, input_layout_);  // for its strides only
      std::vector<int64_t> strides(shape.strides().begin(), shape.strides().end());
      if (input_layout_ == Layout::kSliced) {
        std::vector<int64_t> wide = sizes_;
        wide.back() += 3;
        xt = Tensor::empty(wide, DType::kF32).raw_narrow(static_cast<int64_t>(sizes_.size()) - 1, 1, sizes_.back());
      } else if (input_layout_ == Layout::kContiguous) {
        xt = Tensor::empty(sizes_, DType::kF32);
      } else {
        xt = Tensor::empty_strided(sizes_, strides, DType::kF32);
      }
      float* p = xt.raw_mutable_data<float>();
      for (int64_t i = 0; i < n; ++i) p[offset_of_logical(xt, i)] = x[static_cast<size_t>(i)];
    }
    const QuantParamsPtr qp = QuantParams::per_tensor(scale_, zp_);
    const Tensor y = kernels::quantize_to(xt, qp, DType::kU8, format_);
    ASSERT_EQ(sizes_of(y), sizes_);
    ASSERT_EQ(y.dtype(), DType::kU8);
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *qp);
    // The promised layout: kPreserve keeps a dense input's layout; kChannelsLast applies to 4-D.
    if (format_ == MemoryFormat::kContiguous) {
      EXPECT_TRUE(y.is_contiguous());
    }
    if (format_ == MemoryFormat::kChannelsLast && sizes_.size() == 4) {
      EXPECT_TRUE(y.is_channels_last());
    }
    if (format_ == MemoryFormat::kPreserve && xt.is_non_overlapping_and_dense()) {
      for (size_t d = 0; d < sizes_.size(); ++d) {
        const int64_t dim = static_cast<int64_t>(d);
        if (sizes_[d] != 1) {
          EXPECT_EQ(y.stride(dim), xt.stride(dim)) << "dim " << d;
        }
      }
    }
    const RefCodes ref = reference_codes(std::vector<double>(x.begin(), x.end()), scale_, zp_);
    if (ties_) {
      expect_codes_exact(label, read_codes(y), ref.codes);
    } else {
      expect_codes(label, read_codes(y), ref.codes, &ref.unrounded);
    }
  }

 private:
  std::vector<int64_t> sizes_ = shape_of({2, 3, 4, 5});
  float scale_ = 0.037f;
  int32_t zp_ = 0;
  Layout input_layout_ = Layout::kContiguous;
  MemoryFormat format_ = MemoryFormat::kPreserve;
  bool ties_ = false, out_of_range_ = false;
  uint32_t seed_ = 1;
};

// ---------------------------------------------------------------------------------------------
// requantize: u8 -> u8 with other parameters.

class RequantizeTester {
 public:
  RequantizeTester& sizes(std::vector<int64_t> v) { sizes_ = std::move(v); return *this; }
  RequantizeTester& input_qparams(float s, int32_t zp) { in_s_ = s; in_zp_ = zp; return *this; }
  RequantizeTester& output_qparams(float s, int32_t zp) { out_s_ = s; out_zp_ = zp; return *this; }
  RequantizeTester& layout(Layout v) { layout_ = v; return *this; }
  // Both sides exact (power-of-two scale ratios, equal scales): every code must match.
  RequantizeTester& exact(bool v) { exact_ = v; return *this; }
  // Scales whose ratio makes exact real ties (see Test()).
  RequantizeTester& real_ties(bool v) { real_ties_ = v; return *this; }
  RequantizeTester& seed(uint32_t v) { seed_ = v; return *this; }

  void Test() const {
    std::ostringstream os;
    os << "requantize " << sizes_string(sizes_) << " " << layout_name(layout_) << " (" << in_s_ << ", " << in_zp_
       << ") -> (" << out_s_ << ", " << out_zp_ << ")";
    const std::string label = os.str();
    SCOPED_TRACE(label);
    std::mt19937 rng(seed_);
    // Every code at least once, then random ones.
    std::vector<int32_t> codes = random_codes(rng, numel_of(sizes_));
    for (size_t i = 0; i < codes.size() && i < 256; ++i) codes[i] = static_cast<int32_t>(i);
    const QuantParamsPtr in = QuantParams::per_tensor(in_s_, in_zp_), out = QuantParams::per_tensor(out_s_, out_zp_);
    const Tensor x = make_u8(sizes_, codes, in, layout_);
    const Tensor y = kernels::requantize(x, out);
    ASSERT_EQ(sizes_of(y), sizes_);
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *out);
    if (x.is_non_overlapping_and_dense()) {
      EXPECT_EQ(y.strides(), x.strides()) << "layout not kept";
    }
    std::vector<double> real(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) real[i] = dequantize(codes[i], in_s_, in_zp_);
    const RefCodes ref = reference_codes(real, out_s_, out_zp_);
    const std::vector<int32_t> got = read_codes(y);
    if (exact_) {
      expect_codes_exact(label, got, ref.codes);
      return;
    }
    if (!real_ties_) {
      expect_codes(label, got, ref.codes, &ref.unrounded);
      return;
    }
    // Scale ratios such as 0.05 / 0.02 = 5 / 2 put whole classes of codes on exact real ties. Which
    // way such a tie rounds is decided by the f32 rounding of the scales: the double reference
    // (the f32 scales taken exactly) and the kernel's f32 arithmetic legitimately differ there.
    // So: within 1 code of the double reference with every difference at a near-tie (no 1% cap,
    // the ties are the point of the case) ...
    expect_codes(label, got, ref.codes, &ref.unrounded, /*max_off_by_one=*/1.0);
    // ... and ties broken exactly as the kernel documents: PyTorch's Tensor.dequantize() ((q - zp)
    // * scale in f32, no FMA) followed by quantize_per_tensor (x * f32(1 / double(scale)), round
    // half to even).
    const float inv = static_cast<float>(1.0 / static_cast<double>(out_s_));
    std::vector<int32_t> f32(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) {
      const float v = (static_cast<float>(codes[i]) - static_cast<float>(in_zp_)) * in_s_;
      const float r = std::nearbyint(v * inv);
      f32[i] = std::min(std::max(static_cast<int32_t>(r) + out_zp_, 0), 255);
    }
    expect_codes_exact(label + " f32 tie-breaking", got, f32);
  }

 private:
  std::vector<int64_t> sizes_ = shape_of({2, 4, 8, 8});
  float in_s_ = 0.031f, out_s_ = 0.047f;
  int32_t in_zp_ = 5, out_zp_ = 120;
  Layout layout_ = Layout::kContiguous;
  bool exact_ = false, real_ties_ = false;
  uint32_t seed_ = 1;
};

// ---------------------------------------------------------------------------------------------
// make_lut + apply_lut: any real function through a 256-entry table.

class LutTester {
 public:
  enum class Fn { kIdentity, kSigmoid, kTanh, kSquare, kExpNeg, kLog, kStep };
  LutTester& function(Fn v) { fn_ = v; return *this; }
  LutTester& sizes(std::vector<int64_t> v) { sizes_ = std::move(v); return *this; }
  LutTester& input_qparams(float s, int32_t zp) { in_s_ = s; in_zp_ = zp; return *this; }
  // Output parameters; by default chosen from the function's range over the input codes.
  LutTester& output_qparams(float s, int32_t zp) { out_s_ = s; out_zp_ = zp; return *this; }
  LutTester& layout(Layout v) { layout_ = v; return *this; }
  LutTester& seed(uint32_t v) { seed_ = v; return *this; }

  static double eval(Fn fn, double x) {
    switch (fn) {
      case Fn::kIdentity:
        return x;
      case Fn::kSigmoid:
        return 1.0 / (1.0 + std::exp(-x));
      case Fn::kTanh:
        return std::tanh(x);
      case Fn::kSquare:
        return x * x / 4.0;
      case Fn::kExpNeg:
        return std::exp(-x);  // overflows to +inf in f32 for the lowest codes: saturates
      case Fn::kLog:
        return std::log(x);   // NaN below 0 (the table maps NaN to the zero point: real 0), -inf at 0
      case Fn::kStep:
        return x >= 0.0 ? 1.0 : -1.0;
    }
    return x;
  }
  static const char* fn_name(Fn fn) {
    static const char* const kNames[] = {"identity", "sigmoid", "tanh", "square", "exp_neg", "log", "step"};
    return kNames[static_cast<int>(fn)];
  }

  void Test() const {
    std::ostringstream os;
    os << "lut " << fn_name(fn_) << " " << sizes_string(sizes_) << " " << layout_name(layout_) << " (" << in_s_ << ", "
       << in_zp_ << ")";
    std::mt19937 rng(seed_);
    const QuantParamsPtr in = QuantParams::per_tensor(in_s_, in_zp_);
    QuantParamsPtr out;
    if (out_s_ > 0.f) {
      out = QuantParams::per_tensor(out_s_, out_zp_);
    } else {
      double lo = 0.0, hi = 0.0;
      for (int q = 0; q < 256; ++q) {
        const double v = eval(fn_, dequantize(q, in_s_, in_zp_));
        if (std::isfinite(v)) {
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
      }
      out = qparams_for_range(lo, hi);
    }
    os << " -> (" << out->scale() << ", " << out->zero_point() << ")";
    const std::string label = os.str();
    SCOPED_TRACE(label);

    // The table itself, entry by entry.
    const kernels::Lut lut = kernels::make_lut(*in, *out, [&](float x) { return eval(fn_, static_cast<double>(x)); });
    std::vector<int32_t> table(256);
    std::vector<double> table_real(256);
    for (int q = 0; q < 256; ++q) {
      table[q] = lut[q];
      table_real[q] = eval(fn_, dequantize(q, in_s_, in_zp_));
    }
    const RefCodes table_ref = reference_codes(table_real, out->scale(), out->zero_point());
    expect_codes(label + " table", table, table_ref.codes, &table_ref.unrounded);

    // Applied to a tensor: every code at least once.
    std::vector<int32_t> codes = random_codes(rng, numel_of(sizes_));
    for (size_t i = 0; i < codes.size() && i < 256; ++i) codes[i] = static_cast<int32_t>(255 - i);
    const Tensor x = make_u8(sizes_, codes, in, layout_);
    const Tensor y = kernels::apply_lut(x, lut, out);
    ASSERT_EQ(sizes_of(y), sizes_);
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *out);
    if (x.is_non_overlapping_and_dense()) {
      EXPECT_EQ(y.strides(), x.strides()) << "layout not kept";
    }
    std::vector<int32_t> expected(codes.size()), via_table(codes.size());
    std::vector<double> unrounded(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) {
      expected[i] = table_ref.codes[codes[i]];
      unrounded[i] = table_ref.unrounded[codes[i]];
      via_table[i] = lut[codes[i]];
    }
    const std::vector<int32_t> got = read_codes(y);
    // apply_lut is a pure lookup: exactly the table's entries.
    EXPECT_EQ(got, via_table) << label << ": apply_lut differs from a lookup in its table";
    expect_codes(label, got, expected, &unrounded);
  }

 private:
  Fn fn_ = Fn::kSigmoid;
  std::vector<int64_t> sizes_ = shape_of({2, 3, 8, 7});
  float in_s_ = 0.05f, out_s_ = 0.f;
  int32_t in_zp_ = 128, out_zp_ = 0;
  Layout layout_ = Layout::kContiguous;
  uint32_t seed_ = 1;
};

// ---------------------------------------------------------------------------------------------
// qadd / qmul of two u8 tensors of equal sizes.

class QBinaryTester {
 public:
  enum class Op { kAdd, kMul };
  QBinaryTester& op(Op v) { op_ = v; return *this; }
  QBinaryTester& relu(bool v) { relu_ = v; return *this; }
  QBinaryTester& sizes(std::vector<int64_t> v) { sizes_ = std::move(v); return *this; }
  QBinaryTester& a_qparams(float s, int32_t zp) { a_s_ = s; a_zp_ = zp; return *this; }
  QBinaryTester& b_qparams(float s, int32_t zp) { b_s_ = s; b_zp_ = zp; return *this; }
  QBinaryTester& a_layout(Layout v) { a_layout_ = v; return *this; }
  QBinaryTester& b_layout(Layout v) { b_layout_ = v; return *this; }
  QBinaryTester& saturate(bool v) { saturate_ = v; return *this; }
  QBinaryTester& seed(uint32_t v) { seed_ = v; return *this; }

  void Test() const {
    std::ostringstream os;
    os << (op_ == Op::kAdd ? "qadd" : "qmul") << (relu_ ? "_relu " : " ") << sizes_string(sizes_) << " "
       << layout_name(a_layout_) << "+" << layout_name(b_layout_) << " a(" << a_s_ << ", " << a_zp_ << ") b(" << b_s_
       << ", " << b_zp_ << ")" << (saturate_ ? " sat" : "");
    std::mt19937 rng(seed_);
    const int64_t n = numel_of(sizes_);
    const std::vector<int32_t> ac = random_codes(rng, n), bc = random_codes(rng, n);
    std::vector<double> real(static_cast<size_t>(n));
    double lo = 0.0, hi = 0.0;
    for (size_t i = 0; i < real.size(); ++i) {
      const double a = dequantize(ac[i], a_s_, a_zp_), b = dequantize(bc[i], b_s_, b_zp_);
      double v = op_ == Op::kAdd ? a + b : a * b;
      if (relu_) v = std::max(v, 0.0);
      real[i] = v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    if (saturate_) {
      lo *= 0.6;
      hi *= 0.6;
    }
    const QuantParamsPtr out = qparams_for_range(lo, hi);
    os << " -> (" << out->scale() << ", " << out->zero_point() << ")";
    const std::string label = os.str();
    SCOPED_TRACE(label);
    const Tensor a = make_u8(sizes_, ac, QuantParams::per_tensor(a_s_, a_zp_), a_layout_);
    const Tensor b = make_u8(sizes_, bc, QuantParams::per_tensor(b_s_, b_zp_), b_layout_);
    const Tensor y = op_ == Op::kAdd ? kernels::qadd(a, b, out, relu_) : kernels::qmul(a, b, out, relu_);
    ASSERT_EQ(sizes_of(y), sizes_);
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *out);
    // The result takes a's layout (walked in a's memory order).
    if (a.is_non_overlapping_and_dense()) {
      EXPECT_EQ(y.strides(), a.strides()) << "not in a's layout";
    }
    const RefCodes ref = reference_codes(real, out->scale(), out->zero_point());
    expect_codes(label, read_codes(y), ref.codes, &ref.unrounded);
    EXPECT_EQ(read_codes(a), ac);
    EXPECT_EQ(read_codes(b), bc);
  }

 private:
  Op op_ = Op::kAdd;
  bool relu_ = false, saturate_ = false;
  std::vector<int64_t> sizes_ = shape_of({2, 3, 5, 7});
  float a_s_ = 0.021f, b_s_ = 0.034f;
  int32_t a_zp_ = 100, b_zp_ = 30;
  Layout a_layout_ = Layout::kContiguous, b_layout_ = Layout::kContiguous;
  uint32_t seed_ = 1;
};

// ---------------------------------------------------------------------------------------------
// qclamp: clamp of real values on codes, same parameters.

class QClampTester {
 public:
  QClampTester& range(double lo, double hi) { lo_ = lo; hi_ = hi; return *this; }
  QClampTester& qparams(float s, int32_t zp) { s_ = s; zp_ = zp; return *this; }
  QClampTester& sizes(std::vector<int64_t> v) { sizes_ = std::move(v); return *this; }
  QClampTester& layout(Layout v) { layout_ = v; return *this; }
  QClampTester& seed(uint32_t v) { seed_ = v; return *this; }

  void Test() const {
    std::ostringstream os;
    os << "qclamp [" << lo_ << ", " << hi_ << "] " << sizes_string(sizes_) << " " << layout_name(layout_) << " (" << s_
       << ", " << zp_ << ")";
    const std::string label = os.str();
    SCOPED_TRACE(label);
    std::mt19937 rng(seed_);
    std::vector<int32_t> codes = random_codes(rng, numel_of(sizes_));
    for (size_t i = 0; i < codes.size() && i < 256; ++i) codes[i] = static_cast<int32_t>(i);
    const QuantParamsPtr qp = QuantParams::per_tensor(s_, zp_);
    const Tensor x = make_u8(sizes_, codes, qp, layout_);
    const Tensor y = kernels::qclamp(x, lo_, hi_);
    ASSERT_EQ(sizes_of(y), sizes_);
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *qp);
    std::vector<double> real(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) real[i] = std::min(std::max(dequantize(codes[i], s_, zp_), lo_), hi_);
    const RefCodes ref = reference_codes(real, s_, zp_);
    expect_codes(label, read_codes(y), ref.codes, &ref.unrounded);
  }

 private:
  double lo_ = 0.0, hi_ = 6.0;
  float s_ = 0.05f;
  int32_t zp_ = 60;
  std::vector<int64_t> sizes_ = shape_of({2, 4, 6, 6});
  Layout layout_ = Layout::kContiguous;
  uint32_t seed_ = 1;
};

// ---------------------------------------------------------------------------------------------
// qsoftmax: dequantize, softmax over a dim, quantize to the output parameters.

class QSoftmaxTester {
 public:
  QSoftmaxTester& sizes(std::vector<int64_t> v) { sizes_ = std::move(v); return *this; }
  QSoftmaxTester& dim(int64_t v) { dim_ = v; return *this; }
  QSoftmaxTester& input_qparams(float s, int32_t zp) { in_s_ = s; in_zp_ = zp; return *this; }
  QSoftmaxTester& output_qparams(float s, int32_t zp) { out_s_ = s; out_zp_ = zp; return *this; }
  QSoftmaxTester& layout(Layout v) { layout_ = v; return *this; }
  QSoftmaxTester& seed(uint32_t v) { seed_ = v; return *this; }

  void Test() const {
    std::ostringstream os;
    os << "qsoftmax dim " << dim_ << " " << sizes_string(sizes_) << " " << layout_name(layout_) << " (" << in_s_ << ", "
       << in_zp_ << ") -> (" << out_s_ << ", " << out_zp_ << ")";
    const std::string label = os.str();
    SCOPED_TRACE(label);
    std::mt19937 rng(seed_);
    const std::vector<int32_t> codes = random_codes(rng, numel_of(sizes_));
    const Tensor x = make_u8(sizes_, codes, QuantParams::per_tensor(in_s_, in_zp_), layout_);
    const QuantParamsPtr out = QuantParams::per_tensor(out_s_, out_zp_);
    const Tensor y = kernels::qsoftmax(x, dim_, out);
    ASSERT_EQ(sizes_of(y), sizes_);
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *out);
    // Softmax over `d`, in double: outer x len x inner in logical row-major order.
    const int64_t d = dim_ < 0 ? dim_ + static_cast<int64_t>(sizes_.size()) : dim_;
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i) outer *= sizes_[i];
    for (size_t i = static_cast<size_t>(d) + 1; i < sizes_.size(); ++i) inner *= sizes_[i];
    const int64_t len = sizes_[d];
    std::vector<double> real(codes.size());
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t in = 0; in < inner; ++in) {
        double mx = -std::numeric_limits<double>::infinity(), sum = 0.0;
        auto at = [&](int64_t l) { return static_cast<size_t>((o * len + l) * inner + in); };
        for (int64_t l = 0; l < len; ++l) mx = std::max(mx, dequantize(codes[at(l)], in_s_, in_zp_));
        for (int64_t l = 0; l < len; ++l) sum += std::exp(dequantize(codes[at(l)], in_s_, in_zp_) - mx);
        for (int64_t l = 0; l < len; ++l) {
          real[at(l)] = std::exp(dequantize(codes[at(l)], in_s_, in_zp_) - mx) / sum;
        }
      }
    }
    const RefCodes ref = reference_codes(real, out_s_, out_zp_);
    expect_codes(label, read_codes(y), ref.codes, &ref.unrounded);
  }

 private:
  std::vector<int64_t> sizes_ = shape_of({4, 10});
  int64_t dim_ = -1;
  float in_s_ = 0.08f, out_s_ = 1.f / 256.f;
  int32_t in_zp_ = 128, out_zp_ = 0;
  Layout layout_ = Layout::kContiguous;
  uint32_t seed_ = 1;
};

}  // namespace dbrq::kernel_testing
