// The steps of a post-training int8 quantization run, shared by the demo and the `dbrq` command
// line tool: data sets in safetensors files, building a zoo model with its weights, calibration
// with a progress bar, fp32-vs-int8 evaluation and latency measurement. Written against the
// public API (dbrq.h) and the model zoo only.
//
//   const zoo::ModelSpec& spec = zoo::find_model("small_cnn");
//   auto fp32 = pipeline::build_model(spec, zoo::Variant::kFull, "w.safetensors", /*seed=*/0);
//   auto q = pipeline::clone_model(spec, zoo::Variant::kFull, *fp32);
//   pipeline::Dataset calib = pipeline::load_dataset("calib.safetensors");
//   dbrq::prepare(*q, {calib.input_batch(0, 32)}, pipeline::qconfig_mapping_for("histogram"));
//   pipeline::calibrate(spec, *q, calib, {/*batch_size=*/32});   // progress bar on stderr
//   dbrq::convert(*q);
//   pipeline::EvalResult r = pipeline::evaluate(spec, *fp32, *q, test, {32});
//   std::cout << r.int8_accuracy() << " " << r.sqnr_db() << "\n";
//
// Data files are safetensors with an "images" (or "inputs") tensor [N, ...] and optionally
// "labels" [N] (integer class ids). Errors are dbrq::Error subclasses with one-line messages.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/zoo.h"

namespace pipeline {

// ---- files ----

// Locates a file shipped in the workspace (e.g. "samples/data/digits_test.safetensors"): Bazel
// runfiles (RUNFILES_DIR, TEST_SRCDIR, or <argv0>.runfiles), then the workspace of `bazel run`
// (BUILD_WORKSPACE_DIRECTORY), then the current directory. Throws dbrq::IOError naming the
// places it looked.
std::string find_workspace_file(const std::string& relative_path, const char* argv0);
// A user-given path: relative paths are taken from where the user ran the command (under
// `bazel run` that is BUILD_WORKING_DIRECTORY, not the runfiles directory).
std::string resolve_user_path(const std::string& path);
// Creates a directory and its parents; throws dbrq::IOError.
void make_dirs(const std::string& path);
// `path` relative to the user's working directory when inside it (for printing).
std::string display_path(const std::string& path);

// ---- data ----

struct Dataset {
  std::string path;
  std::string input_name;  // "images" or "inputs"
  dbrq::Tensor inputs;     // [N, ...], contiguous
  std::vector<int64_t> labels;  // N class ids, or empty

  int64_t size() const { return inputs.size(0); }
  bool has_labels() const { return !labels.empty(); }
  // Batches of `batch_size` samples (the last one may be smaller), at most `max_batches` when > 0.
  int64_t num_batches(int64_t batch_size, int64_t max_batches = 0) const;
  // A copy of samples [index * batch_size, min(N, (index + 1) * batch_size)).
  dbrq::Tensor input_batch(int64_t index, int64_t batch_size) const;
  // Sizes of one sample ([1, 8, 8] for digits).
  std::vector<int64_t> sample_shape() const;
};

// Throws dbrq::IOError / FileFormatError for unreadable files, dbrq::ValueError when there is no
// "images"/"inputs" tensor or the labels do not fit.
Dataset load_dataset(const std::string& path);
// Throws dbrq::ValueError when the data cannot be the model's input (dtype, rank, channels).
void check_dataset_fits(const Dataset& data, const zoo::ModelSpec& spec, zoo::Variant variant);
// "360 samples of [1, 8, 8] f32, with labels"
std::string describe(const Dataset& data);

// ---- progress ----

enum class ProgressMode { kAuto, kAlways, kNever };
ProgressMode parse_progress_mode(const std::string& name);  // auto|always|never; ValueError
bool stderr_is_tty();

// A progress bar on stderr with rate and ETA. On a terminal it redraws one line in place (\r);
// otherwise (logs, CI, pipes) it prints a plain line at 25% steps so logs stay short.
class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit, ProgressMode mode = ProgressMode::kAuto);
  ~ProgressBar();
  void update(int64_t done);
  // Draws the final state (once) and ends the line.
  void finish();

 private:
  void draw(bool final);

  std::string label_, unit_;
  int64_t total_ = 0, done_ = 0;
  bool enabled_ = false, tty_ = false, finished_ = false;
  int last_quarter_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// ---- models ----

// Builds a zoo model in eval mode. With `weights_path` the weights are loaded strictly
// (missing, unexpected or mis-shaped tensors throw); without, PyTorch-style random init seeded
// with `seed`.
std::shared_ptr<dbrq::nn::Module> build_model(const zoo::ModelSpec& spec, zoo::Variant variant,
                                              const std::string& weights_path, uint64_t seed);
// A second instance with the same weights (e.g. the one to quantize next to the fp32 reference).
std::shared_ptr<dbrq::nn::Module> clone_model(const zoo::ModelSpec& spec, zoo::Variant variant,
                                              const dbrq::nn::Module& source);

// Activation observers by name: histogram (the default), minmax, percentile, entropy.
const std::vector<std::string>& observer_names();
dbrq::ObserverSpec activation_observer(const std::string& name);  // ValueError for others
// The onednn default mapping with `observer` for activations (per-channel s8 weights).
dbrq::QConfigMapping qconfig_mapping_for(const std::string& observer);
// The mapping a saved quant-state file was calibrated with (its activation observer spec), so
// prepare() builds the same observers and load_quant_state() accepts the file. Throws IOError /
// FileFormatError.
dbrq::QConfigMapping qconfig_mapping_from_state_file(const std::string& path, std::string* observer_description);

// Quantizeable ops recorded by prepare, and how many run int8 after convert.
struct OpCounts {
  int64_t recorded = 0;
  int64_t observers = 0;
};
OpCounts op_counts(const dbrq::nn::Module& prepared_model);

// ---- running ----

struct RunOptions {
  int64_t batch_size = 32;
  int64_t max_batches = 0;  // 0: all
  ProgressMode progress = ProgressMode::kAuto;
  std::string progress_label = "calibrating";
};

struct CalibrationResult {
  int64_t batches = 0;
  int64_t samples = 0;
  double seconds = 0.0;
};
// Runs the prepared model over the data so its observers record ranges.
CalibrationResult calibrate(const zoo::ModelSpec& spec, dbrq::nn::Module& model, const Dataset& data,
                            const RunOptions& options);

struct EvalResult {
  int64_t samples = 0;
  int64_t batches = 0;
  bool has_accuracy = false;  // labels given and outputs are [N, classes]
  int64_t fp32_correct = 0, int8_correct = 0;
  int64_t top1_agree = 0;     // int8 argmax == fp32 argmax (when outputs are [N, classes])
  double ref_energy = 0.0, error_energy = 0.0;  // sum fp32^2, sum (fp32 - int8)^2 over all outputs
  double max_abs_error = 0.0;
  double fp32_seconds = 0.0, int8_seconds = 0.0;  // model time over the whole pass (after one warm-up call)

  double fp32_accuracy() const { return samples ? double(fp32_correct) / samples : 0.0; }
  double int8_accuracy() const { return samples ? double(int8_correct) / samples : 0.0; }
  double agreement() const { return samples ? double(top1_agree) / samples : 0.0; }
  double sqnr_db() const;  // +inf when identical
};
// Runs both models over the data: accuracy against the labels and SQNR of int8 vs fp32 outputs.
EvalResult evaluate(const zoo::ModelSpec& spec, dbrq::nn::Module& fp32_model, dbrq::nn::Module& int8_model,
                    const Dataset& data, const RunOptions& options);

// The data as compare_numerics wants it: one input list per batch.
std::vector<std::vector<dbrq::Tensor>> numerics_inputs(const Dataset& data, int64_t batch_size, int64_t max_batches);

struct Latency {
  int iters = 0;
  double first_ms = 0.0;  // the first call (primitive creation)
  double median_ms = 0.0, min_ms = 0.0, mean_ms = 0.0;
};
// Times `iters` calls after `warmup` untimed ones.
Latency measure_latency(const zoo::ModelSpec& spec, dbrq::nn::Module& model, const dbrq::Tensor& input, int iters,
                        int warmup = 3);

// "12.3 ms", "450 us", "1.2 s"
std::string format_ms(double ms);
// "98.61%"
std::string format_percent(double fraction);
// "35.2 dB", "inf dB"
std::string format_db(double db);

}  // namespace pipeline
