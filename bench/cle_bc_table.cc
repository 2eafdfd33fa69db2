// Output SQNR vs fp32 of int8 ResNet-18 and MobileNetV2 (random weights, batch norms randomized as
// bench/torch_models.py and tests/models do) before / after cross-layer equalization, bias
// correction, and both, with per-tensor and per-channel weights. Prints a Markdown table
// (docs/equalization_bias_correction.md).
//
//   bazel run -c opt //bench:cle_bc_table -- --variants=tiny,full --calib=8 --test=4 --batch=2
//   ... --gamma_decades=3   # batch-norm gammas over 3 decades: the imbalance of trained nets
//
// Every recipe starts from the same weights; SQNR is over the held-out test batches against the
// original fp32 model (so an fp32 change made by equalizing through relu6 counts against it).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "dbrq.h"
#include "samples/zoo/zoo.h"

namespace {

using dbrq::Tensor;

void fill(Tensor& t, const Tensor& src) {
  const std::vector<float> v = src.to_vector<float>();
  float* p = t.mutable_data<float>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
}

// tools/torch_zoo.py's randomize_norms, with dbrq's generator. gamma_decades > 0 draws gamma
// log-uniformly over that many decades instead (around 1), imitating the channel imbalance of
// trained depthwise layers (Nagel et al. 2019, fig. 2) that random weights lack.
void randomize_norms(dbrq::nn::Module& model, uint64_t seed, double gamma_decades) {
  for (auto& [fqn, m] : model.named_modules()) {
    auto* bn = dynamic_cast<dbrq::nn::BatchNorm2dImpl*>(m);
    if (bn == nullptr) continue;
    const int64_t n = bn->num_features();
    fill(bn->running_mean, dbrq::mul(dbrq::randn({n}, seed++), 0.2));
    fill(bn->running_var, dbrq::rand_uniform({n}, 0.5, 2.0, seed++));
    if (gamma_decades > 0) {
      const std::vector<float> e = dbrq::rand_uniform({n}, -gamma_decades / 2, gamma_decades / 2, seed++).to_vector<float>();
      std::vector<float> g(e.size());
      for (size_t i = 0; i < e.size(); ++i) g[i] = std::pow(10.0f, e[i]);
      float* p = bn->weight.mutable_data<float>();
      for (size_t i = 0; i < g.size(); ++i) p[i] = g[i];
    } else {
      fill(bn->weight, dbrq::rand_uniform({n}, 0.5, 1.5, seed++));
    }
    fill(bn->bias, dbrq::mul(dbrq::randn({n}, seed++), 0.1));
  }
}

struct Recipe {
  const char* name;
  bool cle = false;
  dbrq::Relu6Policy relu6 = dbrq::Relu6Policy::kSkip;
  bool bc = false;
};

Tensor run_all(const zoo::ModelSpec& spec, dbrq::nn::Module& m, const std::vector<Tensor>& xs) {
  std::vector<Tensor> ys;
  for (const Tensor& x : xs) ys.push_back(spec.run(m, x));
  return dbrq::cat(ys, 0);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> variants = {"tiny", "full"};
  std::vector<std::string> models = {"resnet18", "mobilenet_v2"};
  int calib_n = 8, test_n = 4;
  int64_t batch = 2;
  double gamma_decades = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) { return a.substr(std::string(flag).size()); };
    if (a.rfind("--variants=", 0) == 0) variants = absl::StrSplit(value("--variants="), ',');
    else if (a.rfind("--models=", 0) == 0) models = absl::StrSplit(value("--models="), ',');
    else if (a.rfind("--calib=", 0) == 0) calib_n = std::stoi(value("--calib="));
    else if (a.rfind("--test=", 0) == 0) test_n = std::stoi(value("--test="));
    else if (a.rfind("--batch=", 0) == 0) batch = std::stoll(value("--batch="));
    else if (a.rfind("--gamma_decades=", 0) == 0) gamma_decades = std::stod(value("--gamma_decades="));
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  const Recipe recipes[] = {{"int8 (no correction)", false, dbrq::Relu6Policy::kSkip, false},
                            {"+ CLE", true, dbrq::Relu6Policy::kSkip, false},
                            {"+ CLE (relu6 as relu)", true, dbrq::Relu6Policy::kAsRelu, false},
                            {"+ bias correction", false, dbrq::Relu6Policy::kSkip, true},
                            {"+ CLE + bias correction", true, dbrq::Relu6Policy::kSkip, true},
                            {"+ CLE (relu6 as relu) + bias correction", true, dbrq::Relu6Policy::kAsRelu, true}};
  const auto per_tensor = dbrq::QConfigMapping().set_global(dbrq::QConfig::make(
      dbrq::ObserverSpec::histogram(), dbrq::ObserverSpec::min_max(dbrq::DType::kS8, dbrq::QScheme::kPerTensorSymmetric)));
  const auto per_channel = dbrq::default_qconfig_mapping("onednn");

  std::printf("| model | variant | recipe | pairs | fp32 model vs original (SQNR dB) | per-tensor SQNR dB | per-channel SQNR dB |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const std::string& model_name : models) {
    const zoo::ModelSpec& spec = zoo::find_model(model_name);
    for (const std::string& vname : variants) {
      const zoo::Variant variant = zoo::parse_variant(vname);
      dbrq::manual_seed(1);
      auto base = spec.make(variant);
      base->eval();
      randomize_norms(*base, 1000, gamma_decades);
      const dbrq::NamedTensors weights = base->state_dict();
      std::vector<Tensor> calib, test;
      for (int i = 0; i < calib_n; ++i) calib.push_back(spec.example_input(variant, batch, 100 + i));
      for (int i = 0; i < test_n; ++i) test.push_back(spec.example_input(variant, batch, 900 + i));
      std::vector<std::vector<Tensor>> calib_lists;
      for (const Tensor& x : calib) calib_lists.push_back({x});
      const Tensor ref = run_all(spec, *base, test);
      for (const Recipe& r : recipes) {
        if (model_name != "mobilenet_v2" && r.relu6 == dbrq::Relu6Policy::kAsRelu) continue;  // no relu6
        double sqnr[2] = {0, 0};
        std::string pairs = "-";
        double fp32_change = INFINITY;
        const auto t0 = std::chrono::steady_clock::now();
        for (int scheme = 0; scheme < 2; ++scheme) {
          const dbrq::QConfigMapping& mapping = scheme == 0 ? per_tensor : per_channel;
          auto m = spec.make(variant);
          m->eval();
          m->load_state_dict(weights);
          if (r.cle) {
            dbrq::EqualizeOptions o;
            o.relu6 = r.relu6;
            const dbrq::EqualizeReport e = dbrq::equalize(*m, {calib[0]}, o);
            pairs = std::to_string(e.pairs.size());
          }
          if (r.bc) dbrq::correct_bias(*m, calib_lists, mapping);
          if (scheme == 0) fp32_change = dbrq::sqnr_db(ref, run_all(spec, *m, test));
          dbrq::prepare(*m, {calib[0]}, mapping);
          for (const Tensor& x : calib) spec.run(*m, x);
          dbrq::convert(*m);
          sqnr[scheme] = dbrq::sqnr_db(ref, run_all(spec, *m, test));
        }
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("| %s | %s | %s | %s | %s | %.2f | %.2f |\n", model_name.c_str(), vname.c_str(), r.name,
                    pairs.c_str(), std::isinf(fp32_change) ? "inf (identical)" : absl::StrFormat("%.1f", fp32_change).c_str(),
                    sqnr[0], sqnr[1]);
        std::fflush(stdout);
        std::fprintf(stderr, "%s %s %s: %.1f s\n", model_name.c_str(), vname.c_str(), r.name, secs);
      }
    }
  }
  return 0;
}
