// The other chains PyTorch FX folds a batch norm into before calibrating (issue 13): linear +
// batch_norm1d + relu and conv1d + batch_norm1d + relu. dbrq calibrated with the same qconfig
// (MinMax u8 activations, per-tensor symmetric s8 weights) on the same batches gives exactly FX's
// int8 outputs. References: tests/quant/golden/fold_chains_fx.safetensors (make_fold_goldens.py).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace {

using dbrq::Tensor;
namespace nn = dbrq::nn;

constexpr int64_t kCalibBatch = 16;  // make_fold_goldens.py CALIB_BATCH

struct LinearBn : nn::CallableModule<LinearBn> {
  LinearBn() {
    fc1 = register_module("fc1", std::make_shared<nn::LinearImpl>(12, 16));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm1dImpl>(16));
    relu1 = register_module("relu1", std::make_shared<nn::ReLUImpl>());
    fc2 = register_module("fc2", std::make_shared<nn::LinearImpl>(16, 5));
  }
  Tensor forward(const Tensor& x) { return (*fc2)((*relu1)((*bn1)((*fc1)(x)))); }
  std::shared_ptr<nn::LinearImpl> fc1, fc2;
  std::shared_ptr<nn::BatchNorm1dImpl> bn1;
  std::shared_ptr<nn::ReLUImpl> relu1;
};

struct Conv1dBn : nn::CallableModule<Conv1dBn> {
  Conv1dBn() {
    conv1 = register_module("conv1", std::make_shared<nn::Conv1dImpl>(nn::Conv1dOptions(4, 8, 3).padding(1)));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm1dImpl>(8));
    relu1 = register_module("relu1", std::make_shared<nn::ReLUImpl>());
    conv2 = register_module("conv2", std::make_shared<nn::Conv1dImpl>(nn::Conv1dOptions(8, 6, 3)));
  }
  Tensor forward(const Tensor& x) { return (*conv2)((*relu1)((*bn1)((*conv1)(x)))); }
  std::shared_ptr<nn::Conv1dImpl> conv1, conv2;
  std::shared_ptr<nn::BatchNorm1dImpl> bn1;
  std::shared_ptr<nn::ReLUImpl> relu1;
};

const std::map<std::string, Tensor>& golden() {
  static const auto* g =
      new std::map<std::string, Tensor>(dbrq::testing::load_golden("tests/quant/golden/fold_chains_fx.safetensors"));
  return *g;
}

template <typename M>
void expect_matches_fx(const std::string& name, const std::string& chain) {
  M m;
  dbrq::NamedTensors weights;
  for (const auto& [k, t] : golden()) {
    if (k.rfind(name + ".", 0) == 0) {
      const std::string key = k.substr(name.size() + 1);
      if (key != "calib" && key != "eval" && key != "fx") weights.emplace_back(key, t);
    }
  }
  m.load_state_dict(weights, /*strict=*/true);
  m.eval();
  const Tensor calib = golden().at(name + ".calib");
  dbrq::QConfigMapping mapping;
  mapping.set_global(dbrq::QConfig::make(dbrq::ObserverSpec::min_max(),
                                         dbrq::ObserverSpec::min_max(dbrq::DType::kS8, dbrq::QScheme::kPerTensorSymmetric)));
  dbrq::prepare(m, {calib.narrow(0, 0, 1).contiguous()}, mapping);
  for (int64_t i = 0; i < calib.size(0); i += kCalibBatch) m(calib.narrow(0, i, kCalibBatch).contiguous());
  dbrq::convert(m);
  bool fused = false;
  for (const dbrq::QuantizedOpInfo& op : dbrq::quantized_ops(m)) fused = fused || op.op == chain;
  EXPECT_TRUE(fused) << "no " << chain << " chain";
  const Tensor out = m(golden().at(name + ".eval"));
  const std::vector<float> got = out.to_vector<float>(), want = golden().at(name + ".fx").to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  int64_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
  std::cout << "[ fold     ] " << name << ": " << differ << " of " << got.size() << " outputs differ from FX\n";
  EXPECT_EQ(differ, 0);
}

TEST(FoldChainsFx, LinearBatchNorm1dRelu) { expect_matches_fx<LinearBn>("linear_bn", "linear+batch_norm+relu"); }

TEST(FoldChainsFx, Conv1dBatchNorm1dRelu) { expect_matches_fx<Conv1dBn>("conv1d_bn", "conv1d+batch_norm+relu"); }

}  // namespace
