// End to end against PyTorch FX (prepare_fx / convert_fx, onednn engine): the zoo's SmallCnn and
// tiny ResNet-18 with the same weights, the same calibration data and the same observer kinds as
// FX (tests/int8/golden/e2e_*.safetensors, written by make_int8_goldens.py).
//
// SmallCnn, MinMax activations and per-channel symmetric MinMax weights (deterministic qparams):
// dbrq's int8 logits (u8 codes before the final dequantize) must equal FX's, at most 1 LSB off on
// at most 0.1% of them. The graphs must do the same things: FX's converted code quantizes the
// input once, runs conv1+bn1+relu1, conv2+bn2+relu2 and conv3+relu3 as fused int8 convs, keeps
// max_pool2d, adaptive_avg_pool2d and flatten on int8 with shared qparams, runs fc in int8 and
// dequantizes only the logits; dbrq's converted state must show the same plan and the same qparams.
//
// ResNet-18 (base width 8), FX's default onednn mapping (HistogramObserver activations): the SQNR
// of dbrq's logits against fp32 must be at least FX's minus 0.5 dB.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dbrq.h"
#include "kernels/simd.h"
#include "samples/zoo/zoo.h"
#include "tests/test_util.h"

namespace {

using dbrq::DType;
using dbrq::QuantParamsPtr;
using dbrq::Tensor;

struct E2eGolden {
  dbrq::NamedTensors weights;  // state-dict entries (stored as F16 values, loaded as f32)
  std::map<std::string, Tensor> other;
  std::map<std::string, std::string> meta;
};

E2eGolden load_e2e(const std::string& name) {
  const std::string path = "tests/int8/golden/" + name + ".safetensors";
  E2eGolden g;
  for (auto& [k, t] : dbrq::load_safetensors(path)) {
    const bool data = k == "calib_codes" || k == "eval_codes" || k.rfind("fp32_", 0) == 0 || k.rfind("fx_", 0) == 0;
    if (data) {
      g.other[k] = t;
    } else {
      g.weights.emplace_back(k, t);
    }
  }
  g.meta = dbrq::load_safetensors_metadata(path);
  return g;
}

// (code - 128) / 32, rows [begin, end) of a [N, C, H, W] u8 code tensor: exact in f32, as the script.
Tensor images(const Tensor& codes, int64_t begin, int64_t end) {
  std::vector<int64_t> sizes(codes.sizes().begin(), codes.sizes().end());
  const int64_t per = codes.numel() / sizes[0];
  sizes[0] = end - begin;
  Tensor x = Tensor::empty(sizes, DType::kF32);
  const std::vector<int32_t> c = codes.to_vector<int32_t>();
  float* p = x.mutable_data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] = (static_cast<float>(c[begin * per + i]) - 128.f) / 32.f;
  return x;
}

// Calibration exactly as the script feeds FX: batches of 8 in file order (histograms depend on it).
template <typename M>
void calibrate(M& model, const Tensor& codes) {
  for (int64_t i = 0; i < codes.size(0); i += 8) model(images(codes, i, std::min<int64_t>(i + 8, codes.size(0))));
}

double sqnr(const Tensor& ref, const Tensor& x) { return dbrq::sqnr_db(ref, x); }

// The parameters convert() chose for every int8 tensor, keyed by "<layer fqn>:in" / "<layer fqn>:out"
// (a fused chain's output under its base layer), and the plan, one line per seen op.
struct DbrqPlan {
  std::map<std::string, std::pair<float, int32_t>> qparams;
  std::map<std::string, int64_t> tensor_ids;
  std::vector<std::string> ops;  // "conv1 conv2d+batch_norm+relu: int8 conv2d ..."
};

DbrqPlan plan_of(const dbrq::nn::Module& model) {
  DbrqPlan p;
  dbrq::ModelQuantState& m = dbrq::model_quant_state(model);
  auto qp = [&](int64_t id) -> std::pair<float, int32_t> {
    const auto* r = m.tensor(id);
    if (r == nullptr || r->slot < 0) return {0.f, -1};
    const QuantParamsPtr& q = m.slot(r->slot).qparams;
    return q ? std::make_pair(q->scale(), q->zero_point()) : std::make_pair(0.f, -1);
  };
  for (auto& [state, index] : m.execution_order()) {
    const dbrq::SeenOpInfo& op = state->seen_ops()[index];
    const std::string what = op.fusion.fused() ? op.fusion.name() : std::string(dbrq::op_name(op.kind));
    if (op.fusion.fused() && op.fusion.position > 0) continue;
    p.ops.push_back(op.fqn + " " + what + ": " + (op.executor ? op.executor->describe() : "none"));
    if (!op.inputs.empty()) {
      p.qparams[op.fqn + ":in"] = qp(op.inputs[0].id);
      p.tensor_ids[op.fqn + ":in"] = op.inputs[0].id;
    }
    int64_t out = op.outputs[0].id;
    if (op.fusion.fused()) out = state->seen_ops()[op.fusion.base + op.fusion.pattern.size() - 1].outputs[0].id;
    p.qparams[op.fqn + ":out"] = qp(out);
    p.tensor_ids[op.fqn + ":out"] = out;
  }
  return p;
}

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t pos = s.find(needle); pos != std::string::npos; pos = s.find(needle, pos + 1)) ++n;
  return n;
}

// Overwrites the range of the MinMax observer behind `key` ("conv2:out") with FX's.
void set_observed_range(dbrq::nn::Module& model, const DbrqPlan& plan, const std::string& key,
                        const std::vector<float>& range) {
  dbrq::ModelQuantState& m = dbrq::model_quant_state(model);
  const int64_t id = plan.tensor_ids.at(key);
  const auto* r = m.tensor(id);
  ASSERT_TRUE(r != nullptr && r->slot >= 0) << key;
  dbrq::Observer& obs = m.observer(r->slot);
  dbrq::Observer::Stats st = obs.stats();
  for (auto& [field, values] : st.fields) {
    if (field == "min") values = {range[0]};
    if (field == "max") values = {range[1]};
  }
  obs.load_stats(st);
}

struct SmallCnnRun {
  std::shared_ptr<zoo::SmallCnn> model;
  DbrqPlan plan;
  Tensor logits;  // u8 codes
};

// Loads the golden weights, prepares with FX's observers, calibrates on the golden batches,
// optionally replaces the observed ranges with FX's, converts with int8 outputs and runs the
// evaluation images.
SmallCnnRun run_small_cnn(const E2eGolden& g, bool fx_ranges) {
  SmallCnnRun r;
  r.model = std::make_shared<zoo::SmallCnn>(zoo::small_cnn_config(zoo::Variant::kTiny));
  r.model->load_state_dict(g.weights, /*strict=*/true);
  r.model->eval();
  const Tensor& calib = g.other.at("calib_codes");
  dbrq::QConfigMapping mapping;
  mapping.set_global(dbrq::QConfig::make(dbrq::ObserverSpec::min_max(), dbrq::ObserverSpec::per_channel_min_max()));
  dbrq::prepare(*r.model, {images(calib, 0, 1)}, mapping);
  calibrate(*r.model, calib);
  if (fx_ranges) {
    const DbrqPlan before = plan_of(*r.model);
    for (auto [key, fx_node] : std::vector<std::pair<std::string, std::string>>{
             {"conv1:in", "x"}, {"conv1:out", "conv1"}, {"conv2:out", "conv2"}, {"conv3:out", "conv3"},
             {"fc:out", "fc"}}) {
      set_observed_range(*r.model, before, key, g.other.at("fx_range." + fx_node).to_vector<float>());
    }
  }
  dbrq::ConvertOptions options;
  options.int8_outputs = true;  // the logits' u8 codes, before any dequantize
  dbrq::convert(*r.model, options);
  r.plan = plan_of(*r.model);
  const Tensor& evals = g.other.at("eval_codes");
  r.logits = (*r.model)(images(evals, 0, evals.size(0)));
  return r;
}

struct LsbStats {
  int64_t n = 0, identical = 0, off1 = 0, worse = 0;
  double max_lsb = 0;
};

// dbrq's int8 logits against FX's, in LSBs of FX's output scale (code differences when the
// scales agree).
LsbStats compare_logits(const Tensor& q, const E2eGolden& g, const std::string& label) {
  const Tensor& fx_codes = g.other.at("fx_codes");
  const float fx_scale = g.other.at("fx_scale").item<float>();
  const int32_t fx_zp = g.other.at("fx_zp").item<int32_t>();
  LsbStats s;
  EXPECT_EQ(q.dtype(), DType::kU8);
  EXPECT_TRUE(q.is_quantized());
  EXPECT_EQ(q.sizes(), fx_codes.sizes());
  if (!q.is_quantized() || q.sizes() != fx_codes.sizes()) return s;
  const std::vector<int32_t> a = dbrq::testing::codes(q), e = dbrq::testing::codes(fx_codes);
  for (size_t i = 0; i < a.size(); ++i) {
    const double da = (a[i] - q.q_zero_point()) * static_cast<double>(q.q_scale());
    const double de = (e[i] - fx_zp) * static_cast<double>(fx_scale);
    const double lsb = std::abs(da - de) / fx_scale;
    s.max_lsb = std::max(s.max_lsb, lsb);
    s.identical += lsb <= 0.5;
    s.off1 += lsb > 0.5 && lsb <= 1.5;
    s.worse += lsb > 1.5;
  }
  s.n = static_cast<int64_t>(a.size());
  std::cout << "[ e2e      ] " << label << ": " << s.identical << "/" << s.n << " identical ("
            << std::setprecision(5) << 100.0 * s.identical / s.n << "%), " << s.off1 << " off by 1 LSB, " << s.worse
            << " worse (max " << s.max_lsb << " LSB)" << std::endl;
  return s;
}

// ---------------------------------------------------------------------------------------------

TEST(Int8E2e, SmallCnnMatchesFxInt8Logits) {
  const E2eGolden g = load_e2e("e2e_small_cnn");
  EXPECT_EQ(g.meta.at("config"), R"({"in_channels": 1, "num_classes": 10})");

  // Same weights as PyTorch: the fp32 models agree.
  {
    auto fp32 = std::make_shared<zoo::SmallCnn>(zoo::small_cnn_config(zoo::Variant::kTiny));
    fp32->load_state_dict(g.weights, /*strict=*/true);
    fp32->eval();
    const Tensor& evals = g.other.at("eval_codes");
    dbrq::testing::expect_close((*fp32)(images(evals, 0, evals.size(0))), g.other.at("fp32_logits"), 1e-4,
                                "fp32 logits");
  }

  // FX's graph (the converted code the script stored): one quantize of the input, fused int8
  // convs, pools and flatten on int8, one dequantize at the end.
  const std::string& fx = g.meta.at("fx_code");
  EXPECT_EQ(count(fx, "torch.quantize_per_tensor("), 1) << fx;
  EXPECT_EQ(count(fx, ".dequantize()"), 1) << fx;
  for (const char* call : {"self.conv1(quantize_per_tensor)", "self.conv2(conv1)", "self.pool(conv2)",
                           "self.conv3(pool)", "self.avgpool(conv3)", "torch.flatten(avgpool, 1)",
                           "self.fc(flatten)", "fc.dequantize()"}) {
    EXPECT_NE(fx.find(call), std::string::npos) << call << " not in FX's code:\n" << fx;
  }

  const SmallCnnRun r = run_small_cnn(g, /*fx_ranges=*/false);

  // The same plan in dbrq: the chains FX fuses are fused, the pools and flatten pass int8 through
  // with their input's parameters, nothing runs in fp32.
  std::string plan_text;
  for (const std::string& line : r.plan.ops) plan_text += "  " + line + "\n";
  std::cout << "dbrq's converted SmallCnn:\n" << plan_text;
  const std::vector<std::string> expected_ops = {
      "conv1 conv2d+batch_norm+relu: int8 conv2d", "conv2 conv2d+batch_norm+relu: int8 conv2d",
      "pool max_pool2d: int8 max_pool2d (shares parameters)", "conv3 conv2d+relu: int8 conv2d",
      "avgpool adaptive_avg_pool2d: int8 adaptive_avg_pool2d (shares parameters)",
      " flatten: int8 flatten (shares parameters)", "fc linear: int8 linear"};
  ASSERT_EQ(r.plan.ops.size(), expected_ops.size()) << plan_text;
  for (size_t i = 0; i < expected_ops.size(); ++i) {
    EXPECT_EQ(r.plan.ops[i].rfind(expected_ops[i], 0), 0u) << "op " << i << ": " << r.plan.ops[i] << "\n  want "
                                                           << expected_ops[i];
  }
  // Shared parameters: max_pool2d, adaptive_avg_pool2d and flatten keep their input's.
  EXPECT_EQ(r.plan.qparams.at("pool:out"), r.plan.qparams.at("conv2:out"));
  EXPECT_EQ(r.plan.qparams.at("avgpool:out"), r.plan.qparams.at("conv3:out"));

  // The same qparams as FX, tensor by tensor.
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"conv1:in", "quantize_per_tensor"}, {"conv1:out", "conv1"}, {"conv2:out", "conv2"},
      {"conv3:out", "conv3"}, {"fc:out", "fc"}};
  for (const auto& [dbrq_name, fx_name] : pairs) {
    const auto d = r.plan.qparams.at(dbrq_name);
    const std::vector<float> f = g.other.at("fx_qparams." + fx_name).to_vector<float>();
    std::cout << "[ qparams  ] " << std::left << std::setw(10) << dbrq_name << std::right << " dbrq scale "
              << std::setprecision(9) << d.first << " zp " << d.second << " | FX scale " << f[0] << " zp " << f[1]
              << (d.first == f[0] ? "" : "  (differs in the last bits)") << std::endl;
    EXPECT_EQ(d.second, static_cast<int32_t>(f[1])) << dbrq_name;
    // dbrq calibrates the unfolded conv -> bn -> relu, FX the conv with bn folded in: the observed
    // maxima can differ in the last bits, so can the scales (by an ulp or two).
    EXPECT_NEAR(d.first, f[0], 4e-7 * f[0]) << dbrq_name;
  }

  const LsbStats s = compare_logits(r.logits, g, "SmallCnn int8 logits (own calibration)");
  EXPECT_EQ(s.worse, 0);
  EXPECT_LE(s.off1, s.n / 1000) << "more than 0.1% of the logits are 1 LSB off";

  // For the record: both against fp32.
  const Tensor& fp32 = g.other.at("fp32_logits");
  const float fx_scale = g.other.at("fx_scale").item<float>();
  const int32_t fx_zp = g.other.at("fx_zp").item<int32_t>();
  const Tensor fx_real = dbrq::dequantize(g.other.at("fx_codes").with_qparams(dbrq::QuantParams::per_tensor(fx_scale, fx_zp)));
  std::cout << "[ e2e      ] SmallCnn SQNR vs fp32: dbrq " << std::setprecision(4) << sqnr(fp32, dbrq::dequantize(r.logits))
            << " dB, FX " << sqnr(fp32, fx_real) << " dB" << std::endl;
}

// With the ranges FX's observers saw (the folded-BN calibration difference removed), the qparams
// are FX's exactly and the int8 logits are bit-identical: the kernels and the plan agree with
// PyTorch's; any remaining difference above comes from calibrating the unfolded graph.
TEST(Int8E2e, SmallCnnWithFxRangesIsBitIdentical) {
  const E2eGolden g = load_e2e("e2e_small_cnn");
  const SmallCnnRun r = run_small_cnn(g, /*fx_ranges=*/true);
  for (const auto& [dbrq_name, fx_name] : std::vector<std::pair<std::string, std::string>>{
           {"conv1:in", "quantize_per_tensor"}, {"conv1:out", "conv1"}, {"conv2:out", "conv2"},
           {"conv3:out", "conv3"}, {"fc:out", "fc"}}) {
    const std::vector<float> f = g.other.at("fx_qparams." + fx_name).to_vector<float>();
    EXPECT_EQ(r.plan.qparams.at(dbrq_name).first, f[0]) << dbrq_name;
    EXPECT_EQ(r.plan.qparams.at(dbrq_name).second, static_cast<int32_t>(f[1])) << dbrq_name;
  }
  const LsbStats s = compare_logits(r.logits, g, "SmallCnn int8 logits (FX's ranges)");
  EXPECT_EQ(s.worse, 0);
  EXPECT_LE(s.off1, s.n / 1000);
}

// ---------------------------------------------------------------------------------------------

TEST(Int8E2e, ResNet18SqnrAtLeastFx) {
  const E2eGolden g = load_e2e("e2e_resnet18");
  EXPECT_EQ(g.meta.at("config"), R"({"base_width": 8, "num_classes": 10})");
  const Tensor& calib = g.other.at("calib_codes");
  const Tensor& evals = g.other.at("eval_codes");
  const Tensor x = images(evals, 0, evals.size(0));
  const Tensor& fp32 = g.other.at("fp32_logits");
  const double fx_sqnr = sqnr(fp32, g.other.at("fx_logits"));
  EXPECT_NEAR(fx_sqnr, std::stod(g.meta.at("fx_sqnr_db")), 1e-3);

  auto make = [&] {
    auto m = std::make_shared<zoo::ResNet18>(zoo::resnet18_config(zoo::Variant::kTiny));
    m->load_state_dict(g.weights, /*strict=*/true);
    m->eval();
    return m;
  };
  dbrq::testing::expect_close((*make())(x), fp32, 1e-4, "fp32 logits");

  // dbrq's default onednn mapping (histogram activations, per-channel symmetric weights), and the
  // same with PyTorch 1.13's integer histogram edges (see quant_state/observers.h).
  for (bool torch_edges : {false, true}) {
    auto model = make();
    dbrq::QConfigMapping mapping = dbrq::default_qconfig_mapping("onednn");
    if (torch_edges) {
      dbrq::ObserverSpec act = dbrq::ObserverSpec::histogram();
      act.torch_integer_edges = true;
      mapping.set_global(dbrq::QConfig::make(act, dbrq::ObserverSpec::per_channel_min_max()));
    }
    dbrq::prepare(*model, {images(calib, 0, 1)}, mapping);
    calibrate(*model, calib);
    dbrq::convert(*model);
    const double d = sqnr(fp32, (*model)(x));
    std::cout << "[ e2e      ] ResNet-18 (width 8) SQNR vs fp32: dbrq " << std::setprecision(4) << d << " dB"
              << (torch_edges ? " (torch_integer_edges)" : " (default histogram)") << ", PyTorch FX " << fx_sqnr
              << " dB" << std::endl;
    EXPECT_GE(d, fx_sqnr - 0.5);
  }
}


// kernels/simd.h picks its AVX-512 loops at run time (what a portable build, --config=portable, relies on):
// the converted ResNet-18 computes the same bytes with the portable loops (as on a CPU without
// AVX-512, or with DBRQ_PORTABLE_KERNELS=1). Loop-level checks: tests/kernels/simd_dispatch_test.
TEST(Int8E2e, PortableLoopsGiveTheSameBytes) {
  if (!dbrq::kernels::simd::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU: one path only";
  const E2eGolden g = load_e2e("e2e_resnet18");
  const Tensor& calib = g.other.at("calib_codes");
  const Tensor& evals = g.other.at("eval_codes");
  auto model = std::make_shared<zoo::ResNet18>(zoo::resnet18_config(zoo::Variant::kTiny));
  model->load_state_dict(g.weights, /*strict=*/true);
  model->eval();
  dbrq::prepare(*model, {images(calib, 0, 1)});
  calibrate(*model, calib);
  for (bool int8_outputs : {true, false}) {
    dbrq::ConvertOptions options;
    options.int8_outputs = int8_outputs;
    dbrq::convert(*model, options);
    const Tensor x = images(evals, 0, evals.size(0));
    const Tensor fast = (*model)(x).contiguous();
    dbrq::kernels::simd::force_portable(true);
    const Tensor portable = (*model)(x).contiguous();
    dbrq::kernels::simd::force_portable(false);
    ASSERT_EQ(fast.dtype(), portable.dtype());
    ASSERT_EQ(fast.nbytes(), portable.nbytes());
    EXPECT_EQ(std::memcmp(fast.data_ptr(), portable.data_ptr(), fast.nbytes()), 0) << "int8_outputs " << int8_outputs;
    if (!int8_outputs) break;
    model = std::make_shared<zoo::ResNet18>(zoo::resnet18_config(zoo::Variant::kTiny));
    model->load_state_dict(g.weights, /*strict=*/true);
    model->eval();
    dbrq::prepare(*model, {images(calib, 0, 1)});
    calibrate(*model, calib);
  }
}

// The loops added for the baseline build's speed (dynamic quantization's min / max, the adaptive
// average pool's window sums and means): the dynamic GRU classifier and the small CNN (batch 8, as
// bench/portable_vs_native.py times them) give the same bytes on both paths.
TEST(Int8E2e, PortableLoopsGiveTheSameBytesDynamicGruAndSmallCnn) {
  if (!dbrq::kernels::simd::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU: one path only";
  for (const std::string name : {"gru_classifier", "small_cnn"}) {
    const zoo::ModelSpec& spec = zoo::find_model(name);
    dbrq::manual_seed(0);
    auto model = spec.make(zoo::Variant::kTiny);
    model->eval();
    const bool dynamic = name == "gru_classifier";
    const Tensor example = spec.example_input(zoo::Variant::kTiny, 8, 0);
    dbrq::prepare(*model, {example},
                  dynamic ? dbrq::default_dynamic_qconfig_mapping() : dbrq::default_qconfig_mapping("onednn"));
    if (!dynamic) {
      spec.run(*model, spec.example_input(zoo::Variant::kTiny, 8, 100));
      spec.run(*model, spec.example_input(zoo::Variant::kTiny, 8, 101));
    }
    dbrq::convert(*model);
    const Tensor x = spec.example_input(zoo::Variant::kTiny, 8, 7);
    const Tensor fast = spec.run(*model, x).contiguous();
    dbrq::kernels::simd::force_portable(true);
    const Tensor portable = spec.run(*model, x).contiguous();
    dbrq::kernels::simd::force_portable(false);
    ASSERT_EQ(fast.dtype(), portable.dtype()) << name;
    ASSERT_EQ(fast.nbytes(), portable.nbytes()) << name;
    EXPECT_EQ(std::memcmp(fast.data_ptr(), portable.data_ptr(), fast.nbytes()), 0) << name;
    // Not a vacuous comparison: the outputs vary.
    const std::vector<float> v = fast.to_vector<float>();
    EXPECT_GT(*std::max_element(v.begin(), v.end()), *std::min_element(v.begin(), v.end())) << name;
  }
}

}  // namespace

