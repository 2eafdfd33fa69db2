// dbrq: the command line tool. Quantizes zoo models to int8, evaluates them against fp32, writes
// the numeric report and measures latency.
//
//   dbrq quantize --model=small_cnn --weights=W.safetensors --calib=CALIB.safetensors --out=S.json
//   dbrq eval     --model=small_cnn --weights=W.safetensors --state=S.json --data=TEST.safetensors
//   dbrq report   --model=small_cnn --weights=W.safetensors --state=S.json --data=TEST.safetensors
//                 --out=report.html --csv=report.csv   (one command line)
//   dbrq bench    --model=resnet18 --batch_size=1 --threads=2 --iters=50
//   dbrq quantize --help
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
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "dbrq.h"
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
ABSL_FLAG(std::string, progress, "auto",
          "progress bar on stderr: auto (in place on a terminal, plain lines otherwise), always or never");
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
                      {"progress"}}),
              common_flags()),
       "dbrq quantize --model=small_cnn --weights=samples/data/digits_small_cnn.safetensors \\\n"
       "      --calib=samples/data/digits_calib.safetensors --out=out/digits.qstate.json",
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
  auto q = pipeline::clone_model(*s.spec, s.variant, *s.model);
  dbrq::prepare(*q, {example}, mapping);
  for_flag("state", [&] { dbrq::load_quant_state(*q, state_path); });
  dbrq::convert(*q);
  std::cout << "state:     " << absl::GetFlag(FLAGS_state) << " (activations: " << observer << ")\n";
  return q;
}

// ---- subcommands ----

int run_quantize() {
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

int run_bench() {
  Setup s = build_model();
  const int64_t batch = batch_size_or(1);
  const int iters = absl::GetFlag(FLAGS_iters);
  const dbrq::Tensor input = s.spec->example_input(s.variant, batch, /*seed=*/1);
  std::cout << "input:     " << input.shape_string() << " " << dbrq::dtype_name(input.dtype()) << ", threads "
            << dbrq::get_num_threads() << ", " << iters << " timed runs\n";
  std::shared_ptr<dbrq::nn::Module> q;
  if (!absl::GetFlag(FLAGS_state).empty()) {
    q = quantized_from_state(s, input);
  } else {
    q = pipeline::clone_model(*s.spec, s.variant, *s.model);
    dbrq::prepare(*q, {input}, dbrq::default_qconfig_mapping("onednn"));
    const int64_t n = absl::GetFlag(FLAGS_calib_batches);
    pipeline::ProgressBar bar("calibrating on random data", n, "batches", progress_mode());
    for (int64_t i = 0; i < n; ++i) {
      s.spec->run(*q, s.spec->example_input(s.variant, batch, /*seed=*/100 + static_cast<uint64_t>(i)));
      bar.update(i + 1);
    }
    bar.finish();
    dbrq::convert(*q);
    std::cout << "state:     calibrated on " << n << " random batches (timing only; see --state)\n";
  }
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
                               first, "\"; commands: quantize, eval, report, bench"));
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
