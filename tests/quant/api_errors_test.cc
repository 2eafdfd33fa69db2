// Error paths of the public quantization API, each with its exception type and message: prepare
// twice, prepare on a bare layer, convert before prepare, convert twice, convert before any
// calibration (NotCalibratedError naming module, op and tensor; the model stays calibratable),
// enable / disable_observers after convert, empty example inputs, a failing example run (the model
// is left unprepared and can be prepared again), and a forward taking more tensors than prepare
// passes.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using Conv2d = nn::Conv2dImpl;
using testing::sqnr_of;
using testing::state_of;

struct Inner : nn::CallableModule<Inner> {
  Inner() { conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1)); }
  Tensor forward(const Tensor& x) { return relu((*conv)(x)); }
  std::shared_ptr<Conv2d> conv;
};

struct Net : nn::CallableModule<Net> {
  Net() { inner = register_module("inner", std::make_shared<Inner>()); }
  Tensor forward(const Tensor& x) { return (*inner)(x)*2.0; }
  std::shared_ptr<Inner> inner;
};

Tensor input(uint64_t seed) { return randn({1, 3, 6, 6}, seed); }

TEST(ApiErrors, PrepareTwice) {
  auto model = std::make_shared<Net>();
  prepare(*model, {input(1)});
  EXPECT_THROW_MSG(prepare(*model, {input(1)}), UsageError,
                   "prepare: Net is already prepared; prepare a freshly built model");
  // The first preparation is intact.
  EXPECT_TRUE(is_prepared(*model));
  EXPECT_EQ(state_of(*model->inner).seen_ops().size(), 2u);
}

TEST(ApiErrors, PrepareOnABareLayer) {
  auto conv = std::make_shared<Conv2d>(3, 4, 3);
  EXPECT_THROW_MSG(prepare(*conv, {input(1)}), UsageError, "prepare: Conv2d is a built-in layer");
  EXPECT_FALSE(is_prepared(*conv));
  EXPECT_EQ(conv->extension(), nullptr);
}

TEST(ApiErrors, ConvertBeforePrepare) {
  auto model = std::make_shared<Net>();
  EXPECT_THROW_MSG(convert(*model), UsageError,
                   "convert: Net is not a prepared model; call dbrq::prepare(model, example_inputs) first");
  EXPECT_THROW_MSG(disable_observers(*model), UsageError, "disable_observers: Net is not a prepared model");
  EXPECT_THROW_MSG(enable_observers(*model), UsageError, "enable_observers: Net is not a prepared model");
  EXPECT_THROW_MSG(model_quant_state(*model), UsageError, "is not a prepared model");
  EXPECT_FALSE(is_converted(*model));
}

TEST(ApiErrors, ConvertBeforeAnyCalibration) {
  auto model = std::make_shared<Net>();
  const Tensor ref = (*model)(input(2));
  prepare(*model, {input(1)});
  const SeenOpInfo& conv = state_of(*model->inner).seen_ops()[0];
  const int64_t tid = conv.inputs[0].id;
  // The first observer convert needs is the conv's input (the model input).
  EXPECT_THROW_MSG(convert(*model), NotCalibratedError,
                   "convert: no calibration data for tensor t" + std::to_string(tid) +
                       " used by conv2d (inner.conv) in module \"inner\", op 0: its Histogram observer saw nothing");
  EXPECT_FALSE(is_converted(*model));
  EXPECT_EQ(conv.executor, nullptr);
  // Still calibrating: calibrate, then convert works.
  testing::expect_equal((*model)(input(2)), ref);
  (*model)(input(3));
  convert(*model);
  EXPECT_TRUE(is_converted(*model));
  EXPECT_GT(sqnr_of((*model)(input(2)), ref), 25.0);
}

TEST(ApiErrors, ConvertTwiceAndObserversAfterConvert) {
  auto model = std::make_shared<Net>();
  prepare(*model, {input(1)});
  (*model)(input(2));
  convert(*model);
  EXPECT_THROW_MSG(convert(*model), UsageError, "convert: Net is already converted; convert once per prepared model");
  EXPECT_THROW_MSG(enable_observers(*model), UsageError,
                   "enable_observers: the model is already converted; calibration must happen before convert");
  EXPECT_THROW_MSG(disable_observers(*model), UsageError, "disable_observers: the model is already converted");
  // Still runs int8.
  EXPECT_EQ((*model)(input(3)).dtype(), DType::kF32);
}

TEST(ApiErrors, EmptyExampleInputs) {
  auto model = std::make_shared<Net>();
  EXPECT_THROW_MSG(prepare(*model, std::vector<Tensor>{}), ValueError,
                   "prepare: example_inputs is empty; pass the tensors forward takes");
  EXPECT_FALSE(is_prepared(*model));
  EXPECT_THROW_MSG(prepare(*model, std::function<void()>(), default_qconfig_mapping()), ValueError,
                   "prepare: run_example is empty");
  EXPECT_FALSE(is_prepared(*model));
}

TEST(ApiErrors, FailingExampleRunLeavesModelUnpreparedAndRepreparable) {
  manual_seed(9);
  auto model = std::make_shared<Net>();
  manual_seed(9);
  auto twin = std::make_shared<Net>();  // same weights, prepared without a failure first
  const Tensor good = input(5);
  const Tensor ref = (*model)(good);
  // 5 channels for a 3-channel conv.
  try {
    prepare(*model, {randn({1, 5, 6, 6}, 1)});
    ADD_FAILURE() << "prepare should have thrown";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("prepare: the example run failed: "), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ShapeError, got " << e.what();
  }
  EXPECT_FALSE(is_prepared(*model));
  for (auto& [fqn, m] : model->named_modules()) {
    EXPECT_EQ(m->extension(), nullptr) << fqn;
    EXPECT_EQ(m->interceptor(), nullptr) << fqn;
  }
  // Still an ordinary fp32 model.
  testing::expect_equal((*model)(good), ref);
  // Prepare again, correctly this time.
  prepare(*model, {good});
  prepare(*twin, {good});
  EXPECT_TRUE(is_prepared(*model));
  EXPECT_EQ(state_of(*model->inner).seen_ops().size(), 2u);
  for (uint64_t seed : {5, 6, 7, 8}) {
    (*model)(input(seed));
    (*twin)(input(seed));
  }
  convert(*model);
  convert(*twin);
  // The failed attempt left nothing behind: the result is exactly the twin's.
  testing::expect_equal((*model)(good), (*twin)(good));
  EXPECT_GT(sqnr_of((*model)(good), ref), 25.0);
}

TEST(ApiErrors, ExampleRunThrowingANonDbrqException) {
  auto model = std::make_shared<Net>();
  bool first = true;
  EXPECT_THROW(prepare(
                   *model,
                   [&] {
                     (*model)(input(1));
                     if (first) throw std::runtime_error("user code failed");
                   },
                   default_qconfig_mapping()),
               std::runtime_error);
  EXPECT_FALSE(is_prepared(*model));
  first = false;
  prepare(
      *model, [&] { (*model)(input(1)); }, default_qconfig_mapping());
  EXPECT_TRUE(is_prepared(*model));
}

TEST(ApiErrors, ExampleInputCountMustMatchForward) {
  auto model = std::make_shared<Net>();
  EXPECT_THROW(prepare(*model, {input(1), input(2)}), ValueError);
  EXPECT_FALSE(is_prepared(*model));
}

}  // namespace
}  // namespace dbrq
