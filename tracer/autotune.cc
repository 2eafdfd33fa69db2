#include "tracer/autotune.h"
#include "tracer/autotune_executor.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"
#include "tracer/internal.h"
#include "tracer/introspection.h"
#include "tracer/numerics.h"
#include "tracer/precision.h"
#include "tracer/quantize.h"
#include "quant_state/serialization.h"

namespace dbrq {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kLogFormat = "dbrq.autotune_log";
// 2: functional ops (TuneOp) in configs and the ranking, and the base mapping.
constexpr int kLogVersion = 2;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fmt_metric(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.6g", v);
}

// JSON has no inf / NaN: they are written as strings.
json metric_to_json(double v) {
  if (std::isfinite(v)) return v;
  return fmt_metric(v);
}

double metric_from_json(const json& j) {
  if (j.is_number()) return j.get<double>();
  const std::string s = j.get<std::string>();
  if (s == "inf") return kInf;
  if (s == "-inf") return -kInf;
  if (s == "nan") return kNaN;
  DBRQ_THROW(FileFormatError, "metric must be a number, \"inf\", \"-inf\" or \"nan\", got \"", s, "\"");
}

ObserverSpec activation_spec(ObserverKind k) {
  switch (k) {
    case ObserverKind::kHistogram:
      return ObserverSpec::histogram();
    case ObserverKind::kMinMax:
      return ObserverSpec::min_max();
    case ObserverKind::kPercentile:
      return ObserverSpec::percentile_of();
    case ObserverKind::kEntropy:
      return ObserverSpec::entropy();
    default:
      break;
  }
  DBRQ_THROW(ValueError, "autotune: activation observer ", observer_kind_name(k),
             " is not searched; expected Histogram, MinMax, Percentile or Entropy");
}

// The four activation observers, cheapest-to-compute first is not the point: the default first.
const ObserverKind kActivationKinds[] = {ObserverKind::kHistogram, ObserverKind::kMinMax, ObserverKind::kPercentile,
                                         ObserverKind::kEntropy};

struct Unit {
  std::string fqn;                  // the op's layer, or the functional op's TuneOp::to_string()
  std::vector<std::string> layers;  // every layer of its fused chain
  std::vector<TuneOp> ops;          // every functional op of its fused chain
  double sqnr_db = 0.0;
};

OpKind op_kind_named(const std::string& name) {
  for (size_t k = 0; k < static_cast<size_t>(OpKind::kNumOpKinds); ++k) {
    if (name == op_name(static_cast<OpKind>(k))) return static_cast<OpKind>(k);
  }
  DBRQ_THROW(FileFormatError, "unknown op \"", name, "\"");
}

json ops_to_json(const std::vector<TuneOp>& ops) {
  json a = json::array();
  for (const TuneOp& o : ops) a.push_back(json{{"module", o.module}, {"op", op_name(o.op)}, {"index", o.index}});
  return a;
}

std::vector<TuneOp> ops_from_json(const json& a) {
  std::vector<TuneOp> ops;
  for (const json& j : a) {
    TuneOp o;
    o.module = j.at("module").get<std::string>();
    o.op = op_kind_named(j.at("op").get<std::string>());
    o.index = j.at("index").get<int>();
    ops.push_back(std::move(o));
  }
  return ops;
}

// A trial that ran (or was resumed) with what it needs beyond the public record.
struct Trial {
  TuneTrial t;
  bool threw = false;  // evaluate or the factory threw: never reused on resume
};

// A trial's result as processes exchange it (executor mode).
struct Outcome {
  double metric = kNaN;
  double latency_ms = 0.0;
  std::string error;
  bool threw = false;
  std::string message;  // the exception's message when it threw
  int process = 0;      // which process evaluated it
};

// A trial a pass needs and no process has evaluated yet.
struct Pending {
  TuneConfig config;
  std::string stage;
  int index = 0;  // its index in the search, were it reached
};

json units_to_json(const std::vector<Unit>& units) {
  json s = json::array();
  for (const Unit& u : units) {
    s.push_back(json{{"fqn", u.fqn}, {"layers", u.layers}, {"ops", ops_to_json(u.ops)}, {"sqnr_db", metric_to_json(u.sqnr_db)}});
  }
  return s;
}

std::vector<Unit> units_from_json(const json& s) {
  std::vector<Unit> units;
  for (const json& j : s) {
    Unit u;
    u.fqn = j.at("fqn").get<std::string>();
    u.layers = j.at("layers").get<std::vector<std::string>>();
    if (j.contains("ops")) u.ops = ops_from_json(j.at("ops"));
    u.sqnr_db = metric_from_json(j.at("sqnr_db"));
    units.push_back(std::move(u));
  }
  return units;
}

// Temporary file, then rename: a reader never sees half a file.
void write_atomically(const std::string& path, const std::string& text, const char* what) {
  const std::string tmp = path + ".tmp";
  write_text_file(tmp, text);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    DBRQ_THROW(IOError, "autotune: cannot write ", what, " ", path, ": ", std::strerror(err));
  }
}

class Tuner {
 public:
  Tuner(const ModelFactory& make, const std::vector<std::vector<Tensor>>& calib, const EvaluateFn& evaluate,
        const TuneCriterion& criterion, const TuneBudget& budget, const AutotuneOptions& options,
        TrialExecutor* executor = nullptr)
      : make_(make),
        calib_(calib),
        evaluate_(evaluate),
        criterion_(criterion),
        budget_(budget),
        opt_(options),
        ex_(executor) {
    if (options.base_mapping.has_value()) base_ = std::make_shared<const QConfigMapping>(*options.base_mapping);
  }

  AutotuneRunStats stats() const { return stats_; }

  AutotuneResult run() {
    start_ = Clock::now();
    r_.criterion = criterion_;
    r_.bf16_used = bf16_supported();
    // The fp32 reference: always evaluated (a log is only resumed for the same model and metric).
    auto fp32_metric = [&] {
      std::shared_ptr<nn::Module> fp32 = fresh_model("the fp32 reference");
      if (base_ != nullptr) {
        try {
          base_->validate(*fp32);
        } catch (const ValueError& e) {
          e.rethrow_with_context("autotune: the base mapping does not fit the model: ");
        }
      }
      return call_evaluate(*fp32, "the fp32 reference");
    };
    if (ex_ == nullptr) {
      r_.fp32_metric = fp32_metric();
    } else {
      r_.fp32_metric = metric_from_json(
          json::parse(ex_->from_writer("evaluating the fp32 reference", [&] { return metric_to_json(fp32_metric()).dump(); })));
    }
    DBRQ_ENSURE(!std::isnan(r_.fp32_metric), ValueError,
                "autotune: evaluate returned NaN for the fp32 model; the metric must be a number");
    r_.target = criterion_.target(r_.fp32_metric);
    load_log();
    if (ex_ != nullptr) return run_passes();
    planned_ = 8;
    status_ = TuneStatus::kNotMet;
    if (search()) status_ = TuneStatus::kMet;
    finish();
    return std::move(r_);
  }

 private:
  // ---- executor mode: passes over the table of evaluated trials (autotune_executor.h) ----

  AutotuneResult run_passes() {
    for (;;) {
      r_.trials.clear();
      r_.sensitivity.clear();
      threw_.clear();
      run_ = 0;
      planned_ = 8;
      status_ = TuneStatus::kNotMet;
      frontier_.clear();
      // The writer's clock decides the time budget, the same way on every process.
      pass_elapsed_ = std::stod(ex_->from_writer("reading the clock", [&] {
        return absl::StrFormat("%.17g", seconds_since(start_));
      }));
      const bool met = search();
      // Trials before the first unknown one are what one process would have logged by now.
      const size_t known = frontier_.empty() ? r_.trials.size() : static_cast<size_t>(frontier_[0].index);
      ex_->from_writer("writing the trial log", [&] {
        write_log(known);
        return std::string();
      });
      if (frontier_.empty()) {
        if (met) status_ = TuneStatus::kMet;
        break;
      }
      const int n = static_cast<int>(frontier_.size());
      const std::vector<std::string> results = ex_->exchange(n, [&](int k) { return run_pending(frontier_[static_cast<size_t>(k)]); });
      DBRQ_CHECK(static_cast<int>(results.size()) == n);
      for (int k = 0; k < n; ++k) {
        const json j = json::parse(results[static_cast<size_t>(k)]);
        Outcome o;
        o.metric = metric_from_json(j.at("metric"));
        o.latency_ms = j.at("latency_ms").get<double>();
        o.error = j.at("error").get<std::string>();
        o.threw = j.at("threw").get<bool>();
        o.message = j.at("message").get<std::string>();
        o.process = k;
        table_[frontier_[static_cast<size_t>(k)].config.key()] = o;
      }
      ++stats_.rounds;
      stats_.evaluated += n;
    }
    int used = 0;
    for (const TuneTrial& t : r_.trials) used += t.resumed ? 0 : 1;
    stats_.discarded = stats_.evaluated - used;
    if (stats_.discarded > 0) {
      log()->info("autotune: {} trials evaluated in {} rounds on {} processes; {} speculative ones discarded (not "
                  "counted, not logged)",
                  stats_.evaluated, stats_.rounds, ex_->width(), stats_.discarded);
    }
    finish();
    return std::move(r_);
  }

  // Evaluates one pending trial on this process; never throws (a failure is in the result).
  std::string run_pending(const Pending& p) {
    TuneTrial t;
    t.index = p.index;
    t.stage = p.stage;
    t.config = p.config;
    json o;
    try {
      std::shared_ptr<nn::Module> m = build(p.config, &t);
      o = json{{"metric", metric_to_json(t.metric)}, {"latency_ms", t.latency_ms}, {"error", t.error},
               {"threw", false}, {"message", ""}};
      // Its calibration as one process would save it (after evaluate: the call counts are in it),
      // in case it becomes the best.
      if (!std::isnan(t.metric)) states_[p.config.key()] = quant_state_to_json(model_quant_state(*m), m->type_name(), {});
      // The writer keeps the models that may become the best (it saves it): those that meet the
      // criterion (the search stops at the first), and the best metric it has seen.
      if (ex_->writer() && !std::isnan(t.metric)) {
        if (criterion_.met(t.metric, r_.fp32_metric)) kept_[p.config.key()] = m;
        const bool best = kept_best_key_.empty() || (criterion_.higher_is_better ? t.metric > kept_best_metric_
                                                                                 : t.metric < kept_best_metric_);
        if (best) {
          if (!kept_best_key_.empty() && !criterion_.met(kept_best_metric_, r_.fp32_metric)) kept_.erase(kept_best_key_);
          kept_best_key_ = p.config.key();
          kept_best_metric_ = t.metric;
          kept_[kept_best_key_] = m;
        }
      }
    } catch (const std::exception& e) {
      o = json{{"metric", "nan"}, {"latency_ms", 0.0}, {"error", absl::StrCat("threw: ", e.what())},
               {"threw", true}, {"message", e.what()}};
    } catch (...) {
      o = json{{"metric", "nan"}, {"latency_ms", 0.0}, {"error", "threw: unknown exception"},
               {"threw", true}, {"message", "unknown exception"}};
    }
    return o.dump();
  }

  // trial() in executor mode, past the resume and budget checks.
  int trial_from_table(const TuneConfig& c, const std::string& stage, const std::string& key) {
    TuneTrial t;
    t.index = static_cast<int>(r_.trials.size());
    t.stage = stage;
    t.config = c;
    auto it = table_.find(key);
    if (it == table_.end()) {
      frontier_.push_back(Pending{c, stage, t.index});
      if (static_cast<int>(frontier_.size()) >= ex_->width()) {
        stopped_ = true;
        return -2;
      }
      // Speculation: assume it fails the criterion and has no metric, and look further.
      t.metric = kNaN;
      ++run_;
      r_.trials.push_back(t);
      threw_.push_back(false);
      return t.index;
    }
    const Outcome& o = it->second;
    t.metric = o.metric;
    t.latency_ms = o.latency_ms;
    t.error = o.error;
    if (o.threw) {
      if (!frontier_.empty()) {  // reached only if an unknown trial before it fails: decide that first
        stopped_ = true;
        return -2;
      }
      // One process would have logged it and stopped here: so does every process, together.
      r_.trials.push_back(t);
      threw_.push_back(true);
      ex_->from_writer("writing the trial log", [&] {
        write_log(r_.trials.size());
        return std::string();
      });
      ex_->trial_failed(o.process, absl::StrCat("autotune: trial ", t.index, " (", key, ") failed: ", o.message));
    }
    ++run_;
    t.meets = !std::isnan(t.metric) && criterion_.met(t.metric, r_.fp32_metric);
    r_.trials.push_back(t);
    threw_.push_back(false);
    if (frontier_.empty() && t.index >= reported_) {  // a trial one process would have run by now
      reported_ = t.index + 1;
      log()->info("autotune: trial {} [{}] {} -> {}{}", t.index, stage, key, fmt_metric(t.metric),
                  t.meets ? " (meets the criterion)" : "");
      ex_->from_writer("on_trial", [&] {
        if (opt_.on_trial) {
          TuneProgress p;
          p.trials_done = run_;
          p.trials_planned = std::max(run_, std::min(budget_.max_trials, planned_ - resumed_count()));
          p.elapsed_seconds = seconds_since(start_);
          p.eta_seconds = (p.trials_planned - run_) * (p.elapsed_seconds / run_);
          p.last = &r_.trials.back();
          opt_.on_trial(p);
        }
        return std::string();
      });
    }
    return t.index;
  }

  double elapsed() const { return ex_ != nullptr ? pass_elapsed_ : seconds_since(start_); }

  // ---- the search ----

  // True when a trial met the criterion (the search stops there); false when the space or the
  // budget ran out (status_ says which).
  bool search() {
    // Stages 1-2: observer kind, then per-tensor weights.
    int best = -1, first = -1;
    for (bool per_channel : {true, false}) {
      for (ObserverKind k : kActivationKinds) {
        TuneConfig c;
        c.base = base_;
        c.activation = k;
        c.per_channel_weights = per_channel;
        const int i = trial(c, per_channel ? "observer" : "weights");
        if (i == -2) return false;
        if (r_.trials[static_cast<size_t>(i)].meets) return true;
        if (first < 0) first = i;
        if (better(i, best)) best = i;
      }
    }
    // Stage 3 starts from the default config unless another closed a real part of the gap to the
    // target: with a broken layer dominating the metric, the differences between configs are noise
    // (4.646 vs 4.681 dB, target 15) and the "best" may be an aggressive observer that hurts
    // everything else.
    if (first >= 0 && best >= 0 && best != first && !std::isnan(r_.trials[static_cast<size_t>(first)].metric)) {
      const double m0 = r_.trials[static_cast<size_t>(first)].metric, mb = r_.trials[static_cast<size_t>(best)].metric;
      const double gap = std::abs(r_.target - m0);
      if (!(std::abs(mb - m0) >= kBaseGapFraction * gap)) best = first;
    }
    // Stage 3: layers and functional ops to bf16, then fp32, worst SQNR first, accumulated.
    if (best < 0) {
      if (ex_ != nullptr && !frontier_.empty()) return false;  // speculative: nothing is known yet
      log()->warn("autotune: no observer configuration produced a metric; nothing to rank layers from");
      return false;
    }
    // Executor mode: the base of stage 3 is only known once every trial before it is.
    if (ex_ != nullptr && !logged_sensitivity_ && !frontier_.empty()) {
      stopped_ = true;
      return false;
    }
    TuneConfig cur = r_.trials[static_cast<size_t>(best)].config;
    const std::vector<Unit> units = sensitivity(cur);
    const bool bf16 = bf16_supported();
    planned_ = 8 + static_cast<int>(units.size()) * (bf16 ? 2 : 1);
    int cur_trial = best;
    for (const Unit& u : units) {
      int tb = -1;
      if (bf16) {
        TuneConfig c = cur;
        c.bf16_layers.insert(c.bf16_layers.end(), u.layers.begin(), u.layers.end());
        c.bf16_ops.insert(c.bf16_ops.end(), u.ops.begin(), u.ops.end());
        tb = trial(c, "bf16");
        if (tb == -2) return false;
        if (r_.trials[static_cast<size_t>(tb)].meets) return true;
      }
      TuneConfig c = cur;
      c.fp32_layers.insert(c.fp32_layers.end(), u.layers.begin(), u.layers.end());
      c.fp32_ops.insert(c.fp32_ops.end(), u.ops.begin(), u.ops.end());
      const int tf = trial(c, "fp32");
      if (tf == -2) return false;
      if (r_.trials[static_cast<size_t>(tf)].meets) return true;
      // Keep whichever scored better (fp32 when neither has a metric: it is the safe side).
      cur_trial = tb >= 0 && better(tb, tf) ? tb : tf;
      cur = r_.trials[static_cast<size_t>(cur_trial)].config;
    }
    return false;
  }

  // Whether trial a has a better metric than trial b (b = -1: none yet).
  bool better(int a, int b) const {
    const double ma = r_.trials[static_cast<size_t>(a)].metric;
    if (std::isnan(ma)) return false;
    if (b < 0) return true;
    const double mb = r_.trials[static_cast<size_t>(b)].metric;
    if (std::isnan(mb)) return true;
    return criterion_.higher_is_better ? ma > mb : ma < mb;
  }

  // The part of the default config's gap to the target another config must close to become
  // stage 3's base.
  static constexpr double kBaseGapFraction = 0.1;

  // Runs (or resumes) one trial; its index in r_.trials, or -2 when the budget stops the search.
  int trial(const TuneConfig& c, const std::string& stage) {
    const std::string key = c.key();
    auto it = logged_.find(key);
    if (it != logged_.end() && !it->second.threw) {
      Trial t = it->second;
      t.t.index = static_cast<int>(r_.trials.size());
      t.t.stage = stage;
      t.t.config = c;
      t.t.resumed = true;
      t.t.meets = !std::isnan(t.t.metric) && criterion_.met(t.t.metric, r_.fp32_metric);
      r_.trials.push_back(t.t);
      threw_.push_back(false);
      return t.t.index;
    }
    if (run_ >= budget_.max_trials) {
      status_ = TuneStatus::kTrialBudget;
      return -2;
    }
    if (budget_.max_seconds > 0 && elapsed() >= budget_.max_seconds) {
      status_ = TuneStatus::kTimeBudget;
      return -2;
    }
    if (ex_ != nullptr) return trial_from_table(c, stage, key);
    TuneTrial t;
    t.index = static_cast<int>(r_.trials.size());
    t.stage = stage;
    t.config = c;
    const auto t0 = Clock::now();
    std::shared_ptr<nn::Module> model;
    try {
      model = build(c, &t);
    } catch (const std::exception& e) {
      t.metric = kNaN;
      t.error = absl::StrCat("threw: ", e.what());
      r_.trials.push_back(t);
      threw_.push_back(true);
      write_log();
      throw;
    }
    ++run_;
    trial_seconds_ += seconds_since(t0);
    t.meets = !std::isnan(t.metric) && criterion_.met(t.metric, r_.fp32_metric);
    r_.trials.push_back(t);
    threw_.push_back(false);
    if (better(t.index, best_in_memory_) && !std::isnan(t.metric)) {
      best_in_memory_ = t.index;
      best_model_ = model;
    }
    write_log();
    log()->info("autotune: trial {} [{}] {} -> {}{}", t.index, stage, key, fmt_metric(t.metric),
                t.meets ? " (meets the criterion)" : "");
    if (opt_.on_trial) {
      TuneProgress p;
      p.trials_done = run_;
      p.trials_planned = std::max(run_, std::min(budget_.max_trials, planned_ - resumed_count()));
      p.elapsed_seconds = seconds_since(start_);
      p.eta_seconds = (p.trials_planned - run_) * (trial_seconds_ / run_);
      p.last = &r_.trials.back();
      opt_.on_trial(p);
    }
    return t.index;
  }

  int resumed_count() const {
    int n = 0;
    for (const TuneTrial& t : r_.trials) n += t.resumed ? 1 : 0;
    return n;
  }

  std::shared_ptr<nn::Module> fresh_model(const std::string& what) {
    std::shared_ptr<nn::Module> m;
    try {
      m = make_();
    } catch (const Error& e) {
      e.rethrow_with_context(absl::StrCat("autotune: the model factory threw building ", what, ": "));
    } catch (const std::exception& e) {
      DBRQ_THROW(UsageError, "autotune: the model factory threw building ", what, ": ", e.what());
    }
    DBRQ_ENSURE(m != nullptr, ValueError, "autotune: the model factory returned null building ", what);
    DBRQ_ENSURE(!is_prepared(*m), ValueError, "autotune: the model factory returned a prepared model building ", what,
                "; it must build a fresh fp32 model on every call (prepare and convert work in place)");
    return m;
  }

  double call_evaluate(nn::Module& m, const std::string& what) {
    try {
      return evaluate_(m);
    } catch (const ControlFlowError& e) {
      e.rethrow_with_context(absl::StrCat("autotune: evaluating ", what,
                                          " ran a path the calibration data never took (calibrate on data that "
                                          "takes every path the evaluation takes): "));
    } catch (const Error& e) {
      e.rethrow_with_context(absl::StrCat("autotune: evaluate threw on ", what, ": "));
    } catch (const std::exception& e) {
      DBRQ_THROW(UsageError, "autotune: evaluate threw on ", what, ": ", e.what());
    }
  }

  // A converted model for config c (the trial's metric and latency into *t when given).
  std::shared_ptr<nn::Module> build(const TuneConfig& c, TuneTrial* t) {
    const std::string what = t != nullptr ? absl::StrCat("trial ", t->index, " (", c.key(), ")") : c.key();
    std::shared_ptr<nn::Module> m = fresh_model(what);
    prepare(*m, calib_[0], c.mapping());
    for (const std::vector<Tensor>& batch : calib_) m->forward_tensors(batch);
    ConvertOptions co;
    co.strict_paths = true;  // an uncalibrated path must not pass silently as fp32
    convert(*m, co);
    if (t == nullptr) return m;
    t->metric = call_evaluate(*m, what);
    if (std::isnan(t->metric)) {
      t->error = "evaluate returned NaN";
      log()->warn("autotune: {}: evaluate returned NaN; the trial counts as failed", what);
    }
    if (opt_.latency_iters > 0) {
      std::vector<double> ms;
      for (int i = 0; i < opt_.latency_iters + 1; ++i) {
        const auto t0 = Clock::now();
        m->forward_tensors(calib_[0]);
        if (i > 0) ms.push_back(seconds_since(t0) * 1e3);  // the first call creates primitives
      }
      std::sort(ms.begin(), ms.end());
      t->latency_ms = ms[ms.size() / 2];
    }
    return m;
  }

  // Layers ranked by the SQNR of their op against fp32 under config c (from the log when there).
  std::vector<Unit> sensitivity(const TuneConfig& c) {
    std::vector<Unit> units;
    if (logged_sensitivity_) {
      units = logged_units_;
    } else if (ex_ != nullptr) {
      // Measured once, on the writer; every process ranks with its numbers.
      units = units_from_json(json::parse(
          ex_->from_writer("ranking layers by sensitivity", [&] { return units_to_json(rank_units(c)).dump(); })));
      logged_units_ = units;
      logged_sensitivity_ = true;
    } else {
      units = rank_units(c);
      logged_units_ = units;
      logged_sensitivity_ = true;
      write_log();
    }
    for (const Unit& u : units) r_.sensitivity.emplace_back(u.fqn, u.sqnr_db);
    return units;
  }

  std::vector<Unit> rank_units(const TuneConfig& c) {
    std::vector<Unit> units;
    {
      std::shared_ptr<nn::Module> q = build(c, nullptr);
      std::shared_ptr<nn::Module> ref = fresh_model("the fp32 reference for compare_numerics");
      const NumericReport rep = compare_numerics(*ref, *q, calib_);
      // Leaf layers, and functional ops by their call site (a functional op's fqn is its module,
      // and moving a module would move all of it).
      std::set<std::string> leaves;
      for (const auto& [fqn, mod] : ref->named_modules()) {
        if (!fqn.empty() && mod->children().empty()) leaves.insert(fqn);
      }
      const std::vector<QuantizedOpInfo> ops = quantized_ops(*q);
      // An op's SQNR includes the error its inputs bring: rank by the noise it adds itself, its
      // noise-to-signal ratio minus its inputs' (a layer after a broken one is not to blame).
      ModelQuantState& ms = model_quant_state(*q);
      std::map<std::string, const AutoQuantizationState*> states;
      for (const AutoQuantizationState* st : ms.states()) states[st->fqn()] = st;
      std::map<std::pair<std::string, int>, double> reported;
      for (const OpNumerics& o : rep.ops) reported[{o.module_fqn, o.index}] = o.sqnr_db;
      auto nsr = [](double db) { return std::isinf(db) ? (db > 0 ? 0.0 : kInf) : std::pow(10.0, -db / 10.0); };
      auto input_nsr = [&](int64_t id) {
        for (int hops = 0; hops < 64; ++hops) {  // through ops compare_numerics does not report
          const ModelQuantState::TensorRecord* tr = ms.tensor(id);
          if (tr == nullptr || tr->record < 0) return 0.0;  // an fp32 source: exact
          const auto& [st, idx] = ms.records()[static_cast<size_t>(tr->record)];
          const SeenOpInfo& p = st->seen_ops()[static_cast<size_t>(idx)];
          const int base = p.fusion.fused() ? p.fusion.base : p.index;
          auto it = reported.find({st->fqn(), base});
          if (it != reported.end()) return nsr(it->second);
          if (p.inputs.empty()) return 0.0;
          id = p.inputs[0].id;
        }
        return 0.0;
      };
      // The seen op a report entry is about, when it is a functional op with a call site.
      auto functional = [&](const std::string& module, int index) -> const SeenOpInfo* {
        auto st = states.find(module);
        if (st == states.end() || index < 0 || index >= static_cast<int>(st->second->seen_ops().size())) return nullptr;
        const SeenOpInfo& p = st->second->seen_ops()[static_cast<size_t>(index)];
        return p.leaf == nullptr && p.order >= 0 ? &p : nullptr;
      };
      std::vector<std::pair<double, const OpNumerics*>> ranked;
      for (const OpNumerics& o : rep.ops) {
        // An exact op (+inf) has nothing to gain. -inf (noise where fp32 is all zero) and NaN (a
        // non-finite value in its output) are the most sensitive of all: ranked first.
        if (!leaves.count(o.fqn) && functional(o.module_fqn, o.index) == nullptr) continue;
        if (std::isinf(o.sqnr_db) && o.sqnr_db > 0) continue;
        if (!std::isfinite(o.sqnr_db)) {
          ranked.emplace_back(kInf, &o);
          continue;
        }
        double in = 0.0;
        auto st = states.find(o.module_fqn);
        if (st != states.end() && o.index < static_cast<int>(st->second->seen_ops().size())) {
          for (const QTensorInfo& t : st->second->seen_ops()[static_cast<size_t>(o.index)].inputs) {
            in = std::max(in, input_nsr(t.id));
          }
        }
        ranked.emplace_back(nsr(o.sqnr_db) - in, &o);
      }
      std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      std::set<std::string> done;
      for (const auto& [added, op] : ranked) {
        const OpNumerics& o = *op;
        const SeenOpInfo* f = leaves.count(o.fqn) ? nullptr : functional(o.module_fqn, o.index);
        Unit u;
        if (f != nullptr) {
          u.ops.push_back(TuneOp{o.module_fqn, f->kind, f->order});
          u.fqn = u.ops[0].to_string();
        } else {
          u.fqn = o.fqn;
          u.layers.push_back(o.fqn);
        }
        if (done.count(u.fqn)) continue;
        u.sqnr_db = added > 0 ? -10.0 * std::log10(added) : kInf;  // the SQNR of its own noise
        // The rest of its fused chain (batch norm, activation layers, functional followers) leaves
        // int8 with it.
        for (const QuantizedOpInfo& i : ops) {
          if (i.module == o.module_fqn && i.fused_into == o.index && i.fqn != o.fqn && leaves.count(i.fqn)) {
            u.layers.push_back(i.fqn);
          }
        }
        auto st = states.find(o.module_fqn);
        if (st != states.end() && o.index < static_cast<int>(st->second->seen_ops().size())) {
          for (const SeenOpInfo& p : st->second->seen_ops()) {
            if (p.index != o.index && p.fusion.fused() && p.fusion.base == o.index && p.leaf == nullptr && p.order >= 0) {
              u.ops.push_back(TuneOp{o.module_fqn, p.kind, p.order});
            }
          }
        }
        for (const std::string& l : u.layers) done.insert(l);
        for (const TuneOp& t : u.ops) done.insert(t.to_string());
        units.push_back(std::move(u));
      }
    }
    return units;
  }

  void finish() {
    // Best: the first trial that met the criterion, else the best metric.
    int best = -1;
    for (const TuneTrial& t : r_.trials) {
      if (t.meets) {
        best = t.index;
        break;
      }
    }
    if (best < 0) {
      for (const TuneTrial& t : r_.trials) {
        if (better(t.index, best)) best = t.index;
      }
    }
    r_.status = status_;
    r_.best_trial = best;
    if (best < 0) {
      log()->warn("autotune: no trial produced a metric");
      return;
    }
    const TuneTrial& b = r_.trials[static_cast<size_t>(best)];
    r_.best_config = b.config;
    r_.best_metric = b.metric;
    if (ex_ != nullptr) {
      // The process that evaluated the best trial sends its calibration (a resumed best is rebuilt
      // by the writer, as one process does); the writer saves it, atomically, while the other
      // processes wait for the outcome.
      const std::string key = b.config.key();
      auto o = table_.find(key);
      const int owner = b.resumed || o == table_.end() ? 0 : o->second.process;
      const std::string state = ex_->from_process(owner, "sending the best trial's calibration", [&] {
        auto it = states_.find(key);
        if (it != states_.end()) return it->second;
        std::shared_ptr<nn::Module> m = build(b.config, nullptr);
        return quant_state_to_json(model_quant_state(*m), m->type_name(), {});
      });
      states_.clear();
      ex_->from_writer("saving the best trial", [&] {
        auto it = kept_.find(key);
        if (it != kept_.end() && owner == 0 && !b.resumed) {
          r_.best_model = it->second;
        } else {  // the same model from the calibration: prepare, load, convert
          r_.best_model = fresh_model("the best trial");
          prepare(*r_.best_model, calib_[0], b.config.mapping());
          quant_state_from_json(model_quant_state(*r_.best_model), r_.best_model->type_name(), state,
                                "(the best trial's calibration)");
          ConvertOptions co;
          co.strict_paths = true;
          convert(*r_.best_model, co);
          stats_.rebuilt_best = 1;
        }
        kept_.clear();
        if (!opt_.quant_state_path.empty()) {
          write_atomically(opt_.quant_state_path, state, "the quant state");
          write_atomically(opt_.quant_state_path + ".mapping.json", qconfig_mapping_to_json(b.config.mapping()),
                           "the qconfig mapping");
        }
        return std::string();
      });
      if (status_ != TuneStatus::kMet) {
        log()->warn("autotune: the criterion ({}, target {}) was not met ({}); best found: trial {} with {}",
                    criterion_.to_string(), fmt_metric(r_.target), tune_status_name(status_), best,
                    fmt_metric(b.metric));
      }
      return;
    }
    // The model of a resumed trial is rebuilt (calibration is deterministic: the same parameters).
    r_.best_model = best == best_in_memory_ ? best_model_ : build(b.config, nullptr);
    if (!opt_.quant_state_path.empty()) {
      save_quant_state(*r_.best_model, opt_.quant_state_path);
      save_qconfig_mapping(b.config.mapping(), opt_.quant_state_path + ".mapping.json");
    }
    if (status_ != TuneStatus::kMet) {
      log()->warn("autotune: the criterion ({}, target {}) was not met ({}); best found: trial {} with {}",
                  criterion_.to_string(), fmt_metric(r_.target), tune_status_name(status_), best, fmt_metric(b.metric));
    }
  }

  // ---- the log ----

  static json config_json(const TuneConfig& c) {
    return json{{"activation", observer_kind_name(c.activation)},
                {"per_channel_weights", c.per_channel_weights},
                {"bf16_layers", c.bf16_layers},
                {"fp32_layers", c.fp32_layers},
                {"bf16_ops", ops_to_json(c.bf16_ops)},
                {"fp32_ops", ops_to_json(c.fp32_ops)}};
  }

  void write_log(size_t limit = std::numeric_limits<size_t>::max()) {
    if (opt_.log_path.empty()) return;
    json doc;
    doc["format"] = kLogFormat;
    doc["version"] = kLogVersion;
    doc["criterion"] = criterion_.to_string();
    doc["base_mapping"] = base_ != nullptr ? json::parse(qconfig_mapping_to_json(*base_)) : json(nullptr);
    doc["fp32_metric"] = metric_to_json(r_.fp32_metric);
    doc["bf16_hardware"] = bf16_supported();
    json trials = json::array();
    for (size_t i = 0; i < r_.trials.size() && i < limit; ++i) {
      const TuneTrial& t = r_.trials[i];
      trials.push_back(json{{"index", t.index},
                            {"stage", t.stage},
                            {"key", t.config.key()},
                            {"config", config_json(t.config)},
                            {"metric", metric_to_json(t.metric)},
                            {"latency_ms", t.latency_ms},
                            {"meets", t.meets},
                            {"threw", threw_[i]},
                            {"error", t.error}});
    }
    doc["trials"] = trials;
    if (logged_sensitivity_) doc["sensitivity"] = units_to_json(logged_units_);
    // Written whole to a temporary file, then renamed: an interrupted search leaves a readable log.
    const std::string tmp = opt_.log_path + ".tmp";
    write_text_file(tmp, doc.dump(1));
    DBRQ_ENSURE(std::rename(tmp.c_str(), opt_.log_path.c_str()) == 0, IOError, "autotune: cannot write trial log ",
                opt_.log_path, ": ", std::strerror(errno));
  }

  // "" when there is no log (a new search), else "L" + its text.
  std::string read_log() const {
    std::FILE* f = std::fopen(opt_.log_path.c_str(), "rb");
    if (f == nullptr) return std::string();
    std::string text = "L";
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    std::fclose(f);
    return text;
  }

  void load_log() {
    if (opt_.log_path.empty()) return;
    // Executor mode: the writer's log (other machines need not see its file system).
    std::string text = ex_ == nullptr ? read_log() : ex_->from_writer("reading the trial log", [&] { return read_log(); });
    if (text.empty()) return;  // a new search
    text.erase(0, 1);
    const std::string where = absl::StrCat("autotune log ", opt_.log_path);
    try {
      const json doc = json::parse(text);
      DBRQ_ENSURE(doc.is_object() && doc.value("format", "") == kLogFormat, FileFormatError, where,
                  " is not a dbrq autotune log (no \"format\": \"", kLogFormat, "\")");
      const int version = doc.at("version").get<int>();
      DBRQ_ENSURE(version == 1 || version == kLogVersion, FileFormatError, where, " has version ",
                  doc.at("version").dump(), "; this dbrq reads versions 1 and ", kLogVersion);
      // Version 1 (before functional ops were searched and before base mappings) always started
      // from the default mapping.
      const json logged_base = version == 1 ? json(nullptr) : doc.at("base_mapping");
      const json our_base = base_ != nullptr ? json::parse(qconfig_mapping_to_json(*base_)) : json(nullptr);
      DBRQ_ENSURE(logged_base == our_base, ValueError, where, " was written for ",
                  logged_base.is_null() ? std::string("the default base mapping") : "another base mapping",
                  " but this search starts from ",
                  our_base.is_null() ? std::string("the default one") : "another (AutotuneOptions::base_mapping)",
                  ". Delete the log or give another log path");
      const double f32 = metric_from_json(doc.at("fp32_metric"));
      const bool same = f32 == r_.fp32_metric || (std::isnan(f32) && std::isnan(r_.fp32_metric)) ||
                        std::abs(f32 - r_.fp32_metric) <= 1e-9 * std::max(1.0, std::abs(r_.fp32_metric));
      DBRQ_ENSURE(same, ValueError, where, " was written for an fp32 metric of ", fmt_metric(f32),
                  " but the fp32 model now scores ", fmt_metric(r_.fp32_metric),
                  ": another model or metric. Delete the log or give another log path");
      for (const json& j : doc.at("trials")) {
        Trial t;
        t.t.metric = metric_from_json(j.at("metric"));
        t.t.latency_ms = j.at("latency_ms").get<double>();
        t.t.error = j.at("error").get<std::string>();
        t.threw = j.at("threw").get<bool>();
        const std::string key = j.at("key").get<std::string>();
        if (!t.threw || !logged_.count(key)) logged_[key] = t;
      }
      if (doc.contains("sensitivity") && version == kLogVersion) {
        try {
          logged_units_ = units_from_json(doc.at("sensitivity"));
        } catch (const FileFormatError& e) {
          e.rethrow_with_context(absl::StrCat(where, ": sensitivity: "));
        }
        logged_sensitivity_ = true;
      } else if (doc.contains("sensitivity")) {
        // A version 1 ranking has layers only: measured again, so functional ops are candidates
        // too. Its trials (layer moves) keep their keys and are reused.
        log()->info("autotune: {} is a version 1 log: its layer ranking is measured again to include functional ops",
                    opt_.log_path);
      }
    } catch (const json::exception& e) {
      DBRQ_THROW(FileFormatError, where, " is malformed: ", e.what());
    }
    log()->info("autotune: resuming from {} ({} logged trials)", opt_.log_path, logged_.size());
  }

  const ModelFactory& make_;
  const std::vector<std::vector<Tensor>>& calib_;
  const EvaluateFn& evaluate_;
  TuneCriterion criterion_;
  TuneBudget budget_;
  const AutotuneOptions& opt_;
  std::shared_ptr<const QConfigMapping> base_;  // AutotuneOptions::base_mapping; null: the default
  AutotuneResult r_;
  TuneStatus status_ = TuneStatus::kNotMet;
  Clock::time_point start_;
  int run_ = 0;              // trials run by this call
  int planned_ = 0;
  double trial_seconds_ = 0.0;
  std::vector<bool> threw_;  // per r_.trials entry
  std::map<std::string, Trial> logged_;
  bool logged_sensitivity_ = false;
  std::vector<Unit> logged_units_;
  int best_in_memory_ = -1;
  std::shared_ptr<nn::Module> best_model_;
  // Executor mode.
  TrialExecutor* ex_ = nullptr;
  std::map<std::string, Outcome> table_;  // every evaluated trial, by key
  std::vector<Pending> frontier_;         // this pass's unknown trials, in search order
  bool stopped_ = false;                  // this pass stopped at an unknown (not the budget)
  double pass_elapsed_ = 0.0;             // the writer's clock at the start of the pass
  int reported_ = 0;                      // trials already logged / passed to on_trial
  std::map<std::string, std::shared_ptr<nn::Module>> kept_;  // writer: models that may be the best
  std::map<std::string, std::string> states_;  // quant state of every trial this process evaluated
  std::string kept_best_key_;
  double kept_best_metric_ = 0.0;
  AutotuneRunStats stats_;
};

std::string layer_list(const std::vector<std::string>& v) { return absl::StrCat("[", absl::StrJoin(v, ","), "]"); }

}  // namespace

TuneCriterion TuneCriterion::relative_loss(double fraction, bool higher_is_better) {
  DBRQ_ENSURE(std::isfinite(fraction) && fraction >= 0.0, ValueError,
              "TuneCriterion::relative_loss: the tolerable loss must be a finite fraction >= 0, got ", fraction);
  return TuneCriterion{Kind::kRelativeLoss, fraction, higher_is_better};
}

TuneCriterion TuneCriterion::absolute_loss(double amount, bool higher_is_better) {
  DBRQ_ENSURE(std::isfinite(amount) && amount >= 0.0, ValueError,
              "TuneCriterion::absolute_loss: the tolerable loss must be finite and >= 0, got ", amount);
  return TuneCriterion{Kind::kAbsoluteLoss, amount, higher_is_better};
}

TuneCriterion TuneCriterion::at_least(double value) {
  DBRQ_ENSURE(!std::isnan(value), ValueError, "TuneCriterion::at_least: the value is NaN");
  return TuneCriterion{Kind::kAtLeast, value, true};
}

TuneCriterion TuneCriterion::at_most(double value) {
  DBRQ_ENSURE(!std::isnan(value), ValueError, "TuneCriterion::at_most: the value is NaN");
  return TuneCriterion{Kind::kAtMost, value, false};
}

double TuneCriterion::target(double f) const {
  switch (kind) {
    case Kind::kAtLeast:
    case Kind::kAtMost:
      return value;
    case Kind::kRelativeLoss:
    case Kind::kAbsoluteLoss:
      break;
  }
  DBRQ_ENSURE(std::isfinite(f), ValueError, "autotune: a ", kind == Kind::kRelativeLoss ? "relative" : "absolute",
              " loss needs a finite fp32 metric, but the fp32 model scores ", fmt_metric(f),
              " (a metric against fp32 itself, like SQNR or MSE?); use TuneCriterion::at_least / at_most");
  if (kind == Kind::kRelativeLoss) {
    const double m = std::abs(f) * value;
    return higher_is_better ? f - m : f + m;
  }
  return higher_is_better ? f - value : f + value;
}

bool TuneCriterion::met(double metric, double fp32_metric) const {
  if (std::isnan(metric)) return false;
  const double t = target(fp32_metric);
  return higher_is_better ? metric >= t : metric <= t;
}

std::string TuneCriterion::to_string() const {
  const char* dir = higher_is_better ? "higher is better" : "lower is better";
  switch (kind) {
    case Kind::kRelativeLoss:
      return absl::StrCat("relative loss <= ", fmt_metric(value * 100), "% (", dir, ")");
    case Kind::kAbsoluteLoss:
      return absl::StrCat("absolute loss <= ", fmt_metric(value), " (", dir, ")");
    case Kind::kAtLeast:
      return absl::StrCat("metric >= ", fmt_metric(value));
    case Kind::kAtMost:
      return absl::StrCat("metric <= ", fmt_metric(value));
  }
  return "?";
}

std::string TuneOp::to_string() const {
  return absl::StrCat(module, module.empty() ? "" : ".", op == OpKind::kNumOpKinds ? "?" : op_name(op), "#", index);
}

QConfigMapping TuneConfig::mapping() const {
  const ObserverSpec w = per_channel_weights ? ObserverSpec::per_channel_min_max()
                                             : ObserverSpec::min_max(DType::kS8, QScheme::kPerTensorSymmetric);
  const QConfigPtr tuned = QConfig::make(activation_spec(activation), w);
  QConfigMapping m;
  if (base == nullptr) {
    m = default_qconfig_mapping("onednn");
    m.set_global(tuned);
  } else {
    // The base's int8 QConfigs take the trial's observer and weights; its structure stays.
    auto tune = [&](const QConfigPtr& q) -> QConfigPtr {
      if (q == nullptr || q->is_bf16() || q->is_dynamic()) return q;
      switch (q->activation.kind) {
        case ObserverKind::kMinMax:
        case ObserverKind::kMovingAverageMinMax:
        case ObserverKind::kHistogram:
        case ObserverKind::kPercentile:
        case ObserverKind::kEntropy:
        case ObserverKind::kMse:
          return tuned;
        default:
          return q;  // fixed qparams (sigmoid, tanh), per-channel activations: kept
      }
    };
    m.set_global(tune(base->global()));
    for (const auto& [t, q] : base->object_types()) m.set_object_type(t, tune(q));
    for (const auto& [k, q] : base->op_types()) m.set_object_type(k, tune(q));
    for (const auto& [to, q] : base->module_type_object_types()) m.set_module_type_object_type(to.module_type, to.op, tune(q));
    for (const auto& [r, q] : base->module_name_regexes()) m.set_module_name_regex(r, tune(q));
    for (const auto& [n, q] : base->module_names()) m.set_module_name(n, tune(q));
    for (const auto& [site, q] : base->module_name_object_type_orders()) {
      m.set_module_name_object_type_order(site.module_fqn, site.op, site.index, tune(q));
    }
  }
  for (const std::string& l : bf16_layers) m.set_module_name(l, QConfig::bf16());
  for (const std::string& l : fp32_layers) m.set_module_name(l, nullptr);
  for (const TuneOp& o : bf16_ops) m.set_module_name_object_type_order(o.module, o.op, o.index, QConfig::bf16());
  for (const TuneOp& o : fp32_ops) m.set_module_name_object_type_order(o.module, o.op, o.index, nullptr);
  return m;
}

std::string TuneConfig::key() const {
  std::string k = absl::StrCat("act=", observer_kind_name(activation), " w=", per_channel_weights ? "per_channel" : "per_tensor",
                               " bf16=", layer_list(bf16_layers), " fp32=", layer_list(fp32_layers));
  if (!bf16_ops.empty() || !fp32_ops.empty()) {
    auto list = [](const std::vector<TuneOp>& v) {
      std::vector<std::string> s;
      for (const TuneOp& o : v) s.push_back(o.to_string());
      return layer_list(s);
    };
    absl::StrAppend(&k, " bf16_ops=", list(bf16_ops), " fp32_ops=", list(fp32_ops));
  }
  return k;
}

const char* tune_status_name(TuneStatus s) {
  switch (s) {
    case TuneStatus::kMet:
      return "met";
    case TuneStatus::kNotMet:
      return "not met (search space exhausted)";
    case TuneStatus::kTrialBudget:
      return "not met (trial budget exhausted)";
    case TuneStatus::kTimeBudget:
      return "not met (time budget exhausted)";
  }
  return "?";
}

std::string AutotuneResult::to_string() const {
  std::string s = absl::StrFormat("autotune: %s; fp32 metric %s, target %s (%s)\n", tune_status_name(status),
                                  fmt_metric(fp32_metric), fmt_metric(target), criterion.to_string());
  absl::StrAppend(&s, absl::StrFormat("%5s  %-8s  %-12s  %10s  %s\n", "trial", "stage", "metric", "latency", "config"));
  for (const TuneTrial& t : trials) {
    absl::StrAppend(&s, absl::StrFormat("%5d  %-8s  %-12s  %8.3fms  %s%s%s%s\n", t.index, t.stage, fmt_metric(t.metric),
                                        t.latency_ms, t.config.key(), t.meets ? "  <- meets" : "",
                                        t.resumed ? "  (resumed)" : "", t.error.empty() ? "" : "  " + t.error));
  }
  if (best_trial >= 0) {
    absl::StrAppend(&s, "best: trial ", best_trial, ", ", best_config.key(), ", metric ", fmt_metric(best_metric), "\n");
  }
  return s;
}

namespace {

void check_autotune_args(const ModelFactory& make_model, const std::vector<std::vector<Tensor>>& calibration,
                         const EvaluateFn& evaluate, const TuneBudget& budget, const AutotuneOptions& options) {
  DBRQ_ENSURE(make_model != nullptr, ValueError, "autotune: the model factory is empty");
  DBRQ_ENSURE(evaluate != nullptr, ValueError, "autotune: the evaluate callback is empty");
  DBRQ_ENSURE(!calibration.empty(), ValueError, "autotune: no calibration data (one input list per call expected)");
  for (size_t i = 0; i < calibration.size(); ++i) {
    DBRQ_ENSURE(!calibration[i].empty() && calibration[i].size() <= 4, ValueError, "autotune: calibration call ", i,
                " has ", calibration[i].size(), " tensors; a call takes 1 to 4");
  }
  DBRQ_ENSURE(budget.max_trials >= 1, ValueError, "autotune: the budget allows ", budget.max_trials,
              " trials; it must allow at least 1");
  DBRQ_ENSURE(std::isfinite(budget.max_seconds) && budget.max_seconds >= 0, ValueError,
              "autotune: max_seconds must be finite and >= 0 (0: no limit), got ", budget.max_seconds);
  DBRQ_ENSURE(options.latency_iters >= 0, ValueError, "autotune: latency_iters must be >= 0, got ",
              options.latency_iters);
}

}  // namespace

AutotuneResult autotune(const ModelFactory& make_model, const std::vector<std::vector<Tensor>>& calibration,
                        const EvaluateFn& evaluate, const TuneCriterion& criterion, const TuneBudget& budget,
                        const AutotuneOptions& options) {
  check_autotune_args(make_model, calibration, evaluate, budget, options);
  Tuner t(make_model, calibration, evaluate, criterion, budget, options);
  return t.run();
}

AutotuneResult autotune_with_executor(TrialExecutor& executor, const ModelFactory& make_model,
                                      const std::vector<std::vector<Tensor>>& calibration, const EvaluateFn& evaluate,
                                      const TuneCriterion& criterion, const TuneBudget& budget,
                                      const AutotuneOptions& options, AutotuneRunStats* stats) {
  DBRQ_ENSURE(executor.width() >= 1, ValueError, "autotune: the executor evaluates ", executor.width(),
              " trials per round; it must evaluate at least 1");
  check_autotune_args(make_model, calibration, evaluate, budget, options);
  Tuner t(make_model, calibration, evaluate, criterion, budget, options, &executor);
  AutotuneResult r = t.run();
  if (stats != nullptr) *stats = t.stats();
  return r;
}

}  // namespace dbrq
