// dbrq::smooth_quant (issue 13) against a naive reference on small tensors: the fp32 function is
// unchanged, the factors follow s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) from the calibration
// data, they are folded into the LayerNorm / producing Linear and the consumers' weights, linears
// without a foldable producer are skipped with the reason, the alpha search picks the grid value
// with the smallest simulated error, and int8 accuracy improves on an input with outlier channels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

constexpr int64_t kC = 16;

// ln -> {q, k}; (q + k) -> fc -> fc2. Groups: ln -> {q, k} and fc -> fc2; fc's input (an add's
// output) has no producer to fold into; q and k feed an add.
struct Net : nn::CallableModule<Net> {
  Net() {
    ln = register_module("ln", std::make_shared<nn::LayerNormImpl>(kC));
    q = register_module("q", std::make_shared<nn::LinearImpl>(kC, 8));
    k = register_module("k", std::make_shared<nn::LinearImpl>(kC, 8));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(8, 12));
    fc2 = register_module("fc2", std::make_shared<nn::LinearImpl>(12, 4));
  }
  Tensor forward(const Tensor& x) {
    const Tensor h = (*ln)(x);
    return (*fc2)((*fc)((*q)(h) + (*k)(h)));
  }
  std::shared_ptr<nn::LayerNormImpl> ln;
  std::shared_ptr<nn::LinearImpl> q, k, fc, fc2;
};

// Post-LayerNorm residual: the normalized tensor also feeds the add, so it cannot be rescaled.
struct Residual : nn::CallableModule<Residual> {
  Residual() {
    ln = register_module("ln", std::make_shared<nn::LayerNormImpl>(kC));
    proj = register_module("proj", std::make_shared<nn::LinearImpl>(kC, kC));
  }
  Tensor forward(const Tensor& x) {
    const Tensor h = (*ln)(x);
    return (*proj)(h) + h;
  }
  std::shared_ptr<nn::LayerNormImpl> ln;
  std::shared_ptr<nn::LinearImpl> proj;
};

// Gamma with outlier channels (3 and 11), as trained transformers' layer norms have.
std::shared_ptr<Net> make_net() {
  manual_seed(3);
  auto m = std::make_shared<Net>();
  float* g = m->ln->weight.mutable_data<float>();
  float* b = m->ln->bias.mutable_data<float>();
  for (int64_t j = 0; j < kC; ++j) {
    g[j] = 0.5f + 0.05f * static_cast<float>(j);
    b[j] = 0.02f * static_cast<float>(j % 5) - 0.04f;
  }
  g[3] = 30.f;
  g[11] = -18.f;
  m->eval();
  return m;
}

std::vector<std::vector<Tensor>> calib() {
  std::vector<std::vector<Tensor>> c;
  for (uint64_t s = 0; s < 3; ++s) c.push_back({randn({4, 6, kC}, 10 + s)});
  return c;
}

std::vector<float> values(const Tensor& t) { return t.contiguous().to_vector<float>(); }

TEST(SmoothQuant, KeepsTheFp32FunctionAndFollowsTheFormula) {
  auto m = make_net();
  const Tensor x = randn({2, 5, kC}, 99);
  const Tensor before = (*m)(x);
  const std::vector<float> gamma0 = values(m->ln->weight), beta0 = values(m->ln->bias);
  const std::vector<float> q0 = values(m->q->weight), k0 = values(m->k->weight);
  const std::vector<float> fc0 = values(m->fc->weight), fcb0 = values(m->fc->bias), fc20 = values(m->fc2->weight);

  // Naive reference statistics: max |ln(x)_j| over the calibration data, max |W[:, j]| over q and k.
  std::vector<float> ax(kC, 0.f), aw(kC, 0.f);
  for (const auto& in : calib()) {
    const std::vector<float> h = values(layer_norm(in[0], {kC}, m->ln->weight, m->ln->bias));
    for (size_t i = 0; i < h.size(); ++i) ax[i % kC] = std::max(ax[i % kC], std::fabs(h[i]));
  }
  for (const std::vector<float>* w : {&q0, &k0}) {
    for (size_t i = 0; i < w->size(); ++i) aw[i % kC] = std::max(aw[i % kC], std::fabs((*w)[i]));
  }

  SmoothQuantOptions o;
  o.alpha = 0.6;
  o.fold_into_linears = true;
  const SmoothQuantReport r = smooth_quant(*m, calib(), o);
  ASSERT_EQ(r.groups.size(), 2u) << r.to_string();
  const SmoothedGroup& g = r.groups[0];
  EXPECT_EQ(g.producer, "ln");
  EXPECT_EQ(g.producer_kind, "layer_norm");
  // In the order they ran (C++ leaves the order of q(h) + k(h) to the compiler).
  std::vector<std::string> consumers = g.consumers;
  std::sort(consumers.begin(), consumers.end());
  EXPECT_EQ(consumers, (std::vector<std::string>{"k", "q"}));
  EXPECT_EQ(g.alpha, 0.6);
  ASSERT_EQ(g.factors.size(), static_cast<size_t>(kC));
  for (int64_t j = 0; j < kC; ++j) {
    const double s = std::pow(ax[j], 0.6) / std::pow(aw[j], 0.4);
    EXPECT_NEAR(g.act_absmax[j], ax[j], 1e-5 * ax[j]) << j;
    EXPECT_NEAR(g.weight_absmax[j], aw[j], 1e-7) << j;
    EXPECT_NEAR(g.factors[j], s, 1e-5 * s) << j;
  }
  // The outlier channels get the largest factors.
  EXPECT_GT(g.factors[3], 2.f * g.factors[0]);

  // Folded: gamma and beta divided, the consumers' columns multiplied.
  const std::vector<float> gamma = values(m->ln->weight), beta = values(m->ln->bias), q = values(m->q->weight);
  for (int64_t j = 0; j < kC; ++j) {
    EXPECT_FLOAT_EQ(gamma[j], gamma0[j] / g.factors[j]);
    EXPECT_FLOAT_EQ(beta[j], beta0[j] / g.factors[j]);
  }
  for (size_t i = 0; i < q.size(); ++i) EXPECT_FLOAT_EQ(q[i], q0[i] * g.factors[i % kC]);

  // The Linear -> Linear group: fc's rows and bias divided, fc2's columns multiplied.
  const SmoothedGroup& g2 = r.groups[1];
  EXPECT_EQ(g2.producer, "fc");
  EXPECT_EQ(g2.producer_kind, "linear");
  EXPECT_EQ(g2.consumers, (std::vector<std::string>{"fc2"}));
  const std::vector<float> fc = values(m->fc->weight), fcb = values(m->fc->bias), fc2 = values(m->fc2->weight);
  for (size_t i = 0; i < fc.size(); ++i) EXPECT_FLOAT_EQ(fc[i], fc0[i] / g2.factors[i / 8]);
  for (size_t j = 0; j < fcb.size(); ++j) EXPECT_FLOAT_EQ(fcb[j], fcb0[j] / g2.factors[j]);
  for (size_t i = 0; i < fc2.size(); ++i) EXPECT_FLOAT_EQ(fc2[i], fc20[i] * g2.factors[i % 12]);

  // fc's own input is an add's output: nothing to fold into.
  ASSERT_EQ(r.skipped.size(), 1u) << r.to_string();
  EXPECT_EQ(r.skipped[0].linear, "fc");
  EXPECT_NE(r.skipped[0].reason.find("not the output of a LayerNorm or Linear"), std::string::npos);

  const Tensor after = (*m)(x);
  EXPECT_LT(testing::relative_error(after, before), 1e-5);
}

TEST(SmoothQuant, AlphaZeroWithUnitWeightsIsIdentity) {
  // alpha 0: s_j = 1 / max|W_j|; alpha 1: s_j = max|X_j|. Both exact inverses on the fp32 side.
  for (double alpha : {0.0, 1.0}) {
    auto m = make_net();
    const Tensor x = randn({3, kC}, 5);
    const Tensor before = (*m)(x);
    SmoothQuantOptions o;
    o.alpha = alpha;
    o.fold_into_linears = true;
    const SmoothQuantReport r = smooth_quant(*m, calib(), o);
    ASSERT_FALSE(r.groups.empty());
    const SmoothedGroup& g = r.groups[0];
    for (int64_t j = 0; j < kC; ++j) {
      const double s = alpha == 0.0 ? 1.0 / g.weight_absmax[j] : g.act_absmax[j];
      EXPECT_NEAR(g.factors[j], s, 1e-5 * s);
    }
    EXPECT_LT(testing::relative_error((*m)(x), before), 1e-5) << "alpha " << alpha;
  }
}

TEST(SmoothQuant, PostLayerNormResidualIsSkippedAndReported) {
  manual_seed(4);
  auto m = std::make_shared<Residual>();
  m->eval();
  const std::vector<float> w0 = values(m->proj->weight), g0 = values(m->ln->weight);
  const SmoothQuantReport r = smooth_quant(*m, {{randn({2, kC}, 1)}});
  EXPECT_TRUE(r.groups.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].linear, "proj");
  EXPECT_NE(r.skipped[0].reason.find("its input comes from ln, which cannot be rescaled: its output is also read by add"),
            std::string::npos)
      << r.skipped[0].reason;
  EXPECT_EQ(values(m->proj->weight), w0);  // nothing changed
  EXPECT_EQ(values(m->ln->weight), g0);
  EXPECT_NE(r.to_string().find("skipped proj"), std::string::npos);
}

// ln's output is returned: rescaling it would change what the caller gets.
struct ReturnsNorm : nn::CallableModule<ReturnsNorm> {
  ReturnsNorm() {
    ln = register_module("ln", std::make_shared<nn::LayerNormImpl>(kC));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(kC, 4));
  }
  Tensor forward(const Tensor& x) {
    const Tensor h = (*ln)(x);
    side = (*fc)(h);
    return h;
  }
  std::shared_ptr<nn::LayerNormImpl> ln;
  std::shared_ptr<nn::LinearImpl> fc;
  Tensor side;
};

TEST(SmoothQuant, ModelOutputIsNotRescaled) {
  manual_seed(5);
  auto m = std::make_shared<ReturnsNorm>();
  const SmoothQuantReport r = smooth_quant(*m, {{randn({2, kC}, 1)}});
  EXPECT_TRUE(r.groups.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].reason, "its input comes from ln, which cannot be rescaled: its output is returned by the model");
}

TEST(SmoothQuant, AlphaSearchPicksTheSmallestSimulatedError) {
  auto m = make_net();
  SmoothQuantOptions o;
  o.search_alpha = true;
  o.alpha_grid = {0.0, 0.25, 0.5, 0.75, 1.0};
  o.fold_into_linears = true;
  const SmoothQuantReport r = smooth_quant(*m, calib(), o);
  ASSERT_EQ(r.groups.size(), 2u);
  for (const SmoothedGroup& g : r.groups) {
    EXPECT_NE(std::find(o.alpha_grid.begin(), o.alpha_grid.end(), g.alpha), o.alpha_grid.end());
    EXPECT_GT(g.error_before, 0.0);
    EXPECT_LE(g.error_after, g.error_before);
  }
  // With outliers of 30x, smoothing the layer norm's output helps a lot.
  EXPECT_LT(r.groups[0].error_after, 0.5 * r.groups[0].error_before) << r.to_string();
  // Each grid value alone gives an error no smaller than the chosen one.
  for (double a : o.alpha_grid) {
    auto m2 = make_net();
    SmoothQuantOptions one = o;
    one.alpha_grid = {a};
    const SmoothQuantReport r2 = smooth_quant(*m2, calib(), one);
    EXPECT_GE(r2.groups[0].error_after, r.groups[0].error_after) << "alpha " << a;
  }
}

// Output SQNR of the int8 model; `qk` gets the worse of the q and k linears' SQNR (their outputs
// are what smoothing the layer norm's output changes).
double int8_sqnr(const std::shared_ptr<Net>& m, const std::shared_ptr<Net>& ref, double* qk) {
  QConfigMapping mapping;
  mapping.set_global(QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max()));
  mapping.set_object_type(OpKind::kAdd, nullptr);
  prepare(*m, {randn({1, kC}, 1)}, mapping);
  for (const auto& in : calib()) (*m)(in[0]);
  convert(*m);
  const Tensor x = randn({8, 6, kC}, 77);
  const NumericReport rep = compare_numerics(*ref, *m, {{x}});
  if (std::getenv("SQ_DEBUG")) std::cout << rep.to_table() << "\n";
  *qk = 1e9;
  for (const OpNumerics& op : rep.ops) {
    if (op.fqn == "q" || op.fqn == "k") *qk = std::min(*qk, op.sqnr_db);
  }
  return rep.output_sqnr_db;
}

TEST(SmoothQuant, ImprovesInt8AccuracyWithOutlierChannels) {
  auto ref = make_net();
  auto plain = make_net();
  auto smoothed = make_net();
  SmoothQuantOptions o;
  o.search_alpha = true;
  const SmoothQuantReport r = smooth_quant(*smoothed, calib(), o);
  if (std::getenv("SQ_DEBUG")) std::cout << r.to_string();
  ASSERT_EQ(r.groups.size(), 1u) << r.to_string();  // ln -> {q, k}; fc -> fc2 only when asked
  EXPECT_EQ(r.groups[0].producer, "ln");
  double qk_plain = 0, qk_smoothed = 0;
  const double a = int8_sqnr(plain, ref, &qk_plain), b = int8_sqnr(smoothed, ref, &qk_smoothed);
  EXPECT_GT(qk_smoothed, qk_plain + 3.0) << "q/k: plain " << qk_plain << " dB, smoothed " << qk_smoothed << " dB";
  EXPECT_GT(b, a) << "plain " << a << " dB, smoothed " << b << " dB";
}

TEST(SmoothQuant, LinearProducersAreOptIn) {
  auto m = make_net();
  const std::vector<float> fc0 = values(m->fc->weight);
  const SmoothQuantReport r = smooth_quant(*m, calib());
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_EQ(values(m->fc->weight), fc0);
  bool reported = false;
  for (const SkippedLinear& k : r.skipped) {
    if (k.linear == "fc2") {
      reported = true;
      EXPECT_EQ(k.reason, "its input comes from fc, which cannot be rescaled: its producer is a Linear "
                          "(SmoothQuantOptions::fold_into_linears is off)");
    }
  }
  EXPECT_TRUE(reported) << r.to_string();
}

// A language model's head tied to its embedding (emb -> ln -> head, head.weight registered as
// emb.weight): scaling the head's weight columns would rescale the embedding too. Silent before.
struct TiedHead : nn::CallableModule<TiedHead> {
  TiedHead() {
    emb = register_module("emb", std::make_shared<nn::EmbeddingImpl>(10, kC));
    ln = register_module("ln", std::make_shared<nn::LayerNormImpl>(kC));
    head = register_module("head", std::make_shared<nn::LinearImpl>(kC, 10, false));
    head->weight = head->register_parameter("weight", emb->weight);
  }
  Tensor forward(const Tensor& ids) { return (*head)((*ln)((*emb)(ids))); }
  std::shared_ptr<nn::EmbeddingImpl> emb;
  std::shared_ptr<nn::LayerNormImpl> ln;
  std::shared_ptr<nn::LinearImpl> head;
};

TEST(SmoothQuant, TiedWeightsAreNotRescaled) {
  manual_seed(6);
  auto m = std::make_shared<TiedHead>();
  m->eval();
  float* g = m->ln->weight.mutable_data<float>();
  g[2] = 25.f;  // an outlier channel: smoothing would act if it could
  const Tensor ids = arange(0.0, 10.0, 1.0, DType::kS64).reshape({2, 5});
  const Tensor before = (*m)(ids);
  const std::vector<float> e0 = values(m->emb->weight), g0 = values(m->ln->weight);
  const SmoothQuantReport r = smooth_quant(*m, {{ids}});
  EXPECT_TRUE(r.groups.empty()) << r.to_string();
  ASSERT_EQ(r.skipped.size(), 1u) << r.to_string();
  EXPECT_EQ(r.skipped[0].linear, "head");
  EXPECT_EQ(r.skipped[0].reason, "its weight is tied to another registered tensor (emb.weight, head.weight)");
  EXPECT_EQ(values(m->emb->weight), e0);
  EXPECT_EQ(values(m->ln->weight), g0);
  EXPECT_EQ(values((*m)(ids)), values(before));
}

// A linear whose weight another op also reads (here relu on it, as weight-norm style code does):
// found at run time, the weight keeps its values.
struct WeightReadElsewhere : nn::CallableModule<WeightReadElsewhere> {
  WeightReadElsewhere() {
    ln = register_module("ln", std::make_shared<nn::LayerNormImpl>(kC));
    proj = register_module("proj", std::make_shared<nn::LinearImpl>(kC, kC));
  }
  Tensor forward(const Tensor& x) {
    side = relu(proj->weight);
    return (*proj)((*ln)(x));
  }
  std::shared_ptr<nn::LayerNormImpl> ln;
  std::shared_ptr<nn::LinearImpl> proj;
  Tensor side;
};

TEST(SmoothQuant, AWeightReadByAnotherOpIsNotRescaled) {
  manual_seed(7);
  auto m = std::make_shared<WeightReadElsewhere>();
  m->eval();
  m->ln->weight.mutable_data<float>()[4] = 20.f;
  const std::vector<float> w0 = values(m->proj->weight), g0 = values(m->ln->weight);
  const SmoothQuantReport r = smooth_quant(*m, {{randn({3, kC}, 2)}});
  EXPECT_TRUE(r.groups.empty()) << r.to_string();
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0].reason, "its weight is also read by relu");
  EXPECT_EQ(values(m->proj->weight), w0);
  EXPECT_EQ(values(m->ln->weight), g0);
}

// A LayerNorm's weight also read by a layer_norm call that is not the layer's own (no bias, or
// another bias): rescaling the weight would change that call's result, so the layer is skipped.
struct NormWeightReadElsewhere : nn::CallableModule<NormWeightReadElsewhere> {
  explicit NormWeightReadElsewhere(bool other_bias) : other_bias(other_bias) {
    ln = register_module("ln", std::make_shared<nn::LayerNormImpl>(kC));
    proj = register_module("proj", std::make_shared<nn::LinearImpl>(kC, kC));
    bias = register_parameter("bias", randn({kC}, 9));
  }
  Tensor forward(const Tensor& x) {
    const Tensor side = layer_norm(x * 2.0, {kC}, ln->weight, other_bias ? bias : Tensor());
    return (*proj)((*ln)(x)) + side;
  }
  bool other_bias;
  std::shared_ptr<nn::LayerNormImpl> ln;
  std::shared_ptr<nn::LinearImpl> proj;
  Tensor bias;
};

TEST(SmoothQuant, ANormWeightReadByAnotherLayerNormCallIsNotRescaled) {
  for (bool other_bias : {false, true}) {
    SCOPED_TRACE(other_bias ? "another bias" : "no bias");
    manual_seed(7);
    auto m = std::make_shared<NormWeightReadElsewhere>(other_bias);
    m->eval();
    m->ln->weight.mutable_data<float>()[4] = 20.f;
    const Tensor x = randn({3, kC}, 2);
    const Tensor before = (*m)(x);
    const std::vector<float> g0 = values(m->ln->weight);
    const SmoothQuantReport r = smooth_quant(*m, {{x}});
    EXPECT_TRUE(r.groups.empty()) << r.to_string();
    ASSERT_EQ(r.skipped.size(), 1u) << r.to_string();
    // (With another bias the call passes for the layer's and its output, read by add, tells.)
    EXPECT_EQ(r.skipped[0].reason, absl::StrCat("its input comes from ln, which cannot be rescaled: ",
                                                other_bias ? "its output is also read by add"
                                                           : "its weight is also read by layer_norm"));
    EXPECT_EQ(values(m->ln->weight), g0);
    EXPECT_LT(testing::relative_error((*m)(x), before), 1e-6);
  }
}

// One Linear registered under two names and called twice on the same tensor is not a tie: it is
// smoothed once, and the function is kept.
struct SharedLayer : nn::CallableModule<SharedLayer> {
  SharedLayer() {
    ln = register_module("ln", std::make_shared<nn::LayerNormImpl>(kC));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(kC, 6));
    register_module("fc_again", fc);
  }
  Tensor forward(const Tensor& x) {
    const Tensor h = (*ln)(x);
    return (*fc)(h) + (*fc)(h);
  }
  std::shared_ptr<nn::LayerNormImpl> ln;
  std::shared_ptr<nn::LinearImpl> fc;
};

TEST(SmoothQuant, ASharedLayerIsNotATie) {
  manual_seed(8);
  auto m = std::make_shared<SharedLayer>();
  m->eval();
  m->ln->weight.mutable_data<float>()[1] = 12.f;
  const Tensor x = randn({3, kC}, 3);
  const Tensor before = (*m)(x);
  const SmoothQuantReport r = smooth_quant(*m, {{x}});
  ASSERT_EQ(r.groups.size(), 1u) << r.to_string();
  EXPECT_EQ(r.groups[0].consumers, std::vector<std::string>{"fc"});
  EXPECT_LT(testing::relative_error((*m)(x), before), 1e-5);
}

TEST(SmoothQuant, BadInputs) {
  auto m = make_net();
  SmoothQuantOptions o;
  o.alpha = -0.1;
  EXPECT_THROW_MSG(smooth_quant(*m, calib(), o), ValueError, "smooth_quant: alpha must be in [0, 1], got -0.1");
  o.alpha = 1.5;
  EXPECT_THROW_MSG(smooth_quant(*m, calib(), o), ValueError, "alpha must be in [0, 1], got 1.5");
  o = SmoothQuantOptions{};
  o.search_alpha = true;
  o.alpha_grid = {0.5, 2.0};
  EXPECT_THROW_MSG(smooth_quant(*m, calib(), o), ValueError, "alpha_grid values must be in [0, 1], got 2");
  o.alpha_grid = {};
  EXPECT_THROW_MSG(smooth_quant(*m, calib(), o), ValueError, "search_alpha needs a non-empty alpha_grid");
  o.alpha_grid = {0.5};
  o.search_rows = 0;
  EXPECT_THROW_MSG(smooth_quant(*m, calib(), o), ValueError, "search_rows must be >= 1, got 0");
  EXPECT_THROW_MSG(smooth_quant(*m, {}), ValueError, "smooth_quant: no calibration data");
  // A failing calibration run leaves the parameters as they were.
  const std::vector<float> g0 = values(m->ln->weight);
  EXPECT_THROW(smooth_quant(*m, {{randn({2, kC + 1}, 1)}}), Error);
  EXPECT_EQ(values(m->ln->weight), g0);
  // After prepare: too late.
  prepare(*m, {randn({1, kC}, 1)}, default_qconfig_mapping("onednn"));
  EXPECT_THROW_MSG(smooth_quant(*m, calib()), UsageError, "the model is already prepared");
}

}  // namespace
}  // namespace dbrq
