// `dbrq tune` as a user runs it: the digits model tuned with zero tolerable loss (status, trial
// table, the saved state and mapping that `dbrq eval` then uses), a rerun resuming from the log,
// and its usage errors and failures (exit codes 2 and 1, one line on stderr).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/cli/subprocess.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using dbrq::testing::RunResult;

const std::string& cli() {
  static const std::string path = dbrq::testing::runfile("tools/cli/dbrq");
  return path;
}
std::string data(const std::string& name) { return dbrq::testing::runfile("samples/data/" + name); }

RunResult run(const std::vector<std::string>& args) { return dbrq::testing::run_binary(cli(), args); }

std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.exit_code) + "\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

std::vector<std::string> tune_args(const std::string& out, const std::string& log) {
  return {"tune",
          "--model=small_cnn",
          "--weights=" + data("digits_small_cnn.safetensors"),
          "--calib=" + data("digits_calib.safetensors"),
          "--data=" + data("digits_test.safetensors"),
          "--max_loss=0",
          "--progress=always",
          "--log=" + log,
          "--out=" + out};
}

TEST(TuneCli, DigitsZeroLossThenEvalWithTheTunedStateThenResume) {
  const std::string out = dbrq::testing::temp_path("tuned.qstate.json");
  const std::string log = dbrq::testing::temp_path("tune_log.json");
  const RunResult r = run(tune_args(out, log));
  SCOPED_TRACE(describe(r));
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("status:    met\n"));
  EXPECT_THAT(r.out, HasSubstr("<- meets"));
  EXPECT_THAT(r.out, HasSubstr("act=Histogram w=per_channel"));
  // The progress bar (not a terminal: plain lines at 25% steps, then the final one).
  EXPECT_THAT(r.err, HasSubstr("tuning: "));
  EXPECT_THAT(r.err, HasSubstr(" trials ("));
  EXPECT_THAT(r.err, HasSubstr("took"));
  EXPECT_TRUE(dbrq::testing::file_exists(out));
  EXPECT_TRUE(dbrq::testing::file_exists(out + ".mapping.json"));
  EXPECT_THAT(dbrq::testing::read_file(log), HasSubstr("\"format\": \"dbrq.autotune_log\""));

  const RunResult e = run({"eval", "--model=small_cnn", "--weights=" + data("digits_small_cnn.safetensors"),
                           "--state=" + out, "--data=" + data("digits_test.safetensors"), "--progress=never"});
  SCOPED_TRACE(describe(e));
  ASSERT_EQ(e.exit_code, 0);
  EXPECT_THAT(e.out, HasSubstr(".mapping.json"));
  EXPECT_THAT(e.out, HasSubstr("top-1 accuracy"));

  const RunResult again = run(tune_args(out, log));
  SCOPED_TRACE(describe(again));
  ASSERT_EQ(again.exit_code, 0);
  EXPECT_THAT(again.out, HasSubstr("(resumed)"));
  EXPECT_THAT(again.out, HasSubstr("status:    met\n"));
}

TEST(TuneCli, UsageErrorsAndFailures) {
  const std::string out = dbrq::testing::temp_path("bad.qstate.json");
  for (const auto& [flag, reason] : std::vector<std::pair<std::string, std::string>>{
           {"--trials=0", "--trials must be >= 1"},
           {"--metric=f1", "invalid --metric \"f1\"; expected accuracy or sqnr"},
           {"--loss=percent", "invalid --loss \"percent\""},
           {"--max_loss=-1", "--max_loss must be a finite number >= 0"},
           {"--time_limit=-5", "--time_limit must be >= 0"}}) {
    std::vector<std::string> args = tune_args(out, dbrq::testing::temp_path("l.json"));
    args.push_back(flag);
    const RunResult r = run(args);
    SCOPED_TRACE(flag + "\n" + describe(r));
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_THAT(r.err, HasSubstr(reason));
    EXPECT_EQ(r.out, "");
  }
  std::vector<std::string> missing = tune_args(out, dbrq::testing::temp_path("l2.json"));
  missing[3] = "--calib=/nonexistent/calib.safetensors";
  const RunResult m = run(missing);
  SCOPED_TRACE(describe(m));
  EXPECT_EQ(m.exit_code, 1);
  EXPECT_THAT(m.err, HasSubstr("dbrq tune: error: --calib: "));
  EXPECT_THAT(m.err, HasSubstr("[IOError]"));
  EXPECT_THAT(m.err, Not(HasSubstr("terminate called")));

  const RunResult h = run({"tune", "--help"});
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_THAT(h.out, HasSubstr("usage: dbrq tune"));
  EXPECT_THAT(h.out, HasSubstr("--max_loss"));
}

TEST(TuneCli, BaseMappingFlag) {
  // transformer: the search starts from transformer_qconfig_mapping (adds fp32), and the saved
  // mapping keeps that.
  const std::string out = dbrq::testing::temp_path("base.qstate.json");
  const std::string log = dbrq::testing::temp_path("base_log.json");
  std::vector<std::string> args = tune_args(out, log);
  args.push_back("--base_mapping=transformer");
  const RunResult r = run(args);
  SCOPED_TRACE(describe(r));
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("base:      transformer\n"));
  EXPECT_THAT(r.out, HasSubstr("status:    met\n"));
  const std::string saved = dbrq::testing::read_file(out + ".mapping.json");
  EXPECT_THAT(saved, HasSubstr("\"op\": \"add\",\n   \"qconfig\": null"));
  // A mapping file: the one just saved.
  const std::string out2 = dbrq::testing::temp_path("base2.qstate.json");
  std::vector<std::string> from_file = tune_args(out2, dbrq::testing::temp_path("base2_log.json"));
  from_file.push_back("--base_mapping=" + out + ".mapping.json");
  const RunResult f = run(from_file);
  SCOPED_TRACE(describe(f));
  ASSERT_EQ(f.exit_code, 0);
  EXPECT_THAT(f.out, HasSubstr("status:    met\n"));
  EXPECT_EQ(dbrq::testing::read_file(out2 + ".mapping.json"), saved);
  // Bad values: a usage error (exit 2), a missing file (exit 1, IOError), a file that is no mapping.
  std::vector<std::string> bad = tune_args(out2, dbrq::testing::temp_path("bad_log.json"));
  bad.push_back("--base_mapping=smoothquant");
  const RunResult b = run(bad);
  SCOPED_TRACE(describe(b));
  EXPECT_EQ(b.exit_code, 2);
  EXPECT_THAT(b.err, HasSubstr("invalid --base_mapping \"smoothquant\"; expected default, transformer or a qconfig "
                               "mapping JSON file"));
  bad.back() = "--base_mapping=/nonexistent/mapping.json";
  const RunResult m = run(bad);
  SCOPED_TRACE(describe(m));
  EXPECT_EQ(m.exit_code, 1);
  EXPECT_THAT(m.err, HasSubstr("dbrq tune: error: --base_mapping: "));
  EXPECT_THAT(m.err, HasSubstr("[IOError]"));
  bad.back() = "--base_mapping=" + log;  // a trial log, not a mapping
  const RunResult w = run(bad);
  SCOPED_TRACE(describe(w));
  EXPECT_EQ(w.exit_code, 1);
  EXPECT_THAT(w.err, HasSubstr("is not a dbrq qconfig mapping"));
  EXPECT_THAT(w.err, HasSubstr("[FileFormatError]"));
}

}  // namespace
