// dbrq::autotune: stops at the first config meeting the criterion (digits model, zero tolerable
// loss); on a model with one fragile layer it moves exactly that layer out of int8; every bad input
// (callback throwing, NaN metric, zero budget, impossible criterion, calibration missing a path)
// gives its status or typed error; a log resumes the search; the saved quant state reproduces the
// best model exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dbrq.h"
#include "samples/demo/pipeline.h"
#include "samples/zoo/zoo.h"
#include "tests/test_util.h"
#include "tests/tune/fragile_model.h"

namespace dbrq {
namespace {

using Batches = std::vector<std::vector<Tensor>>;

// ---- the digits model (samples/data) ----

struct Digits {
  const zoo::ModelSpec& spec = zoo::find_model("small_cnn");
  std::string weights = pipeline::find_workspace_file("samples/data/digits_small_cnn.safetensors", nullptr);
  pipeline::Dataset calib =
      pipeline::load_dataset(pipeline::find_workspace_file("samples/data/digits_calib.safetensors", nullptr));
  pipeline::Dataset test =
      pipeline::load_dataset(pipeline::find_workspace_file("samples/data/digits_test.safetensors", nullptr));

  ModelFactory factory() const {
    return [this] { return pipeline::build_model(spec, zoo::Variant::kFull, weights, 0); };
  }
  Batches calibration() const {
    Batches b;
    for (int64_t i = 0; i < calib.num_batches(64); ++i) b.push_back({calib.input_batch(i, 64)});
    return b;
  }
  EvaluateFn accuracy() const {
    return [this](nn::Module& m) {
      int64_t correct = 0;
      for (int64_t i = 0; i < test.num_batches(120); ++i) {
        const std::vector<float> logits = m.forward_tensors({test.input_batch(i, 120)})[0].contiguous().to_vector<float>();
        const int64_t n = static_cast<int64_t>(logits.size()) / 10;
        for (int64_t r = 0; r < n; ++r) {
          int64_t arg = 0;
          for (int64_t c = 1; c < 10; ++c) arg = logits[r * 10 + c] > logits[r * 10 + arg] ? c : arg;
          correct += arg == test.labels[static_cast<size_t>(i * 120 + r)];
        }
      }
      return double(correct) / double(test.size());
    };
  }
};

TEST(Autotune, DigitsWithZeroLossStopsAtTheFirstConfigMeetingIt) {
  Digits d;
  AutotuneOptions opt;
  opt.quant_state_path = testing::temp_file("digits.qstate.json");
  const AutotuneResult r =
      autotune(d.factory(), d.calibration(), d.accuracy(), TuneCriterion::relative_loss(0.0), TuneBudget{}, opt);
  SCOPED_TRACE(r.to_string());
  ASSERT_EQ(r.status, TuneStatus::kMet);
  ASSERT_FALSE(r.trials.empty());
  EXPECT_EQ(r.best_trial, static_cast<int>(r.trials.size()) - 1);
  for (size_t i = 0; i + 1 < r.trials.size(); ++i) {
    EXPECT_FALSE(r.trials[i].meets) << i;
    EXPECT_LT(r.trials[i].metric, r.fp32_metric) << i;
  }
  EXPECT_TRUE(r.trials.back().meets);
  EXPECT_GE(r.best_metric, r.fp32_metric);
  EXPECT_EQ(r.target, r.fp32_metric);
  EXPECT_GT(r.trials.back().latency_ms, 0.0);
  // The returned model is converted and scores what the trial scored.
  ASSERT_NE(r.best_model, nullptr);
  EXPECT_TRUE(is_converted(*r.best_model));
  EXPECT_EQ(d.accuracy()(*r.best_model), r.best_metric);

  // The saved quant state and mapping reproduce it exactly.
  auto again = d.factory()();
  const Batches calib = d.calibration();
  prepare(*again, calib[0], load_qconfig_mapping(opt.quant_state_path + ".mapping.json"));
  load_quant_state(*again, opt.quant_state_path);
  convert(*again);
  for (int64_t i = 0; i < d.test.num_batches(120); ++i) {
    const Tensor x = d.test.input_batch(i, 120);
    testing::expect_equal(again->forward_tensors({x})[0], r.best_model->forward_tensors({x})[0], "reloaded best");
  }
}

// ---- a model with one fragile layer (tests/tune/fragile_model.h) ----

using FragileSetup = fragile::Setup;
constexpr double kFragileTarget = fragile::kTarget;
std::shared_ptr<nn::Module> make_fragile() { return fragile::make(); }

TEST(Autotune, FragileLayerIsTheOneMovedOutOfInt8) {
  FragileSetup f;
  const AutotuneResult r = autotune(make_fragile, f.calib, f.sqnr(), TuneCriterion::at_least(kFragileTarget), TuneBudget{});
  SCOPED_TRACE(r.to_string());
  ASSERT_EQ(r.status, TuneStatus::kMet);
  EXPECT_TRUE(std::isinf(r.fp32_metric));
  // No observer / weight-scheme trial helps.
  ASSERT_GT(r.trials.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_LT(r.trials[i].metric, 10.0) << r.trials[i].config.key();
  ASSERT_FALSE(r.sensitivity.empty());
  EXPECT_EQ(r.sensitivity[0].first, "fc2");
  // Exactly fc2 leaves int8: in bf16 where the CPU has it (bf16 first), else fp32.
  if (bf16_supported()) {
    EXPECT_EQ(r.best_config.bf16_layers, std::vector<std::string>{"fc2"});
    EXPECT_TRUE(r.best_config.fp32_layers.empty());
  } else {
    EXPECT_TRUE(r.best_config.bf16_layers.empty());
    EXPECT_EQ(r.best_config.fp32_layers, std::vector<std::string>{"fc2"});
  }
  EXPECT_GE(r.best_metric, kFragileTarget);
  // Stage 3 started from the default observer (the others were no better beyond noise).
  EXPECT_EQ(r.best_config.activation, ObserverKind::kHistogram);
  // fc1 and fc3 still run int8.
  int int8_linears = 0;
  for (const QuantizedOpInfo& op : quantized_ops(*r.best_model)) int8_linears += op.kind == OpKind::kLinear;
  EXPECT_EQ(int8_linears, 2);
}

// lin0 makes [a, a/2]; fc computes a/2 - a/2, exactly 0 in fp32. In int8 the two codes round
// differently, so fc's output is pure noise: its op SQNR is -inf (zero signal). The ranking skipped
// non-finite SQNRs, so the one layer to blame was never tried and the search ended unmet.
struct Cancelling : nn::CallableModule<Cancelling> {
  Cancelling() {
    lin0 = register_module("lin0", std::make_shared<nn::LinearImpl>(1, 2, false));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(2, 1, false));
    float* w0 = lin0->weight.mutable_data<float>();
    w0[0] = 1.f;
    w0[1] = 0.5f;
    float* w1 = fc->weight.mutable_data<float>();
    w1[0] = 0.5f;
    w1[1] = -1.f;
  }
  Tensor forward(const Tensor& x) { return (*fc)((*lin0)(x)); }
  std::shared_ptr<nn::LinearImpl> lin0, fc;
};

TEST(Autotune, ALayerWithMinusInfiniteSqnrIsRankedFirst) {
  ModelFactory make = [] {
    auto m = std::make_shared<Cancelling>();
    m->eval();
    return std::static_pointer_cast<nn::Module>(m);
  };
  Batches calib;
  for (const Tensor& x : testing::random_batches(4, 41, {32, 1})) calib.push_back({x});
  const std::vector<Tensor> test = testing::random_batches(2, 42, {32, 1});
  // The largest |output| over the test inputs (fp32: exactly 0).
  EvaluateFn max_abs = [&](nn::Module& m) {
    double worst = 0;
    for (const Tensor& x : test)
      for (float v : m.forward_tensors({x})[0].contiguous().to_vector<float>()) worst = std::max(worst, double(std::fabs(v)));
    return worst;
  };
  const AutotuneResult r = autotune(make, calib, max_abs, TuneCriterion::at_most(1e-6), TuneBudget{});
  SCOPED_TRACE(r.to_string());
  ASSERT_FALSE(r.sensitivity.empty());
  EXPECT_EQ(r.sensitivity[0].first, "fc");
  EXPECT_TRUE(std::isinf(r.sensitivity[0].second) && r.sensitivity[0].second < 0) << r.sensitivity[0].second;
  ASSERT_EQ(r.status, TuneStatus::kMet);
  std::vector<std::string> moved = r.best_config.bf16_layers;
  moved.insert(moved.end(), r.best_config.fp32_layers.begin(), r.best_config.fp32_layers.end());
  EXPECT_NE(std::find(moved.begin(), moved.end(), "fc"), moved.end());
}

TEST(Autotune, ImpossibleCriterionReturnsTheBestFoundAfterTheWholeSpace) {
  FragileSetup f;
  const AutotuneResult r = autotune(make_fragile, f.calib, f.sqnr(), TuneCriterion::at_least(1e9), TuneBudget{});
  SCOPED_TRACE(r.to_string());
  EXPECT_EQ(r.status, TuneStatus::kNotMet);
  // 8 observer / weight configs, then each of the 3 layers to bf16 (when available) and fp32.
  EXPECT_EQ(r.trials.size(), 8u + 3u * (bf16_supported() ? 2u : 1u));
  ASSERT_GE(r.best_trial, 0);
  for (const TuneTrial& t : r.trials) EXPECT_LE(t.metric, r.best_metric);
  ASSERT_NE(r.best_model, nullptr);
  EXPECT_NEAR(f.sqnr()(*r.best_model), r.best_metric, 1e-9);
}

TEST(Autotune, TrialAndTimeBudgetsStopTheSearch) {
  FragileSetup f;
  const AutotuneResult r = autotune(make_fragile, f.calib, f.sqnr(), TuneCriterion::at_least(1e9), TuneBudget{3, 0});
  EXPECT_EQ(r.status, TuneStatus::kTrialBudget);
  EXPECT_EQ(r.trials.size(), 3u);
  EXPECT_GE(r.best_trial, 0);
  const AutotuneResult t =
      autotune(make_fragile, f.calib, f.sqnr(), TuneCriterion::at_least(1e9), TuneBudget{50, 1e-9});
  EXPECT_EQ(t.status, TuneStatus::kTimeBudget);
  EXPECT_TRUE(t.trials.empty());
  EXPECT_EQ(t.best_trial, -1);
  EXPECT_EQ(t.best_model, nullptr);
}

TEST(Autotune, NanMetricFailsTheTrialAndTheSearchGoesOn) {
  FragileSetup f;
  int calls = 0;
  const EvaluateFn sqnr = f.sqnr();
  auto eval = [&](nn::Module& m) { return ++calls == 2 ? NAN : sqnr(m); };  // call 1: fp32; 2: trial 0
  const AutotuneResult r = autotune(make_fragile, f.calib, eval, TuneCriterion::at_least(-1e9), TuneBudget{});
  ASSERT_EQ(r.trials.size(), 2u);
  EXPECT_TRUE(std::isnan(r.trials[0].metric));
  EXPECT_EQ(r.trials[0].error, "evaluate returned NaN");
  EXPECT_FALSE(r.trials[0].meets);
  EXPECT_TRUE(r.trials[1].meets);
  EXPECT_EQ(r.best_trial, 1);
}

TEST(Autotune, CallbackThrowingIsReportedWithTheTrialAndLogged) {
  FragileSetup f;
  const std::string log = testing::temp_file("throws.json");
  AutotuneOptions opt;
  opt.log_path = log;
  int calls = 0;
  const EvaluateFn sqnr = f.sqnr();
  auto eval = [&](nn::Module& m) -> double {
    if (++calls == 2) throw std::runtime_error("boom");
    return sqnr(m);
  };
  EXPECT_THROW_MSG(autotune(make_fragile, f.calib, eval, TuneCriterion::at_least(1e9), TuneBudget{}, opt), UsageError,
                   "autotune: evaluate threw on trial 0 (act=Histogram w=per_channel bf16=[] fp32=[]): boom");
  const nlohmann::json doc = nlohmann::json::parse(testing::read_text(log));
  ASSERT_EQ(doc.at("trials").size(), 1u);
  EXPECT_TRUE(doc.at("trials")[0].at("threw").get<bool>());
  // A dbrq::Error keeps its type.
  calls = 0;
  auto eval2 = [&](nn::Module& m) -> double {
    if (++calls == 2) DBRQ_THROW(ValueError, "bad labels");
    return sqnr(m);
  };
  EXPECT_THROW_MSG(autotune(make_fragile, f.calib, eval2, TuneCriterion::at_least(1e9), TuneBudget{}), ValueError,
                   "evaluate threw on trial 0 (act=Histogram w=per_channel bf16=[] fp32=[]): bad labels");
  // A factory throwing on the fp32 reference.
  auto bad_factory = []() -> std::shared_ptr<nn::Module> { throw std::runtime_error("no weights"); };
  EXPECT_THROW_MSG(autotune(bad_factory, f.calib, sqnr, TuneCriterion::at_least(1), TuneBudget{}), UsageError,
                   "the model factory threw building the fp32 reference: no weights");
  // A factory handing out the same (then prepared) model twice.
  auto shared = make_fragile();
  EXPECT_THROW_MSG(autotune([&] { return shared; }, f.calib, sqnr, TuneCriterion::at_least(1e9), TuneBudget{}),
                   ValueError, "returned a prepared model");
}

TEST(Autotune, BadArgumentsAreValueErrors) {
  FragileSetup f;
  const EvaluateFn sqnr = f.sqnr();
  EXPECT_THROW_MSG(autotune(make_fragile, f.calib, sqnr, TuneCriterion::at_least(1), TuneBudget{0, 0}), ValueError,
                   "the budget allows 0 trials; it must allow at least 1");
  EXPECT_THROW_MSG(autotune(make_fragile, f.calib, sqnr, TuneCriterion::at_least(1), TuneBudget{5, -1}), ValueError,
                   "max_seconds must be finite and >= 0");
  EXPECT_THROW_MSG(autotune(make_fragile, {}, sqnr, TuneCriterion::at_least(1), TuneBudget{}), ValueError,
                   "no calibration data");
  EXPECT_THROW_MSG(autotune(make_fragile, {{}}, sqnr, TuneCriterion::at_least(1), TuneBudget{}), ValueError,
                   "calibration call 0 has 0 tensors");
  EXPECT_THROW_MSG(autotune(nullptr, f.calib, sqnr, TuneCriterion::at_least(1), TuneBudget{}), ValueError,
                   "the model factory is empty");
  EXPECT_THROW_MSG(autotune(make_fragile, f.calib, nullptr, TuneCriterion::at_least(1), TuneBudget{}), ValueError,
                   "the evaluate callback is empty");
  // SQNR vs fp32 is +inf for the fp32 model: a relative loss of it means nothing.
  EXPECT_THROW_MSG(autotune(make_fragile, f.calib, sqnr, TuneCriterion::relative_loss(0.01), TuneBudget{}), ValueError,
                   "a relative loss needs a finite fp32 metric, but the fp32 model scores inf");
  EXPECT_THROW_MSG(autotune(make_fragile, f.calib, [](nn::Module&) { return double(NAN); },
                            TuneCriterion::at_least(1), TuneBudget{}),
                   ValueError, "evaluate returned NaN for the fp32 model");
  EXPECT_THROW_MSG(TuneCriterion::relative_loss(-0.1), ValueError, "finite fraction >= 0, got -0.1");
  EXPECT_THROW_MSG(TuneCriterion::at_least(NAN), ValueError, "the value is NaN");
}

TEST(Autotune, CriterionTargets) {
  EXPECT_DOUBLE_EQ(TuneCriterion::relative_loss(0.1).target(0.9), 0.81);
  EXPECT_DOUBLE_EQ(TuneCriterion::relative_loss(0.1, false).target(2.0), 2.2);
  EXPECT_DOUBLE_EQ(TuneCriterion::absolute_loss(0.02).target(0.9), 0.88);
  EXPECT_TRUE(TuneCriterion::absolute_loss(0.02).met(0.88, 0.9));
  EXPECT_FALSE(TuneCriterion::absolute_loss(0.02).met(0.87, 0.9));
  EXPECT_TRUE(TuneCriterion::at_most(0.5).met(0.4, 0.0));
  EXPECT_FALSE(TuneCriterion::at_most(0.5).met(NAN, 0.0));
}

// A branch on the data: calibration only ever takes one side.
struct Branchy : nn::CallableModule<Branchy> {
  Branchy() {
    a = register_module("a", std::make_shared<nn::LinearImpl>(8, 4));
    b = register_module("b", std::make_shared<nn::LinearImpl>(8, 4));
  }
  Tensor forward(const Tensor& x) { return mean(x).item<float>() > 0 ? (*a)(x) : (*b)(x); }
  std::shared_ptr<nn::LinearImpl> a, b;
};

TEST(Autotune, CalibrationMissingAPathIsAControlFlowError) {
  auto make = []() -> std::shared_ptr<nn::Module> {
    manual_seed(2);
    auto m = std::make_shared<Branchy>();
    m->eval();
    return m;
  };
  Batches calib;
  for (const Tensor& x : testing::random_batches(3, 4, {6, 8})) calib.push_back({relu(x) + 0.1});
  const Tensor negative = -(relu(randn({6, 8}, 9)) + 0.1);
  auto eval = [&](nn::Module& m) { return double(m.forward_tensors({negative})[0].contiguous().to_vector<float>()[0]); };
  EXPECT_THROW_MSG(autotune(make, calib, eval, TuneCriterion::at_least(1e9), TuneBudget{}), ControlFlowError,
                   "ran a path the calibration data never took");
}

TEST(Autotune, ResumesFromItsLog) {
  FragileSetup f;
  const std::string log = testing::temp_file("resume.json");
  AutotuneOptions opt;
  opt.log_path = log;
  const AutotuneResult first = autotune(make_fragile, f.calib, f.sqnr(), TuneCriterion::at_least(kFragileTarget), TuneBudget{3, 0}, opt);
  ASSERT_EQ(first.status, TuneStatus::kTrialBudget);
  ASSERT_EQ(first.trials.size(), 3u);
  int calls = 0;
  const EvaluateFn sqnr = f.sqnr();
  auto counting = [&](nn::Module& m) {
    ++calls;
    return sqnr(m);
  };
  int progress_calls = 0;
  opt.on_trial = [&](const TuneProgress& p) {
    ++progress_calls;
    EXPECT_EQ(p.trials_done, progress_calls);
    EXPECT_GE(p.trials_planned, p.trials_done);
    EXPECT_TRUE(std::isfinite(p.eta_seconds));
    ASSERT_NE(p.last, nullptr);
    EXPECT_FALSE(p.last->resumed);
  };
  const AutotuneResult second =
      autotune(make_fragile, f.calib, counting, TuneCriterion::at_least(kFragileTarget), TuneBudget{}, opt);
  SCOPED_TRACE(second.to_string());
  EXPECT_EQ(second.status, TuneStatus::kMet);
  ASSERT_GT(second.trials.size(), 3u);
  for (size_t i = 0; i < second.trials.size(); ++i) {
    EXPECT_EQ(second.trials[i].resumed, i < 3) << i;
    if (i < 3) {
      EXPECT_EQ(second.trials[i].config.key(), first.trials[i].config.key());
      EXPECT_EQ(second.trials[i].metric, first.trials[i].metric);
    }
  }
  // fp32 once, the new trials once each (the sensitivity ranking evaluates nothing).
  EXPECT_EQ(calls, 1 + static_cast<int>(second.trials.size()) - 3);
  EXPECT_EQ(progress_calls, static_cast<int>(second.trials.size()) - 3);
  const nlohmann::json doc = nlohmann::json::parse(testing::read_text(log));
  EXPECT_EQ(doc.at("trials").size(), second.trials.size());
  EXPECT_EQ(doc.at("format"), "dbrq.autotune_log");
  // A log of another model (another fp32 metric) is refused, and a broken one is a FileFormatError.
  auto accuracy_like = [](nn::Module&) { return 0.5; };
  EXPECT_THROW_MSG(autotune(make_fragile, f.calib, accuracy_like, TuneCriterion::at_least(1), TuneBudget{}, opt),
                   ValueError, "was written for an fp32 metric of inf but the fp32 model now scores 0.5");
  testing::write_text(log, "{\"format\": \"dbrq.autotune_log\", \"version\": 1}");
  EXPECT_THROW_MSG(autotune(make_fragile, f.calib, sqnr, TuneCriterion::at_least(1), TuneBudget{}, opt),
                   FileFormatError, "is malformed");
}

}  // namespace
}  // namespace dbrq
