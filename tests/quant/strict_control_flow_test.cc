// PrepareOptions::strict_control_flow: one fixed op sequence per module, as dbrq required before
// paths. A forward whose branch flag (a member) selects which quantizeable op runs: flipping the
// flag so a different op runs raises ControlFlowError naming the module fqn, the op index, the
// recorded op and the op seen; running fewer quantizeable ops than
// recorded is caught at the module's exit; data-dependent branches over non-quantizeable ops are
// fine. After the error the model is still usable (restore the flag and call again), both while
// calibrating and after convert, and a parent that catches its child's error keeps its own state.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using Conv2d = nn::Conv2dImpl;
using testing::expect_equal;
using testing::sqnr_of;
using testing::state_of;

PrepareOptions strict() {
  PrepareOptions o;
  o.strict_control_flow = true;
  return o;
}

struct Branchy : nn::CallableModule<Branchy> {
  enum Mode { kConv1, kConv2, kSkipSecond, kSigmoidInsteadOfRelu };
  Branchy() {
    conv1 = register_module("conv1", std::make_shared<Conv2d>(4, 4, 3, 1, 1));
    conv2 = register_module("conv2", std::make_shared<Conv2d>(4, 4, 3, 1, 1));
    head = register_module("head", std::make_shared<Conv2d>(4, 4, 1));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = mode == kConv2 ? (*conv2)(x) : (*conv1)(x);
    if (mode == kSkipSecond) return y;
    y = mode == kSigmoidInsteadOfRelu ? sigmoid(y) : relu(y);
    return (*head)(y);
  }
  Mode mode = kConv1;
  std::shared_ptr<Conv2d> conv1, conv2, head;
};

struct Net : nn::CallableModule<Net> {
  Net() {
    stem = register_module("stem", std::make_shared<Conv2d>(3, 4, 1));
    branchy = register_module("branchy", std::make_shared<Branchy>());
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*branchy)((*stem)(x));
    // Data-dependent control flow over non-quantizeable ops only: always allowed. After convert the
    // activations are int8, so reading a value takes an explicit dequantize.
    const Tensor f = y.is_quantized() ? y.dequantize() : y;
    if (f.at<float>({0, 0, 0, 0}) > 0.f) y = y - 1.0;
    return y;
  }
  std::shared_ptr<Conv2d> stem;
  std::shared_ptr<Branchy> branchy;
};

class ControlFlowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manual_seed(3);
    model = std::make_shared<Net>();
    for (int i = 0; i < 3; ++i) inputs.push_back(randn({2, 3, 6, 6}, 40 + i));
    for (const Tensor& x : inputs) refs.push_back((*model)(x));
    prepare(*model, {inputs[0]}, default_qconfig_mapping(), BackendConfig::onednn(), strict());
    // A calibrating call computes as PyTorch FX's prepared model (docs/observers.md), a few ulps
    // from the fp32 model: what a calibrating call returns, from an identical twin.
    manual_seed(3);
    auto twin = std::make_shared<Net>();
    prepare(*twin, {inputs[0]}, default_qconfig_mapping(), BackendConfig::onednn(), strict());
    for (const Tensor& x : inputs) calib_refs.push_back((*twin)(x));
  }
  void expect_still_usable(bool converted) {
    model->branchy->mode = Branchy::kConv1;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor y = (*model)(inputs[i]);
      if (converted) {
        EXPECT_GT(sqnr_of(y, refs[i]), 25.0) << i;
      } else {
        expect_equal(y, calib_refs[i], "after the error");
      }
    }
  }
  std::shared_ptr<Net> model;
  std::vector<Tensor> inputs, refs, calib_refs;
};

TEST_F(ControlFlowTest, RecordedOps) {
  AutoQuantizationState& s = state_of(*model->branchy);
  ASSERT_EQ(s.seen_ops().size(), 3u);  // conv1+relu (fused), head
  EXPECT_EQ(s.seen_ops()[0].fqn, "branchy.conv1");
  EXPECT_EQ(s.seen_ops()[0].display_kind(), "conv2d+relu");
  EXPECT_EQ(s.seen_ops()[2].fqn, "branchy.head");
}

TEST_F(ControlFlowTest, DifferentLayerOfTheSameKind) {
  model->branchy->mode = Branchy::kConv2;
  EXPECT_THROW_MSG((*model)(inputs[1]), ControlFlowError,
                   "control flow changed in module \"branchy\" (Branchy): op 0 was recorded as conv2d (branchy.conv1) "
                   "but this run called conv2d (branchy.conv2)");
  expect_still_usable(false);
}

TEST_F(ControlFlowTest, DifferentOpKind) {
  model->branchy->mode = Branchy::kSigmoidInsteadOfRelu;
  EXPECT_THROW_MSG((*model)(inputs[1]), ControlFlowError,
                   "in module \"branchy\" (Branchy): op 1 was recorded as relu (branchy) but this run called sigmoid "
                   "(branchy)");
  expect_still_usable(false);
}

TEST_F(ControlFlowTest, FewerOpsThanRecorded) {
  model->branchy->mode = Branchy::kSkipSecond;
  EXPECT_THROW_MSG((*model)(inputs[1]), ControlFlowError,
                   "control flow changed in module \"branchy\" (Branchy): this call ran 1 of the 3 recorded "
                   "quantizeable ops; op 1 (relu (branchy)) did not run");
  expect_still_usable(false);
}

TEST_F(ControlFlowTest, ErrorDoesNotFeedObserversOfLaterOps) {
  ModelQuantState& m = model_quant_state(*model);
  const SeenOpInfo& head = state_of(*model->branchy).seen_ops()[2];
  model->branchy->mode = Branchy::kSigmoidInsteadOfRelu;
  EXPECT_THROW((*model)(inputs[1]), ControlFlowError);
  EXPECT_EQ(m.observer(head.output_observer).num_batches(), 0);
  expect_still_usable(false);
  EXPECT_EQ(m.observer(head.output_observer).num_batches(), 3);
}

TEST_F(ControlFlowTest, AfterConvert) {
  for (const Tensor& x : inputs) (*model)(x);
  convert(*model);
  expect_still_usable(true);
  for (auto mode : {Branchy::kConv2, Branchy::kSigmoidInsteadOfRelu, Branchy::kSkipSecond}) {
    SCOPED_TRACE(static_cast<int>(mode));
    model->branchy->mode = mode;
    EXPECT_THROW_MSG((*model)(inputs[1]), ControlFlowError, "control flow changed in module \"branchy\" (Branchy)");
    expect_still_usable(true);
  }
}

// The same checks at the root (fqn ""), with more ops than recorded.
struct RootBranch : nn::CallableModule<RootBranch> {
  RootBranch() { conv = register_module("conv", std::make_shared<Conv2d>(3, 3, 1)); }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    if (extra) y = (*conv)(y);
    return y;
  }
  bool extra = false;
  std::shared_ptr<Conv2d> conv;
};

TEST(ControlFlowRoot, MoreOpsThanRecorded) {
  auto model = std::make_shared<RootBranch>();
  const Tensor x = randn({1, 3, 4, 4}, 5);
  prepare(*model, {x}, default_qconfig_mapping(), BackendConfig::onednn(), strict());
  const Tensor ref = (*model)(x);  // a calibrating call
  model->extra = true;
  EXPECT_THROW_MSG((*model)(x), ControlFlowError,
                   "control flow changed in module \"\" (RootBranch): op 1 is conv2d (conv) but the first run "
                   "recorded only 1 quantizeable ops");
  model->extra = false;
  expect_equal((*model)(x), ref);
  (*model)(x);
  convert(*model);
  model->extra = true;
  EXPECT_THROW((*model)(x), ControlFlowError);
  model->extra = false;
  EXPECT_GT(sqnr_of((*model)(x), ref), 25.0);
}

// A parent that catches its child's ControlFlowError and carries on: the parent's own frame must
// survive the child's error, whether it was raised at an op (wrong op) or at the child's exit
// (fewer ops than recorded).
struct Catcher : nn::CallableModule<Catcher> {
  Catcher() {
    stem = register_module("stem", std::make_shared<Conv2d>(3, 4, 1));
    branchy = register_module("branchy", std::make_shared<Branchy>());
    tail = register_module("tail", std::make_shared<Conv2d>(4, 2, 1));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*stem)(x);
    try {
      y = (*branchy)(y);
    } catch (const ControlFlowError&) {
      ++caught;
    }
    return (*tail)(y);
  }
  int caught = 0;
  std::shared_ptr<Conv2d> stem, tail;
  std::shared_ptr<Branchy> branchy;
};

TEST(ControlFlowCaught, ParentCatchingAChildErrorKeepsItsOwnState) {
  manual_seed(6);
  auto model = std::make_shared<Catcher>();
  const Tensor x = randn({1, 3, 6, 6}, 7);
  prepare(*model, {x}, default_qconfig_mapping(), BackendConfig::onednn(), strict());
  AutoQuantizationState& root = state_of(*model);
  ASSERT_EQ(root.seen_ops().size(), 2u);  // stem, tail
  ModelQuantState& m = model_quant_state(*model);
  ASSERT_GE(root.seen_ops()[1].output_observer, 0);
  // The tail's output observer (its slot number may change when a call adds an edge: the stem's
  // output now reaches the tail directly, and analysis runs again).
  auto tail_batches = [&] { return m.observer(root.seen_ops()[1].output_observer).num_batches(); };
  for (auto mode : {Branchy::kSigmoidInsteadOfRelu, Branchy::kSkipSecond}) {
    SCOPED_TRACE(static_cast<int>(mode));
    const int64_t before = tail_batches();
    model->branchy->mode = mode;
    (*model)(x);  // must not throw: the parent handles the child's error
    model->branchy->mode = Branchy::kConv1;
    // The parent's tail op ran as the parent's seen op 1 (validated and observed).
    EXPECT_EQ(tail_batches(), before + 1);
    (*model)(x);
    EXPECT_EQ(tail_batches(), before + 2);
  }
  EXPECT_EQ(model->caught, 2);
}

}  // namespace
}  // namespace dbrq
