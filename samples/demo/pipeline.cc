#include "samples/demo/pipeline.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace pipeline {

using dbrq::Tensor;
namespace nn = dbrq::nn;
using Clock = std::chrono::steady_clock;

namespace {

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool dir_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string join_path(const std::string& dir, const std::string& rel) {
  if (dir.empty()) return rel;
  return dir.back() == '/' ? dir + rel : dir + "/" + rel;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Argmax of each row of an [N, C] f32 output.
std::vector<int64_t> argmax_rows(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<int64_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = v.data() + r * cols;
    out[static_cast<size_t>(r)] = std::max_element(row, row + cols) - row;
  }
  return out;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  if (seconds < 60) return absl::StrFormat("%.1fs", seconds);
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

}  // namespace

// ---- files ----

std::string find_workspace_file(const std::string& relative_path, const char* argv0) {
  std::vector<std::string> candidates;
  const std::string workspace = env("TEST_WORKSPACE").empty() ? "dbrq" : env("TEST_WORKSPACE");
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    const std::string dir = env(var);
    if (!dir.empty()) candidates.push_back(join_path(join_path(dir, workspace), relative_path));
  }
  if (argv0 != nullptr && argv0[0] != '\0') {
    candidates.push_back(join_path(std::string(argv0) + ".runfiles/" + workspace, relative_path));
  }
  if (!env("BUILD_WORKSPACE_DIRECTORY").empty()) {
    candidates.push_back(join_path(env("BUILD_WORKSPACE_DIRECTORY"), relative_path));
  }
  candidates.push_back(relative_path);  // the current directory: `bazel run` starts in the runfiles tree
  for (const std::string& c : candidates) {
    if (file_exists(c)) return c;
  }
  DBRQ_THROW(dbrq::IOError, "cannot find ", relative_path, " (looked in: ", absl::StrJoin(candidates, ", "),
             "); run from the workspace or through bazel run");
}

std::string resolve_user_path(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const std::string cwd = env("BUILD_WORKING_DIRECTORY");
  return cwd.empty() ? path : join_path(cwd, path);
}

void make_dirs(const std::string& path) {
  if (path.empty() || dir_exists(path)) return;
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_dirs(path.substr(0, slash));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    DBRQ_THROW(dbrq::IOError, "cannot create directory ", path, ": ", std::strerror(errno));
  }
}

std::string display_path(const std::string& path) {
  std::string base = env("BUILD_WORKING_DIRECTORY");
  if (base.empty()) {
    char buf[4096];
    if (::getcwd(buf, sizeof buf) != nullptr) base = buf;
  }
  if (!base.empty() && base.back() != '/') base += '/';
  if (!base.empty() && path.rfind(base, 0) == 0) return path.substr(base.size());
  return path;
}

// ---- data ----

int64_t Dataset::num_batches(int64_t batch_size, int64_t max_batches) const {
  const int64_t n = (size() + batch_size - 1) / batch_size;
  return max_batches > 0 ? std::min(n, max_batches) : n;
}

Tensor Dataset::input_batch(int64_t index, int64_t batch_size) const {
  const int64_t start = index * batch_size;
  DBRQ_ENSURE(start >= 0 && start < size(), dbrq::IndexError, "batch ", index, " of ", batch_size,
              " samples is outside the data set of ", size(), " samples");
  const int64_t count = std::min(batch_size, size() - start);
  std::vector<int64_t> sizes(inputs.sizes().begin(), inputs.sizes().end());
  sizes[0] = count;
  Tensor batch = Tensor::empty(sizes, inputs.dtype());
  const size_t sample_bytes = inputs.nbytes() / static_cast<size_t>(size());
  // A plain copy rather than narrow(): data handling is no part of the model, so nothing here
  // should pass through the dispatcher.
  std::memcpy(batch.mutable_data_ptr(),
              static_cast<const char*>(inputs.data_ptr()) + static_cast<size_t>(start) * sample_bytes,
              static_cast<size_t>(count) * sample_bytes);
  return batch;
}

std::vector<int64_t> Dataset::sample_shape() const {
  return std::vector<int64_t>(inputs.sizes().begin() + 1, inputs.sizes().end());
}

Dataset load_dataset(const std::string& path) {
  dbrq::NamedTensors tensors = dbrq::load_safetensors(path);
  Dataset d;
  d.path = path;
  std::vector<std::string> names;
  Tensor labels;
  for (const auto& [name, t] : tensors) {
    names.push_back(name);
    if ((name == "images" || name == "inputs") && !d.inputs.defined()) {
      d.input_name = name;
      d.inputs = t;
    } else if (name == "labels") {
      labels = t;
    }
  }
  DBRQ_ENSURE(d.inputs.defined(), dbrq::ValueError, path, " has no \"images\" or \"inputs\" tensor (it has: ",
              names.empty() ? "nothing" : absl::StrJoin(names, ", "), ")");
  DBRQ_ENSURE(d.inputs.dim() >= 1 && d.inputs.size(0) >= 1, dbrq::ValueError, path, ": \"", d.input_name,
              "\" must be [N, ...] with N >= 1, got ", d.inputs.shape_string());
  DBRQ_ENSURE(d.inputs.dtype() == dbrq::DType::kF32 || d.inputs.dtype() == dbrq::DType::kS64, dbrq::ValueError,
              path, ": \"", d.input_name, "\" must be f32 (images) or s64 (token ids), got ",
              dbrq::dtype_name(d.inputs.dtype()));
  if (!d.inputs.is_contiguous()) d.inputs = d.inputs.contiguous();
  if (labels.defined()) {
    const bool integral = labels.dtype() == dbrq::DType::kS64 || labels.dtype() == dbrq::DType::kS32 ||
                          labels.dtype() == dbrq::DType::kU8;
    DBRQ_ENSURE(integral && labels.dim() == 1 && labels.size(0) == d.size(), dbrq::ValueError, path,
                ": \"labels\" must be integer class ids [", d.size(), "], got ", labels.shape_string(), " ",
                dbrq::dtype_name(labels.dtype()));
    d.labels = labels.to_vector<int64_t>();
  }
  return d;
}

void check_dataset_fits(const Dataset& data, const zoo::ModelSpec& spec, zoo::Variant variant) {
  const std::vector<int64_t> want = spec.input_shape(variant, 1);
  const std::vector<int64_t> got = data.sample_shape();
  DBRQ_ENSURE(data.inputs.dtype() == spec.input_dtype, dbrq::ValueError, data.path, ": ", spec.name, " takes ",
              dbrq::dtype_name(spec.input_dtype), " inputs, the data is ", dbrq::dtype_name(data.inputs.dtype()));
  const std::vector<int64_t> want_sample(want.begin() + 1, want.end());
  const bool images = spec.input_dtype == dbrq::DType::kF32;
  // Image models accept any spatial size; channels must match. Token models any sequence length.
  const bool fits = got.size() == want_sample.size() && (!images || got[0] == want_sample[0]);
  DBRQ_ENSURE(fits, dbrq::ValueError, data.path, ": samples of ", dbrq::shape_to_string(got), " do not fit ",
              spec.name, " (", zoo::variant_name(variant), "), which takes samples like ",
              dbrq::shape_to_string(want_sample));
}

std::string describe(const Dataset& data) {
  return absl::StrCat(data.size(), " samples of ", dbrq::shape_to_string(data.sample_shape()), " ",
                      dbrq::dtype_name(data.inputs.dtype()), data.has_labels() ? ", with labels" : ", no labels");
}

// ---- progress ----

ProgressMode parse_progress_mode(const std::string& name) {
  if (name == "auto") return ProgressMode::kAuto;
  if (name == "always") return ProgressMode::kAlways;
  if (name == "never") return ProgressMode::kNever;
  DBRQ_THROW(dbrq::ValueError, "unknown progress mode \"", name, "\"; expected auto, always or never");
}

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, ProgressMode mode)
    : label_(std::move(label)), unit_(std::move(unit)), total_(std::max<int64_t>(total, 0)) {
  tty_ = stderr_is_tty();
  enabled_ = mode == ProgressMode::kAlways || (mode == ProgressMode::kAuto && total_ > 0);
  start_ = last_draw_ = Clock::now();
  if (enabled_ && tty_) draw(false);
}

ProgressBar::~ProgressBar() {
  // Leaving a half-drawn line behind (e.g. when an exception unwinds) would glue the next message
  // onto it.
  if (enabled_ && tty_ && !finished_) std::fputs("\n", stderr);
}

void ProgressBar::update(int64_t done) {
  done_ = std::min(done, total_);
  if (!enabled_ || finished_) return;
  if (tty_) {
    if (std::chrono::duration<double>(Clock::now() - last_draw_).count() >= 0.05 || done_ == total_) draw(false);
  } else {
    const int quarter = total_ > 0 ? static_cast<int>(done_ * 4 / total_) : 4;
    if (quarter > last_quarter_ && done_ < total_) {
      last_quarter_ = quarter;
      draw(false);
    }
  }
}

void ProgressBar::finish() {
  if (finished_) return;
  if (enabled_) draw(true);
  finished_ = true;
}

void ProgressBar::draw(bool final) {
  last_draw_ = Clock::now();
  const double elapsed = seconds_since(start_);
  const double rate = elapsed > 0 ? done_ / elapsed : 0.0;
  const double eta = rate > 0 ? (total_ - done_) / rate : std::numeric_limits<double>::infinity();
  const int percent = total_ > 0 ? static_cast<int>(100 * done_ / total_) : 100;
  std::string line;
  if (tty_) {
    constexpr int kWidth = 28;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * done_ / total_) : kWidth;
    const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    line = absl::StrFormat("\r%s [%s] %3d%%  %d/%d %s  %.1f %s/s  %s %s\x1b[K", label_, bar, percent, done_, total_,
                           unit_, rate, unit_, final ? "took" : "ETA", format_duration(final ? elapsed : eta));
    if (final) line += "\n";
  } else {
    line = absl::StrFormat("%s: %d/%d %s (%d%%), %.1f %s/s, %s %s\n", label_, done_, total_, unit_, percent, rate,
                           unit_, final ? "took" : "ETA", format_duration(final ? elapsed : eta));
  }
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

// ---- models ----

std::shared_ptr<nn::Module> build_model(const zoo::ModelSpec& spec, zoo::Variant variant,
                                        const std::string& weights_path, uint64_t seed) {
  dbrq::manual_seed(seed);
  std::shared_ptr<nn::Module> model = spec.make(variant);
  if (!weights_path.empty()) {
    const dbrq::NamedTensors weights = dbrq::load_safetensors(weights_path);
    try {
      model->load_state_dict(weights, /*strict=*/true);
    } catch (const dbrq::Error& e) {
      e.rethrow_with_context(absl::StrCat(weights_path, " does not fit ", spec.name, " (",
                                          zoo::variant_name(variant), "): "));
    }
  }
  model->eval();
  return model;
}

std::shared_ptr<nn::Module> clone_model(const zoo::ModelSpec& spec, zoo::Variant variant, const nn::Module& source) {
  std::shared_ptr<nn::Module> model = spec.make(variant);
  model->load_state_dict(source.state_dict(), /*strict=*/true);
  model->eval();
  return model;
}

const std::vector<std::string>& observer_names() {
  static const std::vector<std::string> names = {"histogram", "minmax", "percentile", "entropy", "mse"};
  return names;
}

dbrq::ObserverSpec activation_observer(const std::string& name) {
  if (name == "histogram") return dbrq::ObserverSpec::histogram();
  if (name == "minmax") return dbrq::ObserverSpec::min_max();
  if (name == "percentile") return dbrq::ObserverSpec::percentile_of();
  if (name == "entropy") return dbrq::ObserverSpec::entropy();
  if (name == "mse") return dbrq::ObserverSpec::mse();
  DBRQ_THROW(dbrq::ValueError, "unknown observer \"", name, "\"; expected ", absl::StrJoin(observer_names(), ", "));
}

namespace {

dbrq::QConfigMapping mapping_with_activation(const dbrq::ObserverSpec& activation) {
  dbrq::QConfigMapping mapping = dbrq::default_qconfig_mapping("onednn");
  mapping.set_global(dbrq::QConfig::make(activation, mapping.global()->weight));
  return mapping;
}

}  // namespace

dbrq::QConfigMapping qconfig_mapping_for(const std::string& observer) {
  return mapping_with_activation(activation_observer(observer));
}

dbrq::QConfigMapping qconfig_mapping_from_state_file(const std::string& path, std::string* observer_description) {
  std::ifstream in(path, std::ios::binary);
  DBRQ_ENSURE(in, dbrq::IOError, "cannot open quant state ", path, ": ", std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  using json = nlohmann::json;
  // The activation observers a calibration used are the per-tensor ones that are neither fixed
  // (sigmoid, softmax) nor per-channel (weights); a file from prepare() with one global qconfig has
  // one such spec. load_quant_state() checks everything else.
  try {
    const json doc = json::parse(text.str());
    for (const json& slot : doc.at("observers")) {
      if (!slot.contains("observer")) continue;
      const json& j = slot.at("observer");
      const dbrq::ObserverKind kind = dbrq::observer_kind_from_name(j.at("kind").get<std::string>());
      if (kind == dbrq::ObserverKind::kFixedQParams || kind == dbrq::ObserverKind::kPerChannelMinMax ||
          kind == dbrq::ObserverKind::kPlaceholder) {
        continue;
      }
      dbrq::ObserverSpec s;
      s.kind = kind;
      s.dtype = dbrq::dtype_from_name(j.at("dtype").get<std::string>());
      s.qscheme = dbrq::qscheme_from_name(j.at("qscheme").get<std::string>());
      s.reduce_range = j.at("reduce_range").get<bool>();
      s.ch_axis = j.at("ch_axis").get<int64_t>();
      s.averaging_constant = j.at("averaging_constant").get<double>();
      s.bins = j.at("bins").get<int>();
      s.upsample_rate = j.at("upsample_rate").get<int>();
      s.percentile = j.at("percentile").get<double>();
      s.torch_integer_edges = j.at("torch_integer_edges").get<bool>();
      s.fixed_scale = j.at("fixed_scale").get<float>();
      s.fixed_zero_point = j.at("fixed_zero_point").get<int32_t>();
      if (observer_description != nullptr) *observer_description = s.to_string();
      return mapping_with_activation(s);
    }
  } catch (const json::exception& e) {
    DBRQ_THROW(dbrq::FileFormatError, "quant state ", path, " is not a readable dbrq quant-state file: ", e.what());
  } catch (const dbrq::ValueError& e) {
    DBRQ_THROW(dbrq::FileFormatError, "quant state ", path, ": ", e.what());
  }
  // No activation observer at all (nothing quantized): the default mapping is as good as any.
  if (observer_description != nullptr) *observer_description = "none";
  return dbrq::default_qconfig_mapping("onednn");
}

OpCounts op_counts(const nn::Module& prepared_model) {
  OpCounts c;
  c.recorded = static_cast<int64_t>(dbrq::quantized_ops(prepared_model).size());
  c.observers = dbrq::num_observers(prepared_model);
  return c;
}

// ---- running ----

CalibrationResult calibrate(const zoo::ModelSpec& spec, nn::Module& model, const Dataset& data,
                            const RunOptions& options) {
  CalibrationResult r;
  r.batches = data.num_batches(options.batch_size, options.max_batches);
  ProgressBar bar(options.progress_label, r.batches, "batches", options.progress);
  const auto start = Clock::now();
  for (int64_t b = 0; b < r.batches; ++b) {
    const Tensor x = data.input_batch(b, options.batch_size);
    spec.run(model, x);
    r.samples += x.size(0);
    bar.update(b + 1);
  }
  bar.finish();
  r.seconds = seconds_since(start);
  return r;
}

double EvalResult::sqnr_db() const {
  if (error_energy == 0.0) return std::numeric_limits<double>::infinity();
  if (ref_energy == 0.0) return -std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(ref_energy / error_energy);
}

EvalResult evaluate(const zoo::ModelSpec& spec, nn::Module& fp32_model, nn::Module& int8_model, const Dataset& data,
                    const RunOptions& options) {
  EvalResult r;
  r.batches = data.num_batches(options.batch_size, options.max_batches);
  if (r.batches > 0) {
    // One untimed call each first, so the times below do not include primitive creation.
    const Tensor warmup = data.input_batch(0, options.batch_size);
    spec.run(fp32_model, warmup);
    spec.run(int8_model, warmup);
  }
  ProgressBar bar(options.progress_label, r.batches, "batches", options.progress);
  for (int64_t b = 0; b < r.batches; ++b) {
    const Tensor x = data.input_batch(b, options.batch_size);
    const int64_t n = x.size(0);
    auto t0 = Clock::now();
    const Tensor ref = spec.run(fp32_model, x);
    r.fp32_seconds += seconds_since(t0);
    t0 = Clock::now();
    const Tensor q = spec.run(int8_model, x);
    r.int8_seconds += seconds_since(t0);

    const std::vector<float> rv = ref.to_vector<float>();
    const std::vector<float> qv = q.dtype() == dbrq::DType::kF32 ? q.to_vector<float>() : q.dequantize().to_vector<float>();
    DBRQ_ENSURE(rv.size() == qv.size(), dbrq::ShapeError, "int8 output ", q.shape_string(),
                " differs in size from the fp32 output ", ref.shape_string());
    for (size_t i = 0; i < rv.size(); ++i) {
      const double d = static_cast<double>(rv[i]) - qv[i];
      r.ref_energy += static_cast<double>(rv[i]) * rv[i];
      r.error_energy += d * d;
      r.max_abs_error = std::max(r.max_abs_error, std::abs(d));
    }
    if (ref.dim() == 2 && ref.size(0) == n) {
      const std::vector<int64_t> pr = argmax_rows(rv, n, ref.size(1));
      const std::vector<int64_t> pq = argmax_rows(qv, n, ref.size(1));
      for (int64_t i = 0; i < n; ++i) {
        r.top1_agree += pr[i] == pq[i];
        if (data.has_labels()) {
          const int64_t label = data.labels[static_cast<size_t>(b * options.batch_size + i)];
          r.fp32_correct += pr[i] == label;
          r.int8_correct += pq[i] == label;
        }
      }
      r.has_accuracy = data.has_labels();
    }
    r.samples += n;
    bar.update(b + 1);
  }
  bar.finish();
  return r;
}

std::vector<std::vector<Tensor>> numerics_inputs(const Dataset& data, int64_t batch_size, int64_t max_batches) {
  std::vector<std::vector<Tensor>> inputs;
  for (int64_t b = 0; b < data.num_batches(batch_size, max_batches); ++b) {
    inputs.push_back({data.input_batch(b, batch_size)});
  }
  return inputs;
}

Latency measure_latency(const zoo::ModelSpec& spec, nn::Module& model, const Tensor& input, int iters, int warmup) {
  Latency l;
  l.iters = iters;
  auto t0 = Clock::now();
  spec.run(model, input);
  l.first_ms = seconds_since(t0) * 1e3;
  for (int i = 1; i < warmup; ++i) spec.run(model, input);
  std::vector<double> times;
  times.reserve(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    t0 = Clock::now();
    spec.run(model, input);
    times.push_back(seconds_since(t0) * 1e3);
  }
  if (times.empty()) return l;
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  l.median_ms = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  l.min_ms = times.front();
  double total = 0;
  for (double t : times) total += t;
  l.mean_ms = total / n;
  return l;
}

std::string format_ms(double ms) {
  if (ms < 1.0) return absl::StrFormat("%.1f us", ms * 1e3);
  if (ms < 1000.0) return absl::StrFormat("%.2f ms", ms);
  return absl::StrFormat("%.2f s", ms / 1e3);
}

std::string format_percent(double fraction) { return absl::StrFormat("%.2f%%", fraction * 100.0); }

std::string format_db(double db) {
  if (std::isinf(db)) return db > 0 ? "inf dB (identical)" : "-inf dB";
  return absl::StrFormat("%.1f dB", db);
}

}  // namespace pipeline
