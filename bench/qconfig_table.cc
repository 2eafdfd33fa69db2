// The dbrq side of bench/qconfig_table.py: quantizes one zoo model with dbrq's default qconfig
// mapping whose global activation observer is replaced by the kind asked for, and writes the int8
// outputs of the evaluation batches (and the fp32 ones) to a safetensors file.
//
//   qconfig_table --model resnet18 --variant tiny --weights w.safetensors --data d.safetensors \
//                 --act Histogram --out out.safetensors
//
// --data holds "example", "calib<k>" (k = 0, 1, ..: calibration batches, in order) and
// "eval<k>" (evaluation batches). --weights may hold more tensors than the model's state dict (a
// golden file with "input" / "output"); only the model's keys are loaded, and a missing one is an
// error. --act names an ObserverKind ("Histogram", "Mse", "MinMax", ...) or "Histogram+torch_edges"
// (PyTorch 1.13's integer histogram edges); "default" keeps default_qconfig_mapping("onednn") as
// it is. The output has "int8_<k>" and "fp32_<k>" for every eval<k>, and "convert_ms".
// --print 1 writes the converted quantization state (what runs int8, with which qparams) to stderr.
#include <chrono>
#include <iostream>
#include <map>
#include <string>

#include "bench/bench_util.h"
#include "dbrq.h"
#include "samples/zoo/zoo.h"

namespace {

using dbrq::Tensor;

Tensor find(const dbrq::NamedTensors& t, const std::string& name) {
  for (const auto& [n, v] : t) {
    if (n == name) return v;
  }
  return Tensor();
}

int run(const std::map<std::string, std::string>& args) {
  auto arg = [&](const std::string& k) {
    auto it = args.find(k);
    if (it == args.end()) throw dbrq::ValueError("qconfig_table: missing --" + k);
    return it->second;
  };
  if (args.count("threads")) dbrq::set_num_threads(std::stoi(args.at("threads")));
  const zoo::ModelSpec& spec = zoo::find_model(arg("model"));
  std::shared_ptr<dbrq::nn::Module> model = spec.make(zoo::parse_variant(arg("variant")));
  const dbrq::NamedTensors file = dbrq::load_safetensors(arg("weights"));
  dbrq::NamedTensors weights;
  for (const auto& [name, _] : model->state_dict()) {
    Tensor t = find(file, name);
    if (!t.defined()) throw dbrq::ValueError("qconfig_table: weights file lacks \"" + name + "\"");
    weights.emplace_back(name, t);
  }
  model->load_state_dict(weights);
  model->eval();

  const dbrq::NamedTensors data = dbrq::load_safetensors(arg("data"));
  dbrq::NamedTensors out;
  std::vector<Tensor> evals;
  for (int k = 0;; ++k) {
    Tensor e = find(data, "eval" + std::to_string(k));
    if (!e.defined()) break;
    evals.push_back(e);
    out.emplace_back("fp32_" + std::to_string(k), spec.run(*model, e).clone());
  }
  const Tensor example = find(data, "example");
  dbrq::prepare(*model, [&] { spec.run(*model, example); }, bench::default_mapping_with_observer(arg("act")));
  for (int k = 0;; ++k) {
    Tensor c = find(data, "calib" + std::to_string(k));
    if (!c.defined()) break;
    spec.run(*model, c);
  }
  const auto t0 = std::chrono::steady_clock::now();
  dbrq::convert(*model);
  const double convert_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (args.count("print") && args.at("print") == "1") std::cerr << dbrq::quant_state_to_string(*model) << "\n";
  for (size_t k = 0; k < evals.size(); ++k) {
    out.emplace_back("int8_" + std::to_string(k), spec.run(*model, evals[k]).clone());
  }
  out.emplace_back("convert_ms", dbrq::from_vector<float>({static_cast<float>(convert_ms)}, {1}));
  dbrq::save_safetensors(arg("out"), out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k.rfind("--", 0) != 0) {
      std::cerr << "qconfig_table: expected --name value pairs, got " << k << "\n";
      return 2;
    }
    args[k.substr(2)] = argv[i + 1];
  }
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "qconfig_table: " << e.what() << "\n";
    return 1;
  }
}
