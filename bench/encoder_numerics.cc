// encoder_numerics: where the BERT encoder's int8 accuracy goes. Quantizes the zoo's BertEncoder on
// given weights and inputs (the files bench/compare.py writes: bert_encoder.safetensors and
// bert_encoder.inputs.safetensors) with one of several recipes, and prints the output SQNR against
// dbrq fp32 and the worst ops (dbrq::compare_numerics).
//
//   bazel build -c opt //bench:encoder_numerics
//   bazel-bin/bench/encoder_numerics W.safetensors IN.safetensors [recipe ...]
//
// A recipe is parts joined by "+" (recipe() lists them): mapping changes such as add_fp32,
// softmax_hist, mse; float_out (PrepareOptions::float_outputs_for_float_readers); sq and bc run
// dbrq::smooth_quant / dbrq::correct_bias on the calibration batches before prepare (VERBOSE=1
// prints their reports). IN must hold ref_bs1 (PyTorch's fp32 output for ids_bs1).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/bert_encoder.h"
#include "samples/zoo/zoo.h"

namespace {

using dbrq::Tensor;

Tensor get(const dbrq::NamedTensors& ts, const std::string& key) {
  for (const auto& [k, t] : ts)
    if (k == key) return t;
  throw std::runtime_error("missing " + key);
}

std::shared_ptr<zoo::BertEncoder> load(const dbrq::NamedTensors& w) {
  auto m = std::make_shared<zoo::BertEncoder>(zoo::bert_config(zoo::Variant::kFull));
  m->load_state_dict(w);
  m->eval();
  return m;
}

dbrq::QConfigMapping recipe(const std::string& name) {
  auto mapping = dbrq::default_qconfig_mapping("onednn");
  const auto minmax = dbrq::QConfig::make(dbrq::ObserverSpec::min_max(), dbrq::ObserverSpec::per_channel_min_max());
  auto fp32 = [&](dbrq::OpKind k) { mapping.set_object_type(k, nullptr); };
  for (size_t p = 0; p < name.size();) {
    size_t e = name.find('+', p);
    if (e == std::string::npos) e = name.size();
    const std::string part = name.substr(p, e - p);
    p = e + 1;
    if (part == "default") continue;
    if (part == "float_out") continue;  // PrepareOptions, see main
    if (part == "bc" || part == "sq") continue;  // bias correction / SmoothQuant before prepare, see main
    if (part == "minmax") mapping.set_global(minmax);
    else if (part == "mse") mapping.set_global(dbrq::QConfig::make(dbrq::ObserverSpec::mse(), dbrq::ObserverSpec::per_channel_min_max()));
    else if (part == "softmax_mse") mapping.set_object_type(dbrq::OpKind::kSoftmax, dbrq::QConfig::make(dbrq::ObserverSpec::mse(), dbrq::ObserverSpec::per_channel_min_max()));
    else if (part == "softmax_fp32") fp32(dbrq::OpKind::kSoftmax);
    else if (part == "gelu_fp32") { fp32(dbrq::OpKind::kGelu); mapping.set_object_type("GELU", nullptr); }
    else if (part == "ln_fp32") { fp32(dbrq::OpKind::kLayerNorm); mapping.set_object_type("LayerNorm", nullptr); }
    else if (part == "add_fp32") fp32(dbrq::OpKind::kAdd);
    else if (part == "add_minmax") mapping.set_object_type(dbrq::OpKind::kAdd, minmax);
    else if (part == "matmul_minmax") mapping.set_object_type(dbrq::OpKind::kMatmul, minmax);
    else if (part == "linear_minmax") mapping.set_object_type("Linear", minmax);
    else if (part == "add_pct") mapping.set_object_type(dbrq::OpKind::kAdd, dbrq::QConfig::make(dbrq::ObserverSpec::percentile_of(99.999), dbrq::ObserverSpec::per_channel_min_max()));
    else if (part == "add_entropy") mapping.set_object_type(dbrq::OpKind::kAdd, dbrq::QConfig::make(dbrq::ObserverSpec::entropy(), dbrq::ObserverSpec::per_channel_min_max()));
    else if (part == "softmax_hist") mapping.set_object_type(dbrq::OpKind::kSoftmax, dbrq::default_qconfig("onednn"));
    else if (part == "softmax_minmax") mapping.set_object_type(dbrq::OpKind::kSoftmax, minmax);
    else if (part == "softmax_pct") mapping.set_object_type(dbrq::OpKind::kSoftmax, dbrq::QConfig::make(dbrq::ObserverSpec::percentile_of(99.99), dbrq::ObserverSpec::per_channel_min_max()));
    else if (part == "softmax_entropy") mapping.set_object_type(dbrq::OpKind::kSoftmax, dbrq::QConfig::make(dbrq::ObserverSpec::entropy(), dbrq::ObserverSpec::per_channel_min_max()));
    else if (part.rfind("fp32re:", 0) == 0) mapping.set_module_name_regex(part.substr(7), nullptr);
    else if (part == "matmul_pct") mapping.set_object_type(dbrq::OpKind::kMatmul, dbrq::QConfig::make(dbrq::ObserverSpec::percentile_of(99.99), dbrq::ObserverSpec::per_channel_min_max()));
    else if (part == "linear_pct") mapping.set_object_type("Linear", dbrq::QConfig::make(dbrq::ObserverSpec::percentile_of(99.99), dbrq::ObserverSpec::per_channel_min_max()));
    else if (part == "linear_entropy") mapping.set_object_type("Linear", dbrq::QConfig::make(dbrq::ObserverSpec::entropy(), dbrq::ObserverSpec::per_channel_min_max()));
    else if (part.rfind("q:", 0) == 0) {  // q:<minmax|pct|entropy|hist>:<module regex>
      const size_t c = part.find(':', 2);
      const std::string kind = part.substr(2, c - 2);
      const dbrq::ObserverSpec a = kind == "minmax" ? dbrq::ObserverSpec::min_max()
                                   : kind == "pct"  ? dbrq::ObserverSpec::percentile_of(99.99)
                                   : kind == "entropy" ? dbrq::ObserverSpec::entropy()
                                                       : dbrq::ObserverSpec::histogram();
      mapping.set_module_name_regex(part.substr(c + 1), dbrq::QConfig::make(a, dbrq::ObserverSpec::per_channel_min_max()));
    }
    else if (part == "div_fp32") fp32(dbrq::OpKind::kDiv);
    else if (part == "matmul_fp32") fp32(dbrq::OpKind::kMatmul);
    else if (part == "linear_fp32") mapping.set_object_type("Linear", nullptr);
    else if (part.rfind("softmax_fixed", 0) == 0) {
      const float inv = std::stof(part.substr(13));
      mapping.set_object_type(dbrq::OpKind::kSoftmax,
                              dbrq::QConfig::make(dbrq::ObserverSpec::fixed(1.f / inv, 0), dbrq::ObserverSpec::per_channel_min_max()));
    } else throw std::runtime_error("unknown recipe part " + part);
  }
  return mapping;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: encoder_numerics W.safetensors IN.safetensors [recipe ...]\n";
    return 2;
  }
  const dbrq::NamedTensors w = dbrq::load_safetensors(argv[1]);
  const dbrq::NamedTensors in = dbrq::load_safetensors(argv[2]);
  std::vector<std::string> recipes;
  for (int i = 3; i < argc; ++i) recipes.push_back(argv[i]);
  if (recipes.empty()) recipes = {"default"};
  const bool verbose = std::getenv("VERBOSE") != nullptr;
  auto ref = load(w);
  const Tensor x = get(in, "ids_bs1");
  {
    Tensor y = (*ref)(x);
    std::printf("dbrq fp32 vs torch fp32: %.1f dB\n", dbrq::sqnr_db(get(in, "ref_bs1"), y));
  }
  for (const std::string& r : recipes) {
    auto q = load(w);
    dbrq::PrepareOptions options;
    options.float_outputs_for_float_readers = r.find("float_out") != std::string::npos;
    const dbrq::QConfigMapping mapping = recipe(r);
    const std::vector<std::vector<Tensor>> calibration = {{get(in, "ids_calib0")}, {get(in, "ids_calib1")}};
    auto has = [&](const std::string& part) { return ("+" + r + "+").find("+" + part + "+") != std::string::npos; };
    if (has("sq")) {
      const dbrq::SmoothQuantReport sq = dbrq::smooth_quant(*q, calibration, dbrq::SmoothQuantOptions{});
      if (verbose) std::cout << sq.to_string() << "\n";
    }
    if (has("bc")) {
      const dbrq::BiasCorrectionReport bc = dbrq::correct_bias(*q, calibration, mapping);
      if (verbose) std::cout << bc.to_string() << "\n";
    }
    dbrq::prepare(*q, {get(in, "ids_example")}, mapping, dbrq::BackendConfig::onednn(), options);
    (*q)(get(in, "ids_calib0"));
    (*q)(get(in, "ids_calib1"));
    dbrq::convert(*q);
    dbrq::NumericReport rep = dbrq::compare_numerics(*ref, *q, {{x}});
    std::printf("%-40s output SQNR %.2f dB (bs8: %.2f dB)\n", r.c_str(), rep.output_sqnr_db,
                dbrq::sqnr_db((*ref)(get(in, "ids_bs8")), (*q)(get(in, "ids_bs8"))));
    if (std::getenv("TIME") != nullptr) {
      auto t = [&](zoo::BertEncoder& m) {
        double best = 1e30;
        for (int i = 0; i < 30; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          (void)m(x);
          best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        return best;
      };
      const double f = t(*ref), i8 = t(*q);
      std::printf("    latency bs1 (best of 30): fp32 %.2f ms, int8 %.2f ms, ratio %.2f\n", f, i8, i8 / f);
    }
    if (verbose) std::cout << rep.to_table() << "\n";
  }
  return 0;
}
