// Replays the fuzzers' committed inputs through the same entry points the libFuzzer binaries call
// (tools/fuzz/fuzz_targets.h), built by Bazel with gcc and, under --config=asan, with ASan + UBSan:
//
//   - every seed of tools/fuzz/corpus/{safetensors,quant_state}: it must not crash, and each seed
//     must do what it was made for (valid ones load, malformed ones raise the dbrq error type and
//     message they were written to provoke);
//   - every input under tests/reliability/data/fuzz/ (findings of tools/fuzz/run.sh, named
//     <target>-<what>.<ext>): it must not crash, and the table below says what it does now.
//
// A crash here is a crash of the fuzz target: the target aborts on a broken invariant and lets
// anything but a dbrq::Error escape (which fails the test through GoogleTest).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"
#include "tools/fuzz/fuzz_targets.h"

namespace dbrq {
namespace {

namespace fs = std::filesystem;

constexpr char kSafetensorsSeeds[] = "tools/fuzz/corpus/safetensors";
constexpr char kQuantStateSeeds[] = "tools/fuzz/corpus/quant_state";
constexpr char kFindings[] = "tests/reliability/data/fuzz";

std::vector<fs::path> files_in(const std::string& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file()) out.push_back(e.path());  // follows the runfiles symlinks
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const uint8_t* data_of(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// ---- seeds -----------------------------------------------------------------------------------

TEST(FuzzCorpus, SeedCorporaArePresentAndSmall) {
  uint64_t total = 0;
  for (const char* dir : {kSafetensorsSeeds, kQuantStateSeeds}) {
    const std::vector<fs::path> files = files_in(dir);
    EXPECT_GE(files.size(), 8u) << dir;
    for (const fs::path& p : files) total += fs::file_size(p);
  }
  // Large seeds raise libFuzzer's default -max_len and slow every execution down.
  EXPECT_LT(total, 300u * 1024) << "the committed seed corpora should stay small";
}

// What each safetensors seed must do through parse_safetensors: "" = parses, else the message.
const std::map<std::string, std::string>& safetensors_expectations() {
  static const std::map<std::string, std::string> m = {
      {"every_dtype.safetensors", ""},
      {"f16.safetensors", ""},
      {"tiny_net.safetensors", ""},
      {"tiny_net_metadata.safetensors", ""},
      {"bad_dtype.safetensors", "entry \"a\" has unsupported dtype \"F64\""},
      {"bad_header_length.safetensors", "header length 9223372036854775807 exceeds the limit of"},
      {"bad_json.safetensors", "header is not valid JSON"},
      {"bad_overlap.safetensors", "entries \"a\" and \"b\" overlap"},
      {"bad_shape.safetensors", "entry \"a\" has a shape entry that is not a non-negative integer"},
      {"bad_truncated.safetensors", "(file truncated?)"},
  };
  return m;
}

TEST(FuzzCorpus, SafetensorsSeedsDoWhatTheyWereMadeFor) {
  const std::vector<fs::path> files = files_in(kSafetensorsSeeds);
  ASSERT_EQ(files.size(), safetensors_expectations().size());
  for (const fs::path& p : files) {
    SCOPED_TRACE(p.string());
    const auto it = safetensors_expectations().find(p.filename().string());
    ASSERT_NE(it, safetensors_expectations().end()) << "a seed without an expectation: add it to this table";
    const std::string bytes = read_bytes(p);
    fuzz::run_safetensors_input(data_of(bytes), bytes.size());
    if (it->second.empty()) {
      const NamedTensors t = parse_safetensors(bytes, p.filename().string());
      EXPECT_FALSE(t.empty());
    } else {
      EXPECT_THROW_MSG(parse_safetensors(bytes, "\"seed\""), FileFormatError, it->second);
      EXPECT_THROW_MSG(parse_safetensors(bytes, "\"seed\""), FileFormatError, "safetensors \"seed\": ");
    }
  }
}

TEST(FuzzCorpus, ValidSafetensorsSeedsLoadIntoTheTargetModel) {
  auto model = fuzz::make_tiny_net();
  for (const char* name : {"tiny_net.safetensors", "tiny_net_metadata.safetensors"}) {
    SCOPED_TRACE(name);
    auto fresh = std::make_shared<fuzz::TinyNet>();
    fresh->load_state_dict(parse_safetensors(read_bytes(fs::path(kSafetensorsSeeds) / name)));  // strict
    fresh->eval();
    const Tensor x = fuzz::tiny_input(2, 7);
    testing::expect_equal((*fresh)(x), (*model)(x), name);
  }
}

struct QuantStateExpectation {
  int mapping = -1;             // accepted by a TinyNet prepared with tiny_mapping(mapping)
  std::string error_type;       // or rejected by every mapping with this error type
  std::string message;          // and a message containing this
};

const std::map<std::string, QuantStateExpectation>& quant_state_expectations() {
  static const std::map<std::string, QuantStateExpectation> m = {
      {"tiny_mapping0.json", {0, "", ""}},
      {"tiny_mapping1.json", {1, "", ""}},
      {"tiny_mapping1_stats.json", {1, "", ""}},
      {"tiny_mapping2.json", {2, "", ""}},
      {"tiny_mapping3.json", {3, "", ""}},
      {"tiny_mapping3_stats.json", {3, "", ""}},
      {"bad_format.json", {-1, "FileFormatError", "is not a dbrq quant-state document"}},
      {"bad_not_object.json", {-1, "FileFormatError", "is not a dbrq quant-state document"}},
      {"bad_truncated.json", {-1, "FileFormatError", "is not valid JSON"}},
      {"bad_version.json", {-1, "StateMismatchError", "file version 7, this dbrq reads version 3"}},
      {"bad_model_type.json", {-1, "StateMismatchError", "made for model ResNet18, this is TinyNet"}},
  };
  return m;
}

// The error check_quant_state raises against a TinyNet prepared with `mapping`, as (type, message);
// ("", "") when it accepts the document.
std::pair<std::string, std::string> check_against(int mapping, const std::string& text) {
  auto m = fuzz::prepared_tiny_net(mapping);
  try {
    check_quant_state(model_quant_state(*m), m->type_name(), text, "<seed>");
  } catch (const StateMismatchError& e) {
    return {"StateMismatchError", e.what()};
  } catch (const FileFormatError& e) {
    return {"FileFormatError", e.what()};
  } catch (const Error& e) {
    return {"Error", e.what()};
  }
  return {"", ""};
}

TEST(FuzzCorpus, QuantStateSeedsDoWhatTheyWereMadeFor) {
  const std::vector<fs::path> files = files_in(kQuantStateSeeds);
  ASSERT_EQ(files.size(), quant_state_expectations().size());
  for (const fs::path& p : files) {
    SCOPED_TRACE(p.string());
    const auto it = quant_state_expectations().find(p.filename().string());
    ASSERT_NE(it, quant_state_expectations().end()) << "a seed without an expectation: add it to this table";
    const std::string text = read_bytes(p);
    fuzz::run_quant_state_input(data_of(text), text.size());
    const QuantStateExpectation& want = it->second;
    for (int mapping = 0; mapping < fuzz::kNumMappings; ++mapping) {
      SCOPED_TRACE(mapping);
      const auto [type, message] = check_against(mapping, text);
      if (want.mapping >= 0) {
        if (mapping == want.mapping) {
          EXPECT_EQ(type, "") << message;
        }
        continue;
      }
      EXPECT_EQ(type, want.error_type) << message;
      EXPECT_NE(message.find(want.message), std::string::npos) << message;
      EXPECT_NE(message.find("quant state <seed>"), std::string::npos) << message;
    }
  }
}

TEST(FuzzCorpus, ValidQuantStateSeedsConvertAndRun) {
  for (const auto& [name, want] : quant_state_expectations()) {
    if (want.mapping < 0) continue;
    SCOPED_TRACE(name);
    auto m = fuzz::prepared_tiny_net(want.mapping);
    quant_state_from_json(model_quant_state(*m), m->type_name(), read_bytes(fs::path(kQuantStateSeeds) / name));
    convert(*m);
    const Tensor y = (*m)(fuzz::tiny_input(2, 3));
    EXPECT_EQ(y.shape_string(), "[2, 5]");
  }
}

// ---- findings --------------------------------------------------------------------------------

// What each committed finding does now (beyond not crashing when replayed through its target).
// Every file under data/fuzz must be listed here, with the fix it is the regression input for.
const std::map<std::string, std::function<void(const std::string&)>>& finding_checks() {
  static const std::map<std::string, std::function<void(const std::string&)>> m = {
      // The seed tiny_mapping0.json crashed the quant-state target on its first execution: a
      // document without statistics loads parameters only, so every observer of the loaded model
      // is empty; saving that model with include_observer_stats wrote each empty range as
      // [inf, -inf], which JSON stores as null, and the re-saved document was rejected ("type must
      // be number, but is null"). Fixed in quant_state_to_json: observers that saw nothing are
      // saved without statistics. (The file is that seed in format version 3.)
      {"quant_state-resave_unobserved_stats.json",
       [](const std::string& text) {
         auto m = fuzz::prepared_tiny_net(0);
         quant_state_from_json(model_quant_state(*m), m->type_name(), text, "<finding>");
         SaveQuantStateOptions with_stats;
         with_stats.include_observer_stats = true;
         const std::string saved = quant_state_to_json(model_quant_state(*m), m->type_name(), with_stats);
         auto fresh = fuzz::prepared_tiny_net(0);
         quant_state_from_json(model_quant_state(*fresh), fresh->type_name(), saved, "<re-saved>");
         convert(*m);
         convert(*fresh);
         const Tensor x = fuzz::tiny_input(2, 5);
         testing::expect_equal((*fresh)(x), (*m)(x), "re-saved vs loaded");
       }},
  };
  return m;
}

TEST(FuzzFindings, EveryFindingReplaysThroughItsTarget) {
  const std::vector<fs::path> files = files_in(kFindings);
  EXPECT_EQ(files.size(), finding_checks().size()) << "every finding needs an entry in finding_checks()";
  for (const fs::path& p : files) {
    const std::string name = p.filename().string();
    SCOPED_TRACE(name);
    const std::string bytes = read_bytes(p);
    if (name.rfind("safetensors-", 0) == 0) {
      fuzz::run_safetensors_input(data_of(bytes), bytes.size());
    } else if (name.rfind("quant_state-", 0) == 0) {
      fuzz::run_quant_state_input(data_of(bytes), bytes.size());
    } else {
      ADD_FAILURE() << "findings are named safetensors-<what> or quant_state-<what>";
      continue;
    }
    const auto it = finding_checks().find(name);
    if (it == finding_checks().end()) {
      ADD_FAILURE() << "no check for this finding in finding_checks()";
      continue;
    }
    it->second(bytes);
  }
}

}  // namespace
}  // namespace dbrq
