// Deploying a calibration: save_quant_state after calibrating, then in a fresh model (same
// architecture, same weights, prepared again) load_quant_state and convert with no data at all.
// The converted outputs must be bit-identical to converting right after calibration. Every kind
// of mismatch (another model, another qconfig, another file version, an edited op) is a
// StateMismatchError naming the first mismatching module and op; malformed files are a
// FileFormatError, never a crash, and a failed load leaves the model as it was.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/zoo.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::expect_equal;
using testing::read_text;
using testing::temp_file;
using testing::write_text;

// Replaces the first occurrence of `from` (which must be there) in a file's text.
std::string edited(const std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "\"" << from << "\" is not in the document";
  if (at == std::string::npos) return text;
  return text.substr(0, at) + to + text.substr(at + from.size());
}

// One zoo model, built twice from the same fp32 weights: `a` is calibrated and saved, `fresh()`
// builds the deployment copy.
struct Case {
  std::string model;
  zoo::Variant variant = zoo::Variant::kTiny;
  int64_t batch = 2;
};

class Deployment {
 public:
  explicit Deployment(const Case& c) : c_(c), spec_(zoo::find_model(c.model)) {
    a_ = spec_.make(c.variant);
    a_->eval();
    // Deep copies: the model's own tensors may change (convert folds batch norm into the convs).
    for (const auto& [name, t] : a_->state_dict()) weights_[name] = t.clone();
  }

  const zoo::ModelSpec& spec() const { return spec_; }
  nn::Module& calibrated() { return *a_; }
  Tensor input(uint64_t seed) const { return spec_.example_input(c_.variant, c_.batch, seed); }

  std::shared_ptr<nn::Module> fresh() const {
    auto m = spec_.make(c_.variant);
    m->load_state_dict(weights_);
    m->eval();
    return m;
  }

  void prepare(nn::Module& m, const QConfigMapping& mapping = default_qconfig_mapping("onednn")) const {
    dbrq::prepare(m, {input(100)}, mapping);
  }

  void calibrate(nn::Module& m, uint64_t first_seed, int batches) const {
    for (int i = 0; i < batches; ++i) spec_.run(m, input(first_seed + static_cast<uint64_t>(i)));
  }

  // Outputs of a converted model on a fixed set of inputs (including another batch size).
  std::vector<Tensor> outputs(nn::Module& m) const {
    std::vector<Tensor> out;
    for (uint64_t seed : {200u, 201u}) out.push_back(spec_.run(m, input(seed)));
    out.push_back(spec_.run(m, spec_.example_input(c_.variant, c_.batch + 1, 202)));
    return out;
  }

 private:
  Case c_;
  const zoo::ModelSpec& spec_;
  std::shared_ptr<nn::Module> a_;
  std::map<std::string, Tensor> weights_;
};

class RoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(RoundTrip, LoadedCalibrationConvertsBitIdentically) {
  Deployment d(GetParam());
  nn::Module& a = d.calibrated();
  d.prepare(a);
  d.calibrate(a, 1, 3);
  const std::string path = temp_file(GetParam().model + ".qstate.json");
  save_quant_state(a, path);
  convert(a);
  const std::vector<Tensor> expected = d.outputs(a);

  auto b = d.fresh();
  d.prepare(*b);
  load_quant_state(*b, path);
  convert(*b);
  const std::vector<Tensor> actual = d.outputs(*b);
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) expect_equal(actual[i], expected[i], "output " + std::to_string(i));
}

INSTANTIATE_TEST_SUITE_P(Zoo, RoundTrip,
                         ::testing::Values(Case{"small_cnn"}, Case{"resnet18"}, Case{"mobilenet_v2"},
                                           Case{"bert_encoder"}, Case{"gru_classifier"}, Case{"vit"}),
                         [](const auto& info) { return info.param.model; });

// Fixture over the small CNN for the error cases.
class StateFile : public ::testing::Test {
 protected:
  StateFile() : d_(Case{"small_cnn"}) {}

  // Calibrates the reference model and saves its state; returns the path.
  std::string saved(const std::string& name, const SaveQuantStateOptions& options = {}) {
    nn::Module& a = d_.calibrated();
    if (!is_prepared(a)) {
      d_.prepare(a);
      d_.calibrate(a, 1, 3);
    }
    const std::string path = temp_file(name);
    save_quant_state(a, path, options);
    return path;
  }

  std::shared_ptr<nn::Module> prepared_fresh(const QConfigMapping& mapping = default_qconfig_mapping("onednn")) {
    auto b = d_.fresh();
    d_.prepare(*b, mapping);
    return b;
  }

  // Loading `text` into a fresh prepared model must throw `E` with every substring in `parts`.
  template <typename E>
  void expect_load_error(const std::string& text, const std::vector<std::string>& parts,
                         const QConfigMapping& mapping = default_qconfig_mapping("onednn")) {
    const std::string path = temp_file("edited.qstate.json");
    write_text(path, text);
    auto b = prepared_fresh(mapping);
    try {
      load_quant_state(*b, path);
      ADD_FAILURE() << "loading did not throw";
    } catch (const E& e) {
      EXPECT_THAT(e.what(), HasSubstr("quant state \"" + path + "\""));  // names the file
      for (const std::string& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "unexpected exception: " << e.what();
    }
  }

  Deployment d_;
};

TEST_F(StateFile, DocumentHoldsWhatDeploymentNeeds) {
  const std::string text = read_text(saved("doc.qstate.json"));
  for (const char* part : {"\"format\": \"dbrq.quant_state\"", "\"version\": 3", "\"model_type\": \"SmallCnn\"",
                           "\"backend\": \"onednn\"", "\"seen_ops\"", "\"non_quant_ops\"", "\"observers\"",
                           "\"qparams\"", "\"scales\"", "\"zero_points\"", "\"fusion\"", "\"qconfig\"",
                           "\"conv1\"", "\"pattern\"", "\"observer\"", "\"kind\": \"Histogram\""}) {
    EXPECT_NE(text.find(part), std::string::npos) << part;
  }
  EXPECT_EQ(text.find("\"stats\""), std::string::npos);
  EXPECT_NE(read_text(saved("stats.qstate.json", SaveQuantStateOptions{true})).find("\"stats\""), std::string::npos);
}

TEST_F(StateFile, ObserverStatisticsLetCalibrationResume) {
  // One pass over batches 1..4 ...
  auto whole = prepared_fresh();
  d_.calibrate(*whole, 1, 4);
  convert(*whole);
  // ... equals batches 1..2, saved with statistics, loaded elsewhere and continued with 3..4.
  auto first = prepared_fresh();
  d_.calibrate(*first, 1, 2);
  const std::string path = temp_file("resume.qstate.json");
  save_quant_state(*first, path, SaveQuantStateOptions{true});
  auto resumed = prepared_fresh();
  load_quant_state(*resumed, path);
  d_.calibrate(*resumed, 3, 2);
  convert(*resumed);
  const std::vector<Tensor> expected = d_.outputs(*whole), actual = d_.outputs(*resumed);
  for (size_t i = 0; i < actual.size(); ++i) expect_equal(actual[i], expected[i], "output " + std::to_string(i));
}

TEST_F(StateFile, HistogramCountsBeyondFloatPrecisionRoundTripExactly) {
  // A long calibration puts more than 2^24 values in one bin; float would round such counts.
  auto a = prepared_fresh();
  d_.calibrate(*a, 1, 1);
  ModelQuantState& m = model_quant_state(*a);
  Observer& obs = *m.slot(0).observer;
  Observer::Stats st = obs.stats();
  bool found = false;
  for (auto& [name, values] : st.fields) {
    if (name == "histogram") {
      values[values.size() / 2] = 16777217.0;  // 2^24 + 1: not a float
      found = true;
    }
  }
  ASSERT_TRUE(found) << "slot 0 is not a histogram observer";
  obs.load_stats(st);
  const std::string path = temp_file("big_counts.qstate.json");
  save_quant_state(*a, path, SaveQuantStateOptions{true});
  auto b = prepared_fresh();
  load_quant_state(*b, path);
  const Observer::Stats back = model_quant_state(*b).slot(0).observer->stats();
  ASSERT_EQ(back.fields.size(), st.fields.size());
  for (size_t i = 0; i < st.fields.size(); ++i) {
    EXPECT_EQ(back.fields[i].first, st.fields[i].first);
    EXPECT_EQ(back.fields[i].second, st.fields[i].second) << st.fields[i].first;
  }
}

TEST_F(StateFile, ParametersOnlyFileFreezesTheCalibration) {
  // Without statistics the file carries final parameters: further calls may not move them.
  const std::string path = saved("frozen.qstate.json");
  auto b = prepared_fresh();
  load_quant_state(*b, path);
  convert(*b);
  auto c = prepared_fresh();
  load_quant_state(*c, path);
  d_.calibrate(*c, 50, 2);  // data with other ranges would change a live observer
  convert(*c);
  const std::vector<Tensor> expected = d_.outputs(*b), actual = d_.outputs(*c);
  for (size_t i = 0; i < actual.size(); ++i) expect_equal(actual[i], expected[i], "output " + std::to_string(i));
}

TEST_F(StateFile, AnotherModelIsAMismatch) {
  Deployment other(Case{"resnet18"});
  auto r = other.fresh();
  other.prepare(*r);
  try {
    load_quant_state(*r, saved("cnn.qstate.json"));
    FAIL() << "no error";
  } catch (const StateMismatchError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("does not match this model"), HasSubstr("made for model SmallCnn"),
                                HasSubstr("this is ResNet18")));
  }
}

TEST_F(StateFile, EditedRecordsAreCaughtByTheirCheck) {
  // Each record carries a check of its content: any edit (here a layer's weights: conv1 told to
  // use conv2's, and to drop its bias) is a corrupt file, named by module and op.
  const std::string text = read_text(saved("cnn.qstate.json"));
  // (The record's weight list, not the calibrated values' key "conv1.weight": ...)
  expect_load_error<FileFormatError>(edited(text, "\"conv1.weight\",", "\"conv2.weight\","),
                                     {"module \"\" op 0 fails its check", "the record was edited or is corrupt"});
  nlohmann::json no_bias = nlohmann::json::parse(text);
  no_bias["modules"][0]["seen_ops"][0]["weights"] = {"conv1.weight"};
  expect_load_error<FileFormatError>(no_bias.dump(1), {"module \"\" op 0 fails its check"});
  // An origin moved to another op.
  expect_load_error<FileFormatError>(edited(text, "\"op\": 0", "\"op\": 1"), {"fails its check"});
}

TEST_F(StateFile, ResealedEditsAreCaughtByTheTag) {
  // A deliberate edit with the checks recomputed (reseal_quant_state) still cannot change what a
  // record is: its tag is a function of its kind, layer, parameters, scalar and weights. (A model
  // whose code changed is a StateMismatchError; see control_flow_state_test.)
  const std::string text = read_text(saved("cnn.qstate.json"));
  const std::string changed = reseal_quant_state(edited(text, "\"kind\": \"relu\"", "\"kind\": \"hardswish\""));
  expect_load_error<FileFormatError>(changed, {"module \"\" op 2 (hardswish relu1) has tag",
                                               "the record was edited or is corrupt"});
  // conv1's first stride value: 1 -> 2.
  std::string strided = text;
  const size_t stride = strided.find('1', strided.find("\"stride\""));
  ASSERT_NE(stride, std::string::npos);
  strided[stride] = '2';
  expect_load_error<FileFormatError>(reseal_quant_state(strided),
                                     {"module \"\" op 0 (conv2d conv1) has tag", "edited or is corrupt"});
  // The unedited document resealed loads.
  auto b = prepared_fresh();
  const std::string path = temp_file("resealed.qstate.json");
  write_text(path, reseal_quant_state(text));
  load_quant_state(*b, path);
  EXPECT_THROW_MSG(reseal_quant_state("{]"), FileFormatError, "reseal_quant_state: not valid JSON");
  EXPECT_THROW_MSG(reseal_quant_state("[1]"), FileFormatError, "reseal_quant_state: not a quant-state document");
}

TEST_F(StateFile, AnotherQConfigIsAMismatch) {
  QConfigMapping minmax = default_qconfig_mapping("onednn");
  minmax.set_global(QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max()));
  expect_load_error<StateMismatchError>(read_text(saved("cnn.qstate.json")),
                                        {"does not match this model", "module \"\" op 0", "qconfig"}, minmax);
}

TEST_F(StateFile, AModuleKeptInFp32IsAMismatch) {
  QConfigMapping mapping = default_qconfig_mapping("onednn");
  mapping.set_module_name("conv2", nullptr);
  expect_load_error<StateMismatchError>(read_text(saved("cnn.qstate.json")), {"module \"\" op", "conv2"}, mapping);
}

TEST_F(StateFile, AnotherFileVersionIsAMismatch) {
  const std::string changed = edited(read_text(saved("cnn.qstate.json")), "\"version\": 3", "\"version\": 7");
  expect_load_error<StateMismatchError>(changed, {"file version 7", "this dbrq reads version 3"});
  const std::string old = edited(read_text(saved("cnn.qstate.json")), "\"version\": 3", "\"version\": 1");
  expect_load_error<StateMismatchError>(old, {"file version 1, this dbrq reads version 3 (calibrate again"});
  // Format 2 identified pass-through ops' outputs by their own tag (docs/control_flow.md).
  const std::string v2 = edited(read_text(saved("cnn.qstate.json")), "\"version\": 3", "\"version\": 2");
  expect_load_error<StateMismatchError>(v2, {"file version 2, this dbrq reads version 3 (calibrate again"});
}

TEST_F(StateFile, AnotherBackendIsAMismatch) {
  const std::string changed = edited(read_text(saved("cnn.qstate.json")), "\"backend\": \"onednn\"",
                                     "\"backend\": \"qnnpack\"");
  expect_load_error<StateMismatchError>(changed, {"made for backend qnnpack"});
}

TEST_F(StateFile, MalformedDocumentsAreFileFormatErrors) {
  const std::string text = read_text(saved("cnn.qstate.json"));
  struct Row {
    std::string what, text, message;
  };
  const std::vector<Row> rows = {
      {"empty", "", "is not valid JSON"},
      {"not JSON", "hello", "is not valid JSON"},
      {"truncated", text.substr(0, text.size() / 2), "is not valid JSON"},
      {"array", "[1, 2, 3]", "is not a dbrq quant-state document"},
      {"other format", edited(text, "dbrq.quant_state", "something.else"), "is not a dbrq quant-state document"},
      {"version as string", edited(text, "\"version\": 3", "\"version\": \"1\""), "is malformed"},
      {"no modules", edited(text, "\"modules\"", "\"moduls\""), "is malformed"},
      {"modules not an array", edited(text, "\"modules\": [", "\"modules\": {\"x\": ["), "is not valid JSON"},
      {"scales as string", edited(text, "\"scales\": [", "\"scales\": \"x\", \"was\": ["), "is malformed"},
      {"negative scale", edited(text, "\"scales\": [", "\"scales\": [-1.0], \"was\": ["), "scale"},
      {"zero scale", edited(text, "\"scales\": [", "\"scales\": [0.0], \"was\": ["), "scale"},
      {"u8 zero point out of range", edited(text, "\"zero_points\": [", "\"zero_points\": [300], \"was\": ["),
       "has zero point 300, outside u8's range [0, 255]"},
      {"two scales for one zero point", edited(text, "\"scales\": [", "\"scales\": [0.5, 0.5], \"was\": ["),
       "per-tensor parameters need exactly one scale and zero point, got 2 and 1"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    expect_load_error<FileFormatError>(row.text, {row.message});
  }
}

TEST_F(StateFile, FailedLoadLeavesTheModelUnchanged) {
  const std::string path = saved("good.qstate.json");
  const std::string text = read_text(path);
  // Valid up to the last observer, whose parameters are broken: nothing may have been applied.
  const std::string key = "\"scales\": [";
  const size_t last = text.rfind(key);
  ASSERT_NE(last, std::string::npos);
  const std::string broken = text.substr(0, last) + "\"scales\": \"broken\", \"was\": [" + text.substr(last + key.size());
  const std::string bad = temp_file("broken.qstate.json");
  write_text(bad, broken);
  auto b = prepared_fresh();
  EXPECT_THROW(load_quant_state(*b, bad), FileFormatError);
  EXPECT_THROW(convert(*b), NotCalibratedError);  // nothing was half-loaded
  load_quant_state(*b, path);                      // and the model still takes a good file
  convert(*b);
  nn::Module& a = d_.calibrated();
  convert(a);
  const std::vector<Tensor> expected = d_.outputs(a), actual = d_.outputs(*b);
  for (size_t i = 0; i < actual.size(); ++i) expect_equal(actual[i], expected[i], "output " + std::to_string(i));
}

TEST_F(StateFile, UsageErrors) {
  const std::string path = saved("cnn.qstate.json");
  auto unprepared = d_.fresh();
  EXPECT_THROW(
      {
        try {
          load_quant_state(*unprepared, path);
        } catch (const UsageError& e) {
          EXPECT_THAT(e.what(), HasSubstr("load_quant_state"));
          throw;
        }
      },
      UsageError);
  EXPECT_THROW(save_quant_state(*unprepared, temp_file("x.json")), UsageError);

  auto b = prepared_fresh();
  try {
    load_quant_state(*b, temp_file("does_not_exist.json"));
    FAIL() << "no error";
  } catch (const IOError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("cannot open"), HasSubstr("does_not_exist.json")));
  }
  try {
    save_quant_state(d_.calibrated(), "/nonexistent-dir/x.qstate.json");
    FAIL() << "no error";
  } catch (const IOError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent-dir/x.qstate.json"));
  }
  load_quant_state(*b, path);
  convert(*b);
  try {
    load_quant_state(*b, path);
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("already converted"));
  }
}

TEST_F(StateFile, CheckQuantStateValidatesWithoutLoading) {
  const std::string text = read_text(saved("cnn.qstate.json"));
  auto b = prepared_fresh();
  ModelQuantState& m = model_quant_state(*b);
  check_quant_state(m, b->type_name(), text);
  EXPECT_THROW(convert(*b), NotCalibratedError);  // checking loaded nothing
  EXPECT_THROW(check_quant_state(m, "ResNet18", text), StateMismatchError);
  EXPECT_THROW(check_quant_state(m, b->type_name(), "{"), FileFormatError);
}

}  // namespace
}  // namespace dbrq
