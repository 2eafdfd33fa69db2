// Options objects of the layers (libtorch's LinearOptions, BatchNorm2dOptions, MaxPool2dOptions, ...):
// each builds the layer its positional arguments build (same parameters, same outputs), defaults
// are PyTorch's, and options dbrq cannot honour are refused with a typed error.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using testing::expect_equal;

const Tensor& input4d() {
  static const Tensor x = randn({2, 3, 9, 9}, 21);
  return x;
}

TEST(Options, Linear) {
  manual_seed(1);
  nn::LinearImpl a(nn::LinearOptions(6, 4).bias(false));
  EXPECT_FALSE(a.bias.defined());
  EXPECT_EQ(a.weight.sizes(), (std::vector<int64_t>{4, 6}));
  manual_seed(1);
  nn::LinearImpl b(nn::LinearOptions(6, 4));
  EXPECT_TRUE(b.bias.defined());
  EXPECT_EQ(b.extra_repr(), "in_features=6, out_features=4, bias=True");
  EXPECT_THROW(nn::LinearImpl(nn::LinearOptions(-1, 4)), ValueError);
}

TEST(Options, BatchNorm) {
  nn::BatchNorm2dOptions o(3);
  EXPECT_EQ(o.eps(), 1e-5);
  EXPECT_EQ(o.momentum(), 0.1);
  EXPECT_TRUE(o.affine());
  EXPECT_TRUE(o.track_running_stats());
  nn::BatchNorm2dImpl bn(nn::BatchNorm2dOptions(3).eps(1e-3).momentum(0.01));
  EXPECT_EQ(bn.eps(), 1e-3);
  EXPECT_EQ(bn.num_features(), 3);
  EXPECT_TRUE(bn.weight.defined());
  nn::BatchNorm2dImpl plain(3, 1e-3);
  bn.eval();
  plain.eval();
  expect_equal(bn(input4d()), plain(input4d()));
  nn::BatchNorm1dImpl bn1(nn::BatchNorm1dOptions(5).affine(false));
  EXPECT_FALSE(bn1.weight.defined());
  EXPECT_EQ(bn1.type_name(), "BatchNorm1d");
  try {
    nn::BatchNorm2dImpl bad(nn::BatchNorm2dOptions(3).track_running_stats(false));
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("BatchNorm2d: track_running_stats(false) is not supported"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(nn::BatchNorm1dImpl(nn::BatchNorm1dOptions(0)), ValueError);
}

// A new module is in training mode, as in libtorch, where a batch norm would use the batch's
// statistics: dbrq's ran the running ones silently; it now throws until eval().
TEST(Options, BatchNormRefusesTrainingMode) {
  nn::BatchNorm2d bn(3);
  EXPECT_TRUE(bn->is_training());
  EXPECT_THROW_MSG(bn(input4d()), UsageError,
                   "BatchNorm2d called in training mode (a new module's default, as in libtorch), where PyTorch "
                   "normalizes with the batch's statistics; dbrq normalizes with the running statistics only "
                   "(inference): call eval() on the model before running it");
  bn->eval();
  EXPECT_NO_THROW(bn(input4d()));
  // InstanceNorm2d with running statistics: each instance's own in training mode (as PyTorch),
  // the running ones in eval mode.
  nn::InstanceNorm2d tracked(nn::InstanceNorm2dOptions(3).track_running_stats(true));
  tracked->running_mean.fill_(5.0);
  tracked->running_var.fill_(9.0);
  expect_equal(tracked(input4d()), instance_norm(input4d()));
  tracked->eval();
  expect_equal(tracked(input4d()), batch_norm(input4d(), tracked->running_mean, tracked->running_var));
}

TEST(Options, Pooling) {
  const Tensor& x = input4d();
  nn::MaxPool2dImpl mp(nn::MaxPool2dOptions(3).stride(2).padding(1).ceil_mode(true));
  expect_equal(mp(x), max_pool2d(x, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true));
  EXPECT_EQ(mp.extra_repr(), nn::MaxPool2dImpl(3, 2, 1, 1, true).extra_repr());
  nn::MaxPool2dImpl mp_default(nn::MaxPool2dOptions(2));
  EXPECT_EQ(mp_default.params().stride, (std::array<int64_t, 2>{2, 2}));
  nn::MaxPool2dImpl dil(nn::MaxPool2dOptions(2).dilation(2));
  expect_equal(dil(x), max_pool2d(x, {2, 2}, {}, {0, 0}, {2, 2}));
  nn::AvgPool2dImpl ap(nn::AvgPool2dOptions(3).stride(2).padding(1).count_include_pad(false));
  expect_equal(ap(x), avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, false, false));
  nn::AdaptiveAvgPool2dImpl aap(nn::AdaptiveAvgPool2dOptions({2, 3}));
  EXPECT_EQ(aap(x).sizes(), (std::vector<int64_t>{2, 3, 2, 3}));
  nn::AdaptiveAvgPool2dImpl aap1(nn::AdaptiveAvgPool2dOptions(1));
  expect_equal(aap1(x), adaptive_avg_pool2d(x, {1, 1}));
  EXPECT_THROW(nn::MaxPool2dImpl(nn::MaxPool2dOptions(0)), ValueError);
  EXPECT_THROW(nn::AvgPool2dImpl(nn::AvgPool2dOptions(2).stride(-1)), ValueError);
}

TEST(Options, NormEmbeddingDropout) {
  const Tensor x = randn({2, 4, 6}, 3);
  nn::LayerNormImpl ln(nn::LayerNormOptions({6}).eps(1e-3).elementwise_affine(false));
  EXPECT_FALSE(ln.weight.defined());
  expect_equal(ln(x), nn::LayerNormImpl(6, 1e-3, false)(x));
  EXPECT_THROW(nn::LayerNormImpl(nn::LayerNormOptions({})), ValueError);
  nn::EmbeddingImpl emb(nn::EmbeddingOptions(10, 3));
  EXPECT_EQ(emb.weight.sizes(), (std::vector<int64_t>{10, 3}));
  EXPECT_THROW(nn::EmbeddingImpl(nn::EmbeddingOptions(0, 3)), ValueError);
  nn::DropoutImpl d(nn::DropoutOptions().p(0.2));
  EXPECT_EQ(d.extra_repr(), "p=0.2");
  nn::DropoutImpl d2(nn::DropoutOptions(0.3));
  EXPECT_EQ(d2.extra_repr(), "p=0.3");
  EXPECT_THROW(nn::DropoutImpl(nn::DropoutOptions(1.5)), ValueError);
}

TEST(Options, Activations) {
  const Tensor x = randn({3, 5}, 8);
  expect_equal(nn::LeakyReLUImpl(nn::LeakyReLUOptions().negative_slope(0.2))(x), leaky_relu(x, 0.2));
  expect_equal(nn::LeakyReLUImpl(nn::LeakyReLUOptions())(x), leaky_relu(x, 0.01));
  expect_equal(nn::ELUImpl(nn::ELUOptions().alpha(0.5))(x), elu(x, 0.5));
  expect_equal(nn::HardtanhImpl(nn::HardtanhOptions().min_val(-0.5).max_val(0.25))(x), hardtanh(x, -0.5, 0.25));
  expect_equal(nn::SoftmaxImpl(nn::SoftmaxOptions(0))(x), softmax(x, 0));
  expect_equal(nn::GELUImpl(nn::GELUOptions().approximate("tanh"))(x), gelu(x, "tanh"));
  const Tensor y = randn({2, 3, 4, 5}, 9);
  EXPECT_EQ(nn::FlattenImpl(nn::FlattenOptions())(y).sizes(), (std::vector<int64_t>{2, 60}));
  EXPECT_EQ(nn::FlattenImpl(nn::FlattenOptions().start_dim(2))(y).sizes(), (std::vector<int64_t>{2, 3, 20}));
  EXPECT_EQ(nn::FlattenImpl(nn::FlattenOptions().start_dim(0).end_dim(1))(y).sizes(), (std::vector<int64_t>{6, 4, 5}));
  EXPECT_THROW(nn::GELUImpl(nn::GELUOptions().approximate("cubic"))(x), ValueError);
  EXPECT_THROW(nn::SoftmaxImpl(nn::SoftmaxOptions(2))(x), IndexError);
}

}  // namespace
}  // namespace dbrq
