// Printing a prepared model: operator<< shows each module's AutoQuantizationState (fqn, seen ops with
// fused chain names, tensors and weights, observers with their ranges, fp32 ops) under the module
// tree; before calibration observers print as empty; after convert each seen op names its executor
// and each observer its quantization parameters. quant_state_to_string lists every state in fqn order.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;
using ReLU = nn::ReLUImpl;
using testing::state_of;

struct Block : nn::CallableModule<Block> {
  Block() {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1, 1, 1, false));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(4));
    relu = register_module("relu", std::make_shared<ReLU>());
    testing::randomize_bn(*bn, 2);
  }
  Tensor forward(const Tensor& x) { return (*relu)((*bn)((*conv)(x))); }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<ReLU> relu;
};

struct Net : nn::CallableModule<Net> {
  Net() {
    block = register_module("block", std::make_shared<Block>());
    head = register_module("head", std::make_shared<Conv2d>(4, 2, 1));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*head)((*block)(x));
    return dbrq::std(y, {2, 3}) + mean(y, {2, 3});
  }
  std::shared_ptr<Block> block;
  std::shared_ptr<Conv2d> head;
};

std::string print(const nn::Module& m) {
  std::ostringstream os;
  os << m;
  return os.str();
}

void expect_contains(const std::string& text, const std::string& what) {
  EXPECT_NE(text.find(what), std::string::npos) << "missing \"" << what << "\" in:\n" << text;
}

class PrintingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manual_seed(4);
    model = std::make_shared<Net>();
    model->eval();
    prepare(*model, {randn({2, 3, 6, 6}, 1)});
  }
  void calibrate() {
    for (int i = 0; i < 3; ++i) (*model)(randn({2, 3, 6, 6}, 10 + i));
  }
  std::shared_ptr<Net> model;
};

TEST_F(PrintingTest, PreparedModelBeforeCalibration) {
  const std::string text = print(*model);
  // The module tree is still printed as PyTorch does.
  expect_contains(text, "(block): Block(");
  expect_contains(text, "(conv): Conv2d(3, 4, kernel_size=(3, 3)");
  expect_contains(text, "AutoQuantizationState(fqn=\"block\")");
  expect_contains(text, "AutoQuantizationState(fqn=\"\")");
  expect_contains(text, "seen_ops:");
  expect_contains(text, "0: conv2d+batch_norm+relu");
  expect_contains(text, "w=[block.conv.weight:s8 per-channel]");
  expect_contains(text, "observers:");
  expect_contains(text, "Histogram[empty]");
  expect_contains(text, "fp32_ops: std");
  // Fused followers are shown through their chain: no separate "1: batch_norm" line.
  EXPECT_EQ(text.find("1: batch_norm"), std::string::npos) << text;
  // The block's state is printed inside the block, indented under it.
  const size_t block_pos = text.find("(block): Block(");
  const size_t state_pos = text.find("AutoQuantizationState(fqn=\"block\")");
  const size_t head_pos = text.find("(head): Conv2d");
  EXPECT_LT(block_pos, state_pos);
  EXPECT_LT(state_pos, head_pos);
}

TEST_F(PrintingTest, RangesAfterCalibration) {
  calibrate();
  const std::string text = print(*model);
  EXPECT_EQ(text.find("[empty]"), std::string::npos) << text;
  expect_contains(text, "Histogram[min=");
  // Every observer's own summary appears verbatim.
  ModelQuantState& m = model_quant_state(*model);
  for (int r : testing::observer_roots(m)) expect_contains(text, m.slot(r).observer->describe());
  // The chain's output observer is listed under the block with the chain's output tensor id.
  const SeenOpInfo& relu = state_of(*model->block).seen_ops()[2];
  expect_contains(state_of(*model->block).to_string(),
                  " t" + std::to_string(m.slot(relu.output_observer).tensor_id) + " Histogram[min=0 ");
  expect_contains(state_of(*model->block).to_string(), "out=[t" + std::to_string(relu.outputs[0].id) + ":u8]");
}

TEST_F(PrintingTest, ConvertedModelDescribesExecutors) {
  calibrate();
  convert(*model);
  const std::string text = print(*model);
  expect_contains(text, "-> int8 conv2d");
  expect_contains(text, "+relu");
  expect_contains(text, "{scale=");
  expect_contains(text, "zero_point=");
  const std::string all = quant_state_to_string(*model);
  expect_contains(all, "AutoQuantizationState(fqn=\"\")");
  expect_contains(all, "AutoQuantizationState(fqn=\"block\")");
  EXPECT_LT(all.find("AutoQuantizationState(fqn=\"\")"), all.find("AutoQuantizationState(fqn=\"block\")"));
  expect_contains(all, "int8 mean (shares parameters)");
  for (AutoQuantizationState* s : model_quant_state(*model).states()) {
    for (const SeenOpInfo& op : s->seen_ops()) {
      ASSERT_NE(op.executor, nullptr) << op.fqn;
      if (!(op.fusion.fused() && op.fusion.position > 0)) expect_contains(all, "-> " + op.executor->describe());
    }
  }
}

TEST(Printing, UnpreparedModelHasNoState) {
  auto model = std::make_shared<Net>();
  model->eval();
  const std::string text = print(*model);
  EXPECT_EQ(text.find("AutoQuantizationState"), std::string::npos) << text;
  EXPECT_THROW_MSG(quant_state_to_string(*model), UsageError, "is not a prepared model");
}

}  // namespace
}  // namespace dbrq
