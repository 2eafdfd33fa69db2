// Tensor methods mirroring the functional API (x.mean({2, 3}), x.chunk(2, 1), x.relu(), ...): each
// equals its functional form, bad arguments raise typed errors, and a model written with methods
// (including the in-place relu_) quantizes exactly like the same model written with functions.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using testing::expect_equal;

TEST(TensorMethods, EqualTheFunctionalForms) {
  const Tensor x = randn({2, 3, 4, 5}, 1);
  const Tensor y = randn({2, 3, 4, 5}, 2);
  expect_equal(x.add(y), add(x, y));
  expect_equal(x.add(2.0), add(x, 2.0));
  expect_equal(x.sub(y), sub(x, y));
  expect_equal(x.sub(0.5), sub(x, 0.5));
  expect_equal(x.mul(y), mul(x, y));
  expect_equal(x.mul(3.0), mul(x, 3.0));
  expect_equal(x.div(y), div(x, y));
  expect_equal(x.div(4.0), div(x, 4.0));
  expect_equal(x.relu(), relu(x));
  expect_equal(x.sigmoid(), sigmoid(x));
  expect_equal(x.tanh(), tanh(x));
  expect_equal(x.clamp(-0.5, 0.5), clamp(x, -0.5, 0.5));
  expect_equal(x.softmax(1), softmax(x, 1));
  expect_equal(x.log_softmax(-1), log_softmax(x, -1));
  expect_equal(x.mean({2, 3}), mean(x, {2, 3}));
  expect_equal(x.mean({1}, true), mean(x, {1}, true));
  expect_equal(x.mean(), mean(x));
  expect_equal(x.sum({0}), sum(x, {0}));
  const Tensor a = randn({3, 4}, 3), b = randn({4, 6}, 4);
  expect_equal(a.matmul(b), matmul(a, b));
  EXPECT_EQ(x.dim(), 4);
  EXPECT_EQ(x.size(-1), 5);
  EXPECT_EQ(std::vector<int64_t>(x.sizes().begin(), x.sizes().end()), (std::vector<int64_t>{2, 3, 4, 5}));
}

TEST(TensorMethods, ChunkAndSplit) {
  const Tensor x = arange(0, 14).reshape({2, 7});
  std::vector<Tensor> c = x.chunk(3, 1);  // ceil(7 / 3) = 3: sizes 3, 3, 1
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].size(1), 3);
  EXPECT_EQ(c[2].size(1), 1);
  expect_equal(c[1], x.narrow(1, 3, 3));
  expect_equal(cat(c, 1), x);
  // As PyTorch: 7 into 6 chunks gives 4 pieces of 2, 2, 2, 1.
  EXPECT_EQ(x.chunk(6, 1).size(), 4u);
  EXPECT_EQ(x.chunk(2, 0).size(), 2u);
  // An empty dim: `chunks` empty pieces, as PyTorch's (it returned one).
  const std::vector<Tensor> e = zeros({0, 3}).chunk(3, 0);
  ASSERT_EQ(e.size(), 3u);
  for (const Tensor& t : e) EXPECT_EQ(t.sizes(), IntArrayRef(std::vector<int64_t>{0, 3}));
  EXPECT_EQ(zeros({0, 3}).split(1, 0).size(), 1u);  // split keeps PyTorch's one piece
  std::vector<Tensor> s = x.split(2, -1);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[3].size(1), 1);
  expect_equal(cat(s, 1), x);
  std::vector<Tensor> w = x.split({1, 4, 2}, 1);
  ASSERT_EQ(w.size(), 3u);
  expect_equal(w[1], x.narrow(1, 1, 4));
  expect_equal(x.split_with_sizes({5, 2}, 1)[1], x.narrow(1, 5, 2));
}

TEST(TensorMethods, BadArgumentsThrowTypedErrors) {
  const Tensor x = randn({2, 7}, 5);
  auto expect_msg = [](auto&& f, const std::string& msg) {
    try {
      f();
      FAIL() << "expected ValueError with " << msg;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { x.chunk(0, 1); }, "chunk: chunks must be >= 1, got 0");
  expect_msg([&] { x.split(0, 1); }, "split: split_size must be >= 1, got 0");
  expect_msg([&] { x.split({3, 3}, 1); }, "split: sizes add up to 6 but dim 1 has size 7");
  expect_msg([&] { x.split({8, -1}, 1); }, "split: sizes must be >= 0, got -1");
  EXPECT_THROW(x.chunk(2, 2), IndexError);
  EXPECT_THROW(x.mean({5}), IndexError);
  EXPECT_THROW(x.clamp(1.0, -1.0), ValueError);
  EXPECT_THROW(x.matmul(randn({3, 2}, 1)), ShapeError);
}

// A channel-split block written with methods and with functions: same records, same int8 results.
struct SplitBlock : nn::CallableModule<SplitBlock> {
  explicit SplitBlock(bool methods) : methods(methods) {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(4, 8, 3, 1, 1));
    branch = register_module("branch", std::make_shared<nn::Conv2dImpl>(4, 4, 1));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    if (methods) {
      std::vector<Tensor> halves = y.chunk(2, 1);
      Tensor b = (*branch)(halves[1]);
      b.relu_();
      return cat({halves[0], b}, 1).add(x.mean({1}, true)).mean({2, 3});
    }
    Tensor b = (*branch)(y.narrow(1, 4, 4));
    b.relu_();
    const Tensor c = cat({y.narrow(1, 0, 4), b}, 1);  // the order C++17 gives the method chain
    return mean(add(c, mean(x, {1}, true)), {2, 3});
  }
  bool methods;
  std::shared_ptr<nn::Conv2dImpl> conv, branch;
};

TEST(TensorMethods, QuantizeLikeTheFunctionalForms) {
  std::vector<Tensor> results;
  std::vector<std::vector<std::string>> kinds;
  for (bool methods : {false, true}) {
    manual_seed(9);
    SplitBlock m(methods);
    const Tensor x = randn({2, 4, 6, 6}, 6);
    const Tensor fp32 = m(x);
    prepare(m, {x});
    kinds.push_back(testing::display_kinds(testing::state_of(m)));
    testing::calibrate(m, {2, 4, 6, 6}, 4, 50);
    convert(m);
    results.push_back(m(x));
    EXPECT_GT(testing::sqnr_of(results.back(), fp32), 20.0);
  }
  EXPECT_EQ(kinds[0], kinds[1]);
  expect_equal(results[0], results[1], "methods vs functions");
}

}  // namespace
}  // namespace dbrq
