// Control flow and saved calibration (issue 11): a quant-state file holds every path calibration
// took, so a deployment copy whose example run takes a single path still converts every path to
// int8, bit-identically to the calibrated model. Files round-trip text-identically, list their
// paths with call counts, and are refused when they lack a path the model takes or were written
// for other model code. merge_calibration unites replicas that saw different paths.
// compare_numerics reports every path with its calls and SQNR, ops in loops over every iteration,
// and calls where the int8 model took another branch than the fp32 one.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dbrq.h"
#include "tests/quant/control_flow_models.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using json = nlohmann::json;
using namespace control_flow_models;  // NOLINT: the models under test
using testing::read_text;
using testing::state_of;
using testing::temp_file;

// Min/max activations: merged replicas give exactly the observers of one process.
QConfigMapping min_max_mapping() {
  return QConfigMapping().set_global(QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max()));
}

// A model type with its inputs: `all` takes every path, `one` takes a single path (the
// deployment copy's example).
template <typename M>
struct Scenario {
  std::function<std::shared_ptr<M>()> make;  // the same fp32 weights every time
  std::vector<Tensor> all;
  Tensor one;
  bool one_takes_fewer = true;  // `one` records fewer ops than `all`
};

template <typename M>
void expect_bit_identical(M& a, M& b, const std::vector<Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) testing::expect_equal(b(inputs[i]), a(inputs[i]));
}

// Calibrates a copy on every path and saves it; a fresh copy prepared on one path loads the file
// and converts; both run every input bit-identically and int8 throughout. Saving the loaded copy
// gives the same text.
template <typename M>
void round_trip(const Scenario<M>& sc, const std::string& name, const QConfigMapping& mapping, bool with_stats) {
  SCOPED_TRACE(name);
  auto a = sc.make();
  prepare(*a, {sc.all[0]}, mapping);
  for (const Tensor& x : sc.all) (*a)(x);
  SaveQuantStateOptions opts;
  opts.include_observer_stats = with_stats;
  const std::string path = temp_file(name + ".qstate.json");
  save_quant_state(*a, path, opts);
  const std::string text = read_text(path);

  auto b = sc.make();
  prepare(*b, {sc.one}, mapping);
  const size_t traced = model_quant_state(*b).records().size();
  load_quant_state(*b, path);
  if (sc.one_takes_fewer) EXPECT_GT(model_quant_state(*b).records().size(), traced) << "the file's paths were not loaded";
  EXPECT_EQ(quant_state_to_json(model_quant_state(*b), b->type_name(), opts), text);

  convert(*a);
  convert(*b);
  expect_bit_identical(*a, *b, sc.all);
  EXPECT_EQ(uncalibrated_ops(*b), 0);
  EXPECT_EQ(uncalibrated_ops(*a), 0);
}

Scenario<IfElse> if_else() {
  Scenario<IfElse> sc;
  sc.make = [] {
    manual_seed(11);
    return std::make_shared<IfElse>();
  };
  for (int i = 0; i < 6; ++i) sc.all.push_back(signed_input({2, 3, 6, 6}, 10 + i, i % 2 == 0 ? 1.0 : -1.0));
  sc.one = signed_input({2, 3, 6, 6}, 99, -1.0);  // branch b, where calibration traced a first
  return sc;
}

Scenario<Parent> switch3() {
  Scenario<Parent> sc;
  sc.make = [] {
    manual_seed(12);
    return std::make_shared<Parent>();
  };
  for (int i = 0; i < 9; ++i) sc.all.push_back(randn({1, 4, 5, 5}, 100 + i) * 0.3 + (i % 3 - 1) * 0.8);
  sc.one = randn({1, 4, 5, 5}, 98) * 0.3 + 0.8;
  return sc;
}

Scenario<Rnn> rnn() {
  Scenario<Rnn> sc;
  sc.make = [] {
    manual_seed(13);
    return std::make_shared<Rnn>();
  };
  for (int64_t t : {3, 1, 5, 8, 2}) sc.all.push_back(randn({t, 8}, 200 + t));
  sc.one = randn({1, 8}, 97);  // T = 1: the loop body's later iterations never ran
  return sc;
}

Scenario<Loops> loops() {
  Scenario<Loops> sc;
  sc.make = [] {
    manual_seed(14);
    return std::make_shared<Loops>();
  };
  for (int i = 0; i < 8; ++i) sc.all.push_back(randn({1, 4, 5, 5}, 400 + i) * (0.5 + 0.3 * i));
  sc.one = randn({1, 4, 5, 5}, 396) * 0.2;
  sc.one_takes_fewer = false;  // every input runs each loop's body twice or more
  return sc;
}

TEST(ControlFlowState, EveryPathRoundTripsBitIdentically) {
  for (bool stats : {false, true}) {
    round_trip(if_else(), "if_else", default_qconfig_mapping("onednn"), stats);
    round_trip(switch3(), "switch3", default_qconfig_mapping("onednn"), stats);
    round_trip(rnn(), "rnn", default_qconfig_mapping("onednn"), stats);
    round_trip(loops(), "loops", min_max_mapping(), stats);
  }
}

TEST(ControlFlowState, TheDocumentListsEachModulesPathsWithTheirCalls) {
  const Scenario<Parent> sc = switch3();
  auto m = sc.make();
  prepare(*m, {sc.all[0]});
  for (const Tensor& x : sc.all) (*m)(x);
  const json doc = json::parse(quant_state_to_json(model_quant_state(*m), m->type_name()));
  EXPECT_EQ(doc["calls"], 9);
  for (const json& mod : doc["modules"]) {
    const std::string fqn = mod["fqn"];
    int64_t calls = 0;
    for (const json& p : mod["paths"]) {
      calls += p["calls"].get<int64_t>();
      EXPECT_FALSE(p["ops"].empty()) << fqn;
    }
    EXPECT_EQ(calls, 1 + 9) << fqn;  // the trace and the calibration calls
    EXPECT_EQ(mod["paths"].size(), fqn == "sw" ? 3u : 1u) << fqn;
  }
  // The switch's three cases, in the order first taken (all[0] has mean < -0.4).
  const AutoQuantizationState& sw = state_of(*m->sw);
  ASSERT_EQ(sw.paths().size(), 3u);
  std::vector<std::string> first_ops;
  for (const PathInfo& p : sw.paths()) {
    std::string kinds;
    for (int r : p.records) kinds += sw.seen_ops()[static_cast<size_t>(r)].display_kind() + " ";
    first_ops.push_back(kinds);
  }
  // Mean is the op that decides (fp32: it reads fp32 x). c1's record is shared by the relu case
  // and the add case, so it does not fuse with the relu.
  EXPECT_EQ(first_ops, (std::vector<std::string>{"mean conv2d sigmoid ", "mean conv2d conv2d add ",
                                                 "mean conv2d relu "}));
}

// A file calibrated on branch a only, loaded into a copy whose example takes branch b: the file
// cannot convert what the copy runs.
TEST(ControlFlowState, AFileMissingAPathTheModelTakesIsAMismatch) {
  const Scenario<IfElse> sc = if_else();
  auto a = sc.make();
  const Tensor pos = signed_input({2, 3, 6, 6}, 1, 1.0);
  prepare(*a, {pos});
  (*a)(signed_input({2, 3, 6, 6}, 2, 1.0));
  const std::string path = temp_file("branch_a_only.qstate.json");
  save_quant_state(*a, path);

  auto b = sc.make();
  prepare(*b, {signed_input({2, 3, 6, 6}, 3, -1.0)});
  const std::string before = quant_state_to_json(model_quant_state(*b), b->type_name());
  EXPECT_THROW_MSG(load_quant_state(*b, path), StateMismatchError,
                   "module \"\" ran conv2d (b) where the file has no record of it (the file's op 1 there is conv2d (a)): "
                   "the file is missing a path this model takes");
  EXPECT_EQ(quant_state_to_json(model_quant_state(*b), b->type_name()), before);  // unchanged

  // A copy whose example takes branch a loads it; branch b then runs fp32 (an uncalibrated path).
  auto c = sc.make();
  prepare(*c, {pos});
  load_quant_state(*c, path);
  convert(*c);
  (*c)(signed_input({2, 3, 6, 6}, 4, -1.0));
  EXPECT_GT(uncalibrated_ops(*c), 0);
}

// The same model type whose forward changed between calibration and deployment.
struct Edited : nn::CallableModule<Edited> {
  explicit Edited(bool scale_a) : scale_a(scale_a) {
    a = register_module("a", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    b = register_module("b", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    head = register_module("head", std::make_shared<Conv2d>(8, 4, 1));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = mean(x).item<float>() > 0 ? (*a)(x) : relu((*b)(x));
    if (scale_a) y = y * 2.0;
    return (*head)(y);
  }
  bool scale_a;
  std::shared_ptr<Conv2d> a, b, head;
};

TEST(ControlFlowState, AFileForOtherModelCodeIsAMismatch) {
  Edited old_code(false), new_code(true);
  prepare(old_code, {signed_input({2, 3, 6, 6}, 1, 1.0)});
  old_code(signed_input({2, 3, 6, 6}, 2, -1.0));
  old_code(signed_input({2, 3, 6, 6}, 3, 1.0));
  const std::string path = temp_file("old_code.qstate.json");
  save_quant_state(old_code, path);
  prepare(new_code, {signed_input({2, 3, 6, 6}, 4, 1.0)});
  EXPECT_THROW_MSG(load_quant_state(new_code, path), StateMismatchError,
                   "ran mul () where the file has no record of it (the file's op 2 there is conv2d (head))");
}

// A file saved after a call that recorded a new path but before any call observed it: the path's
// observers are in the file without data, and convert says which op lacks it.
TEST(ControlFlowState, APathWhoseObserversSawNoDataCannotConvertAfterLoading) {
  const Scenario<IfElse> sc = if_else();
  auto a = sc.make();
  prepare(*a, {signed_input({2, 3, 6, 6}, 1, 1.0)});
  (*a)(signed_input({2, 3, 6, 6}, 2, 1.0));
  (*a)(signed_input({2, 3, 6, 6}, 3, -1.0));  // records branch b; observed from the next call
  const std::string path = temp_file("unobserved_path.qstate.json");
  save_quant_state(*a, path);
  auto b = sc.make();
  prepare(*b, {signed_input({2, 3, 6, 6}, 4, 1.0)});
  load_quant_state(*b, path);
  EXPECT_THROW_MSG(convert(*b), NotCalibratedError, "used by conv2d (b) in module \"\"");
}

// Two replicas, each calibrated on its own shard, and each shard takes paths the other does not:
// merged, the model has every path, and converts them all to int8.
TEST(ControlFlowState, MergingReplicasThatSawDifferentPathsUnitesThem) {
  const Scenario<Parent> sc = switch3();
  std::vector<Tensor> shard1, shard2;  // the switch's cases: shard 1 takes -1 and +1, shard 2 all three
  for (size_t i = 0; i < sc.all.size(); ++i) (i % 3 != 1 ? shard1 : shard2).push_back(sc.all[i]);
  shard2.push_back(sc.all[0]);
  shard2.push_back(sc.all[2]);
  auto r1 = sc.make(), r2 = sc.make(), fp32 = sc.make();
  prepare(*r1, {sc.all[0]});
  prepare(*r2, {sc.all[0]});
  for (int k = 0; k < 2; ++k) {  // twice: a call that first takes a path records it, the next observes it
    for (const Tensor& x : shard1) (*r1)(x);
    for (const Tensor& x : shard2) (*r2)(x);
  }
  EXPECT_EQ(state_of(*r1->sw).paths().size(), 2u);
  merge_calibration(*r1, *r2);
  EXPECT_EQ(state_of(*r1->sw).paths().size(), 3u);
  EXPECT_EQ(model_quant_state(*r1).records().size(), model_quant_state(*r2).records().size());
  convert(*r1);
  for (const Tensor& x : sc.all) EXPECT_GT(testing::sqnr_of((*r1)(x), (*fp32)(x)), 25.0);
  EXPECT_EQ(uncalibrated_ops(*r1), 0);
}

// Replicas whose first calls took every path (a call that records a path does not observe it,
// and may move observers) and then calibrated on their own shards: merged min/max observers are
// those of one process that calibrated on both shards, so the int8 models are bit-identical, even
// when the replicas found the paths in different orders.
TEST(ControlFlowState, MergedReplicasMatchOneProcess) {
  const auto check = [](const auto& sc) {
    using M = typename decltype(sc.make())::element_type;
    std::vector<Tensor> shard1, shard2;
    for (size_t i = 0; i < sc.all.size(); ++i) (i % 2 == 0 ? shard1 : shard2).push_back(sc.all[i] * 1.5);
    std::shared_ptr<M> whole = sc.make(), r1 = sc.make(), r2 = sc.make();
    for (const std::shared_ptr<M>& m : {whole, r1}) {
      prepare(*m, {sc.all[0]}, min_max_mapping());
      for (int k = 0; k < 2; ++k) {
        for (const Tensor& x : sc.all) (*m)(x);
      }
    }
    // The second replica is prepared on another example and tours the paths in reverse: its
    // records come in another order, and an fp32 tensor's observer belongs to another consumer.
    prepare(*r2, {sc.one}, min_max_mapping());
    for (int k = 0; k < 2; ++k) {
      for (auto it = sc.all.rbegin(); it != sc.all.rend(); ++it) (*r2)(*it);
    }
    for (const Tensor& x : shard1) (*whole)(x), (*r1)(x);
    for (const Tensor& x : shard2) (*whole)(x), (*r2)(x);
    merge_calibration(*r1, *r2);
    convert(*whole);
    convert(*r1);
    expect_bit_identical(*whole, *r1, sc.all);
    EXPECT_EQ(uncalibrated_ops(*r1), 0);
  };
  check(if_else());
  check(switch3());
  check(loops());
  check(rnn());
}

// conv + relu fuse on the path of large positive inputs; the path of small negative ones also
// reads the conv's output (tanh), which breaks the chain. While fused, the conv's output is
// observed only by an inner observer, which quant-state documents did not hold: a merge whose
// union broke the chain gave the conv's new output slot the other replica's statistics alone.
// The large inputs then ran at 0.5 dB instead of 38 dB. Documents with statistics now carry
// inner observers, so a merge equals one process that saw both shards, whichever replica broke
// the chain (MinMax: bit-identical), also through a file.
struct FusedThenBroken : nn::CallableModule<FusedThenBroken> {
  FusedThenBroken() { conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1)); }
  Tensor forward(const Tensor& x) {
    const Tensor y = (*conv)(x);
    Tensor out = relu(y);
    if (mean(x).item<float>() < 0) out = out + tanh(y);
    return out;
  }
  std::shared_ptr<Conv2d> conv;
};

TEST(ControlFlowState, MergedReplicasKeepTheRangeOfAChainTheUnionBreaks) {
  std::vector<Tensor> big, small, all;
  for (const Tensor& x : testing::random_batches(3, 80, {2, 3, 8, 8})) big.push_back(x * 4.0 + 2.0);
  for (const Tensor& x : testing::random_batches(3, 81, {2, 3, 8, 8})) small.push_back(x * 0.2 - 1.0);
  all = big;
  all.insert(all.end(), small.begin(), small.end());
  const auto make = [] {
    manual_seed(5);
    return std::make_shared<FusedThenBroken>();
  };
  auto fp32 = make();
  auto whole = make();
  prepare(*whole, {big[0]}, min_max_mapping());
  (*whole)(small[0]);  // records the other path (a recording call observes nothing new)
  for (const Tensor& x : all) (*whole)(x);
  convert(*whole);
  for (const Tensor& x : big) EXPECT_GT(testing::sqnr_of((*fp32)(x), (*whole)(x)), 30.0);
  // model fused / replica broke it, and the other way round; in memory and through a file.
  for (const bool fused_first : {true, false}) {
    for (const bool through_file : {false, true}) {
      SCOPED_TRACE(absl::StrCat(fused_first ? "the model" : "the replica", " fused; ",
                                through_file ? "through a file" : "in memory"));
      const std::vector<Tensor>& mine = fused_first ? big : small;
      const std::vector<Tensor>& theirs = fused_first ? small : big;
      auto m = make(), r = make();
      prepare(*m, {mine[0]}, min_max_mapping());
      for (const Tensor& x : mine) (*m)(x);
      prepare(*r, {theirs[0]}, min_max_mapping());
      for (const Tensor& x : theirs) (*r)(x);
      if (through_file) {
        const std::string path = temp_file("fused_then_broken.qstate.json");
        SaveQuantStateOptions opts;
        opts.include_observer_stats = true;
        save_quant_state(*(fused_first ? m : r), path, opts);
        EXPECT_NE(read_text(path).find("\"inner_outputs\""), std::string::npos);
        // A fresh copy loads the file (its inner observer too) and takes the file's place.
        auto loaded = make();
        prepare(*loaded, {big[0]}, min_max_mapping());
        load_quant_state(*loaded, path);
        if (fused_first) {
          m = loaded;
        } else {
          r = loaded;
        }
      }
      merge_calibration(*m, *r);
      convert(*m);
      expect_bit_identical(*whole, *m, all);
    }
  }
}

// A malformed "inner_outputs" entry is a FileFormatError, and loading it changes nothing.
TEST(ControlFlowState, MalformedInnerOutputsAreRefused) {
  const auto make = [] {
    manual_seed(5);
    return std::make_shared<FusedThenBroken>();
  };
  std::vector<Tensor> xs;  // all on the fused path
  for (const Tensor& x : testing::random_batches(2, 82, {2, 3, 8, 8})) xs.push_back(x * 4.0 + 2.0);
  auto m = make();
  prepare(*m, {xs[0]}, min_max_mapping());
  for (const Tensor& x : xs) (*m)(x);
  SaveQuantStateOptions opts;
  opts.include_observer_stats = true;
  const json good = json::parse(quant_state_to_json(model_quant_state(*m), m->type_name(), opts));
  ASSERT_TRUE(good.contains("inner_outputs"));
  const size_t records = model_quant_state(*m).records().size();
  auto load = [&](const json& doc) {
    auto fresh = make();
    prepare(*fresh, {xs[0]}, min_max_mapping());
    const std::string before = quant_state_to_json(model_quant_state(*fresh), fresh->type_name(), opts);
    try {
      quant_state_from_json(model_quant_state(*fresh), fresh->type_name(), doc.dump(1), "\"edited\"");
    } catch (...) {
      EXPECT_EQ(quant_state_to_json(model_quant_state(*fresh), fresh->type_name(), opts), before);
      throw;
    }
  };
  json out_of_range = good;
  out_of_range["inner_outputs"][0]["record"] = records;
  EXPECT_THROW_MSG(load(out_of_range), FileFormatError,
                   absl::StrCat("inner output 0 is of record ", records, "; the file has ", records));
  json negative = good;
  negative["inner_outputs"][0]["record"] = -1;
  EXPECT_THROW_MSG(load(negative), FileFormatError, "inner output 0 is of record -1");
  json not_array = good;
  not_array["inner_outputs"] = json::object();
  EXPECT_THROW(load(not_array), FileFormatError);
  json no_stats = good;
  no_stats["inner_outputs"][0].erase("stats");
  EXPECT_THROW(load(no_stats), FileFormatError);
  load(good);  // the unedited document loads
}

TEST(ControlFlowState, MergingAReplicaOfAnotherModelIsAMismatch) {
  const Scenario<IfElse> sc = if_else();
  auto a = sc.make();
  Edited other(false);
  prepare(*a, {sc.all[0]});
  prepare(other, {sc.all[0]});
  EXPECT_THROW_MSG(merge_calibration(*a, other), StateMismatchError, "Edited");
}

// A parameters-only file freezes the parameters: calibrating further does not change them, and
// a file saved with statistics afterwards keeps them frozen (it converts like the model that saved
// it, and saves to the same text).
TEST(ControlFlowState, FrozenParametersStayFrozenThroughAFileWithStatistics) {
  const Scenario<IfElse> sc = if_else();
  auto a = sc.make();
  prepare(*a, {sc.all[0]});
  for (const Tensor& x : sc.all) (*a)(x);
  const std::string params_only = temp_file("frozen_a.qstate.json");
  save_quant_state(*a, params_only);
  auto b = sc.make();
  prepare(*b, {sc.all[0]});
  load_quant_state(*b, params_only);
  for (const Tensor& x : sc.all) (*b)(x * 3.0);  // wider data: would change the parameters
  SaveQuantStateOptions stats;
  stats.include_observer_stats = true;
  const std::string with_stats = temp_file("frozen_b.qstate.json");
  save_quant_state(*b, with_stats, stats);
  EXPECT_NE(read_text(with_stats).find("\"frozen\": true"), std::string::npos);
  auto c = sc.make();
  prepare(*c, {sc.all[0]});
  load_quant_state(*c, with_stats);
  EXPECT_EQ(quant_state_to_json(model_quant_state(*c), c->type_name(), stats), read_text(with_stats));
  convert(*a);
  convert(*b);
  convert(*c);
  expect_bit_identical(*a, *b, sc.all);
  expect_bit_identical(*a, *c, sc.all);
}

// A functional op whose weight is computed at run time (not a parameter or buffer), on a path the
// deployment copy's example does not take: the file cannot hold the weight, so convert names the
// op until the copy has run it once; then it converts like the calibrated model.
struct ComputedBias : nn::CallableModule<ComputedBias> {
  ComputedBias() { fc = register_module("fc", std::make_shared<Linear>(6, 4)); }
  Tensor forward(const Tensor& x) {
    if (mean(x).item<float>() > 0) return (*fc)(x);
    return linear(x, fc->weight, fc->bias * 2.0);
  }
  std::shared_ptr<Linear> fc;
};

TEST(ControlFlowState, ComputedWeightsOfPathsTheExampleDidNotTakeComeFromTheirFirstCall) {
  std::vector<Tensor> xs;
  for (int i = 0; i < 6; ++i) xs.push_back(signed_input({2, 6}, 90 + i, i % 2 ? 1.0 : -1.0));
  manual_seed(41);
  ComputedBias a;
  prepare(a, {xs[1]});
  for (const Tensor& x : xs) a(x);
  const std::string path = temp_file("computed.qstate.json");
  save_quant_state(a, path);
  EXPECT_NE(read_text(path).find("\"weights\": [\n      \"fc.weight\",\n      \"\""), std::string::npos)
      << "the computed bias is saved as \"\"";
  manual_seed(41);
  ComputedBias b;
  prepare(b, {xs[1]});  // the layer's path only
  load_quant_state(b, path);
  EXPECT_THROW_MSG(convert(b), NotCalibratedError,
                   "convert: linear () in module \"\", op 3 takes a weight computed at run time (input 3");
  // The failed convert left the loaded (frozen) parameters in place.
  disable_observers(b);
  b(xs[0]);  // the functional path once: its bias is taken from the call
  enable_observers(b);
  convert(b);
  convert(a);
  expect_bit_identical(a, b, xs);
}

TEST(ControlFlowState, AModelPreparedStrictAndAFileThatIsNotAreAMismatch) {
  const Scenario<IfElse> sc = if_else();
  auto loose = sc.make(), strict = sc.make();
  PrepareOptions strict_opts;
  strict_opts.strict_control_flow = true;
  prepare(*loose, {sc.all[0]});
  prepare(*strict, {sc.all[0]}, default_qconfig_mapping("onednn"), BackendConfig::onednn(), strict_opts);
  (*loose)(sc.all[0]);
  (*strict)(sc.all[0]);
  const std::string loose_file = temp_file("loose.qstate.json"), strict_file = temp_file("strict.qstate.json");
  save_quant_state(*loose, loose_file);
  save_quant_state(*strict, strict_file);
  auto b = sc.make();
  prepare(*b, {sc.all[0]}, default_qconfig_mapping("onednn"), BackendConfig::onednn(), strict_opts);
  EXPECT_THROW_MSG(load_quant_state(*b, loose_file), StateMismatchError,
                   "the model was prepared with strict_control_flow, the file was not");
  load_quant_state(*b, strict_file);
  auto c = sc.make();
  prepare(*c, {sc.all[0]});
  EXPECT_THROW_MSG(load_quant_state(*c, strict_file), StateMismatchError,
                   "the file was saved with strict_control_flow, the model was not prepared with it");
}

// merge_quant_state takes a document's text: it is checked like a file before anything changes.
TEST(ControlFlowState, AMalformedReplicaDocumentIsRefusedAndChangesNothing) {
  const Scenario<IfElse> sc = if_else();
  auto a = sc.make(), r = sc.make();
  prepare(*a, {sc.all[0]});
  prepare(*r, {sc.all[1]});
  for (const Tensor& x : sc.all) (*a)(x), (*r)(x);
  SaveQuantStateOptions stats;
  stats.include_observer_stats = true;
  const json good = json::parse(quant_state_to_json(model_quant_state(*r), r->type_name(), stats));
  const std::string before = quant_state_to_json(model_quant_state(*a), a->type_name(), stats);
  auto merge = [&](const json& doc) {
    merge_quant_state(model_quant_state(*a), a->type_name(), reseal_quant_state(doc.dump(1)), "\"replica\"");
  };
  json bad_root = good;
  bad_root["observers"][1]["root"] = 99;
  EXPECT_THROW_MSG(merge(bad_root), FileFormatError, "observer 1 shares observer 99, which is not an observer of its own");
  json twice = good;
  twice["modules"][0]["seen_ops"][2]["tag"] = twice["modules"][0]["seen_ops"][1]["tag"];
  twice["modules"][0]["seen_ops"][2]["producers"] = twice["modules"][0]["seen_ops"][1]["producers"];
  twice["modules"][0]["seen_ops"][2]["kind"] = twice["modules"][0]["seen_ops"][1]["kind"];
  EXPECT_THROW(merge(twice), FileFormatError);
  json placement = good;
  int dropped = -1;
  for (json& op : placement["modules"][0]["seen_ops"]) {
    if (op["output_observer"] >= 0) {
      dropped = op["output_observer"];
      op["output_observer"] = -1;
      break;
    }
  }
  ASSERT_GE(dropped, 0);
  // What differs, and what to do about it (a file from a dbrq with other fusion rules looks alike).
  EXPECT_THROW_MSG(merge(placement), StateMismatchError, "observer placement differs (the file observes inputs [");
  EXPECT_THROW_MSG(merge(placement), StateMismatchError, "], output -1, this dbrq's analysis of the same program inputs [");
  EXPECT_THROW_MSG(merge(placement), StateMismatchError, absl::StrCat("], output ", dropped, "; -1: none)"));
  EXPECT_THROW_MSG(merge(placement), StateMismatchError, "calibrate again and save with this dbrq");
  EXPECT_EQ(quant_state_to_json(model_quant_state(*a), a->type_name(), stats), before);
  merge(good);
  EXPECT_NE(quant_state_to_json(model_quant_state(*a), a->type_name(), stats), before);
}

// ---- compare_numerics per path ----------------------------------------------------------------

const PathNumerics* find_path(const NumericReport& r, const std::string& module, const std::string& ops) {
  for (const PathNumerics& p : r.paths) {
    if (p.module_fqn == module && p.ops == ops) return &p;
  }
  return nullptr;
}

TEST(ControlFlowNumerics, EveryPathIsReportedWithItsCallsAndSqnr) {
  const Scenario<IfElse> sc = if_else();
  auto ref = sc.make(), q = sc.make();
  prepare(*q, {sc.all[0]});
  for (const Tensor& x : sc.all) (*q)(x);
  convert(*q);
  std::vector<std::vector<Tensor>> inputs;
  for (int i = 0; i < 5; ++i) inputs.push_back({signed_input({2, 3, 6, 6}, 70 + i, i < 2 ? 1.0 : -1.0)});
  const NumericReport r = compare_numerics(*ref, *q, inputs);
  ASSERT_EQ(r.paths.size(), 2u) << r.to_table();
  const PathNumerics* a = find_path(r, "", "mean conv2d conv2d");
  const PathNumerics* b = find_path(r, "", "mean conv2d+relu conv2d");
  ASSERT_NE(a, nullptr) << r.to_table();
  ASSERT_NE(b, nullptr) << r.to_table();
  EXPECT_EQ(a->path, 0);
  EXPECT_EQ(b->path, 1);
  EXPECT_EQ(a->calls, 2);
  EXPECT_EQ(b->calls, 3);
  EXPECT_EQ(a->calls_before, 1 + 3);  // the trace and the positive calibration inputs
  EXPECT_EQ(b->calls_before, 3);
  EXPECT_GT(a->sqnr_db, 25.0);
  EXPECT_GT(b->sqnr_db, 25.0);
  EXPECT_EQ(r.diverged_calls, 0);
  EXPECT_EQ(r.uncalibrated_ops, 0);
  // The head has one record per branch, each reported.
  int heads = 0;
  for (const OpNumerics& o : r.ops) heads += o.fqn == "head" ? 1 : 0;
  EXPECT_EQ(heads, 2);
  const std::string table = r.to_table();
  EXPECT_NE(table.find("paths of module"), std::string::npos) << table;
  EXPECT_NE(table.find("mean conv2d+relu conv2d"), std::string::npos) << table;
  EXPECT_NE(r.paths_to_csv().find("\"\",1,3,3,"), std::string::npos) << r.paths_to_csv();
  EXPECT_NE(r.to_html("if/else").find("Control-flow paths"), std::string::npos);
  // Printing lists each path's records and calls: trace + 3 calibration + 2 compared calls took a.
  const std::string printed = quant_state_to_string(*q);
  EXPECT_NE(printed.find("paths: [0 1 2] x6; [0 3 4 5] x6;"), std::string::npos) << printed;
}

TEST(ControlFlowNumerics, LoopsReportEveryIteration) {
  const Scenario<Rnn> sc = rnn();
  auto ref = sc.make(), q = sc.make();
  prepare(*q, {sc.all[0]});
  for (const Tensor& x : sc.all) (*q)(x);
  convert(*q);
  const NumericReport r = compare_numerics(*ref, *q, {{randn({7, 8}, 5)}});
  // The cell's first iteration (h from zeros) and its later ones are two records.
  std::vector<int64_t> cell_runs;
  for (const OpNumerics& o : r.ops) {
    if (o.fqn == "cell") cell_runs.push_back(o.runs);
  }
  std::sort(cell_runs.begin(), cell_runs.end());
  EXPECT_EQ(cell_runs, (std::vector<int64_t>{1, 6})) << r.to_table();
  // The model has two paths, T = 1 (the first iteration only, seen in calibration) and T > 1
  // (whatever T is); this call took the second.
  ASSERT_EQ(r.paths.size(), 1u) << r.to_table();
  EXPECT_GE(r.paths[0].path, 0);
  EXPECT_EQ(r.paths[0].calls, 1);
  EXPECT_EQ(r.paths[0].calls_before, 5);  // the trace (T = 3), then T = 3, 5, 8, 2
  EXPECT_GT(r.output_sqnr_db, 25.0);
}

TEST(ControlFlowNumerics, APathNeverCalibratedIsReportedAsNew) {
  const Scenario<IfElse> sc = if_else();
  auto ref = sc.make(), q = sc.make();
  prepare(*q, {sc.all[0]});
  for (size_t i = 0; i < sc.all.size(); i += 2) (*q)(sc.all[i]);  // branch a only
  convert(*q);
  const NumericReport r = compare_numerics(*ref, *q, {{sc.all[1]}, {sc.all[0]}});
  ASSERT_EQ(r.paths.size(), 2u) << r.to_table();
  const PathNumerics& known = r.paths[0];
  const PathNumerics& fresh = r.paths[1];  // new paths sort last
  EXPECT_EQ(known.path, 0);
  EXPECT_EQ(fresh.path, -1);
  EXPECT_EQ(fresh.calls, 1);
  EXPECT_EQ(fresh.calls_before, 0);
  EXPECT_EQ(fresh.ops, "mean") << "only the calibrated records of the path are int8 records";
  EXPECT_GT(fresh.sqnr_db, 25.0);  // b and the head ran in fp32 from the dequantized input
  EXPECT_EQ(r.uncalibrated_ops, 3);  // b, relu, head
  const std::string table = r.to_table();
  EXPECT_NE(table.find("3 op run(s) on paths never calibrated (fp32)"), std::string::npos) << table;
  EXPECT_NE(table.find(" new "), std::string::npos) << table;
}

// A branch on an intermediate value whose int8 value falls on the other side of the threshold:
// the two models' ops no longer pair up there, and the report says so instead of comparing them.
struct Threshold : nn::CallableModule<Threshold> {
  explicit Threshold(bool relu_on_up = false) : relu_on_up(relu_on_up) {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1));
    up = register_module("up", std::make_shared<Conv2d>(4, 4, 1));
    down = register_module("down", std::make_shared<Conv2d>(4, 4, 1));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    last_mean = mean(y).item<float>();
    if (relu_on_up) return last_mean > threshold ? relu((*up)(y)) : (*down)(y);
    return last_mean > threshold ? (*up)(y) : relu((*down)(y));
  }
  bool relu_on_up;
  float threshold = 0.0f;
  float last_mean = 0.0f;
  std::shared_ptr<Conv2d> conv, up, down;
};

TEST(ControlFlowNumerics, CallsWhereInt8TookAnotherBranchAreCounted) {
  // Whichever branch has the extra op: the two calls' ops do not pair up either way.
  for (bool relu_on_up : {false, true}) {
    SCOPED_TRACE(relu_on_up ? "relu on up" : "relu on down");
    manual_seed(21);
    Threshold ref(relu_on_up);
    manual_seed(21);
    Threshold q(relu_on_up);
    prepare(q, {randn({1, 3, 6, 6}, 1)});
    for (uint64_t i = 0; i < 8; ++i) {
      q.threshold = i % 2 == 0 ? -100.0f : 100.0f;  // both branches
      q(randn({1, 3, 6, 6}, 10 + i));
    }
    convert(q);
    const Tensor x = randn({1, 3, 6, 6}, 99);
    ref(x);
    q(x);
    const float fp32_mean = ref.last_mean, int8_mean = q.last_mean;
    ASSERT_NE(fp32_mean, int8_mean);
    ref.threshold = q.threshold = -100.0f;  // both take "up"
    const NumericReport agree = compare_numerics(ref, q, {{x}});
    EXPECT_EQ(agree.diverged_calls, 0);
    EXPECT_GT(agree.output_sqnr_db, 25.0);
    bool up_reported = false;
    for (const OpNumerics& o : agree.ops) up_reported = up_reported || o.fqn == "up";
    EXPECT_TRUE(up_reported) << agree.to_table();
    ref.threshold = q.threshold = (fp32_mean + int8_mean) / 2;  // fp32 and int8 take different ones
    const NumericReport split = compare_numerics(ref, q, {{x}});
    EXPECT_EQ(split.diverged_calls, 1) << split.to_table();
    EXPECT_TRUE(split.ops.empty()) << split.to_table();  // the call's ops are not compared
    EXPECT_NE(split.to_table().find("1 module call(s) took another branch than the fp32 model"), std::string::npos);
  }
}

}  // namespace
}  // namespace dbrq
