// batch_norm on its own in int8 (issue 12): a batch norm that cannot be folded into a conv (a
// pre-activation block: bn -> relu -> conv, DenseNet's cat -> bn) runs as a per-channel
// multiply-add on codes (QuantRole::kChannelAffine), with a following relu fused as PyTorch's
// quantized::batch_norm2d_relu. Kernel parity with PyTorch is in tests/int8 (goldens) and
// tests/kernels (qnorm_test); here: what prepare / convert decide, accuracy, a batch norm whose
// input stays fp32, statistics changed after convert, BatchNorm1d, and quant-state files.
#include <gtest/gtest.h>

#include <memory>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;

// conv0's output feeds both bn1 and the cat, so bn1 is not folded: bn1 -> relu runs int8 (fused),
// and the cat's output goes through bn2 (int8, no relu) into conv2.
struct PreActNet : nn::CallableModule<PreActNet> {
  PreActNet() {
    conv0 = register_module("conv0", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(8));
    relu1 = register_module("relu1", std::make_shared<nn::ReLUImpl>());
    conv1 = register_module("conv1", std::make_shared<Conv2d>(8, 8, 1));
    bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(16));
    conv2 = register_module("conv2", std::make_shared<Conv2d>(16, 4, 1));
    testing::randomize_bn(*bn1, 5);
    testing::randomize_bn(*bn2, 6);
  }
  Tensor forward(const Tensor& x) {
    const Tensor a = (*conv0)(x);
    const Tensor b = (*conv1)((*relu1)((*bn1)(a)));
    return (*conv2)((*bn2)(cat({a, b}, 1)));
  }
  std::shared_ptr<Conv2d> conv0, conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::ReLUImpl> relu1;
};

std::unique_ptr<PreActNet> make_net() {
  manual_seed(21);
  return std::make_unique<PreActNet>();
}

void calibrate_and_convert(nn::Module& m) {
  testing::calibrate(m, {2, 3, 10, 10}, 8, 100);
  convert(m);
}

const QuantizedOpInfo& find_op(const std::vector<QuantizedOpInfo>& ops, const std::string& fqn, OpKind kind) {
  for (const QuantizedOpInfo& o : ops) {
    if (o.fqn == fqn && o.kind == kind) return o;
  }
  throw std::runtime_error("no op " + fqn);
}

TEST(BatchNormInt8, OnItsOwnAndFusedWithRelu) {
  auto ref = make_net();
  ref->eval();
  auto m = make_net();
  m->eval();
  const Tensor x = randn({2, 3, 10, 10}, 1);
  const Tensor expected = (*ref)(x);
  prepare(*m, {x});
  EXPECT_EQ(testing::display_kinds(testing::state_of(*m)),
            (std::vector<std::string>{"conv2d", "batch_norm+relu", "conv2d", "cat", "batch_norm", "conv2d"}));
  calibrate_and_convert(*m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(*m);
  const QuantizedOpInfo& bn1 = find_op(ops, "bn1", OpKind::kBatchNorm);
  EXPECT_EQ(bn1.role, "channel_affine");
  EXPECT_EQ(bn1.executor, "int8 batch_norm (per-channel multiply-add on codes, relu fused)");
  EXPECT_EQ(bn1.input_dtypes, std::vector<DType>{DType::kU8});
  EXPECT_EQ(bn1.output_dtype, DType::kU8);
  EXPECT_EQ(find_op(ops, "relu1", OpKind::kRelu).executor, "fused into batch_norm+relu");
  const QuantizedOpInfo& bn2 = find_op(ops, "bn2", OpKind::kBatchNorm);
  EXPECT_EQ(bn2.executor, "int8 batch_norm (per-channel multiply-add on codes)");
  ASSERT_NE(bn2.output_qparams, nullptr);
  // Nothing in this net stays fp32.
  for (const QuantizedOpInfo& o : ops) EXPECT_EQ(o.executor.find("fp32"), std::string::npos) << o.fqn << ": " << o.executor;
  const Tensor y = (*m)(x);
  EXPECT_EQ(y.dtype(), DType::kF32);
  EXPECT_GT(testing::sqnr_of(y, expected), 25.0);
}

// The int8 batch norm gives what the same model gives with it in fp32 (the conv / cat around it
// still int8), within the quantization of its output.
TEST(BatchNormInt8, AgreesWithFp32BatchNorm) {
  auto m = make_net();
  m->eval();
  auto f = make_net();
  f->eval();
  const Tensor x = randn({2, 3, 10, 10}, 1);
  QConfigMapping fp32_bn = default_qconfig_mapping("onednn");
  fp32_bn.set_object_type("BatchNorm2d", nullptr);
  prepare(*m, {x});
  prepare(*f, {x}, fp32_bn);
  calibrate_and_convert(*m);
  calibrate_and_convert(*f);
  for (const QuantizedOpInfo& o : quantized_ops(*f)) EXPECT_NE(o.kind, OpKind::kBatchNorm) << o.fqn << " quantized";
  EXPECT_GT(testing::sqnr_of((*m)(x), (*f)(x)), 30.0);
}

// A batch norm whose input is fp32 (the model input) stays fp32, and so does the relu fused
// after it: the relu must still run.
struct InputBn : nn::CallableModule<InputBn> {
  InputBn() {
    bn = register_module("bn", std::make_shared<BatchNorm2d>(3));
    conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 1));
    testing::randomize_bn(*bn, 3);
  }
  Tensor forward(const Tensor& x) { return (*conv)(relu((*bn)(x))); }
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<Conv2d> conv;
};

TEST(BatchNormInt8, Fp32InputKeepsTheChainFp32) {
  manual_seed(4);
  InputBn ref;
  ref.eval();
  manual_seed(4);
  InputBn m;
  m.eval();
  const Tensor x = randn({2, 3, 6, 6}, 2);
  prepare(m, {x});
  calibrate_and_convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  EXPECT_EQ(ops[0].kind, OpKind::kBatchNorm);
  EXPECT_EQ(ops[0].role, "fp32");
  EXPECT_EQ(ops[1].kind, OpKind::kRelu);
  EXPECT_EQ(ops[1].role, "fp32");
  EXPECT_EQ(ops[1].output_dtype, DType::kF32);
  // Without the relu, about half the conv's inputs would be negative: far below this SQNR.
  EXPECT_GT(testing::sqnr_of(m(x), ref(x)), 25.0);
}

// Statistics changed after convert (load_state_dict, or a write through the API) are picked up:
// the per-channel constants are computed again.
TEST(BatchNormInt8, StatisticsChangedAfterConvert) {
  auto m = make_net();
  m->eval();
  auto ref = make_net();
  ref->eval();
  const Tensor x = randn({2, 3, 10, 10}, 1);
  prepare(*m, {x});
  calibrate_and_convert(*m);
  const Tensor before = (*m)(x);
  for (auto* bn : {m->bn2.get(), ref->bn2.get()}) {
    bn->running_mean.copy_(bn->running_mean * 0.5f);
    bn->weight.copy_(bn->weight * 0.8f);
  }
  const Tensor after = (*m)(x);
  EXPECT_LT(testing::sqnr_of(after, before), 30.0) << "the new statistics were not used";
  EXPECT_GT(testing::sqnr_of(after, (*ref)(x)), 20.0);
}

TEST(BatchNormInt8, QuantStateFileRoundTrip) {
  auto m = make_net();
  m->eval();
  const Tensor x = randn({2, 3, 10, 10}, 1);
  prepare(*m, {x});
  testing::calibrate(*m, {2, 3, 10, 10}, 8, 100);
  const std::string path = testing::temp_file("batch_norm_int8.qstate.json");
  save_quant_state(*m, path);
  convert(*m);

  auto loaded = make_net();
  loaded->eval();
  prepare(*loaded, {x});
  load_quant_state(*loaded, path);
  convert(*loaded);
  EXPECT_EQ(find_op(quantized_ops(*loaded), "bn1", OpKind::kBatchNorm).role, "channel_affine");
  testing::expect_equal((*loaded)(x), (*m)(x), "converted after loading the quant state");
}

// BatchNorm1d on [N, C] (after flatten) and [N, C, L] runs int8 too.
struct Bn1dNet : nn::CallableModule<Bn1dNet> {
  Bn1dNet() {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 6, 3, 1, 1));
    bn_ncl = register_module("bn_ncl", std::make_shared<nn::BatchNorm1dImpl>(6));
    bn_nc = register_module("bn_nc", std::make_shared<nn::BatchNorm1dImpl>(6 * 16));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(6 * 16, 5));
    manual_seed(8);
    for (auto* bn : {bn_ncl.get(), bn_nc.get()}) {
      const int64_t c = bn->num_features();
      bn->running_mean.copy_(randn({c}, 30 + c) * 0.3f);
      bn->running_var.copy_(randn({c}, 31 + c) * randn({c}, 31 + c) + 0.5f);
      bn->weight.copy_(randn({c}, 32 + c) * 0.2f + 1.0f);
    }
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);                                   // [N, 6, 4, 4]
    y = (*bn_ncl)(relu(y).reshape({x.size(0), 6, 16}));      // [N, C, L]
    return (*fc)((*bn_nc)(flatten(y, 1)));                   // [N, C]
  }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<nn::BatchNorm1dImpl> bn_ncl, bn_nc;
  std::shared_ptr<nn::LinearImpl> fc;
};

TEST(BatchNormInt8, BatchNorm1d) {
  Bn1dNet ref, m;
  ref.eval();
  m.eval();
  m.load_state_dict(ref.state_dict());
  const Tensor x = randn({4, 3, 4, 4}, 3);
  prepare(m, {x});
  testing::calibrate(m, {4, 3, 4, 4}, 8, 200);
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  for (const char* fqn : {"bn_ncl", "bn_nc"}) {
    const QuantizedOpInfo& bn = find_op(ops, fqn, OpKind::kBatchNorm);
    EXPECT_EQ(bn.role, "channel_affine") << fqn;
    EXPECT_EQ(bn.output_dtype, DType::kU8) << fqn;
  }
  EXPECT_GT(testing::sqnr_of(m(x), ref(x)), 25.0);
}

}  // namespace
}  // namespace dbrq
