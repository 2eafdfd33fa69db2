// Observers when a fused chain breaks after calibration has started (reliability review, 25 Nov).
// Calibration first records conv -> relu fused: the chain's one output observer sees relu's
// output, and nothing observes the conv's own output. A later calibrating call takes a path where
// the conv's output is also read elsewhere, so the chain can no longer fuse: the conv now runs on
// its own in int8, and its output needs parameters of its own, covering every value it produces
// on every calibrated path, not only on the calls after the break.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"
#include "tracer/internal.h"

namespace dbrq {
namespace {

using testing::sqnr_of;
using testing::state_of;

// Path A (mean > 0): head(relu(c(x))), conv + relu fuse. Path B (mean < 0): head(relu(y)) + y
// with y = c(x): the conv's output is also read by the add, so conv + relu cannot fuse any more.
struct BreaksFusion : nn::CallableModule<BreaksFusion> {
  BreaksFusion() {
    c = register_module("c", std::make_shared<nn::Conv2dImpl>(3, 8, 3, 1, 1));
    head = register_module("head", std::make_shared<nn::Conv2dImpl>(8, 8, 1));
  }
  Tensor forward(const Tensor& x) {
    const Tensor y = (*c)(x);
    const Tensor h = (*head)(relu(y));
    if (mean(x).item<float>() > 0) return h;
    return h + y;
  }
  std::shared_ptr<nn::Conv2dImpl> c, head;
};

// Path A inputs are large (|values| up to ~20), path B inputs small: the conv's output range on
// path A is many times that on path B.
Tensor path_a(uint64_t seed) { return randn({2, 3, 6, 6}, seed) * 6.0 + 1.0; }
Tensor path_b(uint64_t seed) { return randn({2, 3, 6, 6}, seed) * 0.3 - 0.5; }

const SeenOpInfo& conv_c(const nn::Module& m) {
  for (const SeenOpInfo& op : state_of(m).seen_ops()) {
    if (op.kind == OpKind::kConv2d && op.fqn == "c") return op;
  }
  throw std::runtime_error("no record of conv c");
}

// The fp32 range of c's output over the given inputs.
std::pair<float, float> conv_range(BreaksFusion& m, const std::vector<Tensor>& inputs) {
  float lo = 0.f, hi = 0.f;
  for (const Tensor& x : inputs) {
    const std::vector<float> v = testing::values((*m.c)(x));
    lo = std::min(lo, *std::min_element(v.begin(), v.end()));
    hi = std::max(hi, *std::max_element(v.begin(), v.end()));
  }
  return {lo, hi};
}

TEST(FusionBreak, TheConvsOwnObserverCoversTheCallsBeforeTheBreak) {
  manual_seed(3);
  BreaksFusion m;
  std::vector<Tensor> a, b;
  for (uint64_t i = 0; i < 4; ++i) a.push_back(path_a(10 + i));
  for (uint64_t i = 0; i < 3; ++i) b.push_back(path_b(20 + i));
  const auto [a_lo, a_hi] = conv_range(m, a);
  std::vector<Tensor> refs;
  for (const Tensor& x : a) refs.push_back(m(x));

  prepare(m, {a[0]});
  EXPECT_TRUE(conv_c(m).fusion.fused());
  for (const Tensor& x : a) m(x);  // path A calibrated: relu's output observed, fused
  for (const Tensor& x : b) m(x);  // path B: the chain breaks; its first call only records
  const SeenOpInfo& c = conv_c(m);
  ASSERT_FALSE(c.fusion.fused());
  ASSERT_GE(c.output_observer, 0);
  const Observer& obs = model_quant_state(m).observer(c.output_observer);
  // The conv's output on path A reached a_hi (and negative values down to a_lo): its observer must
  // have seen them, or convert clips path A's conv outputs to path B's range.
  EXPECT_GE(obs.max_val(), a_hi * 0.999f);
  EXPECT_LE(obs.min_val(), a_lo * 0.999f);

  convert(m);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_GT(sqnr_of(m(a[i]), refs[i]), 25.0) << "path A input " << i;
}


// The same break across a module boundary (docs/architecture.md, "Fusion across modules"): the
// conv + batch norm run in a child Sequential, the relu in the root. Path A: the relu is the
// batch norm's only reader, so the chain absorbs it and its output observer sees the relu's output.
// Path B: the root also adds the batch norm's output, so the relu no longer fuses and the batch
// norm's own output needs a range covering path A's negative values too.
struct BreaksCrossModuleFusion : nn::CallableModule<BreaksCrossModuleFusion> {
  BreaksCrossModuleFusion() {
    auto conv = std::make_shared<nn::Conv2dImpl>(3, 8, 3, 1, 1);
    bn = std::make_shared<nn::BatchNorm2dImpl>(8);
    testing::randomize_bn(*bn, 7);
    features = register_module("features", std::make_shared<nn::SequentialImpl>(conv, bn));
    head = register_module("head", std::make_shared<nn::Conv2dImpl>(8, 8, 1));
  }
  Tensor forward(const Tensor& x) {
    const Tensor y = (*features)(x);
    const Tensor h = (*head)(relu(y));
    if (mean(x).item<float>() > 0) return h;
    return h + y;
  }
  std::shared_ptr<nn::BatchNorm2dImpl> bn;
  std::shared_ptr<nn::SequentialImpl> features;
  std::shared_ptr<nn::Conv2dImpl> head;
};

TEST(FusionBreak, ACrossModuleFusionBrokenLaterKeepsTheCallsBeforeTheBreak) {
  manual_seed(4);
  BreaksCrossModuleFusion m;
  m.eval();
  std::vector<Tensor> a, b;
  for (uint64_t i = 0; i < 4; ++i) a.push_back(path_a(30 + i));
  for (uint64_t i = 0; i < 3; ++i) b.push_back(path_b(40 + i));
  float lo = 0.f, hi = 0.f;
  std::vector<Tensor> refs;
  for (const Tensor& x : a) {
    const std::vector<float> v = testing::values((*m.features)(x));
    lo = std::min(lo, *std::min_element(v.begin(), v.end()));
    hi = std::max(hi, *std::max_element(v.begin(), v.end()));
    refs.push_back(m(x));
  }
  ASSERT_LT(lo, -1.f);  // the relu removes something on path A

  prepare(m, {a[0]});
  for (const Tensor& x : a) m(x);
  const SeenOpInfo& bn_before = state_of(*m.features).seen_ops().back();
  EXPECT_GE(bn_before.absorbs, 0) << "path A alone fuses the root's relu into the child's chain";
  for (const Tensor& x : b) m(x);
  const SeenOpInfo& bn_rec = state_of(*m.features).seen_ops().back();
  ASSERT_LT(bn_rec.absorbs, 0) << "path B reads the batch norm's output twice: no fusion";
  ASSERT_GE(bn_rec.output_observer, 0);
  const Observer& obs = model_quant_state(m).observer(bn_rec.output_observer);
  EXPECT_GE(obs.max_val(), hi * 0.999f);
  EXPECT_LE(obs.min_val(), lo * 0.999f);

  convert(m);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_GT(sqnr_of(m(a[i]), refs[i]), 25.0) << "path A input " << i;
}

}  // namespace
}  // namespace dbrq
