// The observer lifecycle of a prepared model: tracing (the example run) leaves every observer
// untouched; each calibration call updates every observer once; disable_observers stops updates
// and the prepared model then computes bit-identically what the fp32 model does; enable_observers
// resumes; convert uses only what was observed.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;
using testing::expect_equal;
using testing::fed_roots;
using testing::observer_roots;
using testing::randomize_bn;
using testing::state_of;

struct Block : nn::CallableModule<Block> {
  Block() {
    conv = register_module("conv", std::make_shared<Conv2d>(6, 6, 3, 1, 1));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(6));
    randomize_bn(*bn, 4);
  }
  Tensor forward(const Tensor& x) { return relu((*bn)((*conv)(x)) + x); }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
};

struct Net : nn::CallableModule<Net> {
  Net() {
    stem = register_module("stem", std::make_shared<Conv2d>(3, 6, 3, 1, 1));
    block = register_module("block", std::make_shared<Block>());
    fc = register_module("fc", std::make_shared<Linear>(6, 5));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*block)(relu((*stem)(x)));
    y = mean(y, {2, 3});
    return (*fc)(y)*2.0 + (*fc)(y);
  }
  std::shared_ptr<Conv2d> stem;
  std::shared_ptr<Block> block;
  std::shared_ptr<Linear> fc;
};

Tensor input(uint64_t seed) { return randn({2, 3, 8, 8}, seed); }

// The statistics of every observer, in slot order.
std::vector<Observer::Stats> snapshot(ModelQuantState& m) {
  std::vector<Observer::Stats> out;
  for (int r : observer_roots(m)) out.push_back(m.slot(r).observer->stats());
  return out;
}

void expect_same_stats(const std::vector<Observer::Stats>& a, const std::vector<Observer::Stats>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].num_batches, b[i].num_batches) << "observer " << i;
    ASSERT_EQ(a[i].fields.size(), b[i].fields.size());
    for (size_t f = 0; f < a[i].fields.size(); ++f) {
      EXPECT_EQ(a[i].fields[f].first, b[i].fields[f].first);
      EXPECT_EQ(a[i].fields[f].second, b[i].fields[f].second) << "observer " << i << " field " << a[i].fields[f].first;
    }
  }
}

class CalibrationTest : public ::testing::Test {
 protected:
  // The output observer of fc, which forward runs twice on the same input (one record).
  int fc_output_observer() {
    for (const SeenOpInfo& op : state_of(*model).seen_ops()) {
      if (op.fqn == "fc") return op.output_observer;
    }
    ADD_FAILURE() << "no fc record";
    return -1;
  }
  void SetUp() override {
    manual_seed(8);
    model = std::make_shared<Net>();
    model->eval();
    for (int i = 0; i < 3; ++i) refs.push_back((*model)(input(200 + i)));
    // An example far outside the calibration data: if the trace observed it, ranges would show it.
    prepare(*model, {input(1) * 100.0});
  }
  std::shared_ptr<Net> model;
  std::vector<Tensor> refs;
};

TEST_F(CalibrationTest, TracingLeavesEveryObserverUntouched) {
  ModelQuantState& m = model_quant_state(*model);
  ASSERT_GE(observer_roots(m).size(), 5u);
  for (int r : observer_roots(m)) {
    const Observer& o = *m.slot(r).observer;
    EXPECT_FALSE(o.has_data()) << "slot " << r;
    EXPECT_EQ(o.num_batches(), 0) << "slot " << r;
    EXPECT_NE(o.describe().find("[empty]"), std::string::npos) << o.describe();
  }
  // Every observer is fed by some seen op (none is dangling).
  EXPECT_EQ(fed_roots(m), observer_roots(m));
}

TEST_F(CalibrationTest, CalibrationUpdatesEveryObserverOncePerRunOfItsOp) {
  ModelQuantState& m = model_quant_state(*model);
  // fc runs twice per call on the same input (one record, one observer): its output observer sees
  // two batches per call, every other observer one.
  const int fc_out = m.find(fc_output_observer());
  ASSERT_GE(fc_out, 0);
  for (int call = 1; call <= 3; ++call) {
    (*model)(input(200 + call));
    for (int r : observer_roots(m)) {
      const Observer& o = *m.slot(r).observer;
      EXPECT_TRUE(o.has_data()) << "slot " << r;
      EXPECT_EQ(o.num_batches(), r == fc_out ? 2 * call : call) << "slot " << r << " (tensor t" << m.slot(r).tensor_id
                                                                  << ")";
    }
  }
  // The 100x example never reached an observer: the model input's range is that of N(0, 1) data.
  const SeenOpInfo& stem = state_of(*model).seen_ops()[0];
  ASSERT_GE(stem.input_observers[0], 0);
  EXPECT_LT(m.observer(stem.input_observers[0]).max_val(), 10.f);
  EXPECT_GT(m.observer(stem.input_observers[0]).min_val(), -10.f);
}

// Observing calls compute as PyTorch FX's prepared model does (batch norms folded, PyTorch's
// order of sums: docs/observers.md), within float rounding of fp32; with observers off, exactly
// fp32 (next test).
TEST_F(CalibrationTest, PreparedModelComputesFp32WithinRounding) {
  for (int i = 0; i < 3; ++i) {
    testing::expect_close((*model)(input(200 + i)), refs[i], 1e-5, "observing call " + std::to_string(i));
  }
}

TEST_F(CalibrationTest, DisableObserversStopsUpdatesAndIsBitIdenticalToFp32) {
  ModelQuantState& m = model_quant_state(*model);
  (*model)(input(300));
  const auto before = snapshot(m);
  disable_observers(*model);
  EXPECT_FALSE(m.observers_enabled());
  for (int i = 0; i < 3; ++i) {
    const Tensor y = (*model)(input(200 + i) * 5.0 - 1.0);  // data that would move every range
    (void)y;
    expect_equal((*model)(input(200 + i)), refs[i], "observers off, call " + std::to_string(i));
  }
  expect_same_stats(snapshot(m), before);

  enable_observers(*model);
  EXPECT_TRUE(m.observers_enabled());
  (*model)(input(400) * 5.0);
  const int fc_out = m.find(fc_output_observer());  // fc runs twice per call
  for (int r : observer_roots(m)) EXPECT_EQ(m.slot(r).observer->num_batches(), r == fc_out ? 4 : 2) << "slot " << r;
  const SeenOpInfo& stem = state_of(*model).seen_ops()[0];
  EXPECT_GT(m.observer(stem.input_observers[0]).max_val(), 10.f);  // the resumed call was recorded
}

TEST_F(CalibrationTest, ObserversOffBeforeAnyCalibrationThenConvertFails) {
  disable_observers(*model);
  (*model)(input(300));
  EXPECT_THROW_MSG(convert(*model), NotCalibratedError, "saw nothing");
  EXPECT_FALSE(is_converted(*model));
  enable_observers(*model);
  (*model)(input(300));
  convert(*model);
  EXPECT_TRUE(is_converted(*model));
  EXPECT_GT(testing::sqnr_of((*model)(input(200)), refs[0]), 25.0);
}

TEST_F(CalibrationTest, ConvertedParametersComeFromCalibrationOnly) {
  for (int i = 0; i < 4; ++i) (*model)(input(500 + i));
  convert(*model);
  ModelQuantState& m = model_quant_state(*model);
  const SeenOpInfo& stem = state_of(*model).seen_ops()[0];
  QuantParamsPtr qp = m.slot(stem.input_observers[0]).qparams;
  ASSERT_NE(qp, nullptr);
  // A range covering the 100x example would need a scale above 1.
  EXPECT_LT(qp->scale(), 0.1f);
  for (int i = 0; i < 3; ++i) EXPECT_GT(testing::sqnr_of((*model)(input(200 + i)), refs[i]), 25.0);
  EXPECT_THROW_MSG(disable_observers(*model), UsageError, "already converted");
}

}  // namespace
}  // namespace dbrq
