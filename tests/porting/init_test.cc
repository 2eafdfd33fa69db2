// nn::init against PyTorch's formulas: fans and gains, sample mean / std within statistical bounds
// (a 6-sigma band on 131072 samples), determinism per seed (manual_seed and an explicit Generator),
// and the typed errors for bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

namespace init = nn::init;

struct Stats {
  double mean, std, min, max;
};

Stats stats_of(const Tensor& t) {
  const std::vector<float> v = t.contiguous().to_vector<float>();
  double s = 0, s2 = 0, mn = v[0], mx = v[0];
  for (float x : v) {
    s += x;
    s2 += static_cast<double>(x) * x;
    mn = std::min<double>(mn, x);
    mx = std::max<double>(mx, x);
  }
  const double n = static_cast<double>(v.size());
  const double mean = s / n;
  return {mean, std::sqrt(s2 / n - mean * mean), mn, mx};
}

// The sample of N draws from a distribution with this std: mean within 6 std / sqrt(N), std within 2%.
void expect_distribution(const Tensor& t, double mean, double std) {
  const Stats st = stats_of(t);
  const double n = static_cast<double>(t.numel());
  EXPECT_NEAR(st.mean, mean, 6.0 * std / std::sqrt(n));
  EXPECT_NEAR(st.std, std, 0.02 * std);
}

TEST(Init, FansAndGainsArePyTorchs) {
  const Tensor conv_w = zeros({8, 4, 3, 5});
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(conv_w), (std::pair<int64_t, int64_t>{60, 120}));
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(zeros({10, 20})), (std::pair<int64_t, int64_t>{20, 10}));
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::kLinear), 1.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::kConv2d), 1.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::kSigmoid), 1.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::kTanh), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::kReLU), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::kLeakyReLU), std::sqrt(2.0 / (1.0 + 0.01 * 0.01)));
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::kLeakyReLU, 0.2), std::sqrt(2.0 / 1.04));
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::kSELU), 0.75);
}

TEST(Init, DistributionsFollowTheFormulas) {
  manual_seed(3);
  Tensor w = zeros({256, 128, 2, 2});  // fan_in 512, fan_out 1024, 131072 samples
  const double fan_in = 512, fan_out = 1024;

  init::uniform_(w, -2.0, 3.0);
  Stats st = stats_of(w);
  EXPECT_GE(st.min, -2.0);
  EXPECT_LT(st.max, 3.0);
  expect_distribution(w, 0.5, 5.0 / std::sqrt(12.0));

  init::normal_(w, 1.5, 0.25);
  expect_distribution(w, 1.5, 0.25);

  init::xavier_uniform_(w, 2.0);
  const double xa = 2.0 * std::sqrt(6.0 / (fan_in + fan_out));
  st = stats_of(w);
  EXPECT_GE(st.min, -xa);
  EXPECT_LE(st.max, xa);
  EXPECT_GT(st.max, 0.99 * xa);
  expect_distribution(w, 0.0, xa / std::sqrt(3.0));

  init::xavier_normal_(w);
  expect_distribution(w, 0.0, std::sqrt(2.0 / (fan_in + fan_out)));

  init::kaiming_uniform_(w, 0.0, init::kFanIn, init::kReLU);
  const double kb = std::sqrt(3.0) * std::sqrt(2.0) / std::sqrt(fan_in);
  st = stats_of(w);
  EXPECT_GE(st.min, -kb);
  EXPECT_LE(st.max, kb);
  expect_distribution(w, 0.0, kb / std::sqrt(3.0));

  init::kaiming_normal_(w, 0.0, init::kFanOut, init::kReLU);
  expect_distribution(w, 0.0, std::sqrt(2.0) / std::sqrt(fan_out));

  // PyTorch's defaults: a = 0 with leaky_relu, fan_in.
  init::kaiming_normal_(w);
  expect_distribution(w, 0.0, std::sqrt(2.0 / (1.0 + 0.0)) / std::sqrt(fan_in));

  init::constant_(w, 0.7);
  st = stats_of(w);
  EXPECT_EQ(st.min, 0.7f);
  EXPECT_EQ(st.max, 0.7f);
  init::ones_(w);
  EXPECT_EQ(stats_of(w).min, 1.0);
  init::zeros_(w);
  EXPECT_EQ(stats_of(w).max, 0.0);
}

TEST(Init, DeterministicPerSeedAndGenerator) {
  Tensor a = zeros({16, 8}), b = zeros({16, 8}), c = zeros({16, 8});
  manual_seed(42);
  init::xavier_uniform_(a);
  manual_seed(42);
  init::xavier_uniform_(b);
  testing::expect_equal(a, b);
  init::xavier_uniform_(c);  // the stream moved on
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());

  Generator g1(7), g2(7);
  manual_seed(1);
  init::kaiming_normal_(a, 0.0, init::kFanIn, init::kReLU, &g1);
  manual_seed(99);  // the explicit generator ignores the default stream
  init::kaiming_normal_(b, 0.0, init::kFanIn, init::kReLU, &g2);
  testing::expect_equal(a, b);
  Generator g3(8);
  init::kaiming_normal_(c, 0.0, init::kFanIn, init::kReLU, &g3);
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
}

TEST(Init, ChangesParametersOfLayers) {
  manual_seed(5);
  nn::Conv2dImpl conv(4, 8, 3);
  init::kaiming_normal_(conv.weight, 0.0, init::kFanOut, init::kReLU);
  init::zeros_(conv.bias);
  EXPECT_EQ(stats_of(conv.bias).max, 0.0);
  // The layer sees the new values: its output is the functional conv of them.
  const Tensor x = randn({1, 4, 5, 5}, 2);
  testing::expect_equal(conv(x), conv2d(x, conv.weight, Tensor(), conv.params()));
}

template <typename E, typename F>
void expect_error(F&& f, const std::string& msg) {
  try {
    f();
    FAIL() << "expected an error with " << msg;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
  }
}

// An empty interval fills with its bound, as PyTorch's (it threw from rand_uniform's low < high).
TEST(Init, AnEmptyUniformIntervalFillsWithItsBound) {
  Tensor w = zeros({3, 4});
  init::uniform_(w, 0.25, 0.25);
  EXPECT_EQ(w.to_vector<float>(), std::vector<float>(12, 0.25f));
  init::xavier_uniform_(w, 0.0);
  EXPECT_EQ(w.to_vector<float>(), std::vector<float>(12, 0.f));
}

TEST(Init, BadInputsThrowTypedErrors) {
  Tensor v = zeros({5});
  expect_error<ValueError>([&] { init::xavier_uniform_(v); },
                           "fan in and fan out can not be computed for a tensor with fewer than 2 dimensions (sizes [5])");
  expect_error<ValueError>([&] { init::kaiming_normal_(v); }, "fewer than 2 dimensions");
  Tensor w = zeros({4, 4});
  expect_error<ValueError>([&] { init::kaiming_uniform_(w, 0.0, init::kFanIn, "swish"); },
                           "calculate_gain: unsupported nonlinearity \"swish\"");
  expect_error<ValueError>([&] { init::kaiming_uniform_(w, 0.0, "fan_avg"); },
                           "kaiming_uniform_: mode must be \"fan_in\" or \"fan_out\", got \"fan_avg\"");
  expect_error<ValueError>([&] { init::uniform_(w, 1.0, 0.0); }, "uniform_: a (1) must be <= b (0)");
  expect_error<ValueError>([&] { init::normal_(w, 0.0, -1.0); }, "normal_: std must be >= 0, got -1");
  Tensor q = quantize_per_tensor(randn({4, 4}, 1), 0.1, 128, DType::kU8);
  expect_error<DTypeError>([&] { init::xavier_uniform_(q); }, "xavier_uniform_: cannot initialize a quantized tensor");
  expect_error<DTypeError>([&] { init::zeros_(q); }, "constant_: cannot initialize a quantized tensor");
  Tensor i = zeros({4, 4}, DType::kS64);
  expect_error<DTypeError>([&] { init::normal_(i); }, "normal_: expected an f32 tensor, got s64");
  Tensor undefined;
  expect_error<ValueError>([&] { init::ones_(undefined); }, "constant_: the tensor is undefined");
  // Nothing was written by a failed call.
  EXPECT_EQ(stats_of(w).max, 0.0);
}

}  // namespace
}  // namespace dbrq
