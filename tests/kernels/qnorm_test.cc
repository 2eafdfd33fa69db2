// The int8 batch norm on its own against naive references (tests/kernels/qnorm_tester.h), and its
// bad inputs.
#include <gtest/gtest.h>

#include "tests/kernels/qnorm_tester.h"

namespace dbrq::kernel_testing {
namespace {

// `stmt` throws `Type` whose message contains `substr` (kernel tests do not link tests/test_util).
#define DBRQ_EXPECT_THROW_MSG(stmt, Type, substr)                                                 \
  do {                                                                                            \
    bool thrown = false;                                                                          \
    try {                                                                                         \
      stmt;                                                                                       \
    } catch (const Type& e) {                                                                     \
      thrown = true;                                                                              \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos) << "message: " << e.what(); \
    } catch (const std::exception& e) {                                                           \
      thrown = true;                                                                              \
      ADD_FAILURE() << "expected " #Type ", got: " << e.what();                                   \
    }                                                                                             \
    EXPECT_TRUE(thrown) << "expected " #Type " from: " #stmt;                                     \
  } while (0)

TEST(QBatchNorm, Default) { QBatchNormTester().Test(); }

TEST(QBatchNorm, Relu) {
  QBatchNormTester().relu(true).Test();
  QBatchNormTester().relu(true).layout(Layout::kContiguous).input_zero_point(3).Test();
}

TEST(QBatchNorm, NoAffine) { QBatchNormTester().affine(false).eps(1e-3).Test(); }

// Channel counts around the 16-lane vector loop: only the scalar tail, exactly one vector, both.
TEST(QBatchNorm, ChannelsAroundVectorWidth) {
  for (int64_t c : {1, 3, 15, 16, 17, 40, 67}) {
    QBatchNormTester().sizes({2, c, 3, 5}).seed(static_cast<uint32_t>(c)).Test();
    QBatchNormTester().sizes({2, c, 3, 5}).layout(Layout::kContiguous).seed(static_cast<uint32_t>(c)).Test();
  }
}

// Row-major 4-D: one channel's H * W positions at a time, around the vector width.
TEST(QBatchNorm, PositionsAroundVectorWidth) {
  for (int64_t hw : {1, 4, 16, 17, 33}) {
    QBatchNormTester().sizes({3, 5, hw, 1}).layout(Layout::kContiguous).relu(true).Test();
  }
}

TEST(QBatchNorm, OtherLayoutsAreCopied) {
  QBatchNormTester().layout(Layout::kTransposed).Test();
  QBatchNormTester().layout(Layout::kSliced).relu(true).Test();
}

// BatchNorm1d's inputs.
TEST(QBatchNorm, OneD) {
  QBatchNormTester().sizes({16, 20}).layout(Layout::kContiguous).Test();
  QBatchNormTester().sizes({4, 12, 9}).layout(Layout::kContiguous).relu(true).Test();
  QBatchNormTester().sizes({4, 12, 9}).layout(Layout::kTransposed).Test();
}

TEST(QBatchNorm, FiveD) { QBatchNormTester().sizes({2, 6, 3, 4, 5}).layout(Layout::kContiguous).Test(); }

TEST(QBatchNorm, ZeroPoints) {
  for (int32_t zp : {0, 1, 200, 255}) QBatchNormTester().input_zero_point(zp).relu(zp == 200).Test();
}

TEST(QBatchNorm, EmptyBatch) {
  const Tensor m = make_f32({4}, {0, 0, 0, 0}), v = make_f32({4}, {1, 1, 1, 1});
  const QuantParamsPtr qp = QuantParams::per_tensor(0.1f, 10);
  const kernels::QChannelAffine k(kernels::batch_norm_affine(m, v, Tensor(), Tensor(), 1e-5, 0.1f, 0.1f), qp, qp,
                                  false);
  const Tensor y = k.run(make_u8({0, 4, 3, 3}, {}, qp));
  EXPECT_EQ(sizes_of(y), shape_of({0, 4, 3, 3}));
}

// ---- bad inputs ----

class QBatchNormErrors : public ::testing::Test {
 protected:
  Tensor mean = make_f32({4}, {0.1f, 0.2f, 0.3f, 0.4f});
  Tensor var = make_f32({4}, {1, 2, 3, 4});
  QuantParamsPtr in = QuantParams::per_tensor(0.05f, 128), out = QuantParams::per_tensor(0.1f, 100);
  kernels::QChannelAffine kernel() const {
    return kernels::QChannelAffine(kernels::batch_norm_affine(mean, var, Tensor(), Tensor(), 1e-5, 0.05f, 0.1f), in,
                                   out, false);
  }
};

TEST_F(QBatchNormErrors, StatisticsOfTheWrongSize) {
  DBRQ_EXPECT_THROW_MSG(kernels::batch_norm_affine(mean, make_f32({3}, {1, 1, 1}), Tensor(), Tensor(), 1e-5, 0.1f, 0.1f),
                        ShapeError, "running_var must have sizes [4] (as running_mean), got [3]");
  DBRQ_EXPECT_THROW_MSG(kernels::batch_norm_affine(mean, var, make_f32({2, 2}, {1, 1, 1, 1}), Tensor(), 1e-5, 0.1f, 0.1f),
                        ShapeError, "weight must have sizes [4]");
}

TEST_F(QBatchNormErrors, StatisticsNotF32) {
  DBRQ_EXPECT_THROW_MSG(kernels::batch_norm_affine(mean, var, Tensor(), make_u8({4}, {1, 2, 3, 4}, in), 1e-5, 0.1f, 0.1f),
                        DTypeError, "bias");
}

TEST_F(QBatchNormErrors, MissingStatistics) {
  DBRQ_EXPECT_THROW_MSG(kernels::batch_norm_affine(Tensor(), var, Tensor(), Tensor(), 1e-5, 0.1f, 0.1f), ValueError,
                        "needs running_mean and running_var");
}

TEST_F(QBatchNormErrors, BadEpsOrScales) {
  DBRQ_EXPECT_THROW_MSG(kernels::batch_norm_affine(mean, var, Tensor(), Tensor(), -1.0, 0.1f, 0.1f), ValueError,
                        "eps must be >= 0, got -1");
  DBRQ_EXPECT_THROW_MSG(kernels::batch_norm_affine(mean, var, Tensor(), Tensor(), 1e-5, 0.0f, 0.1f), ValueError,
                        "scales must be positive and finite, got input scale 0");
}

TEST_F(QBatchNormErrors, MismatchedConstants) {
  kernels::ChannelAffine a;
  a.alpha = {1.f, 2.f};
  a.beta = {0.f};
  DBRQ_EXPECT_THROW_MSG(kernels::QChannelAffine(a, in, out, false), ValueError,
                        "needs as many alphas as betas (at least one), got 2 and 1");
  a.beta = {0.f, 1.f};
  DBRQ_EXPECT_THROW_MSG(kernels::QChannelAffine(a, QuantParams::per_channel({0.1f, 0.2f}, {0, 0}, 0), out, false),
                        ValueError, "needs per-tensor input and output parameters");
}

TEST_F(QBatchNormErrors, InputNotU8) {
  DBRQ_EXPECT_THROW_MSG(kernel().run(make_f32({1, 4}, {1, 2, 3, 4})), DTypeError,
                        "quantized batch_norm: needs a per-tensor quantized u8 tensor, got f32");
}

TEST_F(QBatchNormErrors, WrongChannels) {
  DBRQ_EXPECT_THROW_MSG(kernel().run(make_u8({2, 3, 2, 2}, std::vector<int32_t>(24, 1), in)), ShapeError,
                        "quantized batch_norm: input has 3 channels (sizes [2, 3, 2, 2]), the statistics have 4");
  DBRQ_EXPECT_THROW_MSG(kernel().run(make_u8({4}, {1, 2, 3, 4}, in)), ShapeError,
                        "input must have 2 to 5 dims (N, C, ...), got sizes [4]");
}

TEST_F(QBatchNormErrors, InputParametersDiffer) {
  DBRQ_EXPECT_THROW_MSG(kernel().run(make_u8({1, 4}, {1, 2, 3, 4}, QuantParams::per_tensor(0.05f, 127))), ValueError,
                        "differ from the ones the kernel was built for");
}

}  // namespace
}  // namespace dbrq::kernel_testing
