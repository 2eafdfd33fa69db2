// Fusion discovery and the observers it implies, checked through SeenOpInfo::fusion and the
// observer slots, then converted and compared with fp32: conv+bn+relu at the top level and inside a
// Sequential; a loop calling the same conv and relu twice (two fused chains); add->relu (one
// observer, on the relu output); the conv+bn+add+relu residual chain of a ResNet basic block.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;
using ReLU = nn::ReLUImpl;
using Sequential = nn::SequentialImpl;
using testing::display_kinds;
using testing::observer_roots;
using testing::randomize_bn;
using testing::seen_kinds;
using testing::sqnr_of;
using testing::state_of;

constexpr double kMinSqnrDb = 25.0;
using K = OpKind;

// Checks that ops[base..base+pattern.size()) form one chain named `name`.
void expect_chain(const AutoQuantizationState& s, int base, const std::vector<OpKind>& pattern,
                  const std::string& name) {
  SCOPED_TRACE("chain at " + std::to_string(base) + " in \"" + s.fqn() + "\"");
  ASSERT_LE(base + pattern.size(), s.seen_ops().size());
  for (size_t p = 0; p < pattern.size(); ++p) {
    const SeenOpInfo& op = s.seen_ops()[base + p];
    EXPECT_EQ(op.kind, pattern[p]);
    EXPECT_TRUE(op.fusion.fused());
    EXPECT_EQ(op.fusion.base, base);
    EXPECT_EQ(op.fusion.position, static_cast<int>(p));
    EXPECT_EQ(op.fusion.pattern, pattern);
    EXPECT_EQ(op.fusion.name(), name);
  }
  EXPECT_EQ(s.seen_ops()[base].display_kind(), name);
}

// Only the chain's last op observes its output; inner ops observe nothing at their outputs.
void expect_chain_output_observed_once(ModelQuantState& m, const AutoQuantizationState& s, int base, size_t len) {
  const int last = base + static_cast<int>(len) - 1;
  for (int i = base; i < last; ++i) EXPECT_EQ(s.seen_ops()[i].output_observer, -1) << "op " << i;
  const SeenOpInfo& tail = s.seen_ops()[last];
  ASSERT_GE(tail.output_observer, 0);
  EXPECT_EQ(m.slot(tail.output_observer).tensor_id, tail.outputs[0].id);
  // Every member's output is the chain's u8 result, with the chain's parameters.
  for (int i = base; i <= last; ++i) {
    EXPECT_EQ(s.seen_ops()[i].outputs[0].inf_dtype, DType::kU8);
    EXPECT_EQ(m.find(m.tensor(s.seen_ops()[i].outputs[0].id)->slot), m.find(tail.output_observer)) << "op " << i;
  }
}

template <typename M>
void calibrate_convert_compare(M& model, const std::vector<Tensor>& inputs, const std::vector<Tensor>& refs) {
  for (const Tensor& x : inputs) model(x);
  convert(model);
  for (size_t i = 0; i < inputs.size(); ++i) EXPECT_GT(sqnr_of(model(inputs[i]), refs[i]), kMinSqnrDb) << i;
}

// ---------------------------------------------------------------------------------------------

struct ConvBnRelu : nn::CallableModule<ConvBnRelu> {
  ConvBnRelu() {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 8, 3, 1, 1, 1, 1, false));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(8));
    relu = register_module("relu", std::make_shared<ReLU>());
    randomize_bn(*bn, 3);
  }
  Tensor forward(const Tensor& x) { return (*relu)((*bn)((*conv)(x))); }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<ReLU> relu;
};

TEST(Fusion, ConvBnReluTopLevel) {
  manual_seed(1);
  auto model = std::make_shared<ConvBnRelu>();
  model->eval();
  const auto inputs = testing::random_batches(3, 100, {2, 3, 8, 8});
  std::vector<Tensor> refs;
  for (const Tensor& x : inputs) refs.push_back((*model)(x));
  prepare(*model, {inputs[0]});
  AutoQuantizationState& s = state_of(*model);
  ASSERT_EQ(seen_kinds(s), (std::vector<OpKind>{K::kConv2d, K::kBatchNorm, K::kRelu}));
  expect_chain(s, 0, {K::kConv2d, K::kBatchNorm, K::kRelu}, "conv2d+batch_norm+relu");
  EXPECT_EQ(display_kinds(s), std::vector<std::string>{"conv2d+batch_norm+relu"});
  EXPECT_EQ(s.seen_ops()[1].fqn, "bn");
  EXPECT_EQ(s.seen_ops()[2].fqn, "relu");
  ModelQuantState& m = model_quant_state(*model);
  expect_chain_output_observed_once(m, s, 0, 3);
  EXPECT_GE(s.seen_ops()[0].input_observers[0], 0);
  EXPECT_EQ(s.seen_ops()[1].input_observers, std::vector<int>{-1});
  EXPECT_EQ(s.seen_ops()[2].input_observers, std::vector<int>{-1});
  EXPECT_EQ(observer_roots(m).size(), 2u);  // input, chain output
  calibrate_convert_compare(*model, inputs, refs);
  EXPECT_NE(s.seen_ops()[0].executor->describe().find("int8 conv2d"), std::string::npos)
      << s.seen_ops()[0].executor->describe();
  EXPECT_NE(s.seen_ops()[1].executor->describe().find("fused into conv2d+batch_norm+relu"), std::string::npos);
}

struct SeqModel : nn::CallableModule<SeqModel> {
  SeqModel() {
    auto bn = std::make_shared<BatchNorm2d>(8);
    randomize_bn(*bn, 9);
    body = register_module("body", std::make_shared<Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                                       std::make_shared<Conv2d>(3, 8, 3, 1, 1), bn, std::make_shared<ReLU>(),
                                       std::make_shared<Conv2d>(8, 4, 1)}));
  }
  Tensor forward(const Tensor& x) { return (*body)(x); }
  std::shared_ptr<Sequential> body;
};

TEST(Fusion, ConvBnReluInsideSequential) {
  manual_seed(2);
  auto model = std::make_shared<SeqModel>();
  model->eval();
  const auto inputs = testing::random_batches(3, 110, {2, 3, 8, 8});
  std::vector<Tensor> refs;
  for (const Tensor& x : inputs) refs.push_back((*model)(x));
  prepare(*model, {inputs[0]});
  // The Sequential owns the ops of its layers; the root records none.
  EXPECT_TRUE(state_of(*model).seen_ops().empty());
  AutoQuantizationState& s = state_of(*model->body);
  EXPECT_EQ(s.fqn(), "body");
  ASSERT_EQ(seen_kinds(s), (std::vector<OpKind>{K::kConv2d, K::kBatchNorm, K::kRelu, K::kConv2d}));
  expect_chain(s, 0, {K::kConv2d, K::kBatchNorm, K::kRelu}, "conv2d+batch_norm+relu");
  EXPECT_FALSE(s.seen_ops()[3].fusion.fused());
  EXPECT_EQ(s.seen_ops()[0].fqn, "body.0");
  EXPECT_EQ(s.seen_ops()[3].fqn, "body.3");
  EXPECT_EQ(display_kinds(s), (std::vector<std::string>{"conv2d+batch_norm+relu", "conv2d"}));
  ModelQuantState& m = model_quant_state(*model);
  expect_chain_output_observed_once(m, s, 0, 3);
  EXPECT_EQ(s.seen_ops()[3].input_observers, std::vector<int>{-1});  // already u8
  EXPECT_EQ(observer_roots(m).size(), 3u);
  calibrate_convert_compare(*model, inputs, refs);
}

// The same conv and relu modules called twice in a loop: two fused seen ops.
struct LoopModel : nn::CallableModule<LoopModel> {
  LoopModel() {
    conv = register_module("conv", std::make_shared<Conv2d>(4, 4, 3, 1, 1));
    relu = register_module("relu", std::make_shared<ReLU>());
  }
  Tensor forward(Tensor x) {
    for (int i = 0; i < 2; ++i) x = (*relu)((*conv)(x));
    return x;
  }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<ReLU> relu;
};

// A loop folds: the conv's first iteration (input: the module's input) is one record, every later
// iteration (input: the relu's output) another, and the relu after both is one record that both
// convs fuse with (the conv's output feeds nothing else on any iteration).
TEST(Fusion, LoopCallingTheSameConvTwice) {
  manual_seed(3);
  auto model = std::make_shared<LoopModel>();
  model->eval();
  const auto inputs = testing::random_batches(3, 120, {2, 4, 8, 8});
  std::vector<Tensor> refs;
  for (const Tensor& x : inputs) refs.push_back((*model)(x));
  prepare(*model, {inputs[0]});
  AutoQuantizationState& s = state_of(*model);
  ASSERT_EQ(seen_kinds(s), (std::vector<OpKind>{K::kConv2d, K::kRelu, K::kConv2d}));
  EXPECT_EQ(s.seen_ops()[0].leaf, model->conv.get());
  EXPECT_EQ(s.seen_ops()[2].leaf, model->conv.get());
  EXPECT_EQ(s.seen_ops()[1].leaf, model->relu.get());
  // One relu record, reached from both convs.
  EXPECT_EQ(s.seen_ops()[1].inputs[0].num_origins(), 2u);
  EXPECT_EQ(display_kinds(s), (std::vector<std::string>{"conv2d+relu", "conv2d+relu"}));
  EXPECT_EQ(s.seen_ops()[0].fusion.members, (std::vector<int>{0, 1}));
  EXPECT_EQ(s.seen_ops()[2].fusion.members, (std::vector<int>{2, 1}));
  EXPECT_EQ(s.seen_ops()[1].fusion.position, 1);
  ModelQuantState& m = model_quant_state(*model);
  // Both chains produce the relu's output: one observer, fed at the relu.
  ASSERT_GE(s.seen_ops()[1].output_observer, 0);
  EXPECT_EQ(s.seen_ops()[0].output_observer, -1);
  EXPECT_EQ(s.seen_ops()[2].output_observer, -1);
  EXPECT_EQ(m.find(m.tensor(s.seen_ops()[0].outputs[0].id)->slot), m.find(s.seen_ops()[1].output_observer));
  // The second conv's input is the relu's u8 output: no observer of its own.
  EXPECT_EQ(s.seen_ops()[2].input_observers, std::vector<int>{-1});
  EXPECT_EQ(observer_roots(m).size(), 2u);  // the model input, the relu output
  calibrate_convert_compare(*model, inputs, refs);
}

// ---------------------------------------------------------------------------------------------

struct AddRelu : nn::CallableModule<AddRelu> {
  Tensor forward(const Tensor& a, const Tensor& b) { return relu(a + b); }
};

TEST(Fusion, AddReluHasOneObserverOnTheReluOutput) {
  auto model = std::make_shared<AddRelu>();
  model->eval();
  std::vector<std::pair<Tensor, Tensor>> inputs;
  std::vector<Tensor> refs;
  for (int i = 0; i < 3; ++i) {
    inputs.emplace_back(randn({2, 3, 4, 4}, 130 + i), randn({2, 3, 4, 4}, 140 + i) * 0.5);
    refs.push_back((*model)(inputs[i].first, inputs[i].second));
  }
  prepare(*model, {inputs[0].first, inputs[0].second});
  AutoQuantizationState& s = state_of(*model);
  ASSERT_EQ(seen_kinds(s), (std::vector<OpKind>{K::kAdd, K::kRelu}));
  expect_chain(s, 0, {K::kAdd, K::kRelu}, "add+relu");
  const SeenOpInfo& add = s.seen_ops()[0];
  const SeenOpInfo& rl = s.seen_ops()[1];
  EXPECT_EQ(add.output_observer, -1);  // nothing on the add output
  ASSERT_GE(rl.output_observer, 0);
  ModelQuantState& m = model_quant_state(*model);
  EXPECT_EQ(m.slot(rl.output_observer).tensor_id, rl.outputs[0].id);
  // Output observers: exactly one, at the relu. The other two observe the model inputs.
  int output_observers = 0;
  for (const SeenOpInfo& op : s.seen_ops()) output_observers += op.output_observer >= 0;
  EXPECT_EQ(output_observers, 1);
  EXPECT_GE(add.input_observers[0], 0);
  EXPECT_GE(add.input_observers[1], 0);
  EXPECT_EQ(observer_roots(m).size(), 3u);
  for (size_t i = 0; i < inputs.size(); ++i) (*model)(inputs[i].first, inputs[i].second);
  // The relu output observer saw only non-negative values.
  EXPECT_GE(m.observer(rl.output_observer).min_val(), 0.f);
  convert(*model);
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_GT(sqnr_of((*model)(inputs[i].first, inputs[i].second), refs[i]), kMinSqnrDb);
  }
  EXPECT_NE(add.executor->describe().find("add"), std::string::npos) << add.executor->describe();
}

// ---------------------------------------------------------------------------------------------

struct BasicBlock : nn::CallableModule<BasicBlock> {
  explicit BasicBlock(int64_t c) {
    conv1 = register_module("conv1", std::make_shared<Conv2d>(c, c, 3, 1, 1, 1, 1, false));
    bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(c));
    relu = register_module("relu", std::make_shared<ReLU>());
    conv2 = register_module("conv2", std::make_shared<Conv2d>(c, c, 3, 1, 1, 1, 1, false));
    bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(c));
    randomize_bn(*bn1, 20);
    randomize_bn(*bn2, 30);
  }
  Tensor forward(const Tensor& x) {
    Tensor out = (*relu)((*bn1)((*conv1)(x)));
    out = (*bn2)((*conv2)(out));
    out = out + x;
    return (*relu)(out);
  }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<ReLU> relu;
};

TEST(Fusion, ResidualConvBnAddRelu) {
  manual_seed(5);
  auto model = std::make_shared<BasicBlock>(6);
  model->eval();
  const auto inputs = testing::random_batches(3, 150, {2, 6, 8, 8});
  std::vector<Tensor> refs;
  for (const Tensor& x : inputs) refs.push_back((*model)(x));
  prepare(*model, {inputs[0]});
  AutoQuantizationState& s = state_of(*model);
  ASSERT_EQ(seen_kinds(s),
            (std::vector<OpKind>{K::kConv2d, K::kBatchNorm, K::kRelu, K::kConv2d, K::kBatchNorm, K::kAdd, K::kRelu}));
  expect_chain(s, 0, {K::kConv2d, K::kBatchNorm, K::kRelu}, "conv2d+batch_norm+relu");
  expect_chain(s, 3, {K::kConv2d, K::kBatchNorm, K::kAdd, K::kRelu}, "conv2d+batch_norm+add+relu");
  EXPECT_EQ(display_kinds(s), (std::vector<std::string>{"conv2d+batch_norm+relu", "conv2d+batch_norm+add+relu"}));
  const SeenOpInfo& add = s.seen_ops()[5];
  // out + x: the chain tensor is input 0, the residual input 1 (the block input).
  EXPECT_EQ(add.fusion.residual_input, 1);
  EXPECT_EQ(add.inputs[1].id, s.seen_ops()[0].inputs[0].id);
  for (int i : {0, 1, 2, 3, 4, 6}) EXPECT_EQ(s.seen_ops()[i].fusion.residual_input, -1) << i;
  ModelQuantState& m = model_quant_state(*model);
  expect_chain_output_observed_once(m, s, 0, 3);
  expect_chain_output_observed_once(m, s, 3, 4);
  // The residual is the block input, observed at conv1: the add reads it through the same
  // observer, not a second one.
  EXPECT_GE(s.seen_ops()[0].input_observers[0], 0);
  EXPECT_EQ(add.input_observers, (std::vector<int>{-1, s.seen_ops()[0].input_observers[0]}));
  EXPECT_EQ(observer_roots(m).size(), 3u);
  calibrate_convert_compare(*model, inputs, refs);
  const std::string d = s.seen_ops()[3].executor->describe();
  EXPECT_NE(d.find("residual"), std::string::npos) << d;
  EXPECT_NE(add.executor->describe().find("residual add fused into conv2d+batch_norm+add+relu"), std::string::npos)
      << add.executor->describe();
}

// A residual whose add reads the chain tensor as its second input (x + out).
struct ResidualFirst : nn::CallableModule<ResidualFirst> {
  ResidualFirst() {
    conv = register_module("conv", std::make_shared<Conv2d>(4, 4, 3, 1, 1));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(4));
    randomize_bn(*bn, 40);
  }
  Tensor forward(const Tensor& x) { return relu(x + (*bn)((*conv)(x))); }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
};

TEST(Fusion, ResidualOnTheLeftOfTheAdd) {
  manual_seed(6);
  auto model = std::make_shared<ResidualFirst>();
  model->eval();
  const auto inputs = testing::random_batches(3, 160, {2, 4, 8, 8});
  std::vector<Tensor> refs;
  for (const Tensor& x : inputs) refs.push_back((*model)(x));
  prepare(*model, {inputs[0]});
  AutoQuantizationState& s = state_of(*model);
  ASSERT_EQ(seen_kinds(s), (std::vector<OpKind>{K::kConv2d, K::kBatchNorm, K::kAdd, K::kRelu}));
  expect_chain(s, 0, {K::kConv2d, K::kBatchNorm, K::kAdd, K::kRelu}, "conv2d+batch_norm+add+relu");
  EXPECT_EQ(s.seen_ops()[2].fusion.residual_input, 0);
  calibrate_convert_compare(*model, inputs, refs);
}

}  // namespace
}  // namespace dbrq
