#include "distributed/tune.h"

#include <nlohmann/json.hpp>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "tracer/autotune_executor.h"

namespace dbrq::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// The tracer's executor seam on a Comm: rank 0 is the writer; a round is a gather to rank 0 and
// a broadcast of every result. Messages from the writer are 'D' + data or 'E' + why not.
class CommExecutor : public TrialExecutor {
 public:
  explicit CommExecutor(Comm& comm) : comm_(comm) {}

  int width() const override { return comm_.size(); }
  bool writer() const override { return comm_.rank() == 0; }

  std::string from_process(int process, const std::string& stage, const std::function<std::string()>& compute) override {
    std::string mine;
    if (comm_.rank() == process) {
      try {
        mine = "D" + compute();
      } catch (const std::exception& e) {
        mine = absl::StrCat("E", e.what());
      } catch (...) {
        mine = "Eunknown exception";
      }
    }
    const auto t0 = Clock::now();
    const std::string got = comm_.broadcast(mine, process, absl::StrCat("autotune: ", stage));
    exchange_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    DBRQ_ENSURE(!got.empty() && got[0] == 'D', DistributedError, "autotune failed on rank ", process, " of ", comm_.size(), " (",
                stage, "): ", got.empty() ? std::string("no answer") : got.substr(1));
    return got.substr(1);
  }

  std::vector<std::string> exchange(int n, const std::function<std::string(int)>& run) override {
    const std::string mine = comm_.rank() < n ? run(comm_.rank()) : std::string();
    const auto t0 = Clock::now();
    const std::vector<std::string> all = comm_.gather(mine, 0, "autotune: collecting trial results");
    std::string joined;
    if (writer()) {
      nlohmann::json a = nlohmann::json::array();
      for (int k = 0; k < n; ++k) a.push_back(all[static_cast<size_t>(k)]);
      joined = a.dump();
    }
    const std::string back = comm_.broadcast(joined, 0, "autotune: sharing trial results");
    exchange_ms_ += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return nlohmann::json::parse(back).get<std::vector<std::string>>();
  }

  [[noreturn]] void trial_failed(int process, const std::string& message) override {
    DBRQ_THROW(DistributedError, "autotune failed on rank ", process, " of ", comm_.size(), ": ", message);
  }

  double exchange_ms() const { return exchange_ms_; }

 private:
  Comm& comm_;
  double exchange_ms_ = 0;
};

}  // namespace

AutotuneResult autotune(Comm& comm, const ModelFactory& make_model, const std::vector<std::vector<Tensor>>& calibration,
                        const EvaluateFn& evaluate, const TuneCriterion& criterion, const TuneBudget& budget,
                        const AutotuneOptions& options, TuneStats* stats) {
  CommExecutor ex(comm);
  AutotuneRunStats rs;
  AutotuneResult r = autotune_with_executor(ex, make_model, calibration, evaluate, criterion, budget, options, &rs);
  if (stats != nullptr) {
    stats->ranks = comm.size();
    stats->rounds = rs.rounds;
    stats->evaluated = rs.evaluated;
    stats->discarded = rs.discarded;
    stats->rebuilt_best = rs.rebuilt_best != 0;
    stats->exchange_ms = ex.exchange_ms();
  }
  return r;
}

}  // namespace dbrq::distributed
