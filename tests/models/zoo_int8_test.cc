// Issue 12's zoo models (samples/zoo: dcgan_generator, unet, kws_conv1d) quantized to static int8
// against PyTorch FX on the same weights and calibration data, plus their bad inputs.
//
// References: tests/models/golden/<model>_int8.safetensors (make_model_goldens.py): "calib"
// (calibrated on in batches of 8, in order, by both sides), "eval", "fp32" (PyTorch's float64
// output on eval) and "fx" (PyTorch FX's int8 output: prepare_fx / convert_fx with
// get_default_qconfig_mapping("onednn"), except ConvTranspose2d's weights per-tensor as FX 1.13
// refuses per-channel ones; onednn engine). The weights are <model>.safetensors'.
//
// Per model: dbrq's SQNR vs fp32 at least FX's - 0.5 dB, the share of ops running int8 (from
// quantized_ops), and batch sizes other than the calibration's after convert.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/zoo.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace {

using dbrq::Tensor;
using dbrq::testing::sqnr_of;

constexpr int64_t kCalibBatch = 8;  // make_model_goldens.py CALIB_BATCH

struct Int8Golden {
  std::map<std::string, Tensor> t;  // calib, eval, fp32, fx
  std::map<std::string, std::string> meta;
};

Int8Golden load_int8(const std::string& model) {
  const std::string path = "tests/models/golden/" + model + "_int8.safetensors";
  return {dbrq::testing::load_golden(path), dbrq::load_safetensors_metadata(path)};
}

// The tiny model with the fp32 golden's weights, in eval mode.
std::shared_ptr<dbrq::nn::Module> golden_model(const std::string& name) {
  auto m = zoo::find_model(name).make(zoo::Variant::kTiny);
  dbrq::NamedTensors weights;
  for (auto& [k, t] : dbrq::load_safetensors("tests/models/golden/" + name + ".safetensors")) {
    if (k != "input" && k != "output") weights.emplace_back(k, t);
  }
  m->load_state_dict(weights, /*strict=*/true);
  m->eval();
  return m;
}

struct Int8Share {
  int all = 0, int8 = 0;
  std::map<std::string, int> int8_by_op;  // int8 ops by op name ("cat", "conv_transpose2d+batch_norm+relu")
  std::vector<std::string> fp32_ops;  // "fqn op" of the ones that are not int8
};

// Every seen op (fused followers included) counts; an op runs int8 unless its role or its executor
// is fp32.
Int8Share int8_share(const dbrq::nn::Module& m) {
  Int8Share s;
  for (const dbrq::QuantizedOpInfo& op : dbrq::quantized_ops(m)) {
    ++s.all;
    if (op.role != "fp32" && op.executor.rfind("fp32", 0) == std::string::npos) {
      ++s.int8;
      ++s.int8_by_op[op.op];
    } else {
      s.fp32_ops.push_back(op.fqn + " " + op.op + " (" + op.executor + ")");
    }
  }
  return s;
}

struct Converted {
  std::shared_ptr<dbrq::nn::Module> model;
  double sqnr = 0, fx_sqnr = 0;
  Int8Share share;
};

// Prepares with dbrq's default onednn mapping, calibrates on the golden's batches as FX did,
// converts (strict paths: an uncalibrated path throws) and measures on the eval inputs.
Converted convert_and_measure(const std::string& name) {
  const Int8Golden g = load_int8(name);
  const zoo::ModelSpec& spec = zoo::find_model(name);
  Converted c;
  c.model = golden_model(name);
  const Tensor& calib = g.t.at("calib");
  const Tensor& evals = g.t.at("eval");
  const Tensor& fp32 = g.t.at("fp32");
  // fp32 first: the loaded model is PyTorch's on these inputs too.
  dbrq::testing::expect_close(spec.run(*c.model, evals), fp32, 1e-4, name + " fp32 on eval");

  dbrq::prepare(*c.model, {calib.narrow(0, 0, 1).contiguous()}, dbrq::default_qconfig_mapping("onednn"));
  for (int64_t i = 0; i < calib.size(0); i += kCalibBatch) {
    spec.run(*c.model, calib.narrow(0, i, std::min(kCalibBatch, calib.size(0) - i)).contiguous());
  }
  dbrq::ConvertOptions options;
  options.strict_paths = true;
  dbrq::convert(*c.model, options);

  const Tensor out = spec.run(*c.model, evals);
  EXPECT_EQ(out.dtype(), dbrq::DType::kF32);  // the caller gets real values, not codes
  c.sqnr = sqnr_of(out, fp32);
  c.fx_sqnr = sqnr_of(g.t.at("fx"), fp32);
  EXPECT_NEAR(c.fx_sqnr, std::stod(g.meta.at("fx_sqnr_db")), 1e-3);
  c.share = int8_share(*c.model);
  std::cout << "[ int8     ] " << name << ": SQNR vs fp32 dbrq " << c.sqnr << " dB, PyTorch FX " << c.fx_sqnr
            << " dB; int8 ops " << c.share.int8 << "/" << c.share.all << "\n";
  for (const std::string& op : c.share.fp32_ops) std::cout << "[ int8     ]   fp32: " << op << "\n";
  EXPECT_EQ(dbrq::uncalibrated_ops(*c.model), 0);
  return c;
}

// After convert, batch 1 and batch 5 (calibration used 8): sizes follow the batch and each sample's
// int8 result does not depend on the batch it came in (static per-tensor activation parameters).
void expect_batch_change(const std::string& name, dbrq::nn::Module& model) {
  SCOPED_TRACE(name);
  const zoo::ModelSpec& spec = zoo::find_model(name);
  const Tensor x5 = spec.example_input(zoo::Variant::kTiny, 5, /*seed=*/21);
  const Tensor y5 = spec.run(model, x5);
  const Tensor y1 = spec.run(model, x5.narrow(0, 3, 1).contiguous());
  ASSERT_EQ(y5.size(0), 5);
  ASSERT_EQ(y1.size(0), 1);
  dbrq::testing::expect_close(y5.narrow(0, 3, 1), y1, 1e-6, "sample 3 at batch 5 vs batch 1");
}

TEST(ZooInt8, DcganGenerator) {
  Converted c = convert_and_measure("dcgan_generator");
  EXPECT_GE(c.sqnr, c.fx_sqnr - 0.5);
  // 4 transposed convs with their batch norms and ReLUs fused, tanh: everything int8.
  EXPECT_EQ(c.share.int8, c.share.all);
  EXPECT_EQ(c.share.all, 11);
  EXPECT_EQ(c.share.int8_by_op["conv_transpose2d+batch_norm+relu"], 3);
  EXPECT_EQ(c.share.int8_by_op["tanh"], 1);
  expect_batch_change("dcgan_generator", *c.model);
}

TEST(ZooInt8, UNet) {
  Converted c = convert_and_measure("unet");
  EXPECT_GE(c.sqnr, c.fx_sqnr - 0.5);
  // 10 conv+bn+relu chains (3 ops each), 2 max pools, 2 transposed convs, 2 cats, the head conv.
  EXPECT_EQ(c.share.int8, c.share.all);
  EXPECT_EQ(c.share.all, 37);
  EXPECT_EQ(c.share.int8_by_op["conv_transpose2d"], 2);
  EXPECT_EQ(c.share.int8_by_op["cat"], 2);
  EXPECT_EQ(c.share.int8_by_op["conv2d+batch_norm+relu"], 10);
  expect_batch_change("unet", *c.model);
}

TEST(ZooInt8, KwsConv1d) {
  Converted c = convert_and_measure("kws_conv1d");
  EXPECT_GE(c.sqnr, c.fx_sqnr - 0.5);
  // 4 conv1d+bn+relu chains (3 ops each), 2 max_pool1d, adaptive_avg_pool1d, flatten, linear.
  EXPECT_EQ(c.share.int8, c.share.all);
  EXPECT_EQ(c.share.all, 17);
  EXPECT_EQ(c.share.int8_by_op["conv1d+batch_norm+relu"], 4);
  EXPECT_EQ(c.share.int8_by_op["max_pool1d"], 2);
  expect_batch_change("kws_conv1d", *c.model);
}

}  // namespace
