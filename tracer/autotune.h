// Accuracy-driven autotuning: the cheapest quantization recipe that keeps a metric within a
// tolerable loss of the fp32 model.
//
//   auto make = [&] { auto m = std::make_shared<Net>(); m->load_state_dict(w); m->eval(); return m; };
//   std::vector<std::vector<dbrq::Tensor>> calib = {{x0}, {x1}, {x2}};      // one input list per call
//   auto accuracy = [&](dbrq::nn::Module& m) { return top1(m, test_set); };  // fp32 and every trial
//   dbrq::AutotuneOptions opt;
//   opt.log_path = "tune.json";                                             // resumable trial log
//   opt.quant_state_path = "best.qstate.json";                              // + best.qstate.json.mapping.json
//   dbrq::AutotuneResult r = dbrq::autotune(make, calib, accuracy, dbrq::TuneCriterion::relative_loss(0.01),
//                                           dbrq::TuneBudget{/*max_trials=*/30, /*max_seconds=*/600}, opt);
//   if (r.status == dbrq::TuneStatus::kMet) deploy(r.best_model);           // converted, ready to run
//
// Search order, cheapest first, stopping at the first trial that meets the criterion:
//   1. one global activation observer kind: histogram, minmax, percentile, entropy, with per-channel
//      s8 weights;
//   2. the same four with per-tensor s8 weights;
//   3. from the default config (or one of 1-2 that closed >= 10% of its gap to the target): the
//      layers and functional ops (a matmul, an add in a block's forward: TuneOp) ranked by the noise
//      their op adds (compare_numerics, measured once, worst first), one at a time and accumulated:
//      the layer or op to bf16 (when the CPU runs bf16,
//      dbrq::bf16_supported()), then to fp32 if bf16 is not enough; each layer keeps whichever of the
//      two scored better before the next one moves.
// Every trial builds a fresh model with the factory (prepare and convert work in place), prepares it
// with the trial's mapping, calibrates on all of `calibration`, converts and calls `evaluate` on it.
// The fp32 reference is `evaluate` on a fresh, unprepared model. See docs/autotune.md.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "quant_state/qconfig.h"
#include "runtime/module.h"

namespace dbrq {

// When a trial's metric is good enough, relative to the fp32 model's metric f.
struct TuneCriterion {
  enum class Kind {
    kRelativeLoss,  // higher is better: metric >= f * (1 - value); lower: metric <= f * (1 + value)
    kAbsoluteLoss,  // higher is better: metric >= f - value;       lower: metric <= f + value
    kAtLeast,       // metric >= value (f unused: e.g. SQNR vs fp32, whose fp32 value is +inf)
    kAtMost,        // metric <= value (e.g. MSE vs fp32, whose fp32 value is 0)
  };
  Kind kind = Kind::kRelativeLoss;
  double value = 0.0;
  bool higher_is_better = true;  // accuracy, SQNR: true; MSE, perplexity: false

  static TuneCriterion relative_loss(double fraction, bool higher_is_better = true);
  static TuneCriterion absolute_loss(double amount, bool higher_is_better = true);
  static TuneCriterion at_least(double value);
  static TuneCriterion at_most(double value);
  // The metric a trial must reach given the fp32 metric (throws ValueError when the criterion needs
  // a finite fp32 metric and it is not).
  double target(double fp32_metric) const;
  bool met(double metric, double fp32_metric) const;
  std::string to_string() const;  // "relative loss <= 1% (higher is better)"
};

// Limits of one autotune call. Trials read back from a log (resume) cost nothing and do not count.
struct TuneBudget {
  int max_trials = 50;       // quantized trials run by this call; must be >= 1
  double max_seconds = 0.0;  // wall time; 0: no limit. Checked before each trial (a trial is never cut)
};

// A functional op the search can move out of int8: the `index`-th call of `op` made directly in
// the forward of the module at `module` ("" is the root), as QConfigMapping's
// set_module_name_object_type_order addresses it.
struct TuneOp {
  std::string module;
  OpKind op = OpKind::kNumOpKinds;
  int index = 0;
  std::string to_string() const;  // "encoder.0.attn.matmul#1", "add#0" for the root's
  bool operator==(const TuneOp& o) const { return module == o.module && op == o.op && index == o.index; }
};

// One point of the search space.
struct TuneConfig {
  ObserverKind activation = ObserverKind::kHistogram;  // every activation observer
  bool per_channel_weights = true;                     // s8 symmetric per output channel, else per tensor
  std::vector<std::string> bf16_layers;                // layers (fqns) moved to QConfig::bf16()
  std::vector<std::string> fp32_layers;                // layers moved to fp32 (null QConfig)
  std::vector<TuneOp> bf16_ops;                        // functional ops moved to QConfig::bf16()
  std::vector<TuneOp> fp32_ops;                        // functional ops moved to fp32
  // The mapping the search starts from (AutotuneOptions::base_mapping); null: onednn's default.
  std::shared_ptr<const QConfigMapping> base;

  // The mapping this config stands for: the base with the observer and weight scheme in each of
  // its int8 QConfigs (global and entries whose activation observer is Histogram, MinMax,
  // MovingAverageMinMax, Percentile, Entropy or Mse; fixed-qparams, dynamic, bf16 and fp32 entries
  // stay), one module-name entry per moved layer and one call-site entry per moved op.
  QConfigMapping mapping() const;
  // A stable text key ("act=histogram w=per_channel bf16=[fc2] fp32=[]", then
  // " bf16_ops=[..] fp32_ops=[..]" when ops moved): trials are identified by it in the log. The base
  // is not in it (a log belongs to one base).
  std::string key() const;
};

enum class TuneStatus {
  kMet,           // a trial met the criterion: best is the first that did
  kNotMet,        // the whole search space was tried; best is the best metric found
  kTrialBudget,   // max_trials reached first; best so far
  kTimeBudget,    // max_seconds reached first; best so far
};
const char* tune_status_name(TuneStatus s);

struct TuneTrial {
  int index = 0;               // order in the search (the log's order)
  std::string stage;           // "observer", "weights", "bf16", "fp32"
  TuneConfig config;
  double metric = 0.0;         // NaN when the trial failed (see error)
  double latency_ms = 0.0;     // median of the converted model's call on the first calibration input
  bool meets = false;
  bool resumed = false;        // read back from the log, not run by this call
  std::string error;           // why the trial has no usable metric ("evaluate returned NaN")
};

struct TuneProgress {
  int trials_done = 0;    // in this call
  int trials_planned = 0; // an upper bound for this call: min(budget, trials left in the space)
  double elapsed_seconds = 0.0;
  double eta_seconds = 0.0;  // from the mean trial time so far (+inf before the first)
  const TuneTrial* last = nullptr;
};

struct AutotuneOptions {
  // Trial log (JSON), rewritten after every trial. An existing log of the same search (same
  // criterion and fp32 metric's model; see docs/autotune.md) is resumed: its trials are not run
  // again. Empty: no log.
  std::string log_path;
  // The best trial's calibration as a quant-state file, and its mapping next to it
  // (quant_state_path + ".mapping.json"): load_qconfig_mapping + prepare + load_quant_state +
  // convert reproduce the best model exactly. Empty: not saved.
  std::string quant_state_path;
  // Called after every trial (e.g. a progress bar); exceptions from it propagate.
  std::function<void(const TuneProgress&)> on_trial;
  // Calls timed per trial for latency_ms (0: not measured).
  int latency_iters = 5;
  // The mapping every trial starts from instead of default_qconfig_mapping("onednn"), e.g.
  // transformer_qconfig_mapping() (a SmoothQuant'ed model is the factory's business). Its
  // structure (what is fp32, bf16, fixed-qparams, dynamic) is kept; the observer and weight stages
  // change its int8 QConfigs (TuneConfig::mapping). Checked against the fp32 model (ValueError for
  // a module name it does not have).
  std::optional<QConfigMapping> base_mapping;
};

struct AutotuneResult {
  TuneStatus status = TuneStatus::kNotMet;
  double fp32_metric = 0.0;
  double target = 0.0;               // what a trial had to reach
  TuneCriterion criterion;
  int best_trial = -1;               // index into trials; -1 when no trial produced a metric
  TuneConfig best_config;
  double best_metric = 0.0;
  std::shared_ptr<nn::Module> best_model;  // converted with best_config (null when best_trial < 0)
  std::vector<TuneTrial> trials;     // every trial, resumed ones included, in search order
  // Layers and functional ops (TuneOp::to_string()) ranked for stage 3, worst first: the SQNR of
  // the noise each adds itself (its op's noise
  // vs fp32, from compare_numerics, minus what its inputs bring), under the best observer config.
  // Empty when stages 1-2 met the criterion.
  std::vector<std::pair<std::string, double>> sensitivity;
  bool bf16_used = false;            // whether bf16 trials ran on bf16 hardware
  std::string to_string() const;     // a summary table
};

using ModelFactory = std::function<std::shared_ptr<nn::Module>()>;
using EvaluateFn = std::function<double(nn::Module& model)>;

// Runs the search. `calibration`: one tensor list per call of the model (1 to 4 tensors each);
// the first is also the example for prepare. Throws ValueError for an empty calibration, a null
// factory or callback, a budget of no trials or negative time, a NaN fp32 metric or a criterion that
// needs a finite one; the exception of `evaluate` or the factory (with the trial named in front, as a
// dbrq::Error of the same type when it is one, else UsageError) after logging the trial;
// ControlFlowError when evaluation runs a path the calibration never took (calibrate on data that
// takes every path). A trial whose metric is NaN is logged as failed and the search goes on.
AutotuneResult autotune(const ModelFactory& make_model, const std::vector<std::vector<Tensor>>& calibration,
                        const EvaluateFn& evaluate, const TuneCriterion& criterion, const TuneBudget& budget,
                        const AutotuneOptions& options = {});

}  // namespace dbrq
