// Control flow without limits (issue 11): every branch, loop and early exit a C++ model can express
// runs int8. Each model here is calibrated on inputs that take all of its paths; after convert
// every calibrated path runs int8 (no op falls back to fp32) and matches the fp32 model to int8
// precision. A path never calibrated runs in fp32, correctly, is logged once and counted; with
// ConvertOptions::strict_paths it raises. The strict, one-sequence mode is tested in
// strict_control_flow_test.cc.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "dbrq.h"
#include "tests/quant/control_flow_models.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using namespace control_flow_models;  // NOLINT: the models under test
using testing::sqnr_of;
using testing::state_of;

// Calibrates, converts and checks every input against the fp32 reference: int8 throughout (no op
// of a calibrated path in fp32) and close to fp32.
template <typename M>
void calibrate_convert_check(M& model, const std::vector<Tensor>& inputs, const std::vector<Tensor>& refs,
                             double min_sqnr = 25.0) {
  for (const Tensor& x : inputs) model(x);
  convert(model);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor y = model(inputs[i]);
    EXPECT_EQ(y.dtype(), DType::kF32);
    EXPECT_GT(sqnr_of(y, refs[i]), min_sqnr) << "input " << i;
  }
  EXPECT_EQ(uncalibrated_ops(model), 0);
  for (const QuantizedOpInfo& op : quantized_ops(model)) {
    if (op.role != "fp32") EXPECT_EQ(op.executor.rfind("fp32", 0), std::string::npos) << op.fqn << ": " << op.executor;
  }
}

// ---- if / else on data ----------------------------------------------------------------------

TEST(ControlFlow, IfElseOnDataRunsBothBranchesInt8) {
  manual_seed(1);
  IfElse m;
  std::vector<Tensor> inputs;
  for (int i = 0; i < 8; ++i) inputs.push_back(signed_input({2, 3, 6, 6}, 10 + i, i % 2 == 0 ? 1.0 : -1.0));
  const auto refs = run_all(m, inputs);
  prepare(m, {inputs[0]});  // the trace takes branch a only
  AutoQuantizationState& s = state_of(m);
  EXPECT_EQ(s.seen_ops().size(), 3u);  // mean (fp32: its input is fp32), a, head
  calibrate_convert_check(m, inputs, refs);
  // Calibration added branch b: b+relu and the head reading b's output.
  std::vector<std::string> kinds;
  for (const SeenOpInfo& op : s.seen_ops()) kinds.push_back(op.fqn + ":" + op.display_kind());
  EXPECT_EQ(kinds, (std::vector<std::string>{":mean", "a:conv2d", "head:conv2d", "b:conv2d+relu", ":relu",
                                             "head:conv2d"}));
  const std::vector<PathInfo> paths = s.paths();
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_NE(quant_state_to_string(m).find("paths:"), std::string::npos) << quant_state_to_string(m);
  int64_t calls = 0;
  for (const PathInfo& p : paths) calls += p.calls;
  EXPECT_EQ(calls, 1 + 8 + 8);  // trace, calibration, the checks after convert
}

// ---- a three-way switch, nested in a child ---------------------------------------------------

TEST(ControlFlow, ThreeWaySwitchInAChild) {
  manual_seed(2);
  Parent m;
  // Inputs whose mean picks each case, four of each.
  std::vector<Tensor> inputs;
  for (int i = 0; i < 12; ++i) inputs.push_back(randn({1, 4, 5, 5}, 100 + i) * 0.3 + (i % 3 - 1) * 0.8);
  const auto refs = run_all(m, inputs);
  prepare(m, {inputs[0]});
  calibrate_convert_check(m, inputs, refs);
  EXPECT_EQ(state_of(*m.sw).paths().size(), 3u);
  EXPECT_EQ(state_of(m).paths().size(), 1u);  // the parent's own ops are the same on every call
}

// ---- a loop over the sequence length -----------------------------------------------------------

TEST(ControlFlow, LoopTracedAtThreeRunsAtAnyLength) {
  manual_seed(3);
  Rnn m;
  std::vector<Tensor> calib;
  for (int i = 0; i < 6; ++i) calib.push_back(randn({3 + i % 3, 8}, 200 + i));  // T = 3, 4, 5
  prepare(m, {randn({3, 8}, 1)});
  AutoQuantizationState& s = state_of(m);
  // The first iteration (h from zeros) and every later one (h from the tanh): two records per op
  // of the loop body, whatever T is.
  const size_t records = s.seen_ops().size();
  for (const Tensor& x : calib) m(x);
  EXPECT_EQ(s.seen_ops().size(), records);
  std::vector<Tensor> tests, refs;
  for (int64_t t : {1, 3, 7, 11}) tests.push_back(randn({t, 8}, 300 + t));
  for (const Tensor& x : tests) {
    disable_observers(m);
    refs.push_back(m(x));  // with observers off a prepared model computes fp32
    enable_observers(m);
  }
  convert(m);
  for (size_t i = 0; i < tests.size(); ++i) EXPECT_GT(sqnr_of(m(tests[i]), refs[i]), 25.0) << "T=" << tests[i].size(0);
  EXPECT_EQ(uncalibrated_ops(m), 0);
}

// The same loop inside a child module, called from a parent that runs it on a prefix of the
// sequence whose length depends on the data.
struct RnnParent : nn::CallableModule<RnnParent> {
  RnnParent() {
    rnn = register_module("rnn", std::make_shared<Rnn>());
    head = register_module("head", std::make_shared<Linear>(8, 3));
  }
  Tensor forward(const Tensor& x) {
    const int64_t t = 1 + static_cast<int64_t>(std::abs(x.at<float>({0, 0})) * 7) % x.size(0);
    return (*head)((*rnn)(x.narrow(0, 0, t)));
  }
  std::shared_ptr<Rnn> rnn;
  std::shared_ptr<Linear> head;
};

TEST(ControlFlow, LoopInAChildRunsAtAnyLength) {
  manual_seed(31);
  RnnParent m;
  std::vector<Tensor> calib, tests, refs;
  for (int i = 0; i < 8; ++i) calib.push_back(randn({6, 8}, 700 + i));
  for (int64_t t : {1, 2, 9, 13}) tests.push_back(randn({t, 8}, 800 + t));
  for (const Tensor& x : tests) refs.push_back(m(x));
  prepare(m, {calib[0]});
  calibrate_convert_check(m, calib, run_all(m, calib));
  for (size_t i = 0; i < tests.size(); ++i) EXPECT_GT(sqnr_of(m(tests[i]), refs[i]), 25.0) << "T=" << tests[i].size(0);
  EXPECT_EQ(uncalibrated_ops(m), 0);
  EXPECT_EQ(state_of(m).paths().size(), 1u);  // the parent's ops do not depend on T
}

// A tensor carried around a loop by one op (z = z + y, n times): the folded record reads the
// first iteration's output and its own. Its own output shares the input's parameters (one range
// for the carried tensor, no requantization per iteration); the first iteration's keeps its own.
struct Accumulate : nn::CallableModule<Accumulate> {
  Tensor forward(const Tensor& x, const Tensor& y) {
    Tensor z = x;
    const int n = 2 + static_cast<int>(std::abs(x.at<float>({0, 0})) * 4) % 5;
    for (int i = 0; i < n; ++i) z = z + y;
    return z;
  }
};

TEST(ControlFlow, ALoopCarriedTensorSharesItsParametersWithItsOwnInput) {
  Accumulate m;
  std::vector<std::pair<Tensor, Tensor>> inputs;
  for (uint64_t i = 0; i < 8; ++i) inputs.emplace_back(randn({2, 16}, 500 + i), randn({2, 16}, 600 + i) * 0.1);
  std::vector<Tensor> refs;
  for (auto& [x, y] : inputs) refs.push_back(m(x, y));
  prepare(m, {inputs[0].first, inputs[0].second});
  for (auto& [x, y] : inputs) m(x, y);
  const auto& ops = state_of(m).seen_ops();
  ASSERT_EQ(ops.size(), 2u);  // the first add and every later one
  ModelQuantState& q = model_quant_state(m);
  ASSERT_EQ(ops[1].inputs[0].num_origins(), 2u);
  ASSERT_GE(ops[1].input_observers[0], 0);
  ASSERT_GE(ops[1].output_observer, 0);
  EXPECT_EQ(q.find(ops[1].input_observers[0]), q.find(ops[1].output_observer));
  EXPECT_NE(q.find(ops[0].output_observer), q.find(ops[1].output_observer));
  convert(m);
  for (size_t i = 0; i < inputs.size(); ++i) EXPECT_GT(sqnr_of(m(inputs[i].first, inputs[i].second), refs[i]), 25.0) << i;
  EXPECT_EQ(uncalibrated_ops(m), 0);
}

// ---- pass-through chains keep their source ------------------------------------------------------

// A transformer's split_heads: the same view chain (reshape, permute) on two linears' outputs whose
// ranges differ 20x. Each permute is its own record with its own range (with one-level producer
// identity both permutes were one record with one range: 21.6 dB on the small path).
struct SplitHeads : nn::CallableModule<SplitHeads> {
  SplitHeads() {
    q = register_module("q", std::make_shared<Linear>(16, 16));
    k = register_module("k", std::make_shared<Linear>(16, 16));
    k->weight.mul_(20.0);
  }
  std::pair<Tensor, Tensor> forward(const Tensor& x) {
    const int64_t b = x.size(0);
    Tensor qh = (*q)(x).reshape({b, 2, 8}).permute({1, 0, 2});
    Tensor kh = (*k)(x).reshape({b, 2, 8}).permute({1, 0, 2});
    return {relu(qh), relu(kh)};
  }
  std::shared_ptr<Linear> q, k;
};

TEST(PassThroughIdentity, SplitHeadsOfTwoLinearsKeepTheirOwnRanges) {
  manual_seed(7);
  SplitHeads m;
  std::vector<Tensor> xs;
  for (uint64_t i = 0; i < 6; ++i) xs.push_back(randn({4, 16}, 700 + i));
  std::vector<std::pair<Tensor, Tensor>> refs;
  for (const Tensor& x : xs) refs.push_back(m(x));
  prepare(m, {xs[0]});
  for (const Tensor& x : xs) m(x);
  int permutes = 0;
  for (const SeenOpInfo& op : state_of(m).seen_ops()) permutes += op.kind == OpKind::kPermute;
  EXPECT_EQ(permutes, 2);
  convert(m);
  for (size_t i = 0; i < xs.size(); ++i) {
    const auto y = m(xs[i]);
    EXPECT_GT(sqnr_of(y.first, refs[i].first), 30.0) << "q heads, input " << i;
    EXPECT_GT(sqnr_of(y.second, refs[i].second), 30.0) << "k heads, input " << i;
  }
  EXPECT_EQ(uncalibrated_ops(m), 0);
}

// A loop that peels the first row off a tensor each step (a chain of narrows on a loop-carried
// view) folds: the records do not grow with the number of steps, and after convert a longer loop
// than any calibrated runs with no uncalibrated op.
struct Peel : nn::CallableModule<Peel> {
  Peel() { fc = register_module("fc", std::make_shared<Linear>(8, 8)); }
  Tensor forward(const Tensor& x) {
    Tensor rest = (*fc)(x);
    Tensor acc = relu(rest.narrow(0, 0, 1));
    while (rest.size(0) > 1) {
      rest = rest.narrow(0, 1, rest.size(0) - 1);
      acc = acc + relu(rest.narrow(0, 0, 1));
    }
    return acc;
  }
  std::shared_ptr<Linear> fc;
};

TEST(PassThroughIdentity, ALoopOverAPeeledViewFolds) {
  manual_seed(8);
  Peel m;
  const Tensor x = randn({10, 8}, 820);  // longer than any loop of the first calibration calls
  const Tensor ref = m(x);
  prepare(m, {randn({3, 8}, 800)});
  for (uint64_t i = 0; i < 4; ++i) m(randn({3 + static_cast<int64_t>(i), 8}, 801 + i));
  const size_t records = state_of(m).seen_ops().size();
  for (uint64_t i = 0; i < 4; ++i) m(randn({8 + static_cast<int64_t>(i), 8}, 810 + i));
  EXPECT_EQ(state_of(m).seen_ops().size(), records) << "a longer loop added records";
  convert(m);
  EXPECT_GT(sqnr_of(m(x), ref), 25.0);
  EXPECT_EQ(uncalibrated_ops(m), 0);
}

// ---- two loops sharing one layer, an early exit, a module called N times -----------------------

TEST(ControlFlow, TwoLoopsSharingALayerEarlyExitAndAModuleCalledNTimes) {
  manual_seed(4);
  Loops m;
  std::vector<Tensor> inputs;
  for (int i = 0; i < 10; ++i) inputs.push_back(randn({1, 4, 5, 5}, 400 + i) * (0.5 + 0.3 * i));
  const auto refs = run_all(m, inputs);
  prepare(m, {inputs[0]});
  calibrate_convert_check(m, inputs, refs, 20.0);
  // The block's records do not depend on how often or from where it is called: its first call
  // (input from the root's relu) and later ones (input from its own add) differ only there.
  AutoQuantizationState& block = state_of(*m.block);
  EXPECT_EQ(block.paths().size(), 1u);
  for (const SeenOpInfo& op : block.seen_ops()) EXPECT_LE(op.inputs[0].num_origins(), 2u) << op.display_kind();
}

// ---- a branch first seen on the second calibration call; one never calibrated -----------------

TEST(ControlFlow, BranchFirstSeenWhileCalibrating) {
  manual_seed(5);
  IfElse m;
  const Tensor pos = signed_input({2, 3, 6, 6}, 1, 1.0);
  prepare(m, {pos});
  m(signed_input({2, 3, 6, 6}, 2, 1.0));
  const size_t before = state_of(m).seen_ops().size();
  m(signed_input({2, 3, 6, 6}, 3, -1.0));  // records branch b; its observers start with the next call
  EXPECT_GT(state_of(m).seen_ops().size(), before);
  std::vector<Tensor> inputs, refs;
  for (int i = 0; i < 6; ++i) inputs.push_back(signed_input({2, 3, 6, 6}, 20 + i, i % 2 ? 1.0 : -1.0));
  for (const Tensor& x : inputs) {
    disable_observers(m);
    refs.push_back(m(x));
    enable_observers(m);
  }
  calibrate_convert_check(m, inputs, refs);
}

// A call that adds a path makes analysis run again over every record: the observers keep what
// they saw (carried over by the record and input they belong to), and the slot table is the one
// a fresh analysis of the same records gives.
TEST(ControlFlow, ObserversKeepTheirDataWhenAPathIsAdded) {
  manual_seed(7);
  IfElse m;
  prepare(m, {signed_input({2, 3, 6, 6}, 1, 1.0)});
  for (uint64_t i = 0; i < 3; ++i) m(signed_input({2, 3, 6, 6}, 2 + i, 1.0));
  ModelQuantState& q = model_quant_state(m);
  // The observer of a conv's input (x for a and b) or output (head's).
  auto observer_of = [&](const std::string& fqn, bool output) -> Observer& {
    for (const SeenOpInfo& op : state_of(m).seen_ops()) {
      if (op.kind == OpKind::kConv2d && op.fqn == fqn) return q.observer(output ? op.output_observer : op.input_observers[0]);
    }
    throw std::runtime_error("no conv " + fqn);
  };
  EXPECT_EQ(observer_of("a", false).num_batches(), 3);
  const float x_lo = observer_of("a", false).min_val(), head_lo = observer_of("head", true).min_val();
  m(signed_input({2, 3, 6, 6}, 9, -1.0));  // records branch b: analysis again
  EXPECT_EQ(observer_of("a", false).num_batches(), 3);
  EXPECT_EQ(observer_of("a", false).min_val(), x_lo);
  EXPECT_EQ(&observer_of("b", false), &observer_of("a", false));  // x has one observer
  EXPECT_EQ(observer_of("head", true).min_val(), head_lo);  // the first head record's (after a)
  m(signed_input({2, 3, 6, 6}, 10, -1.0));
  EXPECT_EQ(observer_of("a", false).num_batches(), 4);  // x, observed at b this time
  // Every slot belongs to a record's input or output, once.
  std::set<std::pair<int, int>> keys;
  for (size_t i = 0; i < q.num_slots(); ++i) {
    const ObserverSlot& e = q.slot_entry(static_cast<int>(i));
    EXPECT_GE(e.record, 0);
    EXPECT_TRUE(keys.insert({e.record, e.input}).second) << e.record << "," << e.input;
  }
}

TEST(ControlFlow, APathOnlySeenOnTheLastCalibrationCallHasNoData) {
  manual_seed(6);
  IfElse m;
  prepare(m, {signed_input({2, 3, 6, 6}, 1, 1.0)});
  m(signed_input({2, 3, 6, 6}, 2, 1.0));
  m(signed_input({2, 3, 6, 6}, 3, -1.0));  // branch b recorded, never observed
  EXPECT_THROW_MSG(convert(m), NotCalibratedError, "used by conv2d (b) in module \"\"");
  EXPECT_FALSE(is_converted(m));
  m(signed_input({2, 3, 6, 6}, 4, -1.0));  // observed now
  convert(m);
  EXPECT_TRUE(is_converted(m));
}

// Counts dbrq's warnings containing a text.
class WarningCounter {
 public:
  WarningCounter() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) { log()->sinks().push_back(sink_); }
  ~WarningCounter() {
    auto& sinks = log()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  int count(const std::string& text) const {
    const std::string s = out_.str();
    int n = 0;
    for (size_t p = s.find(text); p != std::string::npos; p = s.find(text, p + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

TEST(ControlFlow, UncalibratedPathRunsFp32LogsOnceAndIsCounted) {
  manual_seed(7);
  IfElse ref_model;
  manual_seed(7);
  IfElse m;
  prepare(m, {signed_input({2, 3, 6, 6}, 1, 1.0)});
  for (int i = 0; i < 4; ++i) m(signed_input({2, 3, 6, 6}, 10 + i, 1.0));  // branch a only
  convert(m);
  WarningCounter warnings;
  for (int i = 0; i < 3; ++i) {
    const Tensor x = signed_input({2, 3, 6, 6}, 30 + i, -1.0);  // branch b: never calibrated
    const Tensor y = m(x);
    EXPECT_EQ(y.dtype(), DType::kF32);
    testing::expect_close(y, ref_model(x), 1e-5, "uncalibrated path");
  }
  // b, its relu and the head reading b's output ran fp32, three times; one warning per op kind.
  EXPECT_EQ(uncalibrated_ops(m), 9);
  EXPECT_EQ(warnings.count("uncalibrated path after convert: module \"\" (IfElse), conv2d (b)"), 1);
  EXPECT_EQ(warnings.count("uncalibrated path after convert"), 2);  // conv2d, relu
  // The calibrated branch still runs int8.
  EXPECT_GT(sqnr_of(m(signed_input({2, 3, 6, 6}, 40, 1.0)), ref_model(signed_input({2, 3, 6, 6}, 40, 1.0))), 25.0);
}

TEST(ControlFlow, StrictPathsRaiseOnAnUncalibratedPath) {
  manual_seed(8);
  IfElse m;
  prepare(m, {signed_input({2, 3, 6, 6}, 1, 1.0)});
  for (int i = 0; i < 4; ++i) m(signed_input({2, 3, 6, 6}, 10 + i, 1.0));
  ConvertOptions o;
  o.strict_paths = true;
  convert(m, o);
  EXPECT_THROW_MSG(m(signed_input({2, 3, 6, 6}, 30, -1.0)), ControlFlowError,
                   "uncalibrated path after convert: module \"\" (IfElse), conv2d (b) was never run while calibrating");
  // The model is still usable on its calibrated path.
  EXPECT_EQ(m(signed_input({2, 3, 6, 6}, 31, 1.0)).dtype(), DType::kF32);
}

// ---- several threads on different paths ---------------------------------------------------------

TEST(ControlFlow, ThreadsOnDifferentPathsMatchOneThread) {
  manual_seed(9);
  IfElse m;
  std::vector<Tensor> inputs;
  for (int i = 0; i < 8; ++i) inputs.push_back(signed_input({1, 3, 6, 6}, 50 + i, i % 2 ? 1.0 : -1.0));
  prepare(m, {inputs[0]});
  for (const Tensor& x : inputs) m(x);
  convert(m);
  const auto expected = run_all(m, inputs);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 4; ++rep) {
        for (size_t i = 0; i < inputs.size(); ++i) {
          const size_t k = (i + static_cast<size_t>(t)) % inputs.size();
          if (m(inputs[k]).to_vector<float>() != expected[k].to_vector<float>()) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(uncalibrated_ops(m), 0);
}

// compare_numerics probes only its own thread's calls: other threads serving the model meanwhile
// change nothing in the report, and race with nothing (TSan).
TEST(ControlFlow, CompareNumericsWhileOtherThreadsServeTheModel) {
  manual_seed(10);
  IfElse ref;
  manual_seed(10);
  IfElse q;
  std::vector<Tensor> xs;
  for (int i = 0; i < 6; ++i) xs.push_back(signed_input({1, 3, 6, 6}, 60 + i, i % 2 ? 1.0 : -1.0));
  prepare(q, {xs[0]});
  for (const Tensor& x : xs) q(x);
  convert(q);
  std::vector<std::vector<Tensor>> inputs;
  for (const Tensor& x : xs) inputs.push_back({x});
  const NumericReport alone = compare_numerics(ref, q, inputs);
  std::atomic<bool> stop{false};
  std::vector<std::thread> servers;
  for (int t = 0; t < 2; ++t) {
    servers.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); !stop.load(); ++i) q(xs[i % xs.size()]);
    });
  }
  const NumericReport busy = compare_numerics(ref, q, inputs);
  stop = true;
  for (std::thread& th : servers) th.join();
  EXPECT_EQ(busy.to_csv(), alone.to_csv());
  ASSERT_EQ(busy.paths.size(), 2u);
  ASSERT_EQ(alone.paths.size(), 2u);
  for (size_t i = 0; i < busy.paths.size(); ++i) EXPECT_EQ(busy.paths[i].calls, alone.paths[i].calls);
  EXPECT_EQ(busy.output_sqnr_db, alone.output_sqnr_db);
  EXPECT_EQ(busy.diverged_calls, 0);
}

}  // namespace
}  // namespace dbrq
