// kernels::QMatmul against a naive batched, broadcasting matrix product
// (tests/kernels/qmatmul_tester.h).
#include <gtest/gtest.h>

#include "tests/kernels/qmatmul_tester.h"

namespace dbrq::kernel_testing {
namespace {

TEST(QMatmul, Default) { QMatmulTester().iterations(3).Test(); }

TEST(QMatmul, ZeroPoints) {
  QMatmulTester().a_zero_point(3).b_zero_point(0).Test();
  QMatmulTester().a_zero_point(0).b_zero_point(128).Test();
  QMatmulTester().a_zero_point(200).b_zero_point(17).Test();
  QMatmulTester().a_zero_point(255).b_zero_point(255).Test();
}

TEST(QMatmul, Batched) { QMatmulTester().a_shape({2, 3, 4}).b_shape({2, 4, 5}).a_zero_point(3).b_zero_point(9).Test(); }

TEST(QMatmul, BatchedFourDims) {
  QMatmulTester().a_shape({2, 3, 5, 8}).b_shape({2, 3, 8, 4}).a_zero_point(128).b_zero_point(120).Test();
}

TEST(QMatmul, BroadcastB) { QMatmulTester().a_shape({2, 3, 4}).b_shape({4, 5}).b_zero_point(7).Test(); }

TEST(QMatmul, BroadcastA) { QMatmulTester().a_shape({3, 4}).b_shape({2, 4, 5}).a_zero_point(7).Test(); }

TEST(QMatmul, BroadcastBothBatchDims) {
  QMatmulTester().a_shape({2, 1, 3, 4}).b_shape({3, 4, 5}).a_zero_point(3).b_zero_point(100).Test();
}

TEST(QMatmul, BroadcastOnes) { QMatmulTester().a_shape({1, 3, 3, 6}).b_shape({2, 1, 6, 2}).b_zero_point(1).Test(); }

TEST(QMatmul, VectorTimesMatrix) { QMatmulTester().a_shape({4}).b_shape({4, 5}).a_zero_point(2).Test(); }

TEST(QMatmul, MatrixTimesVector) { QMatmulTester().a_shape({3, 4}).b_shape({4}).b_zero_point(2).Test(); }

TEST(QMatmul, VectorTimesBatched) { QMatmulTester().a_shape({4}).b_shape({2, 4, 5}).Test(); }

TEST(QMatmul, BatchedTimesVector) { QMatmulTester().a_shape({2, 3, 4}).b_shape({4}).a_zero_point(30).Test(); }

TEST(QMatmul, TransposedB) {
  QMatmulTester().a_shape({2, 4, 8}).b_shape({2, 8, 4}).transposed_b(true).a_zero_point(5).b_zero_point(60).Test();
}

TEST(QMatmul, TransposedBBroadcast) {
  QMatmulTester().a_shape({2, 2, 3, 8}).b_shape({2, 1, 8, 3}).transposed_b(true).b_zero_point(4).Test();
}

TEST(QMatmul, Saturation) { QMatmulTester().saturate(true).a_zero_point(3).b_zero_point(4).Test(); }

TEST(QMatmul, Larger) { QMatmulTester().a_shape({2, 16, 32}).b_shape({2, 32, 16}).a_zero_point(90).b_zero_point(140).Test(); }

// Static products of at most 2^17 multiply-adds run as plain loops (kernels/int8_compute.cc); the
// ones above on oneDNN. Every case above is small; these cross the line.
TEST(QMatmul, AboveTheDirectLoopSizeRunsOnOneDnn) {
  QMatmulTester().a_shape({2, 64, 96}).b_shape({2, 96, 48}).a_zero_point(90).b_zero_point(140).Test();
  QMatmulTester().a_shape({2, 64, 96}).b_shape({2, 96, 48}).transposed_b(true).a_zero_point(3).b_zero_point(77).Test();
  QMatmulTester().a_shape({2, 1, 64, 64}).b_shape({3, 64, 64}).b_zero_point(200).Test();
  QMatmulTester().a_shape({96, 128}).b_shape({128, 16}).saturate(true).a_zero_point(7).b_zero_point(250).Test();
}

// Attention over a growing key cache: one query row against 1..40 keys (transposed) and the
// probabilities against as many values, a new shape each call.
TEST(QMatmul, OneRowAgainstAGrowingCache) {
  for (int64_t n = 1; n <= 40; ++n) {
    QMatmulTester().a_shape({1, 4, 1, 16}).b_shape({1, 4, 16, n}).transposed_b(true).a_zero_point(128).b_zero_point(
        static_cast<int32_t>(n * 5 % 256)).seed(static_cast<uint32_t>(n)).Test();
    QMatmulTester().a_shape({1, 4, 1, n}).b_shape({1, 4, n, 16}).a_zero_point(0).b_zero_point(131).seed(
        static_cast<uint32_t>(100 + n)).Test();
  }
}

// The one-token decoder step at its real head size: probabilities [1, heads, 1, L] times values
// [1, heads, L, 64 or more] (the vectorized row loop: 64 columns at a time, then 16, then the
// rest), zero points at both ends.
TEST(QMatmul, OneRowTimesWideValues) {
  for (int64_t d : {64, 80, 70}) {
    for (int64_t len : {1, 33, 128}) {
      QMatmulTester().a_shape({1, 4, 1, len}).b_shape({1, 4, len, d}).a_zero_point(0).b_zero_point(255).seed(
          static_cast<uint32_t>(d * 1000 + len)).Test();
      QMatmulTester().a_shape({1, 2, 1, len}).b_shape({1, 2, len, d}).a_zero_point(131).b_zero_point(9).saturate(true).seed(
          static_cast<uint32_t>(d * 1000 + len + 1)).Test();
    }
  }
}

TEST(QMatmul, Dynamic) { QMatmulTester().dynamic(true).iterations(3).Test(); }

// Dynamic calls over inputs of different ranges: one primitive (in the process-wide cache), whose
// runtime scale and zero points give exactly what a fresh kernel gives for each call.
TEST(QMatmul, DynamicOnePrimitive) {
  const uint64_t created = kernels::primitives_created();
  kernels::QMatmul shared(nullptr, nullptr, nullptr, /*dynamic=*/true);
  std::mt19937 rng(7);
  for (int i = 0; i < 12; ++i) {
    // Ranges that move from call to call (so do the scales and zero points).
    const Tensor a = make_f32({3, 8}, random_floats(rng, 24, -0.5 * i - 0.1, 0.2 * i + 1.0));
    const Tensor b = make_f32({8, 5}, random_floats(rng, 40, -2.0 + 0.1 * i, 0.3 * i + 0.5));
    const std::vector<float> expected = read_floats(kernels::QMatmul(nullptr, nullptr, nullptr, true).run(a, b));
    EXPECT_EQ(read_floats(shared.run(a, b)), expected) << "call " << i;
  }
  // (Where oneDNN's pairs saturate, qmatmul_no_vnni_test, the direct loop runs every size: none.)
  EXPECT_EQ(kernels::primitives_created() - created, kernels::int8_pairs_saturate() ? 0u : 1u);
}

TEST(QMatmul, DynamicBatched) { QMatmulTester().dynamic(true).a_shape({2, 3, 4}).b_shape({2, 4, 5}).Test(); }

TEST(QMatmul, DynamicBroadcast) { QMatmulTester().dynamic(true).a_shape({2, 1, 3, 4}).b_shape({3, 4, 5}).Test(); }

TEST(QMatmul, DynamicVector) { QMatmulTester().dynamic(true).a_shape({4}).b_shape({2, 4, 5}).Test(); }

}  // namespace
}  // namespace dbrq::kernel_testing
