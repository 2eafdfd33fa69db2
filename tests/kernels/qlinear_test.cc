// kernels::QLinear against a naive matrix product (tests/kernels/qlinear_tester.h).
#include <gtest/gtest.h>

#include "tests/kernels/qlinear_tester.h"

namespace dbrq::kernel_testing {
namespace {

TEST(QLinear, Default) { QLinearTester().iterations(3).Test(); }

TEST(QLinear, SingleRow) { QLinearTester().batch_dims({1}).Test(); }

TEST(QLinear, VectorInput) { QLinearTester().batch_dims({}).input_zero_point(5).Test(); }

TEST(QLinear, BatchDims) { QLinearTester().batch_dims({2, 3}).input_zero_point(3).Test(); }

TEST(QLinear, ThreeBatchDims) { QLinearTester().batch_dims({2, 1, 4}).input_channels(8).output_channels(16).Test(); }

TEST(QLinear, EmptyBatch) { QLinearTester().batch_dims({0}).Test(); }

TEST(QLinear, NoBias) { QLinearTester().bias(false).input_zero_point(128).Test(); }

TEST(QLinear, PerTensor) { QLinearTester().per_channel(false).input_zero_point(17).Test(); }

TEST(QLinear, PerTensorNoBias) { QLinearTester().per_channel(false).bias(false).batch_dims({4, 2}).Test(); }

TEST(QLinear, InputZeroPoints) {
  for (int32_t zp : {1, 64, 200, 255}) QLinearTester().input_zero_point(zp).Test();
}

TEST(QLinear, Wide) { QLinearTester().input_channels(64).output_channels(33).batch_dims({5}).Test(); }

TEST(QLinear, Relu) { QLinearTester().post(Post::kRelu).iterations(2).Test(); }

TEST(QLinear, ReluPerTensorZeroPoint) {
  QLinearTester().post(Post::kRelu).per_channel(false).input_zero_point(9).batch_dims({2, 3}).Test();
}

TEST(QLinear, ReluNoBias) { QLinearTester().post(Post::kRelu).bias(false).Test(); }

TEST(QLinear, Relu6) { QLinearTester().post(Post::kRelu6).input_zero_point(20).Test(); }

TEST(QLinear, Hardswish) { QLinearTester().post(Post::kHardswish).input_zero_point(20).Test(); }

TEST(QLinear, Saturation) { QLinearTester().saturate(true).input_zero_point(3).Test(); }

TEST(QLinear, SaturationRelu) { QLinearTester().saturate(true).post(Post::kRelu).Test(); }

// Static with f32 output (no destination parameters): the transformer recipe's linears.
TEST(QLinear, FloatOutput) { QLinearTester().float_output(true).input_zero_point(37).iterations(2).Test(); }

TEST(QLinear, FloatOutputPerTensorNoBias) {
  QLinearTester().float_output(true).per_channel(false).bias(false).batch_dims({2, 3}).Test();
}

TEST(QLinear, FloatOutputRelu) { QLinearTester().float_output(true).post(Post::kRelu).input_zero_point(128).Test(); }

TEST(QLinear, FloatOutputWide) {
  QLinearTester().float_output(true).input_channels(256).output_channels(96).batch_dims({33}).Test();
}

TEST(QLinear, Dynamic) { QLinearTester().dynamic(true).iterations(3).Test(); }

TEST(QLinear, DynamicPerTensor) { QLinearTester().dynamic(true).per_channel(false).Test(); }

TEST(QLinear, DynamicNoBias) { QLinearTester().dynamic(true).bias(false).batch_dims({2, 3}).Test(); }

TEST(QLinear, DynamicBatchDims) {
  QLinearTester().dynamic(true).batch_dims({2, 2, 3}).input_channels(32).output_channels(9).Test();
}

TEST(QLinear, DynamicVectorInput) { QLinearTester().dynamic(true).batch_dims({}).Test(); }

TEST(QLinear, DynamicManyCalls) { QLinearTester().dynamic(true).calls(5).Test(); }

// A packed recurrence's hidden-state product: a batch of 40 sequences of 40 lengths runs it at 40
// row counts, every call; the kernel keeps a primitive for each (it held 16 and re-created them).
TEST(QLinear, PrimitivePerRowCount) {
  for (bool dynamic : {false, true}) {
    kernels::QLinearOptions o;
    o.weight = randn({24, 32}, 1);
    o.bias = randn({24}, 2);
    o.weight_qparams = QuantParams::per_tensor(0.02f, 0);
    o.dynamic = dynamic;
    if (!dynamic) {
      o.src_qparams = QuantParams::per_tensor(0.05f, 128);
      o.dst_qparams = QuantParams::per_tensor(0.1f, 128);
    }
    kernels::QLinear linear(std::move(o));
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t m = 40; m >= 1; --m) {
        Tensor x = randn({m, 32}, static_cast<uint64_t>(m));
        if (!dynamic) x = kernels::quantize(x, QuantParams::per_tensor(0.05f, 128), DType::kU8);
        EXPECT_EQ(linear.run(x).size(0), m);
      }
    }
    EXPECT_EQ(linear.num_primitives(), 40u) << (dynamic ? "dynamic" : "static");
  }
}

// A recurrence's per-step product: one row, a new range (scale and zero point) every call.
TEST(QLinear, DynamicOneRowManyCalls) {
  QLinearTester().dynamic(true).batch_dims({1}).input_channels(32).output_channels(24).calls(40).Test();
}

TEST(QLinear, DynamicBatchSizes) {
  for (int64_t m : {1, 4, 2}) QLinearTester().dynamic(true).batch_dims({m}).seed(static_cast<uint32_t>(m)).Test();
}

TEST(QLinear, DynamicQuantizedInput) { QLinearTester().dynamic(true).quantized_input(true).input_zero_point(7).Test(); }

TEST(QLinear, DynamicQuantizedInputPerTensor) {
  QLinearTester().dynamic(true).quantized_input(true).per_channel(false).input_zero_point(250).Test();
}

}  // namespace
}  // namespace dbrq::kernel_testing
