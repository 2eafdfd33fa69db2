// Running a built binary from a test: the CLI and demo tests check exit codes and what a user
// sees on stdout and stderr.
//
//   dbrq::testing::RunResult r = dbrq::testing::run_binary(dbrq::testing::runfile("tools/cli/dbrq"),
//                                                          {"quantize", "--help"});
//   EXPECT_EQ(r.exit_code, 0);
//   EXPECT_THAT(r.out, HasSubstr("usage: dbrq quantize"));
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dbrq::testing {

struct RunResult {
  int exit_code = -1;  // 128 + signal number when killed by a signal
  std::string out, err;
  // stderr without blank lines, split into lines.
  std::vector<std::string> err_lines() const;
};

// A file of the test's runfiles ("tools/cli/dbrq", "samples/data/digits_test.safetensors").
std::string runfile(const std::string& workspace_relative_path);
// A fresh path under the test's temporary directory.
std::string temp_path(const std::string& name);

// Runs `binary args...` with stdin from /dev/null and extra environment variables, and waits.
RunResult run_binary(const std::string& binary, const std::vector<std::string>& args,
                     const std::vector<std::pair<std::string, std::string>>& env = {});

std::string read_file(const std::string& path);
bool file_exists(const std::string& path);

}  // namespace dbrq::testing
