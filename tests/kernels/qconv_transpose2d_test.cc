// kernels::QConvTranspose2d against a naive transposed convolution
// (tests/kernels/qconv_transpose2d_tester.h), and its bad arguments.
#include <gtest/gtest.h>

#include "tests/kernels/qconv_transpose2d_tester.h"

namespace dbrq::kernel_testing {
namespace {

TEST(QConvTranspose2d, Default) { QConvTranspose2dTester().Test(); }

TEST(QConvTranspose2d, PerTensorWeights) { QConvTranspose2dTester().per_channel(false).input_zero_point(17).Test(); }

TEST(QConvTranspose2d, NoBiasBatch) { QConvTranspose2dTester().bias(false).batch(3).Test(); }

TEST(QConvTranspose2d, InputZeroPoint) {
  // The zero point must be subtracted before the scatter (the output border sees fewer inputs).
  for (int32_t zp : {1, 128, 255}) QConvTranspose2dTester().input_zero_point(zp).Test();
}

TEST(QConvTranspose2d, NchwInput) { QConvTranspose2dTester().channels_last(false).input_zero_point(9).Test(); }

TEST(QConvTranspose2d, Stride2Padding1) { QConvTranspose2dTester().stride(2, 2).padding(1, 1).Test(); }

TEST(QConvTranspose2d, DcganBlock) {
  QConvTranspose2dTester().kernel_size(4, 4).stride(2, 2).padding(1, 1).group_input_channels(8).Test();
}

// PyTorch 1.13's onednn engine refuses output_padding; oneDNN runs it (a smaller right padding).
TEST(QConvTranspose2d, OutputPadding) {
  QConvTranspose2dTester().stride(2, 2).padding(1, 1).output_padding(1, 1).Test();
  QConvTranspose2dTester().stride(2, 3).padding(0, 0).output_padding(1, 2).input_zero_point(40).Test();
}

TEST(QConvTranspose2d, AsymmetricAndDilated) {
  QConvTranspose2dTester().kernel_size(3, 2).stride(2, 1).padding(1, 0).dilation(1, 2).Test();
  QConvTranspose2dTester().dilation(2, 2).padding(1, 1).Test();
}

TEST(QConvTranspose2d, Groups) {
  QConvTranspose2dTester().groups(2).Test();
  QConvTranspose2dTester().groups(4).group_input_channels(1).group_output_channels(1).stride(2, 2).Test();
  QConvTranspose2dTester().groups(3).group_output_channels(2).per_channel(false).Test();
}

TEST(QConvTranspose2d, FusedActivations) {
  QConvTranspose2dTester().post(Post::kRelu).input_zero_point(100).Test();
  QConvTranspose2dTester().post(Post::kRelu6).stride(2, 2).Test();
  QConvTranspose2dTester().post(Post::kHardswish).Test();
}

kernels::QConvTranspose2dOptions valid_options() {
  kernels::QConvTranspose2dOptions o;
  o.weight = zeros({4, 3, 3, 3});  // [K, C/groups, R, S]
  o.weight_qparams = QuantParams::per_tensor(0.01f, 0);
  o.src_qparams = QuantParams::per_tensor(0.02f, 3);
  o.dst_qparams = QuantParams::per_tensor(0.05f, 7);
  return o;
}

template <typename E>
void expect_throw(const std::function<void()>& f, const std::string& substr) {
  try {
    f();
    ADD_FAILURE() << "expected an exception containing: " << substr;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(substr), std::string::npos) << e.what();
  }
}

TEST(QConvTranspose2d, BadArguments) {
  expect_throw<ValueError>(
      [] {
        auto o = valid_options();
        o.dst_qparams = nullptr;
        kernels::QConvTranspose2d k(o);
      },
      "QConvTranspose2d: source and destination parameters are required");
  expect_throw<ValueError>(
      [] {
        auto o = valid_options();
        o.sum_qparams = QuantParams::per_tensor(0.1f, 0);
        kernels::QConvTranspose2d k(o);
      },
      "QConvTranspose2d: residual fusion and dynamic quantization are not supported");
  expect_throw<ValueError>(
      [] {
        auto o = valid_options();
        o.weight_qparams = QuantParams::per_tensor(0.01f, 4);
        kernels::QConvTranspose2d k(o);
      },
      "oneDNN needs symmetric weights (zero point 0), got 4");
  expect_throw<ShapeError>(
      [] {
        auto o = valid_options();
        o.params.groups = 3;
        kernels::QConvTranspose2d k(o);
      },
      "quantized conv_transpose2d: out_channels (4) must be divisible by groups (3)");
  expect_throw<ShapeError>(
      [] {
        auto o = valid_options();
        o.weight_qparams = QuantParams::per_channel({0.1f, 0.1f}, {0, 0}, 0);
        kernels::QConvTranspose2d k(o);
      },
      "per-channel parameters along axis 0 have 2 scales for sizes [4, 3, 3, 3]");
  expect_throw<ShapeError>(
      [] {
        auto o = valid_options();
        o.bias = zeros({3});
        kernels::QConvTranspose2d k(o);
      },
      "quantized conv_transpose2d: bias must have sizes [4], got [3]");

  kernels::QConvTranspose2d k(valid_options());
  const Tensor good = zeros({1, 3, 4, 4}, DType::kU8).with_qparams(QuantParams::per_tensor(0.02f, 3));
  EXPECT_EQ(k.run(good).sizes(), (DimVector{1, 4, 6, 6}));
  expect_throw<DTypeError>([&] { k.run(zeros({1, 3, 4, 4})); },
                           "quantized conv_transpose2d: int8 input must be a per-tensor quantized u8 tensor, got f32");
  expect_throw<ValueError>(
      [&] { k.run(zeros({1, 3, 4, 4}, DType::kU8).with_qparams(QuantParams::per_tensor(0.03f, 3))); },
      "quantized conv_transpose2d: input parameters");
  expect_throw<ShapeError>(
      [&] { k.run(zeros({1, 5, 4, 4}, DType::kU8).with_qparams(QuantParams::per_tensor(0.02f, 3))); },
      "conv_transpose2d: input has 5 channels but the weight expects 3");
  EXPECT_NE(k.describe().find("int8 conv_transpose2d [3, 4, 3, 3]"), std::string::npos) << k.describe();
}

}  // namespace
}  // namespace dbrq::kernel_testing
