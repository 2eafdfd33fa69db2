// kernels::QConv2d against a naive convolution (tests/kernels/qconv2d_tester.h).
#include <gtest/gtest.h>

#include "tests/kernels/qconv2d_tester.h"

namespace dbrq::kernel_testing {
namespace {

TEST(QConv2d, Default) { QConv2dTester().iterations(3).Test(); }

TEST(QConv2d, Batch) { QConv2dTester().batch(3).Test(); }

TEST(QConv2d, NoBias) { QConv2dTester().bias(false).Test(); }

TEST(QConv2d, PerTensorWeights) { QConv2dTester().per_channel(false).Test(); }

TEST(QConv2d, PerTensorWeightsNoBias) { QConv2dTester().per_channel(false).bias(false).input_zero_point(17).Test(); }

TEST(QConv2d, InputZeroPoint) {
  for (int32_t zp : {1, 3, 128, 255}) QConv2dTester().input_zero_point(zp).Test();
}

TEST(QConv2d, InputZeroPointWithPadding) {
  // Padding must be a real zero (code == zero point), not code 0.
  QConv2dTester().input_zero_point(200).padding(2, 1).kernel_size(3, 3).Test();
}

TEST(QConv2d, NchwInput) { QConv2dTester().channels_last(false).input_zero_point(5).Test(); }

TEST(QConv2d, NchwInputBatch) { QConv2dTester().channels_last(false).batch(2).groups(2).Test(); }

TEST(QConv2d, Stride) { QConv2dTester().input_size(9, 8).stride(2, 2).Test(); }

TEST(QConv2d, AsymmetricStride) { QConv2dTester().input_size(9, 8).stride(2, 1).padding(0, 1).Test(); }

TEST(QConv2d, AsymmetricPadding) { QConv2dTester().padding(2, 0).kernel_size(3, 2).Test(); }

TEST(QConv2d, Dilation) { QConv2dTester().input_size(9, 9).dilation(2, 2).padding(2, 2).Test(); }

TEST(QConv2d, AsymmetricDilation) { QConv2dTester().input_size(9, 9).dilation(2, 1).padding(1, 0).Test(); }

TEST(QConv2d, Pointwise) {
  QConv2dTester().kernel_size(1, 1).padding(0, 0).group_input_channels(16).group_output_channels(8).Test();
}

TEST(QConv2d, PointwiseStride) {
  QConv2dTester().kernel_size(1, 1).padding(0, 0).stride(2, 2).group_input_channels(8).input_zero_point(9).Test();
}

TEST(QConv2d, LargeKernel) { QConv2dTester().input_size(11, 10).kernel_size(7, 7).padding(3, 3).stride(2, 2).Test(); }

TEST(QConv2d, Groups) { QConv2dTester().batch(2).groups(4).input_zero_point(3).Test(); }

TEST(QConv2d, GroupsPerTensor) { QConv2dTester().groups(3).per_channel(false).input_zero_point(100).Test(); }

TEST(QConv2d, Depthwise) {
  QConv2dTester().groups(8).group_input_channels(1).group_output_channels(1).input_zero_point(4).Test();
}

TEST(QConv2d, DepthwiseMultiplier) {
  QConv2dTester().groups(6).group_input_channels(1).group_output_channels(2).stride(2, 2).input_size(8, 8).Test();
}

TEST(QConv2d, DepthwiseNchw) {
  QConv2dTester().groups(8).group_input_channels(1).group_output_channels(1).channels_last(false).Test();
}

TEST(QConv2d, Relu) { QConv2dTester().post(Post::kRelu).iterations(2).Test(); }

TEST(QConv2d, ReluPerTensorZeroPoint) { QConv2dTester().post(Post::kRelu).per_channel(false).input_zero_point(7).Test(); }

TEST(QConv2d, Relu6) { QConv2dTester().post(Post::kRelu6).iterations(2).Test(); }

TEST(QConv2d, Relu6Groups) { QConv2dTester().post(Post::kRelu6).groups(2).input_zero_point(50).Test(); }

TEST(QConv2d, Hardswish) { QConv2dTester().post(Post::kHardswish).iterations(2).Test(); }

TEST(QConv2d, HardswishDepthwiseNchw) {
  QConv2dTester()
      .post(Post::kHardswish)
      .groups(4)
      .group_input_channels(1)
      .group_output_channels(1)
      .channels_last(false)
      .input_zero_point(30)
      .Test();
}

TEST(QConv2d, Saturation) { QConv2dTester().saturate(true).input_zero_point(3).Test(); }

TEST(QConv2d, SaturationRelu6) { QConv2dTester().saturate(true).post(Post::kRelu6).Test(); }

TEST(QConv2d, SaturationHardswish) { QConv2dTester().saturate(true).post(Post::kHardswish).Test(); }

TEST(QConv2d, OutBuffer) { QConv2dTester().out_buffer(true).Test(); }

TEST(QConv2d, Residual) { QConv2dTester().residual(true).residual_zero_point(11).iterations(2).Test(); }

TEST(QConv2d, ResidualRelu) { QConv2dTester().residual(true).residual_zero_point(128).post(Post::kRelu).Test(); }

TEST(QConv2d, ResidualReluNchwBatch) {
  QConv2dTester().residual(true).post(Post::kRelu).channels_last(false).batch(2).input_zero_point(3).Test();
}

TEST(QConv2d, ResidualStrideGroupsPerTensor) {
  QConv2dTester().residual(true).stride(2, 2).input_size(8, 8).groups(2).per_channel(false).residual_zero_point(40).Test();
}

TEST(QConv2d, ResidualSaturation) { QConv2dTester().residual(true).saturate(true).post(Post::kRelu).Test(); }

TEST(QConv2d, ResidualNoBias) { QConv2dTester().residual(true).bias(false).residual_zero_point(0).Test(); }

TEST(QConv2d, ResidualWithRelu6IsRejected) { QConv2dTester().residual(true).post(Post::kRelu6).TestRejected(); }

TEST(QConv2d, ResidualWithHardswishIsRejected) {
  QConv2dTester().residual(true).post(Post::kHardswish).TestRejected();
}

TEST(QConv2d, Everything) {
  QConv2dTester()
      .batch(2)
      .input_size(10, 9)
      .groups(2)
      .group_input_channels(3)
      .group_output_channels(5)
      .kernel_size(3, 2)
      .stride(2, 1)
      .padding(1, 1)
      .dilation(1, 2)
      .input_zero_point(77)
      .post(Post::kRelu)
      .residual(true)
      .residual_zero_point(9)
      .channels_last(false)
      .Test();
}

}  // namespace
}  // namespace dbrq::kernel_testing
