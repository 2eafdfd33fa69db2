// The program tests/distributed/mpi_tune_test.cc runs under mpirun (and once without MPI, as the
// single-process reference): autotunes the fragile-layer model (tests/tune/fragile_model.h),
// writing the quant state, its mapping and the trial log, and prints one line per rank.
//
//   tune_worker --out=STATE.json --log=LOG.json [--single] [--min_sqnr=DB] [--trials=N]
//               [--throw_rank=R]   evaluate throws on rank R (every trial it evaluates)
//               [--timeout=S]
#include <cstdio>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

#include "dbrq.h"
#include "distributed/tune.h"
#include "tests/tune/fragile_model.h"

namespace {

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) continue;
    const size_t eq = s.find('=');
    a[s.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] = eq == std::string::npos ? "1" : s.substr(eq + 1);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const auto a = parse(argc, argv);
  dbrq::fragile::Setup f;
  const dbrq::TuneCriterion criterion =
      dbrq::TuneCriterion::at_least(a.count("min_sqnr") ? std::stod(a.at("min_sqnr")) : dbrq::fragile::kTarget);
  const dbrq::TuneBudget budget{a.count("trials") ? std::stoi(a.at("trials")) : 50, 0};
  dbrq::AutotuneOptions opt;
  opt.quant_state_path = a.at("out");
  opt.log_path = a.at("log");
  opt.latency_iters = 1;
  if (a.count("single")) {
    const dbrq::AutotuneResult r = dbrq::autotune(dbrq::fragile::make, f.calib, f.sqnr(), criterion, budget, opt);
    std::cout << "single ok: " << r.trials.size() << " trials, best " << r.best_config.key() << std::endl;
    return 0;
  }
  dbrq::distributed::MpiSession mpi(&argc, &argv);
  try {
    dbrq::distributed::Comm comm(a.count("timeout") ? std::stod(a.at("timeout")) : 60);
    const int throw_rank = a.count("throw_rank") ? std::stoi(a.at("throw_rank")) : -1;
    const dbrq::EvaluateFn sqnr = f.sqnr();
    int calls = 0;
    auto eval = [&](dbrq::nn::Module& m) -> double {
      // The fp32 reference is evaluated on rank 0 only; a trial is any later call.
      if (comm.rank() == throw_rank && (comm.rank() != 0 || ++calls > 1)) {
        throw std::runtime_error("labels of rank " + std::to_string(comm.rank()) + " are unreadable");
      }
      return sqnr(m);
    };
    dbrq::distributed::TuneStats st;
    const dbrq::AutotuneResult r =
        dbrq::distributed::autotune(comm, dbrq::fragile::make, f.calib, eval, criterion, budget, opt, &st);
    std::cout << "rank " << comm.rank() << " ok: " << r.trials.size() << " trials, best " << r.best_config.key()
              << ", " << st.evaluated << " evaluated in " << st.rounds << " rounds, " << st.discarded << " discarded"
              << std::endl;
    return 0;
  } catch (const std::exception& e) {
    const std::string line = std::string("tune_worker: error: ") + e.what() + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);  // one write: ranks share the pipe
    std::fflush(stderr);
    return 1;
  }
}
