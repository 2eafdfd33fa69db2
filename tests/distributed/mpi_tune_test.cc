// Distributed autotune under mpirun (issue 15): `mpirun -np N` of tune_worker (the fragile-layer
// model, whose search reaches the per-layer stage) and of `dbrq_mpi tune ... --distributed` (the
// digits model), each compared with the same search in one process.
//
// What fails if distributed tuning is wrong:
//  - the choice: best config, status and every logged trial (keys, stages, metrics, meets) must
//    equal one process's with the same budget, and the quant-state and mapping files must be
//    byte-identical (a speculative trial counted, logged or used; the best calibration taken from
//    another model than the evaluated one; a rank's metric misattributed: all break it);
//  - a rank whose evaluate throws makes every rank exit non-zero within 30 s naming that rank and
//    the cause, and no quant-state file (nor temporary) is left;
//  - bad flags are usage errors; a data file missing fails every rank at once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/cli/subprocess.h"
#include "tests/distributed/mpi_env.h"

namespace {

using ::testing::HasSubstr;
using dbrq::testing::RunResult;

using dbrq::testing::mpi_env;

struct Timed {
  RunResult r;
  double seconds = 0;
};

Timed mpirun(int np, const std::string& binary, const std::vector<std::string>& args) {
  std::vector<std::string> full = {"--allow-run-as-root", "--oversubscribe", "-np", std::to_string(np), binary};
  full.insert(full.end(), args.begin(), args.end());
  const auto t = std::chrono::steady_clock::now();
  Timed out;
  out.r = dbrq::testing::run_binary(DBRQ_MPIRUN, full, mpi_env());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  return out;
}

void expect_ok(const RunResult& r) {
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

bool temp_file_left(const std::string& out) {
  const std::filesystem::path p(out);
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path())) {
    if (e.path().filename().string().rfind(p.filename().string() + ".tmp", 0) == 0) return true;
  }
  return false;
}

// The trial log without its timing fields.
nlohmann::json log_without_timing(const std::string& path) {
  nlohmann::json doc = nlohmann::json::parse(dbrq::testing::read_file(path));
  for (nlohmann::json& t : doc.at("trials")) t.erase("latency_ms");
  return doc;
}

void expect_same_files(const std::string& ref, const std::string& out) {
  EXPECT_FALSE(temp_file_left(out + ".qstate.json"));
  EXPECT_EQ(dbrq::testing::read_file(out + ".qstate.json"), dbrq::testing::read_file(ref + ".qstate.json"));
  EXPECT_EQ(dbrq::testing::read_file(out + ".qstate.json.mapping.json"),
            dbrq::testing::read_file(ref + ".qstate.json.mapping.json"));
  const nlohmann::json a = log_without_timing(ref + ".log.json"), b = log_without_timing(out + ".log.json");
  EXPECT_EQ(a, b) << a.dump(1) << "\nvs\n" << b.dump(1);
}

// ---- the fragile-layer model, through dbrq::distributed::autotune ----

std::string worker() { return dbrq::testing::runfile("tests/distributed/tune_worker"); }

std::vector<std::string> worker_args(const std::string& base) {
  return {"--out=" + base + ".qstate.json", "--log=" + base + ".log.json"};
}

TEST(MpiTune, FragileModelFromTwoAndFourRanksMakesTheSingleProcessChoice) {
  const std::string ref = dbrq::testing::temp_path("fragile_single");
  std::vector<std::string> args = worker_args(ref);
  args.push_back("--single");
  expect_ok(dbrq::testing::run_binary(worker(), args, {{"OMP_NUM_THREADS", "1"}}));
  const nlohmann::json log = log_without_timing(ref + ".log.json");
  ASSERT_GT(log.at("trials").size(), 8u);  // the per-layer stage ran
  for (int np : {2, 4}) {
    SCOPED_TRACE(np);
    const std::string out = dbrq::testing::temp_path("fragile_np" + std::to_string(np));
    const Timed t = mpirun(np, worker(), worker_args(out));
    expect_ok(t.r);
    EXPECT_EQ(count(t.r.out, " ok: "), static_cast<size_t>(np)) << t.r.out;
    expect_same_files(ref, out);
  }
}

TEST(MpiTune, ARankWhoseEvaluateThrowsFailsEveryRankWithItsMessage) {
  for (int np : {2, 4}) {
    SCOPED_TRACE(np);
    const std::string out = dbrq::testing::temp_path("fragile_throw" + std::to_string(np));
    std::vector<std::string> args = worker_args(out);
    args.push_back("--throw_rank=1");
    args.push_back("--min_sqnr=1e9");  // never met: the search reaches rank 1's first trial
    const Timed t = mpirun(np, worker(), args);
    EXPECT_NE(t.r.exit_code, 0);
    EXPECT_LT(t.seconds, 30.0);
    EXPECT_EQ(count(t.r.err, "tune_worker: error: autotune failed on rank 1 of " + std::to_string(np) +
                                 ": autotune: trial 1 (act=MinMax w=per_channel bf16=[] fp32=[]) failed: "),
              static_cast<size_t>(np))
        << t.r.err;
    EXPECT_THAT(t.r.err, HasSubstr("labels of rank 1 are unreadable"));
    EXPECT_FALSE(dbrq::testing::file_exists(out + ".qstate.json"));
    EXPECT_FALSE(temp_file_left(out + ".qstate.json"));
    // The log holds what one process would have logged: trial 0, then the failed trial 1.
    const nlohmann::json log = nlohmann::json::parse(dbrq::testing::read_file(out + ".log.json"));
    ASSERT_EQ(log.at("trials").size(), 2u);
    EXPECT_TRUE(log.at("trials")[1].at("threw").get<bool>());
  }
}

// ---- the command line: `mpirun -np N dbrq_mpi tune ... --distributed` ----

std::string dbrq() { return dbrq::testing::runfile("tools/cli/dbrq"); }
std::string dbrq_mpi() { return dbrq::testing::runfile("tools/cli/dbrq_mpi"); }

std::vector<std::string> tune_args(const std::string& base, const std::string& data) {
  return {"tune",
          "--model=small_cnn",
          "--weights=" + dbrq::testing::runfile("samples/data/digits_small_cnn.safetensors"),
          "--calib=" + dbrq::testing::runfile("samples/data/digits_calib.safetensors"),
          "--data=" + data,
          "--metric=sqnr",
          "--min_sqnr=40",  // reached in the per-layer stage (docs/autotune.md)
          "--trials=16",
          "--progress=never",
          "--log=" + base + ".log.json",
          "--out=" + base + ".qstate.json"};
}

std::string digits_test() { return dbrq::testing::runfile("samples/data/digits_test.safetensors"); }

TEST(MpiTuneCli, DigitsFromTwoAndFourRanksMakesThePlainToolsChoice) {
  const std::string ref = dbrq::testing::temp_path("digits_single");
  const RunResult one = dbrq::testing::run_binary(dbrq(), tune_args(ref, digits_test()), {{"OMP_NUM_THREADS", "1"}});
  expect_ok(one);
  for (int np : {2, 4}) {
    SCOPED_TRACE(np);
    const std::string out = dbrq::testing::temp_path("digits_np" + std::to_string(np));
    std::vector<std::string> args = tune_args(out, digits_test());
    args.push_back("--distributed");
    const Timed t = mpirun(np, dbrq_mpi(), args);
    expect_ok(t.r);
    expect_same_files(ref, out);
    EXPECT_EQ(count(t.r.out, "status:    met"), 1u) << t.r.out;  // one report, rank 0's
    EXPECT_THAT(t.r.out, HasSubstr("ranks:     " + std::to_string(np) + ";"));
  }
}

TEST(MpiTuneCli, AMissingDataFileFailsEveryRankAtOnce) {
  const std::string out = dbrq::testing::temp_path("digits_missing");
  std::vector<std::string> args = tune_args(out, out + ".no_such_data.safetensors");
  args.push_back("--distributed");
  const Timed t = mpirun(2, dbrq_mpi(), args);
  EXPECT_NE(t.r.exit_code, 0);
  EXPECT_LT(t.seconds, 30.0);
  EXPECT_EQ(count(t.r.err, "dbrq tune: error: loading the model and data failed on rank 0 of 2: "), 2u) << t.r.err;
  EXPECT_THAT(t.r.err, HasSubstr("no_such_data.safetensors"));
  EXPECT_THAT(t.r.err, HasSubstr("[DistributedError]"));
  EXPECT_FALSE(dbrq::testing::file_exists(out + ".qstate.json"));
}

TEST(MpiTuneCli, BadFlags) {
  const std::string out = dbrq::testing::temp_path("digits_flags");
  std::vector<std::string> args = tune_args(out, digits_test());
  args.push_back("--distributed");
  RunResult r = dbrq::testing::run_binary(dbrq(), args);  // the plain tool
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("dbrq tune: --distributed needs the MPI build of dbrq"));
  args = tune_args(out, digits_test());
  args.push_back("--mpi_timeout=5");
  r = dbrq::testing::run_binary(dbrq_mpi(), args);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--mpi_timeout needs --distributed"));
  args = tune_args(out, digits_test());
  args.push_back("--distributed");
  args.push_back("--mpi_timeout=0");
  r = dbrq::testing::run_binary(dbrq_mpi(), args);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--mpi_timeout must be > 0 seconds"));
}

}  // namespace
