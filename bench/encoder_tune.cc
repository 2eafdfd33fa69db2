// encoder_tune: dbrq::autotune on the BERT encoder with an output-SQNR criterion (docs/autotune.md,
// "The BERT encoder"). Weights and inputs are the files bench/compare.py writes
// (bert_encoder.safetensors, bert_encoder.inputs.safetensors: calibration ids_calib0/1, evaluation
// ids_bs1 and ids_bs8). Prints the trial table, what the best trial moves out of int8, its SQNR and
// its latency at batch 1 against dbrq fp32, measured in the same run.
//
//   bazel build -c opt //bench:encoder_tune
//   bazel-bin/bench/encoder_tune W.safetensors IN.safetensors MIN_SQNR_DB [default|transformer] [TRIALS]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
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

double best_ms(dbrq::nn::Module& m, const Tensor& x, int iters) {
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)m.forward_tensors({x});
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: encoder_tune W.safetensors IN.safetensors MIN_SQNR_DB [default|transformer] [TRIALS]\n";
    return 2;
  }
  const dbrq::NamedTensors w = dbrq::load_safetensors(argv[1]);
  const dbrq::NamedTensors in = dbrq::load_safetensors(argv[2]);
  const double min_sqnr = std::atof(argv[3]);
  const std::string base = argc > 4 ? argv[4] : "transformer";
  const int trials = argc > 5 ? std::atoi(argv[5]) : 30;
  if (base != "default" && base != "transformer") {
    std::cerr << "encoder_tune: base must be default or transformer, got " << base << "\n";
    return 2;
  }
  auto make = [&]() -> std::shared_ptr<dbrq::nn::Module> {
    auto m = std::make_shared<zoo::BertEncoder>(zoo::bert_config(zoo::Variant::kFull));
    m->load_state_dict(w);
    m->eval();
    return m;
  };
  const Tensor bs1 = get(in, "ids_bs1"), bs8 = get(in, "ids_bs8");
  auto fp32 = make();
  const Tensor ref1 = fp32->forward_tensors({bs1})[0], ref8 = fp32->forward_tensors({bs8})[0];
  // Output SQNR vs fp32 over batch 1 and batch 8 (the energy-weighted mean of the two).
  auto evaluate = [&](dbrq::nn::Module& m) {
    double sig = 0, err = 0;
    const std::vector<std::pair<Tensor, Tensor>> cases = {{bs1, ref1}, {bs8, ref8}};
    for (const auto& [x, r] : cases) {
      const std::vector<float> a = r.contiguous().to_vector<float>();
      const std::vector<float> b = m.forward_tensors({x})[0].contiguous().to_vector<float>();
      for (size_t k = 0; k < a.size(); ++k) {
        sig += double(a[k]) * a[k];
        err += (double(a[k]) - b[k]) * (double(a[k]) - b[k]);
      }
    }
    return err == 0 ? INFINITY : 10 * std::log10(sig / err);
  };
  dbrq::AutotuneOptions opt;
  if (base == "transformer") opt.base_mapping = dbrq::transformer_qconfig_mapping("onednn");
  opt.latency_iters = 0;  // measured below for the best only, with more calls
  opt.on_trial = [](const dbrq::TuneProgress& p) {
    std::fprintf(stderr, "trial %d: %s -> %.2f dB (%.0f s)\n", p.last->index, p.last->config.key().c_str(),
                 p.last->metric, p.elapsed_seconds);
  };
  const std::vector<std::vector<Tensor>> calib = {{get(in, "ids_calib0")}, {get(in, "ids_calib1")}};
  const auto t0 = std::chrono::steady_clock::now();
  const dbrq::AutotuneResult r = dbrq::autotune(make, calib, evaluate, dbrq::TuneCriterion::at_least(min_sqnr),
                                                dbrq::TuneBudget{trials, 0}, opt);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << r.to_string();
  std::printf("searched %zu trials in %.0f s (base %s)\n", r.trials.size(), secs, base.c_str());
  std::cout << "sensitivity (worst first):";
  for (size_t i = 0; i < r.sensitivity.size() && i < 12; ++i) {
    std::printf(" %s %.1f dB;", r.sensitivity[i].first.c_str(), r.sensitivity[i].second);
  }
  std::cout << "\n";
  if (r.best_model != nullptr) {
    const double f = best_ms(*fp32, bs1, 30), q = best_ms(*r.best_model, bs1, 30);
    std::printf("best: %.2f dB; latency bs1 (best of 30): fp32 %.2f ms, tuned %.2f ms, ratio %.2f\n", r.best_metric,
                f, q, q / f);
  }
  return 0;
}
