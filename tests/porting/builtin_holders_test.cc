// Holders of the built-in modules (issue 12): nn::Conv2d, nn::Sequential, ... are libtorch-shaped
// holders of nn::Conv2dImpl, nn::SequentialImpl, ... The cases check libtorch's spellings
// (`nn::Conv2d conv{nullptr}`, `register_module("conv", nn::Conv2d(opts))`, `conv(x)`,
// `conv->forward(x)`, `conv->weight`, `nn::Sequential(a, b, c)`, `seq->push_back`, `seq[i]`,
// `m->as<nn::Conv2d>()`, `modules()`), that both call spellings are the hooked call (same records,
// same layer attribution, per-layer qconfigs apply), that copying a holder shares its module, that
// set_object_type<Holder> names the modules' type, and the misuses' typed errors.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

// Written as libtorch's C++ frontend writes a block: holder members, options, register_module.
struct ConvBlockImpl : nn::CallableModule<ConvBlockImpl> {
  ConvBlockImpl(int64_t in, int64_t out, bool arrow) : arrow(arrow) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1).bias(false)));
    bn1 = register_module("bn1", nn::BatchNorm2d(out));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1)));
  }
  Tensor forward(const Tensor& x) {
    if (arrow) return relu(conv2->forward(relu(bn1->forward(conv1->forward(x)))));
    return relu(conv2(relu(bn1(conv1(x)))));
  }
  nn::Conv2d conv1{nullptr};
  nn::BatchNorm2d bn1{nullptr};
  nn::Conv2d conv2{nullptr};
  bool arrow;
};
DBRQ_MODULE(ConvBlock);

TEST(BuiltinHolders, ConvHolderMembersAndCalls) {
  manual_seed(1);
  nn::Conv2d conv{nullptr};
  EXPECT_TRUE(conv.is_empty());
  conv = nn::Conv2d(nn::Conv2dOptions(3, 8, 3).stride(2).bias(false));
  ASSERT_FALSE(conv.is_empty());
  EXPECT_EQ(conv->weight.sizes(), (std::vector<int64_t>{8, 3, 3, 3}));
  EXPECT_FALSE(conv->bias.defined());
  EXPECT_EQ(conv->options().stride(), (nn::Int2{2, 2}));
  EXPECT_EQ(conv->type_name(), "Conv2d");
  EXPECT_TRUE(conv->is_leaf());
  const Tensor x = randn({2, 3, 9, 9}, 2);
  const Tensor reference = conv2d(x, conv->weight, Tensor(), conv->params());
  testing::expect_equal(conv(x), reference);
  testing::expect_equal(conv->forward(x), reference);
  testing::expect_equal((*conv)(x), reference);
  // The module class is reachable as in libtorch: ptr(), get(), and the Impl spelling.
  std::shared_ptr<nn::Conv2dImpl> impl = conv.ptr();
  EXPECT_EQ(impl.get(), conv.get());
  // Positional arguments, and layers without options.
  nn::Linear fc(4, 3);
  EXPECT_EQ(fc->weight.sizes(), (std::vector<int64_t>{3, 4}));
  testing::expect_equal(fc(randn({2, 4}, 3)), linear(randn({2, 4}, 3), fc->weight, fc->bias));
  nn::ReLU r;
  testing::expect_equal(r(x), relu(x));
  nn::LeakyReLU lr(nn::LeakyReLUOptions().negative_slope(0.2));
  testing::expect_equal(lr->forward(x), leaky_relu(x, 0.2));
  nn::BatchNorm2d bn(nn::BatchNorm2dOptions(3).eps(1e-3));
  EXPECT_DOUBLE_EQ(bn->eps(), 1e-3);
}

struct Passthrough : nn::CallableModule<Passthrough> {
  Tensor forward(const Tensor& x) { return x; }
};

TEST(BuiltinHolders, EmptyHolderUseThrowsUsageError) {
  nn::Conv2d c{nullptr};
  const Tensor x = randn({1, 3, 4, 4}, 1);
  for (const std::string& what : {error_of<UsageError>([&] { c(x); }), error_of<UsageError>([&] { c->forward(x); }),
                                  error_of<UsageError>([&] { (void)c->weight; })}) {
    EXPECT_NE(what.find("an empty module holder of Conv2dImpl (made from nullptr) was used"), std::string::npos)
        << what;
  }
  nn::Sequential s = nullptr;
  EXPECT_NE(error_of<UsageError>([&] { s[0]; }).find("empty module holder of SequentialImpl"), std::string::npos);
  // Registering an empty holder is refused with the same error, not registered as null.
  Passthrough net;
  EXPECT_NE(error_of<UsageError>([&] { net.register_module("c", c); }).find("empty module holder of Conv2dImpl"),
            std::string::npos);
  EXPECT_TRUE(net.named_children().empty());
}

// Both call spellings of a built-in holder are the layer's hooked call: the same ops recorded under
// the layer's own name, the same int8 result.
TEST(BuiltinHolders, ArrowForwardIsTheHookedCall) {
  std::vector<Tensor> results;
  std::vector<std::vector<std::string>> ops;
  for (bool arrow : {false, true}) {
    manual_seed(7);
    ConvBlock block(3, 8, arrow);
    block->eval();
    testing::randomize_bn(*block->bn1, 11);
    const Tensor x = randn({2, 3, 8, 8}, 3);
    prepare(*block, {x});
    testing::calibrate(*block, {2, 3, 8, 8}, 4, 300);
    convert(*block);
    results.push_back(block(x));
    ops.emplace_back();
    for (const QuantizedOpInfo& op : quantized_ops(*block)) ops.back().push_back(op.fqn + ":" + op.op + ":" + op.role);
  }
  testing::expect_equal(results[0], results[1], "conv(x) vs conv->forward(x)");
  EXPECT_EQ(ops[0], ops[1]);
  // Attributed to the layers themselves (a direct call would record them under the block, "").
  std::vector<std::string> convs;
  for (const std::string& op : ops[1]) {
    if (op.find(":conv2d") != std::string::npos) convs.push_back(op.substr(0, op.rfind(':')));
  }
  EXPECT_EQ(convs, (std::vector<std::string>{"conv1:conv2d+batch_norm+relu", "conv2:conv2d+relu"}));
}

// A qconfig set for one layer by name applies when the layer is called as layer->forward(x):
// conv2 (qconfig None) is left out of quantization exactly as when called as conv2(x). (With a raw
// std::shared_ptr<Conv2dImpl>, ->forward is a direct call and prepare refuses this mapping:
// fire_port_test BuiltinArrowForwardIsReported.)
TEST(BuiltinHolders, PerLayerQConfigAppliesThroughArrowForward) {
  std::vector<Tensor> results;
  for (bool arrow : {false, true}) {
    manual_seed(7);
    ConvBlock block(3, 8, arrow);
    block->eval();
    QConfigMapping mapping = default_qconfig_mapping("onednn");
    mapping.set_module_name("conv2", nullptr);
    const Tensor x = randn({2, 3, 8, 8}, 3);
    prepare(*block, {x}, mapping);
    testing::calibrate(*block, {2, 3, 8, 8}, 4, 300);
    convert(*block);
    std::vector<std::string> convs;
    for (const QuantizedOpInfo& op : quantized_ops(*block)) {
      if (op.kind == OpKind::kConv2d) convs.push_back(op.fqn + ":" + op.role);
    }
    ASSERT_EQ(convs.size(), 1u) << "arrow " << arrow;
    EXPECT_EQ(convs[0], "conv1:weighted") << "arrow " << arrow;
    results.push_back(block(x));
  }
  testing::expect_equal(results[0], results[1], "conv2(x) vs conv2->forward(x)");
}

TEST(BuiltinHolders, SequentialHolder) {
  manual_seed(4);
  nn::Conv2d conv(nn::Conv2dOptions(3, 4, 1));
  nn::Sequential seq(conv, nn::ReLU(), nn::Functional(dbrq::leaky_relu, 0.1));
  EXPECT_EQ(seq->size(), 3u);
  EXPECT_FALSE(seq->is_empty());
  EXPECT_EQ(seq[0].get(), conv.get());
  EXPECT_EQ(seq->ptr(0).get(), conv.get());
  EXPECT_EQ(seq->at<nn::Conv2d>(0).get(), conv.get());
  EXPECT_EQ(seq->ptr<nn::Conv2dImpl>(0).get(), conv.get());
  EXPECT_EQ(seq->at<nn::Conv2d>(0)->weight.sizes(), conv->weight.sizes());
  const Tensor x = randn({1, 3, 5, 5}, 5);
  const Tensor expected = leaky_relu(relu(conv(x)), 0.1);
  testing::expect_equal(seq(x), expected);
  testing::expect_equal(seq->forward(x), expected);
  seq->push_back(nn::Flatten());
  seq->push_back("head", nn::Linear(4 * 5 * 5, 2));
  EXPECT_EQ(seq->size(), 5u);
  EXPECT_EQ(seq->named_children()[4].first, "head");
  EXPECT_EQ(seq(x).sizes(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(seq->type_name(), "Sequential");
  // A child of another class: ValueError naming both.
  const std::string what = error_of<ValueError>([&] { seq->at<nn::Conv2d>(1); });
  EXPECT_NE(what.find("Sequential::at(1): child is a ReLU, not a Conv2d"), std::string::npos) << what;
  nn::Sequential empty;
  EXPECT_TRUE(empty->is_empty());
}

// Copying a holder shares the module. The constructing constructor must not take a holder of its
// own class: Sequential and Functional accept a module as an argument, so `nn::Sequential b(a)`
// would otherwise build a new Sequential around a.
TEST(BuiltinHolders, CopyingAHolderSharesTheModule) {
  nn::Sequential a{nn::ReLU(), nn::Identity()};
  nn::Sequential b(a);
  EXPECT_EQ(b.get(), a.get());
  const nn::Sequential& ca = a;
  nn::Sequential c(ca);
  EXPECT_EQ(c.get(), a.get());
  nn::Sequential d(std::move(c));
  EXPECT_EQ(d.get(), a.get());
  nn::Functional f(dbrq::relu);
  nn::Functional g(f);
  EXPECT_EQ(g.get(), f.get());
  // A Sequential of one Sequential is still spelled out: a pointer or a named pair.
  nn::Sequential outer(std::make_pair("inner", a));
  EXPECT_NE(outer.get(), a.get());
  EXPECT_EQ(outer[0].get(), a.get());
}

TEST(BuiltinHolders, ModuleListAndDict) {
  nn::ModuleList list;
  list->push_back(nn::Linear(4, 4));
  list->push_back(nn::ReLU());
  EXPECT_EQ(list->size(), 2u);
  EXPECT_NE(list->at<nn::Linear>(0), nullptr);
  EXPECT_EQ(list[1].get(), list->ptr(1).get());
  int n = 0;
  for (const auto& m : *list) n += m->as<nn::Linear>() != nullptr;
  EXPECT_EQ(n, 1);
  EXPECT_NE(error_of<ValueError>([&] { list->at<nn::Linear>(1); }).find("ModuleList::at(1): child is a ReLU, not a Linear"),
            std::string::npos);
  nn::ModuleDict dict;
  dict->insert("fc", nn::Linear(2, 2));
  EXPECT_TRUE(dict->contains("fc"));
  EXPECT_EQ(dict["fc"]->type_name(), "Linear");
}

TEST(BuiltinHolders, AsAndModules) {
  manual_seed(2);
  ConvBlock block(3, 4, false);
  std::vector<std::string> types;
  int convs = 0;
  // libtorch's initialization loop.
  for (auto& m : block->modules(/*include_self=*/false)) {
    types.push_back(m->type_name());
    if (auto* conv = m->as<nn::Conv2d>()) {
      nn::init::constant_(conv->weight, 0.5);
      ++convs;
    } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
      nn::init::constant_(bn->weight, 2.0);
    }
    EXPECT_EQ(m->as<nn::ReLU>(), nullptr);
  }
  EXPECT_EQ(types, (std::vector<std::string>{"Conv2d", "BatchNorm2d", "Conv2d"}));
  EXPECT_EQ(convs, 2);
  EXPECT_FLOAT_EQ(block->conv2->weight.to_vector<float>()[0], 0.5f);
  EXPECT_FLOAT_EQ(block->bn1->weight.to_vector<float>()[0], 2.0f);
  auto all = block->modules();
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].get(), block.get());
  EXPECT_EQ(all[0]->as<ConvBlock>(), block.get());
  EXPECT_EQ(all[0]->as<ConvBlockImpl>(), block.get());
  EXPECT_EQ(all[1].get(), block->conv1.get());
}

TEST(BuiltinHolders, RecurrentHolders) {
  manual_seed(6);
  nn::LSTM lstm(nn::LSTMOptions(4, 6).batch_first(true));
  const Tensor x = randn({2, 3, 4}, 6);
  auto [out, state] = lstm(x);
  auto [out2, state2] = lstm->forward(x);
  testing::expect_equal(out, out2);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3, 6}));
  nn::GRU gru(4, 5);
  auto [g, h] = gru->forward(x);
  EXPECT_EQ(g.sizes(), (std::vector<int64_t>{2, 3, 5}));
}

// set_object_type by class names the modules' type_name(): a holder, its Impl, or a user holder.
// Before, a class whose name differs from its type_name (a user holder Fire of FireImpl) matched
// nothing, silently.
TEST(BuiltinHolders, TypeNamesOfHoldersAndImpls) {
  EXPECT_EQ(nn::detail::module_type_name<nn::Conv2d>(), "Conv2d");
  EXPECT_EQ(nn::detail::module_type_name<nn::Conv2dImpl>(), "Conv2d");
  EXPECT_EQ(nn::detail::module_type_name<ConvBlock>(), "ConvBlockImpl");
  EXPECT_EQ(nn::detail::module_type_name<ConvBlockImpl>(), "ConvBlockImpl");
  manual_seed(1);
  const std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>> made = {
      {nn::detail::module_type_name<nn::Conv2d>(), nn::Conv2d(1, 1, 1).ptr()},
      {nn::detail::module_type_name<nn::Linear>(), nn::Linear(1, 1).ptr()},
      {nn::detail::module_type_name<nn::BatchNorm2d>(), nn::BatchNorm2d(1).ptr()},
      {nn::detail::module_type_name<nn::BatchNorm1d>(), nn::BatchNorm1d(1).ptr()},
      {nn::detail::module_type_name<nn::LayerNorm>(), nn::LayerNorm(2).ptr()},
      {nn::detail::module_type_name<nn::Embedding>(), nn::Embedding(2, 2).ptr()},
      {nn::detail::module_type_name<nn::ReLU>(), nn::ReLU().ptr()},
      {nn::detail::module_type_name<nn::ReLU6>(), nn::ReLU6().ptr()},
      {nn::detail::module_type_name<nn::Hardtanh>(), nn::Hardtanh().ptr()},
      {nn::detail::module_type_name<nn::LeakyReLU>(), nn::LeakyReLU().ptr()},
      {nn::detail::module_type_name<nn::ELU>(), nn::ELU().ptr()},
      {nn::detail::module_type_name<nn::PReLU>(), nn::PReLU().ptr()},
      {nn::detail::module_type_name<nn::Softplus>(), nn::Softplus().ptr()},
      {nn::detail::module_type_name<nn::Mish>(), nn::Mish().ptr()},
      {nn::detail::module_type_name<nn::Hardswish>(), nn::Hardswish().ptr()},
      {nn::detail::module_type_name<nn::Hardsigmoid>(), nn::Hardsigmoid().ptr()},
      {nn::detail::module_type_name<nn::Sigmoid>(), nn::Sigmoid().ptr()},
      {nn::detail::module_type_name<nn::Tanh>(), nn::Tanh().ptr()},
      {nn::detail::module_type_name<nn::GELU>(), nn::GELU().ptr()},
      {nn::detail::module_type_name<nn::SiLU>(), nn::SiLU().ptr()},
      {nn::detail::module_type_name<nn::Softmax>(), nn::Softmax(1).ptr()},
      {nn::detail::module_type_name<nn::MaxPool2d>(), nn::MaxPool2d(2).ptr()},
      {nn::detail::module_type_name<nn::AvgPool2d>(), nn::AvgPool2d(2).ptr()},
      {nn::detail::module_type_name<nn::AdaptiveAvgPool2d>(), nn::AdaptiveAvgPool2d(1).ptr()},
      {nn::detail::module_type_name<nn::ConvTranspose2d>(), nn::ConvTranspose2d(nn::ConvTranspose2dOptions(1, 1, 2)).ptr()},
      {nn::detail::module_type_name<nn::Conv1d>(), nn::Conv1d(nn::Conv1dOptions(1, 1, 2)).ptr()},
      {nn::detail::module_type_name<nn::MaxPool1d>(), nn::MaxPool1d(2).ptr()},
      {nn::detail::module_type_name<nn::AvgPool1d>(), nn::AvgPool1d(2).ptr()},
      {nn::detail::module_type_name<nn::AdaptiveAvgPool1d>(), nn::AdaptiveAvgPool1d(1).ptr()},
      {nn::detail::module_type_name<nn::Upsample>(), nn::Upsample(nn::UpsampleOptions().scale_factor(2.0)).ptr()},
      {nn::detail::module_type_name<nn::GroupNorm>(), nn::GroupNorm(1, 2).ptr()},
      {nn::detail::module_type_name<nn::InstanceNorm2d>(), nn::InstanceNorm2d(2).ptr()},
      {nn::detail::module_type_name<nn::Flatten>(), nn::Flatten().ptr()},
      {nn::detail::module_type_name<nn::Dropout>(), nn::Dropout().ptr()},
      {nn::detail::module_type_name<nn::Identity>(), nn::Identity().ptr()},
      {nn::detail::module_type_name<nn::LSTM>(), nn::LSTM(2, 2).ptr()},
      {nn::detail::module_type_name<nn::GRU>(), nn::GRU(2, 2).ptr()},
      {nn::detail::module_type_name<nn::Sequential>(), nn::Sequential().ptr()},
      {nn::detail::module_type_name<nn::Functional>(), nn::Functional(dbrq::relu).ptr()},
      {nn::detail::module_type_name<nn::ModuleList>(), nn::ModuleList().ptr()},
      {nn::detail::module_type_name<nn::ModuleDict>(), nn::ModuleDict().ptr()},
  };
  for (const auto& [name, module] : made) EXPECT_EQ(name, module->type_name());
}

TEST(BuiltinHolders, SetObjectTypeByHolderApplies) {
  // A user holder and its Impl both name "ConvBlockImpl", the modules' type_name().
  for (bool holder : {true, false}) {
    QConfigMapping mapping = default_qconfig_mapping("onednn");
    if (holder) {
      mapping.set_object_type<ConvBlock>(nullptr);
    } else {
      mapping.set_object_type<ConvBlockImpl>(nullptr);
    }
    EXPECT_EQ(mapping.for_module("ConvBlockImpl", "block"), nullptr) << mapping.to_string();
    EXPECT_NE(mapping.for_module("Conv2d", "block.conv1"), nullptr);
  }
  // Built-in holders and Impls name the layer type: the convs run fp32.
  for (int spelling = 0; spelling < 2; ++spelling) {
    manual_seed(7);
    ConvBlock block(3, 8, false);
    block->eval();
    QConfigMapping mapping = default_qconfig_mapping("onednn");
    if (spelling == 0) mapping.set_object_type<nn::Conv2d>(nullptr);
    if (spelling == 1) mapping.set_object_type<nn::Conv2dImpl>(nullptr);
    prepare(*block, {randn({2, 3, 8, 8}, 3)}, mapping);
    testing::calibrate(*block, {2, 3, 8, 8}, 2, 300);
    convert(*block);
    for (const QuantizedOpInfo& op : quantized_ops(*block)) {
      if (op.kind == OpKind::kConv2d) EXPECT_EQ(op.role, "fp32") << "spelling " << spelling << ": " << op.fqn;
    }
  }
}

// A subclass of a layer with its own forward: the layer's call operator cannot run it, so calling
// it is an error (registering it does not compile: tests/compile_fail/layer_subclass.cc).
struct DoublingConv : nn::Conv2dImpl {
  DoublingConv() : Conv2dImpl(3, 3, 1) {}
  Tensor forward(const Tensor& x) { return Conv2dImpl::forward(x) * 2.0; }
};

TEST(BuiltinHolders, LayerSubclassCallThrowsUsageError) {
  auto d = std::make_shared<DoublingConv>();
  const std::string what = error_of<UsageError>([&] { (*d)(randn({1, 3, 2, 2}, 1)); });
  EXPECT_NE(what.find("module class DoublingConv derives from Conv2dImpl"), std::string::npos) << what;
  std::shared_ptr<nn::Module> as_module = d;
  EXPECT_THROW(as_module->forward_unary(randn({1, 3, 2, 2}, 1)), UsageError);
}

}  // namespace
}  // namespace dbrq

namespace dbrq {
namespace {

// libtorch's own spelling of a user module: derived from nn::Module itself, with a holder. The
// holder makes it callable (HookedModule), so that `block(x)` and `block->forward(x)` are both the
// hooked call.
struct PlainBlockImpl : nn::Module {
  explicit PlainBlockImpl(int64_t features) : fc(nn::LinearOptions(features, features)) {
    register_module("fc", fc);
  }
  Tensor forward(Tensor x) {
    ++calls;
    return relu(fc(x));
  }
  nn::Linear fc;
  int calls = 0;
};
DBRQ_MODULE(PlainBlock);

// A plain module without forward (a container) needs no holder.
struct PlainBag : nn::Module {};

TEST(PlainModuleHolders, CallableThroughTheHolder) {
  manual_seed(8);
  PlainBlock block(4);
  EXPECT_EQ(block->type_name(), "PlainBlockImpl");
  EXPECT_EQ(block->type(), std::type_index(typeid(PlainBlockImpl)));
  EXPECT_EQ(nn::detail::module_type_name<PlainBlock>(), "PlainBlockImpl");
  const Tensor x = randn({3, 4}, 8);
  const Tensor expected = relu(linear(x, block->fc->weight, block->fc->bias));
  testing::expect_equal(block(x), expected);
  testing::expect_equal(block->forward(x), expected);
  EXPECT_EQ(block->calls, 2);
  // In a Sequential (forward_unary) and as the model prepare drives (forward_tensors).
  nn::Sequential seq(block, nn::ReLU());
  testing::expect_equal(seq(x), expected);
  ASSERT_EQ(block->forward_tensors({x}).size(), 1u);
  EXPECT_THROW(block->forward_tensors({x, x}), ValueError);
  // A registered plain module without a holder is named after its class.
  auto bag = std::make_shared<PlainBag>();
  Passthrough owner;
  owner.register_module("bag", bag);
  EXPECT_EQ(bag->type_name(), "PlainBag");
}

struct PlainParentImpl : nn::CallableModule<PlainParentImpl> {
  PlainParentImpl() { block = register_module("block", PlainBlock(4)); }
  Tensor forward(const Tensor& x) { return block->forward(x); }
  PlainBlock block{nullptr};
};

// block->forward(x) inside a parent is the block's hooked call: its linear is recorded in the
// block's own state (a direct call would record it in the parent's, module "").
TEST(PlainModuleHolders, ArrowForwardIsHookedUnderPrepareAndConvert) {
  manual_seed(8);
  auto parent = std::make_shared<PlainParentImpl>();
  parent->eval();
  const Tensor x = randn({3, 4}, 8);
  const Tensor reference = (*parent)(x);
  prepare(*parent, {x});
  testing::calibrate(*parent, {3, 4}, 4, 300);
  convert(*parent);
  std::vector<std::string> linears;
  for (const QuantizedOpInfo& op : quantized_ops(*parent)) {
    if (op.kind == OpKind::kLinear) linears.push_back(op.fqn + " in \"" + op.module + "\" " + op.module_type);
  }
  EXPECT_EQ(linears, (std::vector<std::string>{"block.fc in \"block\" PlainBlockImpl"}));
  EXPECT_GT(testing::sqnr_of((*parent)(x), reference), 20.0);
}

}  // namespace
}  // namespace dbrq
