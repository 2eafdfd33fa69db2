// Thread-local interception: two different prepared models calibrated at the same time on two
// std::threads end up with exactly the observer statistics they get when calibrated alone; a
// converted model called from several threads at once gives each thread the single-threaded result;
// one thread can calibrate a model while another runs a converted one.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;
using testing::observer_roots;

struct ConvModel : nn::CallableModule<ConvModel> {
  ConvModel() {
    conv1 = register_module("conv1", std::make_shared<Conv2d>(3, 6, 3, 1, 1));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(6));
    conv2 = register_module("conv2", std::make_shared<Conv2d>(6, 6, 3, 1, 1));
    testing::randomize_bn(*bn, 5);
  }
  Tensor forward(const Tensor& x) {
    Tensor y = relu((*bn)((*conv1)(x)));
    return (*conv2)(y) + y;
  }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn;
};

struct MlpBlock : nn::CallableModule<MlpBlock> {
  MlpBlock() {
    fc1 = register_module("fc1", std::make_shared<Linear>(16, 32));
    fc2 = register_module("fc2", std::make_shared<Linear>(32, 16));
  }
  Tensor forward(const Tensor& x) { return (*fc2)(relu((*fc1)(x))) + x; }
  std::shared_ptr<Linear> fc1, fc2;
};

struct MlpModel : nn::CallableModule<MlpModel> {
  MlpModel() {
    a = register_module("a", std::make_shared<MlpBlock>());
    b = register_module("b", std::make_shared<MlpBlock>());
  }
  Tensor forward(const Tensor& x) { return cat({(*b)((*a)(x)), x * 0.5}, 1); }
  std::shared_ptr<MlpBlock> a, b;
};

template <typename M>
std::shared_ptr<M> build(uint64_t seed) {
  manual_seed(seed);
  auto m = std::make_shared<M>();
  m->eval();
  return m;
}

std::vector<Tensor> conv_data(int n) {
  std::vector<Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(randn({2, 3, 8, 8}, 1000 + i) * (1.0 + 0.1 * i));
  return out;
}

std::vector<Tensor> mlp_data(int n) {
  std::vector<Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(randn({4, 16}, 2000 + i) * (0.5 + 0.2 * i));
  return out;
}

std::vector<Observer::Stats> all_stats(nn::Module& model) {
  ModelQuantState& m = model_quant_state(model);
  std::vector<Observer::Stats> out;
  for (int r : observer_roots(m)) out.push_back(m.slot(r).observer->stats());
  return out;
}

void expect_same(const std::vector<Observer::Stats>& a, const std::vector<Observer::Stats>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].num_batches, b[i].num_batches) << "observer " << i;
    ASSERT_EQ(a[i].fields.size(), b[i].fields.size());
    for (size_t f = 0; f < a[i].fields.size(); ++f) {
      EXPECT_EQ(a[i].fields[f].second, b[i].fields[f].second) << "observer " << i << " " << a[i].fields[f].first;
    }
  }
}

TEST(Threading, TwoModelsCalibratedConcurrentlyMatchCalibratedAlone) {
  const auto cdata = conv_data(12);
  const auto mdata = mlp_data(12);
  // Reference: each calibrated alone on this thread.
  auto conv_alone = build<ConvModel>(1);
  auto mlp_alone = build<MlpModel>(2);
  prepare(*conv_alone, {cdata[0]});
  prepare(*mlp_alone, {mdata[0]});
  for (const Tensor& x : cdata) (*conv_alone)(x);
  for (const Tensor& x : mdata) (*mlp_alone)(x);

  auto conv_mt = build<ConvModel>(1);
  auto mlp_mt = build<MlpModel>(2);
  prepare(*conv_mt, {cdata[0]});
  prepare(*mlp_mt, {mdata[0]});
  std::atomic<int> ready{0};
  std::atomic<bool> failed{false};
  auto run = [&](nn::Module* model, const std::vector<Tensor>* data) {
    ready.fetch_add(1);
    while (ready.load() < 2) std::this_thread::yield();  // start together
    try {
      for (const Tensor& x : *data) model->forward_tensors({x});
    } catch (...) {
      failed = true;
    }
  };
  std::thread t1(run, conv_mt.get(), &cdata);
  std::thread t2(run, mlp_mt.get(), &mdata);
  t1.join();
  t2.join();
  ASSERT_FALSE(failed.load());
  // Nothing was left installed on this thread.
  EXPECT_EQ(current_interceptor(), nullptr);
  expect_same(all_stats(*conv_mt), all_stats(*conv_alone));
  expect_same(all_stats(*mlp_mt), all_stats(*mlp_alone));
  for (int r : observer_roots(model_quant_state(*conv_mt))) {
    EXPECT_EQ(model_quant_state(*conv_mt).slot(r).observer->num_batches(), 12);
  }
}

TEST(Threading, ConvertedModelCalledFromSeveralThreads) {
  const auto cdata = conv_data(6);
  auto model = build<ConvModel>(3);
  prepare(*model, {cdata[0]});
  for (const Tensor& x : cdata) (*model)(x);
  convert(*model);
  std::vector<Tensor> expected;
  for (const Tensor& x : cdata) expected.push_back((*model)(x));
  std::vector<std::vector<Tensor>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) {
        for (const Tensor& x : cdata) got[t].push_back((*model)(x));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) {
    ASSERT_EQ(got[t].size(), 3 * cdata.size());
    for (size_t i = 0; i < got[t].size(); ++i) testing::expect_equal(got[t][i], expected[i % cdata.size()]);
  }
}

TEST(Threading, CalibrateOneModelWhileAnotherRunsConverted) {
  const auto cdata = conv_data(8);
  const auto mdata = mlp_data(8);
  auto converted = build<ConvModel>(4);
  prepare(*converted, {cdata[0]});
  for (const Tensor& x : cdata) (*converted)(x);
  convert(*converted);
  std::vector<Tensor> expected;
  for (const Tensor& x : cdata) expected.push_back((*converted)(x));

  auto alone = build<MlpModel>(5);
  prepare(*alone, {mdata[0]});
  for (const Tensor& x : mdata) (*alone)(x);
  auto calibrating = build<MlpModel>(5);
  prepare(*calibrating, {mdata[0]});

  std::vector<Tensor> got;
  std::thread t1([&] {
    for (int rep = 0; rep < 3; ++rep) {
      for (const Tensor& x : cdata) got.push_back((*converted)(x));
    }
  });
  std::thread t2([&] {
    for (const Tensor& x : mdata) (*calibrating)(x);
  });
  t1.join();
  t2.join();
  for (size_t i = 0; i < got.size(); ++i) testing::expect_equal(got[i], expected[i % cdata.size()]);
  expect_same(all_stats(*calibrating), all_stats(*alone));
}

}  // namespace
}  // namespace dbrq
