// Autotune and functional ops (issue 13's autotune follow-ups): it ranks and moves functional ops
// (a matmul inside a child module) by call site and moves only the fragile one; it starts from
// AutotuneOptions::base_mapping; a version 1 trial log (no functional ops) still resumes.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dbrq.h"
#include "tests/test_util.h"
#include "tests/tune/op_model.h"

namespace dbrq {
namespace {

using namespace opnet;  // NOLINT: the test model

// ---- autotune ----

TEST(AutotuneOps, MovesOnlyTheFragileFunctionalMatmul) {
  OpSetup s;
  AutotuneOptions opt;
  opt.quant_state_path = testing::temp_file("ops.qstate.json");
  const AutotuneResult r = autotune(make_opnet, s.calib, s.sqnr(), TuneCriterion::at_least(kTarget), TuneBudget{}, opt);
  SCOPED_TRACE(r.to_string());
  ASSERT_EQ(r.status, TuneStatus::kMet);
  for (size_t i = 0; i < 8 && i < r.trials.size(); ++i) EXPECT_FALSE(r.trials[i].meets) << r.trials[i].config.key();
  ASSERT_FALSE(r.sensitivity.empty());
  EXPECT_EQ(r.sensitivity[0].first, "block.matmul#0");
  const std::vector<TuneOp> moved = {TuneOp{"block", OpKind::kMatmul, 0}};
  EXPECT_TRUE(r.best_config.bf16_layers.empty());
  EXPECT_TRUE(r.best_config.fp32_layers.empty());
  if (bf16_supported()) {
    EXPECT_EQ(r.best_config.bf16_ops, moved);
    EXPECT_TRUE(r.best_config.fp32_ops.empty());
  } else {
    EXPECT_TRUE(r.best_config.bf16_ops.empty());
    EXPECT_EQ(r.best_config.fp32_ops, moved);
  }
  EXPECT_EQ(r.trials[static_cast<size_t>(r.best_trial)].config.key().find("_ops=[block.matmul#0]") != std::string::npos,
            true);
  // Only that call left int8: the other matmul of the block is still recorded.
  const std::map<int, std::string> mm = block_matmuls(*r.best_model);
  EXPECT_EQ(mm.count(0), 0u);
  EXPECT_EQ(mm.count(1), 1u);
  // The saved quant state + mapping reproduce the best model exactly.
  auto again = make_opnet();
  prepare(*again, s.calib[0], load_qconfig_mapping(opt.quant_state_path + ".mapping.json"));
  load_quant_state(*again, opt.quant_state_path);
  convert(*again);
  for (const Tensor& x : s.test) {
    testing::expect_equal(again->forward_tensors({x})[0], r.best_model->forward_tensors({x})[0], "reloaded best");
  }
}

TEST(AutotuneOps, StartsFromABaseMapping) {
  OpSetup s;
  AutotuneOptions opt;
  QConfigMapping base = transformer_qconfig_mapping();
  base.set_module_name("head", nullptr);  // the user keeps the head fp32
  opt.base_mapping = base;
  opt.quant_state_path = testing::temp_file("base.qstate.json");
  opt.log_path = testing::temp_file("base.log.json");
  const AutotuneResult r = autotune(make_opnet, s.calib, s.sqnr(), TuneCriterion::at_least(kTarget), TuneBudget{}, opt);
  SCOPED_TRACE(r.to_string());
  ASSERT_EQ(r.status, TuneStatus::kMet);
  // Every trial's mapping is the base's structure with the trial's observer.
  for (const TuneTrial& t : r.trials) {
    const QConfigMapping m = t.config.mapping();
    EXPECT_EQ(m.for_module("Linear", "head"), nullptr) << t.config.key();
    EXPECT_EQ(m.for_op(OpKind::kAdd, "OpNet", ""), nullptr) << t.config.key();
    EXPECT_EQ(m.global()->activation.kind, t.config.activation) << t.config.key();
  }
  // The head stayed fp32 in the best model, and the saved mapping says so.
  for (const QuantizedOpInfo& i : quantized_ops(*r.best_model)) EXPECT_NE(i.fqn, "head");
  const QConfigMapping saved = load_qconfig_mapping(opt.quant_state_path + ".mapping.json");
  EXPECT_EQ(saved.for_module("Linear", "head"), nullptr);
  EXPECT_EQ(saved.for_op(OpKind::kAdd, "OpNet", ""), nullptr);
  // The log names its base: resuming it from another base is refused.
  AutotuneOptions other = opt;
  other.base_mapping.reset();
  EXPECT_THROW_MSG(autotune(make_opnet, s.calib, s.sqnr(), TuneCriterion::at_least(kTarget), TuneBudget{}, other),
                   ValueError, "was written for another base mapping but this search starts from the default one");
  // A base naming a module the model does not have.
  AutotuneOptions bad;
  bad.base_mapping = QConfigMapping(base).set_module_name("blocks.0", nullptr);
  EXPECT_THROW_MSG(autotune(make_opnet, s.calib, s.sqnr(), TuneCriterion::at_least(kTarget), TuneBudget{}, bad),
                   ValueError, "autotune: the base mapping does not fit the model: QConfigMapping names module(s) \"blocks.0\"");
}

TEST(AutotuneOps, AVersion1LogResumesAndFunctionalOpsAreRankedAgain) {
  OpSetup s;
  const std::string log = testing::temp_file("v1.log.json");
  AutotuneOptions opt;
  opt.log_path = log;
  const AutotuneResult first = autotune(make_opnet, s.calib, s.sqnr(), TuneCriterion::at_least(kTarget), TuneBudget{8, 0}, opt);
  ASSERT_EQ(first.status, TuneStatus::kTrialBudget);
  ASSERT_EQ(first.trials.size(), 8u);
  // Rewrite it as the previous version wrote it: version 1, no base, layer-only configs and a
  // layer-only ranking (the old search never ranked functional ops).
  nlohmann::json doc = nlohmann::json::parse(testing::read_text(log));
  ASSERT_EQ(doc.at("version"), 2);
  doc["version"] = 1;
  doc.erase("base_mapping");
  nlohmann::json trials = nlohmann::json::array();
  for (nlohmann::json t : doc.at("trials")) {
    t.at("config").erase("bf16_ops");
    t.at("config").erase("fp32_ops");
    trials.push_back(t);
  }
  doc["trials"] = trials;
  nlohmann::json sens = nlohmann::json::array();
  sens.push_back(nlohmann::json{{"fqn", "head"}, {"layers", {"head"}}, {"sqnr_db", 3.0}});
  doc["sensitivity"] = sens;
  testing::write_text(log, doc.dump(1));

  int calls = 0;
  const EvaluateFn sqnr = s.sqnr();
  auto counting = [&](nn::Module& m) {
    ++calls;
    return sqnr(m);
  };
  const AutotuneResult r = autotune(make_opnet, s.calib, counting, TuneCriterion::at_least(kTarget), TuneBudget{}, opt);
  SCOPED_TRACE(r.to_string());
  ASSERT_EQ(r.status, TuneStatus::kMet);
  for (size_t i = 0; i < 8; ++i) EXPECT_TRUE(r.trials[i].resumed) << i;
  // The old ranking (head only) was not reused: the matmul is found.
  ASSERT_FALSE(r.sensitivity.empty());
  EXPECT_EQ(r.sensitivity[0].first, "block.matmul#0");
  EXPECT_EQ(calls, 1 + static_cast<int>(r.trials.size()) - 8);
  EXPECT_EQ(nlohmann::json::parse(testing::read_text(log)).at("version"), 2);
  // A log from a newer dbrq is refused.
  nlohmann::json newer = nlohmann::json::parse(testing::read_text(log));
  newer["version"] = 3;
  testing::write_text(log, newer.dump());
  EXPECT_THROW_MSG(autotune(make_opnet, s.calib, sqnr, TuneCriterion::at_least(kTarget), TuneBudget{}, opt),
                   FileFormatError, "has version 3; this dbrq reads versions 1 and 2");
  // A version 1 log cannot be resumed from a base mapping (version 1 always used the default).
  testing::write_text(log, doc.dump(1));
  AutotuneOptions based = opt;
  based.base_mapping = transformer_qconfig_mapping();
  EXPECT_THROW_MSG(autotune(make_opnet, s.calib, sqnr, TuneCriterion::at_least(kTarget), TuneBudget{}, based),
                   ValueError, "was written for the default base mapping but this search starts from another");
}

}  // namespace
}  // namespace dbrq
