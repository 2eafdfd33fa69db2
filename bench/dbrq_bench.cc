// dbrq_bench: the dbrq side of bench/compare.sh. Times a zoo model (fp32, static int8 or dynamic
// int8) on given weights and inputs, or the whole prepare + calibrate + convert pipeline, and
// prints one JSON object per result on stdout.
//
// One-shot use (flags):
//
//   bazel build -c opt //bench:dbrq_bench
//   bazel-out/k8-opt/bin/bench/dbrq_bench --model=resnet18 --mode=int8 --batch=8 --iters=20
//   bazel-out/k8-opt/bin/bench/dbrq_bench --model=bert_encoder --mode=fp32 --threads=2 --warmup=3
//       --weights=w.safetensors --inputs=in.safetensors      (all on one line)
//   bazel-out/k8-opt/bin/bench/dbrq_bench --model=resnet18 --mode=prep --threads=2 --reps=3
//   bazel-out/k8-opt/bin/bench/dbrq_bench --model=gru_classifier --mode=dynamic --iters=50
//
// Modes: fp32; int8 (static: prepare, calibration batches, convert, default_qconfig_mapping
// "onednn"); dynamic (prepare on the example, convert, default_dynamic_qconfig_mapping: nothing to
// calibrate); prep (the static pipeline's time).
//
// Without --weights the model keeps its default initialization; without --inputs the zoo's
// example_input() supplies the timed input (seed 0) and the calibration batches (seeds 100, 101;
// decoder_lm: four one-sequence prompts, seeds 100..103; gru_classifier: sixteen, 100..115).
// With --inputs the timed input is the tensor "x_bs<batch>" (token models: bert_encoder and
// gru_classifier "ids_bs<batch>", decoder_lm "ids_prompt"), the example for prepare() is "example"
// ("ids_example") and the calibration batches are "calib0", "calib1" ("ids_calib0", "ids_calib1";
// gru_classifier "ids_calib0".."ids_calib15");
// --input_key, --example_key and --calib_keys override them.
//
// decoder_lm is timed generating: one timed run is DecoderLM::generate(prompt, new_tokens) (greedy,
// no stop token; --new_tokens, default 96) on the prompt "ids_prompt" ([1, S] ids), and int8
// calibration generates new_tokens tokens from each of "ids_calib0".."ids_calib3" (so the prompt
// call and the one-token calls at every cache length are seen), after prepare() on "ids_example".
// --int8_outputs=1 converts with ConvertOptions::int8_outputs (the returned cache stays int8 between
// calls instead of being dequantized at every return and quantized again by the next call's cat;
// the logits are then u8 too). --recipe and --observer set the int8 recipe and the default recipe's
// activation observer (DataSpec::recipe, DataSpec::observer), as the server's fields do.
//
// Server use (--serve), as bench/compare.py drives it so that it can interleave dbrq and PyTorch
// in small chunks of iterations: one JSON command per stdin line, one JSON reply per stdout line.
//
//   {"cmd":"setup","model":"resnet18","mode":"int8","batch":1,"threads":1,"weights":..,"inputs":..}
//       (mode fp32, int8 or dynamic; decoder_lm also takes "new_tokens" and "int8_outputs"; int8
//       takes "recipe": "default", "transformer" or "transformer_bc", see DataSpec::recipe)
//       -> {"ok":true,"setup_s":..,"input":"[1, 3, 224, 224]","quantize_s":..,"executors":{..}}
//          (quantize_s only when this setup converted the model; executors, for int8, counts what
//          convert() chose per op, e.g. {"int8 conv2d":20,..}). A model is cached per model, mode,
//          weights and inputs, and reused for every batch size and thread count, as dbrq supports.
//          Every setup selects the model, input and thread count for the commands that follow.
//   {"cmd":"time","iters":10,"warmup":0}  -> {"ok":true,"samples_ms":[..]}
//   {"cmd":"save_output","path":"/tmp/y.safetensors"}  -> {"ok":true,"shape":..}  (key "output", f32;
//       decoder_lm: the logits of every generated token [new_tokens, vocab] and "tokens" [new_tokens])
//   {"cmd":"prep","model":"resnet18","threads":2,"reps":1,..}
//       -> {"ok":true,"total_s":[..],"prepare_s":[..],"calibrate_s":[..],"convert_s":[..]}
//          (a fresh model per repetition; loading weights and inputs is not timed)
//   {"cmd":"quit"}
//
// Errors come back as {"ok":false,"error":".."}; the server keeps running.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "bench/bench_util.h"
#include "dbrq.h"
#include "nlohmann/json.hpp"
#include "samples/zoo/zoo.h"

namespace {

using dbrq::Tensor;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

bool is_bert(const std::string& model) { return model == "bert_encoder"; }
bool is_decoder(const std::string& model) { return model == "decoder_lm"; }
bool is_gru(const std::string& model) { return model == "gru_classifier"; }
// Models whose inputs are token ids (input keys "ids_...").
bool uses_token_ids(const std::string& model) { return is_bert(model) || is_decoder(model) || is_gru(model); }

// Safetensors files are read once per process.
const dbrq::NamedTensors& load_file(const std::string& path) {
  static std::map<std::string, dbrq::NamedTensors> cache;
  auto it = cache.find(path);
  if (it == cache.end()) it = cache.emplace(path, dbrq::load_safetensors(path)).first;
  return it->second;
}

Tensor tensor_from(const std::string& path, const std::string& key) {
  for (const auto& [name, t] : load_file(path)) {
    if (name == key) return t;
  }
  throw std::runtime_error("no tensor \"" + key + "\" in " + path);
}

// Where the data of one run comes from (a command's fields, with the defaults described above).
struct DataSpec {
  std::string model;
  int64_t batch = 1;
  std::string weights;  // empty: default initialization
  std::string inputs;   // empty: the zoo's example inputs
  std::string input_key, example_key;
  std::vector<std::string> calib_keys;
  int64_t new_tokens = 96;    // decoder_lm: tokens generated per timed run and per calibration prompt
  bool int8_outputs = false;  // convert with ConvertOptions::int8_outputs
  // int8 qconfig recipe: "default" (default_qconfig_mapping), "transformer"
  // (transformer_qconfig_mapping + PrepareOptions::float_outputs_for_float_readers, issue 13), or
  // "transformer_bc": the same after dbrq::correct_bias on the calibration batches (not decoder_lm,
  // whose calibration is generation).
  std::string recipe = "default";
  // Activation observer of the default recipe: "" (the mapping's, Histogram), an ObserverKind name
  // ("Mse", "Percentile", ...) or "Histogram+torch_edges" (PyTorch 1.13's observer exactly).
  std::string observer;

  static DataSpec from(const json& c) {
    DataSpec d;
    d.model = c.value("model", std::string("resnet18"));
    d.batch = c.value("batch", 1);
    d.weights = c.value("weights", std::string());
    d.inputs = c.value("inputs", std::string());
    d.new_tokens = c.value("new_tokens", int64_t{96});
    d.int8_outputs = c.value("int8_outputs", false);
    d.recipe = c.value("recipe", std::string("default"));
    d.observer = c.value("observer", std::string());
    if (!d.observer.empty() && d.recipe != "default") {
      throw std::runtime_error("observer: only with recipe default, got recipe " + d.recipe);
    }
    if (d.recipe != "default" && d.recipe != "transformer" && d.recipe != "transformer_bc") {
      throw std::runtime_error("recipe must be default, transformer or transformer_bc, got " + d.recipe);
    }
    if (d.recipe == "transformer_bc" && is_decoder(d.model)) {
      throw std::runtime_error("recipe transformer_bc: bias correction needs forward calibration batches, decoder_lm "
                               "calibrates by generating");
    }
    const std::string p = uses_token_ids(d.model) ? "ids_" : "";
    const std::string input = is_decoder(d.model) ? "prompt" : (is_bert(d.model) || is_gru(d.model) ? "bs" : "x_bs") + std::to_string(d.batch);
    d.input_key = c.value("input_key", p + input);
    d.example_key = c.value("example_key", p + "example");
    // gru_classifier: 16 batches of 8 sequences (issue 11). With 2, its logits' range came from 64
    // values and clipped other batches' logits (26.5 dB -> 17-29 dB per batch; docs/recurrent.md).
    const int num_calib = is_decoder(d.model) ? 4 : is_gru(d.model) ? 16 : 2;
    std::vector<std::string> keys;
    for (int i = 0; i < num_calib; ++i) keys.push_back(p + "calib" + std::to_string(i));
    d.calib_keys = c.value("calib_keys", keys);
    return d;
  }

  const zoo::ModelSpec& spec() const { return zoo::find_model(model); }
  Tensor input() const {
    return inputs.empty() ? spec().example_input(zoo::Variant::kFull, batch, 0) : tensor_from(inputs, input_key);
  }
  Tensor example() const {
    return inputs.empty() ? spec().example_input(zoo::Variant::kFull, 1, 99) : tensor_from(inputs, example_key);
  }
  std::vector<Tensor> calibration() const {
    std::vector<Tensor> out;
    for (size_t i = 0; i < calib_keys.size(); ++i) {
      out.push_back(inputs.empty() ? spec().example_input(zoo::Variant::kFull, is_decoder(model) ? 1 : 8, 100 + i)
                                   : tensor_from(inputs, calib_keys[i]));
    }
    return out;
  }
  std::shared_ptr<dbrq::nn::Module> make_fp32_model() const {
    auto m = spec().make(zoo::Variant::kFull);
    if (!weights.empty()) m->load_state_dict(load_file(weights));  // strict: every key must match
    m->eval();
    return m;
  }
};

// Counts the executors convert() chose, from the printed quantization state.
json count_executors(const dbrq::nn::Module& model) {
  const std::string s = dbrq::quant_state_to_string(model);
  std::map<std::string, int> counts;
  size_t pos = 0;
  while ((pos = s.find("-> ", pos)) != std::string::npos) {
    pos += 3;
    const size_t end = s.find('\n', pos);
    std::string what = s.substr(pos, end - pos);
    // "int8 linear [256, 256]+relu" -> "int8 linear"
    const size_t cut = what.find_first_of("[(+");
    if (cut != std::string::npos) what = what.substr(0, cut);
    while (!what.empty() && what.back() == ' ') what.pop_back();
    counts[what]++;
  }
  return json(counts);
}

struct Timings {
  double prepare_s = 0, calibrate_s = 0, convert_s = 0;
};

// prepare (one traced example run) + every calibration batch + convert, on `m` in place. Dynamic:
// prepare + convert (nothing to calibrate).
Timings quantize(dbrq::nn::Module& m, const DataSpec& d, bool dynamic = false) {
  const zoo::ModelSpec& spec = d.spec();
  const Tensor example = d.example();
  const std::vector<Tensor> calib = dynamic ? std::vector<Tensor>() : d.calibration();
  Timings t;
  auto t0 = Clock::now();
  dbrq::PrepareOptions prepare_options;
  const bool transformer = d.recipe == "transformer" || d.recipe == "transformer_bc";
  prepare_options.float_outputs_for_float_readers = transformer;
  const dbrq::QConfigMapping mapping = dynamic       ? dbrq::default_dynamic_qconfig_mapping()
                                       : transformer ? dbrq::transformer_qconfig_mapping("onednn")
                                                     : bench::default_mapping_with_observer(d.observer);
  if (!dynamic && d.recipe == "transformer_bc") {
    std::vector<std::vector<Tensor>> batches;
    for (const Tensor& batch : calib) batches.push_back({batch});
    dbrq::correct_bias(m, batches, mapping);
  }
  dbrq::prepare(m, {example}, mapping, dbrq::BackendConfig::onednn(), prepare_options);
  t.prepare_s = ms_since(t0) / 1e3;
  t0 = Clock::now();
  for (const Tensor& batch : calib) {
    if (is_decoder(d.model)) {
      dynamic_cast<zoo::DecoderLM&>(m).generate(batch.to_vector<int64_t>(), d.new_tokens);
    } else {
      spec.run(m, batch);
    }
  }
  t.calibrate_s = ms_since(t0) / 1e3;
  t0 = Clock::now();
  dbrq::ConvertOptions options;
  options.int8_outputs = d.int8_outputs;
  dbrq::convert(m, options);
  t.convert_s = ms_since(t0) / 1e3;
  return t;
}

class Bench {
 public:
  json handle(const json& c) {
    const std::string cmd = c.value("cmd", std::string());
    if (cmd == "setup") return setup(c);
    if (cmd == "time") return time(c.value("iters", 10), c.value("warmup", 0));
    if (cmd == "save_output") return save_output(c.at("path").get<std::string>());
    if (cmd == "prep") return prep(c);
    throw std::runtime_error("unknown command \"" + cmd + "\"");
  }

 private:
  json setup(const json& c) {
    const auto t0 = Clock::now();
    data_ = DataSpec::from(c);
    const std::string mode = c.value("mode", std::string("fp32"));
    if (mode != "fp32" && mode != "int8" && mode != "dynamic") {
      throw std::runtime_error("mode must be fp32, int8 or dynamic, got " + mode);
    }
    dbrq::set_num_threads(c.value("threads", 1));
    json reply = {{"ok", true}};
    const std::string key = data_.model + "/" + mode + (data_.int8_outputs ? "/int8_outputs" : "") + "/" +
                            data_.recipe + "/" + data_.observer + "/" +
                            data_.weights + "/" + data_.inputs + "/" + std::to_string(data_.new_tokens);
    auto it = models_.find(key);
    if (it == models_.end()) {
      auto m = data_.make_fp32_model();
      if (mode != "fp32") {
        const Timings t = quantize(*m, data_, mode == "dynamic");
        reply["quantize_s"] = t.prepare_s + t.calibrate_s + t.convert_s;
      }
      it = models_.emplace(key, m).first;
    }
    model_ = it->second;
    if (mode != "fp32") reply["executors"] = count_executors(*model_);
    input_ = data_.input();
    reply["input"] = input_.shape_string();
    reply["setup_s"] = ms_since(t0) / 1e3;
    return reply;
  }

  Tensor run_once() {
    if (!model_) throw std::runtime_error("no model: send setup first");
    if (is_decoder(data_.model)) {
      dynamic_cast<zoo::DecoderLM&>(*model_).generate(input_.to_vector<int64_t>(), data_.new_tokens);
      return Tensor();
    }
    return data_.spec().run(*model_, input_);
  }

  json time(int iters, int warmup) {
    for (int i = 0; i < warmup; ++i) run_once();
    std::vector<double> samples;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = Clock::now();
      run_once();  // the result is freed inside the timed region, as in PyTorch's timing loop
      samples.push_back(ms_since(t0));
    }
    return {{"ok", true}, {"samples_ms", samples}};
  }

  json save_output(const std::string& path) {
    if (is_decoder(data_.model)) {
      if (!model_) throw std::runtime_error("no model: send setup first");
      const zoo::Generation g = dynamic_cast<zoo::DecoderLM&>(*model_).generate(input_.to_vector<int64_t>(),
                                                                                data_.new_tokens, -1, true);
      const Tensor tokens = dbrq::from_vector(g.tokens, {static_cast<int64_t>(g.tokens.size())});
      dbrq::save_safetensors(path, {{"output", g.logits.contiguous()}, {"tokens", tokens}});
      return {{"ok", true}, {"shape", g.logits.shape_string()}};
    }
    Tensor y = run_once();
    if (y.is_quantized()) y = y.dequantize();
    dbrq::save_safetensors(path, {{"output", y.contiguous()}});
    return {{"ok", true}, {"shape", y.shape_string()}};
  }

  // Fresh model per repetition; loading weights is not timed.
  json prep(const json& c) {
    const DataSpec d = DataSpec::from(c);
    dbrq::set_num_threads(c.value("threads", 1));
    json total = json::array(), prepare = json::array(), calibrate = json::array(), convert = json::array();
    for (int r = 0; r < c.value("reps", 1); ++r) {
      auto m = d.make_fp32_model();
      d.calibration();  // reads the inputs file outside the timed region
      const Timings t = quantize(*m, d);
      total.push_back(t.prepare_s + t.calibrate_s + t.convert_s);
      prepare.push_back(t.prepare_s);
      calibrate.push_back(t.calibrate_s);
      convert.push_back(t.convert_s);
    }
    return {{"ok", true}, {"total_s", total}, {"prepare_s", prepare}, {"calibrate_s", calibrate}, {"convert_s", convert}};
  }

  DataSpec data_;
  std::shared_ptr<dbrq::nn::Module> model_;
  Tensor input_;
  std::map<std::string, std::shared_ptr<dbrq::nn::Module>> models_;
};

json error_reply(const std::exception& e) { return {{"ok", false}, {"error", e.what()}}; }

int serve() {
  Bench bench;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    json reply;
    try {
      const json c = json::parse(line);
      if (c.value("cmd", std::string()) == "quit") break;
      reply = bench.handle(c);
    } catch (const std::exception& e) {
      reply = error_reply(e);
    }
    std::cout << reply.dump() << std::endl;  // endl flushes: the driver waits for each line
  }
  return 0;
}

int usage() {
  std::cerr << "usage: dbrq_bench --serve\n"
               "       dbrq_bench --model=NAME [--mode=fp32|int8|dynamic|prep] [--batch=N] [--threads=N] [--iters=N]\n"
               "                  [--warmup=N] [--reps=N] [--weights=FILE] [--inputs=FILE] [--input_key=K]\n"
               "                  [--example_key=K] [--calib_keys=K1,K2,...] [--new_tokens=N] [--int8_outputs=0|1]\n"
               "                  [--recipe=default|transformer|transformer_bc] [--observer=KIND]\n"
               "models: resnet18, mobilenet_v2, bert_encoder, small_cnn, decoder_lm (timed generating), gru_classifier, "
               "dcgan_generator, unet, kws_conv1d, densenet, vit\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  json c = {{"model", "resnet18"}, {"mode", "fp32"}, {"batch", 1}, {"threads", 1}};
  int iters = 20, warmup = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--serve") return serve();
    if (a == "--help" || a == "-h") return usage();
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) return usage();
    const std::string k = a.substr(2, eq - 2), v = a.substr(eq + 1);
    int n = 0;
    const bool numeric = k == "iters" || k == "warmup" || k == "batch" || k == "threads" || k == "reps" ||
                         k == "new_tokens" || k == "int8_outputs";
    if (numeric && !absl::SimpleAtoi(v, &n)) return usage();
    if (k == "iters") {
      iters = n;
    } else if (k == "warmup") {
      warmup = n;
    } else if (k == "batch" || k == "threads" || k == "reps" || k == "new_tokens") {
      c[k] = n;
    } else if (k == "int8_outputs") {
      c[k] = n != 0;
    } else if (k == "calib_keys") {
      std::vector<std::string> keys;
      for (size_t s = 0; s <= v.size();) {
        const size_t e = std::min(v.find(',', s), v.size());
        keys.push_back(v.substr(s, e - s));
        s = e + 1;
      }
      c[k] = keys;
    } else if (k == "model" || k == "mode" || k == "weights" || k == "inputs" || k == "input_key" ||
               k == "example_key" || k == "recipe" || k == "observer") {
      c[k] = v;
    } else {
      return usage();
    }
  }
  Bench bench;
  try {
    json out = c;
    if (c["mode"] == "prep") {
      c["cmd"] = "prep";
      out["result"] = bench.handle(c);
    } else {
      c["cmd"] = "setup";
      out["setup"] = bench.handle(c);
      json t = bench.handle({{"cmd", "time"}, {"iters", iters}, {"warmup", warmup}});
      std::vector<double> s = t["samples_ms"];
      std::sort(s.begin(), s.end());
      out["median_ms"] = s.empty() ? 0.0 : s[s.size() / 2];
      out["samples_ms"] = t["samples_ms"];
    }
    std::cout << out.dump() << std::endl;
  } catch (const std::exception& e) {
    std::cout << error_reply(e).dump() << std::endl;
    return 1;
  }
  return 0;
}
