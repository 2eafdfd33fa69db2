// The int8 averaging kernels against naive references (tests/kernels/qpool_tester.h):
// qavg_pool2d, qadaptive_avg_pool2d, qmean.
#include <gtest/gtest.h>

#include "tests/kernels/qpool_tester.h"

namespace dbrq::kernel_testing {
namespace {

// ---- qavg_pool2d ----

TEST(QAvgPool2d, Default) { QAvgPool2dTester().Test(); }

TEST(QAvgPool2d, ZeroPoints) {
  for (int32_t zp : {1, 3, 128, 255}) QAvgPool2dTester().zero_point(zp).Test();
}

TEST(QAvgPool2d, Nchw) {
  // Divisor 4: a quarter of the windows are exact ties; with odd zero points the NCHW rule
  // (round(acc / d + zp)) and quantize(mean) differ there, and the kernel must follow the rule.
  for (int32_t zp : {0, 3, 128}) QAvgPool2dTester().layout(Layout::kContiguous).zero_point(zp).Test();
}

TEST(QAvgPool2d, Kernel3Stride2) { QAvgPool2dTester().kernel(3, 3).stride(2, 2).zero_point(5).Test(); }

TEST(QAvgPool2d, Overlapping) { QAvgPool2dTester().kernel(3, 2).stride(1, 1).zero_point(9).Test(); }

TEST(QAvgPool2d, Padding) {
  QAvgPool2dTester().kernel(3, 3).stride(2, 2).padding(1, 1).zero_point(7).Test();
  QAvgPool2dTester().kernel(3, 3).stride(2, 2).padding(1, 1).zero_point(7).layout(Layout::kContiguous).Test();
}

TEST(QAvgPool2d, PaddingExcluded) {
  QAvgPool2dTester().kernel(3, 3).stride(2, 2).padding(1, 1).count_include_pad(false).zero_point(7).Test();
  QAvgPool2dTester()
      .kernel(3, 3)
      .stride(2, 2)
      .padding(1, 1)
      .count_include_pad(false)
      .zero_point(7)
      .layout(Layout::kContiguous)
      .Test();
}

TEST(QAvgPool2d, AsymmetricPadding) { QAvgPool2dTester().kernel(3, 2).stride(1, 2).padding(1, 0).zero_point(2).Test(); }

TEST(QAvgPool2d, CeilMode) {
  // 8x9 with 3x3 / 2: the last window hangs past the input.
  QAvgPool2dTester().kernel(3, 3).stride(2, 2).ceil_mode(true).zero_point(11).Test();
  QAvgPool2dTester().kernel(2, 2).stride(2, 2).ceil_mode(true).input_size(7, 7).Test();
}

TEST(QAvgPool2d, CeilModePadding) {
  for (bool include : {true, false}) {
    for (Layout l : {Layout::kChannelsLast, Layout::kContiguous}) {
      QAvgPool2dTester()
          .kernel(3, 3)
          .stride(2, 2)
          .padding(1, 1)
          .ceil_mode(true)
          .count_include_pad(include)
          .input_size(8, 10)
          .zero_point(13)
          .layout(l)
          .Test();
    }
  }
}

TEST(QAvgPool2d, CeilModeDropsWindowStartingInPadding) {
  // (o - 1) * stride >= in + pad: PyTorch drops that last window.
  QAvgPool2dTester().kernel(2, 2).stride(2, 2).padding(1, 1).ceil_mode(true).input_size(6, 6).Test();
}

TEST(QAvgPool2d, GlobalWindow) { QAvgPool2dTester().kernel(8, 9).input_size(8, 9).zero_point(100).Test(); }

TEST(QAvgPool2d, SlicedInput) { QAvgPool2dTester().layout(Layout::kSliced).zero_point(3).Test(); }

TEST(QAvgPool2d, ManyChannels) { QAvgPool2dTester().channels(32).input_size(6, 6).kernel(3, 3).stride(1, 1).Test(); }

// Channels-last inputs run a loop vectorized over 16 channels (kernels/int8_pool.cc) with a scalar
// tail: channel counts on both sides of the vector width, with padding either way and ceil_mode.
TEST(QAvgPool2d, ChannelsAroundVectorWidth) {
  for (int64_t c : {15, 16, 17, 33, 70}) {
    for (bool include : {true, false}) {
      QAvgPool2dTester()
          .channels(c)
          .kernel(3, 3)
          .stride(2, 2)
          .padding(1, 1)
          .ceil_mode(true)
          .count_include_pad(include)
          .zero_point(static_cast<int32_t>(c))
          .seed(static_cast<uint32_t>(c))
          .Test();
    }
  }
}

// ---- qadaptive_avg_pool2d ----

TEST(QAdaptiveAvgPool2d, Default) { QAdaptiveAvgPool2dTester().Test(); }

TEST(QAdaptiveAvgPool2d, Global) {
  QAdaptiveAvgPool2dTester().output_size(1, 1).zero_point(3).Test();
  QAdaptiveAvgPool2dTester().output_size(1, 1).zero_point(3).layout(Layout::kContiguous).Test();
}

TEST(QAdaptiveAvgPool2d, Divisible) { QAdaptiveAvgPool2dTester().input_size(8, 12).output_size(4, 3).zero_point(9).Test(); }

TEST(QAdaptiveAvgPool2d, OverlappingWindows) {
  QAdaptiveAvgPool2dTester().input_size(5, 7).output_size(3, 4).zero_point(1).Test();
}

TEST(QAdaptiveAvgPool2d, Nchw) {
  for (int32_t zp : {0, 3, 128}) {
    QAdaptiveAvgPool2dTester().input_size(8, 12).output_size(4, 3).layout(Layout::kContiguous).zero_point(zp).Test();
    QAdaptiveAvgPool2dTester().input_size(5, 7).output_size(3, 4).layout(Layout::kContiguous).zero_point(zp).Test();
  }
}

TEST(QAdaptiveAvgPool2d, Upsampling) { QAdaptiveAvgPool2dTester().input_size(3, 2).output_size(5, 4).Test(); }

TEST(QAdaptiveAvgPool2d, TallWindows) {
  // 6 x 41 windows: NHWC multiplies by 1 / (kh * kw), NCHW by (1 / kh) / kw.
  QAdaptiveAvgPool2dTester().input_size(6, 41).output_size(1, 1).channels(16).zero_point(5).Test();
  QAdaptiveAvgPool2dTester().input_size(6, 41).output_size(1, 1).channels(16).zero_point(5).layout(Layout::kContiguous).Test();
}

TEST(QAdaptiveAvgPool2d, SlicedInput) { QAdaptiveAvgPool2dTester().layout(Layout::kSliced).zero_point(3).Test(); }

// ---- qmean ----

TEST(QMean, Default) { QMeanTester().Test(); }  // count 35: no exact ties

TEST(QMean, KeepDim) { QMeanTester().keepdim(true).Test(); }

TEST(QMean, OneDim) {
  QMeanTester().dims({1}).Test();  // count 3
  QMeanTester().dims({-1}).keepdim(true).Test();  // count 7
}

TEST(QMean, AllDims) { QMeanTester().sizes({3, 5, 7}).dims({}).Test(); }

TEST(QMean, ChannelsLast) {
  QMeanTester().layout(Layout::kChannelsLast).Test();
  QMeanTester().layout(Layout::kChannelsLast).dims({1}).keepdim(true).Test();
}

TEST(QMean, Transposed) { QMeanTester().sizes({3, 5, 7}).dims({1}).layout(Layout::kTransposed).Test(); }

TEST(QMean, PowerOfTwoTies) {
  // count 4 and 8 with power-of-two scales: the f32 path is exact, so exact ties round half to even.
  QMeanTester().sizes({2, 3, 4, 4}).dims({3}).qparams(0.125f, 3).Test();
  QMeanTester().sizes({2, 8, 5}).dims({1}).qparams(1.f / 64, 128).Test();
}

TEST(QMean, DecimalTies) {
  // count 6 with scale 0.043: exact ties in real numbers, decided by f32 rounding.
  QMeanTester().sizes({40, 6, 5}).dims({1}).real_ties(true).Test();
}

}  // namespace
}  // namespace dbrq::kernel_testing
