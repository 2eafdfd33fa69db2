// Accuracy-driven autotuning with trials evaluated in parallel across MPI ranks (issue 15).
//
//   dbrq::distributed::MpiSession mpi(&argc, &argv);
//   dbrq::distributed::Comm comm;
//   dbrq::AutotuneOptions opt;                      // the same options as dbrq::autotune
//   opt.log_path = "tune.json";                     // written by rank 0 only
//   opt.quant_state_path = "best.qstate.json";      // written by rank 0 only, atomically
//   dbrq::distributed::TuneStats st;
//   dbrq::AutotuneResult r = dbrq::distributed::autotune(comm, make, calib, accuracy,
//       dbrq::TuneCriterion::relative_loss(0.01), dbrq::TuneBudget{30, 0}, opt, &st);
//   // every rank: the same r.trials / r.best_config / r.status; rank 0: r.best_model
//
// The same choice as one process with the same budget: every rank runs the same deterministic
// search over a shared table of evaluated trials; each round, rank k evaluates the k-th trial the
// search does not know yet (in search order, looking ahead on the assumption that unknown trials
// fail the criterion), on its own replica calibrated on the whole calibration set, and every rank
// receives every result (tracer/autotune_executor.h, docs/distributed.md "Distributed tuning").
// Trials the single-process search would not have reached are discarded: not logged, not counted
// against the budget (TuneStats::discarded). The fp32 reference, the sensitivity ranking and the
// files are computed / written on rank 0 and broadcast.
//
// Failures: a trial the search reaches that threw on rank k makes every rank throw the same
// DistributedError ("autotune failed on rank k of n: autotune: trial 3 (...) failed: <cause>")
// after rank 0 logged the trial; no quant-state file is written. A rank that hangs or dies is
// caught by the Comm's timeout or by mpirun, as in distributed calibration.
#pragma once

#include "distributed/comm.h"
#include "tracer/autotune.h"

namespace dbrq::distributed {

struct TuneStats {
  int ranks = 1;
  int rounds = 0;        // rounds of parallel evaluation
  int evaluated = 0;     // trials evaluated on some rank, speculative ones included
  int discarded = 0;     // evaluated but not reached by the search (not logged, not counted)
  bool rebuilt_best = false;  // rank 0 rebuilt the best model (another rank had evaluated it)
  double exchange_ms = 0;     // this rank's time in the collectives (waiting for the slowest rank included)
};

// Collective: every rank of `comm` calls it with the same arguments (the same factory, calibration
// and evaluate semantics). Throws what dbrq::autotune throws for bad arguments (checked on every
// rank before any collective), and DistributedError when a rank failed.
AutotuneResult autotune(Comm& comm, const ModelFactory& make_model, const std::vector<std::vector<Tensor>>& calibration,
                        const EvaluateFn& evaluate, const TuneCriterion& criterion, const TuneBudget& budget,
                        const AutotuneOptions& options = {}, TuneStats* stats = nullptr);

}  // namespace dbrq::distributed
