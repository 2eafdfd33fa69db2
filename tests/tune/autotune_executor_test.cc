// autotune_with_executor (tracer/autotune_executor.h), the search behind distributed tuning, on a
// simulated executor: W "processes" run in this one, round by round. Whatever W, the result must
// be the single-process autotune's: same trials (keys, stages, metrics, meets), same status and
// best, the same quant-state and mapping bytes, the same log apart from latency; with trial
// budgets that cut a round of speculation short; with a log to resume; and a failure only when
// the single-process search would have reached the failing trial.
//
// What fails if the speculation is wrong: a speculative trial counted against the budget (status
// or trial count differs), logged (log differs), or used although the search would not reach it
// (trials differ); the best trial's calibration taken from a rebuilt model instead of the
// evaluated one (the quant state's call counts differ).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "dbrq.h"
#include "tests/test_util.h"
#include "tests/tune/fragile_model.h"
#include "tracer/autotune_executor.h"

namespace dbrq {
namespace {

// W processes simulated in one: a round runs its trials one after the other.
class SimulatedExecutor : public TrialExecutor {
 public:
  explicit SimulatedExecutor(int width) : width_(width) {}
  int width() const override { return width_; }
  bool writer() const override { return true; }
  std::string from_process(int, const std::string&, const std::function<std::string()>& compute) override {
    return compute();
  }
  std::vector<std::string> exchange(int n, const std::function<std::string(int)>& run) override {
    EXPECT_LE(n, width_);
    std::vector<std::string> out;
    for (int k = 0; k < n; ++k) out.push_back(run(k));
    ++rounds;
    return out;
  }
  [[noreturn]] void trial_failed(int process, const std::string& message) override {
    DBRQ_THROW(UsageError, "process ", process, ": ", message);
  }
  int rounds = 0;

 private:
  int width_;
};

// The log without its timing fields.
nlohmann::json log_without_timing(const std::string& path) {
  nlohmann::json doc = nlohmann::json::parse(testing::read_text(path));
  for (nlohmann::json& t : doc.at("trials")) t.erase("latency_ms");
  return doc;
}

void expect_same_search(const AutotuneResult& a, const AutotuneResult& b) {
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.best_trial, b.best_trial);
  EXPECT_EQ(a.best_config.key(), b.best_config.key());
  EXPECT_EQ(a.best_metric, b.best_metric);
  ASSERT_EQ(a.trials.size(), b.trials.size());
  for (size_t i = 0; i < a.trials.size(); ++i) {
    EXPECT_EQ(a.trials[i].config.key(), b.trials[i].config.key()) << i;
    EXPECT_EQ(a.trials[i].stage, b.trials[i].stage) << i;
    EXPECT_EQ(a.trials[i].metric, b.trials[i].metric) << i;
    EXPECT_EQ(a.trials[i].meets, b.trials[i].meets) << i;
    EXPECT_EQ(a.trials[i].resumed, b.trials[i].resumed) << i;
  }
  ASSERT_EQ(a.sensitivity.size(), b.sensitivity.size());
  for (size_t i = 0; i < a.sensitivity.size(); ++i) EXPECT_EQ(a.sensitivity[i].first, b.sensitivity[i].first);
}

struct TuneRun {
  AutotuneResult r;
  AutotuneRunStats stats;
  std::string state, mapping;
  nlohmann::json log;
};

// Single process (width 0) or simulated width W, with its own files.
TuneRun run(int width, const fragile::Setup& f, const EvaluateFn& eval, const TuneCriterion& c, const TuneBudget& b,
        const std::string& tag) {
  AutotuneOptions opt;
  opt.log_path = testing::temp_file(tag + ".log.json");
  opt.quant_state_path = testing::temp_file(tag + ".qstate.json");
  opt.latency_iters = 0;  // timing is not compared; the test stays fast
  std::remove(opt.log_path.c_str());
  std::remove(opt.quant_state_path.c_str());
  TuneRun out;
  if (width == 0) {
    out.r = autotune(fragile::make, f.calib, eval, c, b, opt);
  } else {
    SimulatedExecutor ex(width);
    out.r = autotune_with_executor(ex, fragile::make, f.calib, eval, c, b, opt, &out.stats);
    EXPECT_EQ(out.stats.rounds, ex.rounds);
  }
  if (out.r.best_trial >= 0) {
    out.state = testing::read_text(opt.quant_state_path);
    out.mapping = testing::read_text(opt.quant_state_path + ".mapping.json");
  }
  out.log = log_without_timing(opt.log_path);
  return out;
}

TEST(AutotuneExecutor, AnyWidthMakesTheSingleProcessChoiceWithTheSameFiles) {
  fragile::Setup f;
  const TuneCriterion c = TuneCriterion::at_least(fragile::kTarget);
  const TuneRun one = run(0, f, f.sqnr(), c, TuneBudget{}, "single");
  ASSERT_EQ(one.r.status, TuneStatus::kMet);
  ASSERT_GT(one.r.trials.size(), 8u);  // the search reached stage 3
  for (int w : {1, 2, 3, 7}) {  // 4: //tests/distributed:mpi_tune_test
    SCOPED_TRACE(absl::StrFormat("width %d", w));
    const TuneRun par = run(w, f, f.sqnr(), c, TuneBudget{}, absl::StrFormat("w%d", w));
    SCOPED_TRACE(par.r.to_string());
    expect_same_search(one.r, par.r);
    EXPECT_EQ(par.state, one.state);
    EXPECT_EQ(par.mapping, one.mapping);
    EXPECT_EQ(par.log, one.log);
    ASSERT_NE(par.r.best_model, nullptr);
    EXPECT_TRUE(is_converted(*par.r.best_model));
    EXPECT_EQ(f.sqnr()(*par.r.best_model), par.r.best_metric);
    // Every trial was evaluated once; fewer rounds than trials once W > 1.
    EXPECT_EQ(par.stats.evaluated - par.stats.discarded, static_cast<int>(par.r.trials.size()));
    if (w == 1) {
      EXPECT_EQ(par.stats.discarded, 0);
    } else {
      EXPECT_LT(par.stats.rounds, static_cast<int>(par.r.trials.size()));
    }
  }
}

TEST(AutotuneExecutor, TrialBudgetsCuttingARoundShortGiveTheSameStatusAndTrials) {
  fragile::Setup f;
  const TuneCriterion impossible = TuneCriterion::at_least(1e9);
  for (int budget : {3, 10}) {  // inside stage 1's first round; in stage 3, after the ranking
    const TuneRun one = run(0, f, f.sqnr(), impossible, TuneBudget{budget, 0}, "b_single");
    ASSERT_EQ(one.r.status, TuneStatus::kTrialBudget);
    ASSERT_EQ(one.r.trials.size(), static_cast<size_t>(budget));
    for (int w : {2, 4}) {
      SCOPED_TRACE(absl::StrFormat("budget %d, width %d", budget, w));
      const TuneRun par = run(w, f, f.sqnr(), impossible, TuneBudget{budget, 0}, "b_par");
      expect_same_search(one.r, par.r);
      EXPECT_EQ(par.state, one.state);
      EXPECT_EQ(par.log, one.log);
      EXPECT_LE(par.stats.evaluated, budget);  // speculation never runs past the budget
    }
  }
  // The whole space, criterion never met.
  const TuneRun one = run(0, f, f.sqnr(), impossible, TuneBudget{}, "all_single");
  const TuneRun par = run(3, f, f.sqnr(), impossible, TuneBudget{}, "all_par");
  EXPECT_EQ(one.r.status, TuneStatus::kNotMet);
  expect_same_search(one.r, par.r);
  EXPECT_EQ(par.state, one.state);
  EXPECT_EQ(par.log, one.log);
}

TEST(AutotuneExecutor, AFailingTrialTheSearchReachesFailsWithItsProcessAndIsLogged) {
  fragile::Setup f;
  const EvaluateFn sqnr = f.sqnr();
  int calls = 0;  // evaluate calls: fp32 first, then trials in evaluation order
  auto eval = [&](nn::Module& m) -> double {
    if (++calls == 4) throw std::runtime_error("boom");  // fp32, trials 0 and 1, then the 3rd trial evaluated
    return sqnr(m);
  };
  AutotuneOptions opt;
  opt.log_path = testing::temp_file("fail.log.json");
  opt.quant_state_path = testing::temp_file("fail.qstate.json");
  std::remove(opt.log_path.c_str());
  std::remove(opt.quant_state_path.c_str());
  SimulatedExecutor ex(2);  // round 1: trials 0, 1; round 2: trials 2 (process 0, throws), 3
  EXPECT_THROW_MSG(autotune_with_executor(ex, fragile::make, f.calib, eval, TuneCriterion::at_least(1e9), TuneBudget{}, opt),
                   UsageError,
                   "process 0: autotune: trial 2 (act=Percentile w=per_channel bf16=[] fp32=[]) failed: autotune: "
                   "evaluate threw on trial 2 (act=Percentile w=per_channel bf16=[] fp32=[]): boom");
  const nlohmann::json doc = nlohmann::json::parse(testing::read_text(opt.log_path));
  ASSERT_EQ(doc.at("trials").size(), 3u);  // trials 0, 1 and the failed one; not trial 3
  EXPECT_TRUE(doc.at("trials")[2].at("threw").get<bool>());
  EXPECT_FALSE(doc.at("trials")[1].at("threw").get<bool>());
  EXPECT_FALSE(std::filesystem::exists(opt.quant_state_path));
}

TEST(AutotuneExecutor, AFailingSpeculativeTrialTheSearchNeverReachesIsDiscarded) {
  fragile::Setup f;
  const EvaluateFn sqnr = f.sqnr();
  int calls = 0;
  auto eval = [&](nn::Module& m) -> double {
    if (++calls == 3) throw std::runtime_error("boom");  // trial 1, speculative: trial 0 meets
    return sqnr(m);
  };
  SimulatedExecutor ex(2);
  AutotuneRunStats st;
  const AutotuneResult r =
      autotune_with_executor(ex, fragile::make, f.calib, eval, TuneCriterion::at_least(-1e9), TuneBudget{}, {}, &st);
  EXPECT_EQ(r.status, TuneStatus::kMet);
  ASSERT_EQ(r.trials.size(), 1u);
  EXPECT_EQ(st.evaluated, 2);
  EXPECT_EQ(st.discarded, 1);
}

TEST(AutotuneExecutor, ResumesASingleProcessLogAndViceVersa) {
  fragile::Setup f;
  const TuneCriterion c = TuneCriterion::at_least(fragile::kTarget);
  AutotuneOptions opt;
  opt.log_path = testing::temp_file("resume_exec.json");
  std::remove(opt.log_path.c_str());
  autotune(fragile::make, f.calib, f.sqnr(), c, TuneBudget{5, 0}, opt);
  SimulatedExecutor ex(3);
  const AutotuneResult par = autotune_with_executor(ex, fragile::make, f.calib, f.sqnr(), c, TuneBudget{}, opt);
  const AutotuneResult one = run(0, f, f.sqnr(), c, TuneBudget{}, "resume_ref").r;
  ASSERT_EQ(par.trials.size(), one.trials.size());
  for (size_t i = 0; i < par.trials.size(); ++i) {
    EXPECT_EQ(par.trials[i].resumed, i < 5) << i;
    EXPECT_EQ(par.trials[i].config.key(), one.trials[i].config.key()) << i;
    EXPECT_EQ(par.trials[i].metric, one.trials[i].metric) << i;
  }
  EXPECT_EQ(par.best_config.key(), one.best_config.key());
}

TEST(AutotuneExecutor, BadArguments) {
  fragile::Setup f;
  SimulatedExecutor none(0);
  EXPECT_THROW_MSG(autotune_with_executor(none, fragile::make, f.calib, f.sqnr(), TuneCriterion::at_least(1), TuneBudget{}),
                   ValueError, "the executor evaluates 0 trials per round; it must evaluate at least 1");
  SimulatedExecutor two(2);
  EXPECT_THROW_MSG(autotune_with_executor(two, fragile::make, f.calib, f.sqnr(), TuneCriterion::at_least(1), TuneBudget{0, 0}),
                   ValueError, "it must allow at least 1");
  EXPECT_THROW_MSG(autotune_with_executor(two, fragile::make, {}, f.sqnr(), TuneCriterion::at_least(1), TuneBudget{}),
                   ValueError, "no calibration data");
  EXPECT_THROW_MSG(autotune_with_executor(two, nullptr, f.calib, f.sqnr(), TuneCriterion::at_least(1), TuneBudget{}),
                   ValueError, "the model factory is empty");
}

}  // namespace
}  // namespace dbrq
