// Issue 12's op families in a prepared and converted model: stack, pad, clamp, expand and repeat
// run int8 (stack like cat, the rest sharing their input's parameters), the model stays close to
// fp32, and a new batch size works after convert. fp32 and int8 parity with PyTorch are in the op
// goldens (tests/ops, tests/int8).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using nn::Conv2d;

struct FamiliesNet : nn::CallableModule<FamiliesNet> {
  FamiliesNet() {
    conv1 = register_module("conv1", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    conv2 = register_module("conv2", std::make_shared<Conv2d>(8, 8, 3));
    conv3 = register_module("conv3", std::make_shared<Conv2d>(3, 8, 1));
    conv4 = register_module("conv4", std::make_shared<Conv2d>(16, 4, 3));
  }
  Tensor forward(const Tensor& x) {
    Tensor a = pad((*conv1)(x), {1, 1, 1, 1}, PadMode::kReflect);  // [N, 8, 10, 10]
    Tensor c = clamp((*conv2)(a), -1.0, 1.0);                     // [N, 8, 8, 8]
    Tensor s = stack({(*conv3)(x), c}, 1);                        // [N, 2, 8, 8, 8]
    Tensor f = s.flatten(1, 2);                                   // [N, 16, 8, 8]
    Tensor e = f.narrow(2, 0, 1).expand({-1, -1, 8, -1});         // a row broadcast down
    Tensor y = pad(f + e, {1, 1, 1, 1}, PadMode::kConstant, 0.0);
    y = (*conv4)(y).repeat({1, 2, 1, 1});                         // [N, 8, 8, 8]
    return y;
  }
  std::shared_ptr<Conv2d> conv1, conv2, conv3, conv4;
};

TEST(OpFamilies, PrepareCalibrateConvertRunsInt8) {
  manual_seed(21);
  FamiliesNet ref;
  manual_seed(21);
  FamiliesNet m;
  const Tensor x = randn({2, 3, 8, 8}, 1);
  const Tensor expected = ref(x);
  prepare(m, {x});
  EXPECT_EQ(testing::display_kinds(testing::state_of(m)),
            (std::vector<std::string>{"conv2d", "pad", "conv2d", "clamp", "conv2d", "stack", "flatten", "narrow",
                                      "expand", "add", "pad", "conv2d", "repeat"}));
  for (int i = 0; i < 8; ++i) m(randn({2, 3, 8, 8}, 30 + i));
  convert(m);
  for (const QuantizedOpInfo& op : quantized_ops(m)) {
    SCOPED_TRACE(op.op);
    EXPECT_EQ(op.executor.rfind("int8", 0), 0u) << op.executor;
    ASSERT_EQ(op.output_dtype, DType::kU8);
    ASSERT_TRUE(op.output_qparams != nullptr);
    if (op.kind == OpKind::kPad || op.kind == OpKind::kClamp || op.kind == OpKind::kExpand ||
        op.kind == OpKind::kRepeat) {
      EXPECT_EQ(op.executor, std::string("int8 ") + op_name(op.kind) + " (shares parameters)");
      ASSERT_EQ(op.input_qparams.size(), 1u);
      EXPECT_EQ(*op.input_qparams[0], *op.output_qparams) << "passes its input's parameters through";
    }
    if (op.kind == OpKind::kStack) {
      ASSERT_EQ(op.input_qparams.size(), 2u);
      EXPECT_EQ(op.role, "cat");
    }
  }
  const Tensor y = m(x);
  EXPECT_FALSE(y.is_quantized()) << "the model's output comes back fp32";
  EXPECT_GT(testing::sqnr_of(y, expected), 25.0);
  // A new batch size after convert.
  const Tensor x3 = randn({3, 3, 8, 8}, 2);
  EXPECT_GT(testing::sqnr_of(m(x3), ref(x3)), 25.0);
}

TEST(OpFamilies, OpNamesAndRoles) {
  EXPECT_STREQ(op_name(OpKind::kStack), "stack");
  EXPECT_STREQ(op_name(OpKind::kExpand), "expand");
  EXPECT_STREQ(op_name(OpKind::kRepeat), "repeat");
  EXPECT_STREQ(op_name(OpKind::kPad), "pad");
  EXPECT_EQ(op_def(OpKind::kStack).role, QuantRole::kCat);
  EXPECT_EQ(op_def(OpKind::kPad).role, QuantRole::kShare);
}

}  // namespace
}  // namespace dbrq
