// The int8 elementwise kernels against naive references (tests/kernels/qelementwise_tester.h):
// quantize_to, the eager quantize, requantize, make_lut + apply_lut, qadd, qmul, qclamp, qsoftmax.
#include <gtest/gtest.h>

#include <limits>

#include "tests/kernels/qelementwise_tester.h"

namespace dbrq::kernel_testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- quantize_to ----

TEST(QuantizeTo, Default) { QuantizeTester().Test(); }

TEST(QuantizeTo, ZeroPoints) {
  for (int32_t zp : {1, 3, 128, 255}) QuantizeTester().zero_point(zp).Test();
}

TEST(QuantizeTo, NchwToChannelsLast) {
  // The first conv's input: NCHW f32 quantized straight into NHWC u8.
  QuantizeTester().format(MemoryFormat::kChannelsLast).zero_point(9).Test();
}

TEST(QuantizeTo, ChannelsLastPreserved) { QuantizeTester().input_layout(Layout::kChannelsLast).zero_point(7).Test(); }

TEST(QuantizeTo, ChannelsLastToContiguous) {
  QuantizeTester().input_layout(Layout::kChannelsLast).format(MemoryFormat::kContiguous).Test();
}

TEST(QuantizeTo, TransposedPreserved) { QuantizeTester().input_layout(Layout::kTransposed).zero_point(40).Test(); }

// A row-major tensor whose dim of size 1 has a stride of its own (a [T, B, C] view of a batch of
// one transposed from [B, T, C]): once recursed forever (its "contiguous" copy was itself).
TEST(QuantizeTo, BatchOfOneTransposed) {
  QuantizeTester().sizes({5, 1, 7}).input_layout(Layout::kTransposed).zero_point(40).Test();
  QuantizeTester().sizes({1, 6}).input_layout(Layout::kTransposed).Test();
}

TEST(QuantizeTo, SlicedInput) { QuantizeTester().input_layout(Layout::kSliced).zero_point(40).Test(); }

TEST(QuantizeTo, SlicedInputChannelsLast) {
  QuantizeTester().input_layout(Layout::kSliced).format(MemoryFormat::kChannelsLast).Test();
}

TEST(QuantizeTo, ChannelsLastRequestOn3D) {
  // kChannelsLast only applies to 4-D tensors; others keep their layout.
  QuantizeTester().sizes({3, 5, 7}).format(MemoryFormat::kChannelsLast).Test();
}

TEST(QuantizeTo, OneDim) { QuantizeTester().sizes({1000}).zero_point(100).Test(); }

TEST(QuantizeTo, Saturation) { QuantizeTester().out_of_range(true).zero_point(50).Test(); }

TEST(QuantizeTo, SaturationChannelsLast) {
  QuantizeTester().out_of_range(true).format(MemoryFormat::kChannelsLast).zero_point(200).Test();
}

TEST(QuantizeTo, RoundHalfToEven) {
  // Exact halves (scale a power of two): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, ...
  QuantizeTester().ties(true).scale(0.25f).zero_point(0).sizes({1000}).Test();
  QuantizeTester().ties(true).scale(0.125f).zero_point(3).sizes({1000}).Test();
  QuantizeTester().ties(true).scale(1.f / 64).zero_point(128).sizes({2, 3, 8, 8}).format(MemoryFormat::kChannelsLast).Test();
}

TEST(QuantizeTo, RoundHalfToEvenByHand) {
  // Independent of the tester: a few hand-written halves.
  const std::vector<float> x = {0.5f, 1.5f, 2.5f, 3.5f, -0.5f, 254.5f, 255.5f, 300.f};
  const std::vector<int32_t> expected = {0, 2, 2, 4, 0, 254, 255, 255};
  const Tensor y = kernels::quantize_to(make_f32({8}, x), QuantParams::per_tensor(1.f, 0), DType::kU8,
                                        MemoryFormat::kPreserve);
  EXPECT_EQ(read_codes(y), expected);
  // zp + round_half_even(x / scale): the tie is decided before the zero point is added.
  const std::vector<int32_t> expected_zp = {11, 13, 13, 15, 11, 255, 255, 255};
  const Tensor y2 = kernels::quantize_to(make_f32({8}, x), QuantParams::per_tensor(1.f, 11), DType::kU8,
                                         MemoryFormat::kPreserve);
  EXPECT_EQ(read_codes(y2), expected_zp);
}

// kernels::quantize (the eager op and dynamic quantization), per tensor to u8: the vector loop
// gives zp + round_half_even(x * (1 / scale)) saturated, over more than one vector, with a tail.
TEST(EagerQuantize, U8ByHand) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {0.5f, 1.5f, 2.5f, 3.5f, -0.5f, 254.5f, 255.5f, 300.f, -300.f, inf, -inf, nan};
  std::vector<int32_t> expected = {11, 13, 13, 15, 11, 255, 255, 255, 0, 255, 0, 0};
  for (int i = 0; i < 25; ++i) {  // 37 values: two vectors of 16 and a tail of 5
    x.push_back(0.25f * static_cast<float>(i) - 3.f);
    expected.push_back(11 + static_cast<int32_t>(std::nearbyint(0.25 * i - 3.0)));
  }
  const int64_t n = static_cast<int64_t>(x.size());
  const Tensor y = kernels::quantize(make_f32({n}, x), QuantParams::per_tensor(1.f, 11), DType::kU8);
  EXPECT_EQ(read_codes(y), expected);
}

// ---- requantize ----

TEST(Requantize, Default) { RequantizeTester().Test(); }

TEST(Requantize, Narrowing) { RequantizeTester().input_qparams(0.047f, 128).output_qparams(0.019f, 100).Test(); }

TEST(Requantize, Widening) { RequantizeTester().input_qparams(0.011f, 0).output_qparams(0.093f, 3).Test(); }

TEST(Requantize, ChannelsLast) { RequantizeTester().layout(Layout::kChannelsLast).Test(); }

TEST(Requantize, Transposed) { RequantizeTester().layout(Layout::kTransposed).Test(); }

TEST(Requantize, Sliced) { RequantizeTester().layout(Layout::kSliced).Test(); }

TEST(Requantize, SameParameters) { RequantizeTester().input_qparams(0.05f, 7).output_qparams(0.05f, 7).Test(); }

TEST(Requantize, ShiftOnly) {
  // Same scale, other zero point: code + 20, saturating at 255; exact on both sides.
  RequantizeTester().input_qparams(0.05f, 7).output_qparams(0.05f, 27).exact(true).Test();
}

TEST(Requantize, PowerOfTwoTies) {
  // Scale ratio 2 (exact in f32 and double): odd codes land on exact halves.
  RequantizeTester().input_qparams(0.125f, 3).output_qparams(0.25f, 64).exact(true).Test();
  RequantizeTester().input_qparams(1.f / 256, 0).output_qparams(1.f / 64, 0).exact(true).Test();
}

TEST(Requantize, DecimalTies) {
  // Scale ratios with small denominators put whole classes of codes on exact real ties:
  // 0.03 -> 0.04 ((q - zp) = 2 mod 4), 0.05 -> 0.02 (odd q - zp), 0.01 -> 0.1 ((q - zp) = 5 mod 10).
  RequantizeTester().input_qparams(0.03f, 0).output_qparams(0.04f, 0).real_ties(true).Test();
  RequantizeTester().input_qparams(0.03f, 9).output_qparams(0.04f, 17).real_ties(true).Test();
  RequantizeTester().input_qparams(0.05f, 128).output_qparams(0.02f, 100).real_ties(true).Test();
  RequantizeTester().input_qparams(0.01f, 0).output_qparams(0.1f, 3).real_ties(true).Test();
}

// ---- make_lut + apply_lut ----

TEST(Lut, Functions) {
  using Fn = LutTester::Fn;
  for (Fn fn : {Fn::kIdentity, Fn::kSigmoid, Fn::kTanh, Fn::kSquare, Fn::kExpNeg, Fn::kLog, Fn::kStep}) {
    LutTester().function(fn).Test();
  }
}

TEST(Lut, InputParameters) {
  LutTester().function(LutTester::Fn::kTanh).input_qparams(0.02f, 0).Test();
  LutTester().function(LutTester::Fn::kTanh).input_qparams(0.1f, 255).Test();
  LutTester().function(LutTester::Fn::kSquare).input_qparams(0.013f, 77).Test();
}

TEST(Lut, FixedOutputParameters) {
  // sigmoid / tanh's fixed parameters.
  LutTester().function(LutTester::Fn::kSigmoid).output_qparams(1.f / 256, 0).Test();
  LutTester().function(LutTester::Fn::kTanh).output_qparams(2.f / 256, 128).Test();
}

TEST(Lut, SaturatingOutput) { LutTester().function(LutTester::Fn::kIdentity).output_qparams(0.01f, 128).Test(); }

TEST(Lut, Layouts) {
  for (Layout l : {Layout::kChannelsLast, Layout::kTransposed, Layout::kSliced}) {
    LutTester().function(LutTester::Fn::kSigmoid).layout(l).Test();
  }
}

// ---- qadd / qmul ----

TEST(QAdd, Default) { QBinaryTester().Test(); }

TEST(QAdd, Relu) { QBinaryTester().relu(true).Test(); }

TEST(QAdd, ZeroPoints) {
  QBinaryTester().a_qparams(0.02f, 0).b_qparams(0.02f, 0).Test();
  QBinaryTester().a_qparams(0.05f, 255).b_qparams(0.01f, 128).relu(true).Test();
}

TEST(QAdd, SameScale) { QBinaryTester().a_qparams(0.03f, 10).b_qparams(0.03f, 10).Test(); }

TEST(QAdd, Saturation) { QBinaryTester().saturate(true).Test(); }

TEST(QAdd, Layouts) {
  QBinaryTester().a_layout(Layout::kChannelsLast).b_layout(Layout::kChannelsLast).Test();
  QBinaryTester().a_layout(Layout::kChannelsLast).b_layout(Layout::kContiguous).relu(true).Test();
  QBinaryTester().a_layout(Layout::kContiguous).b_layout(Layout::kChannelsLast).Test();
  QBinaryTester().a_layout(Layout::kTransposed).b_layout(Layout::kSliced).Test();
  QBinaryTester().a_layout(Layout::kSliced).b_layout(Layout::kTransposed).Test();
}

TEST(QAdd, Large) { QBinaryTester().sizes({2, 16, 16, 16}).relu(true).Test(); }

TEST(QMul, Default) { QBinaryTester().op(QBinaryTester::Op::kMul).Test(); }

TEST(QMul, Relu) { QBinaryTester().op(QBinaryTester::Op::kMul).relu(true).Test(); }

TEST(QMul, ZeroPoints) {
  QBinaryTester().op(QBinaryTester::Op::kMul).a_qparams(0.02f, 0).b_qparams(0.04f, 0).Test();
  QBinaryTester().op(QBinaryTester::Op::kMul).a_qparams(0.05f, 255).b_qparams(0.01f, 3).relu(true).Test();
}

TEST(QMul, Saturation) { QBinaryTester().op(QBinaryTester::Op::kMul).saturate(true).Test(); }

TEST(QMul, Layouts) {
  QBinaryTester().op(QBinaryTester::Op::kMul).a_layout(Layout::kChannelsLast).b_layout(Layout::kContiguous).Test();
  QBinaryTester().op(QBinaryTester::Op::kMul).a_layout(Layout::kSliced).b_layout(Layout::kChannelsLast).Test();
}

TEST(QMul, Large) { QBinaryTester().op(QBinaryTester::Op::kMul).sizes({2, 16, 16, 16}).Test(); }

// ---- qclamp ----

TEST(QClamp, Relu6) { QClampTester().Test(); }

TEST(QClamp, Relu) { QClampTester().range(0.0, kInf).Test(); }

TEST(QClamp, Hardtanh) { QClampTester().range(-1.0, 1.0).qparams(0.02f, 128).Test(); }

TEST(QClamp, BoundsBetweenCodes) { QClampTester().range(-0.333, 0.777).qparams(0.05f, 60).Test(); }

TEST(QClamp, BoundsOutsideRange) { QClampTester().range(-100.0, 100.0).Test(); }

TEST(QClamp, LowerOnly) { QClampTester().range(-0.5, kInf).Test(); }

TEST(QClamp, UpperOnly) { QClampTester().range(-kInf, 1.5).Test(); }

// Finite bounds beyond the codes' range (and beyond int32 once divided by the scale): before, the
// upper bound's code overflowed the int32 conversion and every output became code 0.
TEST(QClamp, FiniteBoundsBeyondTheCodes) {
  QClampTester().range(0.0, 1e10).Test();
  QClampTester().range(-1e10, 0.5).Test();
  QClampTester().range(-1e30, 1e30).qparams(0.02f, 128).Test();
  QClampTester().range(0.0, 3.4028234663852886e38).Test();
  QClampTester().range(-1.7976931348623157e308, 1.7976931348623157e308).Test();
}

TEST(QClamp, Layouts) {
  for (Layout l : {Layout::kChannelsLast, Layout::kTransposed, Layout::kSliced}) QClampTester().layout(l).Test();
}

// ---- qsoftmax ----

TEST(QSoftmax, Default) { QSoftmaxTester().Test(); }

TEST(QSoftmax, Dims) {
  QSoftmaxTester().sizes({2, 3, 4, 5}).dim(1).Test();
  QSoftmaxTester().sizes({2, 3, 4, 5}).dim(-1).Test();
  QSoftmaxTester().sizes({2, 3, 4, 5}).dim(0).Test();
  QSoftmaxTester().sizes({6, 7, 3}).dim(1).Test();
}

TEST(QSoftmax, ChannelsLast) { QSoftmaxTester().sizes({2, 6, 3, 4}).dim(1).layout(Layout::kChannelsLast).Test(); }

TEST(QSoftmax, Transposed) { QSoftmaxTester().sizes({3, 8, 5}).dim(-1).layout(Layout::kTransposed).Test(); }

TEST(QSoftmax, InputParameters) {
  QSoftmaxTester().input_qparams(0.02f, 0).Test();
  QSoftmaxTester().input_qparams(0.2f, 200).sizes({5, 33}).Test();
}

TEST(QSoftmax, OtherOutputParameters) { QSoftmaxTester().output_qparams(0.002f, 10).Test(); }

TEST(QSoftmax, LongRows) { QSoftmaxTester().sizes({3, 300}).Test(); }

}  // namespace
}  // namespace dbrq::kernel_testing
