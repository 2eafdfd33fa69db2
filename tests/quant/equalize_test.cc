// Cross-layer equalization (dbrq::equalize): a naive reference of the factors on a conv -> bn ->
// relu -> conv pair, the fp32 function unchanged (1e-5) on pairs with and without batch norm,
// depthwise chains and linears, the folded per-channel ranges equalized, pairs found by data flow
// (not registration order), pairs skipped when the intermediate has another reader or goes
// through relu6, and every bad input (prepared model, training mode, no inputs, bad options, a
// forward that reads an intermediate behind dbrq's back).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;
using ReLU = nn::ReLUImpl;
using ReLU6 = nn::ReLU6Impl;
using testing::randomize_bn;

std::vector<float> vals(const Tensor& t) { return t.contiguous().to_vector<float>(); }

void set_values(Tensor& t, const std::vector<float>& v) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
  float* p = t.mutable_data<float>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
}

// Gives output channel o of `w` a range spread over 4 decades, as trained nets with BN folded have.
void spread_rows(Tensor& w, uint64_t seed) {
  std::vector<float> v = vals(w);
  const int64_t rows = w.size(0), len = w.numel() / rows;
  std::vector<float> f = vals(rand_uniform({rows}, -2.0, 2.0, seed));
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t k = 0; k < len; ++k) v[o * len + k] *= std::pow(10.0f, f[o]);
  set_values(w, v);
}

double rel_diff(const Tensor& a, const Tensor& b) { return testing::relative_error(a, b); }

struct ConvBnReluConv : nn::CallableModule<ConvBnReluConv> {
  explicit ConvBnReluConv(bool bn_between = true, bool relu6 = false) : bn_between_(bn_between), relu6_(relu6) {
    conv1 = register_module("conv1", std::make_shared<Conv2d>(3, 8, 3, 1, 1, 1, 1, !bn_between));
    bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(8));
    relu = register_module("relu", std::make_shared<ReLU>());
    relu6m = register_module("relu6", std::make_shared<ReLU6>());
    conv2 = register_module("conv2", std::make_shared<Conv2d>(8, 5, 3, 1, 1));
    randomize_bn(*bn1, 11);
    spread_rows(conv1->weight, 12);
  }
  Tensor forward(const Tensor& x) {
    Tensor h = (*conv1)(x);
    if (bn_between_) h = (*bn1)(h);
    h = relu6_ ? (*relu6m)(h) : (*relu)(h);
    return (*conv2)(h);
  }
  bool bn_between_, relu6_;
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<ReLU6> relu6m;
};

// Naive reference: s_i = sqrt(r1_i / r2_i) with r1 over conv1's folded output channel i and r2 over
// conv2's input channel i, then gamma_i, beta_i / s_i and conv2[:, i] * s_i.
TEST(Equalize, MatchesNaiveReferenceWithBatchNorm) {
  ConvBnReluConv m;
  m.eval();
  const std::vector<float> w1 = vals(m.conv1->weight), w2 = vals(m.conv2->weight), g = vals(m.bn1->weight),
                           b = vals(m.bn1->bias), var = vals(m.bn1->running_var);
  std::vector<double> s(8);
  for (int i = 0; i < 8; ++i) {
    double r1 = 0, r2 = 0;
    for (int k = 0; k < 27; ++k) r1 = std::max(r1, std::abs(double(w1[i * 27 + k])));
    r1 *= std::abs(double(g[i])) / std::sqrt(double(var[i]) + 1e-5);
    for (int o = 0; o < 5; ++o)
      for (int k = 0; k < 9; ++k) r2 = std::max(r2, std::abs(double(w2[(o * 8 + i) * 9 + k])));
    s[i] = std::sqrt(r1 / r2);
  }
  const Tensor x = randn({2, 3, 10, 10}, 1);
  const Tensor before = m(x);
  const EqualizeReport r = equalize(m, {x});
  ASSERT_EQ(r.pairs.size(), 1u) << r.to_string();
  EXPECT_EQ(r.pairs[0].first, "conv1");
  EXPECT_EQ(r.pairs[0].second, "conv2");
  EXPECT_EQ(r.pairs[0].via, "batch_norm+relu");
  EXPECT_EQ(r.pairs[0].channels, 8);
  EXPECT_GT(r.pairs[0].imbalance_before, 10.0);
  EXPECT_NEAR(r.pairs[0].imbalance_after, 1.0, 1e-5);
  // One pair settles in one round (the second finds every factor 1).
  EXPECT_LE(r.iterations, 2);
  const std::vector<float> g2 = vals(m.bn1->weight), b2 = vals(m.bn1->bias), w2n = vals(m.conv2->weight);
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(g2[i], g[i] / s[i], 1e-6 * std::abs(g[i] / s[i])) << i;
    EXPECT_NEAR(b2[i], b[i] / s[i], 1e-6 * std::abs(b[i] / s[i]) + 1e-9) << i;
    for (int o = 0; o < 5; ++o)
      for (int k = 0; k < 9; ++k) {
        const double want = w2[(o * 8 + i) * 9 + k] * s[i];
        EXPECT_NEAR(w2n[(o * 8 + i) * 9 + k], want, 1e-6 * std::abs(want) + 1e-12);
      }
  }
  // conv1's weights are untouched (the batch norm carries the factor), and the function is the same.
  EXPECT_EQ(vals(m.conv1->weight), w1);
  EXPECT_LT(rel_diff(m(x), before), 1e-5);
  EXPECT_LT(r.output_change, 1e-5);
}

TEST(Equalize, WithoutBatchNormScalesWeightsAndBias) {
  ConvBnReluConv m(/*bn_between=*/false);
  m.eval();
  set_values(m.conv1->bias, vals(rand_uniform({8}, -1.0, 1.0, 5)));
  const Tensor x = randn({2, 3, 9, 9}, 3), x2 = randn({1, 3, 12, 12}, 4);
  const Tensor y = m(x), y2 = m(x2);
  const std::vector<float> w1 = vals(m.conv1->weight), b1 = vals(m.conv1->bias);
  const EqualizeReport r = equalize(m, {x});
  ASSERT_EQ(r.pairs.size(), 1u);
  EXPECT_EQ(r.pairs[0].via, "relu");
  EXPECT_LT(rel_diff(m(x), y), 1e-5);
  EXPECT_LT(rel_diff(m(x2), y2), 1e-5);  // not only on the example
  // Each conv1 row and its bias moved by the same factor.
  const std::vector<float> w1n = vals(m.conv1->weight), b1n = vals(m.conv1->bias);
  for (int i = 0; i < 8; ++i) {
    const double f = double(w1n[i * 27]) / double(w1[i * 27]);
    EXPECT_NEAR(double(b1n[i]) / double(b1[i]), f, 1e-5 * f) << i;
  }
}

// expand 1x1 -> relu -> depthwise 3x3 -> relu -> project 1x1: two pairs sharing the depthwise conv.
struct DepthwiseBlock : nn::CallableModule<DepthwiseBlock> {
  DepthwiseBlock() {
    expand = register_module("expand", std::make_shared<Conv2d>(4, 12, 1));
    dw = register_module("dw", std::make_shared<Conv2d>(12, 12, 3, 1, 1, 1, 12));
    project = register_module("project", std::make_shared<Conv2d>(12, 6, 1));
    relu1 = register_module("relu1", std::make_shared<ReLU>());
    relu2 = register_module("relu2", std::make_shared<ReLU>());
    spread_rows(expand->weight, 21);
    spread_rows(dw->weight, 22);
  }
  Tensor forward(const Tensor& x) { return (*project)((*relu2)((*dw)((*relu1)((*expand)(x))))); }
  std::shared_ptr<Conv2d> expand, dw, project;
  std::shared_ptr<ReLU> relu1, relu2;
};

double channel_range(const std::vector<float>& w, int64_t begin, int64_t len) {
  double m = 0;
  for (int64_t k = begin; k < begin + len; ++k) m = std::max(m, std::abs(double(w[k])));
  return m;
}

TEST(Equalize, DepthwiseChainIteratesToEqualRanges) {
  DepthwiseBlock m;
  m.eval();
  const Tensor x = randn({2, 4, 8, 8}, 7);
  const Tensor y = m(x);
  EqualizeOptions o;
  o.tolerance = 1e-7;
  o.max_iterations = 200;
  const EqualizeReport r = equalize(m, {x}, o);
  ASSERT_EQ(r.pairs.size(), 2u) << r.to_string();
  EXPECT_EQ(r.pairs[0].first, "expand");
  EXPECT_EQ(r.pairs[0].second, "dw");
  EXPECT_EQ(r.pairs[1].first, "dw");
  EXPECT_EQ(r.pairs[1].second, "project");
  EXPECT_GT(r.iterations, 1);
  EXPECT_LT(rel_diff(m(x), y), 1e-5);
  // Independently of the report: expand's row i, dw's filter i and project's column i.
  const std::vector<float> e = vals(m.expand->weight), d = vals(m.dw->weight), p = vals(m.project->weight);
  for (int i = 0; i < 12; ++i) {
    const double re = channel_range(e, i * 4, 4), rd = channel_range(d, i * 9, 9);
    double rp = 0;
    for (int o = 0; o < 6; ++o) rp = std::max(rp, std::abs(double(p[o * 12 + i])));
    EXPECT_NEAR(re / rd, 1.0, 1e-3) << "channel " << i;
    EXPECT_NEAR(rd / rp, 1.0, 1e-3) << "channel " << i;
  }
}

struct Mlp : nn::CallableModule<Mlp> {
  Mlp() {
    fc1 = register_module("fc1", std::make_shared<Linear>(6, 10));
    fc2 = register_module("fc2", std::make_shared<Linear>(10, 3));
    relu = register_module("relu", std::make_shared<ReLU>());
    spread_rows(fc1->weight, 31);
  }
  Tensor forward(const Tensor& x) { return (*fc2)((*relu)((*fc1)(x))); }
  std::shared_ptr<Linear> fc1, fc2;
  std::shared_ptr<ReLU> relu;
};

TEST(Equalize, LinearPair) {
  Mlp m;
  m.eval();
  const Tensor x = randn({4, 6}, 8);
  const Tensor y = m(x);
  const EqualizeReport r = equalize(m, {x});
  ASSERT_EQ(r.pairs.size(), 1u);
  EXPECT_NEAR(r.pairs[0].imbalance_after, 1.0, 1e-5);
  EXPECT_LT(rel_diff(m(x), y), 1e-5);
}

// Registered c_late, c_first, c_other; the data flow is c_first -> relu -> c_late, and c_other reads
// the model input: module order would pair the wrong layers.
struct OutOfOrder : nn::CallableModule<OutOfOrder> {
  OutOfOrder() {
    c_late = register_module("c_late", std::make_shared<Conv2d>(8, 4, 1));
    c_other = register_module("c_other", std::make_shared<Conv2d>(3, 4, 1));
    c_first = register_module("c_first", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    spread_rows(c_first->weight, 41);
  }
  Tensor forward(const Tensor& x) { return (*c_late)(relu((*c_first)(x))) + (*c_other)(x); }
  std::shared_ptr<Conv2d> c_late, c_other, c_first;
};

TEST(Equalize, PairsFollowDataFlowNotModuleOrder) {
  OutOfOrder m;
  m.eval();
  const Tensor x = randn({1, 3, 6, 6}, 9);
  const Tensor y = m(x);
  const EqualizeReport r = equalize(m, {x});
  ASSERT_EQ(r.pairs.size(), 1u) << r.to_string();
  EXPECT_EQ(r.pairs[0].first, "c_first");
  EXPECT_EQ(r.pairs[0].second, "c_late");
  EXPECT_EQ(r.pairs[0].via, "relu");  // a functional relu in the model's own forward
  EXPECT_LT(rel_diff(m(x), y), 1e-5);
}

// The relu output also feeds the residual add: no pair (equalizing would change the add's input).
struct SharedIntermediate : nn::CallableModule<SharedIntermediate> {
  SharedIntermediate() {
    c1 = register_module("c1", std::make_shared<Conv2d>(4, 4, 3, 1, 1));
    c2 = register_module("c2", std::make_shared<Conv2d>(4, 4, 3, 1, 1));
    spread_rows(c1->weight, 51);
  }
  Tensor forward(const Tensor& x) {
    Tensor h = relu((*c1)(x));
    return (*c2)(h) + h;
  }
  std::shared_ptr<Conv2d> c1, c2;
};

TEST(Equalize, NoPairWhenTheIntermediateHasAnotherReader) {
  SharedIntermediate m;
  m.eval();
  const Tensor x = randn({1, 4, 5, 5}, 10);
  const std::vector<float> w1 = vals(m.c1->weight), w2 = vals(m.c2->weight);
  const EqualizeReport r = equalize(m, {x});
  EXPECT_TRUE(r.pairs.empty());
  EXPECT_NE(r.to_string().find("no conv -> conv or linear -> linear pair found"), std::string::npos)
      << r.to_string();
  EXPECT_EQ(vals(m.c1->weight), w1);
  EXPECT_EQ(vals(m.c2->weight), w2);
}

TEST(Equalize, Relu6SkippedByDefaultAndEqualizedOnRequest) {
  ConvBnReluConv m(true, /*relu6=*/true);
  m.eval();
  const Tensor x = randn({2, 3, 8, 8}, 12);
  const std::vector<float> g = vals(m.bn1->weight);
  EqualizeReport r = equalize(m, {x});
  EXPECT_TRUE(r.pairs.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(r.skipped[0].find("conv1 -> conv2: relu6 is not positive-homogeneous"), std::string::npos)
      << r.skipped[0];
  EXPECT_EQ(vals(m.bn1->weight), g);

  EqualizeOptions o;
  o.relu6 = Relu6Policy::kAsRelu;
  r = equalize(m, {x}, o);
  ASSERT_EQ(r.pairs.size(), 1u);
  EXPECT_FALSE(r.pairs[0].exact);
  EXPECT_EQ(r.pairs[0].via, "batch_norm+relu6");
  EXPECT_NE(vals(m.bn1->weight), g);
  EXPECT_NE(r.to_string().find("relu6 treated as relu"), std::string::npos);
}

TEST(Equalize, FunctionalConvWithComputedWeightIsSkipped) {
  struct Computed : nn::CallableModule<Computed> {
    Computed() {
      c1 = register_module("c1", std::make_shared<Conv2d>(3, 4, 1));
      w2 = register_parameter("w2", randn({4, 4, 1, 1}, 3));
    }
    Tensor forward(const Tensor& x) { return conv2d(relu((*c1)(x)), w2 * 2.0); }
    std::shared_ptr<Conv2d> c1;
    Tensor w2;
  } m;
  m.eval();
  const EqualizeReport r = equalize(m, {randn({1, 3, 4, 4}, 1)});
  EXPECT_TRUE(r.pairs.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_NE(r.skipped[0].find("its weight is not a registered f32 parameter"), std::string::npos) << r.skipped[0];
}

// fc1 -> relu -> fc2 where one layer's weight is tied to `side`, a Linear the example never runs
// (a second head, another method, a branch not taken). Equalizing rescaled the tied weight, and
// with it `side`, silently: one use in the traced run looked like no other use.
struct TiedToASideLayer : nn::CallableModule<TiedToASideLayer> {
  explicit TiedToASideLayer(bool tie_second) {
    fc1 = register_module("fc1", std::make_shared<Linear>(6, 10));
    fc2 = register_module("fc2", std::make_shared<Linear>(10, 6));
    side = register_module("side", tie_second ? std::make_shared<Linear>(10, 6, false)
                                              : std::make_shared<Linear>(6, 10, false));
    side->weight = side->register_parameter("weight", tie_second ? fc2->weight : fc1->weight);
    spread_rows(fc1->weight, 71);
  }
  Tensor forward(const Tensor& x) { return (*fc2)(relu((*fc1)(x))); }
  std::shared_ptr<Linear> fc1, fc2, side;
};

TEST(Equalize, TiedWeightsAreNotRescaled) {
  for (const bool tie_second : {false, true}) {
    SCOPED_TRACE(tie_second ? "fc2 tied" : "fc1 tied");
    TiedToASideLayer m(tie_second);
    m.eval();
    const Tensor x = randn({4, 6}, 72), xs = randn({4, tie_second ? 10 : 6}, 73);
    const Tensor y = m(x), ys = (*m.side)(xs);
    const std::vector<float> w1 = vals(m.fc1->weight), w2 = vals(m.fc2->weight), b1 = vals(m.fc1->bias);
    const EqualizeReport r = equalize(m, {x});
    EXPECT_TRUE(r.pairs.empty()) << r.to_string();
    EXPECT_EQ(vals(m.fc1->weight), w1);
    EXPECT_EQ(vals(m.fc1->bias), b1);
    EXPECT_EQ(vals(m.fc2->weight), w2);
    EXPECT_EQ(vals((*m.side)(xs)), vals(ys));
    EXPECT_EQ(vals(m(x)), vals(y));
    if (tie_second) {
      ASSERT_EQ(r.skipped.size(), 1u) << r.to_string();
      EXPECT_EQ(r.skipped[0], "fc1 -> fc2: its weight is tied to another registered tensor (fc2.weight, side.weight)");
    }
  }
}

// One Linear registered under two names is not a tie: the pair is equalized.
TEST(Equalize, ASharedLayerIsNotATie) {
  Mlp m;
  m.register_module("fc1_again", m.fc1);
  m.eval();
  const Tensor x = randn({4, 6}, 74);
  const Tensor y = m(x);
  const EqualizeReport r = equalize(m, {x});
  ASSERT_EQ(r.pairs.size(), 1u) << r.to_string();
  EXPECT_LT(rel_diff(m(x), y), 1e-5);
}

TEST(Equalize, BadInputs) {
  ConvBnReluConv m;
  const Tensor x = randn({1, 3, 6, 6}, 1);
  EXPECT_THROW_MSG(equalize(m, {x}), UsageError, "is in training mode; call eval() first");
  m.eval();
  EXPECT_THROW_MSG(equalize(m, std::vector<Tensor>{}), ValueError, "equalize: example_inputs is empty");
  EqualizeOptions o;
  o.max_iterations = 0;
  EXPECT_THROW_MSG(equalize(m, {x}, o), ValueError, "max_iterations must be >= 1, got 0");
  o = {};
  o.tolerance = -1;
  EXPECT_THROW_MSG(equalize(m, {x}, o), ValueError, "tolerance must be a positive number");
  o = {};
  o.max_output_change = -1;
  EXPECT_THROW_MSG(equalize(m, {x}, o), ValueError, "max_output_change must be >= 0");
  // A forward that throws on the example leaves the model unchanged.
  const std::vector<float> g = vals(m.bn1->weight);
  EXPECT_THROW(equalize(m, {randn({1, 5, 6, 6}, 1)}), ShapeError);
  EXPECT_EQ(vals(m.bn1->weight), g);
  prepare(m, {x});
  EXPECT_THROW_MSG(equalize(m, {x}), UsageError, "is prepared; equalize the fp32 model before dbrq::prepare");
}

// forward reads the relu output's values directly (not through an op): the trace cannot see that
// reader, the output check does, and the weights are restored.
struct HiddenReader : nn::CallableModule<HiddenReader> {
  HiddenReader() {
    c1 = register_module("c1", std::make_shared<Conv2d>(3, 4, 1));
    c2 = register_module("c2", std::make_shared<Conv2d>(4, 2, 1));
    spread_rows(c1->weight, 61);
    // Positive weights and bias on positive inputs: h > 0 everywhere, so its sum moves with it.
    std::vector<float> w = vals(c1->weight);
    for (float& v : w) v = std::abs(v);
    set_values(c1->weight, w);
    set_values(c1->bias, std::vector<float>(4, 0.5f));
  }
  Tensor forward(const Tensor& x) {
    Tensor h = relu((*c1)(x));
    double sum = 0;
    const float* p = h.raw_data<float>();  // raw memory (a sum: any order): no op, invisible to the trace
    for (int64_t i = 0; i < h.numel(); ++i) sum += p[i];
    return (*c2)(h) * sum;
  }
  std::shared_ptr<Conv2d> c1, c2;
};

TEST(Equalize, ReaderOutsideOpsIsCaughtAndRestored) {
  HiddenReader m;
  m.eval();
  const Tensor x = rand_uniform({1, 3, 4, 4}, 0.5, 1.0, 2);
  const std::vector<float> w1 = vals(m.c1->weight), w2 = vals(m.c2->weight);
  const Tensor y = m(x);
  EXPECT_THROW_MSG(equalize(m, {x}), ValueError, "something reads an equalized tensor outside dbrq's ops");
  EXPECT_EQ(vals(m.c1->weight), w1);
  EXPECT_EQ(vals(m.c2->weight), w2);
  EXPECT_EQ(vals(m(x)), vals(y));
}

}  // namespace
}  // namespace dbrq

namespace dbrq {
namespace {

// The point of it: with per-tensor weights, channels with small ranges lose their precision; after
// equalization the int8 model is closer to the (unchanged) fp32 model.
TEST(Equalize, ImprovesPerTensorInt8) {
  auto run = [](bool equalized) {
    manual_seed(3);  // the same weights both times
    ConvBnReluConv m(/*bn_between=*/false);
    m.eval();
    // As in trained nets: conv1's row i scaled by 10^f_i (spread_rows), conv2's column i by 10^-f_i,
    // so every channel matters equally to the output whatever its range in conv1.
    const std::vector<float> f = vals(rand_uniform({8}, -2.0, 2.0, 12));
    std::vector<float> w2 = vals(m.conv2->weight), b1 = vals(m.conv1->bias);
    for (int o = 0; o < 5; ++o)
      for (int i = 0; i < 8; ++i)
        for (int k = 0; k < 9; ++k) w2[(o * 8 + i) * 9 + k] *= std::pow(10.0f, -f[i]);
    for (int i = 0; i < 8; ++i) b1[i] *= std::pow(10.0f, f[i]);
    set_values(m.conv2->weight, w2);
    set_values(m.conv1->bias, b1);
    std::vector<Tensor> calib;
    for (int i = 0; i < 4; ++i) calib.push_back(randn({2, 3, 8, 8}, 40 + i));
    const Tensor test = randn({4, 3, 8, 8}, 99);
    const Tensor ref = m(test);
    if (equalized) equalize(m, {calib[0]});
    const QConfigMapping mapping = QConfigMapping().set_global(
        QConfig::make(ObserverSpec::min_max(), ObserverSpec::min_max(DType::kS8, QScheme::kPerTensorSymmetric)));
    prepare(m, {calib[0]}, mapping);
    for (const Tensor& x : calib) m(x);
    convert(m);
    return sqnr_db(ref, m(test));
  };
  const double before = run(false), after = run(true);
  std::cout << "per-tensor int8 SQNR " << before << " dB -> " << after << " dB after equalization\n";
  EXPECT_GT(after, before + 6.0);
}

}  // namespace
}  // namespace dbrq
