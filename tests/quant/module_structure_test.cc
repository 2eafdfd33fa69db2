// Module structures prepare must handle: nested child modules (each non-leaf gets its own state and
// owns the ops it runs directly); a child returning a std::tuple of tensors; a child returning a
// non-tensor alongside a tensor (std::pair<Tensor, int>); ModuleList iteration in forward; a
// non-traceable child class and a non-traceable mid-level subtree, which stay fp32 (no state below
// them, their ops not recorded) inside a prepared, converted parent; and a child called twice
// during the trace, which validates its second call against its first record.
#include <gtest/gtest.h>

#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"
#include "tracer/interceptor.h"

namespace dbrq {
namespace {

using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;
using ModuleList = nn::ModuleListImpl;
using ReLU = nn::ReLUImpl;
using Sequential = nn::SequentialImpl;
using testing::expect_equal;
using testing::fed_roots;
using testing::observer_roots;
using testing::seen_kinds;
using testing::sqnr_of;
using testing::state_of;
using K = OpKind;

constexpr double kMinSqnrDb = 25.0;

template <typename M>
std::vector<Tensor> run_all(M& model, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> out;
  for (const Tensor& x : inputs) out.push_back(model(x));
  return out;
}

template <typename M>
void calibrate_convert_compare(M& model, const std::vector<Tensor>& inputs, const std::vector<Tensor>& refs) {
  run_all(model, inputs);
  convert(model);
  for (size_t i = 0; i < inputs.size(); ++i) EXPECT_GT(sqnr_of(model(inputs[i]), refs[i]), kMinSqnrDb) << i;
}

// ---------------------------------------------------------------------------------------------

struct Inner : nn::CallableModule<Inner> {
  Inner() { conv = register_module("conv", std::make_shared<Conv2d>(4, 4, 3, 1, 1)); }
  Tensor forward(const Tensor& x) { return relu((*conv)(x)); }
  std::shared_ptr<Conv2d> conv;
};

struct Mid : nn::CallableModule<Mid> {
  Mid() {
    inner = register_module("inner", std::make_shared<Inner>());
    conv = register_module("conv", std::make_shared<Conv2d>(4, 4, 1));
  }
  Tensor forward(const Tensor& x) { return (*conv)((*inner)(x)) + x; }
  std::shared_ptr<Inner> inner;
  std::shared_ptr<Conv2d> conv;
};

struct Nested : nn::CallableModule<Nested> {
  Nested() {
    stem = register_module("stem", std::make_shared<Conv2d>(3, 4, 3, 1, 1));
    mid = register_module("mid", std::make_shared<Mid>());
  }
  Tensor forward(const Tensor& x) { return (*mid)((*stem)(x)); }
  std::shared_ptr<Conv2d> stem;
  std::shared_ptr<Mid> mid;
};

TEST(ModuleStructure, NestedChildrenEachOwnTheirOps) {
  manual_seed(1);
  auto model = std::make_shared<Nested>();
  const auto inputs = testing::random_batches(3, 10, {2, 3, 8, 8});
  const auto refs = run_all(*model, inputs);
  prepare(*model, {inputs[0]});
  AutoQuantizationState& root = state_of(*model);
  AutoQuantizationState& mid = state_of(*model->mid);
  AutoQuantizationState& inner = state_of(*model->mid->inner);
  EXPECT_EQ(root.fqn(), "");
  EXPECT_EQ(mid.fqn(), "mid");
  EXPECT_EQ(inner.fqn(), "mid.inner");
  EXPECT_EQ(inner.type_name(), "Inner");
  // Leaves get no state of their own.
  EXPECT_EQ(quant_state_of(*model->stem), nullptr);
  EXPECT_NE(dynamic_cast<LeafQuantInfo*>(model->mid->inner->conv->extension()), nullptr);
  EXPECT_EQ(dynamic_cast<LeafQuantInfo*>(model->mid->inner->conv->extension())->fqn(), "mid.inner.conv");

  EXPECT_EQ(seen_kinds(root), std::vector<OpKind>{K::kConv2d});
  EXPECT_EQ(seen_kinds(mid), (std::vector<OpKind>{K::kConv2d, K::kAdd}));
  EXPECT_EQ(seen_kinds(inner), (std::vector<OpKind>{K::kConv2d, K::kRelu}));
  EXPECT_EQ(inner.seen_ops()[0].fqn, "mid.inner.conv");
  EXPECT_EQ(inner.seen_ops()[1].fqn, "mid.inner");  // functional relu: the enclosing module
  EXPECT_EQ(mid.seen_ops()[0].fqn, "mid.conv");
  EXPECT_EQ(mid.seen_ops()[1].fqn, "mid");
  EXPECT_EQ(inner.seen_ops()[0].display_kind(), "conv2d+relu");
  // mid.conv + x: a conv2d+add chain inside mid; the residual x is the stem's output.
  EXPECT_EQ(mid.seen_ops()[0].display_kind(), "conv2d+add");
  EXPECT_EQ(mid.seen_ops()[1].fusion.residual_input, 1);
  // Tensors flow across module boundaries by id: mid's input is the stem's output (u8, observed by
  // the stem), so no module re-observes it.
  EXPECT_EQ(inner.seen_ops()[0].inputs[0].id, root.seen_ops()[0].outputs[0].id);
  EXPECT_EQ(inner.seen_ops()[0].input_observers, std::vector<int>{-1});
  EXPECT_EQ(mid.seen_ops()[1].inputs[1].id, root.seen_ops()[0].outputs[0].id);
  ModelQuantState& m = model_quant_state(*model);
  EXPECT_EQ(m.states().size(), 3u);
  EXPECT_EQ(observer_roots(m).size(), 4u);  // x, stem out, inner chain out, mid chain out
  EXPECT_EQ(fed_roots(m), observer_roots(m));
  calibrate_convert_compare(*model, inputs, refs);
}

// ---------------------------------------------------------------------------------------------

struct TwoHeads : nn::CallableModule<TwoHeads> {
  TwoHeads() {
    a = register_module("a", std::make_shared<Conv2d>(3, 4, 3, 1, 1));
    b = register_module("b", std::make_shared<Conv2d>(3, 4, 1));
  }
  std::tuple<Tensor, Tensor> forward(const Tensor& x) { return std::make_tuple((*a)(x), (*b)(x)); }
  std::shared_ptr<Conv2d> a, b;
};

struct TupleUser : nn::CallableModule<TupleUser> {
  TupleUser() { heads = register_module("heads", std::make_shared<TwoHeads>()); }
  Tensor forward(const Tensor& x) {
    auto [p, q] = (*heads)(x);
    return p + q;
  }
  std::shared_ptr<TwoHeads> heads;
};

TEST(ModuleStructure, ChildReturningATuple) {
  manual_seed(2);
  auto model = std::make_shared<TupleUser>();
  const auto inputs = testing::random_batches(3, 20, {2, 3, 8, 8});
  const auto refs = run_all(*model, inputs);
  prepare(*model, {inputs[0]});
  AutoQuantizationState& heads = state_of(*model->heads);
  AutoQuantizationState& root = state_of(*model);
  ASSERT_EQ(seen_kinds(heads), (std::vector<OpKind>{K::kConv2d, K::kConv2d}));
  ASSERT_EQ(seen_kinds(root), std::vector<OpKind>{K::kAdd});
  // make_tuple's arguments run in an unspecified order: find each head's op by its fqn.
  const SeenOpInfo* a = nullptr;
  const SeenOpInfo* b = nullptr;
  for (const SeenOpInfo& o : heads.seen_ops()) (o.fqn == "heads.a" ? a : b) = &o;
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->fqn, "heads.b");
  // Both tuple elements reach the parent's add as u8 tensors with their own observers; fusion
  // never crosses a module boundary.
  const SeenOpInfo& add = root.seen_ops()[0];
  EXPECT_FALSE(add.fusion.fused());
  EXPECT_FALSE(a->fusion.fused());
  EXPECT_FALSE(b->fusion.fused());
  EXPECT_EQ(add.inputs[0].id, a->outputs[0].id);
  EXPECT_EQ(add.inputs[1].id, b->outputs[0].id);
  EXPECT_EQ(add.input_observers, (std::vector<int>{-1, -1}));
  EXPECT_GE(add.output_observer, 0);
  calibrate_convert_compare(*model, inputs, refs);
}

struct WithCount : nn::CallableModule<WithCount> {
  WithCount() { conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1)); }
  std::pair<Tensor, int> forward(const Tensor& x) { return {(*conv)(x), 3}; }
  std::shared_ptr<Conv2d> conv;
};

struct CountUser : nn::CallableModule<CountUser> {
  CountUser() {
    child = register_module("child", std::make_shared<WithCount>());
    fc = register_module("fc", std::make_shared<Conv2d>(4, 2, 1));
  }
  Tensor forward(const Tensor& x) {
    auto [y, n] = (*child)(x);
    for (int i = 0; i < n; ++i) y = y * 0.75;
    return (*fc)(y);
  }
  std::shared_ptr<WithCount> child;
  std::shared_ptr<Conv2d> fc;
};

TEST(ModuleStructure, ChildReturningANonTensorAlongsideATensor) {
  manual_seed(3);
  auto model = std::make_shared<CountUser>();
  const auto inputs = testing::random_batches(3, 30, {2, 3, 8, 8});
  const auto refs = run_all(*model, inputs);
  prepare(*model, {inputs[0]});
  EXPECT_EQ(seen_kinds(state_of(*model->child)), std::vector<OpKind>{K::kConv2d});
  // The loop folds: the first mul reads the child's output, every later one the mul's own.
  EXPECT_EQ(seen_kinds(state_of(*model)), (std::vector<OpKind>{K::kMul, K::kMul, K::kConv2d}));
  // The first mul keeps u8 with parameters derived from the conv's. The folded mul reads both the
  // first mul's output and its own (parameters derived from its own would change every
  // iteration), so it runs fp32 and fc observes its input.
  const auto& ops = state_of(*model).seen_ops();
  EXPECT_EQ(ops[0].role, QuantRole::kBinary);
  EXPECT_EQ(ops[0].output_observer, -1);
  EXPECT_EQ(ops[1].inputs[0].num_origins(), 2u);
  EXPECT_EQ(ops[1].role, QuantRole::kNone);
  EXPECT_GE(ops[2].input_observers[0], 0);
  calibrate_convert_compare(*model, inputs, refs);
}

struct ListModel : nn::CallableModule<ListModel> {
  ListModel() {
    layers = register_module("layers", std::make_shared<ModuleList>(std::vector<std::shared_ptr<nn::Module>>{
                                           std::make_shared<Conv2d>(3, 4, 3, 1, 1), std::make_shared<ReLU>(),
                                           std::make_shared<Conv2d>(4, 4, 3, 1, 1), std::make_shared<ReLU>()}));
  }
  Tensor forward(Tensor x) {
    for (const auto& layer : *layers) x = layer->forward_unary(x);
    return x;
  }
  std::shared_ptr<ModuleList> layers;
};

TEST(ModuleStructure, ModuleListIteration) {
  manual_seed(4);
  auto model = std::make_shared<ListModel>();
  const auto inputs = testing::random_batches(3, 40, {2, 3, 8, 8});
  const auto refs = run_all(*model, inputs);
  prepare(*model, {inputs[0]});
  AutoQuantizationState& root = state_of(*model);
  ASSERT_EQ(seen_kinds(root), (std::vector<OpKind>{K::kConv2d, K::kRelu, K::kConv2d, K::kRelu}));
  EXPECT_EQ(root.seen_ops()[0].fqn, "layers.0");
  EXPECT_EQ(root.seen_ops()[3].fqn, "layers.3");
  EXPECT_EQ(root.seen_ops()[0].display_kind(), "conv2d+relu");
  EXPECT_EQ(root.seen_ops()[2].display_kind(), "conv2d+relu");
  // The list itself is never called: its state records nothing.
  AutoQuantizationState* list_state = quant_state_of(*model->layers);
  if (list_state != nullptr) {
    EXPECT_TRUE(list_state->seen_ops().empty());
  }
  EXPECT_EQ(observer_roots(model_quant_state(*model)).size(), 3u);
  calibrate_convert_compare(*model, inputs, refs);
}

// ---------------------------------------------------------------------------------------------

// Custom code the tracer must not look into.
struct Opaque : nn::CallableModule<Opaque> {
  Opaque() {
    conv = register_module("conv", std::make_shared<Conv2d>(4, 4, 3, 1, 1));
    sub = register_module("sub", std::make_shared<Inner>());
  }
  Tensor forward(const Tensor& x) {
    EXPECT_FALSE(x.is_quantized()) << "a non-traceable module must receive fp32 inputs";
    Tensor y = (*sub)((*conv)(x));
    return y * 0.5 + sigmoid(x);
  }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<Inner> sub;
};

struct WithOpaque : nn::CallableModule<WithOpaque> {
  WithOpaque() {
    stem = register_module("stem", std::make_shared<Conv2d>(3, 4, 3, 1, 1));
    opaque = register_module("opaque", std::make_shared<Opaque>());
    head = register_module("head", std::make_shared<Conv2d>(4, 2, 1));
  }
  Tensor forward(const Tensor& x) { return (*head)((*opaque)(relu((*stem)(x)))); }
  std::shared_ptr<Conv2d> stem;
  std::shared_ptr<Opaque> opaque;
  std::shared_ptr<Conv2d> head;
};

void expect_untouched_subtree(nn::Module& m, const std::string& fqn) {
  auto* marker = dynamic_cast<tracer::NonTraceableInfo*>(m.extension());
  ASSERT_NE(marker, nullptr) << fqn;
  EXPECT_EQ(marker->fqn(), fqn);
  EXPECT_EQ(quant_state_of(m), nullptr);
  for (auto& [name, child] : m.named_modules("", /*include_self=*/false)) {
    EXPECT_EQ(child->extension(), nullptr) << fqn << "." << name;
    EXPECT_EQ(child->interceptor(), nullptr) << fqn << "." << name;
  }
}

TEST(ModuleStructure, NonTraceableChildClassStaysFp32) {
  manual_seed(5);
  auto model = std::make_shared<WithOpaque>();
  const auto inputs = testing::random_batches(3, 50, {2, 3, 8, 8});
  const auto refs = run_all(*model, inputs);
  PrepareOptions options;
  options.non_traceable_module_classes = {"Opaque"};
  prepare(*model, {inputs[0]}, default_qconfig_mapping(), BackendConfig::onednn(), options);
  expect_untouched_subtree(*model->opaque, "opaque");
  AutoQuantizationState& root = state_of(*model);
  // Only the parent's own ops: the opaque conv, relu, mul and sigmoid are not recorded anywhere.
  ASSERT_EQ(seen_kinds(root), (std::vector<OpKind>{K::kConv2d, K::kRelu, K::kConv2d}));
  EXPECT_EQ(root.seen_ops()[2].fqn, "head");
  EXPECT_TRUE(root.non_quant_ops().empty());
  ModelQuantState& m = model_quant_state(*model);
  EXPECT_EQ(m.states().size(), 1u);
  // The head's input comes out of the fp32 region: it needs its own observer.
  EXPECT_GE(root.seen_ops()[2].input_observers[0], 0);
  EXPECT_EQ(root.seen_ops()[2].inputs[0].inf_dtype, DType::kU8);
  // With observers off the prepared model computes exactly fp32; calibrating computes as PyTorch
  // FX's prepared model (its order of sums), within float rounding of it.
  disable_observers(*model);
  for (size_t i = 0; i < inputs.size(); ++i) expect_equal((*model)(inputs[i]), refs[i]);
  enable_observers(*model);
  for (size_t i = 0; i < inputs.size(); ++i) testing::expect_close((*model)(inputs[i]), refs[i], 1e-5);
  convert(*model);
  EXPECT_TRUE(is_converted(*model));
  for (size_t i = 0; i < inputs.size(); ++i) EXPECT_GT(sqnr_of((*model)(inputs[i]), refs[i]), kMinSqnrDb);
  // Called on its own after convert, the opaque module is still plain fp32.
  const Tensor mid = randn({1, 4, 6, 6}, 99);
  const Tensor y = (*model->opaque)(mid);
  EXPECT_FALSE(y.is_quantized());
}

struct Deep : nn::CallableModule<Deep> {
  Deep() {
    body = register_module("body", std::make_shared<Sequential>(std::vector<std::shared_ptr<nn::Module>>{
                                       std::make_shared<Conv2d>(3, 4, 3, 1, 1), std::make_shared<Mid>(),
                                       std::make_shared<Conv2d>(4, 3, 1)}));
  }
  Tensor forward(const Tensor& x) { return (*body)(x); }
  std::shared_ptr<Sequential> body;
};

TEST(ModuleStructure, NonTraceableMidLevelSubtreeStaysFp32) {
  manual_seed(6);
  auto model = std::make_shared<Deep>();
  const auto inputs = testing::random_batches(3, 60, {2, 3, 8, 8});
  const auto refs = run_all(*model, inputs);
  PrepareOptions options;
  options.non_traceable_module_names = {"body.1"};
  prepare(*model, {inputs[0]}, default_qconfig_mapping(), BackendConfig::onednn(), options);
  expect_untouched_subtree(*model->body->operator[](1), "body.1");
  AutoQuantizationState& body = state_of(*model->body);
  ASSERT_EQ(seen_kinds(body), (std::vector<OpKind>{K::kConv2d, K::kConv2d}));
  EXPECT_EQ(body.seen_ops()[0].fqn, "body.0");
  EXPECT_EQ(body.seen_ops()[1].fqn, "body.2");
  EXPECT_GE(body.seen_ops()[1].input_observers[0], 0);
  EXPECT_EQ(model_quant_state(*model).states().size(), 2u);  // "" and "body"
  calibrate_convert_compare(*model, inputs, refs);
}

TEST(ModuleStructure, NonTraceableNameMustExist) {
  auto model = std::make_shared<Deep>();
  PrepareOptions options;
  options.non_traceable_module_names = {"body.7"};
  EXPECT_THROW_MSG(
      prepare(*model, {randn({1, 3, 8, 8}, 1)}, default_qconfig_mapping(), BackendConfig::onednn(), options),
      ValueError, "non-traceable module \"body.7\" does not exist");
  EXPECT_FALSE(is_prepared(*model));
}

// ---------------------------------------------------------------------------------------------

struct Unit : nn::CallableModule<Unit> {
  Unit() { conv = register_module("conv", std::make_shared<Conv2d>(4, 4, 3, 1, 1)); }
  Tensor forward(const Tensor& x) {
    ++calls;
    Tensor y = (*conv)(x);
    if (alternate && calls % 2 == 0) return y;  // every other call skips the relu
    return relu(y);
  }
  std::shared_ptr<Conv2d> conv;
  bool alternate = false;
  int calls = 0;
};

struct SharedTwice : nn::CallableModule<SharedTwice> {
  SharedTwice() {
    stem = register_module("stem", std::make_shared<Conv2d>(3, 4, 1));
    unit = register_module("unit", std::make_shared<Unit>());
  }
  Tensor forward(const Tensor& x) { return (*unit)((*unit)((*stem)(x))); }
  std::shared_ptr<Conv2d> stem;
  std::shared_ptr<Unit> unit;
};

TEST(ModuleStructure, ChildCalledTwiceDuringTraceKeepsOneRecord) {
  manual_seed(7);
  auto model = std::make_shared<SharedTwice>();
  const auto inputs = testing::random_batches(3, 70, {2, 3, 8, 8});
  const auto refs = run_all(*model, inputs);
  prepare(*model, {inputs[0]});
  AutoQuantizationState& unit = state_of(*model->unit);
  // Recorded on the first call; the second call validated against it and added nothing.
  ASSERT_EQ(seen_kinds(unit), (std::vector<OpKind>{K::kConv2d, K::kRelu}));
  EXPECT_EQ(unit.seen_ops()[0].display_kind(), "conv2d+relu");
  EXPECT_TRUE(unit.recorded());
  ModelQuantState& m = model_quant_state(*model);
  const int out_slot = unit.seen_ops()[1].output_observer;
  ASSERT_GE(out_slot, 0);
  (*model)(inputs[1]);
  // Both calls feed the same observer.
  EXPECT_EQ(m.observer(out_slot).num_batches(), 2);
  calibrate_convert_compare(*model, inputs, refs);
}

// A child running different ops on its two calls: the second call's ops are a second path of the
// child (with strict_control_flow, prepare fails instead).
TEST(ModuleStructure, ChildCalledTwiceDifferentlyDuringTraceRecordsBothPaths) {
  manual_seed(8);
  auto model = std::make_shared<SharedTwice>();
  model->unit->alternate = true;
  const Tensor x = randn({1, 3, 8, 8}, 80);
  const Tensor ref = (*model)(x);
  model->unit->calls = 0;
  prepare(*model, {x});
  AutoQuantizationState& unit = state_of(*model->unit);
  EXPECT_EQ(unit.paths().size(), 2u);
  disable_observers(*model);  // exactly fp32 (calibrating calls sum in PyTorch's order)
  expect_equal((*model)(x), ref);
}

TEST(ModuleStructure, ChildCalledTwiceDifferentlyDuringStrictTraceFailsPrepare) {
  manual_seed(8);
  auto model = std::make_shared<SharedTwice>();
  model->unit->alternate = true;
  const Tensor x = randn({1, 3, 8, 8}, 80);
  const Tensor ref = (*model)(x);
  model->unit->calls = 0;
  PrepareOptions strict;
  strict.strict_control_flow = true;
  // Second call of "unit" during the trace runs 1 of the 2 ops its first call recorded.
  EXPECT_THROW_MSG(prepare(*model, {x}, default_qconfig_mapping(), BackendConfig::onednn(), strict), ControlFlowError,
                   "control flow changed in module \"unit\" (Unit)");
  EXPECT_FALSE(is_prepared(*model));
  EXPECT_EQ(quant_state_of(*model->unit), nullptr);
  // The model still works, in fp32.
  model->unit->calls = 0;
  expect_equal((*model)(x), ref);
}

}  // namespace
}  // namespace dbrq
