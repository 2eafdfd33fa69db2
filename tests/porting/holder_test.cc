// Module holders (DBRQ_MODULE), variadic Sequential, Functional and int pooling arguments: the
// libtorch spellings a port keeps. The prepare / convert cases check that both libtorch call
// spellings, `block(x)` and `block->forward(x)`, go through the module's hooked call: the block's
// own quantization state records its ops, and the int8 results are identical.
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
using testing::state_of;

struct BlockImpl : nn::CallableModule<BlockImpl> {
  BlockImpl(int64_t in, int64_t out) {
    conv = register_module("conv", std::make_shared<Conv2d>(in, out, 3, 1, 1));
  }
  Tensor forward(const Tensor& x) { return relu((*conv)(x)); }
  std::shared_ptr<Conv2d> conv;
  int calls = 0;
};
DBRQ_MODULE(Block);

struct CountingImpl : nn::CallableModule<CountingImpl> {
  CountingImpl() = default;
  Tensor forward(const Tensor& x) {
    ++calls;
    return x;
  }
  int calls = 0;
};
DBRQ_MODULE(Counting);

TEST(ModuleHolder, ConstructsCallsAndShares) {
  manual_seed(3);
  Block b(3, 4);
  ASSERT_FALSE(b.is_empty());
  EXPECT_TRUE(static_cast<bool>(b));
  EXPECT_EQ(b->conv->weight.size(0), 4);
  EXPECT_EQ((*b).conv.get(), b.get()->conv.get());
  EXPECT_EQ(b.ptr().get(), b.get());
  // Copies share the module, as libtorch's holders do.
  Block c = b;
  EXPECT_EQ(c.get(), b.get());
  const Tensor x = randn({1, 3, 5, 5}, 1);
  const Tensor y = b(x);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{1, 4, 5, 5}));
  testing::expect_equal(b->forward(x), y);
  testing::expect_equal(relu(conv2d(x, b->conv->weight, b->conv->bias, b->conv->params())), y);
  // The class name users see is their Impl's.
  EXPECT_EQ(b->type_name(), "BlockImpl");
  // A default-constructible Impl gives a default-constructed holder (as libtorch).
  Counting k;
  ASSERT_FALSE(k.is_empty());
  k(x);
  k->forward(x);
  EXPECT_EQ(k->calls, 2);
}

TEST(ModuleHolder, EmptyHolderThrowsUsageError) {
  Block b(nullptr);
  EXPECT_TRUE(b.is_empty());
  EXPECT_FALSE(static_cast<bool>(b));
  Block c = nullptr;
  EXPECT_TRUE(c.is_empty());
  const Tensor x = randn({1, 3, 5, 5}, 1);
  try {
    b(x);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("empty module holder of BlockImpl"), std::string::npos) << e.what();
  }
  EXPECT_THROW(b->forward(x), UsageError);
  EXPECT_THROW(b.ptr(), UsageError);
  nn::SequentialImpl s;
  EXPECT_THROW(s.push_back(b), UsageError);
}

struct NetImpl : nn::CallableModule<NetImpl> {
  explicit NetImpl(bool arrow) : arrow(arrow) {
    stem = register_module("stem", std::make_shared<Conv2d>(3, 4, 1));
    block = register_module("block", Block(4, 6));
  }
  Tensor forward(const Tensor& x) {
    const Tensor s = (*stem)(x);
    return arrow ? block->forward(s) : block(s);
  }
  bool arrow;
  std::shared_ptr<Conv2d> stem;
  Block block{nullptr};
};
DBRQ_MODULE(Net);

TEST(ModuleHolder, RegisterModuleReturnsTheHolder) {
  Net n(false);
  static_assert(std::is_same_v<decltype(n->block), Block>);
  EXPECT_EQ(n->child("block").get(), n->block.get());
  std::vector<std::string> names;
  for (auto& [name, p] : n->named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"stem.weight", "stem.bias", "block.conv.weight", "block.conv.bias"}));
}

// Both spellings are the hooked call: prepare records the block's conv and relu in the block's
// own state, and the converted models give identical int8 results.
TEST(ModuleHolder, ArrowForwardIsHookedUnderPrepareAndConvert) {
  std::vector<Tensor> results;
  for (bool arrow : {false, true}) {
    manual_seed(11);
    Net n(arrow);
    n->eval();
    const Tensor x = randn({2, 3, 8, 8}, 5);
    const Tensor fp32 = n(x);
    prepare(*n, {x});
    EXPECT_EQ(testing::seen_kinds(state_of(*n->block)), (std::vector<OpKind>{OpKind::kConv2d, OpKind::kRelu}))
        << "arrow=" << arrow;
    EXPECT_EQ(testing::seen_kinds(state_of(*n)), (std::vector<OpKind>{OpKind::kConv2d})) << "arrow=" << arrow;
    testing::calibrate(*n, {2, 3, 8, 8}, 4, 100);
    convert(*n);
    const Tensor y = n(x);
    EXPECT_FALSE(y.is_quantized());
    EXPECT_GT(testing::sqnr_of(y, fp32), 25.0) << "arrow=" << arrow;
    results.push_back(y);
  }
  testing::expect_equal(results[0], results[1], "holder(x) vs holder->forward(x)");
}

// A class derived from a user Impl is still refused (the holder's own wrapper is the one exception).
struct DerivedImpl : BlockImpl {
  DerivedImpl() : BlockImpl(3, 3) {}
  Tensor forward(const Tensor& x) { return x; }
};

TEST(ModuleHolder, ForeignSubclassStillRefused) {
  auto d = std::make_shared<DerivedImpl>();
  std::shared_ptr<BlockImpl> base = d;
  try {
    (*base)(randn({1, 3, 4, 4}, 1));
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("DerivedImpl derives from BlockImpl"), std::string::npos) << e.what();
  }
}

TEST(Sequential, VariadicWithPointersHoldersAndNames) {
  manual_seed(2);
  auto conv = std::make_shared<Conv2d>(3, 4, 1);
  Block block(4, 4);
  nn::SequentialImpl s(conv, std::make_shared<nn::ReLUImpl>(), block);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].get(), conv.get());
  EXPECT_EQ(s[2].get(), block.get());
  EXPECT_EQ(s.at<BlockImpl>(2).get(), block.get());
  EXPECT_EQ(s.named_children()[1].first, "1");
  const Tensor x = randn({1, 3, 4, 4}, 3);
  testing::expect_equal(s(x), block(relu((*conv)(x))));

  nn::SequentialImpl named(std::make_pair("conv", conv), std::make_pair(std::string("block"), block));
  EXPECT_EQ(named.named_children()[0].first, "conv");
  EXPECT_EQ(named.named_children()[1].first, "block");
  testing::expect_equal(named(x), block((*conv)(x)));
  // push_back takes holders too.
  named.push_back(Counting());
  named.push_back("last", Counting());
  EXPECT_EQ(named.size(), 4u);
  EXPECT_EQ(named.named_children()[2].first, "2");
  EXPECT_THROW(named[4], IndexError);
}

TEST(Functional, WrapsFunctionsWithBoundArguments) {
  const Tensor x = randn({1, 2, 6, 6}, 4);
  nn::FunctionalImpl r(dbrq::relu);
  testing::expect_equal(r(x), relu(x));
  nn::FunctionalImpl lr(dbrq::leaky_relu, 0.2);
  testing::expect_equal(lr(x), leaky_relu(x, 0.2));
  nn::FunctionalImpl ht(dbrq::hardtanh, -0.5, 0.5);
  testing::expect_equal(ht(x), hardtanh(x, -0.5, 0.5));
  nn::FunctionalImpl pool([](const Tensor& t) { return max_pool2d(t, 3, 2, 1); });
  EXPECT_EQ(pool(x).sizes(), (std::vector<int64_t>{1, 2, 3, 3}));
  EXPECT_EQ(r.type_name(), "Functional");
  EXPECT_FALSE(r.is_leaf());
  nn::SequentialImpl s(std::make_shared<nn::FunctionalImpl>(dbrq::relu),
                   std::make_shared<nn::FunctionalImpl>([](const Tensor& t) { return avg_pool2d(t, 2); }));
  testing::expect_equal(s(x), avg_pool2d(relu(x), {2, 2}));
}

TEST(Functional, EmptyFunctionThrowsValueError) {
  try {
    nn::FunctionalImpl f(nn::FunctionalImpl::Function{});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("Functional: the function is empty"), std::string::npos) << e.what();
  }
}

TEST(Pooling, IntArgumentsMatchArrays) {
  const Tensor x = randn({2, 3, 9, 9}, 6);
  testing::expect_equal(max_pool2d(x, 3, 2, 1), max_pool2d(x, {3, 3}, {2, 2}, {1, 1}));
  testing::expect_equal(max_pool2d(x, 2), max_pool2d(x, {2, 2}));
  testing::expect_equal(max_pool2d(x, 3, 2, 0, 1, true), max_pool2d(x, {3, 3}, {2, 2}, {0, 0}, {1, 1}, true));
  testing::expect_equal(avg_pool2d(x, 2), avg_pool2d(x, {2, 2}));
  testing::expect_equal(avg_pool2d(x, 3, 2, 1, false, false), avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, false, false));
  testing::expect_equal(adaptive_avg_pool2d(x, 1), adaptive_avg_pool2d(x, {1, 1}));
  EXPECT_EQ(max_pool2d(x, 3, 2, 1).sizes(), (std::vector<int64_t>{2, 3, 5, 5}));
  EXPECT_THROW(max_pool2d(x, 3, -1), ValueError);
  EXPECT_THROW(avg_pool2d(x, 0), ValueError);
}

}  // namespace
}  // namespace dbrq
