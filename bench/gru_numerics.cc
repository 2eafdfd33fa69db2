// Where the GRU classifier's static int8 accuracy goes (issue 11): the zoo's gru_classifier at
// full size on the weights and inputs bench/compare.py exports, quantized with dbrq's default
// static mapping, compared op by op against the same model in fp32 (dbrq::compare_numerics).
//
//   bazel run -c opt //bench:gru_numerics -- --weights=W.safetensors --inputs=I.safetensors \
//       [--calib=ids_calib0,ids_calib1] [--eval=ids_bs1,ids_bs8] [--ops=12] [--state]
//       [--observer=histogram|minmax|mse|p9999] [--fp32=add,mul,sigmoid,tanh] [--float_out]
//
// Prints the SQNR of the model's output on each eval batch and the worst ops. --observer replaces
// the activation observer, --fp32 keeps those functional ops in fp32 and --float_out sets
// PrepareOptions::float_outputs_for_float_readers: what-ifs for docs/recurrent.md.
#include <cstdio>
#include <map>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "dbrq.h"
#include "samples/zoo/zoo.h"

namespace {

std::shared_ptr<zoo::GruClassifier> load(const std::string& weights) {
  auto m = std::make_shared<zoo::GruClassifier>(zoo::gru_classifier_config(zoo::Variant::kFull));
  m->load_state_dict(dbrq::load_safetensors(weights));
  m->eval();
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string weights = bench::flag(argc, argv, "weights", ""), inputs_path = bench::flag(argc, argv, "inputs", "");
  if (weights.empty() || inputs_path.empty()) {
    std::fprintf(stderr, "usage: gru_numerics --weights=W --inputs=I [--calib=K,..] [--eval=K,..] [--ops=N] [--state]\n");
    return 2;
  }
  std::map<std::string, dbrq::Tensor> inputs;
  for (auto& [k, v] : dbrq::load_safetensors(inputs_path)) inputs[k] = v;
  const std::vector<std::string> calib = absl::StrSplit(bench::flag(argc, argv, "calib", "ids_calib0,ids_calib1"), ',');
  const std::vector<std::string> eval = absl::StrSplit(bench::flag(argc, argv, "eval", "ids_bs1,ids_bs8"), ',');
  const int ops = std::stoi(bench::flag(argc, argv, "ops", "12"));
  dbrq::set_num_threads(1);

  auto ref = load(weights);
  auto q = load(weights);
  const dbrq::Tensor example = inputs.at(bench::flag(argc, argv, "example", "ids_example"));
  dbrq::QConfigMapping mapping = dbrq::default_qconfig_mapping("onednn");
  const std::string obs = bench::flag(argc, argv, "observer", "histogram");
  dbrq::ObserverSpec act = obs == "minmax" ? dbrq::ObserverSpec::min_max()
                           : obs == "mse"  ? dbrq::ObserverSpec::mse()
                           : obs == "p9999" ? dbrq::ObserverSpec::percentile_of(99.99)
                                           : dbrq::ObserverSpec::histogram();
  mapping.set_global(dbrq::QConfig::make(act, dbrq::ObserverSpec::per_channel_min_max()));
  const std::string fp32 = bench::flag(argc, argv, "fp32", "");
  if (fp32.find("add") != std::string::npos) mapping.set_object_type(dbrq::OpKind::kAdd, nullptr);
  if (fp32.find("mul") != std::string::npos) mapping.set_object_type(dbrq::OpKind::kMul, nullptr);
  if (fp32.find("sigmoid") != std::string::npos) mapping.set_object_type(dbrq::OpKind::kSigmoid, nullptr);
  if (fp32.find("tanh") != std::string::npos) mapping.set_object_type(dbrq::OpKind::kTanh, nullptr);
  dbrq::PrepareOptions prepare_options;
  prepare_options.float_outputs_for_float_readers = bench::flag(argc, argv, "float_out", "0") == "1";
  dbrq::prepare(*q, std::vector<dbrq::Tensor>{example}, mapping, dbrq::BackendConfig::onednn(), prepare_options);
  for (const std::string& k : calib) (*q)(inputs.at(k));
  dbrq::convert(*q);
  if (bench::flag(argc, argv, "state", "") == "1") std::cout << dbrq::quant_state_to_string(*q) << "\n";

  for (const std::string& k : eval) {
    const dbrq::Tensor x = inputs.at(k);
    std::printf("%-12s output SQNR %.2f dB\n", k.c_str(), dbrq::sqnr_db((*ref)(x), (*q)(x)));
  }
  std::vector<std::vector<dbrq::Tensor>> batches;
  for (const std::string& k : eval) batches.push_back(std::vector<dbrq::Tensor>{inputs.at(k)});
  const dbrq::NumericReport r = dbrq::compare_numerics(*ref, *q, batches);
  std::printf("compare_numerics: output %.2f dB over %zu batches, %lld uncalibrated op runs\n", r.output_sqnr_db,
              batches.size(), static_cast<long long>(r.uncalibrated_ops));
  for (int i = 0; i < ops && i < static_cast<int>(r.ops.size()); ++i) {
    const dbrq::OpNumerics& o = r.ops[static_cast<size_t>(i)];
    std::printf("  %-26s #%-3d %-12s %7.2f dB  runs %-5lld %s\n", o.op.c_str(), o.index, o.fqn.c_str(), o.sqnr_db,
                static_cast<long long>(o.runs), o.qparams.c_str());
  }
  return 0;
}
