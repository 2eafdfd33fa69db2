// The full-size decoder LM's static int8 logits against PyTorch fp32, per token (issue 11's
// acceptance: at least 30 dB). bench/decoder_numerics.py exports the twin's weights (the benchmark's:
// bench/torch_models.py make_model("decoder_lm", seed 13), norms randomized), the benchmark's
// calibration prompts, and for each evaluation prompt the twin's greedy tokens and the logits it
// predicted each from. This program calibrates dbrq's DecoderLM as the benchmark does (generating
// 96 tokens from each calibration prompt), converts, and feeds each evaluation prompt's tokens
// through the int8 model one at a time (teacher forcing: every step sees the twin's context, so
// one flipped argmax does not change every later input), then reports the logits' SQNR per prompt,
// per token (worst, median) and over all.
//
//   /usr/bin/python3 bench/decoder_numerics.py      # builds this, exports, runs it
//   bazel run -c opt //bench:decoder_numerics -- --weights=W --inputs=I [--mapping=default|transformer]
// (transformer: the benchmark's transformer recipe, transformer_qconfig_mapping with
// PrepareOptions::float_outputs_for_float_readers)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "dbrq.h"
#include "samples/zoo/zoo.h"

namespace {

dbrq::Tensor ids_tensor(const std::vector<int64_t>& ids) {
  return dbrq::from_vector(ids, {1, static_cast<int64_t>(ids.size())});
}

dbrq::Tensor last_row(const dbrq::Tensor& logits) { return logits.select(1, logits.size(1) - 1).contiguous(); }

// The logits each of `tokens` is predicted from, given the prompt and the tokens before it.
dbrq::Tensor teacher_forced(zoo::DecoderLM& lm, const std::vector<int64_t>& prompt, const std::vector<int64_t>& tokens) {
  std::vector<dbrq::Tensor> rows;
  zoo::DecoderOutput out = lm(ids_tensor(prompt));
  rows.push_back(last_row(out.logits));
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    out = lm(ids_tensor({tokens[i]}), out.cache);
    rows.push_back(last_row(out.logits));
  }
  return dbrq::cat(rows, 0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string weights = bench::flag(argc, argv, "weights", ""), inputs_path = bench::flag(argc, argv, "inputs", "");
  const std::string recipe = bench::flag(argc, argv, "mapping", "default");
  if (weights.empty() || inputs_path.empty() || (recipe != "default" && recipe != "transformer")) {
    std::fprintf(stderr, "usage: decoder_numerics --weights=W --inputs=I [--mapping=default|transformer]\n");
    return 2;
  }
  std::map<std::string, dbrq::Tensor> in;
  for (auto& [k, v] : dbrq::load_safetensors(inputs_path)) in[k] = v;
  dbrq::set_num_threads(1);
  auto load = [&] {
    auto lm = std::make_shared<zoo::DecoderLM>(zoo::decoder_lm_config(zoo::Variant::kFull));
    lm->load_state_dict(dbrq::load_safetensors(weights));
    lm->eval();
    return lm;
  };
  auto fp32 = load(), q = load();
  const int64_t new_tokens = in.at("new_tokens").item<int64_t>();
  // The benchmark's recipes (bench/dbrq_bench.cc): "transformer" is transformer_qconfig_mapping with
  // PrepareOptions::float_outputs_for_float_readers.
  dbrq::PrepareOptions options;
  options.float_outputs_for_float_readers = recipe == "transformer";
  dbrq::prepare(
      *q, [&] { (*q)(in.at("ids_example")); },
      recipe == "transformer" ? dbrq::transformer_qconfig_mapping("onednn") : dbrq::default_qconfig_mapping("onednn"),
      dbrq::BackendConfig::onednn(), options);
  for (int i = 0; in.count("ids_calib" + std::to_string(i)) != 0; ++i) {
    q->generate(in.at("ids_calib" + std::to_string(i)).to_vector<int64_t>(), new_tokens);
  }
  dbrq::convert(*q);

  std::printf("decoder_lm full size, static int8 (%s mapping) vs PyTorch fp32, teacher forced\n", recipe.c_str());
  std::printf("%-7s %6s %10s %10s %10s %10s %14s\n", "prompt", "tokens", "overall", "worst tok", "median tok",
              "argmax =", "dbrq fp32 rel");
  std::vector<dbrq::Tensor> all_ref, all_q;
  double worst_token = INFINITY;
  for (int p = 0; in.count("eval_prompt" + std::to_string(p)) != 0; ++p) {
    const std::string s = std::to_string(p);
    const std::vector<int64_t> prompt = in.at("eval_prompt" + s).to_vector<int64_t>();
    const std::vector<int64_t> tokens = in.at("eval_tokens" + s).to_vector<int64_t>();
    const dbrq::Tensor ref = in.at("eval_logits" + s);
    const dbrq::Tensor got = teacher_forced(*q, prompt, tokens);
    const dbrq::Tensor f32 = teacher_forced(*fp32, prompt, tokens);
    std::vector<double> per;
    int same_argmax = 0;
    for (int64_t i = 0; i < ref.size(0); ++i) {
      per.push_back(dbrq::sqnr_db(ref.narrow(0, i, 1), got.narrow(0, i, 1)));
      const std::vector<float> a = got.select(0, i).to_vector<float>();
      same_argmax += std::max_element(a.begin(), a.end()) - a.begin() == tokens[static_cast<size_t>(i)];
    }
    std::vector<double> sorted = per;
    std::sort(sorted.begin(), sorted.end());
    worst_token = std::min(worst_token, sorted.front());
    double max_diff = 0, max_ref = 0;
    const std::vector<float> r = ref.to_vector<float>(), f = f32.to_vector<float>();
    for (size_t i = 0; i < r.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(r[i] - f[i])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(r[i])));
    }
    std::printf("%-7d %6lld %7.2f dB %7.2f dB %7.2f dB %6d/%-3lld %14.1e\n", p, static_cast<long long>(ref.size(0)),
                dbrq::sqnr_db(ref, got), sorted.front(), sorted[sorted.size() / 2], same_argmax,
                static_cast<long long>(ref.size(0)), max_diff / max_ref);
    all_ref.push_back(ref);
    all_q.push_back(got);
  }
  std::printf("all     %6lld %7.2f dB %7.2f dB (worst token of any prompt); uncalibrated ops %lld\n",
              static_cast<long long>(dbrq::cat(all_ref, 0).size(0)),
              dbrq::sqnr_db(dbrq::cat(all_ref, 0), dbrq::cat(all_q, 0)), worst_token,
              static_cast<long long>(dbrq::uncalibrated_ops(*q)));
  return 0;
}
