// Distributed calibration under mpirun (issue 15), as a user runs it: the test starts
// `mpirun --allow-run-as-root --oversubscribe -np N mpi_worker ...` (root in a container needs the
// flag; --oversubscribe because this machine has fewer cores than ranks) and compares with the
// same worker run as one process.
//
// What fails if the distributed path is wrong:
//  - min/max: the state file from 2 and 4 ranks must be byte-identical to one process's (a lost
//    shard, a rank's range not merged, the example run counted once per rank, all break it), on
//    ResNet-18 (tiny) and on the digits CNN with its trained weights and data;
//  - every rank's converted model gives bit-identical outputs (rank 0's parameters broadcast);
//  - histogram: every activation range within 1% of the single process's;
//  - a rank whose model throws, or whose shard cannot be read, makes every rank exit non-zero
//    within 30 s with that rank's message, and no file (nor a temporary one) is written;
//  - a hung rank is caught by the timeout (no hang).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <string>
#include <vector>

#include "tests/cli/subprocess.h"
#include "tests/distributed/mpi_env.h"

namespace {

using ::testing::HasSubstr;
using dbrq::testing::RunResult;

std::string worker() { return dbrq::testing::runfile("tests/distributed/mpi_worker"); }
std::string digits_weights() { return dbrq::testing::runfile("samples/data/digits_small_cnn.safetensors"); }
std::string digits_calib() { return dbrq::testing::runfile("samples/data/digits_calib.safetensors"); }

using dbrq::testing::mpi_env;

struct Timed {
  RunResult r;
  double seconds = 0;
};

Timed mpirun(int np, std::vector<std::string> args) {
  std::vector<std::string> full = {"--allow-run-as-root", "--oversubscribe", "-np", std::to_string(np), worker()};
  full.insert(full.end(), args.begin(), args.end());
  const auto t = std::chrono::steady_clock::now();
  Timed out;
  out.r = dbrq::testing::run_binary(DBRQ_MPIRUN, full, mpi_env());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  return out;
}

RunResult single(std::vector<std::string> args) {
  args.push_back("--single");
  return dbrq::testing::run_binary(worker(), args, {{"OMP_NUM_THREADS", "1"}});
}

std::vector<std::string> resnet_args(const std::string& observer, const std::string& out) {
  return {"--model=resnet18", "--observer=" + observer, "--items=8", "--batch=2", "--out=" + out};
}

std::vector<std::string> digits_args(const std::string& observer, const std::string& out) {
  return {"--model=small_cnn", "--observer=" + observer, "--items=10", "--batch=16", "--digits=" + digits_calib(),
          "--weights=" + digits_weights(), "--out=" + out};
}

void expect_ok(const RunResult& r) {
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
}

// No OUT.tmp.<pid> left behind (the atomic write's temporary file).
bool temp_file_left(const std::string& out) {
  const std::filesystem::path p(out);
  for (const auto& e : std::filesystem::directory_iterator(p.parent_path())) {
    if (e.path().filename().string().rfind(p.filename().string() + ".tmp", 0) == 0) return true;
  }
  return false;
}

// Every rank's converted outputs are the same bytes (and, for min/max, the single process's).
void expect_same_outputs(const std::string& reference, const std::string& out, int np) {
  const std::string ref = dbrq::testing::read_file(reference);
  ASSERT_FALSE(ref.empty());
  for (int r = 0; r < np; ++r) {
    EXPECT_EQ(dbrq::testing::read_file(out + ".rank" + std::to_string(r) + ".bin"), ref) << "rank " << r;
  }
}

struct Range {
  double lo, hi;
};

// Each per-tensor u8 observer's representable range, by slot.
std::vector<std::pair<int, Range>> ranges(const std::string& path) {
  const nlohmann::json doc = nlohmann::json::parse(dbrq::testing::read_file(path));
  std::vector<std::pair<int, Range>> out;
  for (const auto& s : doc.at("observers")) {
    if (!s.contains("qparams") || s["qparams"].is_null()) continue;
    const auto& q = s["qparams"];
    if (q.at("scales").size() != 1 || s.at("observer").at("dtype") != "u8") continue;
    const double scale = q["scales"][0].get<double>();
    const double zp = q["zero_points"][0].get<double>();
    out.push_back({s.at("slot").get<int>(), Range{(0 - zp) * scale, (255 - zp) * scale}});
  }
  return out;
}


TEST(MpiCalibration, MinMaxResNet18FromFourRanksIsBitIdenticalToOneProcess) {
  const std::string ref = dbrq::testing::temp_path("resnet_single.json");
  const std::string out = dbrq::testing::temp_path("resnet_mpi4.json");
  expect_ok(single(resnet_args("minmax", ref)));
  expect_ok(mpirun(4, resnet_args("minmax", out)).r);
  EXPECT_FALSE(temp_file_left(out));
  EXPECT_EQ(dbrq::testing::read_file(out), dbrq::testing::read_file(ref));
  expect_same_outputs(ref + ".rank0.bin", out, 4);
}

TEST(MpiCalibration, MinMaxDigitsFromTwoThreeAndFourRanksIsBitIdenticalToOneProcess) {
  const std::string ref = dbrq::testing::temp_path("digits_single.json");
  expect_ok(single(digits_args("minmax", ref)));
  // 3 ranks: a tree with an odd rank out; gather: the flat reduction.
  for (const auto& [np, reduction] : std::vector<std::pair<int, std::string>>{{2, "tree"}, {3, "tree"}, {4, "tree"}, {4, "gather"}}) {
    SCOPED_TRACE(std::to_string(np) + " ranks, " + reduction);
    const std::string out = dbrq::testing::temp_path("digits_mpi" + std::to_string(np) + reduction + ".json");
    std::vector<std::string> args = digits_args("minmax", out);
    args.push_back("--reduction=" + reduction);
    expect_ok(mpirun(np, args).r);
    EXPECT_EQ(dbrq::testing::read_file(out), dbrq::testing::read_file(ref));
    expect_same_outputs(ref + ".rank0.bin", out, np);
  }
}

void expect_histogram_within_one_percent(const std::vector<std::string>& ref_args, const std::string& ref,
                                         const std::vector<std::string>& mpi_args, const std::string& out, int np,
                                         double tolerance = 0.01) {
  expect_ok(single(ref_args));
  expect_ok(mpirun(np, mpi_args).r);
  const auto a = ranges(ref), b = ranges(out);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    const double width = a[i].second.hi - a[i].second.lo;
    EXPECT_NEAR(b[i].second.lo, a[i].second.lo, tolerance * width) << "observer " << a[i].first;
    EXPECT_NEAR(b[i].second.hi, a[i].second.hi, tolerance * width) << "observer " << a[i].first;
  }
  // Every rank converts with rank 0's parameters.
  expect_same_outputs(out + ".rank0.bin", out, np);
}

TEST(MpiCalibration, HistogramResNet18FromFourRanksWithinOnePercentOfOneProcess) {
  const std::string ref = dbrq::testing::temp_path("resnet_hist_single.json");
  const std::string out = dbrq::testing::temp_path("resnet_hist_mpi4.json");
  expect_histogram_within_one_percent(resnet_args("histogram", ref), ref, resnet_args("histogram", out), out, 4);
}

TEST(MpiCalibration, HistogramDigitsFromTwoRanksWithinOnePercentOfOneProcess) {
  const std::string ref = dbrq::testing::temp_path("digits_hist_single.json");
  const std::string out = dbrq::testing::temp_path("digits_hist_mpi2.json");
  expect_histogram_within_one_percent(digits_args("histogram", ref), ref, digits_args("histogram", out), out, 2);
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

TEST(MpiCalibration, PercentileDigitsFromFourRanksWithinOnePercentOfOneProcess) {
  const std::string ref = dbrq::testing::temp_path("digits_pct_single.json");
  const std::string out = dbrq::testing::temp_path("digits_pct_mpi4.json");
  expect_histogram_within_one_percent(digits_args("percentile", ref), ref, digits_args("percentile", out), out, 4);
}

// Entropy (TensorRT's KL search, exact since the stop-19 fix) is not within 1%: its KL minimum is
// flat, so the merged histogram (the two ranks' histograms rebinned to one range) moves the chosen
// threshold by 4-8% of the range on the digits model (measured 25 Nov). The bound here is 10%;
// the 1% goal of issue 15 is open for entropy (docs/distributed.md).
TEST(MpiCalibration, EntropyDigitsFromTwoRanksWithinTenPercentOfOneProcess) {
  const std::string ref = dbrq::testing::temp_path("digits_ent_single.json");
  const std::string out = dbrq::testing::temp_path("digits_ent_mpi2.json");
  expect_histogram_within_one_percent(digits_args("entropy", ref), ref, digits_args("entropy", out), out, 2, 0.10);
}

// Even items take one branch, odd items the other: with 2 ranks each rank sees one branch only.
// Rank 0's merged state must hold both (else its convert would run rank 1's branch in fp32 and
// count it), rank 1 gets both through the broadcast, and the file equals one process's.
TEST(MpiCalibration, BranchesSeenOnDifferentRanksAreUnited) {
  const std::string ref = dbrq::testing::temp_path("if_else_single.json");
  const std::string out = dbrq::testing::temp_path("if_else_mpi2.json");
  auto args = [](const std::string& o) {
    return std::vector<std::string>{"--model=if_else", "--observer=minmax", "--items=6", "--batch=2", "--out=" + o};
  };
  expect_ok(single(args(ref)));
  expect_ok(mpirun(2, args(out)).r);
  EXPECT_EQ(dbrq::testing::read_file(ref + ".rank0.bin.uncalibrated"), "0");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(dbrq::testing::read_file(out + ".rank" + std::to_string(r) + ".bin.uncalibrated"), "0") << "rank " << r;
  }
  EXPECT_EQ(dbrq::testing::read_file(out), dbrq::testing::read_file(ref));
  expect_same_outputs(ref + ".rank0.bin", out, 2);
}

// Every rank printed one error naming `needle` (counted in the whole stream: ranks write to one
// pipe, so their lines may interleave); nothing was written.
void expect_every_rank_failed(const Timed& t, int np, const std::string& out, const std::string& needle) {
  EXPECT_NE(t.r.exit_code, 0);
  EXPECT_LT(t.seconds, 30.0);
  EXPECT_EQ(count(t.r.err, "mpi_worker: error: "), static_cast<size_t>(np)) << t.r.err;
  EXPECT_EQ(count(t.r.err, needle), static_cast<size_t>(np)) << t.r.err;
  EXPECT_FALSE(dbrq::testing::file_exists(out));
  EXPECT_FALSE(temp_file_left(out));
  for (int r = 0; r < np; ++r) EXPECT_FALSE(dbrq::testing::file_exists(out + ".rank" + std::to_string(r) + ".bin"));
}

TEST(MpiCalibration, ARankWhoseModelThrowsFailsEveryRankWithItsMessage) {
  const std::string out = dbrq::testing::temp_path("throws.json");
  std::vector<std::string> args = resnet_args("minmax", out);
  args.push_back("--fail_rank=2");
  args.push_back("--items=40");
  const Timed t = mpirun(4, args);
  expect_every_rank_failed(t, 4, out, "distributed calibration failed on rank 2 of 4: calibrate: ShapeError: ");
}

TEST(MpiCalibration, AReusedCommReportsARankFailingAgain) {
  // Two failed runs on one Comm: the second failure must notify the other ranks again. Before the
  // fix its notice was never sent (the "sent" flag stayed set), rank 0 waited for it until the
  // timeout and aborted the job.
  const std::string out = dbrq::testing::temp_path("reused.json");
  std::vector<std::string> args = resnet_args("minmax", out);
  args.push_back("--fail_rank=1");
  args.push_back("--repeat=2");
  args.push_back("--timeout=20");
  const Timed t = mpirun(2, args);
  EXPECT_EQ(t.r.exit_code, 1) << t.r.err;
  EXPECT_LT(t.seconds, 20.0);
  EXPECT_EQ(count(t.r.err, "mpi_worker: error: distributed calibration failed on rank 1 of 2: calibrate: ShapeError: "),
            4u)
      << t.r.err;
  EXPECT_THAT(t.r.err, ::testing::Not(HasSubstr("aborting the job")));
  EXPECT_FALSE(dbrq::testing::file_exists(out));
}

TEST(MpiCalibration, AnUnreadableShardFailsEveryRankWithItsMessage) {
  const std::string out = dbrq::testing::temp_path("missing.json");
  std::vector<std::string> args = resnet_args("minmax", out);
  args.push_back("--missing_rank=1");
  const Timed t = mpirun(2, args);
  expect_every_rank_failed(t, 2, out, "distributed calibration failed on rank 1 of 2: prepare: IOError: ");
}

TEST(MpiCalibration, RankZeroFailingToWriteFailsEveryRankAndLeavesNoFile) {
  const std::string dir = dbrq::testing::temp_path("no_such_dir");
  const std::string out = dir + "/state.json";
  const Timed t = mpirun(2, resnet_args("minmax", out));
  EXPECT_NE(t.r.exit_code, 0);
  EXPECT_EQ(count(t.r.err, "distributed calibration failed on rank 0 of 2: save: IOError: cannot open"), 2u) << t.r.err;
  EXPECT_FALSE(dbrq::testing::file_exists(dir));
}

TEST(MpiCalibration, ARankThatDiesEndsTheJobWithoutAFile) {
  const std::string out = dbrq::testing::temp_path("dies.json");
  std::vector<std::string> args = resnet_args("minmax", out);
  args.push_back("--die_rank=1");
  args.push_back("--timeout=20");
  const Timed t = mpirun(2, args);
  EXPECT_NE(t.r.exit_code, 0);
  EXPECT_LT(t.seconds, 30.0);
  EXPECT_FALSE(dbrq::testing::file_exists(out));
  EXPECT_FALSE(temp_file_left(out));
}

TEST(MpiCalibration, AHungRankIsCaughtByTheTimeout) {
  const std::string out = dbrq::testing::temp_path("hang.json");
  std::vector<std::string> args = resnet_args("minmax", out);
  args.push_back("--hang_rank=1");
  args.push_back("--timeout=5");
  const Timed t = mpirun(2, args);
  EXPECT_NE(t.r.exit_code, 0);
  EXPECT_LT(t.seconds, 30.0);
  EXPECT_THAT(t.r.err, HasSubstr("rank 0 of 2: calibration vote: no answer from every rank within 5 s"));
  EXPECT_FALSE(dbrq::testing::file_exists(out));
}

// ---- the command line tool: `mpirun -np N dbrq_mpi quantize ... --distributed` ----

namespace cli {

std::string dbrq() { return dbrq::testing::runfile("tools/cli/dbrq"); }
std::string dbrq_mpi() { return dbrq::testing::runfile("tools/cli/dbrq_mpi"); }

std::vector<std::string> quantize_args(const std::string& calib, const std::string& out) {
  return {"quantize", "--model=small_cnn", "--weights=" + digits_weights(), "--calib=" + calib,
          "--observer=minmax", "--batch_size=32", "--progress=never", "--out=" + out};
}

Timed mpirun_cli(int np, std::vector<std::string> args) {
  std::vector<std::string> full = {"--allow-run-as-root", "--oversubscribe", "-np", std::to_string(np), dbrq_mpi()};
  full.insert(full.end(), args.begin(), args.end());
  full.push_back("--distributed");
  const auto t = std::chrono::steady_clock::now();
  Timed out;
  out.r = dbrq::testing::run_binary(DBRQ_MPIRUN, full, mpi_env());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  return out;
}

TEST(MpiCli, DistributedQuantizeWritesTheSameFileAsThePlainTool) {
  const std::string ref = dbrq::testing::temp_path("cli_single.json");
  const std::string out = dbrq::testing::temp_path("cli_mpi4.json");
  expect_ok(dbrq::testing::run_binary(dbrq(), quantize_args(digits_calib(), ref), {{"OMP_NUM_THREADS", "1"}}));
  const Timed t = mpirun_cli(4, quantize_args(digits_calib(), out));
  expect_ok(t.r);
  EXPECT_EQ(dbrq::testing::read_file(out), dbrq::testing::read_file(ref));
  // One report (rank 0's), with the reduction's cost.
  EXPECT_EQ(count(t.r.out, "saved:"), 1u) << t.r.out;
  EXPECT_THAT(t.r.out, HasSubstr("reduction: "));
  EXPECT_THAT(t.r.out, HasSubstr("\"ranks\": 4"));
}

TEST(MpiCli, AMissingShardFileFailsEveryRankNamingIt) {
  // --calib with %r: one file per rank; rank 1's does not exist.
  const std::string shard0 = dbrq::testing::temp_path("shard_0.safetensors");
  {
    std::ofstream f(shard0, std::ios::binary);
    f << dbrq::testing::read_file(digits_calib());
  }
  const std::string pattern = shard0.substr(0, shard0.size() - std::string("0.safetensors").size()) + "%r.safetensors";
  const std::string out = dbrq::testing::temp_path("cli_missing.json");
  const Timed t = mpirun_cli(2, quantize_args(pattern, out));
  EXPECT_NE(t.r.exit_code, 0);
  EXPECT_LT(t.seconds, 30.0);
  EXPECT_EQ(count(t.r.err, "dbrq quantize: error: distributed calibration failed on rank 1 of 2: prepare: IOError: "
                           "--calib: "),
            2u)
      << t.r.err;
  EXPECT_THAT(t.r.err, HasSubstr("shard_1.safetensors"));
  EXPECT_THAT(t.r.err, HasSubstr("[DistributedError]"));
  EXPECT_FALSE(dbrq::testing::file_exists(out));
  EXPECT_FALSE(temp_file_left(out));
}

TEST(MpiCli, AnUnwritableOutFailsEveryRankAtOnceWithRankZerosMessage) {
  // Only rank 0 writes --out; its check runs inside the collective, so no rank waits for a timeout.
  const std::string out = "/nonexistent_dbrq_dir/out.json";
  const Timed t = mpirun_cli(2, quantize_args(digits_calib(), out));
  EXPECT_NE(t.r.exit_code, 0);
  EXPECT_LT(t.seconds, 30.0);
  EXPECT_EQ(count(t.r.err, "distributed calibration failed on rank 0 of 2: prepare: IOError: --out: cannot write "),
            2u)
      << t.r.err;
  EXPECT_FALSE(dbrq::testing::file_exists(out));
}

TEST(MpiCli, ThePlainToolRefusesDistributedAndSaysWhichBinaryToUse) {
  std::vector<std::string> args = quantize_args(digits_calib(), dbrq::testing::temp_path("plain.json"));
  args.push_back("--distributed");
  const RunResult r = dbrq::testing::run_binary(dbrq(), args);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("dbrq quantize: --distributed needs the MPI build of dbrq"));
  EXPECT_THAT(r.err, HasSubstr("//tools/cli:dbrq_mpi"));
}

TEST(MpiCli, MpiTimeoutWithoutDistributedIsAUsageError) {
  std::vector<std::string> args = quantize_args(digits_calib(), dbrq::testing::temp_path("plain2.json"));
  args.push_back("--mpi_timeout=5");
  const RunResult r = dbrq::testing::run_binary(dbrq_mpi(), args);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--mpi_timeout needs --distributed"));
}

}  // namespace cli

}  // namespace
