// Ops that stay fp32 inside a quantized model: an op without an int8 kernel (dbrq::std) after a
// quantized conv gets its input dequantized after convert; in-place ops between two convs
// (sub_ without an int8 kernel, clamp_ sharing its input's parameters, mul_ on a path that is fp32
// there) must be seen by the second conv: converted outputs are compared with fp32 by SQNR, which
// collapses if the in-place result is lost. An explicit dequantize in user code after convert takes
// its int8 argument as it is.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using Conv2d = nn::Conv2dImpl;
using testing::seen_kinds;
using testing::sqnr_of;
using testing::state_of;
using K = OpKind;

bool lists_fp32(const AutoQuantizationState& s, OpKind kind, const std::string& reason) {
  for (const NonQuantOpInfo& o : s.non_quant_ops()) {
    if (o.kind == kind && o.reason == reason) return true;
  }
  return false;
}

struct StdAfterConv : nn::CallableModule<StdAfterConv> {
  StdAfterConv() { conv = register_module("conv", std::make_shared<Conv2d>(3, 5, 3, 1, 1)); }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    return dbrq::std(y, {2, 3}) + mean(y, {2, 3});
  }
  std::shared_ptr<Conv2d> conv;
};

TEST(Fp32Ops, UnsupportedOpAfterQuantizedOpGetsDequantizedInput) {
  manual_seed(1);
  auto model = std::make_shared<StdAfterConv>();
  const auto inputs = testing::random_batches(3, 10, {2, 3, 8, 8});
  std::vector<Tensor> refs;
  for (const Tensor& x : inputs) refs.push_back((*model)(x));
  prepare(*model, {inputs[0]});
  AutoQuantizationState& s = state_of(*model);
  // std is not a seen op; mean shares the conv's parameters; the add of an fp32 tensor (std's
  // output) and a u8 one gets an input observer for the fp32 side.
  ASSERT_EQ(seen_kinds(s), (std::vector<OpKind>{K::kConv2d, K::kMean, K::kAdd}));
  EXPECT_TRUE(lists_fp32(s, K::kStd, "no int8 kernel"));
  EXPECT_EQ(s.seen_ops()[0].outputs[0].inf_dtype, DType::kU8);
  const SeenOpInfo& add = s.seen_ops()[2];
  EXPECT_GE(add.input_observers[0], 0);
  EXPECT_EQ(add.input_observers[1], -1);
  for (const Tensor& x : inputs) (*model)(x);
  convert(*model);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor y = (*model)(inputs[i]);
    EXPECT_EQ(y.dtype(), DType::kF32);
    EXPECT_GT(sqnr_of(y, refs[i]), 25.0) << i;
  }
  // Also with the std result as the model's output directly.
  struct StdOnly : nn::CallableModule<StdOnly> {
    StdOnly() { conv = register_module("conv", std::make_shared<Conv2d>(3, 5, 3, 1, 1)); }
    Tensor forward(const Tensor& x) { return dbrq::std((*conv)(x), {2, 3}); }
    std::shared_ptr<Conv2d> conv;
  };
  auto plain = std::make_shared<StdOnly>();
  std::vector<Tensor> prefs;
  for (const Tensor& x : inputs) prefs.push_back((*plain)(x));
  prepare(*plain, {inputs[0]});
  for (const Tensor& x : inputs) (*plain)(x);
  convert(*plain);
  for (size_t i = 0; i < inputs.size(); ++i) EXPECT_GT(sqnr_of((*plain)(inputs[i]), prefs[i]), 25.0) << i;
}

// conv1 -> in-place op -> conv2. The in-place op changes values a lot, so losing it is visible.
struct InPlaceBetweenConvs : nn::CallableModule<InPlaceBetweenConvs> {
  enum Kind { kSubInPlace, kClampInPlace, kMulInPlaceOnFp32Path, kReluInPlace };
  explicit InPlaceBetweenConvs(Kind k) : kind(k) {
    conv1 = register_module("conv1", std::make_shared<Conv2d>(3, 6, 3, 1, 1));
    conv2 = register_module("conv2", std::make_shared<Conv2d>(6, 4, 3, 1, 1));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv1)(x);
    switch (kind) {
      case kSubInPlace:
        y.sub_(1.5);
        break;
      case kClampInPlace:
        y.clamp_(-0.2, 0.3);
        break;
      case kMulInPlaceOnFp32Path:
        y = y - y * 0.5;  // a tensor-tensor sub has no int8 kernel: fp32 from here
        y.mul_(-3.0);
        break;
      case kReluInPlace:
        y.relu_();
        break;
    }
    return (*conv2)(y);
  }
  Kind kind;
  std::shared_ptr<Conv2d> conv1, conv2;
};

TEST(Fp32Ops, InPlaceOpBetweenTwoConvs) {
  for (auto kind : {InPlaceBetweenConvs::kSubInPlace, InPlaceBetweenConvs::kClampInPlace,
                    InPlaceBetweenConvs::kMulInPlaceOnFp32Path, InPlaceBetweenConvs::kReluInPlace}) {
    SCOPED_TRACE(static_cast<int>(kind));
    manual_seed(2);
    auto model = std::make_shared<InPlaceBetweenConvs>(kind);
    const auto inputs = testing::random_batches(3, 20, {2, 3, 8, 8});
    std::vector<Tensor> refs;
    for (const Tensor& x : inputs) refs.push_back((*model)(x));
    // Sanity: without the in-place op conv2 would compute something far from the reference.
    {
      const Tensor without = (*model->conv2)((*model->conv1)(inputs[0]));
      ASSERT_LT(sqnr_of(without, refs[0]), 15.0) << "the in-place op must matter for this test to mean anything";
    }
    prepare(*model, {inputs[0]});
    AutoQuantizationState& s = state_of(*model);
    const SeenOpInfo& conv2 = s.seen_ops().back();
    EXPECT_EQ(conv2.fqn, "conv2");
    switch (kind) {
      case InPlaceBetweenConvs::kSubInPlace:
        // x -= c on int8 only shifts the zero point: conv2 gets u8 with derived parameters.
        EXPECT_EQ(seen_kinds(s), (std::vector<OpKind>{K::kConv2d, K::kSub, K::kConv2d}));
        EXPECT_EQ(s.seen_ops()[1].role, QuantRole::kBinary);
        EXPECT_TRUE(s.seen_ops()[1].has_scalar);
        EXPECT_EQ(s.seen_ops()[1].output_observer, -1);
        EXPECT_EQ(conv2.input_observers[0], -1);
        break;
      case InPlaceBetweenConvs::kClampInPlace:
        EXPECT_EQ(seen_kinds(s), (std::vector<OpKind>{K::kConv2d, K::kClamp, K::kConv2d}));
        EXPECT_EQ(s.seen_ops()[1].role, QuantRole::kShare);
        break;
      case InPlaceBetweenConvs::kMulInPlaceOnFp32Path:
        EXPECT_EQ(seen_kinds(s), (std::vector<OpKind>{K::kConv2d, K::kMul, K::kSub, K::kMul, K::kConv2d}));
        EXPECT_EQ(s.seen_ops()[2].role, QuantRole::kNone);  // tensor sub: fp32
        EXPECT_EQ(s.seen_ops()[3].role, QuantRole::kNone);  // its input is fp32 at inference
        EXPECT_GE(conv2.input_observers[0], 0);
        break;
      case InPlaceBetweenConvs::kReluInPlace:
        EXPECT_EQ(seen_kinds(s), (std::vector<OpKind>{K::kConv2d, K::kRelu, K::kConv2d}));
        break;
    }
    // conv2 reads the in-place op's result (a new tensor id), never conv1's output itself.
    EXPECT_NE(conv2.inputs[0].id, s.seen_ops()[0].outputs[0].id);
    if (s.seen_ops().size() == 3) {
      EXPECT_EQ(conv2.inputs[0].id, s.seen_ops()[1].outputs[0].id);
    }
    for (size_t i = 0; i < inputs.size(); ++i) testing::expect_equal((*model)(inputs[i]), refs[i], "calibrating");
    convert(*model);
    for (size_t i = 0; i < inputs.size(); ++i) EXPECT_GT(sqnr_of((*model)(inputs[i]), refs[i]), 25.0) << i;
  }
}

// User code may dequantize an int8 activation itself (e.g. to read values for a data-dependent
// branch); the explicit dequantize must not be handed a dequantized (f32) argument.
struct ExplicitDequantize : nn::CallableModule<ExplicitDequantize> {
  ExplicitDequantize() { conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1)); }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    if (y.is_quantized()) y = y.dequantize();
    return y * 2.0 + 1.0;
  }
  std::shared_ptr<Conv2d> conv;
};

TEST(Fp32Ops, ExplicitDequantizeOfAnInt8ActivationAfterConvert) {
  manual_seed(3);
  auto model = std::make_shared<ExplicitDequantize>();
  const auto inputs = testing::random_batches(3, 30, {2, 3, 8, 8});
  std::vector<Tensor> refs;
  for (const Tensor& x : inputs) refs.push_back((*model)(x));
  prepare(*model, {inputs[0]});
  for (const Tensor& x : inputs) (*model)(x);
  convert(*model);
  for (size_t i = 0; i < inputs.size(); ++i) EXPECT_GT(sqnr_of((*model)(inputs[i]), refs[i]), 25.0) << i;
}

}  // namespace
}  // namespace dbrq
