// elu, the activation added through the op registry alone (its OpDef in runtime/ops/activations.cc,
// its declarations in ops.h and nn.h): fused after a conv as oneDNN's elu post-op, alone through a
// 256-entry table, the ELU layer, and bad inputs. fp32 and int8 parity with PyTorch are in the op
// goldens (tests/ops, tests/int8).
#include <gtest/gtest.h>

#include <memory>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using Conv2d = nn::Conv2dImpl;

struct EluNet : nn::CallableModule<EluNet> {
  EluNet() {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    act = register_module("act", std::make_shared<nn::ELUImpl>(0.5));
    conv2 = register_module("conv2", std::make_shared<Conv2d>(8, 8, 1));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*act)((*conv)(x));  // conv -> ELU: fused
    y = (*conv2)(y) * 1.0;          // the scalar multiply keeps conv2's output unfused
    return elu(y);                  // alone: a code table
  }
  std::shared_ptr<Conv2d> conv, conv2;
  std::shared_ptr<nn::ELUImpl> act;
};

TEST(Elu, FusedAfterConvAndAloneThroughATable) {
  manual_seed(9);
  EluNet ref;
  manual_seed(9);
  EluNet m;
  const Tensor x = randn({2, 3, 8, 8}, 1);
  const Tensor expected = ref(x);
  prepare(m, {x});
  EXPECT_EQ(testing::display_kinds(testing::state_of(m)),
            (std::vector<std::string>{"conv2d+elu", "conv2d", "mul", "elu"}));
  for (int i = 0; i < 6; ++i) m(randn({2, 3, 8, 8}, 10 + i));
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  EXPECT_NE(ops[0].executor.find("int8 conv2d"), std::string::npos);
  EXPECT_NE(ops[0].executor.find("+elu"), std::string::npos) << ops[0].executor;
  EXPECT_EQ(ops[1].executor, "fused into conv2d+elu");
  EXPECT_EQ(ops.back().executor, "int8 elu (256-entry table)");
  EXPECT_GT(testing::sqnr_of(m(x), expected), 25.0);
}

TEST(Elu, LayerAndFunction) {
  const Tensor x = from_vector<float>({-2.f, -0.5f, 0.f, 1.5f});
  const std::vector<float> y = elu(x, 0.5).to_vector<float>();
  EXPECT_FLOAT_EQ(y[0], 0.5f * std::expm1(-2.f));
  EXPECT_FLOAT_EQ(y[3], 1.5f);
  nn::ELUImpl layer(0.5);
  EXPECT_EQ(layer(x).to_vector<float>(), y);
  EXPECT_EQ(layer.to_string(), "ELU(alpha=0.5)");
  EXPECT_EQ(op_name(OpKind::kElu), std::string("elu"));
}

TEST(Elu, BadInputs) {
  EXPECT_THROW_MSG(elu(from_vector<int64_t>({1, 2})), DTypeError, "elu: input must have dtype f32");
  EXPECT_THROW_MSG(elu(Tensor()), ValueError, "elu: input");
}

}  // namespace
}  // namespace dbrq
