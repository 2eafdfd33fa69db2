// Issue 13, "calibrate fused chains as they will run": the residual digits CNN
// (tests/models/digits_residual.h) quantized by dbrq gives exactly PyTorch FX's int8 logits on
// every test image, for MinMax activations with per-tensor and with per-channel symmetric weights.
//
// References: tests/models/golden/digits_residual_int8.safetensors and the weights in
// samples/data/digits_residual.safetensors, both written by tools/train_digits_residual.py: FX
// (prepare_fx in eval mode, onednn) folds each batch norm into its conv before calibrating, so its
// observers see the folded convs' outputs. dbrq must observe the same values: observing the unfused
// conv -> batch_norm chain moved ranges by a few float ulps and flipped 0.15% of the logits by one
// int8 step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

#include "dbrq.h"
#include "tests/models/digits_residual.h"
#include "tests/test_util.h"

namespace {

using dbrq::Tensor;
using dbrq::testing::DigitsResidual;

constexpr int64_t kCalibBatch = 32;  // tools/train_digits_residual.py CALIB_BATCH

const std::map<std::string, Tensor>& golden() {
  static const auto* g =
      new std::map<std::string, Tensor>(dbrq::testing::load_golden("tests/models/golden/digits_residual_int8.safetensors"));
  return *g;
}
Tensor calib_images() { return dbrq::testing::load_golden("samples/data/digits_calib.safetensors").at("images"); }
Tensor test_images() { return dbrq::testing::load_golden("samples/data/digits_test.safetensors").at("images"); }

std::shared_ptr<DigitsResidual> trained_model() {
  auto m = std::make_shared<DigitsResidual>();
  m->load_state_dict(dbrq::load_safetensors("samples/data/digits_residual.safetensors"), /*strict=*/true);
  m->eval();
  return m;
}

dbrq::QConfigPtr minmax_qconfig(bool per_channel) {
  return dbrq::QConfig::make(dbrq::ObserverSpec::min_max(),
                             per_channel ? dbrq::ObserverSpec::per_channel_min_max()
                                         : dbrq::ObserverSpec::min_max(dbrq::DType::kS8, dbrq::QScheme::kPerTensorSymmetric));
}

dbrq::QConfigMapping mapping(bool per_channel) {
  dbrq::QConfigMapping m;
  m.set_global(minmax_qconfig(per_channel));
  return m;
}

// Calibrates on images [begin, end) of the calibration split in batches of kCalibBatch, in order.
void calibrate(DigitsResidual& model, const Tensor& calib, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += kCalibBatch) {
    model(calib.narrow(0, i, std::min(kCalibBatch, end - i)).contiguous());
  }
}

std::shared_ptr<DigitsResidual> calibrated(bool per_channel) {
  auto m = trained_model();
  const Tensor calib = calib_images();
  dbrq::prepare(*m, {calib.narrow(0, 0, 1).contiguous()}, mapping(per_channel));
  calibrate(*m, calib, 0, calib.size(0));
  return m;
}

// Logits that differ from FX's (exactly: both are int8 codes dequantized with the same scale when
// the parameters agree).
int64_t count_differ(const Tensor& a, const Tensor& b, const std::string& what) {
  EXPECT_EQ(a.sizes(), b.sizes()) << what;
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  int64_t differ = 0;
  float worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (x[i] != y[i]) ++differ;
    worst = std::max(worst, std::fabs(x[i] - y[i]));
  }
  std::cout << "[ digits   ] " << what << ": " << differ << " of " << x.size() << " logits differ from FX (max "
            << worst << ")\n";
  return differ;
}

// Every op's output parameters, for comparing with FX's observers when logits differ.
void print_qparams(const dbrq::nn::Module& model) {
  for (const dbrq::QuantizedOpInfo& op : dbrq::quantized_ops(model)) {
    if (op.output_qparams == nullptr) continue;
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%-28s scale %.9g zero point %d", op.op.c_str(), op.output_qparams->scale(),
                  op.output_qparams->zero_point());
    std::cout << "[ digits   ]   " << op.fqn << " " << buf << "\n";
  }
}

void expect_matches_fx(bool per_channel) {
  auto m = calibrated(per_channel);
  dbrq::convert(*m);
  const Tensor out = (*m)(test_images());
  const char* key = per_channel ? "fx_minmax_per_channel" : "fx_minmax_per_tensor";
  const int64_t differ = count_differ(out, golden().at(key), key);
  EXPECT_EQ(differ, 0);
  if (differ != 0) print_qparams(*m);
}

TEST(DigitsResidual, Fp32MatchesPyTorch) {
  auto m = trained_model();
  dbrq::testing::expect_close((*m)(test_images()), golden().at("fp32"), 1e-4, "fp32 logits");
}

TEST(DigitsResidual, MinMaxPerTensorWeightsMatchFx) { expect_matches_fx(/*per_channel=*/false); }

TEST(DigitsResidual, MinMaxPerChannelWeightsMatchFx) { expect_matches_fx(/*per_channel=*/true); }

// Calibration split over two replicas and merged gives FX's logits too (MinMax merges exactly).
TEST(DigitsResidual, MergedCalibrationMatchesFx) {
  const Tensor calib = calib_images();
  const Tensor example = calib.narrow(0, 0, 1).contiguous();
  auto a = trained_model();
  auto b = trained_model();
  dbrq::prepare(*a, {example}, mapping(false));
  dbrq::prepare(*b, {example}, mapping(false));
  calibrate(*a, calib, 0, 128);
  calibrate(*b, calib, 128, calib.size(0));
  dbrq::merge_calibration(*a, *b);
  dbrq::convert(*a);
  EXPECT_EQ(count_differ((*a)(test_images()), golden().at("fx_minmax_per_tensor"), "merged replicas"), 0);
}

// A saved calibration loaded into a freshly prepared model converts to the same int8 model.
TEST(DigitsResidual, SavedCalibrationMatchesFx) {
  auto m = calibrated(/*per_channel=*/true);
  const std::string path = ::testing::TempDir() + "/digits_residual.qstate.json";
  dbrq::save_quant_state(*m, path);
  auto fresh = trained_model();
  dbrq::prepare(*fresh, {calib_images().narrow(0, 0, 1).contiguous()}, mapping(true));
  dbrq::load_quant_state(*fresh, path);
  dbrq::convert(*fresh);
  EXPECT_EQ(count_differ((*fresh)(test_images()), golden().at("fx_minmax_per_channel"), "loaded quant state"), 0);
  std::remove(path.c_str());
}

// With observers off a calibrating model computes exactly the fp32 model (no folding).
TEST(DigitsResidual, ObserversOffComputesFp32) {
  auto m = calibrated(false);
  const Tensor x = test_images();
  const Tensor want = (*trained_model())(x);
  dbrq::disable_observers(*m);
  const Tensor got = (*m)(x);
  EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
}

}  // namespace
