// Issue 12's op families in a prepared and converted model: stack, pad, clamp, expand and repeat
// run int8 (stack like cat, the rest sharing their input's parameters); prelu runs int8 with its
// weight quantized like a conv's, softplus and mish through tables; the model stays close to fp32,
// and a new batch size works after convert. fp32 and int8 parity with PyTorch are in the op
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

using Conv2d = nn::Conv2dImpl;

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
  ref.eval();
  manual_seed(21);
  FamiliesNet m;
  m.eval();
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

struct ActivationsNet : nn::CallableModule<ActivationsNet> {
  ActivationsNet() {
    conv1 = register_module("conv1", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    act = register_module("act", std::make_shared<nn::PReLUImpl>(8));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2dImpl>(8));
    conv2 = register_module("conv2", std::make_shared<Conv2d>(8, 8, 1));
    sp = register_module("sp", std::make_shared<nn::SoftplusImpl>(2.0, 5.0));
    mi = register_module("mi", std::make_shared<nn::MishImpl>());
    act1 = register_module("act1", std::make_shared<nn::PReLUImpl>());
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*bn)((*act)((*conv1)(x)));  // prelu ends the chain: bn after it does not fold into it
    y = (*sp)((*conv2)(y) * 1.0);
    return (*act1)((*mi)(y));
  }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<nn::PReLUImpl> act, act1;
  std::shared_ptr<nn::BatchNorm2dImpl> bn;
  std::shared_ptr<nn::SoftplusImpl> sp;
  std::shared_ptr<nn::MishImpl> mi;
};

TEST(OpFamilies, PreluSoftplusMishRunInt8) {
  manual_seed(5);
  ActivationsNet ref;
  ref.eval();
  manual_seed(5);
  ActivationsNet m;
  m.eval();
  // Distinct slopes per channel, some negative, so a wrong channel or sign shows.
  const Tensor slopes = from_vector<float>({0.25f, -0.3f, 0.5f, 0.1f, 0.8f, -0.1f, 0.05f, 0.4f});
  ref.act->weight.copy_(slopes);
  m.act->weight.copy_(slopes);
  testing::randomize_bn(*ref.bn, 3);
  testing::randomize_bn(*m.bn, 3);
  const Tensor x = randn({2, 3, 8, 8}, 1);
  const Tensor expected = ref(x);
  prepare(m, {x});
  EXPECT_EQ(testing::display_kinds(testing::state_of(m)),
            (std::vector<std::string>{"conv2d", "prelu", "batch_norm", "conv2d", "mul", "softplus", "mish", "prelu"}));
  for (int i = 0; i < 8; ++i) m(randn({2, 3, 8, 8}, 40 + i));
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  ASSERT_EQ(ops.size(), 8u);
  EXPECT_EQ(ops[1].executor, "int8 prelu (8 per-channel tables)");
  ASSERT_TRUE(ops[1].weight_qparams != nullptr);
  EXPECT_TRUE(ops[1].weight_qparams->is_per_channel()) << "the qconfig's per-channel s8 weights";
  // batch_norm after prelu does not fold into prelu's weight; it runs int8 on its own.
  EXPECT_EQ(ops[2].role, "channel_affine") << ops[2].executor;
  EXPECT_EQ(ops[2].fused_into, -1);
  EXPECT_EQ(ops[5].executor, "int8 softplus (256-entry table)");
  EXPECT_EQ(ops[6].executor, "int8 mish (256-entry table)");
  EXPECT_EQ(ops[7].executor, "int8 prelu (1 table)");
  EXPECT_GT(testing::sqnr_of(m(x), expected), 25.0);
}

// where, pow, sqrt and exp are fp32 ops: after convert their int8 arguments are dequantized and
// they run in fp32, and the conv after them quantizes their result again.
struct MathNet : nn::CallableModule<MathNet> {
  MathNet() {
    conv1 = register_module("conv1", std::make_shared<Conv2d>(3, 4, 3, 1, 1));
    conv2 = register_module("conv2", std::make_shared<Conv2d>(4, 4, 1));
  }
  Tensor forward(const Tensor& x, const Tensor& mask) {
    Tensor y = (*conv1)(x);
    Tensor z = sqrt(pow(y, 2.0) + 1.0) + exp(y * 0.1);
    return (*conv2)(where(mask, z, y));
  }
  std::shared_ptr<Conv2d> conv1, conv2;
};

TEST(OpFamilies, MathOpsRunFp32OnDequantizedInputs) {
  manual_seed(8);
  MathNet ref;
  ref.eval();
  manual_seed(8);
  MathNet m;
  m.eval();
  const Tensor x = randn({2, 3, 6, 6}, 1);
  const Tensor mask = randn({1, 1, 6, 6}, 2).to(DType::kF32);
  const Tensor expected = ref(x, mask);
  prepare(m, {x, mask});
  for (int i = 0; i < 6; ++i) m(randn({2, 3, 6, 6}, 50 + i), mask);
  convert(m);
  // quantized_ops lists the quantizeable ops: the two convs, int8 in and out; the math ops between
  // them are not among them (they run in fp32 on conv1's dequantized output).
  int convs = 0;
  for (const QuantizedOpInfo& op : quantized_ops(m)) {
    EXPECT_NE(op.kind, OpKind::kWhere);
    EXPECT_NE(op.kind, OpKind::kPow);
    EXPECT_NE(op.kind, OpKind::kSqrt);
    EXPECT_NE(op.kind, OpKind::kExp);
    if (op.kind != OpKind::kConv2d) continue;
    ++convs;
    EXPECT_EQ(op.output_dtype, DType::kU8);
    EXPECT_EQ(op.input_dtypes.at(0), DType::kU8);
  }
  EXPECT_EQ(convs, 2);
  EXPECT_EQ(op_def(OpKind::kWhere).role, QuantRole::kNone);
  EXPECT_EQ(op_def(OpKind::kPow).role, QuantRole::kNone);
  EXPECT_GT(testing::sqnr_of(m(x, mask), expected), 25.0);
}

// max / argmax / topk / index_select / gather on a converted conv's int8 output: fp32 on the
// dequantized codes (not recorded as quantizeable ops).
struct IndexingNet : nn::CallableModule<IndexingNet> {
  IndexingNet() { conv = register_module("conv", std::make_shared<Conv2d>(3, 6, 3, 1, 1)); }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    Tensor v = std::get<0>(y.max(1, true)) + std::get<0>(y.topk(2, 1)).narrow(1, 1, 1);
    Tensor s = y.index_select(1, from_vector<int64_t>({5, 0})).narrow(1, 0, 1);
    return v + s + y.gather(1, zeros({2, 1, 6, 6}, DType::kS64));
  }
  std::shared_ptr<Conv2d> conv;
};

// Issue 12 item 3: max / topk values and gather run on codes (kShare, tests/quant/int8_index_ops_test).
TEST(OpFamilies, IndexingOpsRunOnInt8Codes) {
  manual_seed(4);
  IndexingNet ref;
  ref.eval();
  manual_seed(4);
  IndexingNet m;
  m.eval();
  const Tensor x = randn({2, 3, 6, 6}, 1);
  const Tensor expected = ref(x);
  prepare(m, {x});
  for (int i = 0; i < 6; ++i) m(randn({2, 3, 6, 6}, 60 + i));
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  ASSERT_FALSE(ops.empty());
  EXPECT_EQ(ops[0].kind, OpKind::kConv2d);
  EXPECT_EQ(ops[0].output_dtype, DType::kU8);
  for (const QuantizedOpInfo& op : ops) {
    if (op.kind == OpKind::kMax || op.kind == OpKind::kTopk || op.kind == OpKind::kGather) {
      EXPECT_EQ(op.role, "share") << op.op;
    }
  }
  EXPECT_GT(testing::sqnr_of(m(x), expected), 25.0);
}

TEST(OpFamilies, OpNamesAndRoles) {
  EXPECT_STREQ(op_name(OpKind::kStack), "stack");
  EXPECT_STREQ(op_name(OpKind::kExpand), "expand");
  EXPECT_STREQ(op_name(OpKind::kRepeat), "repeat");
  EXPECT_STREQ(op_name(OpKind::kPad), "pad");
  EXPECT_EQ(op_def(OpKind::kStack).role, QuantRole::kCat);
  EXPECT_EQ(op_def(OpKind::kPad).role, QuantRole::kShare);
  EXPECT_STREQ(op_name(OpKind::kPrelu), "prelu");
  EXPECT_STREQ(op_name(OpKind::kSoftplus), "softplus");
  EXPECT_STREQ(op_name(OpKind::kMish), "mish");
  EXPECT_EQ(op_def(OpKind::kPrelu).role, QuantRole::kWeighted);
  EXPECT_EQ(op_def(OpKind::kPrelu).num_activation_inputs, 1);
  for (OpKind k : {OpKind::kArgmax, OpKind::kTopkIndices, OpKind::kWhere, OpKind::kPow, OpKind::kSqrt, OpKind::kExp}) {
    EXPECT_EQ(op_def(k).role, QuantRole::kNone) << op_name(k);
  }
  for (OpKind k : {OpKind::kMax, OpKind::kTopk, OpKind::kIndexSelect, OpKind::kGather}) {
    EXPECT_EQ(op_def(k).role, QuantRole::kShare) << op_name(k);
  }
  EXPECT_TRUE(op_def(OpKind::kArgmax).takes_int8);
  EXPECT_TRUE(op_def(OpKind::kTopkIndices).takes_int8);
}

}  // namespace
}  // namespace dbrq
