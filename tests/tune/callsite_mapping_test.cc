// QConfigMapping::set_module_name_object_type_order addresses one functional call site (module,
// op, index of the call in forward order): precedence, the mapping JSON (version 2 only with call
// sites; bad documents), prepare / convert moving exactly that call, and a quant state calibrated
// with a call-site qconfig reloading.
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

// ---- the mapping ----

TEST(CallSiteMapping, TakesPrecedenceForItsCallOnly) {
  QConfigMapping m = default_qconfig_mapping("onednn");
  const QConfigPtr minmax = QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max());
  m.set_module_name("block", QConfig::bf16());
  m.set_object_type(OpKind::kMatmul, nullptr);
  m.set_module_name_object_type_order("block", OpKind::kMatmul, 1, minmax);
  EXPECT_EQ(m.for_op(OpKind::kMatmul, "OpBlock", "block", 1), minmax);
  EXPECT_TRUE(m.for_op(OpKind::kMatmul, "OpBlock", "block", 0)->is_bf16());  // module name, as before
  EXPECT_TRUE(m.for_op(OpKind::kMatmul, "OpBlock", "block", 1 + 1)->is_bf16());
  EXPECT_EQ(m.for_op(OpKind::kMatmul, "OpNet", "", 1), nullptr);  // another module: op type
  EXPECT_TRUE(m.for_op(OpKind::kAdd, "OpBlock", "block", 1)->is_bf16());  // another op
  // Replacing an entry keeps one.
  m.set_module_name_object_type_order("block", OpKind::kMatmul, 1, nullptr);
  ASSERT_EQ(m.module_name_object_type_orders().size(), 1u);
  EXPECT_EQ(m.for_op(OpKind::kMatmul, "OpBlock", "block", 1), nullptr);
  EXPECT_NE(m.to_string().find("module_name_object_type_order[block, matmul, 1]=None"), std::string::npos)
      << m.to_string();
  EXPECT_THROW_MSG(m.set_module_name_object_type_order("block", OpKind::kMatmul, -1, nullptr), ValueError,
                   "set_module_name_object_type_order: index must be >= 0, got -1 (block, matmul)");
  EXPECT_THROW_MSG(m.set_module_name_object_type_order("", OpKind::kNumOpKinds, 0, nullptr), ValueError,
                   "invalid op kind");
  auto net = make_opnet();
  QConfigMapping bad;
  bad.set_module_name_object_type_order("blok", OpKind::kMatmul, 0, nullptr);
  EXPECT_THROW_MSG(bad.validate(*net), ValueError, "names module(s) \"blok\" that do not exist");
}

TEST(CallSiteMapping, JsonRoundTripIsVersion2OnlyWithCallSites) {
  // A mapping without (module type, op) entries (those need version 3; the default mapping has
  // some, for nn::GRU / nn::LSTM).
  QConfigMapping m;
  m.set_global(default_qconfig()).set_object_type(OpKind::kAdd, nullptr).set_object_type("Softmax", default_qconfig());
  const std::string v1 = qconfig_mapping_to_json(m);
  EXPECT_EQ(nlohmann::json::parse(v1).at("version"), 1);
  EXPECT_FALSE(nlohmann::json::parse(v1).contains("module_name_object_type_orders"));
  m.set_module_name_object_type_order("block", OpKind::kMatmul, 0, QConfig::bf16());
  m.set_module_name_object_type_order("", OpKind::kAdd, 2, nullptr);
  m.set_module_name_object_type_order("block", OpKind::kMatmul, 1,
                                      QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max()));
  const std::string v2 = qconfig_mapping_to_json(m);
  const nlohmann::json doc = nlohmann::json::parse(v2);
  EXPECT_EQ(doc.at("version"), 2);
  ASSERT_EQ(doc.at("module_name_object_type_orders").size(), 3u);
  const QConfigMapping back = qconfig_mapping_from_json(v2, "v2");
  EXPECT_EQ(back.to_string(), m.to_string());
  EXPECT_EQ(qconfig_mapping_to_json(back), v2);
  EXPECT_TRUE(back.for_op(OpKind::kMatmul, "OpBlock", "block", 0)->is_bf16());
  EXPECT_EQ(back.for_op(OpKind::kAdd, "OpNet", "", 2), nullptr);

  nlohmann::json wrong = doc;
  wrong["version"] = 1;  // a version 1 reader would drop the call sites: refused
  EXPECT_THROW_MSG(qconfig_mapping_from_json(wrong.dump(), "w.json"), FileFormatError,
                   "qconfig mapping w.json has module_name_object_type_orders, which need version 2");
  wrong = doc;
  wrong["module_name_object_type_orders"][0]["op"] = "matmull";
  EXPECT_THROW_MSG(qconfig_mapping_from_json(wrong.dump(), "w.json"), FileFormatError,
                   "unknown op \"matmull\" in module_name_object_type_orders");
  wrong = doc;
  wrong["module_name_object_type_orders"][0]["index"] = -3;
  EXPECT_THROW_MSG(qconfig_mapping_from_json(wrong.dump(), "w.json"), FileFormatError,
                   "index must be >= 0, got -3");
  wrong = doc;
  wrong["version"] = 4;
  EXPECT_THROW_MSG(qconfig_mapping_from_json(wrong.dump(), "w.json"), FileFormatError,
                   "has version 4; this dbrq reads versions 1 to 3");
}

TEST(CallSiteMapping, MovesOneCallOfAFunctionalOp) {
  OpSetup s;
  for (const QConfigPtr& q : {QConfigPtr(nullptr), QConfig::bf16()}) {
    auto m = make_opnet();
    QConfigMapping map = default_qconfig_mapping("onednn");
    map.set_module_name_object_type_order("block", OpKind::kMatmul, 0, q);
    prepare(*m, s.calib[0], map);
    for (const auto& b : s.calib) m->forward_tensors(b);
    convert(*m);
    // The first matmul is not recorded (fp32 / bf16), the second still is, and so are the layers.
    const std::map<int, std::string> mm = block_matmuls(*m);
    EXPECT_EQ(mm.count(0), 0u) << (q ? "bf16" : "fp32");
    ASSERT_EQ(mm.count(1), 1u);
    EXPECT_NE(mm.at(1), "fp32");
    // Numerically: the fragile matmul out of int8 is what the model needed.
    EXPECT_GT(s.sqnr()(*m), kTarget);
  }
  // By op type both leave int8; with the default mapping both are int8 and the model is broken.
  auto all = make_opnet();
  prepare(*all, s.calib[0]);
  for (const auto& b : s.calib) all->forward_tensors(b);
  convert(*all);
  const std::map<int, std::string> mm = block_matmuls(*all);
  ASSERT_EQ(mm.size(), 2u);
  EXPECT_LT(s.sqnr()(*all), 10.0);
}

TEST(CallSiteMapping, QuantStateWithACallSiteQConfigReloads) {
  OpSetup s;
  QConfigMapping map = default_qconfig_mapping("onednn");
  map.set_module_name_object_type_order("block", OpKind::kMatmul, 1,
                                        QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max()));
  auto m = make_opnet();
  prepare(*m, s.calib[0], map);
  for (const auto& b : s.calib) m->forward_tensors(b);
  const std::string state = testing::temp_file("callsite.qstate.json");
  const std::string mapping = state + ".mapping.json";
  save_quant_state(*m, state);
  save_qconfig_mapping(map, mapping);
  convert(*m);
  auto again = make_opnet();
  prepare(*again, s.calib[0], load_qconfig_mapping(mapping));
  load_quant_state(*again, state);
  convert(*again);
  for (const Tensor& x : s.test) testing::expect_equal(again->forward_tensors({x})[0], m->forward_tensors({x})[0], "reloaded");
  // Without the call-site entry the second matmul's qconfig (MinMax) is not the model's.
  auto other = make_opnet();
  prepare(*other, s.calib[0]);
  EXPECT_THROW_MSG(load_quant_state(*other, state), Error, "the file's qconfig is QConfig(activation=MinMax");
}

// A functional linear in a child module, for bias correction.
struct LinBlock : nn::CallableModule<LinBlock> {
  LinBlock() {
    w = register_parameter("w", randn({8, 16}, 81));
    b = register_parameter("b", randn({8}, 82));
  }
  Tensor forward(const Tensor& x) { return linear(x, w, b); }
  Tensor w, b;
};
struct LinNet : nn::CallableModule<LinNet> {
  LinNet() { block = register_module("block", std::make_shared<LinBlock>()); }
  Tensor forward(const Tensor& x) { return (*block)(x); }
  std::shared_ptr<LinBlock> block;
};

// Bias correction does not resolve call sites: a functional linear whose module has call-site
// entries for linear is skipped (its bias untouched) rather than corrected for int8 weights that
// the entry may have moved to fp32.
TEST(CallSiteMapping, BiasCorrectionSkipsFunctionalOpsWithCallSites) {
  std::vector<std::vector<Tensor>> calib;
  for (const Tensor& x : testing::random_batches(2, 83, {16, 16})) calib.push_back({x});
  auto plain = std::make_shared<LinNet>();
  plain->eval();
  const Tensor before = plain->block->b.clone();
  const BiasCorrectionReport r0 = correct_bias(*plain, calib);
  ASSERT_EQ(r0.layers.size(), 1u) << r0.to_string();  // corrected without call sites
  auto sited = std::make_shared<LinNet>();
  sited->eval();
  sited->block->b.copy_(before);
  QConfigMapping m = default_qconfig_mapping("onednn");
  m.set_module_name_object_type_order("block", OpKind::kLinear, 0, nullptr);
  const BiasCorrectionReport r1 = correct_bias(*sited, calib, m);
  EXPECT_TRUE(r1.layers.empty()) << r1.to_string();
  ASSERT_EQ(r1.skipped.size(), 1u);
  EXPECT_NE(r1.skipped[0].find("call-site qconfig entries"), std::string::npos) << r1.skipped[0];
  testing::expect_equal(sited->block->b, before, "bias untouched");
}

}  // namespace
}  // namespace dbrq
