// The zoo's GRU classifier (samples/zoo/gru_classifier.h) beyond its fp32 golden
// (models_golden_test): fp32 against PyTorch on batches of other sizes and lengths, dynamic int8
// against fp32 and against PyTorch's quantize_dynamic, static int8 calibrated at one padded width
// and run at others, and bad inputs.
//
// References: tests/models/golden/gru_classifier_int8.safetensors (make_model_goldens.py), six
// token-id batches (batch 1 to 16, padded widths 5 to 40, one with equal lengths, one with a row
// whose first 0 is followed by tokens), each with the float64 result and PyTorch's
// quantize_dynamic(model, dtype=torch.qint8) result; the weights are gru_classifier.safetensors'.
//
// Every quantized model here is converted with ConvertOptions::strict_paths: a batch whose size or
// lengths took an op calibration never ran would throw instead of running that op in fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/zoo.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace {

using dbrq::Tensor;
using dbrq::testing::sqnr_of;

constexpr int kBatches = 6;

std::shared_ptr<zoo::GruClassifier> golden_model() {
  auto m = std::make_shared<zoo::GruClassifier>(zoo::gru_classifier_config(zoo::Variant::kTiny));
  dbrq::NamedTensors weights;
  for (auto& [k, t] : dbrq::load_safetensors("tests/models/golden/gru_classifier.safetensors")) {
    if (k != "input" && k != "output") weights.emplace_back(k, t);
  }
  m->load_state_dict(weights, /*strict=*/true);
  m->eval();
  return m;
}

const std::map<std::string, Tensor>& refs() {
  static const auto* g = new std::map<std::string, Tensor>(
      dbrq::testing::load_golden("tests/models/golden/gru_classifier_int8.safetensors"));
  return *g;
}
Tensor ref(const std::string& name, int k) { return dbrq::testing::golden(refs(), name + "_" + std::to_string(k)); }

// Calibration batches: the zoo's example inputs (8 sequences padded to 12 tokens, lengths 3..12).
std::vector<Tensor> calibration_batches() {
  std::vector<Tensor> out;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    out.push_back(zoo::find_model("gru_classifier").example_input(zoo::Variant::kTiny, 8, 100 + seed));
  }
  return out;
}

// How many records of `kind` the converted model has, and how many of them run int8.
std::pair<int, int> count_int8(const dbrq::nn::Module& m, dbrq::OpKind kind) {
  int all = 0, int8 = 0;
  for (const dbrq::QuantizedOpInfo& op : dbrq::quantized_ops(m)) {
    if (op.kind != kind) continue;
    ++all;
    if (op.role != "fp32" && op.executor.rfind("fp32", 0) == std::string::npos) ++int8;
  }
  return {all, int8};
}

dbrq::ConvertOptions strict() {
  dbrq::ConvertOptions o;
  o.strict_paths = true;
  return o;
}

TEST(GruClassifier, Fp32MatchesPyTorchAtOtherLengths) {
  auto model = golden_model();
  for (int k = 0; k < kBatches; ++k) {
    const Tensor ids = ref("ids", k);
    SCOPED_TRACE(ids.shape_string());
    const Tensor out = (*model)(ids);
    dbrq::testing::expect_close(out, ref("fp32", k), 1e-4);
    std::cout << "[ fp32     ] ids " << ids.shape_string() << ": max relative error vs PyTorch "
              << dbrq::testing::relative_error(out, ref("fp32", k)) << "\n";
  }
  // The row with a 0 at position 2 is a sequence of length 2: what follows its first 0 is ignored.
  const Tensor ids = ref("ids", 3);
  EXPECT_EQ(zoo::GruClassifier::lengths_of(ids)[0], 2);
  EXPECT_NE(ids.at<int64_t>({0, 3}), 0);
}

// Dynamic int8 (the zoo header's recipe): one preparing call, nothing to calibrate. The four GRU
// products and the head are dynamic int8 linears, everything else stays fp32, at every batch.
TEST(GruClassifier, DynamicInt8) {
  auto model = golden_model();
  dbrq::prepare(*model, {ref("ids", 0)}, dbrq::default_dynamic_qconfig_mapping());
  dbrq::convert(*model, strict());
  int linears = 0;
  for (const dbrq::QuantizedOpInfo& op : dbrq::quantized_ops(*model)) {
    if (op.kind == dbrq::OpKind::kLinear) {
      ++linears;
      EXPECT_TRUE(op.dynamic) << op.fqn;
    } else {
      EXPECT_EQ(op.role, "fp32") << op.op;
    }
  }
  EXPECT_EQ(linears, 5);  // weight_ih_l0, weight_hh_l0, weight_ih_l1, weight_hh_l1, classifier
  double worst = 1e9, worst_torch = 1e9;
  for (int k = 0; k < kBatches; ++k) {
    const Tensor ids = ref("ids", k);
    const Tensor out = (*model)(ids);
    const double s = sqnr_of(out, ref("fp32", k)), t = sqnr_of(ref("torch_dyn", k), ref("fp32", k));
    worst = std::min(worst, s);
    worst_torch = std::min(worst_torch, t);
    EXPECT_GT(s, 38.0) << ids.shape_string();
    std::cout << "[ dynamic  ] ids " << ids.shape_string() << ": dbrq vs fp32 " << s
              << " dB; PyTorch quantize_dynamic vs fp32 " << t << " dB; dbrq vs quantize_dynamic "
              << sqnr_of(out, ref("torch_dyn", k)) << " dB\n";
  }
  EXPECT_EQ(dbrq::uncalibrated_ops(*model), 0);
  // dbrq quantizes activations to 8 bits per call (PyTorch's onednn quantize_dynamic to 7, with
  // per-tensor weights): at least as close to fp32 on the worst batch.
  EXPECT_GT(worst, worst_torch);
  std::cout << "[ dynamic  ] worst: dbrq " << worst << " dB, quantize_dynamic " << worst_torch << " dB\n";
}

// Static int8 (default_qconfig_mapping): calibrated on batches of 8 padded to 12 tokens, run on
// batches of 1 to 16 padded to 5 to 40 tokens. GRU's batch plumbing records nothing, so every
// batch runs the calibrated ops: every product, gate activation, add and product of the GRU int8.
TEST(GruClassifier, StaticInt8AtOtherLengths) {
  auto model = golden_model();
  const std::vector<Tensor> calib = calibration_batches();
  dbrq::prepare(*model, {calib[0]}, dbrq::default_qconfig_mapping("onednn"));
  for (const Tensor& ids : calib) (*model)(ids);
  dbrq::convert(*model, strict());
  // The GRU's projections and the head run int8; its gate arithmetic fp32 (the default mapping's
  // entries for "GRU": int8 gates cost 5-7 dB here, docs/recurrent.md).
  const auto [linears, int8_linears] = count_int8(*model, dbrq::OpKind::kLinear);
  EXPECT_EQ(linears, 5);
  EXPECT_EQ(int8_linears, 5);
  for (dbrq::OpKind kind : {dbrq::OpKind::kSigmoid, dbrq::OpKind::kTanh, dbrq::OpKind::kMul, dbrq::OpKind::kAdd}) {
    EXPECT_EQ(count_int8(*model, kind).second, 0) << dbrq::op_name(kind);
  }
  double worst = 1e9;
  for (int k = 0; k < kBatches; ++k) {
    const Tensor ids = ref("ids", k);
    const double s = sqnr_of((*model)(ids), ref("fp32", k));
    worst = std::min(worst, s);
    EXPECT_GT(s, 30.0) << ids.shape_string();
    std::cout << "[ static   ] ids " << ids.shape_string() << ": dbrq vs fp32 " << s << " dB\n";
  }
  for (const Tensor& ids : calib) worst = std::min(worst, sqnr_of((*model)(ids), (*golden_model())(ids)));
  EXPECT_EQ(dbrq::uncalibrated_ops(*model), 0);
  std::cout << "[ static   ] worst " << worst << " dB (calibration batches included)\n";
}

// Bad inputs: the type and message in the fp32 model, the prepared one and the converted one, and
// the model still gives the same result afterwards.
void expect_bad_inputs_rejected(zoo::GruClassifier& model, const char* stage) {
  SCOPED_TRACE(stage);
  const Tensor good = ref("ids", 5);
  const Tensor before = model(good);
  EXPECT_THROW_MSG(model(dbrq::zeros({2, 5})), dbrq::ValueError,
                   "GruClassifier: expected [batch, steps] s64 token ids, got [2, 5] f32");
  EXPECT_THROW_MSG(model(dbrq::from_vector(std::vector<int64_t>{1, 2, 3}, {3})), dbrq::ValueError,
                   "GruClassifier: expected [batch, steps] s64 token ids, got [3] s64");
  EXPECT_THROW_MSG(model(dbrq::from_vector(std::vector<int64_t>{4, 5, 0, 0, 7, 8}, {2, 3})), dbrq::ValueError,
                   "GruClassifier: sequence 1 is empty (its first token is the padding id 0)");
  EXPECT_THROW_MSG(model(dbrq::from_vector(std::vector<int64_t>{4, 50, 0}, {1, 3})), dbrq::IndexError, "embedding");
  EXPECT_THROW_MSG(model(dbrq::from_vector(std::vector<int64_t>{4, -1, 0}, {1, 3})), dbrq::IndexError, "embedding");
  dbrq::testing::expect_equal(model(good), before, "after the errors");
}

TEST(GruClassifier, BadInputs) {
  auto model = golden_model();
  expect_bad_inputs_rejected(*model, "fp32");
  const std::vector<Tensor> calib = calibration_batches();
  dbrq::prepare(*model, {calib[0]}, dbrq::default_qconfig_mapping("onednn"));
  expect_bad_inputs_rejected(*model, "prepared");
  for (const Tensor& ids : calib) (*model)(ids);
  dbrq::convert(*model, strict());
  expect_bad_inputs_rejected(*model, "converted");
  EXPECT_EQ(dbrq::uncalibrated_ops(*model), 0);
}

}  // namespace
