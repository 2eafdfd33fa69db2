// The seam between dbrq::autotune's search and processes that evaluate its trials in parallel
// (//distributed: dbrq::distributed::autotune). Not part of the public API (dbrq.h does not
// include it); the core library stays free of MPI: an executor only moves strings.
//
//   class MyExecutor : public dbrq::TrialExecutor { ... };   // width() processes, one writer
//   MyExecutor ex;
//   dbrq::AutotuneRunStats stats;
//   dbrq::AutotuneResult r = dbrq::autotune_with_executor(ex, make, calib, evaluate, criterion, budget, opt, &stats);
//
// How the search runs on an executor (docs/distributed.md, "Distributed tuning"): every process
// runs the same deterministic search over the same table of finished trials. A pass replays the
// search from the start; the first trial whose result is not in the table is what one process
// would run next, and the pass goes on speculatively (assuming that trial fails the criterion and
// has no metric) to collect up to width() unknown trials, in search order. Process k evaluates the
// k-th of them, every process receives every result, and the next pass replays again. The pass
// that meets no unknown trial is the search one process would have made, trial for trial: same
// trials, same order, same budget accounting (trials that pass never reached were evaluated but
// are discarded and not counted). The writer process alone writes the log and the quant state and
// calls on_trial.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tracer/autotune.h"

namespace dbrq {

class TrialExecutor {
 public:
  virtual ~TrialExecutor() = default;
  // Trials evaluated per round (the number of processes); >= 1.
  virtual int width() const = 0;
  // This process (process 0) writes the log and the quant state and calls on_trial.
  virtual bool writer() const = 0;
  // Collective: `compute` runs on the writer only; every process returns its result. When it
  // throws there, every process throws the same error naming the writer and `stage`.
  std::string from_writer(const std::string& stage, const std::function<std::string()>& compute) {
    return from_process(0, stage, compute);
  }
  // The same with process `process` computing (the writer is process 0).
  virtual std::string from_process(int process, const std::string& stage, const std::function<std::string()>& compute) = 0;
  // Collective: process k < n returns run(k) (run does not throw: it reports failures in its
  // result); every process receives the n results, in order.
  virtual std::vector<std::string> exchange(int n, const std::function<std::string(int)>& run) = 0;
  // Every process calls it at the same point when a trial the search needs threw on process
  // `process`; throws the same error on every process.
  [[noreturn]] virtual void trial_failed(int process, const std::string& message) = 0;
};

// What a run on an executor did beyond the search itself.
struct AutotuneRunStats {
  int rounds = 0;          // rounds of parallel evaluation
  int evaluated = 0;       // trials evaluated on some process (speculative ones included)
  int discarded = 0;       // evaluated but never reached by the search: not counted, not logged
  int rebuilt_best = 0;    // 1 when the writer rebuilt the best model from the calibration another process sent
};

// dbrq::autotune with the trials evaluated through `executor` (same arguments, same errors for bad
// arguments). On every process the result's trials, best config and status are the same;
// best_model is set on the writer only. The saved quant state is the text the process that
// evaluated the best trial serialized after evaluating it, as one process saves its model. A failed trial the search reaches makes every process
// throw (TrialExecutor::trial_failed); a time budget is checked against the writer's clock at the
// start of each pass, so only a search stopped by max_seconds can differ from one process's.
AutotuneResult autotune_with_executor(TrialExecutor& executor, const ModelFactory& make_model,
                                      const std::vector<std::vector<Tensor>>& calibration, const EvaluateFn& evaluate,
                                      const TuneCriterion& criterion, const TuneBudget& budget,
                                      const AutotuneOptions& options = {}, AutotuneRunStats* stats = nullptr);

}  // namespace dbrq
