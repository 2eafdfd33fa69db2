// Which weights a converted op runs with. A converted conv / linear quantizes and packs its weights
// once; every later call must still compute with the weights it is handed. These cases used to give
// wrong results without an error:
//   - two views of one parameter (a packed qkv weight sliced with narrow, an expert picked with
//     select) in functional calls on the same input were recorded as one op, and after convert
//     every view ran with the first view's weights;
//   - a weight or bias computed at run time (a scale applied per call, a low-rank update) ran with
//     the value it had on its first call;
//   - a batch norm folded into a conv kept its statistics from convert time after load_state_dict.
// Each case compares the converted model with the fp32 model given the same weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using testing::read_text;
using testing::sqnr_of;
using testing::temp_file;
using testing::write_text;

// Random batches, then the batch the test evaluates (so no input value lies outside the range).
template <typename M>
void calibrate(M& m, const Tensor& x, int n, uint64_t seed) {
  testing::calibrate(m, std::vector<int64_t>(x.sizes().begin(), x.sizes().end()), n, seed);
  m(x);
}

// int8 vs fp32 on the same weights: well above this when right; a wrong weight gives about 0 dB.
constexpr double kMinSqnr = 25.0;

// ---- two views of one parameter ----

// q and k from one packed [2d, in] weight and [2d] bias, as a fused qkv projection is often stored.
// (k takes the last 8 rows of the weight, which has 16 unless told.)
struct PackedProjection : nn::CallableModule<PackedProjection> {
  explicit PackedProjection(int64_t rows = 16) {
    w = register_parameter("w", randn({rows, 8}, 1));
    b = register_parameter("b", randn({16}, 2));
  }
  Tensor forward(const Tensor& x) {
    const Tensor q = linear(x, w.narrow(0, 0, 8), b.narrow(0, 0, 8));
    const Tensor k = linear(x, w.narrow(0, w.size(0) - 8, 8), b.narrow(0, 8, 8));
    return cat({q, k}, 1);
  }
  Tensor w, b;
};

TEST(WeightIdentity, TwoViewsOfOnePackedParameterRunWithTheirOwnRows) {
  PackedProjection ref, m;
  const Tensor x = randn({4, 8}, 3);
  const Tensor expected = ref(x);
  prepare(m, {x});
  // Two linear records: one per view.
  const std::vector<OpKind> kinds = testing::seen_kinds(testing::state_of(m));
  EXPECT_EQ(std::count(kinds.begin(), kinds.end(), OpKind::kLinear), 2);
  calibrate(m, x, 4, 10);
  convert(m);
  const Tensor y = m(x);
  EXPECT_GT(sqnr_of(y.narrow(1, 0, 8).contiguous(), expected.narrow(1, 0, 8).contiguous()), kMinSqnr) << "q";
  EXPECT_GT(sqnr_of(y.narrow(1, 8, 8).contiguous(), expected.narrow(1, 8, 8).contiguous()), kMinSqnr) << "k";
}

// A loop over experts stored in one [n, out, in] parameter: each iteration's select is another view.
struct Experts : nn::CallableModule<Experts> {
  Experts() { w = register_parameter("w", randn({3, 6, 6}, 4)); }
  Tensor forward(const Tensor& x) {
    Tensor h = x;
    for (int64_t i = 0; i < w.size(0); ++i) h = relu(linear(h, w.select(0, i)));
    return h;
  }
  Tensor w;
};

TEST(WeightIdentity, ALoopOverSelectedExpertsRunsEachExpertsWeights) {
  Experts ref, m;
  const Tensor x = randn({5, 6}, 5);
  const Tensor expected = ref(x);
  prepare(m, {x});
  calibrate(m, x, 4, 20);
  convert(m);
  EXPECT_GT(sqnr_of(m(x), expected), kMinSqnr);
}

// ---- weights and biases computed at run time ----

// The weight is scaled per call by a value the model holds (a temperature, a LoRA scale).
struct ScaledLinear : nn::CallableModule<ScaledLinear> {
  ScaledLinear() {
    w = register_parameter("w", randn({6, 8}, 6));
    b = register_parameter("b", randn({6}, 7));
  }
  Tensor forward(const Tensor& x) { return linear(x, w * weight_scale, b * bias_scale); }
  Tensor w, b;
  double weight_scale = 1.0;
  double bias_scale = 1.0;
};

TEST(WeightIdentity, AComputedWeightThatChangesAfterConvertIsUsed) {
  ScaledLinear ref, m;
  const Tensor x = randn({4, 8}, 8);
  prepare(m, {x});
  calibrate(m, x, 4, 30);
  convert(m);
  EXPECT_GT(sqnr_of(m(x), ref(x)), kMinSqnr) << "as calibrated";
  // Output range shrinks with the weights: the int8 output keeps its calibrated scale, so the
  // result stays close, never the old weights' values.
  ref.weight_scale = m.weight_scale = 0.5;
  EXPECT_GT(sqnr_of(m(x), ref(x)), 20.0) << "weights halved";
  ref.weight_scale = m.weight_scale = -1.0;
  EXPECT_GT(sqnr_of(m(x), ref(x)), 15.0) << "weights negated";
}

TEST(WeightIdentity, AComputedBiasThatChangesAfterConvertIsUsed) {
  ScaledLinear ref, m;
  const Tensor x = randn({4, 8}, 9);
  prepare(m, {x});
  calibrate(m, x, 4, 40);
  convert(m);
  ref.bias_scale = m.bias_scale = -1.0;
  EXPECT_GT(sqnr_of(m(x), ref(x)), 20.0) << "bias negated";
}

// ---- parameters replaced after convert (load_state_dict) ----

struct ConvBn : nn::CallableModule<ConvBn> {
  ConvBn() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(3, 4, 3, 1, 1));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2dImpl>(4));
    testing::randomize_bn(*bn, 3);
  }
  Tensor forward(const Tensor& x) { return relu((*bn)((*conv)(x))); }
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<nn::BatchNorm2dImpl> bn;
};

TEST(WeightIdentity, NewBatchNormStatisticsAfterConvertReachTheFoldedConv) {
  manual_seed(11);
  ConvBn m;
  m.eval();
  const Tensor x = randn({2, 3, 8, 8}, 12);
  prepare(m, {x});
  calibrate(m, x, 4, 50);
  convert(m);
  // Other statistics, of the same magnitude: the output range stays within the calibrated one.
  manual_seed(11);
  ConvBn ref;
  ref.eval();
  testing::randomize_bn(*ref.bn, 4);
  NamedTensors bn_state;
  for (const auto& [name, t] : ref.state_dict()) {
    if (name.rfind("bn.", 0) == 0) bn_state.emplace_back(name, t.clone());
  }
  m.load_state_dict(bn_state, /*strict=*/false);
  EXPECT_GT(sqnr_of(m(x), ref(x)), 20.0);
}

TEST(WeightIdentity, NewConvWeightsAfterConvertAreUsed) {
  manual_seed(13);
  ConvBn m;
  m.eval();
  const Tensor x = randn({2, 3, 8, 8}, 14);
  prepare(m, {x});
  calibrate(m, x, 4, 60);
  convert(m);
  manual_seed(13);
  ConvBn ref;
  ref.eval();
  NamedTensors conv_state = {{"conv.weight", ref.conv->weight * -1.0}};
  ref.load_state_dict(conv_state, /*strict=*/false);
  m.load_state_dict(conv_state, /*strict=*/false);
  EXPECT_GT(sqnr_of(m(x), ref(x)), 15.0);
}

// Two weights computed from two parameters, on the same input: each call runs with its own.
struct TwoComputed : nn::CallableModule<TwoComputed> {
  TwoComputed() {
    w1 = register_parameter("w1", randn({5, 8}, 15));
    w2 = register_parameter("w2", randn({5, 8}, 16));
  }
  Tensor forward(const Tensor& x) { return cat({linear(x, w1 * 2.0), linear(x, w2 * 2.0)}, 1); }
  Tensor w1, w2;
};

TEST(WeightIdentity, TwoComputedWeightsOnOneInputRunWithTheirOwnValues) {
  TwoComputed ref, m;
  const Tensor x = randn({4, 8}, 17);
  prepare(m, {x});
  calibrate(m, x, 4, 70);
  convert(m);
  const Tensor y = m(x), expected = ref(x);
  EXPECT_GT(sqnr_of(y.narrow(1, 0, 5).contiguous(), expected.narrow(1, 0, 5).contiguous()), kMinSqnr);
  EXPECT_GT(sqnr_of(y.narrow(1, 5, 5).contiguous(), expected.narrow(1, 5, 5).contiguous()), kMinSqnr);
}

// ---- parts of parameters in quant-state files ----

TEST(WeightIdentity, PartsOfAParameterRoundTripThroughAQuantStateFile) {
  PackedProjection a, b;
  const Tensor x = randn({4, 8}, 18);
  prepare(a, {x});
  calibrate(a, x, 4, 80);
  const std::string path = temp_file("packed.qstate.json");
  save_quant_state(a, path);
  const std::string text = read_text(path);
  EXPECT_NE(text.find("\"of\": \"w\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"offset\": 64"), std::string::npos) << "k's rows start at row 8 of 8 columns";
  prepare(b, {x});
  load_quant_state(b, path);
  // The loaded records hold b's rows 0-7 and 8-15 (a wrong part would still compute right after
  // convert, rebuilt from the call's weights, so the geometry is checked here).
  std::vector<int64_t> offsets;
  for (const SeenOpInfo& op : testing::state_of(b).seen_ops()) {
    if (op.kind != OpKind::kLinear) continue;
    ASSERT_TRUE(op.weights[0].has_view);
    EXPECT_EQ(op.weights[0].tensor.storage(), b.w.storage());
    offsets.push_back(op.weights[0].tensor.storage_offset());
    testing::expect_equal(op.weights[0].tensor, b.w.narrow(0, op.weights[0].tensor.storage_offset() / 8, 8));
  }
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 64}));
  convert(a);
  convert(b);
  for (uint64_t seed : {19, 20}) {
    const Tensor xi = randn({3, 8}, seed);
    testing::expect_equal(b(xi), a(xi), "loaded vs calibrated");
  }
}

TEST(WeightIdentity, AFileWhosePartLiesOutsideTheParameterIsRefused) {
  PackedProjection a, b;
  const Tensor x = randn({4, 8}, 21);
  prepare(a, {x});
  calibrate(a, x, 2, 90);
  const std::string path = temp_file("packed_bad.qstate.json");
  save_quant_state(a, path);
  std::string text = read_text(path);
  // The same code on a parameter of 12 rows: the file's k (rows 8 to 15) does not fit.
  PackedProjection shorter(12);
  shorter.eval();
  prepare(shorter, {x});
  EXPECT_THROW_MSG(load_quant_state(shorter, path), StateMismatchError,
                   "its part of \"w\" (offset 64, sizes [8, 8]) lies outside the model's parameter of sizes [12, 8]");
  // An edited part (a stride added) fails the record's check.
  const size_t at = text.find("\"strides\": [");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, std::string("\"strides\": [").size(), "\"strides\": [3, ");
  write_text(path, text);
  prepare(b, {x});
  EXPECT_THROW_MSG(load_quant_state(b, path), FileFormatError, "module \"\" op 2 fails its check");
}

// ---- batch norm statistics that are not the model's own tensors ----

// A functional batch norm after a conv: on the module's buffers it folds into the conv's weights;
// on a statistic computed per call it never folds and runs on the call's values.
struct FunctionalBn : nn::CallableModule<FunctionalBn> {
  FunctionalBn() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(3, 4, 3, 1, 1));
    mean = register_buffer("mean", randn({4}, 31) * 0.1);
    var = register_buffer("var", rand_uniform({4}, 0.5, 2.0, 32));
  }
  Tensor forward(const Tensor& x) {
    const Tensor y = (*conv)(x);
    return relu(batch_norm(y, mean, computed ? var * var_scale : var));
  }
  std::shared_ptr<nn::Conv2dImpl> conv;
  Tensor mean, var;
  bool computed = false;
  double var_scale = 1.0;
};

// Replacing a statistic with a new tensor (not a write into the buffer) after convert: the folded
// weights cannot know; the call is refused, not run with the old statistics. A layer's member
// (BatchNorm2d::running_var) is checked by the fused batch norm; a functional op's statistic is
// part of the op's identity, so a replaced one is another op, which the fused chain cannot run.
TEST(WeightIdentity, AReplacedStatisticOfAFoldedBatchNormIsRefused) {
  manual_seed(33);
  ConvBn m;
  m.eval();
  const Tensor x = randn({2, 3, 8, 8}, 34);
  prepare(m, {x});
  EXPECT_EQ(testing::display_kinds(testing::state_of(m))[0], "conv2d+batch_norm+relu") << "folded";
  calibrate(m, x, 4, 100);
  convert(m);
  manual_seed(33);
  ConvBn ref;
  ref.eval();
  EXPECT_GT(sqnr_of(m(x), ref(x)), kMinSqnr);
  const Tensor var = m.bn->running_var;
  m.bn->running_var = var * 4.0;  // a new tensor: the folded weights hold the old statistics
  EXPECT_THROW_MSG(m(x), ControlFlowError,
                   "is another tensor than the one folded into the weights at convert, with other values");
  // The same values in another tensor are fine (a statistic computed the same way on every call).
  m.bn->running_var = var.clone();
  EXPECT_GT(sqnr_of(m(x), ref(x)), kMinSqnr);

  manual_seed(39);
  FunctionalBn f;
  f.eval();
  prepare(f, {x});
  EXPECT_EQ(testing::display_kinds(testing::state_of(f))[0], "conv2d+batch_norm+relu") << "folded";
  calibrate(f, x, 2, 130);
  convert(f);
  f.var = f.var * 4.0;
  EXPECT_THROW_MSG(f(x), ControlFlowError, "has no output of its own; calibrate this path before convert");
}

TEST(WeightIdentity, AComputedStatisticDoesNotFoldAndIsFollowed) {
  manual_seed(35);
  FunctionalBn m;
  m.eval();
  manual_seed(35);
  FunctionalBn ref;
  ref.eval();
  m.computed = ref.computed = true;
  const Tensor x = randn({2, 3, 6, 6}, 36);
  prepare(m, {x});
  for (const std::string& k : testing::display_kinds(testing::state_of(m))) {
    EXPECT_EQ(k.find("conv2d+batch_norm"), std::string::npos) << k;
  }
  calibrate(m, x, 4, 110);
  convert(m);
  EXPECT_GT(sqnr_of(m(x), ref(x)), kMinSqnr);
  m.var_scale = ref.var_scale = 1.5;
  EXPECT_GT(sqnr_of(m(x), ref(x)), 20.0);
}

// A child registers a part of its parent's parameter (q_w = qkv_w.narrow(0, 0, d)): a functional
// op on another part of the parent's parameter is named after the parent's, and the quant-state
// file loads into a fresh copy.
struct Child : nn::CallableModule<Child> {
  explicit Child(const Tensor& q) { q_w = register_parameter("q_w", q); }
  Tensor forward(const Tensor& x) { return linear(x, q_w); }
  Tensor q_w;
};

struct Parent : nn::CallableModule<Parent> {
  Parent() {
    qkv_w = register_parameter("qkv_w", randn({12, 6}, 37));
    child = register_module("child", std::make_shared<Child>(qkv_w.narrow(0, 0, 4)));
  }
  Tensor forward(const Tensor& x) { return cat({(*child)(x), linear(x, qkv_w.narrow(0, 4, 4))}, 1); }
  Tensor qkv_w;
  std::shared_ptr<Child> child;
};

TEST(WeightIdentity, APartOfAParameterAChildAlsoRegistersRoundTrips) {
  Parent a, b;
  const Tensor x = randn({3, 6}, 38);
  prepare(a, {x});
  calibrate(a, x, 3, 120);
  const std::string path = temp_file("parent.qstate.json");
  save_quant_state(a, path);
  EXPECT_NE(read_text(path).find("\"of\": \"qkv_w\""), std::string::npos) << read_text(path);
  prepare(b, {x});
  load_quant_state(b, path);
  // The loaded record holds the same part of b's parameter.
  const AutoQuantizationState& sb = testing::state_of(b);
  bool found = false;
  for (const SeenOpInfo& op : sb.seen_ops()) {
    if (op.kind != OpKind::kLinear) continue;
    found = true;
    ASSERT_TRUE(op.weights[0].has_view);
    EXPECT_EQ(op.weights[0].tensor.storage(), b.qkv_w.storage());
    EXPECT_EQ(op.weights[0].tensor.storage_offset(), 24);
    testing::expect_equal(op.weights[0].tensor, b.qkv_w.narrow(0, 4, 4), "the loaded part");
  }
  EXPECT_TRUE(found);
  convert(a);
  convert(b);
  testing::expect_equal(b(x), a(x), "loaded vs calibrated");
}

}  // namespace
}  // namespace dbrq
