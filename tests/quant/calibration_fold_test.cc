// Calibration computes what PyTorch FX's prepared model computes (issue 13): a batch norm after a
// conv / linear / conv_transpose is folded into its weights before the observers see the output
// (tracer/fold_calibration.h), and conv2d / linear sum in PyTorch 1.13's order
// (kernels::conv2d_torch_order, linear_torch_order). The end-to-end check against FX is
// tests/models/digits_residual_test.cc; here each piece against a reference built in the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dbrq.h"
#include "kernels/bf16.h"
#include "kernels/bn_fold.h"
#include "kernels/eager.h"
#include "tests/test_util.h"

namespace {

using dbrq::Tensor;
namespace nn = dbrq::nn;
namespace kernels = dbrq::kernels;

void set_values(Tensor& t, const std::vector<float>& v) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::copy(v.begin(), v.end(), t.mutable_data<float>());
}

template <typename BN>
void randomize(BN& bn, uint64_t seed) {
  const int64_t c = bn.num_features();
  set_values(bn.running_mean, dbrq::randn({c}, seed).to_vector<float>());
  std::vector<float> v = dbrq::randn({c}, seed + 1).to_vector<float>();
  for (float& x : v) x = 0.2f + x * x;  // positive
  set_values(bn.running_var, v);
  set_values(bn.weight, dbrq::randn({c}, seed + 2).to_vector<float>());
  set_values(bn.bias, dbrq::randn({c}, seed + 3).to_vector<float>());
}

template <typename BN>
kernels::BatchNormStats stats_of(const BN& bn) {
  return {bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps()};
}

dbrq::QConfigMapping minmax_mapping() {
  dbrq::QConfigMapping m;
  m.set_global(dbrq::QConfig::make(dbrq::ObserverSpec::min_max(), dbrq::ObserverSpec::per_channel_min_max()));
  return m;
}

std::string chain_of(const nn::Module& m, int index) {
  for (const dbrq::QuantizedOpInfo& op : dbrq::quantized_ops(m)) {
    if (op.index == index) return op.op;
  }
  return "";
}

Tensor relu_of(const Tensor& x) { return kernels::eltwise(kernels::Eltwise::relu(), x); }

void expect_bitwise(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>()) << what;
}

struct ConvBnRelu : nn::CallableModule<ConvBnRelu> {
  ConvBnRelu() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(3, 8, 3).padding(1).stride(2)));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2dImpl>(8));
    relu = register_module("relu", std::make_shared<nn::ReLUImpl>());
    randomize(*bn, 10);
  }
  Tensor forward(const Tensor& x) { return (*relu)((*bn)((*conv)(x))); }
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<nn::BatchNorm2dImpl> bn;
  std::shared_ptr<nn::ReLUImpl> relu;
};

// The calibrating call computes relu(conv(x; folded w, folded b)) in PyTorch's order: exactly what
// FX's ConvReLU2d computes while calibrating.
TEST(CalibrationFold, ConvBatchNormReluObservesTheFoldedConv) {
  dbrq::manual_seed(3);
  ConvBnRelu m;
  m.eval();
  const Tensor x = dbrq::randn({4, 3, 9, 9}, 5);
  dbrq::prepare(m, {x}, minmax_mapping());
  ASSERT_EQ(chain_of(m, 0), "conv2d+batch_norm+relu");
  Tensor fw, fb;
  kernels::fold_batch_norm(m.conv->weight, m.conv->bias, stats_of(*m.bn), &fw, &fb);
  const Tensor want = relu_of(kernels::conv2d_torch_order(x, fw, fb, m.conv->params()));
  expect_bitwise(m(x), want, "calibrating call");
  // With observers off: the fp32 model's values, unfolded.
  const Tensor fp32 = relu_of(kernels::batch_norm(kernels::conv2d(x, m.conv->weight, m.conv->bias, m.conv->params()),
                                                        m.bn->running_mean, m.bn->running_var, m.bn->weight,
                                                        m.bn->bias, m.bn->eps()));
  dbrq::disable_observers(m);
  expect_bitwise(m(x), fp32, "observers off");
}

// A batch norm statistic written between calls is folded with its new value.
TEST(CalibrationFold, ChangedStatisticsAreFoldedAgain) {
  dbrq::manual_seed(4);
  ConvBnRelu m;
  m.eval();
  const Tensor x = dbrq::randn({2, 3, 8, 8}, 6);
  dbrq::prepare(m, {x}, minmax_mapping());
  m(x);
  randomize(*m.bn, 50);
  Tensor fw, fb;
  kernels::fold_batch_norm(m.conv->weight, m.conv->bias, stats_of(*m.bn), &fw, &fb);
  expect_bitwise(m(x), relu_of(kernels::conv2d_torch_order(x, fw, fb, m.conv->params())), "after the change");
}

struct DeconvBnRelu : nn::CallableModule<DeconvBnRelu> {
  DeconvBnRelu() {
    deconv = register_module(
        "deconv", std::make_shared<nn::ConvTranspose2dImpl>(nn::ConvTranspose2dOptions(4, 6, 3).stride(2).groups(2)));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2dImpl>(6));
    relu = register_module("relu", std::make_shared<nn::ReLUImpl>());
    randomize(*bn, 20);
  }
  Tensor forward(const Tensor& x) { return (*relu)((*bn)((*deconv)(x))); }
  std::shared_ptr<nn::ConvTranspose2dImpl> deconv;
  std::shared_ptr<nn::BatchNorm2dImpl> bn;
  std::shared_ptr<nn::ReLUImpl> relu;
};

// conv_transpose2d's weight is [in, out/groups, kh, kw]: the fold scales dim 1 per output channel
// (fuse_conv_bn_weights(transpose=True)); the calibrating call runs the op in its own layout.
TEST(CalibrationFold, GroupedConvTransposeFoldsAlongItsOutputChannels) {
  dbrq::manual_seed(5);
  DeconvBnRelu m;
  m.eval();
  const Tensor x = dbrq::randn({2, 4, 5, 5}, 7);
  dbrq::prepare(m, {x}, minmax_mapping());
  ASSERT_EQ(chain_of(m, 0), "conv_transpose2d+batch_norm+relu");
  // Reference fold, written out: output channel of w[i][j] is (i / (in/groups)) * (out/groups) + j.
  const Tensor& w = m.deconv->weight;
  const int64_t in = w.size(0), outg = w.size(1), per = w.size(2) * w.size(3), ing = in / 2;
  const std::vector<float> mean = m.bn->running_mean.to_vector<float>(), var = m.bn->running_var.to_vector<float>();
  const std::vector<float> gamma = m.bn->weight.to_vector<float>(), beta = m.bn->bias.to_vector<float>();
  const std::vector<float> b = m.deconv->bias.to_vector<float>();
  std::vector<float> wv = w.to_vector<float>(), bv(b.size());
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t j = 0; j < outg; ++j) {
      const int64_t oc = (i / ing) * outg + j;
      const float rsqrt = 1.f / std::sqrt(var[oc] + static_cast<float>(m.bn->eps()));
      for (int64_t s = 0; s < per; ++s) wv[(i * outg + j) * per + s] *= gamma[oc] * rsqrt;
    }
  }
  for (size_t c = 0; c < b.size(); ++c) {
    const float rsqrt = 1.f / std::sqrt(var[c] + static_cast<float>(m.bn->eps()));
    bv[c] = (b[c] - mean[c]) * rsqrt * gamma[c] + beta[c];
  }
  const Tensor fw = dbrq::from_vector(wv, w.sizes());
  const Tensor fb = dbrq::from_vector(bv, {static_cast<int64_t>(bv.size())});
  expect_bitwise(m(x), relu_of(kernels::conv_transpose2d(x, fw, fb, m.deconv->params())), "calibrating call");
}

// A functional batch norm whose statistics are not the model's own tensors (here made afresh on
// every call) is not folded into the conv: folded weights could not follow statistics that change
// from call to call. The batch norm runs on its own (with the relu), and the calibrating call
// computes the fp32 chain (the conv's sums in PyTorch's order while observing: within rounding).
struct FreshStats : nn::CallableModule<FreshStats> {
  FreshStats() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(2, 4, 3).padding(1)));
    relu = register_module("relu", std::make_shared<nn::ReLUImpl>());
  }
  Tensor forward(const Tensor& x) {
    const Tensor mean = dbrq::from_vector(std::vector<float>{0.1f, -0.2f, 0.3f, 0.f}, {4});
    const Tensor var = dbrq::from_vector(std::vector<float>{0.5f, 2.f, 1.f, 3.f}, {4});
    const Tensor gamma = dbrq::from_vector(std::vector<float>{1.5f, -0.7f, 0.9f, 1.1f}, {4});
    const Tensor beta = dbrq::from_vector(std::vector<float>{0.2f, 0.1f, -0.3f, 0.4f}, {4});
    return (*relu)(dbrq::batch_norm((*conv)(x), mean, var, gamma, beta, 1e-5));
  }
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<nn::ReLUImpl> relu;
};

TEST(CalibrationFold, OtherStatisticsThanRecordedRecomputeTheUnfusedChain) {
  dbrq::manual_seed(6);
  FreshStats m;
  m.eval();
  const Tensor x = dbrq::randn({2, 2, 6, 6}, 8);
  const Tensor fp32 = m(x);
  dbrq::prepare(m, {x}, minmax_mapping());
  ASSERT_EQ(chain_of(m, 0), "conv2d");
  ASSERT_EQ(chain_of(m, 1), "batch_norm+relu");
  dbrq::testing::expect_close(m(x), fp32, 1e-5, "calibrating call");
}

// A fused conv -> batch_norm whose conv output is also read elsewhere: by another branch's op on
// a call that takes it (the chain is still fused: analysis runs after the call), and after a
// write into it. Each reader sees the conv's own output; before, the folded value (batch norm
// already applied) reached relu and ignored the write, silently.
struct BranchAfterConv : nn::CallableModule<BranchAfterConv> {
  BranchAfterConv() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(3, 6, 3).padding(1)));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2dImpl>(6));
    relu = register_module("relu", std::make_shared<nn::ReLUImpl>());
    randomize(*bn, 30);
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    if (poke) {
      float* v = y.raw_mutable_data<float>();  // every element: any order
      for (int64_t i = 0; i < y.numel(); ++i) v[i] += 3.f;
    }
    return bn_branch ? (*relu)((*bn)(y)) : (*relu)(y);
  }
  bool bn_branch = true, poke = false;
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<nn::BatchNorm2dImpl> bn;
  std::shared_ptr<nn::ReLUImpl> relu;
};

TEST(CalibrationFold, OtherReadersOfTheConvOutputSeeItsOwnValue) {
  dbrq::manual_seed(9);
  BranchAfterConv m;
  m.eval();
  const Tensor x = dbrq::randn({2, 3, 7, 7}, 12);
  m.bn_branch = false;
  const Tensor fp32_relu = m(x);
  m.bn_branch = true;
  m.poke = true;
  const Tensor fp32_poked = m(x);
  m.poke = false;
  dbrq::prepare(m, {x}, minmax_mapping());
  ASSERT_EQ(chain_of(m, 0), "conv2d+batch_norm+relu");
  m(x);
  m.bn_branch = false;  // first call of the other branch: the conv record is still fused
  expect_bitwise(m(x), fp32_relu, "relu reading the conv output");
  m.bn_branch = true;
  m.poke = true;  // a write between the conv and its batch norm
  expect_bitwise(m(x), fp32_poked, "batch norm after a write into the conv output");
}

// A linear on [N, L, F] followed by batch_norm1d normalizes dim 1 (the L positions), not the
// linear's output features (the last dim); with L equal to out_features nothing failed, and the
// batch norm was folded into the linear's weight rows: the calibrating call returned another
// function than the fp32 model (and convert kept it). PyTorch's fuse_linear_bn_weights holds for
// 2-D inputs only. The chain must not fuse; a 2-D input still folds.
struct LinearBn1d : nn::CallableModule<LinearBn1d> {
  LinearBn1d() {
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(5, 6));
    bn = register_module("bn", std::make_shared<nn::BatchNorm1dImpl>(6));
    randomize(*bn, 40);
  }
  Tensor forward(const Tensor& x) { return (*bn)((*fc)(x)); }
  std::shared_ptr<nn::LinearImpl> fc;
  std::shared_ptr<nn::BatchNorm1dImpl> bn;
};

TEST(CalibrationFold, LinearOnA3dInputDoesNotFoldTheBatchNormOverItsDim1) {
  dbrq::manual_seed(41);
  LinearBn1d m;
  m.eval();
  const Tensor x = dbrq::randn({4, 6, 5}, 42);  // L = 6 = out_features
  const Tensor fp32 = m(x);
  dbrq::prepare(m, {x}, minmax_mapping());
  EXPECT_EQ(chain_of(m, 0), "linear");
  dbrq::testing::expect_close(m(x), fp32, 1e-5, "calibrating call");
  for (int i = 0; i < 3; ++i) m(dbrq::randn({4, 6, 5}, 43 + i));
  dbrq::convert(m);
  dbrq::testing::expect_close(m(x), fp32, 0.05, "int8");

  LinearBn1d m2;  // the same layers on [N, F]: linear + batch_norm folds
  m2.eval();
  const Tensor x2 = dbrq::randn({8, 5}, 47);
  dbrq::prepare(m2, {x2}, minmax_mapping());
  EXPECT_EQ(chain_of(m2, 0), "linear+batch_norm");
  m2(x2);
  dbrq::convert(m2);
  // Converted with the batch norm folded in: a 3-D input is refused, not computed on the wrong axis.
  EXPECT_THROW_MSG(m2(x), dbrq::ControlFlowError,
                   "int8 linear: a batch norm was folded into it from 2-D calls, so it takes 2-D inputs only, got "
                   "sizes [4, 6, 5]");

  // Fused from 2-D calls, then a 3-D calibrating call: it computes the fp32 function (no fold).
  LinearBn1d m3;
  m3.eval();
  const Tensor fp32_3d = m3(x);
  dbrq::prepare(m3, {x2}, minmax_mapping());
  ASSERT_EQ(chain_of(m3, 0), "linear+batch_norm");
  dbrq::testing::expect_close(m3(x), fp32_3d, 1e-5, "3-D calibrating call of a fused linear");
}

// in_features 0: every kernel returns the bias in every row, as PyTorch does (an empty sum), for a
// 3-D input too. Before, the row count came from x.numel() / in_features (0 / 0): the fp32 and bf16
// kernels returned an empty result, or zeros, and the PyTorch-order one read no rows.
TEST(TorchOrderKernels, ZeroInFeaturesGiveTheBiasInEveryRow) {
  const Tensor x = dbrq::Tensor::empty({2, 3, 0}, dbrq::DType::kF32);
  const Tensor w = dbrq::Tensor::empty({4, 0}, dbrq::DType::kF32);
  const Tensor b = dbrq::randn({4}, 3);
  const std::vector<float> bv = b.to_vector<float>();
  std::vector<float> want;
  for (int r = 0; r < 6; ++r) want.insert(want.end(), bv.begin(), bv.end());
  for (const auto& [name, got] : std::vector<std::pair<std::string, Tensor>>{
           {"fp32", kernels::linear(x, w, b)},
           {"fp32 relu post-op", kernels::linear(x, w, b, {kernels::Eltwise::relu()})},
           {"torch order", kernels::linear_torch_order(x, w, b)},
           {"bf16", kernels::linear_bf16(x, w, b)},
           {"public op", dbrq::linear(x, w, b)}}) {
    ASSERT_TRUE(got.defined()) << name;
    ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 3, 4})) << name;
    std::vector<float> expect = want;
    if (name == "fp32 relu post-op")
      for (float& v : expect) v = std::max(v, 0.f);
    EXPECT_EQ(got.contiguous().to_vector<float>(), expect) << name;
  }
  EXPECT_EQ(kernels::linear(x, w, Tensor()).contiguous().to_vector<float>(), std::vector<float>(24, 0.f));
}

// linear_torch_order: each output is the dot product summed over k in order, one rounding per
// step, then + bias (the reference BLAS through PyTorch's addmm). Volatile keeps the compiler from
// fusing or reordering the reference's steps.
// Output counts below, at and past the 16-feature blocks (5, 16, 37 = 16 + 16 + 5), so both the
// vector and the remainder path run; with 2 threads the blocks are split between them.
TEST(TorchOrderKernels, LinearSumsInOrderThenAddsBias) {
  for (const int threads : {1, 2}) {
    dbrq::set_num_threads(threads);
    for (const int64_t n : {5, 16, 37}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " threads=" << threads);
      const Tensor x = dbrq::randn({3, 2, 37}, 11);
      const Tensor w = dbrq::randn({n, 37}, 12);
      const Tensor b = dbrq::randn({n}, 13);
      const Tensor got = kernels::linear_torch_order(x, w, b);
      ASSERT_EQ(got.sizes(), (std::vector<int64_t>{3, 2, n}));
      const std::vector<float> xv = x.to_vector<float>(), wv = w.to_vector<float>(), bv = b.to_vector<float>();
      std::vector<float> want;
      for (int64_t i = 0; i < 6; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          volatile float acc = 0.f;
          for (int64_t l = 0; l < 37; ++l) {
            volatile float prod = xv[i * 37 + l] * wv[j * 37 + l];
            acc = acc + prod;
          }
          volatile float out = acc + bv[j];
          want.push_back(static_cast<float>(out));
        }
      }
      EXPECT_EQ(got.to_vector<float>(), want);
      // Without bias: the sum alone; against oneDNN's eager linear: the same function.
      const Tensor nob = kernels::linear_torch_order(x, w, Tensor());
      dbrq::testing::expect_close(nob, kernels::linear(x, w, Tensor()), 1e-5, "no bias");
      dbrq::testing::expect_close(got, kernels::linear(x, w, b), 1e-5, "vs eager linear");
    }
  }
  dbrq::set_num_threads(1);
}

TEST(TorchOrderKernels, Conv2dComputesTheConvolution) {
  for (int64_t groups : {1, 2}) {
    SCOPED_TRACE(groups);
    const Tensor x = dbrq::randn({2, 4, 7, 6}, 14);
    const Tensor w = dbrq::randn({6, 4 / groups, 3, 3}, 15);
    const Tensor b = dbrq::randn({6}, 16);
    dbrq::Conv2dParams p;
    p.stride = {2, 1};
    p.padding = {1, 0};
    p.groups = groups;
    const Tensor got = kernels::conv2d_torch_order(x, w, b, p);
    EXPECT_TRUE(got.is_contiguous());
    dbrq::testing::expect_close(got, kernels::conv2d(x, w, b, p), 1e-5, "with bias");
    dbrq::testing::expect_close(kernels::conv2d_torch_order(x, w, Tensor(), p), kernels::conv2d(x, w, Tensor(), p), 1e-5,
                                "without bias");
  }
}

TEST(TorchOrderKernels, BadInputsAreRejected) {
  const Tensor x = dbrq::randn({1, 3, 5, 5}, 1);
  dbrq::Conv2dParams p;
  try {
    kernels::conv2d_torch_order(x, dbrq::randn({4, 2, 3, 3}, 2), Tensor(), p);
    FAIL() << "expected ShapeError";
  } catch (const dbrq::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d"), std::string::npos) << e.what();
  }
  try {
    kernels::linear_torch_order(dbrq::randn({2, 4}, 3), dbrq::randn({3, 5}, 4), Tensor());
    FAIL() << "expected ShapeError";
  } catch (const dbrq::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("linear"), std::string::npos) << e.what();
  }
}

// A linear's weight (2-D) folds as fuse_linear_bn_weights: bias (b - mean) * (gamma * rsqrt) + beta;
// a conv's as fuse_conv_bn_weights: ((b - mean) * rsqrt) * gamma + beta. Written out here.
TEST(CalibrationFold, LinearAndConvFoldTheBiasInPyTorchsOrder) {
  const int64_t k = 64;
  const Tensor mean = dbrq::randn({k}, 31), gamma = dbrq::randn({k}, 32), beta = dbrq::randn({k}, 33);
  std::vector<float> var = dbrq::randn({k}, 34).to_vector<float>();
  for (float& v : var) v = 0.1f + v * v;
  const Tensor var_t = dbrq::from_vector(var, {k});
  const Tensor b = dbrq::randn({k}, 35);
  const kernels::BatchNormStats st{mean, var_t, gamma, beta, 1e-5};
  const std::vector<float> m = mean.to_vector<float>(), g = gamma.to_vector<float>(), be = beta.to_vector<float>(),
                           bv = b.to_vector<float>();
  std::vector<float> want_linear(k), want_conv(k);
  for (int64_t c = 0; c < k; ++c) {
    const float rsqrt = 1.f / std::sqrt(var[c] + 1e-5f);
    const float scale = g[c] * rsqrt;
    want_linear[c] = (bv[c] - m[c]) * scale + be[c];
    want_conv[c] = (bv[c] - m[c]) * rsqrt * g[c] + be[c];
  }
  Tensor w2, b2;
  kernels::fold_batch_norm(dbrq::randn({k, 8}, 36), b, st, &w2, &b2);
  EXPECT_EQ(b2.to_vector<float>(), want_linear);
  kernels::fold_batch_norm(dbrq::randn({k, 8, 3}, 37), b, st, &w2, &b2);
  EXPECT_EQ(b2.to_vector<float>(), want_conv);
  // The two orders do differ on these values: the test can tell them apart.
  EXPECT_NE(want_linear, want_conv);
}

// conv1d calibrates as PyTorch runs it: a conv2d over [N, C, 1, L].
TEST(TorchOrderKernels, Conv1dIsTheConv2dOverOneRow) {
  const Tensor x = dbrq::randn({3, 4, 11}, 41);
  const Tensor w = dbrq::randn({6, 2, 3}, 42);
  const Tensor b = dbrq::randn({6}, 43);
  dbrq::Conv1dParams p;
  p.stride = 2;
  p.padding = 1;
  p.groups = 2;
  const Tensor got = kernels::conv1d_torch_order(x, w, b, p);
  const Tensor want = kernels::conv2d_torch_order(x.reshape({3, 4, 1, 11}), w.reshape({6, 2, 1, 3}), b,
                                                  kernels::conv1d_as_conv2d(p));
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{3, 6, 6}));
  EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
  dbrq::testing::expect_close(got, kernels::conv1d(x, w, b, p), 1e-5, "vs eager conv1d");
}

}  // namespace
