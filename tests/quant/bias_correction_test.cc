// Bias correction (dbrq::correct_bias): against naive loops (fake-quantized weights, padded conv,
// mean per channel) for a conv's own bias, a batch norm's beta (weights folded first) and a
// linear; the int8 model's per-channel mean error against the fp32 original shrinks; corrected
// weights + the quant-state file reproduce the int8 model bit for bit; skipped layers; bad inputs.
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
using testing::randomize_bn;

std::vector<float> vals(const Tensor& t) { return t.contiguous().to_vector<float>(); }

void set_values(Tensor& t, const std::vector<float>& v) {
  float* p = t.mutable_data<float>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
}

void spread_rows(Tensor& w, uint64_t seed) {
  std::vector<float> v = vals(w);
  const int64_t rows = w.size(0), len = w.numel() / rows;
  std::vector<float> f = vals(rand_uniform({rows}, -1.5, 1.5, seed));
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t k = 0; k < len; ++k) v[o * len + k] *= std::pow(10.0f, f[o]);
  set_values(w, v);
}

QConfigMapping per_tensor_mapping() {
  return QConfigMapping().set_global(
      QConfig::make(ObserverSpec::min_max(), ObserverSpec::min_max(DType::kS8, QScheme::kPerTensorSymmetric)));
}

// Naive fake quantization with the observer's parameters (round half to even, saturate).
std::vector<double> fake_quant_error(const std::vector<float>& w, const ObserverSpec& spec, const Tensor& wt) {
  auto obs = make_observer(spec);
  obs->observe(wt);
  const QuantParamsPtr qp = obs->calculate_qparams();
  const int64_t rows = wt.size(0), len = wt.numel() / rows;
  std::vector<double> err(w.size());
  for (int64_t o = 0; o < rows; ++o) {
    const float s = qp->is_per_channel() ? qp->scales[o] : qp->scale();
    for (int64_t k = 0; k < len; ++k) {
      const float x = w[o * len + k];
      const float q = std::min(127.0f, std::max(-128.0f, std::nearbyint(x / s)));
      err[o * len + k] = double(x) - double(q * s);
    }
  }
  return err;
}

// Mean over batches, images and output positions of conv(x, dw) (3x3, stride 1, padding 1) per channel.
std::vector<double> naive_conv_mean(const std::vector<Tensor>& xs, const std::vector<double>& dw, int64_t cout,
                                    int64_t cin) {
  std::vector<double> sum(cout, 0.0);
  int64_t count = 0;
  for (const Tensor& xt : xs) {
    const std::vector<float> x = vals(xt);
    const int64_t n = xt.size(0), h = xt.size(2), w = xt.size(3);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t oy = 0; oy < h; ++oy)
        for (int64_t ox = 0; ox < w; ++ox) {
          ++count;
          for (int64_t o = 0; o < cout; ++o)
            for (int64_t c = 0; c < cin; ++c)
              for (int64_t ky = 0; ky < 3; ++ky)
                for (int64_t kx = 0; kx < 3; ++kx) {
                  const int64_t iy = oy + ky - 1, ix = ox + kx - 1;
                  if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                  sum[o] += dw[((o * cin + c) * 3 + ky) * 3 + kx] * x[((b * cin + c) * h + iy) * w + ix];
                }
        }
  }
  for (double& s : sum) s /= double(count);
  return sum;
}

struct OneConv : nn::CallableModule<OneConv> {
  explicit OneConv(bool bias = true) {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1, 1, 1, bias));
    spread_rows(conv->weight, 5);
  }
  Tensor forward(const Tensor& x) { return (*conv)(x); }
  std::shared_ptr<Conv2d> conv;
};

std::vector<std::vector<Tensor>> batches_of(const std::vector<Tensor>& xs) {
  std::vector<std::vector<Tensor>> out;
  for (const Tensor& x : xs) out.push_back({x});
  return out;
}

TEST(BiasCorrection, ConvBiasMatchesNaiveReference) {
  OneConv m;
  m.eval();
  const std::vector<Tensor> xs = {rand_uniform({2, 3, 5, 6}, -0.2, 1.0, 1), rand_uniform({1, 3, 5, 6}, -0.2, 1.0, 2)};
  const std::vector<float> b = vals(m.conv->bias), w = vals(m.conv->weight);
  const QConfigMapping mapping = per_tensor_mapping();
  const std::vector<double> shift =
      naive_conv_mean(xs, fake_quant_error(w, mapping.global()->weight, m.conv->weight), 4, 3);
  const BiasCorrectionReport r = correct_bias(m, batches_of(xs), mapping);
  ASSERT_EQ(r.layers.size(), 1u) << r.to_string();
  EXPECT_EQ(r.layers[0].layer, "conv");
  EXPECT_EQ(r.layers[0].target, "conv.bias");
  EXPECT_EQ(r.batches, 2);
  const std::vector<float> b2 = vals(m.conv->bias);
  double max_shift = 0;
  for (int o = 0; o < 4; ++o) {
    EXPECT_NEAR(b2[o] - b[o], shift[o], 1e-5 + 1e-4 * std::abs(shift[o])) << o;
    max_shift = std::max(max_shift, std::abs(shift[o]));
  }
  EXPECT_GT(max_shift, 1e-3);  // the case is not trivial
  EXPECT_NEAR(r.layers[0].max_abs_shift, max_shift, 1e-4 * max_shift);
  EXPECT_EQ(vals(m.conv->weight), w);  // weights untouched
}

struct ConvBn : nn::CallableModule<ConvBn> {
  ConvBn() {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1, 1, 1, false));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(4));
    randomize_bn(*bn, 7);
    spread_rows(conv->weight, 8);
  }
  Tensor forward(const Tensor& x) { return relu((*bn)((*conv)(x))); }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
};

TEST(BiasCorrection, BatchNormBetaWithFoldedWeights) {
  ConvBn m;
  m.eval();
  const std::vector<Tensor> xs = {rand_uniform({2, 3, 4, 4}, 0.0, 1.0, 3)};
  const std::vector<float> w = vals(m.conv->weight), g = vals(m.bn->weight), var = vals(m.bn->running_var),
                           beta = vals(m.bn->bias);
  std::vector<float> wf(w.size());
  for (int o = 0; o < 4; ++o)
    for (int k = 0; k < 27; ++k) wf[o * 27 + k] = w[o * 27 + k] * (g[o] / std::sqrt(var[o] + 1e-5f));
  Tensor wft = Tensor::empty({4, 3, 3, 3});
  set_values(wft, wf);
  // Default mapping: per-channel weights.
  const QConfigMapping mapping = default_qconfig_mapping("onednn");
  const std::vector<double> shift = naive_conv_mean(xs, fake_quant_error(wf, mapping.global()->weight, wft), 4, 3);
  const BiasCorrectionReport r = correct_bias(m, batches_of(xs), mapping);
  ASSERT_EQ(r.layers.size(), 1u) << r.to_string();
  EXPECT_EQ(r.layers[0].target, "bn.bias");
  const std::vector<float> beta2 = vals(m.bn->bias);
  for (int o = 0; o < 4; ++o) EXPECT_NEAR(beta2[o] - beta[o], shift[o], 1e-6 + 1e-3 * std::abs(shift[o])) << o;
  EXPECT_EQ(vals(m.conv->weight), w);
  EXPECT_EQ(vals(m.bn->weight), g);
}

TEST(BiasCorrection, LinearMatchesNaiveReference) {
  struct Fc : nn::CallableModule<Fc> {
    Fc() {
      fc = register_module("fc", std::make_shared<Linear>(5, 3));
      spread_rows(fc->weight, 9);
    }
    Tensor forward(const Tensor& x) { return (*fc)(x); }
    std::shared_ptr<Linear> fc;
  } m;
  m.eval();
  const Tensor x = rand_uniform({2, 4, 5}, 0.0, 2.0, 4);  // 3-D: rows are batch x sequence
  const std::vector<float> w = vals(m.fc->weight), b = vals(m.fc->bias), xv = vals(x);
  const QConfigMapping mapping = per_tensor_mapping();
  const std::vector<double> dw = fake_quant_error(w, mapping.global()->weight, m.fc->weight);
  correct_bias(m, {{x}}, mapping);
  const std::vector<float> b2 = vals(m.fc->bias);
  for (int o = 0; o < 3; ++o) {
    double s = 0;
    for (int r = 0; r < 8; ++r)
      for (int i = 0; i < 5; ++i) s += dw[o * 5 + i] * xv[r * 5 + i];
    s /= 8;
    EXPECT_NEAR(b2[o] - b[o], s, 1e-6 + 1e-4 * std::abs(s)) << o;
  }
}

// Per-channel mean of (int8 - fp32 original) over held-out data, averaged over channels.
double mean_channel_bias(const Tensor& q, const Tensor& ref) {
  const std::vector<float> a = vals(q), b = vals(ref);
  const int64_t n = q.size(0), c = q.size(1), hw = q.size(2) * q.size(3);
  double total = 0;
  for (int64_t o = 0; o < c; ++o) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < hw; ++k) s += double(a[(i * c + o) * hw + k]) - double(b[(i * c + o) * hw + k]);
    total += std::abs(s / double(n * hw));
  }
  return total / double(c);
}

struct Wide : nn::CallableModule<Wide> {
  Wide() {
    conv = register_module("conv", std::make_shared<Conv2d>(8, 16, 3, 1, 1));
    spread_rows(conv->weight, 13);
  }
  Tensor forward(const Tensor& x) { return (*conv)(x); }
  std::shared_ptr<Conv2d> conv;
};

TEST(BiasCorrection, ShrinksTheInt8MeanError) {
  auto make = [] {
    auto m = std::make_shared<Wide>();
    m->eval();
    return m;
  };
  auto ref = make(), plain = make(), corrected = make();
  plain->load_state_dict(ref->state_dict());
  corrected->load_state_dict(ref->state_dict());
  std::vector<std::vector<Tensor>> calib;
  for (int i = 0; i < 4; ++i) calib.push_back({rand_uniform({2, 8, 8, 8}, 0.0, 1.0, 100 + i)});
  const QConfigMapping mapping = per_tensor_mapping();
  correct_bias(*corrected, calib, mapping);
  for (auto* m : {plain.get(), corrected.get()}) {
    prepare(*m, {calib[0][0]}, mapping);
    for (const auto& b : calib) (*m)(b[0]);
    convert(*m);
  }
  const Tensor test = rand_uniform({4, 8, 8, 8}, 0.0, 1.0, 999);
  const Tensor y = (*ref)(test);
  const double before = mean_channel_bias((*plain)(test), y), after = mean_channel_bias((*corrected)(test), y);
  EXPECT_LT(after, 0.5 * before) << "mean |channel bias| " << before << " -> " << after;
}

// The batch norm is not fused with the conv (kept fp32 by the mapping; or the conv lives in a
// child module, which prepare never fuses across): convert runs the conv int8 with its own
// weights, so the shift is the unfolded weights' error, carried through the batch norm
// (times gamma / sigma) into beta. Before, the folded weights' error was used as if fused.
struct ChildConvBn : nn::CallableModule<ChildConvBn> {
  ChildConvBn() {
    auto conv = std::make_shared<Conv2d>(3, 4, 3, 1, 1, 1, 1, false);
    spread_rows(conv->weight, 8);
    body = register_module("body", std::make_shared<nn::SequentialImpl>(std::vector<std::shared_ptr<nn::Module>>{conv}));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(4));
    randomize_bn(*bn, 7);
    this->conv = conv;
  }
  Tensor forward(const Tensor& x) { return relu((*bn)((*body)(x))); }
  std::shared_ptr<nn::SequentialImpl> body;
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
};

template <typename M>
void expect_unfused_bn_shift(M& m, const QConfigMapping& mapping, const std::string& what) {
  m.eval();
  const std::vector<Tensor> xs = {rand_uniform({2, 3, 4, 4}, 0.0, 1.0, 3)};
  const std::vector<float> w = vals(m.conv->weight), g = vals(m.bn->weight), var = vals(m.bn->running_var),
                           beta = vals(m.bn->bias);
  std::vector<double> shift = naive_conv_mean(xs, fake_quant_error(w, mapping.global()->weight, m.conv->weight), 4, 3);
  for (int o = 0; o < 4; ++o) shift[o] *= g[o] / std::sqrt(double(var[o]) + 1e-5);
  const BiasCorrectionReport r = correct_bias(m, batches_of(xs), mapping);
  ASSERT_EQ(r.layers.size(), 1u) << what << "\n" << r.to_string();
  EXPECT_EQ(r.layers[0].target, "bn.bias") << what;
  const std::vector<float> beta2 = vals(m.bn->bias);
  double max_shift = 0;
  for (int o = 0; o < 4; ++o) {
    EXPECT_NEAR(beta2[o] - beta[o], shift[o], 1e-6 + 1e-3 * std::abs(shift[o])) << what << " channel " << o;
    max_shift = std::max(max_shift, std::abs(shift[o]));
  }
  EXPECT_GT(max_shift, 1e-3) << what;
  EXPECT_EQ(vals(m.conv->weight), w) << what;
}

TEST(BiasCorrection, UnfusedBatchNormTakesTheUnfoldedShift) {
  {
    ConvBn m;
    QConfigMapping mapping = per_tensor_mapping();
    mapping.set_object_type("BatchNorm2d", nullptr);
    expect_unfused_bn_shift(m, mapping, "batch norm kept fp32");
  }
  {
    ChildConvBn m;
    expect_unfused_bn_shift(m, per_tensor_mapping(), "conv in a child module");
  }
}

// And the correction does what it is for on such a model: the int8 output's per-channel mean
// error shrinks.
TEST(BiasCorrection, UnfusedBatchNormShrinksTheInt8MeanError) {
  QConfigMapping mapping = per_tensor_mapping();
  mapping.set_object_type("BatchNorm2d", nullptr);
  // conv -> bn, no relu (it would hide negative shifts).
  struct ConvBnOut : nn::CallableModule<ConvBnOut> {
    ConvBnOut() {
      conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1, 1, 1, false));
      bn = register_module("bn", std::make_shared<BatchNorm2d>(4));
      randomize_bn(*bn, 7);
      spread_rows(conv->weight, 8);
    }
    Tensor forward(const Tensor& x) { return (*bn)((*conv)(x)); }
    std::shared_ptr<Conv2d> conv;
    std::shared_ptr<BatchNorm2d> bn;
  };
  auto ref = std::make_shared<ConvBnOut>(), plain = std::make_shared<ConvBnOut>(),
       corrected = std::make_shared<ConvBnOut>();
  for (auto* m : {ref.get(), plain.get(), corrected.get()}) m->eval();
  plain->load_state_dict(ref->state_dict());
  corrected->load_state_dict(ref->state_dict());
  std::vector<std::vector<Tensor>> calib;
  for (int i = 0; i < 4; ++i) calib.push_back({rand_uniform({2, 3, 8, 8}, 0.0, 1.0, 200 + i)});
  correct_bias(*corrected, calib, mapping);
  for (auto* m : {plain.get(), corrected.get()}) {
    prepare(*m, {calib[0][0]}, mapping);
    for (const auto& b : calib) (*m)(b[0]);
    convert(*m);
  }
  const Tensor test = rand_uniform({4, 3, 8, 8}, 0.0, 1.0, 998);
  const Tensor y = (*ref)(test);
  const double before = mean_channel_bias((*plain)(test), y), after = mean_channel_bias((*corrected)(test), y);
  EXPECT_LT(after, 0.5 * before) << "mean |channel bias| " << before << " -> " << after;
}

TEST(BiasCorrection, CorrectedWeightsAndQuantStateReproduceTheInt8Model) {
  const std::string path = testing::temp_file("bias_corrected.qstate.json");
  ConvBn m;
  m.eval();
  std::vector<std::vector<Tensor>> calib = {{rand_uniform({2, 3, 6, 6}, 0.0, 1.0, 20)},
                                            {rand_uniform({2, 3, 6, 6}, 0.0, 1.0, 21)}};
  correct_bias(m, calib);
  prepare(m, {calib[0][0]});
  for (const auto& b : calib) m(b[0]);
  save_quant_state(m, path);
  convert(m);
  const Tensor x = rand_uniform({3, 3, 6, 6}, 0.0, 1.0, 22);
  const Tensor y = m(x);

  ConvBn deployed;  // other initial weights: everything comes from the files
  deployed.eval();
  deployed.load_state_dict(m.state_dict());
  prepare(deployed, {calib[0][0]});
  load_quant_state(deployed, path);
  convert(deployed);
  testing::expect_equal(deployed(x), y, "deployed int8 output");
}

// A bias another module also registers (here `side`, which this forward never calls) is not
// shifted: `side` would change silently on the path that calls it.
TEST(BiasCorrection, TiedBiasIsNotShifted) {
  struct TiedBias : nn::CallableModule<TiedBias> {
    TiedBias() {
      conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1));
      side = register_module("side", std::make_shared<Conv2d>(3, 4, 1));
      side->bias = side->register_parameter("bias", conv->bias);
      spread_rows(conv->weight, 5);
    }
    Tensor forward(const Tensor& x) { return (*conv)(x); }
    std::shared_ptr<Conv2d> conv, side;
  };
  TiedBias m;
  m.eval();
  const std::vector<float> b = vals(m.conv->bias);
  const BiasCorrectionReport r = correct_bias(m, {{rand_uniform({2, 3, 5, 6}, -0.2, 1.0, 1)}}, per_tensor_mapping());
  EXPECT_TRUE(r.layers.empty()) << r.to_string();
  ASSERT_EQ(r.skipped.size(), 1u) << r.to_string();
  EXPECT_EQ(r.skipped[0], "conv: its bias is tied to another registered tensor (conv.bias, side.bias)");
  EXPECT_EQ(vals(m.conv->bias), b);
}

TEST(BiasCorrection, SkippedLayersAreReported) {
  OneConv nobias(/*bias=*/false);
  nobias.eval();
  BiasCorrectionReport r = correct_bias(nobias, {{randn({1, 3, 4, 4}, 1)}});
  EXPECT_TRUE(r.layers.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0], "conv: no bias to correct (bias=false and no batch norm after it)");
  EXPECT_NE(r.to_string().find("no conv2d or linear layer to correct"), std::string::npos);

  OneConv m;
  m.eval();
  const std::vector<float> b = vals(m.conv->bias);
  r = correct_bias(m, {{randn({1, 3, 4, 4}, 1)}}, QConfigMapping());  // everything fp32
  EXPECT_TRUE(r.layers.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0], "conv: kept fp32 by the mapping");
  EXPECT_EQ(vals(m.conv->bias), b);

  // A layer marked bf16 has no int8 weight error to correct (before: the marker's default u8
  // weight spec invented one and shifted the bias).
  r = correct_bias(m, {{randn({1, 3, 4, 4}, 1)}}, default_qconfig_mapping().set_module_name("conv", QConfig::bf16()));
  EXPECT_TRUE(r.layers.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0], "conv: marked bf16 by the mapping (no int8 weights to correct for)");
  EXPECT_EQ(vals(m.conv->bias), b);

  // Per-channel weights along the input channels: convert refuses the qconfig and runs the conv
  // fp32, so a correction would shift an fp32 layer's output.
  r = correct_bias(m, {{randn({1, 3, 4, 4}, 1)}},
                   default_qconfig_mapping().set_module_name(
                       "conv", QConfig::make(ObserverSpec::histogram(),
                                             ObserverSpec::per_channel_min_max(DType::kS8,
                                                                               QScheme::kPerChannelSymmetric, 1))));
  EXPECT_TRUE(r.layers.empty());
  ASSERT_EQ(r.skipped.size(), 1u);
  EXPECT_EQ(r.skipped[0], "conv: convert runs it fp32: conv2d: backend onednn needs per-channel weights along axis 0 "
                          "(output channels), got ch_axis 1");
  EXPECT_EQ(vals(m.conv->bias), b);
}

TEST(BiasCorrection, BadInputs) {
  OneConv m;
  const Tensor x = randn({1, 3, 4, 4}, 1);
  EXPECT_THROW_MSG(correct_bias(m, {{x}}), UsageError, "is in training mode; call eval() first");
  m.eval();
  EXPECT_THROW_MSG(correct_bias(m, {}), ValueError, "correct_bias: no calibration data");
  EXPECT_THROW_MSG(correct_bias(m, {{x}, {}}), ValueError, "correct_bias: calibration batch 1 is empty");
  QConfigMapping bad = default_qconfig_mapping("onednn");
  bad.set_module_name("nope", nullptr);
  EXPECT_THROW_MSG(correct_bias(m, {{x}}, bad), ValueError, "QConfigMapping names module(s) \"nope\"");
  // A batch that fails part-way: nothing is corrected.
  const std::vector<float> b = vals(m.conv->bias);
  EXPECT_THROW(correct_bias(m, {{x}, {randn({1, 5, 4, 4}, 2)}}), ShapeError);
  EXPECT_EQ(vals(m.conv->bias), b);
  prepare(m, {x});
  EXPECT_THROW_MSG(correct_bias(m, {{x}}), UsageError,
                   "is prepared; correct the fp32 model's biases before dbrq::prepare");
}

}  // namespace
}  // namespace dbrq
