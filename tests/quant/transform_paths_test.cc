// Equalization and bias correction on models with data-dependent branches (reliability review,
// 25 Nov). Both transforms find their layers from the data flow of example runs; a model whose
// branches depend on the data takes different paths on different inputs. A transform may only
// rescale or shift what every path it saw agrees on: a pair that is a pair on one path, but on
// another path has its intermediate read elsewhere, must be left alone (else that path's fp32
// result changes), and a layer whose batch norm fuses on one path and not on another must not get
// one path's correction. A path no example takes cannot be seen: the single-example equalize
// changes it (shown below), which is why the several-batch form exists.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using Conv2d = nn::Conv2dImpl;
using BatchNorm2d = nn::BatchNorm2dImpl;

// Path A (mean > 0): c2(relu(c1(x))), an equalizable pair. Path B: the same plus side(c1(x)):
// c1's output has a second reader there.
struct PairThenBranch : nn::CallableModule<PairThenBranch> {
  PairThenBranch() {
    c1 = register_module("c1", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    c2 = register_module("c2", std::make_shared<Conv2d>(8, 8, 3, 1, 1));
    side = register_module("side", std::make_shared<Conv2d>(8, 8, 1));
    // Unbalanced output channels, so equalization has something to move.
    float* w = c1->weight.mutable_data<float>();
    const int64_t per = c1->weight.numel() / 8;
    for (int64_t o = 0; o < 8; ++o)
      for (int64_t k = 0; k < per; ++k) w[o * per + k] *= static_cast<float>(1 << (o % 4)) * (o % 2 ? 10.f : 0.1f);
  }
  Tensor forward(const Tensor& x) {
    const Tensor y = (*c1)(x);
    const Tensor out = (*c2)(relu(y));
    if (mean(x).item<float>() > 0) return out;
    return out + (*side)(y);
  }
  std::shared_ptr<Conv2d> c1, c2, side;
};

// Both paths keep c1 -> relu -> c2 a pair; path B only does more after c2.
struct PairOnBothPaths : nn::CallableModule<PairOnBothPaths> {
  PairOnBothPaths() {
    c1 = register_module("c1", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    c2 = register_module("c2", std::make_shared<Conv2d>(8, 8, 3, 1, 1));
    float* w = c1->weight.mutable_data<float>();
    const int64_t per = c1->weight.numel() / 8;
    for (int64_t o = 0; o < 8; ++o)
      for (int64_t k = 0; k < per; ++k) w[o * per + k] *= o % 2 ? 10.f : 0.1f;
  }
  Tensor forward(const Tensor& x) {
    const Tensor out = (*c2)(relu((*c1)(x)));
    if (mean(x).item<float>() > 0) return out;
    return sigmoid(out) * 2.0;
  }
  std::shared_ptr<Conv2d> c1, c2;
};

Tensor path_a(uint64_t seed) { return randn({2, 3, 6, 6}, seed) * 0.5 + 0.8; }
Tensor path_b(uint64_t seed) { return randn({2, 3, 6, 6}, seed) * 0.5 - 0.8; }

bool has(const std::vector<std::string>& v, const std::string& text) {
  for (const std::string& s : v)
    if (s.find(text) != std::string::npos) return true;
  return false;
}

std::vector<float> vals(const Tensor& t) { return t.contiguous().to_vector<float>(); }

TEST(EqualizePaths, OneExampleCannotSeeTheOtherPath) {
  // The limit the several-batch form lifts: from path A alone, c1 -> c2 looks like a pair, and
  // rescaling it changes what `side` reads on path B.
  manual_seed(1);
  PairThenBranch m;
  m.eval();
  const Tensor xa = path_a(2), xb = path_b(3);
  const Tensor ra = m(xa), rb = m(xb);
  const EqualizeReport r = equalize(m, {xa});
  ASSERT_EQ(r.pairs.size(), 1u);
  EXPECT_LT(testing::relative_error(m(xa), ra), 1e-5);
  EXPECT_GT(testing::relative_error(m(xb), rb), 1e-2);
}

TEST(EqualizePaths, APairWhoseIntermediateHasAnotherReaderOnAnotherPathIsLeftAlone) {
  manual_seed(1);
  PairThenBranch m;
  m.eval();
  const Tensor xa = path_a(2), xb = path_b(3);
  const Tensor ra = m(xa), rb = m(xb);
  const std::vector<float> w1 = vals(m.c1->weight), w2 = vals(m.c2->weight);
  const EqualizeReport r = equalize(m, std::vector<std::vector<Tensor>>{{xa}, {xb}});
  EXPECT_TRUE(r.pairs.empty()) << r.to_string();
  EXPECT_TRUE(has(r.skipped, "c1 -> c2: not a pair on example batch 1")) << r.to_string();
  EXPECT_EQ(vals(m.c1->weight), w1);
  EXPECT_EQ(vals(m.c2->weight), w2);
  EXPECT_EQ(testing::relative_error(m(xa), ra), 0.0);
  EXPECT_EQ(testing::relative_error(m(xb), rb), 0.0);
  // The order of the batches does not matter.
  const EqualizeReport r2 = equalize(m, std::vector<std::vector<Tensor>>{{xb}, {xa}});
  EXPECT_TRUE(r2.pairs.empty()) << r2.to_string();
  EXPECT_TRUE(has(r2.skipped, "c1 -> c2: not a pair on example batch 0")) << r2.to_string();
}

TEST(EqualizePaths, APairOnEveryPathIsEqualizedAndEveryPathKeepsItsResult) {
  manual_seed(4);
  PairOnBothPaths m;
  m.eval();
  const Tensor xa = path_a(5), xb = path_b(6);
  const Tensor ra = m(xa), rb = m(xb);
  const EqualizeReport r = equalize(m, std::vector<std::vector<Tensor>>{{xa}, {xb}});
  ASSERT_EQ(r.pairs.size(), 1u) << r.to_string();  // found on both runs, listed once
  EXPECT_EQ(r.pairs[0].first, "c1");
  EXPECT_EQ(r.pairs[0].second, "c2");
  EXPECT_LT(r.pairs[0].imbalance_after, r.pairs[0].imbalance_before);
  EXPECT_LT(testing::relative_error(m(xa), ra), 1e-5);
  EXPECT_LT(testing::relative_error(m(xb), rb), 1e-5);
}

TEST(EqualizePaths, BadExampleBatches) {
  PairOnBothPaths m;
  m.eval();
  EXPECT_THROW_MSG(equalize(m, std::vector<std::vector<Tensor>>{}), ValueError,
                   "equalize: no example batches; pass at least one");
  EXPECT_THROW_MSG(equalize(m, std::vector<std::vector<Tensor>>{{path_a(1)}, {}}), ValueError,
                   "equalize: example batch 1 is empty");
  m.train();
  EXPECT_THROW_MSG(equalize(m, std::vector<std::vector<Tensor>>{{path_a(1)}}), UsageError,
                   "is in training mode; call eval() first");
}

// Path A: head(relu(bn(conv(x)))): conv + bn fuse, so the correction goes to bn's beta from the
// folded weights. Path B also reads conv's output (head(relu(bn(y)) + y)): prepare, calibrated on
// both, does not fuse conv + bn, and conv has no bias: the two paths call for different
// corrections.
struct BnFusedOnOnePath : nn::CallableModule<BnFusedOnOnePath> {
  BnFusedOnOnePath() {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 8, 3, 1, 1, 1, 1, false));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(8));
    head = register_module("head", std::make_shared<Conv2d>(8, 4, 1));
    testing::randomize_bn(*bn, 7);
  }
  Tensor forward(const Tensor& x) {
    const Tensor y = (*conv)(x);
    const Tensor h = relu((*bn)(y));
    if (mean(x).item<float>() > 0) return (*head)(h);
    return (*head)(h + y);
  }
  std::shared_ptr<Conv2d> conv, head;
  std::shared_ptr<BatchNorm2d> bn;
};

TEST(BiasCorrectionPaths, ALayerCorrectedDifferentlyOnTwoPathsIsSkipped) {
  manual_seed(8);
  BnFusedOnOnePath m;
  m.eval();
  const std::vector<float> beta = vals(m.bn->bias);
  std::vector<std::vector<Tensor>> calibration = {{path_a(10)}, {path_b(11)}, {path_a(12)}, {path_b(13)}};
  const BiasCorrectionReport r = correct_bias(m, calibration);
  EXPECT_TRUE(has(r.skipped, "conv: calibration batches take paths that need different corrections "
                             "(the beta of the batch norm folded into it on one, none on batch 1)"))
      << r.to_string();
  EXPECT_EQ(vals(m.bn->bias), beta);  // the one-path correction would have moved it
  // head runs with its bias on both paths: corrected, from every batch.
  ASSERT_EQ(r.layers.size(), 1u) << r.to_string();
  EXPECT_EQ(r.layers[0].layer, "head");
  EXPECT_EQ(r.batches, 4);
}

TEST(BiasCorrectionPaths, ALayerCorrectedAlikeOnEveryPathIsCorrected) {
  manual_seed(8);
  BnFusedOnOnePath m;
  m.eval();
  const std::vector<float> beta = vals(m.bn->bias);
  // Only path A: conv + bn fuse on every batch; the beta is corrected.
  const BiasCorrectionReport r = correct_bias(m, {{path_a(10)}, {path_a(12)}});
  EXPECT_FALSE(has(r.skipped, "conv:")) << r.to_string();
  EXPECT_EQ(r.layers.size(), 2u) << r.to_string();
  EXPECT_NE(vals(m.bn->bias), beta);
}

}  // namespace
}  // namespace dbrq
