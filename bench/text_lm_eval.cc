// Issue 13: int8 recipes on a small language model with real text (docs/text_lm.md). Loads the
// byte-level DecoderLM trained by tools/train_text_lm.py on Debian's license texts and prints one
// table of held-out bits per character: dbrq fp32, default int8, the transformer mapping,
// SmoothQuant (fixed alpha, alpha search) + int8, dbrq::autotune, next to PyTorch's fp32, FX static
// int8 and quantize_dynamic numbers from the golden file (same weights, same calibration windows).
//
//   bazel run -c opt //bench:text_lm_eval -- --threads=1 --tune_seconds=900
//
// Flags (--name=value): --weights, --golden (default: the committed files, relative to the
// workspace), --threads (default 1), --tune_trials (default 24), --tune_seconds (default 900),
// --tune_loss (relative bpc increases autotune may accept, one search each, default 0.01,0.001),
// --tune_log (trial log path, default none; with several losses, one file each: path.<loss>). Autotune evaluates on the
// even-indexed held-out windows only; the table reports every method on all windows and on the odd half autotune never
// saw.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/text_lm/text_lm.h"

namespace {

using dbrq::Tensor;
using Clock = std::chrono::steady_clock;

struct Row {
  std::string method;
  double all = NAN, odd = NAN;  // bpc on all held-out windows, on the odd half
  double eval_s = NAN;          // wall seconds for the all-window evaluation
  std::string note;
};

// The 1, 5 and 15 minute load averages (Linux), to report the load a run had.
std::string load_average() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return "unknown";
  char buf[64] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  std::string s(buf, n);
  size_t cut = 0;
  for (int i = 0; i < 3 && cut != std::string::npos; ++i) cut = s.find(' ', cut + (i > 0));
  return s.substr(0, cut);
}

double median_ratio(std::vector<float> v) {
  if (v.empty()) return NAN;
  float mx = 0.f;
  for (float x : v) mx = std::max(mx, x);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  const float med = v[v.size() / 2];
  return med > 0.f ? mx / med : NAN;
}

std::string fmt(double v, int prec = 4) {
  if (std::isnan(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

int run(const std::map<std::string, std::string>& args) {
  auto get = [&](const std::string& k, const std::string& d) {
    auto it = args.find(k);
    return it == args.end() ? d : it->second;
  };
  // bazel run starts in the runfiles tree; the default files are the workspace's.
  const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  const std::string root = ws ? std::string(ws) + "/" : "";
  const std::string weights = get("weights", root + "samples/data/text_lm.safetensors");
  const std::string golden = get("golden", root + "tests/models/golden/text_lm_golden.safetensors");
  dbrq::set_num_threads(std::stoi(get("threads", "1")));
  const int tune_trials = std::stoi(get("tune_trials", "24"));
  const double tune_seconds = std::stod(get("tune_seconds", "900"));
  std::vector<double> tune_losses;
  {
    std::stringstream list(get("tune_loss", "0.01,0.001"));
    for (std::string item; std::getline(list, item, ',');) tune_losses.push_back(std::stod(item));
  }

  const std::string load_at_start = load_average();
  const text_lm::TextLmData d = text_lm::load_text_lm_data(golden);
  const Tensor odd = text_lm::every_other(d.eval, 1), even = text_lm::every_other(d.eval, 0);
  std::vector<Row> rows;
  auto measure = [&](const std::string& method, dbrq::nn::Module& m, const std::string& note) {
    Row r{method, NAN, NAN, NAN, note};
    const auto t0 = Clock::now();
    r.all = text_lm::bits_per_char(m, d.eval);
    r.eval_s = std::chrono::duration<double>(Clock::now() - t0).count();
    r.odd = text_lm::bits_per_char(m, odd);
    std::cerr << method << ": " << fmt(r.all) << " bpc (" << fmt(r.eval_s, 1) << " s)\n";
    rows.push_back(r);
  };
  auto int8 = [&](const std::shared_ptr<zoo::DecoderLM>& lm, const dbrq::QConfigMapping& mapping) {
    dbrq::prepare(*lm, {d.calib}, mapping);
    (*lm)(d.calib);  // the one calibration batch: 32 training windows
    dbrq::convert(*lm);
  };

  {
    auto lm = text_lm::make_text_lm(weights);
    measure("dbrq fp32", *lm, "");
  }
  {
    auto lm = text_lm::make_text_lm(weights);
    int8(lm, dbrq::default_qconfig_mapping("onednn"));
    measure("dbrq int8 default", *lm, "default_qconfig_mapping(\"onednn\")");
  }
  {
    auto lm = text_lm::make_text_lm(weights);
    int8(lm, dbrq::transformer_qconfig_mapping("onednn"));
    measure("dbrq int8 transformer", *lm, "transformer_qconfig_mapping: add fp32, softmax observed");
  }
  std::string sq_text;
  struct SqRun {
    bool search, transformer;
  };
  for (const SqRun run : {SqRun{false, false}, SqRun{true, false}, SqRun{true, true}}) {
    auto lm = text_lm::make_text_lm(weights);
    dbrq::SmoothQuantOptions o;
    o.search_alpha = run.search;
    const dbrq::SmoothQuantReport rep = dbrq::smooth_quant(*lm, {{d.calib}}, o);
    std::ostringstream note;
    note << rep.groups.size() << " groups";
    if (run.search) {
      note << ", alphas";
      for (const auto& g : rep.groups) note << " " << fmt(g.alpha, 1);
      sq_text = rep.to_string();
    }
    int8(lm, run.transformer ? dbrq::transformer_qconfig_mapping("onednn") : dbrq::default_qconfig_mapping("onednn"));
    measure(std::string(run.search ? "dbrq SmoothQuant search" : "dbrq SmoothQuant a=0.5") +
                (run.transformer ? " + transformer" : " + default"),
            *lm, note.str());
    if (!run.search) {
      std::cerr << "LayerNorm outputs, max/median of the per-channel max|x| (dbrq, calibration windows):";
      for (const auto& g : rep.groups) std::cerr << " " << g.producer << " " << fmt(median_ratio(g.act_absmax), 2);
      std::cerr << "\n";
    }
  }
  for (const double tune_loss : tune_losses) {
    const auto factory = [&]() -> std::shared_ptr<dbrq::nn::Module> { return text_lm::make_text_lm(weights); };
    const auto evaluate = [&](dbrq::nn::Module& m) { return text_lm::bits_per_char(m, even); };
    dbrq::AutotuneOptions opt;
    opt.log_path = args.count("tune_log") ? args.at("tune_log") + "." + fmt(tune_loss, 4) : "";
    opt.latency_iters = 0;
    opt.on_trial = [](const dbrq::TuneProgress& p) {
      std::cerr << "autotune trial " << p.trials_done << "/" << p.trials_planned << " ("
                << (p.last ? p.last->config.key() + " -> " + fmt(p.last->metric) : std::string()) << "), "
                << fmt(p.elapsed_seconds, 0) << " s, ETA " << fmt(p.eta_seconds, 0) << " s\n";
    };
    const auto t0 = Clock::now();
    dbrq::AutotuneResult r =
        dbrq::autotune(factory, {{d.calib}}, evaluate, dbrq::TuneCriterion::relative_loss(tune_loss, false),
                       dbrq::TuneBudget{tune_trials, tune_seconds}, opt);
    const double tune_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::cerr << r.to_string() << "\n";
    std::ostringstream note;
    note << dbrq::tune_status_name(r.status) << " after " << r.trials.size() << " trials, " << fmt(tune_s, 0)
         << " s: " << r.best_config.key();
    if (r.best_model) {
      measure("dbrq autotune (<= " + fmt(tune_loss * 100, 2) + "% on even half)", *r.best_model, note.str());
    } else {
      rows.push_back({"dbrq autotune", NAN, NAN, NAN, note.str()});
    }
  }

  const double fp32 = rows[0].all;
  std::printf("Held-out bits per character (%lld windows of 64 predicted bytes; odd half: %lld windows).\n",
              static_cast<long long>(d.eval.size(0)), static_cast<long long>(odd.size(0)));
  std::printf("Load average at start %s, at end %s (%d threads).\n", load_at_start.c_str(), load_average().c_str(),
              std::stoi(get("threads", "1")));
  std::printf("Calibration for every int8 method: the same %lld training windows of 64 bytes, one batch.\n",
              static_cast<long long>(d.calib.size(0)));
  std::printf("| method | bpc (all) | vs fp32 | bpc (odd half) | eval s | notes |\n|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    std::printf("| %s | %s | %s | %s | %s | %s |\n", r.method.c_str(), fmt(r.all).c_str(),
                std::isnan(r.all) ? "-" : (fmt((r.all / fp32 - 1) * 100, 2) + "%").c_str(), fmt(r.odd).c_str(),
                fmt(r.eval_s, 1).c_str(), r.note.c_str());
  }
  const double t_fp32 = d.number("fp32_bpc"), t_fx = d.number("fx_bpc"), t_dyn = d.number("dynamic_bpc");
  std::printf("| PyTorch fp32 | %s | %s | - | - | golden |\n", fmt(t_fp32).c_str(),
              (fmt((t_fp32 / fp32 - 1) * 100, 2) + "%").c_str());
  std::printf("| PyTorch FX int8 (onednn default) | %s | %s | - | - | golden |\n", fmt(t_fx).c_str(),
              (fmt((t_fx / fp32 - 1) * 100, 2) + "%").c_str());
  std::printf("| PyTorch quantize_dynamic | %s | %s | - | - | golden |\n", fmt(t_dyn).c_str(),
              (fmt((t_dyn / fp32 - 1) * 100, 2) + "%").c_str());
  for (const char* key : {"layernorm_outlier_ratio", "layernorm_input_outlier_ratio"}) {
    std::printf("PyTorch %s (max/median of the channels' max|x|): %s\n", key,
                d.metadata.count(key) ? d.metadata.at(key).c_str() : "-");
  }
  std::printf("\nSmoothQuant (alpha search):\n%s\n", sq_text.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::cerr << "text_lm_eval: arguments are --name=value, got \"" << a << "\"\n";
      return 2;
    }
    args[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "text_lm_eval: " << e.what() << "\n";
    return 1;
  }
}
