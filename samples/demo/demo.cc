// The dbrq demo: int8 post-training quantization of a small CNN trained on handwritten digits,
// step by step, on the bundled weights and data (samples/data, made by tools/train_digits.py).
//
//   tools/run_demo.sh                                      # setup, build, run (what the README says)
//   bazel run -c opt //samples/demo                        # writes out/ in the workspace
//   bazel run -c opt //samples/demo -- --out_dir=/tmp/demo --observer=entropy
//   bazel run -c opt //samples/demo -- --model=resnet18 --batch_size=1   # any zoo model, random weights
//   bazel run //samples/demo -- --help
//
// Steps: build zoo::SmallCnn, load the trained weights, prepare (trace the first call), calibrate
// on the calibration split, save the calibration, convert to int8, then compare fp32 and int8 on
// the held-back test split (accuracy, latency, output SQNR) and write the op-by-op HTML report.
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "dbrq.h"
#include "samples/demo/pipeline.h"
#include "samples/zoo/zoo.h"

ABSL_FLAG(std::string, out_dir, "",
          "where to write the quant state and the reports (default: out/ in the workspace under bazel run, "
          "else ./out)");
ABSL_FLAG(std::string, observer, "histogram", "activation observer: histogram, minmax, percentile, entropy or mse");
ABSL_FLAG(int64_t, batch_size, 32, "samples per batch for calibration and evaluation");
ABSL_FLAG(int32_t, iters, 200, "timed runs for the latency comparison");
ABSL_FLAG(int32_t, threads, 0, "threads for every kernel (0: one per core)");
ABSL_FLAG(std::string, progress, "auto", "progress bars: auto, always or never");
ABSL_FLAG(std::string, model, "",
          "instead of the digits demo, run a zoo model with random weights and random calibration data: "
          "resnet18, mobilenet_v2, bert_encoder, small_cnn, decoder_lm, gru_classifier, vit, dcgan_generator, "
          "unet, kws_conv1d, densenet");
ABSL_FLAG(std::string, variant, "full", "with --model: full or tiny");
ABSL_FLAG(uint64_t, seed, 0, "with --model: seed of the random weights and data");

namespace {

using pipeline::format_db;
using pipeline::format_ms;
using pipeline::format_percent;

constexpr const char* kWeights = "samples/data/digits_small_cnn.safetensors";
constexpr const char* kCalib = "samples/data/digits_calib.safetensors";
constexpr const char* kTest = "samples/data/digits_test.safetensors";

const std::vector<std::string> kFlagNames = {"out_dir", "observer", "batch_size", "iters", "threads",
                                             "progress", "model",    "variant",    "seed"};

struct UsageError {
  std::string message;
};

void print_help() {
  std::cout << "dbrq demo: int8 quantization of a small CNN on handwritten digits, step by step\n\n"
            << "usage: demo [flags]\n\nflags:\n";
  for (const std::string& name : kFlagNames) {
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    std::string help = f->Help();
    if (!f->DefaultValue().empty()) absl::StrAppend(&help, " (default: ", f->DefaultValue(), ")");
    std::cout << absl::StrFormat("  --%-12s %s\n", name, help);
  }
  std::cout << absl::StrFormat("  --%-12s %s\n", "help", "show this help");
}

// Flags as --name=value or --name value; returns false for --help.
bool parse_flags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return false;
    if (arg.rfind("--", 0) != 0) throw UsageError{absl::StrCat("unexpected argument \"", arg, "\"")};
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (std::find(kFlagNames.begin(), kFlagNames.end(), name) == kFlagNames.end()) {
      throw UsageError{absl::StrCat("unknown flag --", name)};
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw UsageError{absl::StrCat("flag --", name, " needs a value")};
    }
    std::string error;
    if (!absl::FindCommandLineFlag(name)->ParseFrom(value, &error)) {
      throw UsageError{absl::StrCat("invalid value \"", value, "\" for --", name, ": ", error)};
    }
  }
  try {
    pipeline::activation_observer(absl::GetFlag(FLAGS_observer));
    pipeline::parse_progress_mode(absl::GetFlag(FLAGS_progress));
    zoo::parse_variant(absl::GetFlag(FLAGS_variant));
    if (!absl::GetFlag(FLAGS_model).empty()) zoo::find_model(absl::GetFlag(FLAGS_model));
  } catch (const dbrq::ValueError& e) {
    throw UsageError{e.what()};
  }
  if (absl::GetFlag(FLAGS_batch_size) < 1) throw UsageError{"--batch_size must be >= 1"};
  if (absl::GetFlag(FLAGS_iters) < 1) throw UsageError{"--iters must be >= 1"};
  if (absl::GetFlag(FLAGS_threads) < 0) throw UsageError{"--threads must be >= 0"};
  return true;
}

std::string out_dir() {
  const std::string flag = absl::GetFlag(FLAGS_out_dir);
  if (!flag.empty()) return pipeline::resolve_user_path(flag);
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  return workspace != nullptr ? absl::StrCat(workspace, "/out") : "out";
}

// "[3/9] load the data          " then the rest of the line.
class Steps {
 public:
  explicit Steps(int total) : total_(total) {}
  void begin(const std::string& title) {
    std::cout << absl::StrFormat("[%d/%d] %-22s ", ++n_, total_, title) << std::flush;
  }

 private:
  int total_;
  int n_ = 0;
};

constexpr const char* kIndent = "      ";

void print_comparison_row(const std::string& what, const std::string& fp32, const std::string& int8,
                          const std::string& note = "") {
  std::cout << kIndent << absl::StrFormat("%-30s %12s %12s", what, fp32, int8) << (note.empty() ? "" : "   " + note)
            << "\n";
}

void print_worst_ops(const dbrq::NumericReport& report, size_t n) {
  std::cout << kIndent << absl::StrFormat("%-36s %10s %12s", "op (worst SQNR first)", "SQNR", "max |err|") << "\n";
  for (size_t i = 0; i < std::min(n, report.ops.size()); ++i) {
    const dbrq::OpNumerics& op = report.ops[i];
    std::cout << kIndent
              << absl::StrFormat("%-36s %10s %12.4g", absl::StrCat(op.fqn, " ", op.op), format_db(op.sqnr_db),
                                 op.max_abs_error)
              << "\n";
  }
  if (report.ops.size() > n) std::cout << kIndent << "... " << report.ops.size() - n << " more in the report\n";
}

int run_digits(const char* argv0) {
  const pipeline::ProgressMode progress = pipeline::parse_progress_mode(absl::GetFlag(FLAGS_progress));
  const int64_t batch_size = absl::GetFlag(FLAGS_batch_size);
  const std::string observer = absl::GetFlag(FLAGS_observer);
  const zoo::ModelSpec& spec = zoo::find_model("small_cnn");
  const zoo::Variant variant = zoo::Variant::kFull;

  std::cout << "dbrq demo: int8 post-training quantization of a CNN trained on handwritten digits\n"
            << "(scikit-learn's 8x8 digits; trained weights and data splits bundled in samples/data by\n"
            << " tools/train_digits.py; " << dbrq::get_num_threads() << " threads)\n\n";
  Steps step(9);

  step.begin("build the model");
  dbrq::manual_seed(0);
  std::shared_ptr<dbrq::nn::Module> fp32 = spec.make(variant);
  std::cout << "zoo::SmallCnn, " << zoo::parameter_count(*fp32) << " parameters in "
            << fp32->named_parameters().size() << " tensors\n";

  step.begin("load trained weights");
  const dbrq::NamedTensors weights = dbrq::load_safetensors(pipeline::find_workspace_file(kWeights, argv0));
  fp32->load_state_dict(weights, /*strict=*/true);
  fp32->eval();
  // The model to quantize is a second instance with the same weights; `fp32` stays the reference.
  std::shared_ptr<dbrq::nn::Module> model = pipeline::clone_model(spec, variant, *fp32);
  std::cout << kWeights << " (" << weights.size() << " tensors, strict), eval mode\n";

  step.begin("load the data");
  const pipeline::Dataset calib = pipeline::load_dataset(pipeline::find_workspace_file(kCalib, argv0));
  const pipeline::Dataset test = pipeline::load_dataset(pipeline::find_workspace_file(kTest, argv0));
  pipeline::check_dataset_fits(calib, spec, variant);
  pipeline::check_dataset_fits(test, spec, variant);
  std::cout << "calibration split " << calib.size() << " images, held-back test split " << test.size()
            << " images (" << absl::StrJoin(test.sample_shape(), "x") << ", labeled)\n";

  step.begin("prepare");
  dbrq::prepare(*model, {calib.input_batch(0, batch_size)}, pipeline::qconfig_mapping_for(observer));
  const pipeline::OpCounts counts = pipeline::op_counts(*model);
  std::cout << "traced one call: " << counts.recorded << " quantizeable ops, " << counts.observers << " "
            << observer << " observers\n";

  step.begin("calibrate");
  std::cout << "running the calibration split through the prepared model\n";
  pipeline::RunOptions calib_opts;
  calib_opts.batch_size = batch_size;
  calib_opts.progress = progress;
  const pipeline::CalibrationResult cr = pipeline::calibrate(spec, *model, calib, calib_opts);
  std::cout << kIndent << cr.batches << " batches (" << cr.samples << " images) in " << format_ms(cr.seconds * 1e3)
            << "\n";

  step.begin("save the calibration");
  const std::string dir = out_dir();
  pipeline::make_dirs(dir);
  const std::string state_path = dir + "/digits_small_cnn.qstate.json";
  dbrq::save_quant_state(*model, state_path);
  std::cout << pipeline::display_path(state_path) << "\n";

  step.begin("convert to int8");
  dbrq::convert(*model);
  std::cout << "weights quantized and prepacked once, oneDNN int8 primitives from now on\n";

  step.begin("evaluate");
  std::cout << "fp32 vs int8 on the " << test.size() << " held-back test images\n";
  pipeline::RunOptions eval_opts;
  eval_opts.batch_size = batch_size;
  eval_opts.progress = progress;
  eval_opts.progress_label = "evaluating";
  const pipeline::EvalResult r = pipeline::evaluate(spec, *fp32, *model, test, eval_opts);
  const int iters = absl::GetFlag(FLAGS_iters);
  const dbrq::Tensor one = test.input_batch(0, 1);
  const pipeline::Latency l32 = pipeline::measure_latency(spec, *fp32, one, iters);
  const pipeline::Latency l8 = pipeline::measure_latency(spec, *model, one, iters);
  const dbrq::Tensor batch = test.input_batch(0, batch_size);
  const pipeline::Latency b32 = pipeline::measure_latency(spec, *fp32, batch, std::max(1, iters / 4));
  const pipeline::Latency b8 = pipeline::measure_latency(spec, *model, batch, std::max(1, iters / 4));
  print_comparison_row("", "fp32", "int8");
  print_comparison_row("top-1 accuracy", format_percent(r.fp32_accuracy()), format_percent(r.int8_accuracy()),
                       absl::StrFormat("(%d vs %d of %d correct)", r.fp32_correct, r.int8_correct, r.samples));
  print_comparison_row("latency, 1 image (median)", format_ms(l32.median_ms), format_ms(l8.median_ms),
                       absl::StrFormat("(%d runs; int8 %.2fx)", iters, l32.median_ms / l8.median_ms));
  print_comparison_row(absl::StrFormat("latency, %d images (median)", batch.size(0)), format_ms(b32.median_ms),
                       format_ms(b8.median_ms),
                       absl::StrFormat("(%d runs; int8 %.2fx)", b32.iters, b32.median_ms / b8.median_ms));
  std::cout << kIndent << "output SQNR int8 vs fp32: " << format_db(r.sqnr_db())
            << absl::StrFormat(" (max |error| %.4g); top-1 agreement %s\n", r.max_abs_error,
                               format_percent(r.agreement()));

  step.begin("numeric report");
  const dbrq::NumericReport report =
      dbrq::compare_numerics(*fp32, *model, pipeline::numerics_inputs(test, batch_size, /*max_batches=*/0));
  const std::string html = dir + "/digits_small_cnn.report.html";
  const std::string csv = dir + "/digits_small_cnn.report.csv";
  dbrq::write_text_file(html, report.to_html("SmallCnn on digits"));
  dbrq::write_text_file(csv, report.to_csv());
  std::cout << "op by op over the test split: " << pipeline::display_path(html) << " (+ .csv)\n";
  print_worst_ops(report, 4);

  std::cout << "\nDone. The same steps from the command line (bazel build -c opt //tools/cli:dbrq):\n"
            << "  dbrq quantize --model=small_cnn --weights=" << kWeights << " --calib=" << kCalib
            << " --out=out/digits.qstate.json\n"
            << "  dbrq eval --model=small_cnn --weights=" << kWeights
            << " --state=out/digits.qstate.json --data=" << kTest << "\n";
  return 0;
}

// The old demo, extended: any zoo model, random weights, calibration on random inputs.
int run_zoo_model() {
  const pipeline::ProgressMode progress = pipeline::parse_progress_mode(absl::GetFlag(FLAGS_progress));
  const zoo::ModelSpec& spec = zoo::find_model(absl::GetFlag(FLAGS_model));
  const zoo::Variant variant = zoo::parse_variant(absl::GetFlag(FLAGS_variant));
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const int64_t batch_size = absl::GetFlag(FLAGS_batch_size);
  const int iters = absl::GetFlag(FLAGS_iters);
  std::cout << "dbrq demo: " << spec.name << " (" << zoo::variant_name(variant) << "): " << spec.description
            << "\n(random weights and random calibration data: the numbers show the pipeline and the speed, "
               "not accuracy; "
            << dbrq::get_num_threads() << " threads)\n\n";
  Steps step(6);

  step.begin("build the model");
  std::shared_ptr<dbrq::nn::Module> fp32 = pipeline::build_model(spec, variant, "", seed);
  std::shared_ptr<dbrq::nn::Module> model = pipeline::clone_model(spec, variant, *fp32);
  std::cout << zoo::parameter_count(*fp32) << " parameters, random init (seed " << seed << ")\n";

  const dbrq::Tensor input = spec.example_input(variant, batch_size, seed + 1);
  step.begin("prepare");
  dbrq::prepare(*model, {input}, pipeline::qconfig_mapping_for(absl::GetFlag(FLAGS_observer)));
  const pipeline::OpCounts counts = pipeline::op_counts(*model);
  std::cout << "input " << input.shape_string() << ": " << counts.recorded << " quantizeable ops, "
            << counts.observers << " observers\n";

  step.begin("calibrate");
  std::cout << "4 random batches\n";
  {
    pipeline::ProgressBar bar("calibrating", 4, "batches", progress);
    for (int i = 0; i < 4; ++i) {
      spec.run(*model, spec.example_input(variant, batch_size, seed + 100 + i));
      bar.update(i + 1);
    }
    bar.finish();
  }

  step.begin("save the calibration");
  const std::string dir = out_dir();
  pipeline::make_dirs(dir);
  const std::string state_path = absl::StrCat(dir, "/", spec.name, ".qstate.json");
  dbrq::save_quant_state(*model, state_path);
  std::cout << pipeline::display_path(state_path) << "\n";

  step.begin("convert to int8");
  dbrq::convert(*model);
  std::cout << "done\n";

  step.begin("compare");
  const dbrq::Tensor check = spec.example_input(variant, batch_size, seed + 7);
  const double sqnr = dbrq::sqnr_db(spec.run(*fp32, check), spec.run(*model, check));
  const pipeline::Latency l32 = pipeline::measure_latency(spec, *fp32, input, iters);
  const pipeline::Latency l8 = pipeline::measure_latency(spec, *model, input, iters);
  std::cout << "output SQNR int8 vs fp32 on a new random batch: " << format_db(sqnr) << "\n";
  print_comparison_row("", "fp32", "int8");
  print_comparison_row(absl::StrFormat("latency, batch %d (median)", batch_size), format_ms(l32.median_ms),
                       format_ms(l8.median_ms),
                       absl::StrFormat("(%d runs; int8 %.2fx)", iters, l32.median_ms / l8.median_ms));
  print_comparison_row("first call", format_ms(l32.first_ms), format_ms(l8.first_ms));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Progress bars go to stderr; flushing stdout at every write keeps the two in order when both
  // are piped to one file.
  std::cout << std::unitbuf;
  try {
    if (!parse_flags(argc, argv)) {
      print_help();
      return 0;
    }
    if (absl::GetFlag(FLAGS_threads) > 0) dbrq::set_num_threads(absl::GetFlag(FLAGS_threads));
    return absl::GetFlag(FLAGS_model).empty() ? run_digits(argv[0]) : run_zoo_model();
  } catch (const UsageError& e) {
    std::cerr << "demo: " << e.message << "\nRun 'demo --help' for usage.\n";
    return 2;
  } catch (const std::exception& e) {
    std::cout << std::flush;
    std::cerr << "\ndemo: error: " << e.what() << "\n";
    return 1;
  }
}
