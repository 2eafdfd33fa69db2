// dbrq::nn::functional (libtorch's torch::nn::functional, `namespace F = ...`) and the layer options
// added with it: each F:: function gives the bytes of the op of runtime/ops.h called with the
// options spelled out, a model written with F:: records, fuses and converts exactly like the same
// model written with the plain ops, and options dbrq cannot honour raise ValueError naming them.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

namespace F = dbrq::nn::functional;
using testing::expect_equal;

template <typename E, typename Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    FAIL() << "expected an error containing: " << needle;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

const Tensor& x4() {
  static const Tensor x = randn({2, 4, 9, 10}, 31);
  return x;
}
const Tensor& x3() {
  static const Tensor x = randn({2, 4, 17}, 32);
  return x;
}

TEST(Functional, ActivationsAreTheOps) {
  const Tensor& x = x4();
  expect_equal(F::relu(x), relu(x));
  expect_equal(F::relu6(x * 4.0), relu6(x * 4.0));
  expect_equal(F::hardtanh(x, F::HardtanhFuncOptions().min_val(-0.5).max_val(0.25)), hardtanh(x, -0.5, 0.25));
  expect_equal(F::leaky_relu(x, F::LeakyReLUFuncOptions().negative_slope(0.2)), leaky_relu(x, 0.2));
  expect_equal(F::elu(x, F::ELUFuncOptions().alpha(0.5)), elu(x, 0.5));
  expect_equal(F::gelu(x, F::GELUFuncOptions().approximate("tanh")), gelu(x, "tanh"));
  expect_equal(F::gelu(x), gelu(x, "none"));
  expect_equal(F::silu(x), silu(x));
  expect_equal(F::mish(x), mish(x));
  expect_equal(F::hardswish(x), hardswish(x));
  expect_equal(F::softplus(x, F::SoftplusFuncOptions().beta(2.0).threshold(5.0)), softplus(x, 2.0, 5.0));
  const Tensor w = full({4}, 0.1);
  expect_equal(F::prelu(x, w), prelu(x, w));
  expect_equal(F::softmax(x, F::SoftmaxFuncOptions(1)), softmax(x, 1));
  expect_equal(F::log_softmax(x, F::LogSoftmaxFuncOptions(-1)), log_softmax(x, -1));
}

TEST(Functional, InPlaceUpdatesTheCallersTensorLikeLibtorch) {
  Tensor a = x4().clone();
  const Tensor r = F::relu(a, F::ReLUFuncOptions().inplace(true));
  expect_equal(a, relu(x4()));
  expect_equal(r, relu(x4()));
  Tensor b = x4().clone() * 4.0;
  F::relu6(b, F::ReLU6FuncOptions(true));
  expect_equal(b, relu6(x4() * 4.0));
  Tensor c = x4().clone();
  F::hardtanh(c, F::HardtanhFuncOptions().min_val(-0.5).max_val(0.5).inplace(true));
  expect_equal(c, hardtanh(x4(), -0.5, 0.5));
  // Out of place leaves the argument alone.
  Tensor d = x4().clone();
  F::relu(d);
  expect_equal(d, x4());
}

TEST(Functional, InPlaceFormsWithoutAnInPlaceOpAreRefused) {
  Tensor x = x4().clone();
  expect_error<ValueError>([&] { F::leaky_relu(x, F::LeakyReLUFuncOptions().inplace(true)); },
                           "F::leaky_relu: inplace(true) is not supported");
  expect_error<ValueError>([&] { F::elu(x, F::ELUFuncOptions().inplace(true)); }, "F::elu: inplace(true)");
  expect_error<ValueError>([&] { F::dropout(x, F::DropoutFuncOptions().inplace(true)); }, "F::dropout: inplace(true)");
  const Tensor& k = x4();
  expect_error<ValueError>([&] { F::relu(k, F::ReLUFuncOptions(true)); }, "F::relu: inplace(true) on a const tensor");
  expect_error<ValueError>([&] { F::relu6(k, F::ReLU6FuncOptions(true)); }, "F::relu6: inplace(true) on a const");
  expect_error<ValueError>([&] { F::hardtanh(k, F::HardtanhFuncOptions().inplace(true)); }, "F::hardtanh: inplace");
  expect_equal(x, x4());  // nothing was written
}

TEST(Functional, PoolingAreTheOps) {
  const Tensor& x = x4();
  expect_equal(F::max_pool2d(x, F::MaxPool2dFuncOptions(3).stride(2).padding(1).ceil_mode(true)),
               max_pool2d(x, {3, 3}, {2, 2}, {1, 1}, {1, 1}, true));
  expect_equal(F::max_pool2d(x, F::MaxPool2dFuncOptions(2)), max_pool2d(x, {2, 2}, {2, 2}));
  expect_equal(F::avg_pool2d(x, F::AvgPool2dFuncOptions(3).stride(1).padding(1).count_include_pad(false)),
               avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}, false, false));
  expect_equal(F::adaptive_avg_pool2d(x, F::AdaptiveAvgPool2dFuncOptions({2, 3})), adaptive_avg_pool2d(x, {2, 3}));
  const Tensor& y = x3();
  expect_equal(F::max_pool1d(y, F::MaxPool1dFuncOptions(3).stride(2).padding(1)), max_pool1d(y, 3, 2, 1));
  expect_equal(F::max_pool1d(y, F::MaxPool1dFuncOptions(4)), max_pool1d(y, 4, 4));
  expect_equal(F::avg_pool1d(y, F::AvgPool1dFuncOptions(3).stride(1).ceil_mode(true)), avg_pool1d(y, 3, 1, 0, true));
  expect_equal(F::adaptive_avg_pool1d(y, F::AdaptiveAvgPool1dFuncOptions(5)), adaptive_avg_pool1d(y, 5));
}

TEST(Functional, NormalizationsAreTheOps) {
  const Tensor& x = x4();
  const Tensor mean = randn({4}, 1), var = rand_uniform({4}, 0.5, 1.5, 2), w = randn({4}, 3), b = randn({4}, 4);
  expect_equal(F::batch_norm(x, mean, var, F::BatchNormFuncOptions().weight(w).bias(b).eps(1e-3)),
               batch_norm(x, mean, var, w, b, 1e-3));
  expect_equal(F::batch_norm(x, mean, var), batch_norm(x, mean, var));
  const Tensor lw = randn({10}, 5), lb = randn({10}, 6);
  expect_equal(F::layer_norm(x, F::LayerNormFuncOptions({10}).weight(lw).bias(lb).eps(1e-6)),
               layer_norm(x, {10}, lw, lb, 1e-6));
  expect_equal(F::group_norm(x, F::GroupNormFuncOptions(2).weight(w).bias(b)), group_norm(x, 2, w, b));
  expect_equal(F::instance_norm(x, F::InstanceNormFuncOptions().weight(w).bias(b).eps(1e-4)),
               instance_norm(x, w, b, 1e-4));
  // Running statistics instead of the input's: a batch norm, as PyTorch computes it.
  expect_equal(F::instance_norm(x, F::InstanceNormFuncOptions().running_mean(mean).running_var(var).use_input_stats(false)),
               batch_norm(x, mean, var));
}

TEST(Functional, NormalizationOptionsDbrqCannotHonourAreRefused) {
  const Tensor mean = zeros({4}), var = full({4}, 1.0);
  expect_error<ValueError>([&] { F::batch_norm(x4(), mean, var, F::BatchNormFuncOptions().training(true)); },
                           "F::batch_norm: training(true) is not supported");
  expect_error<ValueError>([&] { F::instance_norm(x4(), F::InstanceNormFuncOptions().use_input_stats(false)); },
                           "F::instance_norm: use_input_stats(false) needs running_mean and running_var");
}

TEST(Functional, ConvolutionsAreTheOps) {
  const Tensor& x = x4();
  const Tensor w = randn({6, 2, 3, 3}, 7), b = randn({6}, 8);
  expect_equal(F::conv2d(x, w, F::Conv2dFuncOptions().bias(b).stride(2).padding({1, 0}).dilation(1).groups(2)),
               conv2d(x, w, b, Conv2dParams{{2, 2}, {1, 0}, {1, 1}, 2}));
  const Tensor w1 = randn({6, 4, 3, 3}, 9);
  expect_equal(F::conv2d(x, w1), conv2d(x, w1));
  const Tensor wt = randn({4, 3, 3, 3}, 10), bt = randn({3}, 11);
  expect_equal(F::conv_transpose2d(x, wt, F::ConvTranspose2dFuncOptions().bias(bt).stride(2).padding(1).output_padding(1)),
               conv_transpose2d(x, wt, bt, ConvTranspose2dParams{{2, 2}, {1, 1}, {1, 1}, {1, 1}, 1}));
  const Tensor wc = randn({5, 4, 3}, 12), bc = randn({5}, 13);
  expect_equal(F::conv1d(x3(), wc, F::Conv1dFuncOptions().bias(bc).stride(2).padding(1)),
               conv1d(x3(), wc, bc, Conv1dParams{2, 1, 1, 1}));
  const Tensor wl = randn({3, 10}, 14), bl = randn({3}, 15);
  expect_equal(F::linear(x, wl, bl), linear(x, wl, bl));
  expect_error<ValueError>([&] { F::Conv2dFuncOptions().stride({1, 2, 3}); }, "expected 1 or 2 values");
}

TEST(Functional, InterpolateAndPadAreTheOps) {
  const Tensor& x = x4();
  expect_equal(F::interpolate(x, F::InterpolateFuncOptions()
                                     .size(std::vector<int64_t>({18, 15}))
                                     .mode(kBilinear)
                                     .align_corners(false)),
               interpolate(x, std::array<int64_t, 2>{18, 15}, std::nullopt, "bilinear", false));
  expect_equal(F::interpolate(x, F::InterpolateFuncOptions().scale_factor(std::vector<double>({2.0})).mode(kNearest)),
               interpolate(x, std::nullopt, std::array<double, 2>{2.0, 2.0}, "nearest"));
  expect_equal(F::interpolate(x, F::InterpolateFuncOptions().scale_factor(std::vector<double>({2.0, 1.5})).mode(kBilinear)
                                     .align_corners(true).recompute_scale_factor(false)),
               interpolate(x, std::nullopt, std::array<double, 2>{2.0, 1.5}, "bilinear", true));
  expect_equal(F::pad(x, F::PadFuncOptions({1, 2, 3, 0}).mode(kReflect)), pad(x, {1, 2, 3, 0}, PadMode::kReflect));
  expect_equal(F::pad(x, F::PadFuncOptions({1, 1, 1, 1}).mode(kReplicate)), pad(x, {1, 1, 1, 1}, PadMode::kReplicate));
  expect_equal(F::pad(x, F::PadFuncOptions({1, 1}).value(0.5)), pad(x, {1, 1}, PadMode::kConstant, 0.5));
  expect_equal(F::pad(x, F::PadFuncOptions({2, 0}).mode(kConstant)), pad(x, {2, 0}));
}

TEST(Functional, InterpolateOptionsDbrqCannotHonourAreRefused) {
  const Tensor& x = x4();
  expect_error<ValueError>(
      [&] { F::interpolate(x, F::InterpolateFuncOptions().scale_factor(std::vector<double>({2.0})).recompute_scale_factor(true)); },
      "F::interpolate: recompute_scale_factor(true) is not supported");
  expect_error<ValueError>(
      [&] { F::interpolate(x, F::InterpolateFuncOptions().size(std::vector<int64_t>({4, 4})).mode(kBilinear).antialias(true)); },
      "F::interpolate: antialias(true) is not supported");
  expect_error<ValueError>([&] { F::interpolate(x, F::InterpolateFuncOptions().size(std::vector<int64_t>({4, 4, 4}))); },
                           "F::interpolate: size must have 1 value or 2");
  // The op's own checks: neither size nor scale_factor, an unknown mode.
  EXPECT_THROW(F::interpolate(x), ValueError);
  EXPECT_THROW(F::pad(x, F::PadFuncOptions({1, 1}).mode("circular")), ValueError);
}

TEST(Functional, DropoutFollowsLibtorchsTrainingDefault) {
  const Tensor& x = x4();
  // libtorch's F::dropout defaults to training(true): elements are zeroed.
  const Tensor t = F::dropout(x, F::DropoutFuncOptions().p(0.5));
  int zeros_seen = 0;
  for (float v : t.contiguous().to_vector<float>()) zeros_seen += v == 0.0f;
  EXPECT_GT(zeros_seen, 0);
  expect_equal(F::dropout(x, F::DropoutFuncOptions().p(0.5).training(false)), x);
}

TEST(LayerOptions, OneDPoolsNormsPReLUSoftplusUpsample) {
  const Tensor& y = x3();
  expect_equal(nn::MaxPool1dImpl(nn::MaxPool1dOptions(3).stride(2).padding(1).dilation(2).ceil_mode(true))(y),
               nn::MaxPool1dImpl(3, 2, 1, 2, true)(y));
  expect_equal(nn::AvgPool1dImpl(nn::AvgPool1dOptions(3).padding(1).count_include_pad(false))(y),
               nn::AvgPool1dImpl(3, 0, 1, false, false)(y));
  expect_equal(nn::AdaptiveAvgPool1dImpl(nn::AdaptiveAvgPool1dOptions(4))(y), nn::AdaptiveAvgPool1dImpl(4)(y));
  EXPECT_EQ(nn::MaxPool1dImpl(nn::MaxPool1dOptions(3)).extra_repr(), nn::MaxPool1dImpl(3).extra_repr());

  const Tensor& x = x4();
  nn::GroupNormImpl gn(nn::GroupNormOptions(2, 4).eps(1e-3).affine(false));
  EXPECT_FALSE(gn.weight.defined());
  expect_equal(gn(x), nn::GroupNormImpl(2, 4, 1e-3, false)(x));
  EXPECT_EQ(gn.extra_repr(), "2, 4, eps=0.001, affine=False");
  nn::InstanceNorm2dImpl in(nn::InstanceNorm2dOptions(4).eps(1e-4).affine(true));
  EXPECT_TRUE(in.weight.defined());
  EXPECT_FALSE(in.running_mean.defined());
  expect_equal(in(x), nn::InstanceNorm2dImpl(4, 1e-4, 0.1, true)(x));
  nn::InstanceNorm2dImpl tracked(nn::InstanceNormOptions(4).track_running_stats(true));
  EXPECT_TRUE(tracked.running_var.defined());

  nn::PReLUImpl pr(nn::PReLUOptions().num_parameters(4).init(0.1));
  EXPECT_EQ(pr.num_parameters(), 4);
  expect_equal(pr(x), prelu(x, full({4}, 0.1)));
  expect_equal(nn::SoftplusImpl(nn::SoftplusOptions().beta(2.0).threshold(3.0))(x), softplus(x, 2.0, 3.0));
  // Holders take the options too.
  nn::PReLU holder(nn::PReLUOptions().num_parameters(4));
  EXPECT_EQ(holder->weight.sizes(), (std::vector<int64_t>{4}));

  // Upsample with libtorch's vector forms and mode constants.
  nn::UpsampleImpl up(nn::UpsampleOptions().scale_factor(std::vector<double>({2, 2})).mode(kBilinear).align_corners(false));
  expect_equal(up(x), interpolate(x, std::nullopt, std::array<double, 2>{2.0, 2.0}, "bilinear", false));
  EXPECT_EQ(up.extra_repr(), "scale_factor=(2.0, 2.0), mode='bilinear'");
  nn::UpsampleImpl up_size(nn::UpsampleOptions().size(std::vector<int64_t>({5, 7})).mode(kNearest));
  expect_equal(up_size(x), interpolate(x, std::array<int64_t, 2>{5, 7}));
  EXPECT_EQ(nn::UpsampleImpl(nn::UpsampleOptions().size(std::vector<int64_t>({6}))).extra_repr(), "size=6, mode='nearest'");
  EXPECT_EQ(nn::UpsampleImpl(nn::UpsampleOptions().scale_factor({2.0, 3.0})).extra_repr(),
            "scale_factor=(2.0, 3.0), mode='nearest'");
  try {
    nn::UpsampleOptions().scale_factor(std::vector<double>({2, 2, 2}));
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("Upsample: scale_factor must have 1 value or 2 (one per spatial dim), got 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(nn::UpsampleOptions().size(std::vector<int64_t>{}), ValueError);

  EXPECT_THROW(nn::GroupNormImpl(nn::GroupNormOptions(3, 4)), ValueError);
  EXPECT_THROW(nn::PReLUImpl(nn::PReLUOptions().num_parameters(0)), ValueError);
  EXPECT_THROW(nn::AdaptiveAvgPool1dImpl(nn::AdaptiveAvgPool1dOptions(0)), ValueError);
  EXPECT_THROW(nn::InstanceNorm2dImpl(nn::InstanceNorm2dOptions(0)), ValueError);
}

// The same block written with F:: and with the plain ops: recorded, fused and converted alike.
struct BlockImpl : nn::Module {
  explicit BlockImpl(bool functional) : functional_(functional) {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(4, 8, 3).padding(1)));
    bn = register_module("bn", nn::BatchNorm2d(8));
    fc = register_module("fc", nn::Linear(8, 5));
  }
  Tensor forward(const Tensor& x) {
    if (functional_) {
      Tensor y = F::relu(bn(conv(x)));
      y = F::max_pool2d(y, F::MaxPool2dFuncOptions(2));
      y = F::interpolate(y, F::InterpolateFuncOptions().scale_factor(std::vector<double>({2.0})).mode(kNearest));
      y = F::pad(y, F::PadFuncOptions({1, 1, 1, 1}));
      y = F::adaptive_avg_pool2d(y, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
      return F::linear(y, fc->weight, fc->bias);
    }
    Tensor y = relu(bn(conv(x)));
    y = max_pool2d(y, 2);
    y = interpolate(y, std::nullopt, std::array<double, 2>{2.0, 2.0}, "nearest");
    y = pad(y, {1, 1, 1, 1});
    y = adaptive_avg_pool2d(y, 1).flatten(1);
    return linear(y, fc->weight, fc->bias);
  }
  bool functional_;
  nn::Conv2d conv{nullptr};
  nn::BatchNorm2d bn{nullptr};
  nn::Linear fc{nullptr};
};
DBRQ_MODULE(Block);

TEST(Functional, AModelWrittenWithFIsQuantizedLikeThePlainOps) {
  std::vector<Tensor> outputs;
  std::vector<std::vector<std::string>> kinds;
  const std::vector<int64_t> sizes = {2, 4, 12, 12};
  const Tensor x = randn(sizes, 40);
  for (bool functional : {true, false}) {
    manual_seed(3);
    Block net(functional);
    net->eval();
    testing::randomize_bn(*net->bn, 4);
    prepare(*net, {x});
    kinds.push_back(testing::display_kinds(testing::state_of(*net)));
    testing::calibrate(*net, sizes, 4, 50);
    convert(*net);
    outputs.push_back(net(x));
    int int8_ops = 0;
    for (const QuantizedOpInfo& op : quantized_ops(*net)) int8_ops += !op.input_dtypes.empty() && op.input_dtypes[0] == DType::kU8;
    EXPECT_GE(int8_ops, 2) << "functional=" << functional;
  }
  EXPECT_EQ(kinds[0], kinds[1]);
  EXPECT_EQ(kinds[0].front(), "conv2d+batch_norm+relu");
  expect_equal(outputs[0], outputs[1]);
}

}  // namespace
}  // namespace dbrq
