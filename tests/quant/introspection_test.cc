// The public read-only view of a prepared model (tracer/introspection.h): seen ops in execution
// order with their roles and dtypes, and after convert the parameters of their inputs, outputs and
// weights, which agree with what the converted model computes with.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;

struct Net : nn::CallableModule<Net> {
  Net() {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(8));
    fc = register_module("fc", std::make_shared<Linear>(8, 4));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = relu((*bn)((*conv)(x)));
    return (*fc)(flatten(adaptive_avg_pool2d(y, {1, 1}), 1));
  }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<Linear> fc;
};

TEST(Introspection, SeenOpsBeforeAndAfterConvert) {
  manual_seed(2);
  Net m;
  testing::randomize_bn(*m.bn, 5);
  m.eval();
  const Tensor x = randn({2, 3, 6, 6}, 1);
  prepare(m, {x});
  std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  std::vector<std::string> names;
  for (const QuantizedOpInfo& op : ops) names.push_back(op.op);
  EXPECT_EQ(names, (std::vector<std::string>{"conv2d+batch_norm+relu", "batch_norm", "relu", "adaptive_avg_pool2d",
                                             "flatten", "linear"}));
  EXPECT_EQ(ops[0].fqn, "conv");
  EXPECT_EQ(ops[0].module, "");
  EXPECT_EQ(ops[0].module_type, "Net");
  EXPECT_EQ(ops[0].role, "weighted");
  EXPECT_EQ(ops[0].kind, OpKind::kConv2d);
  EXPECT_EQ(ops[1].fused_into, 0);
  EXPECT_EQ(ops[2].fused_into, 0);
  EXPECT_EQ(ops[3].role, "share");
  EXPECT_EQ(ops[0].input_dtypes, (std::vector<DType>{DType::kU8}));
  EXPECT_EQ(ops[5].output_dtype, DType::kU8);
  EXPECT_EQ(ops[0].weight_qparams, nullptr);  // nothing decided before convert
  EXPECT_TRUE(ops[0].executor.empty());
  EXPECT_EQ(num_observers(m), 3);  // conv input, chain output (shared by pool and flatten), linear output

  for (int i = 0; i < 4; ++i) m(randn({2, 3, 6, 6}, 10 + i));
  convert(m);
  ops = quantized_ops(m);
  // conv: per-channel weight scales, of the weights with batch norm folded in.
  ASSERT_NE(ops[0].weight_qparams, nullptr);
  EXPECT_TRUE(ops[0].weight_qparams->is_per_channel());
  EXPECT_EQ(ops[0].weight_qparams->scales.size(), 8u);
  const std::vector<float> w = m.conv->weight.to_vector<float>();
  const std::vector<float> gamma = m.bn->weight.to_vector<float>(), var = m.bn->running_var.to_vector<float>();
  for (int k = 0; k < 8; ++k) {
    float mx = 0.f;
    const float mult = gamma[k] / std::sqrt(var[k] + 1e-5f);
    for (int i = 0; i < 27; ++i) mx = std::max(mx, std::abs(w[k * 27 + i] * mult));
    EXPECT_NEAR(ops[0].weight_qparams->scales[k], mx / 127.5f, 1e-6f * mx) << "channel " << k;
  }
  ASSERT_EQ(ops[0].input_qparams.size(), 1u);
  ASSERT_NE(ops[0].input_qparams[0], nullptr);
  ASSERT_NE(ops[0].output_qparams, nullptr);
  // The pool and flatten share the chain's output parameters.
  EXPECT_EQ(ops[3].output_qparams, ops[0].output_qparams);
  EXPECT_EQ(ops[4].output_qparams, ops[0].output_qparams);
  ASSERT_NE(ops[5].weight_qparams, nullptr);
  EXPECT_EQ(ops[5].weight_qparams->scales.size(), 4u);
  EXPECT_NE(ops[0].executor.find("int8 conv2d"), std::string::npos) << ops[0].executor;
  EXPECT_NE(ops[1].executor.find("fused into conv2d+batch_norm+relu"), std::string::npos) << ops[1].executor;
  // The linear's output parameters are what a converted call's int8 result carries.
  Tensor logits_q;
  {
    ConvertOptions o;
    o.int8_outputs = true;
    Net m2;
    m2.load_state_dict(m.state_dict());
    m2.eval();
    prepare(m2, {x});
    for (int i = 0; i < 4; ++i) m2(randn({2, 3, 6, 6}, 10 + i));
    convert(m2, o);
    logits_q = m2(x);
    EXPECT_EQ(*logits_q.qparams(), *quantized_ops(m2)[5].output_qparams);
  }
}

TEST(Introspection, UnpreparedModelIsAUsageError) {
  Net m;
  EXPECT_THROW_MSG(quantized_ops(m), UsageError, "quantized_ops: Net is not a prepared model");
  EXPECT_THROW_MSG(num_observers(m), UsageError, "num_observers: Net is not a prepared model");
}

}  // namespace
}  // namespace dbrq
