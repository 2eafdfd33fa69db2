// layer_norm, group_norm and instance_norm in int8 (issue 12, item 2): on an int8 input they run
// on codes (QuantRole::kNormalize, kernels/int8_normalize.cc) with their own output observer, as
// PyTorch FX 1.13 lowers nn.LayerNorm / nn.InstanceNorm2d to quantized::layer_norm /
// quantized::instance_norm. Kernel parity with PyTorch is in tests/int8 (int8_norms_golden_test);
// here: what prepare / convert decide, accuracy against the same model with the norms in fp32, a
// norm whose input is fp32, weights changed after convert, the mapping switching them off, and
// quant-state files.
#include <gtest/gtest.h>

#include <memory>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

struct TokenNet : nn::CallableModule<TokenNet> {
  TokenNet() {
    fc1 = register_module("fc1", std::make_shared<nn::LinearImpl>(16, 32));
    ln = register_module("ln", std::make_shared<nn::LayerNormImpl>(32));
    fc2 = register_module("fc2", std::make_shared<nn::LinearImpl>(32, 8));
    ln->weight = randn({32}, 3) * 0.3 + 1.0;
    ln->bias = randn({32}, 4) * 0.2;
  }
  Tensor forward(const Tensor& x) { return (*fc2)((*ln)((*fc1)(x))); }
  std::shared_ptr<nn::LinearImpl> fc1, fc2;
  std::shared_ptr<nn::LayerNormImpl> ln;
};

struct ImageNet : nn::CallableModule<ImageNet> {
  ImageNet() {
    conv0 = register_module("conv0", std::make_shared<nn::Conv2dImpl>(3, 8, 3, 1, 1));
    gn = register_module("gn", std::make_shared<nn::GroupNormImpl>(4, 8));
    in = register_module("in", std::make_shared<nn::InstanceNorm2dImpl>(8, 1e-5, 0.1, /*affine=*/true));
    conv1 = register_module("conv1", std::make_shared<nn::Conv2dImpl>(8, 4, 1));
    gn->weight = randn({8}, 5) * 0.3 + 1.0;
    gn->bias = randn({8}, 6) * 0.2;
    in->weight = randn({8}, 7) * 0.3 + 1.0;
    in->bias = randn({8}, 8) * 0.2;
  }
  Tensor forward(const Tensor& x) { return (*conv1)((*in)((*gn)((*conv0)(x)))); }
  std::shared_ptr<nn::Conv2dImpl> conv0, conv1;
  std::shared_ptr<nn::GroupNormImpl> gn;
  std::shared_ptr<nn::InstanceNorm2dImpl> in;
};

template <typename M>
std::unique_ptr<M> make(uint64_t seed) {
  manual_seed(seed);
  return std::make_unique<M>();
}

const QuantizedOpInfo& find_op(const std::vector<QuantizedOpInfo>& ops, const std::string& fqn, OpKind kind) {
  for (const QuantizedOpInfo& o : ops) {
    if (o.fqn == fqn && o.kind == kind) return o;
  }
  throw std::runtime_error("no op " + fqn);
}

void expect_int8_norm(const std::vector<QuantizedOpInfo>& ops, const std::string& fqn, OpKind kind,
                      const std::string& executor) {
  const QuantizedOpInfo& o = find_op(ops, fqn, kind);
  EXPECT_EQ(o.role, "normalize") << fqn;
  EXPECT_EQ(o.executor, executor) << fqn;
  EXPECT_EQ(o.input_dtypes, std::vector<DType>{DType::kU8}) << fqn;
  EXPECT_EQ(o.output_dtype, DType::kU8) << fqn;
  ASSERT_NE(o.output_qparams, nullptr) << fqn;
  ASSERT_FALSE(o.input_qparams.empty()) << fqn;
  ASSERT_NE(o.input_qparams[0], nullptr) << fqn;
  // Its own observer: not its input's parameters.
  EXPECT_FALSE(*o.output_qparams == *o.input_qparams[0]) << fqn;
}

TEST(Int8Norms, LayerNormRunsOnCodes) {
  auto ref = make<TokenNet>(31);
  auto m = make<TokenNet>(31);
  const Tensor x = randn({2, 5, 16}, 1);
  const Tensor expected = (*ref)(x);
  prepare(*m, {x});
  EXPECT_EQ(testing::display_kinds(testing::state_of(*m)),
            (std::vector<std::string>{"linear", "layer_norm", "linear"}));
  testing::calibrate(*m, {2, 5, 16}, 8, 100);
  convert(*m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(*m);
  expect_int8_norm(ops, "ln", OpKind::kLayerNorm, "int8 layer_norm (statistics of the codes)");
  for (const QuantizedOpInfo& o : ops) EXPECT_EQ(o.executor.find("fp32"), std::string::npos) << o.fqn << ": " << o.executor;
  EXPECT_GT(testing::sqnr_of((*m)(x), expected), 25.0);
}

TEST(Int8Norms, GroupAndInstanceNormRunOnCodes) {
  auto ref = make<ImageNet>(32);
  auto m = make<ImageNet>(32);
  const Tensor x = randn({2, 3, 10, 10}, 1);
  const Tensor expected = (*ref)(x);
  prepare(*m, {x});
  EXPECT_EQ(testing::display_kinds(testing::state_of(*m)),
            (std::vector<std::string>{"conv2d", "group_norm", "instance_norm", "conv2d"}));
  testing::calibrate(*m, {2, 3, 10, 10}, 8, 100);
  convert(*m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(*m);
  expect_int8_norm(ops, "gn", OpKind::kGroupNorm, "int8 group_norm (statistics of the codes)");
  expect_int8_norm(ops, "in", OpKind::kInstanceNorm, "int8 instance_norm (statistics of the codes)");
  for (const QuantizedOpInfo& o : ops) EXPECT_EQ(o.executor.find("fp32"), std::string::npos) << o.fqn << ": " << o.executor;
  EXPECT_GT(testing::sqnr_of((*m)(x), expected), 25.0);
}

// The int8 norms give what the same model gives with them in fp32 (everything else int8), within
// the quantization of their outputs; the mapping switches them off by layer class.
TEST(Int8Norms, AgreeWithFp32NormsAndMappingSwitchesThemOff) {
  auto m = make<ImageNet>(33);
  auto f = make<ImageNet>(33);
  const Tensor x = randn({2, 3, 10, 10}, 1);
  QConfigMapping fp32_norms = default_qconfig_mapping("onednn");
  fp32_norms.set_object_type("GroupNorm", nullptr);
  fp32_norms.set_object_type("InstanceNorm2d", nullptr);
  prepare(*m, {x});
  prepare(*f, {x}, fp32_norms);
  for (nn::Module* model : {static_cast<nn::Module*>(m.get()), static_cast<nn::Module*>(f.get())}) {
    testing::calibrate(*model, {2, 3, 10, 10}, 8, 100);
    convert(*model);
  }
  for (const QuantizedOpInfo& o : quantized_ops(*f)) {
    EXPECT_TRUE(o.kind != OpKind::kGroupNorm && o.kind != OpKind::kInstanceNorm) << o.fqn << " quantized";
  }
  EXPECT_GT(testing::sqnr_of((*m)(x), (*f)(x)), 28.0);
}

// A layer_norm on the model's fp32 input has no int8 input: it stays fp32 and is still right.
struct InputLn : nn::CallableModule<InputLn> {
  InputLn() {
    ln = register_module("ln", std::make_shared<nn::LayerNormImpl>(16));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(16, 4));
  }
  Tensor forward(const Tensor& x) { return (*fc)((*ln)(x)); }
  std::shared_ptr<nn::LayerNormImpl> ln;
  std::shared_ptr<nn::LinearImpl> fc;
};

TEST(Int8Norms, Fp32InputStaysFp32) {
  auto ref = make<InputLn>(34);
  auto m = make<InputLn>(34);
  const Tensor x = randn({3, 16}, 2);
  prepare(*m, {x});
  testing::calibrate(*m, {3, 16}, 4, 100);
  convert(*m);
  for (const QuantizedOpInfo& o : quantized_ops(*m)) {
    if (o.kind == OpKind::kLayerNorm) EXPECT_EQ(o.executor.rfind("fp32", 0), 0u) << o.executor;
  }
  EXPECT_GT(testing::sqnr_of((*m)(x), (*ref)(x)), 20.0);
}

// The converted op reads the layer's weight and bias at each call: changing them after convert
// changes the output as the fp32 model's changes.
TEST(Int8Norms, WeightsChangedAfterConvertAreUsed) {
  auto ref = make<TokenNet>(35);
  auto m = make<TokenNet>(35);
  const Tensor x = randn({2, 5, 16}, 1);
  prepare(*m, {x});
  testing::calibrate(*m, {2, 5, 16}, 8, 100);
  convert(*m);
  const Tensor before = (*m)(x);
  m->ln->bias.copy_(m->ln->bias + 0.5);
  ref->ln->bias.copy_(ref->ln->bias + 0.5);
  const Tensor after = (*m)(x);
  EXPECT_GT(testing::relative_error(after, before), 1e-3);
  EXPECT_GT(testing::sqnr_of(after, (*ref)(x)), 20.0);
}

// A quant-state file records the role; a model loaded from it converts to the same program.
TEST(Int8Norms, QuantStateFileRoundTrip) {
  auto m = make<ImageNet>(36);
  auto loaded = make<ImageNet>(36);
  const Tensor x = randn({2, 3, 10, 10}, 1);
  prepare(*m, {x});
  testing::calibrate(*m, {2, 3, 10, 10}, 8, 100);
  const std::string path = testing::temp_file("int8_norms.qstate.json");
  save_quant_state(*m, path);
  EXPECT_NE(testing::read_text(path).find("\"normalize\""), std::string::npos);
  prepare(*loaded, {x});
  load_quant_state(*loaded, path);
  convert(*m);
  convert(*loaded);
  testing::expect_equal((*loaded)(x), (*m)(x));
  EXPECT_EQ(find_op(quantized_ops(*loaded), "gn", OpKind::kGroupNorm).role, "normalize");
}

}  // namespace
}  // namespace dbrq
