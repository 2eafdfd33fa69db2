// dbrq: the command line tool. Quantizes zoo models to int8, evaluates them against fp32, writes
// the numeric report and measures latency.
//
//   dbrq quantize --model=small_cnn --weights=W.safetensors --calib=CALIB.safetensors --out=S.json
//   dbrq eval     --model=small_cnn --weights=W.safetensors --state=S.json --data=TEST.safetensors
//   dbrq report   --model=small_cnn --weights=W.safetensors --state=S.json --data=TEST.safetensors
//                 --out=report.html --csv=report.csv   (one command line)
//   dbrq bench    --model=resnet18 --batch_size=1 --threads=2 --iters=50
//   dbrq quantize --help
//   mpirun -np 4 dbrq_mpi quantize ... --distributed   (//tools/cli:dbrq_mpi: this file with MPI,
//                                                       docs/distributed.md)
//
// Exit codes: 0 success; 2 usage error (unknown subcommand or flag, missing or invalid flag value);
// 1 failure (missing file, weights or state that do not fit the model, ...). Errors are one line
// on stderr: what failed and why.
//
// Flags are Abseil flags, but parsed per subcommand by this file (absl::ParseCommandLine knows no
// subcommands, exits 1 on --help and on unknown flags): each subcommand accepts its own flags,
// and values are parsed by Abseil through absl::CommandLineFlag::ParseFrom.
#include <cxxabi.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "dbrq.h"
#ifdef DBRQ_WITH_MPI
#include "distributed/calibrate.h"
#include "distributed/tune.h"
#endif
#include "samples/demo/pipeline.h"
#include "samples/zoo/zoo.h"

ABSL_FLAG(std::string, model, "",
          "zoo model: resnet18, mobilenet_v2, bert_encoder, small_cnn, decoder_lm, gru_classifier, vit, "
          "dcgan_generator, unet, kws_conv1d or densenet");
ABSL_FLAG(std::string, variant, "full", "model configuration: full (as published) or tiny (the test-sized one)");
ABSL_FLAG(std::string, weights, "",
          "weights (safetensors with the model's state-dict keys), loaded strictly; "
          "without: random initialization seeded by --seed");
ABSL_FLAG(uint64_t, seed, 0, "seed of the random initialization when there are no --weights");
ABSL_FLAG(std::string, calib, "", "calibration data: safetensors with an \"images\" or \"inputs\" tensor [N, ...]");
ABSL_FLAG(std::string, data, "",
          "evaluation data: safetensors with an \"images\" or \"inputs\" tensor [N, ...] and optionally "
          "\"labels\" [N]");
ABSL_FLAG(std::string, state, "", "quant-state file written by `dbrq quantize`");
ABSL_FLAG(std::string, out, "", "output file");
ABSL_FLAG(std::string, csv, "", "also write the per-op numbers as CSV to this file");
ABSL_FLAG(std::string, title, "", "report title (default: the model's name)");
ABSL_FLAG(std::string, observer, "histogram", "activation observer: histogram, minmax, percentile, entropy or mse");
ABSL_FLAG(int64_t, batches, 0, "use at most this many batches of the data (0: all)");
ABSL_FLAG(int64_t, batch_size, 0, "samples per batch");
ABSL_FLAG(int32_t, threads, 0, "threads for every kernel (0: one per core)");
ABSL_FLAG(int32_t, iters, 50, "timed runs per model (after 3 warm-up runs)");
ABSL_FLAG(int64_t, calib_batches, 4, "random batches to calibrate on when there is no --state");
ABSL_FLAG(bool, include_stats, false,
          "also save observer statistics (histograms), so calibration can continue after loading");
ABSL_FLAG(bool, distributed, false,
          "calibrate across MPI ranks: run as `mpirun -np N dbrq_mpi quantize ... --distributed`; rank r of n "
          "takes batches r, r+n, ...; a --calib path with %r is one shard file per rank (docs/distributed.md)");
ABSL_FLAG(double, mpi_timeout, 600, "with --distributed: longest wait (seconds) for the other ranks at a collective");
ABSL_FLAG(std::string, progress, "auto",
          "progress bar on stderr: auto (in place on a terminal, plain lines otherwise), always or never");
ABSL_FLAG(std::string, metric, "accuracy",
          "tune: what evaluate measures on --data: accuracy (needs labels) or sqnr (int8 outputs vs fp32, dB)");
ABSL_FLAG(std::string, loss, "relative", "tune: --max_loss is relative (a fraction of fp32's accuracy) or absolute");
ABSL_FLAG(double, max_loss, 0.01, "tune: tolerable accuracy loss vs fp32 (0: none)");
ABSL_FLAG(double, min_sqnr, 30.0, "tune: with --metric=sqnr, the output SQNR vs fp32 to reach, in dB");
ABSL_FLAG(int32_t, trials, 50, "tune: at most this many trials (>= 1)");
ABSL_FLAG(double, time_limit, 0.0, "tune: stop starting trials after this many seconds (0: no limit)");
ABSL_FLAG(std::string, log, "", "tune: trial log (JSON); an existing log of the same search is resumed");
ABSL_FLAG(std::string, base_mapping, "default",
          "tune: the mapping the search starts from: default (onednn's), transformer "
          "(transformer_qconfig_mapping: adds fp32, softmax observed) or a mapping JSON file (.json)");
ABSL_FLAG(std::string, reference, "",
          "also write the example input and dbrq's int8 outputs (with each output's quantization step) "
          "as safetensors, for checking another runtime against dbrq");
ABSL_FLAG(std::string, log_level, "",
          "dbrq's log level: trace, debug, info, warn, error, critical, off (default: DBRQ_LOG_LEVEL, else warn)");

namespace {

using pipeline::format_db;
using pipeline::format_ms;
using pipeline::format_percent;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

// A usage error: printed as one line plus a hint to --help, exit code 2.
struct UsageError {
  std::string message;
};

[[noreturn]] void usage_error(const std::string& message) { throw UsageError{message}; }

// ---- subcommand table ----

struct FlagUse {
  FlagUse(std::string name, bool required = false, std::string help = "", std::string default_value = "")
      : name(std::move(name)), required(required), help(std::move(help)), default_value(std::move(default_value)) {}
  std::string name;
  bool required = false;
  std::string help;           // overrides the flag's own help when not empty
  std::string default_value;  // overrides the flag's default in --help when not empty
};

struct Command {
  std::string name;
  std::string summary;
  std::string usage;
  std::string description;
  std::vector<FlagUse> flags;
  std::string example;
  std::function<int()> run;
};

const std::map<std::string, std::string>& metavars() {
  static const auto* m = new std::map<std::string, std::string>{
      {"model", "NAME"},       {"variant", "full|tiny"},
      {"weights", "W.safetensors"}, {"seed", "N"},
      {"calib", "DATA.safetensors"}, {"data", "DATA.safetensors"},
      {"state", "STATE.json"}, {"out", "FILE"},
      {"csv", "FILE.csv"},     {"title", "TEXT"},
      {"observer", "KIND"},    {"batches", "N"},
      {"batch_size", "N"},     {"threads", "N"},
      {"iters", "N"},          {"calib_batches", "N"},
      {"include_stats", ""},   {"progress", "auto|always|never"},
      {"log_level", "LEVEL"},
      {"distributed", ""},     {"mpi_timeout", "SECONDS"},
      {"metric", "accuracy|sqnr"},
      {"loss", "relative|absolute"}, {"max_loss", "X"},
      {"min_sqnr", "DB"},      {"trials", "N"},
      {"time_limit", "SECONDS"}, {"log", "LOG.json"},
      {"base_mapping", "default|transformer|MAPPING.json"},
      {"reference", "REF.safetensors"},
  };
  return *m;
}

// Flags every model-building subcommand takes.
std::vector<FlagUse> model_flags(bool weights_matter) {
  return {
      {"model", true},
      {"variant"},
      {"weights", false,
       weights_matter ? "" : "weights (safetensors), loaded strictly; without: random initialization (--seed)"},
      {"seed"},
  };
}

std::vector<FlagUse> common_flags() { return {{"threads"}, {"log_level"}}; }

std::vector<FlagUse> concat(std::vector<FlagUse> a, const std::vector<FlagUse>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int run_quantize();
int run_eval();
int run_report();
int run_bench();
int run_tune();
int run_export();

const std::vector<Command>& commands() {
  static const auto* cmds = new std::vector<Command>{
      {"quantize", "calibrate a model on data and save its quantization state",
       "dbrq quantize --model=NAME --calib=DATA.safetensors --out=STATE.json [flags]",
       "Builds the zoo model, loads its weights (strict), prepares it for int8 with the first batch\n"
       "as the example, runs it over the calibration data so the observers record ranges (progress\n"
       "bar on stderr), and saves the calibration as a quant-state JSON file for `dbrq eval`,\n"
       "`dbrq report`, `dbrq bench` or load_quant_state().",
       concat(concat(model_flags(true),
                     {{"calib", true},
                      {"out", true, "where to write the quant-state JSON"},
                      {"observer"},
                      {"batches"},
                      {"batch_size", false, "", "32"},
                      {"include_stats"},
                      {"progress"},
                      {"distributed"},
                      {"mpi_timeout"}}),
              common_flags()),
       "dbrq quantize --model=small_cnn --weights=samples/data/digits_small_cnn.safetensors \\\n"
       "      --calib=samples/data/digits_calib.safetensors --out=out/digits.qstate.json\n"
       "mpirun -np 4 dbrq_mpi quantize ... --distributed   (the MPI build: //tools/cli:dbrq_mpi)",
       run_quantize},
      {"eval", "compare a quantized model with fp32: accuracy, or SQNR without labels",
       "dbrq eval --model=NAME --state=STATE.json --data=DATA.safetensors [flags]",
       "Builds the fp32 model and a second instance that is prepared, given the saved calibration\n"
       "(load_quant_state) and converted to int8; runs both over the data and reports top-1\n"
       "accuracy against the labels when the data has \"labels\", and the SQNR of the int8 outputs\n"
       "against the fp32 ones.",
       concat(concat(model_flags(true),
                     {{"state", true}, {"data", true}, {"batches"}, {"batch_size", false, "", "32"}, {"progress"}}),
              common_flags()),
       "dbrq eval --model=small_cnn --weights=samples/data/digits_small_cnn.safetensors \\\n"
       "      --state=out/digits.qstate.json --data=samples/data/digits_test.safetensors",
       run_eval},
      {"report", "write the op-by-op numeric comparison (HTML, CSV) and print it",
       "dbrq report --model=NAME --state=STATE.json --data=DATA.safetensors --out=REPORT.html [flags]",
       "Like eval, then compares every quantized op's output with the same op of the fp32 model\n"
       "(compare_numerics): SQNR, max error and quantization parameters per op, worst first. Writes\n"
       "a self-contained HTML page with an SVG chart, optionally a CSV, and prints the table.",
       concat(concat(model_flags(true),
                     {{"state", true},
                      {"data", true},
                      {"out", true, "where to write the HTML report"},
                      {"csv"},
                      {"title"},
                      {"batches", false, "batches of the data to compare (0: all)", "4"},
                      {"batch_size", false, "", "32"}}),
              common_flags()),
       "dbrq report --model=small_cnn --weights=samples/data/digits_small_cnn.safetensors \\\n"
       "      --state=out/digits.qstate.json --data=samples/data/digits_test.safetensors \\\n"
       "      --out=out/report.html --csv=out/report.csv",
       run_report},
      {"bench", "fp32 vs int8 latency on this machine",
       "dbrq bench --model=NAME [--weights=W.safetensors] [--state=STATE.json] [flags]",
       "Times the fp32 model and its int8 conversion on the model's example input (median of --iters\n"
       "runs after warm-up). The int8 model uses the calibration in --state, or calibrates on\n"
       "--calib_batches random batches when there is none (fine for timing, not for accuracy).",
       concat(concat(model_flags(false),
                     {{"state", false, "quant-state file to convert with (default: calibrate on random data)"},
                      {"batch_size", false, "", "1"},
                      {"iters"},
                      {"calib_batches"},
                      {"progress"}}),
              common_flags()),
       "dbrq bench --model=resnet18 --batch_size=1 --threads=2 --iters=20", run_bench},
      {"tune", "search the cheapest quantization recipe that keeps accuracy (autotune)",
       "dbrq tune --model=NAME --calib=DATA.safetensors --data=DATA.safetensors --out=STATE.json [flags]",
       "Runs dbrq::autotune: calibrates and evaluates trial after trial, cheapest first (activation\n"
       "observer histogram/minmax/percentile/entropy, per-channel then per-tensor weights, then the\n"
       "most sensitive layers to bf16, then fp32, one at a time and accumulated) until the metric on\n"
       "--data is within --max_loss of fp32 (or --min_sqnr dB for --metric=sqnr). Saves the best\n"
       "trial as a quant-state file plus OUT.mapping.json (which eval, report and bench pick up),\n"
       "logs every trial to --log (rerunning resumes it) and prints the trials. Exits 0 also when\n"
       "the criterion cannot be met: the status line says so and the best found is saved.",
       concat(concat(model_flags(true),
                     {{"calib", true},
                      {"data", true},
                      {"out", true, "where to write the best trial's quant-state JSON"},
                      {"metric"},
                      {"loss"},
                      {"max_loss"},
                      {"min_sqnr"},
                      {"trials"},
                      {"time_limit"},
                      {"log"},
                      {"base_mapping"},
                      {"batches"},
                      {"batch_size", false, "", "32"},
                      {"progress"},
                      {"distributed"},
                      {"mpi_timeout"}}),
              common_flags()),
       "dbrq tune --model=small_cnn --weights=samples/data/digits_small_cnn.safetensors \\\n"
       "      --calib=samples/data/digits_calib.safetensors --data=samples/data/digits_test.safetensors \\\n"
       "      --max_loss=0 --log=out/tune.json --out=out/digits.tuned.qstate.json",
       run_tune},
      {"export", "write the int8 model as an ONNX QDQ graph (ONNX Runtime runs it)",
       "dbrq export --model=NAME --out=MODEL.onnx [--weights=W.safetensors] [--state=STATE.json] [flags]",
       "Converts the model to int8 (with the calibration in --state, or on --calib_batches random\n"
       "batches when there is none), runs it once on the model's example input and writes the ops\n"
       "that call ran as an ONNX (opset 17) QDQ graph: QuantizeLinear / DequantizeLinear with dbrq's\n"
       "scales and zero points, s8 weights with per-channel scales (docs/onnx_export.md). Shapes are\n"
       "the example's (--batch_size).",
       concat(concat(model_flags(false),
                     {{"out", true, "where to write the ONNX model"},
                      {"state", false, "quant-state file to convert with (default: calibrate on random data)"},
                      {"batch_size", false, "", "1"},
                      {"calib_batches"},
                      {"reference"},
                      {"iters", false, "also time dbrq's int8 model on the example: median of N runs (bench/onnx_bench.sh)", "0"},
                      {"progress"}}),
              common_flags()),
       "dbrq export --model=resnet18 --variant=tiny --out=out/resnet18.onnx", run_export},
  };
  return *cmds;
}

const Command* find_command(const std::string& name) {
  for (const Command& c : commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

void print_main_help(std::ostream& os) {
  os << "dbrq: define-by-run int8 quantization of zoo models on oneDNN\n\n"
     << "usage: dbrq <command> [flags]\n\ncommands:\n";
  for (const Command& c : commands()) os << absl::StrFormat("  %-10s %s\n", c.name, c.summary);
  os << "\nmodels: " << absl::StrJoin(zoo::model_names(), ", ") << "\n"
     << "Run 'dbrq <command> --help' for a command's flags. Exit codes: 0 ok, 1 failure, 2 usage error.\n";
}

void print_command_help(const Command& c, std::ostream& os) {
  os << "dbrq " << c.name << ": " << c.summary << "\n\nusage: " << c.usage << "\n\n" << c.description << "\n\nflags:\n";
  for (const FlagUse& f : c.flags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(f.name);
    const std::string metavar = metavars().at(f.name);
    const std::string lhs = metavar.empty() ? "--" + f.name : absl::StrCat("--", f.name, "=", metavar);
    std::string help = f.help.empty() ? flag->Help() : f.help;
    if (f.required) {
      help = "(required) " + help;
    } else {
      std::string def = f.default_value.empty() ? flag->DefaultValue() : f.default_value;
      if (!def.empty() && def != "0" && def != "false") absl::StrAppend(&help, " (default: ", def, ")");
    }
    // Wrapped to 100 columns, continuation lines under the help column.
    std::string line = absl::StrFormat("  %-32s", lhs);
    size_t width = line.size();
    for (const absl::string_view word : absl::StrSplit(help, ' ')) {
      if (width + 1 + word.size() > 100 && width > 35) {
        os << line << "\n";
        line = std::string(34, ' ');
        width = line.size();
      }
      absl::StrAppend(&line, " ", word);
      width += 1 + word.size();
    }
    os << line << "\n";
  }
  os << absl::StrFormat("  %-32s %s\n", "--help", "show this help");
  os << "\nexample:\n  " << c.example << "\n";
}

// ---- parsing ----

std::set<std::string> g_set_flags;  // flags given on the command line

bool is_bool_flag(const absl::CommandLineFlag& flag) { return flag.IsOfType<bool>(); }

// Parses argv[2..] for subcommand `c`. Returns false when --help was asked for.
bool parse_flags(const Command& c, int argc, char** argv) {
  std::set<std::string> allowed;
  for (const FlagUse& f : c.flags) allowed.insert(f.name);
  std::set<std::string> all_known;
  for (const Command& other : commands()) {
    for (const FlagUse& f : other.flags) all_known.insert(f.name);
  }
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-help" || arg == "--helpfull") return false;
    if (arg.size() < 3 || arg.rfind("--", 0) != 0) usage_error(absl::StrCat("unexpected argument \"", arg, "\""));
    const size_t eq = arg.find('=');
    std::string name = absl::StrReplaceAll(arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2),
                                           {{"-", "_"}});
    std::optional<std::string> value;
    if (eq != std::string::npos) value = arg.substr(eq + 1);
    // --noinclude_stats
    if (!allowed.count(name) && name.rfind("no", 0) == 0 && allowed.count(name.substr(2)) && !value) {
      const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name.substr(2));
      if (f != nullptr && is_bool_flag(*f)) {
        name = name.substr(2);
        value = "false";
      }
    }
    if (!allowed.count(name)) {
      if (all_known.count(name)) usage_error(absl::StrCat("flag --", name, " is not used by `dbrq ", c.name, "`"));
      usage_error(absl::StrCat("unknown flag --", name));
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (!value) {
      if (is_bool_flag(*flag)) {
        value = "true";
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        value = argv[++i];
      } else {
        usage_error(absl::StrCat("flag --", name, " needs a value (--", name, "=", metavars().at(name), ")"));
      }
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      usage_error(absl::StrCat("invalid value \"", *value, "\" for --", name, ": ", error));
    }
    g_set_flags.insert(name);
  }
  for (const FlagUse& f : c.flags) {
    if (f.required && (!g_set_flags.count(f.name) || absl::FindCommandLineFlag(f.name)->CurrentValue().empty())) {
      usage_error(absl::StrCat("missing required flag --", f.name, "=", metavars().at(f.name)));
    }
  }
  return true;
}

// Checks flag values that Abseil's types cannot: names from fixed sets, ranges.
void validate_flags(const Command& c) {
  try {
    zoo::find_model(absl::GetFlag(FLAGS_model));
  } catch (const dbrq::ValueError& e) {
    usage_error(absl::StrCat("invalid --model: ", e.what()));
  }
  try {
    zoo::parse_variant(absl::GetFlag(FLAGS_variant));
    pipeline::activation_observer(absl::GetFlag(FLAGS_observer));
    pipeline::parse_progress_mode(absl::GetFlag(FLAGS_progress));
  } catch (const dbrq::ValueError& e) {
    usage_error(e.what());
  }
  const std::string level = absl::GetFlag(FLAGS_log_level);
  const std::vector<std::string> levels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  if (!level.empty() && std::find(levels.begin(), levels.end(), level) == levels.end()) {
    usage_error(absl::StrCat("invalid --log_level \"", level, "\"; expected ", absl::StrJoin(levels, ", ")));
  }
  if (absl::GetFlag(FLAGS_batch_size) < 0) usage_error("--batch_size must be >= 1");
  if (g_set_flags.count("batch_size") && absl::GetFlag(FLAGS_batch_size) == 0) usage_error("--batch_size must be >= 1");
  if (absl::GetFlag(FLAGS_batches) < 0) usage_error("--batches must be >= 0 (0: all)");
  if (absl::GetFlag(FLAGS_threads) < 0) usage_error("--threads must be >= 0 (0: one per core)");
  if (absl::GetFlag(FLAGS_iters) < 1) usage_error("--iters must be >= 1");
  if (absl::GetFlag(FLAGS_calib_batches) < 1) usage_error("--calib_batches must be >= 1");
  if (!(absl::GetFlag(FLAGS_mpi_timeout) > 0)) usage_error("--mpi_timeout must be > 0 seconds");
  if (g_set_flags.count("mpi_timeout") && !absl::GetFlag(FLAGS_distributed)) {
    usage_error("--mpi_timeout needs --distributed");
  }
#ifndef DBRQ_WITH_MPI
  if (absl::GetFlag(FLAGS_distributed)) {
    usage_error(
        "--distributed needs the MPI build of dbrq: install OpenMPI (tools/setup.sh), bazel build -c opt "
        "//tools/cli:dbrq_mpi, then: mpirun -np N bazel-bin/tools/cli/dbrq_mpi quantize ... --distributed");
  }
#endif
  if (absl::GetFlag(FLAGS_trials) < 1) usage_error("--trials must be >= 1");
  if (!(absl::GetFlag(FLAGS_time_limit) >= 0)) usage_error("--time_limit must be >= 0 (0: no limit)");
  if (!(absl::GetFlag(FLAGS_max_loss) >= 0) || !std::isfinite(absl::GetFlag(FLAGS_max_loss))) {
    usage_error("--max_loss must be a finite number >= 0");
  }
  if (!std::isfinite(absl::GetFlag(FLAGS_min_sqnr))) usage_error("--min_sqnr must be a finite number of dB");
  const std::string metric = absl::GetFlag(FLAGS_metric), loss = absl::GetFlag(FLAGS_loss);
  if (metric != "accuracy" && metric != "sqnr") usage_error("invalid --metric \"" + metric + "\"; expected accuracy or sqnr");
  if (loss != "relative" && loss != "absolute") usage_error("invalid --loss \"" + loss + "\"; expected relative or absolute");
  const std::string base = absl::GetFlag(FLAGS_base_mapping);
  if (base != "default" && base != "transformer" && !absl::EndsWith(base, ".json")) {
    usage_error("invalid --base_mapping \"" + base +
                "\"; expected default, transformer or a qconfig mapping JSON file (FILE.json)");
  }
}

// ---- shared steps ----

std::string path_flag(const absl::Flag<std::string>& flag) {
  return pipeline::resolve_user_path(absl::GetFlag(flag));
}

int64_t batch_size_or(int64_t fallback) {
  const int64_t b = absl::GetFlag(FLAGS_batch_size);
  return b > 0 ? b : fallback;
}

pipeline::ProgressMode progress_mode() { return pipeline::parse_progress_mode(absl::GetFlag(FLAGS_progress)); }

// How quantize and eval walk their data: --batch_size (default 32), --batches, --progress.
pipeline::RunOptions data_run_options() {
  pipeline::RunOptions opts;
  opts.batch_size = batch_size_or(32);
  opts.max_batches = absl::GetFlag(FLAGS_batches);
  opts.progress = progress_mode();
  return opts;
}

// Runs `f`, prefixing any dbrq::Error's message with the flag whose file failed ("--calib: ...").
template <typename F>
auto for_flag(const std::string& flag, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dbrq::Error& e) {
    e.rethrow_with_context("--" + flag + ": ");
  }
  throw;  // not reached: rethrow_with_context throws
}

struct Setup {
  const zoo::ModelSpec* spec = nullptr;
  zoo::Variant variant = zoo::Variant::kFull;
  std::shared_ptr<dbrq::nn::Module> model;
};

Setup build_model() {
  Setup s;
  s.spec = &zoo::find_model(absl::GetFlag(FLAGS_model));
  s.variant = zoo::parse_variant(absl::GetFlag(FLAGS_variant));
  const std::string weights = path_flag(FLAGS_weights);
  s.model = for_flag("weights", [&] { return pipeline::build_model(*s.spec, s.variant, weights, absl::GetFlag(FLAGS_seed)); });
  std::cout << absl::StrFormat("model:     %s (%s), %d parameters, ", s.spec->name, zoo::variant_name(s.variant),
                               zoo::parameter_count(*s.model))
            << (weights.empty() ? absl::StrCat("random weights (seed ", absl::GetFlag(FLAGS_seed), ")")
                                : "weights " + absl::GetFlag(FLAGS_weights))
            << "\n";
  return s;
}

pipeline::Dataset load_data(const std::string& flag_name, const absl::Flag<std::string>& flag, const Setup& s) {
  return for_flag(flag_name, [&] {
    pipeline::Dataset d = pipeline::load_dataset(path_flag(flag));
    pipeline::check_dataset_fits(d, *s.spec, s.variant);
    return d;
  });
}

// Fails before any work when an output file's directory does not exist.
void check_output_path(const std::string& flag_name, const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return;
  const std::string dir = path.substr(0, slash);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    DBRQ_THROW(dbrq::IOError, "--", flag_name, ": cannot write ", path, ": directory ", dir, " does not exist");
  }
}

// fp32 model -> a second instance prepared with the saved calibration and converted.
std::shared_ptr<dbrq::nn::Module> quantized_from_state(const Setup& s, const dbrq::Tensor& example) {
  const std::string state_path = path_flag(FLAGS_state);
  std::string observer;
  dbrq::QConfigMapping mapping =
      for_flag("state", [&] { return pipeline::qconfig_mapping_from_state_file(state_path, &observer); });
  // A state written by `dbrq tune` has its full mapping next to it (layers in bf16 / fp32, weights).
  struct stat mapping_st;
  if (::stat((state_path + ".mapping.json").c_str(), &mapping_st) == 0) {
    mapping = for_flag("state", [&] { return dbrq::load_qconfig_mapping(state_path + ".mapping.json"); });
    observer += ", mapping " + absl::GetFlag(FLAGS_state) + ".mapping.json";
  }
  auto q = pipeline::clone_model(*s.spec, s.variant, *s.model);
  dbrq::prepare(*q, {example}, mapping);
  for_flag("state", [&] { dbrq::load_quant_state(*q, state_path); });
  dbrq::convert(*q);
  std::cout << "state:     " << absl::GetFlag(FLAGS_state) << " (activations: " << observer << ")\n";
  return q;
}

// ---- subcommands ----

#ifdef DBRQ_WITH_MPI
int run_quantize_distributed();
#endif

int run_quantize() {
#ifdef DBRQ_WITH_MPI
  if (absl::GetFlag(FLAGS_distributed)) return run_quantize_distributed();
#endif
  check_output_path("out", path_flag(FLAGS_out));
  Setup s = build_model();
  const pipeline::Dataset calib = load_data("calib", FLAGS_calib, s);
  std::cout << "calib:     " << absl::GetFlag(FLAGS_calib) << ": " << pipeline::describe(calib) << "\n";
  pipeline::RunOptions opts = data_run_options();
  dbrq::prepare(*s.model, {calib.input_batch(0, opts.batch_size)},
                pipeline::qconfig_mapping_for(absl::GetFlag(FLAGS_observer)));
  const pipeline::OpCounts counts = pipeline::op_counts(*s.model);
  std::cout << "prepared:  " << counts.recorded << " quantizeable ops recorded, " << counts.observers << " "
            << absl::GetFlag(FLAGS_observer) << " observers\n";
  const pipeline::CalibrationResult r = pipeline::calibrate(*s.spec, *s.model, calib, opts);
  std::cout << absl::StrFormat("calibrated: %d batches (%d samples) in %s, %.1f batches/s\n", r.batches, r.samples,
                               format_ms(r.seconds * 1e3), r.seconds > 0 ? r.batches / r.seconds : 0.0);
  dbrq::save_quant_state(*s.model, path_flag(FLAGS_out), {absl::GetFlag(FLAGS_include_stats)});
  std::cout << "saved:     " << absl::GetFlag(FLAGS_out) << "\n";
  return kExitOk;
}

#ifdef DBRQ_WITH_MPI
std::string one_line(std::string s);
std::string error_kind(const std::exception& e);
int report_rank_error(const char* command, const std::exception& e);

// `mpirun -np N dbrq_mpi quantize ... --distributed` (docs/distributed.md): every rank builds the
// model, loads its data and prepares on the first batch; rank r calibrates batches r, r+n, ...
// (or every batch of its own file when --calib contains %r); rank 0 merges, saves once. Errors
// are printed here, by every rank, before MPI_Finalize: a rank exiting non-zero makes mpirun end
// the others, which must have printed by then.
int run_quantize_distributed() {
  dbrq::distributed::MpiSession mpi(nullptr, nullptr);
  int exit_code = kExitOk;
  int rank = 0;
  try {
    dbrq::distributed::Comm comm(absl::GetFlag(FLAGS_mpi_timeout));
    rank = comm.rank();
    if (rank != 0) std::cout.setstate(std::ios::failbit);  // one report, from rank 0
    const std::string calib_flag = absl::GetFlag(FLAGS_calib);
    const bool presharded = calib_flag.find("%r") != std::string::npos;
    const pipeline::RunOptions opts = data_run_options();
    Setup s;
    pipeline::Dataset calib;
    int64_t batches = 0;
    dbrq::distributed::Replica replica;
    replica.prepare = [&]() -> dbrq::nn::Module& {
      // Only rank 0 writes --out (other nodes need not see its directory); checked here, inside
      // the collective, so a bad path fails every rank at once with rank 0's message.
      if (rank == 0) check_output_path("out", path_flag(FLAGS_out));
      s = build_model();
      const std::string path = absl::StrReplaceAll(calib_flag, {{"%r", std::to_string(rank)}});
      calib = for_flag("calib", [&] {
        pipeline::Dataset d = pipeline::load_dataset(pipeline::resolve_user_path(path));
        pipeline::check_dataset_fits(d, *s.spec, s.variant);
        return d;
      });
      std::cout << "calib:     " << calib_flag << ": " << pipeline::describe(calib) << "\n";
      batches = calib.num_batches(opts.batch_size, opts.max_batches);
      dbrq::prepare(*s.model, {calib.input_batch(0, opts.batch_size)},
                    pipeline::qconfig_mapping_for(absl::GetFlag(FLAGS_observer)));
      return *s.model;
    };
    int64_t done = 0;
    replica.calibrate = [&](dbrq::nn::Module& m, dbrq::distributed::Shard& shard) {
      std::vector<int64_t> mine;  // a shard file per rank: all of it; one shared file: batches r, r+n, ...
      if (presharded) {
        for (int64_t b = 0; b < batches; ++b) mine.push_back(b);
      } else {
        mine = shard.items(batches);
      }
      for (int64_t b : mine) {
        if (shard.stop_requested()) return;
        s.spec->run(m, calib.input_batch(b, opts.batch_size));
        ++done;
      }
    };
    dbrq::distributed::DistributedOptions options;
    options.save_path = path_flag(FLAGS_out);
    options.save_options.include_observer_stats = absl::GetFlag(FLAGS_include_stats);
    const dbrq::distributed::ReductionStats st = dbrq::distributed::calibrate(comm, replica, options);
    std::cout << absl::StrFormat("calibrated: %d ranks, %d batches on rank 0 in %s\n", comm.size(), done,
                                 format_ms(st.calibrate_ms))
              << absl::StrFormat("reduction: %d bytes of statistics gathered, %d bytes of parameters broadcast, "
                                 "%s (gather %s, merge %s, broadcast %s)\n",
                                 st.gathered_bytes, st.broadcast_bytes, format_ms(st.reduction_ms()),
                                 format_ms(st.gather_ms), format_ms(st.merge_ms), format_ms(st.broadcast_ms))
              << "saved:     " << absl::GetFlag(FLAGS_out) << "\n"
              << absl::StrFormat(  // for scripts (bench/distributed_calibration.py)
                     "timing: {\"ranks\": %d, \"batches_rank0\": %d, \"prepare_ms\": %.3f, \"calibrate_ms\": %.3f, "
                     "\"vote_ms\": %.3f, \"reduction_ms\": %.3f, \"gather_ms\": %.3f, \"merge_ms\": %.3f, "
                     "\"broadcast_ms\": %.3f, \"save_ms\": %.3f, \"gathered_bytes\": %d, \"broadcast_bytes\": %d}\n",
                     comm.size(), done, st.prepare_ms, st.calibrate_ms, st.vote_ms, st.reduction_ms(), st.gather_ms,
                     st.merge_ms, st.broadcast_ms, st.save_ms, st.gathered_bytes, st.broadcast_bytes);
  } catch (const std::exception& e) {
    exit_code = report_rank_error("quantize", e);
  }
  std::cout.clear();
  return exit_code;
}
#endif

int run_eval() {
  Setup s = build_model();
  const pipeline::Dataset data = load_data("data", FLAGS_data, s);
  std::cout << "data:      " << absl::GetFlag(FLAGS_data) << ": " << pipeline::describe(data) << "\n";
  pipeline::RunOptions opts = data_run_options();
  opts.progress_label = "evaluating";
  auto q = quantized_from_state(s, data.input_batch(0, opts.batch_size));
  const pipeline::EvalResult r = pipeline::evaluate(*s.spec, *s.model, *q, data, opts);
  std::cout << absl::StrFormat("\n%-20s %12s %12s\n", "", "fp32", "int8");
  if (r.has_accuracy) {
    std::cout << absl::StrFormat("%-20s %12s %12s   (%d vs %d of %d correct)\n", "top-1 accuracy",
                                 format_percent(r.fp32_accuracy()), format_percent(r.int8_accuracy()), r.fp32_correct,
                                 r.int8_correct, r.samples);
  }
  std::cout << absl::StrFormat("%-20s %12s %12s   (%d samples in batches of %d)\n", "time, whole pass",
                               format_ms(r.fp32_seconds * 1e3), format_ms(r.int8_seconds * 1e3), r.samples,
                               opts.batch_size);
  if (!r.has_accuracy && data.has_labels()) {
    std::cout << "(labels ignored: the model's outputs are not [N, classes])\n";
  }
  if (r.has_accuracy || r.top1_agree > 0) {
    std::cout << "top-1 agreement int8 vs fp32: " << format_percent(r.agreement()) << "\n";
  }
  std::cout << "output SQNR int8 vs fp32: " << format_db(r.sqnr_db())
            << absl::StrFormat(" (max |error| %.4g)\n", r.max_abs_error);
  return kExitOk;
}

int run_report() {
  check_output_path("out", path_flag(FLAGS_out));
  if (!absl::GetFlag(FLAGS_csv).empty()) check_output_path("csv", path_flag(FLAGS_csv));
  Setup s = build_model();
  const pipeline::Dataset data = load_data("data", FLAGS_data, s);
  std::cout << "data:      " << absl::GetFlag(FLAGS_data) << ": " << pipeline::describe(data) << "\n";
  const int64_t batch_size = batch_size_or(32);
  const int64_t max_batches = g_set_flags.count("batches") ? absl::GetFlag(FLAGS_batches) : 4;
  auto q = quantized_from_state(s, data.input_batch(0, batch_size));
  const dbrq::NumericReport report =
      dbrq::compare_numerics(*s.model, *q, pipeline::numerics_inputs(data, batch_size, max_batches));
  const std::string title = absl::GetFlag(FLAGS_title).empty()
                                ? absl::StrCat(s.spec->name, " (", zoo::variant_name(s.variant), ")")
                                : absl::GetFlag(FLAGS_title);
  std::cout << "\n" << report.to_table() << "\n";
  std::cout << absl::StrFormat("%d ops over %d batches; model output SQNR %s, max |error| %.4g\n", report.ops.size(),
                               report.batches, format_db(report.output_sqnr_db), report.output_max_abs_error);
  dbrq::write_text_file(path_flag(FLAGS_out), report.to_html(title));
  std::cout << "wrote:     " << absl::GetFlag(FLAGS_out) << "\n";
  if (!absl::GetFlag(FLAGS_csv).empty()) {
    dbrq::write_text_file(path_flag(FLAGS_csv), report.to_csv());
    std::cout << "wrote:     " << absl::GetFlag(FLAGS_csv) << "\n";
  }
  return kExitOk;
}

// The int8 model of bench and export: converted with --state's calibration, or else calibrated on
// --calib_batches random batches of `batch` (printing `note` after the count).
std::shared_ptr<dbrq::nn::Module> int8_model(const Setup& s, const dbrq::Tensor& input, int64_t batch,
                                             const std::string& note) {
  if (!absl::GetFlag(FLAGS_state).empty()) return quantized_from_state(s, input);
  std::shared_ptr<dbrq::nn::Module> q = pipeline::clone_model(*s.spec, s.variant, *s.model);
  dbrq::prepare(*q, {input}, dbrq::default_qconfig_mapping("onednn"));
  const int64_t n = absl::GetFlag(FLAGS_calib_batches);
  pipeline::ProgressBar bar("calibrating on random data", n, "batches", progress_mode());
  for (int64_t i = 0; i < n; ++i) {
    s.spec->run(*q, s.spec->example_input(s.variant, batch, /*seed=*/100 + static_cast<uint64_t>(i)));
    bar.update(i + 1);
  }
  bar.finish();
  dbrq::convert(*q);
  std::cout << "state:     calibrated on " << n << " random batches" << note << "\n";
  return q;
}

int run_bench() {
  Setup s = build_model();
  const int64_t batch = batch_size_or(1);
  const int iters = absl::GetFlag(FLAGS_iters);
  const dbrq::Tensor input = s.spec->example_input(s.variant, batch, /*seed=*/1);
  std::cout << "input:     " << input.shape_string() << " " << dbrq::dtype_name(input.dtype()) << ", threads "
            << dbrq::get_num_threads() << ", " << iters << " timed runs\n";
  std::shared_ptr<dbrq::nn::Module> q = int8_model(s, input, batch, " (timing only; see --state)");
  const pipeline::Latency f = pipeline::measure_latency(*s.spec, *s.model, input, iters);
  const pipeline::Latency i8 = pipeline::measure_latency(*s.spec, *q, input, iters);
  std::cout << absl::StrFormat("\n%-6s %12s %12s %12s %12s\n", "", "median", "min", "mean", "first call");
  for (const auto& [name, l] : {std::pair<const char*, const pipeline::Latency&>{"fp32", f}, {"int8", i8}}) {
    std::cout << absl::StrFormat("%-6s %12s %12s %12s %12s\n", name, format_ms(l.median_ms), format_ms(l.min_ms),
                                 format_ms(l.mean_ms), format_ms(l.first_ms));
  }
  std::cout << absl::StrFormat("int8 speedup (median): %.2fx\n", i8.median_ms > 0 ? f.median_ms / i8.median_ms : 0.0);
  return kExitOk;
}

std::string error_kind(const std::exception& e);

using TuneFn = std::function<dbrq::AutotuneResult(
    const dbrq::ModelFactory&, const std::vector<std::vector<dbrq::Tensor>>&, const dbrq::EvaluateFn&,
    const dbrq::TuneCriterion&, const dbrq::TuneBudget&, const dbrq::AutotuneOptions&)>;

// `dbrq tune` with `tune` doing the search (dbrq::autotune, or distributed::autotune). With
// `setup_vote` (distributed), a failure before the search (a flag, a file) is passed to it instead
// of thrown, so that every rank learns it; `writer`: this process checks and writes the output.
int run_tune_with(const TuneFn& tune, const std::function<void(const std::string&)>& setup_vote = nullptr,
                  bool writer = true) {
  Setup s;
  pipeline::Dataset calib, data;
  bool accuracy = false;
  int64_t batch = 0, eval_batches = 0;
  std::vector<std::vector<dbrq::Tensor>> calibration;
  std::vector<dbrq::Tensor> reference;  // fp32 outputs, for sqnr
  std::optional<dbrq::QConfigMapping> base_mapping;  // --base_mapping
  std::string setup_error;
  try {
    if (writer) {
      check_output_path("out", path_flag(FLAGS_out));
      if (!absl::GetFlag(FLAGS_log).empty()) check_output_path("log", path_flag(FLAGS_log));
    }
    s = build_model();
    calib = load_data("calib", FLAGS_calib, s);
    data = load_data("data", FLAGS_data, s);
    std::cout << "calib:     " << absl::GetFlag(FLAGS_calib) << ": " << pipeline::describe(calib) << "\n";
    std::cout << "data:      " << absl::GetFlag(FLAGS_data) << ": " << pipeline::describe(data) << "\n";
    const std::string base = absl::GetFlag(FLAGS_base_mapping);
    if (base == "transformer") {
      base_mapping = dbrq::transformer_qconfig_mapping("onednn");
    } else if (base != "default") {
      base_mapping = for_flag("base_mapping", [&] { return dbrq::load_qconfig_mapping(path_flag(FLAGS_base_mapping)); });
    }
    if (base != "default") std::cout << "base:      " << base << "\n";
    accuracy = absl::GetFlag(FLAGS_metric) == "accuracy";
    if (accuracy && !data.has_labels()) {
      usage_error("--metric=accuracy needs \"labels\" in --data; use --metric=sqnr for unlabeled data");
    }
    batch = batch_size_or(32);
    for (int64_t i = 0; i < calib.num_batches(batch, absl::GetFlag(FLAGS_batches)); ++i) {
      calibration.push_back({calib.input_batch(i, batch)});
    }
    eval_batches = data.num_batches(batch);
    if (!accuracy) {
      for (int64_t i = 0; i < eval_batches; ++i) reference.push_back(s.spec->run(*s.model, data.input_batch(i, batch)));
    }
  } catch (const std::exception& e) {
    if (!setup_vote) throw;
    setup_error = absl::StrCat(e.what(), " [", error_kind(e), "]");
  }
  if (setup_vote) setup_vote(setup_error);
  const zoo::ModelSpec& spec = *s.spec;
  auto evaluate = [&](dbrq::nn::Module& m) -> double {
    int64_t correct = 0, n = 0;
    double sig = 0, err = 0;
    for (int64_t i = 0; i < eval_batches; ++i) {
      const dbrq::Tensor y = spec.run(m, data.input_batch(i, batch)).contiguous();
      const std::vector<float> v = y.to_vector<float>();
      if (accuracy) {
        if (y.dim() != 2) DBRQ_THROW(dbrq::ValueError, "--metric=accuracy needs [N, classes] outputs, got ", y.shape_string());
        const int64_t classes = y.size(1);
        for (int64_t r = 0; r < y.size(0); ++r, ++n) {
          int64_t arg = 0;
          for (int64_t c = 1; c < classes; ++c) arg = v[r * classes + c] > v[r * classes + arg] ? c : arg;
          correct += arg == data.labels[static_cast<size_t>(n)];
        }
      } else {
        const std::vector<float> ref = reference[static_cast<size_t>(i)].contiguous().to_vector<float>();
        for (size_t k = 0; k < v.size(); ++k) {
          sig += double(ref[k]) * ref[k];
          err += (double(ref[k]) - v[k]) * (double(ref[k]) - v[k]);
        }
      }
    }
    if (accuracy) return n > 0 ? double(correct) / double(n) : 0.0;
    return err == 0 ? std::numeric_limits<double>::infinity() : 10.0 * std::log10(sig / err);
  };
  dbrq::TuneCriterion criterion =
      !accuracy ? dbrq::TuneCriterion::at_least(absl::GetFlag(FLAGS_min_sqnr))
      : absl::GetFlag(FLAGS_loss) == "relative" ? dbrq::TuneCriterion::relative_loss(absl::GetFlag(FLAGS_max_loss))
                                                : dbrq::TuneCriterion::absolute_loss(absl::GetFlag(FLAGS_max_loss));
  // An upper bound on the trials: 8 observer / weight configs, then each layer twice.
  int64_t leaves = 0;
  for (const auto& [fqn, m] : s.model->named_modules()) leaves += !fqn.empty() && m->children().empty();
  const int64_t bound = std::min<int64_t>(absl::GetFlag(FLAGS_trials), 8 + 2 * leaves);
  pipeline::ProgressBar bar("tuning", bound, "trials", writer ? progress_mode() : pipeline::ProgressMode::kNever);
  dbrq::AutotuneOptions opt;
  opt.base_mapping = base_mapping;
  opt.log_path = absl::GetFlag(FLAGS_log).empty() ? "" : path_flag(FLAGS_log);
  opt.quant_state_path = path_flag(FLAGS_out);
  opt.on_trial = [&](const dbrq::TuneProgress& p) { bar.update(std::min<int64_t>(p.trials_done, bound)); };
  dbrq::TuneBudget budget{absl::GetFlag(FLAGS_trials), absl::GetFlag(FLAGS_time_limit)};
  const auto tune_start = std::chrono::steady_clock::now();
  const dbrq::AutotuneResult r =
      tune([&] { return pipeline::clone_model(spec, s.variant, *s.model); }, calibration, evaluate, criterion, budget, opt);
  const double tune_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tune_start).count();
  bar.finish();
  std::cout << "\n" << r.to_string();
  std::cout << absl::StrFormat("searched:  %d trials in %.3f s\n", r.trials.size(), tune_seconds);
  std::cout << "status:    " << dbrq::tune_status_name(r.status) << "\n";
  if (r.best_trial >= 0) {
    std::cout << "saved:     " << absl::GetFlag(FLAGS_out) << " and " << absl::GetFlag(FLAGS_out) << ".mapping.json\n";
  }
  if (!opt.log_path.empty()) std::cout << "log:       " << absl::GetFlag(FLAGS_log) << "\n";
  return kExitOk;
}

#ifdef DBRQ_WITH_MPI
int run_tune_distributed();
#endif

int run_tune() {
#ifdef DBRQ_WITH_MPI
  if (absl::GetFlag(FLAGS_distributed)) return run_tune_distributed();
#endif
  return run_tune_with(dbrq::autotune);
}

#ifdef DBRQ_WITH_MPI
// `mpirun -np N dbrq_mpi tune ... --distributed` (docs/distributed.md): every rank loads the model
// and all the data; trials are evaluated in parallel, the choice is the one-process choice; rank 0
// prints the report and writes --out and --log. Errors are printed by every rank, as in quantize.
int run_tune_distributed() {
  dbrq::distributed::MpiSession mpi(nullptr, nullptr);
  int exit_code = kExitOk;
  try {
    dbrq::distributed::Comm comm(absl::GetFlag(FLAGS_mpi_timeout));
    if (comm.rank() != 0) std::cout.setstate(std::ios::failbit);  // one report, from rank 0
    dbrq::distributed::TuneStats st;
    auto tune = [&](const dbrq::ModelFactory& make, const std::vector<std::vector<dbrq::Tensor>>& calib,
                    const dbrq::EvaluateFn& evaluate, const dbrq::TuneCriterion& criterion,
                    const dbrq::TuneBudget& budget, const dbrq::AutotuneOptions& opt) {
      return dbrq::distributed::autotune(comm, make, calib, evaluate, criterion, budget, opt, &st);
    };
    auto vote = [&](const std::string& error) {
      dbrq::distributed::RankStatus mine;
      mine.ok = error.empty();
      mine.message = error;
      comm.agree_or_throw(mine, "loading the model and data");
    };
    exit_code = run_tune_with(tune, vote, comm.rank() == 0);
    std::cout << absl::StrFormat(
        "ranks:     %d; %d trials evaluated in %d rounds, %d speculative ones discarded (not counted, not logged)%s\n",
        st.ranks, st.evaluated, st.rounds, st.discarded, st.rebuilt_best ? "; best model rebuilt on rank 0" : "");
  } catch (const std::exception& e) {
    exit_code = report_rank_error("tune", e);
  }
  std::cout.clear();
  return exit_code;
}
#endif

int run_export() {
  Setup s = build_model();
  const int64_t batch = batch_size_or(1);
  const dbrq::Tensor input = s.spec->example_input(s.variant, batch, /*seed=*/1);
  std::shared_ptr<dbrq::nn::Module> q = int8_model(s, input, batch, "");
  const std::string out = path_flag(FLAGS_out);
  const std::string ref = path_flag(FLAGS_reference);
  dbrq::OnnxExportOptions options;
  options.int8_inputs_of_fp32_outputs = !ref.empty();  // the reference compares at int8 tensors too
  const dbrq::OnnxExportSummary r = dbrq::export_onnx(*q, {input}, out, options);
  std::cout << absl::StrFormat("onnx:      %s: %d nodes (%d QuantizeLinear), %d initializers, %d bytes, opset 17\n",
                               out, r.nodes, r.quantize_nodes, r.initializers, r.bytes);
  if (!ref.empty()) {
    dbrq::NamedTensors t{{"input_0", input}};
    std::map<std::string, std::string> meta;
    for (size_t k = 0; k < r.output_names.size(); ++k) {
      t.emplace_back(r.output_names[k], r.output_values[k]);
      meta[r.output_names[k] + "_step"] = absl::StrCat(r.output_scales[k]);
    }
    dbrq::save_safetensors(ref, t, meta);
    std::cout << "reference: " << ref << " (input_0, dbrq's outputs: " << absl::StrJoin(r.output_names, ", ") << ")\n";
  }
  if (g_set_flags.count("iters") != 0 && absl::GetFlag(FLAGS_iters) > 0) {
    const pipeline::Latency l = pipeline::measure_latency(*s.spec, *q, input, absl::GetFlag(FLAGS_iters));
    std::cout << absl::StrFormat("dbrq int8: median %.3f ms over %d runs, %d threads\n", l.median_ms,
                                 absl::GetFlag(FLAGS_iters), dbrq::get_num_threads());
  }
  return kExitOk;
}

// Long bracketed lists (every missing key of a state dict) shortened to their first entries, so
// the reason stays readable on one line.
std::string shorten_lists(const std::string& s) {
  constexpr size_t kKeep = 6;
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t open = s.find('[', i);
    const size_t close = open == std::string::npos ? std::string::npos : s.find(']', open);
    if (close == std::string::npos) {
      out += s.substr(i);
      break;
    }
    out += s.substr(i, open - i);
    const std::vector<std::string> items = absl::StrSplit(s.substr(open + 1, close - open - 1), ", ");
    if (items.size() > kKeep + 2) {
      out += absl::StrCat("[", absl::StrJoin(items.begin(), items.begin() + kKeep, ", "), ", ... ",
                          items.size() - kKeep, " more]");
    } else {
      out += s.substr(open, close - open + 1);
    }
    i = close + 1;
  }
  return out;
}

// One line: messages that span lines (lists of keys) are joined.
std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return shorten_lists(absl::StrReplaceAll(s, {{"\r", ""}, {"\n", "; "}}));
}

// "StateMismatchError" for a dbrq::StateMismatchError.
std::string error_kind(const std::exception& e) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : typeid(e).name();
  std::free(demangled);
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

#ifdef DBRQ_WITH_MPI
// A distributed command's error on this rank, "dbrq <command>: error: <message> [<ErrorKind>]",
// in one write (every rank shares the pipe); returns the failure exit code.
int report_rank_error(const char* command, const std::exception& e) {
  const std::string line = absl::StrCat("dbrq ", command, ": error: ", one_line(e.what()), " [", error_kind(e), "]\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  return kExitFailure;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  std::string where = "dbrq";
  const Command* command = nullptr;
  try {
    if (argc < 2) usage_error("no command given");
    const std::string first = argv[1];
    if (first == "--help" || first == "-h" || first == "help") {
      if (first == "help" && argc > 2) {
        command = find_command(argv[2]);
        if (command == nullptr) usage_error(absl::StrCat("unknown command \"", argv[2], "\""));
        print_command_help(*command, std::cout);
      } else {
        print_main_help(std::cout);
      }
      return kExitOk;
    }
    command = find_command(first);
    if (command == nullptr) {
      usage_error(absl::StrCat(first.rfind("-", 0) == 0 ? "expected a command before flags, got \"" : "unknown command \"",
                               first, "\"; commands: quantize, eval, report, bench, tune, export"));
    }
    where = "dbrq " + command->name;
    if (!parse_flags(*command, argc, argv)) {
      print_command_help(*command, std::cout);
      return kExitOk;
    }
    validate_flags(*command);
    if (!absl::GetFlag(FLAGS_log_level).empty()) dbrq::set_log_level(absl::GetFlag(FLAGS_log_level));
    if (absl::GetFlag(FLAGS_threads) > 0) dbrq::set_num_threads(absl::GetFlag(FLAGS_threads));
    return command->run();
  } catch (const UsageError& e) {
    std::cerr << where << ": " << one_line(e.message) << "\n"
              << "Run '" << (command ? "dbrq " + command->name + " --help" : std::string("dbrq --help"))
              << "' for usage.\n";
    return kExitUsage;
  } catch (const dbrq::Error& e) {
    std::cerr << where << ": error: " << one_line(e.what()) << " [" << error_kind(e) << "]\n";
    return kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << where << ": error: " << one_line(e.what()) << " [" << error_kind(e) << "]\n";
    return kExitFailure;
  } catch (...) {
    std::cerr << where << ": error: unknown exception\n";
    return kExitFailure;
  }
}
