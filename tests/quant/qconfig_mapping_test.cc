// QConfigMapping cases, checked on the seen ops (their QConfig, which ops are recorded at all, the
// kind of observer they feed) and on converted numerics: global only; global null with one object
// type enabled; an object type set to null (a layer class, or OpKind::kAdd); a functional op set to
// null (the layer of the same kind stays quantized); a module name set to null (its subtree stays
// fp32, over regex and type entries); regex; precedence module name > regex > type > global with
// parent-name inheritance; validate() naming modules that do not exist.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;
using testing::seen_kinds;
using testing::sqnr_of;
using testing::state_of;
using K = OpKind;

QConfigPtr q_minmax() { return QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max()); }
QConfigPtr q_mavg() {
  return QConfig::make(ObserverSpec::moving_average_min_max(0.1), ObserverSpec::per_channel_min_max());
}
QConfigPtr q_pct() { return QConfig::make(ObserverSpec::percentile_of(99.9), ObserverSpec::per_channel_min_max()); }
QConfigPtr q_entropy() { return QConfig::make(ObserverSpec::entropy(), ObserverSpec::per_channel_min_max()); }

// relu(conv(x)) with a functional relu: one layer op and one functional op per unit.
struct Unit : nn::CallableModule<Unit> {
  Unit() { conv = register_module("conv", std::make_shared<Conv2d>(4, 4, 3, 1, 1)); }
  Tensor forward(const Tensor& x) { return relu((*conv)(x)); }
  std::shared_ptr<Conv2d> conv;
};

struct Outer : nn::CallableModule<Outer> {
  Outer() {
    conv = register_module("conv", std::make_shared<Conv2d>(4, 4, 1));
    sub = register_module("sub", std::make_shared<Unit>());
  }
  Tensor forward(const Tensor& x) { return (*sub)((*conv)(x)) + x; }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<Unit> sub;
};

struct Head : nn::CallableModule<Head> {
  Head() {
    fc = register_module("fc", std::make_shared<Linear>(4, 3));
    weight = register_parameter("weight", randn({3, 4}, 17) * 0.5);
  }
  // A Linear layer and a functional linear.
  Tensor forward(const Tensor& x) { return (*fc)(x) + linear(x, weight); }
  std::shared_ptr<Linear> fc;
  Tensor weight;
};

struct Net : nn::CallableModule<Net> {
  Net() {
    a = register_module("a", std::make_shared<Unit>());
    b = register_module("b", std::make_shared<Unit>());
    c = register_module("c", std::make_shared<Outer>());
    d = register_module("d", std::make_shared<Head>());
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*c)((*b)((*a)(x)) + x);
    return (*d)(mean(y, {2, 3}));
  }
  std::shared_ptr<Unit> a, b;
  std::shared_ptr<Outer> c;
  std::shared_ptr<Head> d;
};

class MappingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manual_seed(12);
    model = std::make_shared<Net>();
    inputs = testing::random_batches(3, 10, {2, 4, 6, 6});
    for (const Tensor& x : inputs) refs.push_back((*model)(x));
  }
  void prepare_with(const QConfigMapping& mapping) { prepare(*model, {inputs[0]}, mapping); }
  void calibrate_convert_compare(double min_db = 22.0) {
    for (const Tensor& x : inputs) (*model)(x);
    convert(*model);
    for (size_t i = 0; i < inputs.size(); ++i) EXPECT_GT(sqnr_of((*model)(inputs[i]), refs[i]), min_db) << i;
  }
  // The seen op of `s` whose fqn is `fqn` and kind `kind`; fails when absent.
  const SeenOpInfo* op(const nn::Module& m, const std::string& fqn, OpKind kind) {
    for (const SeenOpInfo& o : state_of(m).seen_ops()) {
      if (o.fqn == fqn && o.kind == kind) return &o;
    }
    ADD_FAILURE() << "no seen op " << op_name(kind) << " (" << fqn << ")";
    return nullptr;
  }
  bool fp32_listed(const nn::Module& m, const std::string& fqn, OpKind kind) {
    for (const NonQuantOpInfo& o : state_of(m).non_quant_ops()) {
      if (o.fqn == fqn && o.kind == kind && o.reason == "qconfig is None") return true;
    }
    return false;
  }
  ObserverKind output_observer_kind(const SeenOpInfo& o) {
    ModelQuantState& m = model_quant_state(*model);
    const int slot = m.tensor(o.outputs[0].id)->slot;
    EXPECT_GE(slot, 0);
    return slot < 0 ? ObserverKind::kPlaceholder : m.slot(slot).observer->spec().kind;
  }

  std::shared_ptr<Net> model;
  std::vector<Tensor> inputs, refs;
};

TEST_F(MappingTest, GlobalOnly) {
  QConfigPtr q = q_minmax();
  prepare_with(QConfigMapping().set_global(q));
  ModelQuantState& m = model_quant_state(*model);
  int n = 0;
  for (AutoQuantizationState* s : m.states()) {
    for (const SeenOpInfo& o : s->seen_ops()) {
      EXPECT_EQ(o.qconfig, q) << o.fqn;
      ++n;
    }
    EXPECT_TRUE(s->non_quant_ops().empty()) << s->fqn();
  }
  EXPECT_GE(n, 12);
  for (int r : testing::observer_roots(m)) EXPECT_EQ(m.slot(r).observer->spec().kind, ObserverKind::kMinMax);
  calibrate_convert_compare();
}

TEST_F(MappingTest, GlobalNullWithOneObjectTypeEnabled) {
  QConfigPtr q = q_minmax();
  prepare_with(QConfigMapping().set_object_type("Conv2d", q));
  // Only Conv2d layers are seen; every other op is recorded as fp32.
  EXPECT_EQ(seen_kinds(state_of(*model->a)), std::vector<OpKind>{K::kConv2d});
  EXPECT_EQ(seen_kinds(state_of(*model->c)), std::vector<OpKind>{K::kConv2d});
  EXPECT_EQ(seen_kinds(state_of(*model->c->sub)), std::vector<OpKind>{K::kConv2d});
  EXPECT_TRUE(state_of(*model).seen_ops().empty());
  EXPECT_TRUE(state_of(*model->d).seen_ops().empty());
  EXPECT_EQ(op(*model->a, "a.conv", K::kConv2d)->qconfig, q);
  EXPECT_TRUE(fp32_listed(*model->a, "a", K::kRelu));
  EXPECT_TRUE(fp32_listed(*model, "", K::kAdd));
  EXPECT_TRUE(fp32_listed(*model->d, "d.fc", K::kLinear));
  EXPECT_TRUE(fp32_listed(*model->d, "d", K::kLinear));
  calibrate_convert_compare();
}

TEST_F(MappingTest, ObjectTypeNullKeepsThoseFp32) {
  prepare_with(default_qconfig_mapping().set_object_type("Conv2d", nullptr).set_object_type(K::kAdd, nullptr));
  for (const nn::Module* m : {static_cast<nn::Module*>(model->a.get()), static_cast<nn::Module*>(model->b.get()),
                              static_cast<nn::Module*>(model->c.get()), static_cast<nn::Module*>(model->c->sub.get()),
                              static_cast<nn::Module*>(model.get()), static_cast<nn::Module*>(model->d.get())}) {
    for (const SeenOpInfo& o : state_of(*m).seen_ops()) {
      EXPECT_NE(o.kind, K::kConv2d) << o.fqn;
      EXPECT_NE(o.kind, K::kAdd) << o.fqn;
    }
  }
  EXPECT_TRUE(fp32_listed(*model->a, "a.conv", K::kConv2d));
  EXPECT_TRUE(fp32_listed(*model->c, "c", K::kAdd));
  EXPECT_TRUE(fp32_listed(*model, "", K::kAdd));
  EXPECT_TRUE(fp32_listed(*model->d, "d", K::kAdd));
  // Relus stay seen ops but have nothing int8 to pass through: fp32.
  EXPECT_EQ(op(*model->a, "a", K::kRelu)->role, QuantRole::kNone);
  // The head's linears are quantized.
  EXPECT_EQ(op(*model->d, "d.fc", K::kLinear)->role, QuantRole::kWeighted);
  EXPECT_EQ(op(*model->d, "d", K::kLinear)->role, QuantRole::kWeighted);
  calibrate_convert_compare();
}

TEST_F(MappingTest, FunctionalOpNullKeepsTheLayerQuantized) {
  prepare_with(default_qconfig_mapping().set_object_type(K::kLinear, nullptr));
  AutoQuantizationState& d = state_of(*model->d);
  ASSERT_EQ(seen_kinds(d), (std::vector<OpKind>{K::kLinear, K::kAdd}));
  EXPECT_EQ(d.seen_ops()[0].fqn, "d.fc");  // the Linear layer
  EXPECT_EQ(d.seen_ops()[0].role, QuantRole::kWeighted);
  EXPECT_TRUE(fp32_listed(*model->d, "d", K::kLinear));  // the functional linear
  // The add of an int8 and an fp32 tensor: the fp32 side is observed and quantized at the add.
  EXPECT_EQ(d.seen_ops()[1].input_observers[0], -1);
  EXPECT_GE(d.seen_ops()[1].input_observers[1], 0);
  calibrate_convert_compare();
}

TEST_F(MappingTest, ModuleNameNullBeatsRegexAndType) {
  QConfigPtr q = q_minmax();
  prepare_with(default_qconfig_mapping()
                   .set_module_name("c", nullptr)
                   .set_module_name_regex("c", q)
                   .set_object_type("Conv2d", q)
                   .set_object_type("Outer", q));
  // The whole subtree "c" is fp32: nothing seen in c or c.sub.
  EXPECT_TRUE(state_of(*model->c).seen_ops().empty());
  EXPECT_TRUE(state_of(*model->c->sub).seen_ops().empty());
  EXPECT_TRUE(fp32_listed(*model->c, "c.conv", K::kConv2d));
  EXPECT_TRUE(fp32_listed(*model->c, "c", K::kAdd));
  EXPECT_TRUE(fp32_listed(*model->c->sub, "c.sub.conv", K::kConv2d));
  EXPECT_TRUE(fp32_listed(*model->c->sub, "c.sub", K::kRelu));
  // Elsewhere the type entry applies.
  EXPECT_EQ(op(*model->a, "a.conv", K::kConv2d)->qconfig, q);
  calibrate_convert_compare();
}

TEST_F(MappingTest, RegexMatchesFromTheStartOfTheName) {
  QConfigPtr q = q_mavg();
  prepare_with(default_qconfig_mapping().set_module_name_regex("(a|c\\.sub)", q));
  QConfigPtr g = default_qconfig_mapping().global();
  EXPECT_EQ(op(*model->a, "a.conv", K::kConv2d)->qconfig, q);
  EXPECT_EQ(op(*model->a, "a", K::kRelu)->qconfig, q);
  EXPECT_EQ(op(*model->c->sub, "c.sub.conv", K::kConv2d)->qconfig, q);
  EXPECT_EQ(*op(*model->b, "b.conv", K::kConv2d)->qconfig, *g);
  EXPECT_EQ(*op(*model->c, "c.conv", K::kConv2d)->qconfig, *g);  // "c.conv" does not match "c\.sub"
  EXPECT_EQ(output_observer_kind(*op(*model->a, "a.conv", K::kConv2d)), ObserverKind::kMovingAverageMinMax);
  EXPECT_EQ(output_observer_kind(*op(*model->b, "b.conv", K::kConv2d)), ObserverKind::kHistogram);
  calibrate_convert_compare();
}

TEST_F(MappingTest, PrecedenceNameOverRegexOverTypeOverGlobal) {
  QConfigPtr g = q_minmax(), t = q_mavg(), r = q_pct(), n = q_entropy(), n2 = q_minmax();
  QConfigMapping mapping;
  mapping.set_global(g)
      .set_object_type("Conv2d", t)
      .set_module_name_regex("b", r)
      .set_module_name_regex("c", r)
      .set_module_name("c", n)
      .set_module_name("c.sub", n2);
  prepare_with(mapping);
  // a: the type entry for the layer, global for the functional relu.
  EXPECT_EQ(op(*model->a, "a.conv", K::kConv2d)->qconfig, t);
  EXPECT_EQ(op(*model->a, "a", K::kRelu)->qconfig, g);
  // b: regex over type.
  EXPECT_EQ(op(*model->b, "b.conv", K::kConv2d)->qconfig, r);
  EXPECT_EQ(op(*model->b, "b", K::kRelu)->qconfig, r);
  // c: module name over regex and type, inherited by c.conv.
  EXPECT_EQ(op(*model->c, "c.conv", K::kConv2d)->qconfig, n);
  EXPECT_EQ(op(*model->c, "c", K::kAdd)->qconfig, n);
  // c.sub: its own entry beats its parent's.
  EXPECT_EQ(op(*model->c->sub, "c.sub.conv", K::kConv2d)->qconfig, n2);
  EXPECT_EQ(op(*model->c->sub, "c.sub", K::kRelu)->qconfig, n2);
  // d: global.
  EXPECT_EQ(op(*model->d, "d.fc", K::kLinear)->qconfig, g);
  EXPECT_EQ(op(*model, "", K::kAdd)->qconfig, g);
  // The observers follow the qconfigs.
  EXPECT_EQ(output_observer_kind(*op(*model->a, "a.conv", K::kConv2d)), ObserverKind::kMovingAverageMinMax);
  EXPECT_EQ(output_observer_kind(*op(*model->b, "b.conv", K::kConv2d)), ObserverKind::kPercentile);
  EXPECT_EQ(output_observer_kind(*op(*model->c, "c.conv", K::kConv2d)), ObserverKind::kEntropy);
  EXPECT_EQ(output_observer_kind(*op(*model->c->sub, "c.sub.conv", K::kConv2d)), ObserverKind::kMinMax);
  calibrate_convert_compare(20.0);
}

TEST(QConfigMappingLookup, ForModuleAndForOp) {
  QConfigPtr g = q_minmax(), t = q_mavg(), r = q_pct(), n = q_entropy(), f = q_minmax();
  QConfigMapping m;
  m.set_global(g).set_object_type("Conv2d", t).set_object_type(K::kAdd, f).set_module_name_regex("x\\.y", r);
  m.set_module_name("x.y.z", n).set_module_name("p", nullptr);
  EXPECT_EQ(m.for_module("Linear", "q"), g);
  EXPECT_EQ(m.for_module("Conv2d", "q.conv"), t);
  EXPECT_EQ(m.for_module("Conv2d", "x.y.conv"), r);
  EXPECT_EQ(m.for_module("Conv2d", "x.yy"), r);  // prefix match, like Python's re.match
  EXPECT_EQ(m.for_module("Conv2d", "ax.y"), t);  // anchored at the start
  EXPECT_EQ(m.for_module("Conv2d", "x.y.z"), n);
  EXPECT_EQ(m.for_module("Conv2d", "x.y.z.w.conv"), n);  // inherited from the parent name
  EXPECT_EQ(m.for_module("Conv2d", "p.conv"), nullptr);
  EXPECT_EQ(m.for_op(K::kAdd, "Block", "q"), f);
  EXPECT_EQ(m.for_op(K::kMul, "Block", "q"), g);
  EXPECT_EQ(m.for_op(K::kAdd, "Block", "x.y"), r);
  EXPECT_EQ(m.for_op(K::kAdd, "Block", "p"), nullptr);
  // Setting an entry twice replaces it.
  m.set_object_type("Conv2d", g);
  EXPECT_EQ(m.for_module("Conv2d", "q.conv"), g);
  EXPECT_THROW_MSG(m.set_module_name_regex("(", g), ValueError, "is not a valid regular expression");
  EXPECT_THROW_MSG(m.set_object_type(std::string(), g), ValueError, "module type name is empty");
  EXPECT_THROW_MSG(default_qconfig_mapping("tpu"), ValueError, "unknown backend \"tpu\"");
}

TEST(QConfigMappingValidate, RejectsUnknownModuleNames) {
  auto model = std::make_shared<Net>();
  QConfigMapping mapping = default_qconfig_mapping();
  mapping.set_module_name("c.sub", nullptr).set_module_name("nope", nullptr).set_module_name("c.missing", nullptr);
  EXPECT_THROW_MSG(mapping.validate(*model), ValueError, "\"nope\", \"c.missing\"");
  EXPECT_THROW_MSG(mapping.validate(*model), ValueError, "that do not exist in the model (Net)");
  // prepare validates before touching the model.
  EXPECT_THROW_MSG(prepare(*model, {randn({1, 4, 6, 6}, 1)}, mapping), ValueError, "\"nope\"");
  EXPECT_FALSE(is_prepared(*model));
  EXPECT_EQ(quant_state_of(*model->c), nullptr);
  QConfigMapping ok = default_qconfig_mapping();
  ok.set_module_name("c.sub", nullptr).set_module_name("", q_minmax());
  ok.validate(*model);  // "" is the root itself
}

// set_module_type_object_type: a functional op inside modules of one class. It wins over the op's
// own entry and the module class's; module names and regexes win over it.
TEST(QConfigMappingLookup, ModuleTypeObjectType) {
  QConfigPtr g = q_minmax(), t = q_mavg(), r = q_pct(), f = q_entropy();
  QConfigMapping m;
  m.set_global(g).set_object_type(K::kMul, f).set_object_type("Cell", t);
  m.set_module_type_object_type("Cell", K::kMul, nullptr).set_module_type_object_type("Cell", K::kTanh, r);
  EXPECT_EQ(m.for_op(K::kMul, "Cell", "rnn"), nullptr);    // beats set_object_type(kMul) and ("Cell")
  EXPECT_EQ(m.for_op(K::kTanh, "Cell", "rnn"), r);
  EXPECT_EQ(m.for_op(K::kAdd, "Cell", "rnn"), t);          // other ops in Cell: the class's entry
  EXPECT_EQ(m.for_op(K::kMul, "Block", "b"), f);           // mul elsewhere: the op's entry
  EXPECT_EQ(m.for_module("Cell", "rnn"), t);               // the module call itself is not an op
  m.set_module_name("rnn", g);
  EXPECT_EQ(m.for_op(K::kMul, "Cell", "rnn"), g);          // a module name beats it
  m.set_module_name_regex("rn.", f);
  EXPECT_EQ(m.for_op(K::kMul, "Cell", "rnx"), f);          // so does a regex
  // Setting it again replaces it; the typed form names the class as set_object_type<> does.
  m.set_module_type_object_type("Cell", K::kTanh, g);
  EXPECT_EQ(m.for_op(K::kTanh, "Cell", "x"), g);
  m.set_module_type_object_type<nn::GRU>(K::kAdd, r);
  EXPECT_EQ(m.for_op(K::kAdd, "GRU", "gru"), r);
  EXPECT_NE(m.to_string().find("module_type_object_type[Cell, mul]=None"), std::string::npos) << m.to_string();
  EXPECT_THROW_MSG(m.set_module_type_object_type("", K::kAdd, g), ValueError,
                   "set_module_type_object_type: module type name is empty");
  EXPECT_THROW_MSG(m.set_module_type_object_type("Cell", K::kNumOpKinds, g), ValueError, "invalid op kind");
}

TEST(QConfigMappingLookup, DefaultKeepsTheGateArithmeticOfGruAndLstmFp32) {
  const QConfigMapping m = default_qconfig_mapping("onednn");
  for (const char* rnn : {"GRU", "LSTM"}) {
    for (K gate : {K::kAdd, K::kSub, K::kMul, K::kSigmoid, K::kTanh}) {
      EXPECT_EQ(m.for_op(gate, rnn, "rnn"), nullptr) << rnn << " " << op_name(gate);
      EXPECT_NE(m.for_op(gate, "Cell", "cell"), nullptr) << "a hand-written cell's " << op_name(gate);
    }
    EXPECT_NE(m.for_op(K::kLinear, rnn, "rnn"), nullptr) << rnn << "'s products";
  }
}

// PyTorch 1.13 FX fixes softmax's output range for the nn.Softmax module only; a functional
// softmax's output is observed. sigmoid / tanh / hardsigmoid are fixed in both forms.
TEST(QConfigMappingLookup, DefaultFixesTheSoftmaxLayerAndObservesTheFunctionalSoftmax) {
  const QConfigMapping m = default_qconfig_mapping("onednn");
  const QConfigPtr functional = m.for_op(K::kSoftmax, "Block", "b");
  ASSERT_NE(functional, nullptr);
  EXPECT_EQ(functional->activation.kind, ObserverKind::kHistogram);
  const QConfigPtr layer = m.for_module("Softmax", "b.softmax");
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(layer->activation.kind, ObserverKind::kFixedQParams);
  EXPECT_FLOAT_EQ(layer->activation.fixed_scale, 1.f / 256.f);
  for (K k : {K::kSigmoid, K::kTanh, K::kHardsigmoid}) {
    EXPECT_EQ(m.for_op(k, "Block", "b")->activation.kind, ObserverKind::kFixedQParams) << op_name(k);
  }
  EXPECT_EQ(m.for_module("Sigmoid", "b.s")->activation.kind, ObserverKind::kFixedQParams);
}

struct SoftmaxBoth : nn::CallableModule<SoftmaxBoth> {
  SoftmaxBoth() {
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(8, 8));
    sm = register_module("sm", std::make_shared<nn::SoftmaxImpl>(-1));
    out = register_module("out", std::make_shared<nn::LinearImpl>(8, 4));
  }
  Tensor forward(const Tensor& x) {
    const Tensor h = (*fc)(x);
    return (*out)(softmax(h, -1)) + (*out)((*sm)(h));
  }
  std::shared_ptr<nn::LinearImpl> fc, out;
  std::shared_ptr<nn::SoftmaxImpl> sm;
};

TEST(DefaultMapping, FunctionalSoftmaxObservedSoftmaxLayerFixedAsPyTorchFx) {
  manual_seed(3);
  SoftmaxBoth m;
  m.eval();
  prepare(m, {randn({4, 8}, 1)});
  for (uint64_t s = 0; s < 3; ++s) m(randn({4, 8}, 10 + s) * 3.0);
  convert(m);
  int functional = 0, layer = 0;
  for (const QuantizedOpInfo& op : quantized_ops(m)) {
    if (op.kind != K::kSoftmax) continue;
    ASSERT_NE(op.output_qparams, nullptr) << op.fqn;
    if (op.fqn == "sm") {
      ++layer;
      EXPECT_FLOAT_EQ(op.output_qparams->scale(), 1.f / 256.f);
    } else {
      ++functional;
      EXPECT_NE(op.output_qparams->scale(), 1.f / 256.f) << "an observed range, not the fixed one";
    }
    EXPECT_EQ(op.output_qparams->zero_point(), 0) << op.fqn;
  }
  EXPECT_EQ(functional, 1);
  EXPECT_EQ(layer, 1);
}

TEST(QConfigMappingJson, ModuleTypeObjectTypesNeedVersion3) {
  QConfigMapping m;
  m.set_global(q_minmax()).set_module_type_object_type("Cell", K::kMul, nullptr);
  m.set_module_type_object_type("Cell", K::kSigmoid, q_pct());
  const std::string text = qconfig_mapping_to_json(m);
  nlohmann::json doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc.at("version"), 3);
  ASSERT_EQ(doc.at("module_type_object_types").size(), 2u);
  const QConfigMapping back = qconfig_mapping_from_json(text, "v3");
  EXPECT_EQ(back.to_string(), m.to_string());
  EXPECT_EQ(qconfig_mapping_to_json(back), text);
  EXPECT_EQ(back.for_op(K::kMul, "Cell", "c"), nullptr);
  // The default mapping round-trips too.
  const QConfigMapping d = default_qconfig_mapping("onednn");
  EXPECT_EQ(qconfig_mapping_from_json(qconfig_mapping_to_json(d), "d").to_string(), d.to_string());
  doc["version"] = 2;  // a version 2 reader would drop them: refused
  EXPECT_THROW_MSG(qconfig_mapping_from_json(doc.dump(), "w.json"), FileFormatError,
                   "qconfig mapping w.json has module_type_object_types, which need version 3, but says version 2");
  doc = nlohmann::json::parse(text);
  doc["module_type_object_types"][0]["op"] = "mull";
  EXPECT_THROW_MSG(qconfig_mapping_from_json(doc.dump(), "w.json"), FileFormatError,
                   "unknown op \"mull\" in module_type_object_types");
}

// A user module's class is named with its Impl suffix: an entry written after the holder's name
// would match nothing, which validate refuses (as for set_object_type).
struct CellImpl : nn::Module {
  Tensor forward(const Tensor& x) { return x * 2.0; }
};
DBRQ_MODULE(Cell);

struct HasCell : nn::CallableModule<HasCell> {
  HasCell() { cell = register_module("cell", Cell()); }
  Tensor forward(const Tensor& x) { return cell(x); }
  Cell cell{nullptr};
};

TEST(QConfigMappingValidate, ModuleTypeObjectTypeByHolderNameIsRefused) {
  HasCell model;
  QConfigMapping m = default_qconfig_mapping();
  m.set_module_type_object_type("Cell", K::kMul, nullptr);
  EXPECT_THROW_MSG(m.validate(model), ValueError,
                   "set_module_type_object_type(\"Cell\", mul) matches no module of the model (HasCell), which has "
                   "modules of class CellImpl");
  QConfigMapping ok = default_qconfig_mapping();
  ok.set_module_type_object_type<Cell>(K::kMul, nullptr);
  ok.validate(model);
  prepare(model, {randn({2, 3}, 1)}, ok);
  EXPECT_TRUE(seen_kinds(state_of(*model.cell.ptr())).empty()) << "the mul in CellImpl stays fp32";
}

}  // namespace
}  // namespace dbrq
