// Wrong values after convert that came from the int8 program's structure, not from a kernel
// (found by a read-only review, confirmed by these tests failing before their fixes):
//  - an op with a scalar operand as the base of a fused chain (`relu(conv(x) + 0.5)`): its kernel
//    has no post-ops, and the relu was dropped;
//  - cat of a fixed-range output (sigmoid) with another tensor: the inputs' ranges were united,
//    the other tensor clipped to sigmoid's [0, 1) (inputs all with one kind of range, two
//    sigmoids, stay united: exact);
//  - a scalar op whose codes stay the same (`x * 2`) returned its input's storage under new
//    parameters, so an in-place op on the result wrote into the input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using Conv2d = nn::Conv2dImpl;
using testing::sqnr_of;

// fp32 reference, then prepared on the first batch, calibrated on all, converted.
template <typename M>
std::vector<Tensor> fp32_then_convert(M& m, const std::vector<Tensor>& xs) {
  std::vector<Tensor> want;
  for (const Tensor& x : xs) want.push_back(m(x));
  prepare(m, {xs[0]});
  for (const Tensor& x : xs) m(x);
  convert(m);
  return want;
}

float min_of(const Tensor& t) {
  const std::vector<float> v = t.contiguous().to_vector<float>();
  return *std::min_element(v.begin(), v.end());
}

struct ScalarAddRelu : nn::CallableModule<ScalarAddRelu> {
  ScalarAddRelu() { conv = register_module("conv", std::make_shared<Conv2d>(3, 8, 3, 1, 1)); }
  Tensor forward(const Tensor& x) { return relu((*conv)(x) + 0.5); }
  std::shared_ptr<Conv2d> conv;
};

// The same across a module boundary: the child returns conv(x) + 0.5, the parent applies relu.
struct AddsScalar : nn::CallableModule<AddsScalar> {
  AddsScalar() { conv = register_module("conv", std::make_shared<Conv2d>(3, 8, 3, 1, 1)); }
  Tensor forward(const Tensor& x) { return (*conv)(x) * 1.0 + 0.5; }
  std::shared_ptr<Conv2d> conv;
};
struct ReluOfChild : nn::CallableModule<ReluOfChild> {
  ReluOfChild() { child = register_module("child", std::make_shared<AddsScalar>()); }
  Tensor forward(const Tensor& x) { return relu((*child)(x)); }
  std::shared_ptr<AddsScalar> child;
};

template <typename M>
void expect_relu_kept(const std::string& what) {
  manual_seed(90);
  M m;
  const auto xs = testing::random_batches(4, 91, {2, 3, 8, 8});
  const std::vector<Tensor> want = fp32_then_convert(m, xs);
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor got = m(xs[i]);
    EXPECT_GE(min_of(got), 0.0f) << what << ": the relu was dropped";
    EXPECT_GT(sqnr_of(want[i], got), 25.0) << what;
  }
}

TEST(ScalarOpChain, TheReluAfterAScalarAddIsKept) {
  expect_relu_kept<ScalarAddRelu>("relu(conv(x) + 0.5)");
  expect_relu_kept<ReluOfChild>("a child's conv(x) + 0.5, the parent's relu");
}

struct CatWithSigmoid : nn::CallableModule<CatWithSigmoid> {
  explicit CatWithSigmoid(bool sigmoid_first) : sigmoid_first_(sigmoid_first) {
    a = register_module("a", std::make_shared<Conv2d>(3, 4, 1));
    b = register_module("b", std::make_shared<Conv2d>(3, 4, 1));
  }
  Tensor forward(const Tensor& x) {
    const Tensor s = sigmoid((*a)(x)), y = (*b)(x);
    return sigmoid_first_ ? cat({s, y}, 1) : cat({y, s}, 1);
  }
  bool sigmoid_first_;
  std::shared_ptr<Conv2d> a, b;
};

// The model's input (fp32) next to a sigmoid output.
struct CatInputWithSigmoid : nn::CallableModule<CatInputWithSigmoid> {
  CatInputWithSigmoid() { a = register_module("a", std::make_shared<Conv2d>(3, 4, 1)); }
  Tensor forward(const Tensor& x) { return cat({x * 3.0, sigmoid((*a)(x))}, 1); }
  std::shared_ptr<Conv2d> a;
};

template <typename M>
void expect_cat_keeps_each_range(M& m, int64_t other_at, int64_t other_channels, const std::string& what) {
  const auto xs = testing::random_batches(4, 92, {2, 3, 8, 8});
  const std::vector<Tensor> want = fp32_then_convert(m, xs);
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor got = m(xs[i]);
    const Tensor other = got.narrow(1, other_at, other_channels).contiguous();
    const Tensor other_want = want[i].narrow(1, other_at, other_channels).contiguous();
    EXPECT_LT(min_of(other), -0.5f) << what << ": the other input was clipped to the sigmoid's [0, 1)";
    EXPECT_GT(sqnr_of(other_want, other), 25.0) << what;
    EXPECT_GT(sqnr_of(want[i], got), 25.0) << what;
  }
}

TEST(CatOfAFixedRange, EachInputKeepsItsRange) {
  manual_seed(93);
  CatWithSigmoid first(true);
  expect_cat_keeps_each_range(first, 4, 4, "cat({sigmoid(a(x)), b(x)})");
  manual_seed(93);
  CatWithSigmoid second(false);
  expect_cat_keeps_each_range(second, 0, 4, "cat({b(x), sigmoid(a(x))})");
  manual_seed(93);
  CatInputWithSigmoid input;
  expect_cat_keeps_each_range(input, 0, 3, "cat({x * 3, sigmoid(a(x))})");
}

struct ScaledThenReluInPlace : nn::CallableModule<ScaledThenReluInPlace> {
  ScaledThenReluInPlace() { conv = register_module("conv", std::make_shared<Conv2d>(3, 8, 3, 1, 1)); }
  Tensor forward(const Tensor& in) {
    const Tensor x = (*conv)(in);
    Tensor y = x * 2.0;
    y.relu_();
    return x + y;  // negative where x is
  }
  std::shared_ptr<Conv2d> conv;
};

TEST(ScalarOpResult, AnInPlaceOpOnItLeavesItsInputAlone) {
  manual_seed(94);
  ScaledThenReluInPlace m;
  const auto xs = testing::random_batches(4, 95, {2, 3, 8, 8});
  const std::vector<Tensor> want = fp32_then_convert(m, xs);
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor got = m(xs[i]);
    ASSERT_LT(min_of(want[i]), -0.5f);
    EXPECT_LT(min_of(got), -0.5f) << "x was rectified through y's storage";
    EXPECT_GT(sqnr_of(want[i], got), 25.0);
  }
}

}  // namespace
}  // namespace dbrq

namespace dbrq {
namespace {

// Two sigmoid outputs: one kind of range, united as they are; the cat passes the codes on (its
// output on sigmoid's 1/256 grid, within half a step of the fp32 values), not requantized into a
// calibrated range that could clip confidences near 1.
struct CatOfSigmoids : nn::CallableModule<CatOfSigmoids> {
  CatOfSigmoids() {
    a = register_module("a", std::make_shared<nn::Conv2dImpl>(3, 4, 1));
    b = register_module("b", std::make_shared<nn::Conv2dImpl>(3, 4, 1));
  }
  Tensor forward(const Tensor& x) { return cat({sigmoid((*a)(x) * 3.0), sigmoid((*b)(x))}, 1); }
  std::shared_ptr<nn::Conv2dImpl> a, b;
};

TEST(CatOfAFixedRange, InputsWithOneKindOfRangeStayUnited) {
  manual_seed(96);
  CatOfSigmoids m;
  const auto xs = testing::random_batches(3, 97, {2, 3, 6, 6});
  const std::vector<Tensor> want = fp32_then_convert(m, xs);
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::vector<float> got = m(xs[i]).contiguous().to_vector<float>();
    const std::vector<float> ref = want[i].contiguous().to_vector<float>();
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_NEAR(got[k] * 256.0f, std::nearbyint(got[k] * 256.0f), 1e-3) << "not on the 1/256 grid at " << k;
      ASSERT_NEAR(got[k], ref[k], 4.0 / 256) << k;  // (the conv output before each sigmoid is int8)
    }
  }
}

// observe_once takes each tensor once per call; a narrower view of the same storage at the same
// offset is another tensor (its observation was skipped: the range saw 2 of 10 values).
TEST(ObserveOnce, ANarrowerViewOfTheSameStorageIsAnotherTensor) {
  ObserverSlot slot;
  slot.observer = make_observer(ObserverSpec::min_max());
  Tensor t = arange(10);
  t.set_trace_id(7);  // an op's result
  Tensor head = t.narrow(0, 0, 2);
  head.set_trace_id(7);
  slot.observe_once(head, 1, /*consumer=*/1);
  slot.observe_once(t, 1, /*consumer=*/2);
  EXPECT_EQ(slot.observer->max_val(), 9.0f);
  // The same tensor again: by another consumer, taken once unless its values changed; by the same
  // consumer (a loop's next iteration, maybe refilled through a pointer no version sees), observed
  // again.
  t.raw_mutable_data<float>()[9] = 20.0f;  // (bumps the version: write through the pointer taken before)
  float* p = t.raw_mutable_data<float>();
  p[9] = 30.0f;
  const Tensor same = t;
  slot.observe_once(same, 1, /*consumer=*/3);
  EXPECT_EQ(slot.observer->max_val(), 30.0f);  // a new version
  const int64_t batches = slot.observer->stats().num_batches;
  slot.observe_once(same, 1, /*consumer=*/4);  // another consumer, the same values: taken once
  EXPECT_EQ(slot.observer->stats().num_batches, batches);
  slot.observe_once(same, 1, /*consumer=*/4);  // the same consumer again: observed
  EXPECT_EQ(slot.observer->stats().num_batches, batches + 1);
  p[9] = 40.0f;  // no version moves, but the values changed
  slot.observe_once(same, 1, /*consumer=*/5);
  EXPECT_EQ(slot.observer->max_val(), 40.0f);  // another consumer observes them too
}

}  // namespace
}  // namespace dbrq

namespace dbrq {
namespace {

// An additive causal mask of 0 / -inf before softmax (GPT-2 style attention). Observers skip
// infinities, so the mask's range was [0, 0] and quantizing clamped -inf to 0.0: after convert
// every query attended to every key, with no error. The add and the softmax now run fp32 (they
// saw infinities on every call); the projections and matmuls stay int8.
struct MaskedAttention : nn::CallableModule<MaskedAttention> {
  explicit MaskedAttention(bool use_where = false) : use_where(use_where) {
    q = register_module("q", std::make_shared<nn::LinearImpl>(16, 16));
    k = register_module("k", std::make_shared<nn::LinearImpl>(16, 16));
    v = register_module("v", std::make_shared<nn::LinearImpl>(16, 16));
  }
  // mask: 0 where a key is visible; added to the scores, or with use_where the value a masked
  // score takes (where(mask, mask, s): nonzero is true).
  Tensor forward(const Tensor& x, const Tensor& mask) {
    const Tensor s = matmul((*q)(x), (*k)(x).transpose(-1, -2)) * 0.25;
    const Tensor masked = use_where ? where(mask, mask, s) : s + mask;
    return matmul(softmax(masked, -1), (*v)(x));
  }
  bool use_where;
  std::shared_ptr<nn::LinearImpl> q, k, v;
};

// A causal mask: -inf, or a finite stand-in (-1e9, -1e4, the lowest float) as many ports write it.
// Observers skip infinities; a finite stand-in widens the range so far that int8 gives the scores
// no codes. Either way the mask must stay a mask after convert.
struct MaskCase {
  const char* name;
  float value;
  bool use_where;
};

void PrintTo(const MaskCase& c, std::ostream* os) { *os << c.name; }

class MaskedScores : public ::testing::TestWithParam<MaskCase> {};

TEST_P(MaskedScores, StayMaskedAfterConvert) {
  const int64_t t = 6;
  std::vector<float> m(static_cast<size_t>(t * t), 0.f);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = i + 1; j < t; ++j) m[static_cast<size_t>(i * t + j)] = GetParam().value;
  }
  const Tensor mask = from_vector<float>(m, {t, t});
  manual_seed(21);
  MaskedAttention ref(GetParam().use_where);
  manual_seed(21);
  MaskedAttention att(GetParam().use_where);
  const auto xs = testing::random_batches(4, 22, {2, t, 16});
  prepare(att, {xs[0], mask});
  for (const Tensor& x : xs) att(x, mask);
  // The deploy flow: a parameters-only file (no statistics) must carry the mark too. (where
  // runs fp32 and reads no observed mask; the softmax after it sees only what where wrote.)
  const std::string path = testing::temp_file("masked_attention.qstate.json");
  save_quant_state(att, path);
  if (!GetParam().use_where) {
    EXPECT_NE(testing::read_text(path).find("\"infinities\": true"), std::string::npos);
  }
  // A file with statistics keeps the count of masked tensors the observers saw.
  const std::string stats_path = testing::temp_file("masked_attention_stats.qstate.json");
  save_quant_state(att, stats_path, SaveQuantStateOptions{true});
  manual_seed(21);
  MaskedAttention reloaded(GetParam().use_where);
  prepare(reloaded, {xs[0], mask});
  load_quant_state(reloaded, stats_path);
  ModelQuantState &ms = model_quant_state(att), &mr = model_quant_state(reloaded);
  ASSERT_EQ(ms.num_slots(), mr.num_slots());
  for (int i = 0; i < static_cast<int>(ms.num_slots()); ++i) {
    if (ms.slot(i).observer == nullptr) continue;
    EXPECT_EQ(ms.slot(i).observer->mask_count(), mr.slot(i).observer->mask_count()) << "slot " << i;
  }
  manual_seed(21);
  MaskedAttention deployed(GetParam().use_where);
  prepare(deployed, {xs[0], mask});
  load_quant_state(deployed, path);
  convert(deployed);
  convert(att);
  for (const Tensor& x : xs) {
    const Tensor want = ref(x, mask), got = att(x, mask);
    // Row 0 attends to key 0 alone: its output is v(x)[0] in fp32, and so it must stay.
    EXPECT_GT(sqnr_of(want.select(1, 0), got.select(1, 0)), 25.0) << "row 0 attended to masked keys";
    EXPECT_GT(sqnr_of(want, got), 25.0);
    testing::expect_equal(deployed(x, mask), got, "loaded from a parameters-only file");
  }
  EXPECT_EQ(uncalibrated_ops(att), 0);
  // What runs int8: the three projections and the two matmuls, not the mask's op or the softmax.
  int int8 = 0;
  for (const SeenOpInfo& op : testing::state_of(att).seen_ops()) {
    if (op.executor == nullptr || op.role == QuantRole::kNone) continue;
    if (op.kind == OpKind::kAdd || op.kind == OpKind::kSoftmax || op.kind == OpKind::kWhere) {
      EXPECT_TRUE(op.executor->fp32) << op_name(op.kind);
    } else if (op.kind == OpKind::kLinear || op.kind == OpKind::kMatmul) {
      EXPECT_FALSE(op.executor->fp32) << op_name(op.kind);
      int8 += op.executor->fp32 ? 0 : 1;
    }
  }
  EXPECT_EQ(int8, 5);
}

INSTANTIATE_TEST_SUITE_P(
    Masks, MaskedScores,
    ::testing::Values(MaskCase{"MinusInf", -INFINITY, false}, MaskCase{"MinusOneE9", -1e9f, false},
                      MaskCase{"MinusOneE4", -1e4f, false},
                      MaskCase{"Lowest", std::numeric_limits<float>::lowest(), false},
                      MaskCase{"WhereMinusOneE9", -1e9f, true}, MaskCase{"WhereMinusInf", -INFINITY, true}),
    [](const ::testing::TestParamInfo<MaskCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace dbrq
