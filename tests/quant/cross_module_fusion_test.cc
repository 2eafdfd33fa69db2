// Fusion across module boundaries (docs/architecture.md, "Fusion across modules"): an activation in
// one module that is the only reader of a chain ending in another module (DenseNet's norm5 in the
// `features` Sequential, F.relu in the root's forward) runs in that chain's kernel, and its output
// observer gives the chain its parameters, exactly as if both were in one module. Where the
// activation is not the only reader on every path seen (a second consumer, a model output, an
// untraced module, a path without it) nothing fuses, and a path never calibrated that would need
// the unfused value raises ControlFlowError instead of returning a wrong one.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;
using ReLU = nn::ReLUImpl;
using Sequential = nn::SequentialImpl;
using testing::randomize_bn;
using testing::sqnr_of;
using testing::state_of;
using testing::values;

// Inputs with negative and positive values, so a relu changes the result.
std::vector<Tensor> batches(int n, uint64_t seed) {
  std::vector<Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(randn({2, 3, 8, 8}, seed + static_cast<uint64_t>(i)));
  return out;
}

// The layers of DenseNet's tail, built the same way (same seeds) for every model below. With
// `conv_bn` the batch norm follows the conv (it folds: conv2d+batch_norm, then +relu); without it
// the conv is followed by its own relu and the batch norm runs on its own (batch_norm, then +relu),
// as DenseNet's norm5 after the last dense block.
struct Layers {
  explicit Layers(bool conv_bn_) : conv_bn(conv_bn_) {
    conv = std::make_shared<Conv2d>(3, 8, 3, 1, 1, 1, 1, true);
    Tensor w = randn({8, 3, 3, 3}, 11);
    conv->weight.copy_(w * 0.3);
    conv->bias.copy_(randn({8}, 12) * 0.1);
    bn = std::make_shared<BatchNorm2d>(8);
    randomize_bn(*bn, 5);
    relu0 = std::make_shared<ReLU>();
  }
  bool conv_bn;
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
  std::shared_ptr<ReLU> relu0;
};

// The producing chain in a child Sequential, the activation in the root's forward.
struct SplitTail : nn::CallableModule<SplitTail> {
  explicit SplitTail(bool conv_bn) : l(conv_bn) {
    features = register_module(
        "features", conv_bn ? std::make_shared<Sequential>(l.conv, l.bn) : std::make_shared<Sequential>(l.conv, l.relu0, l.bn));
  }
  Tensor forward(const Tensor& x) { return relu((*features)(x)); }
  Layers l;
  std::shared_ptr<Sequential> features;
};

// The same function written in one module.
struct OneModuleTail : nn::CallableModule<OneModuleTail> {
  explicit OneModuleTail(bool conv_bn) : l(conv_bn) {
    register_module("conv", l.conv);
    if (!conv_bn) register_module("relu0", l.relu0);
    register_module("bn", l.bn);
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*l.conv)(x);
    if (!l.conv_bn) y = (*l.relu0)(y);
    return relu((*l.bn)(y));
  }
  Layers l;
};

template <typename M>
std::vector<Tensor> calibrate_convert_run(M& model, const std::vector<Tensor>& calib, const std::vector<Tensor>& eval) {
  prepare(model, {calib[0]});
  for (const Tensor& x : calib) model(x);
  convert(model);
  std::vector<Tensor> out;
  for (const Tensor& x : eval) out.push_back(model(x));
  return out;
}

// The batch norm's record in the split model, and the root's relu.
const SeenOpInfo& bn_record(SplitTail& m) { return state_of(*m.features).seen_ops().back(); }
const SeenOpInfo& relu_record(SplitTail& m) { return state_of(m).seen_ops().back(); }

class CrossModuleTail : public ::testing::TestWithParam<bool> {};

TEST_P(CrossModuleTail, SplitModelIsBitIdenticalToOneModule) {
  const bool conv_bn = GetParam();
  const std::vector<Tensor> calib = batches(4, 100), eval = batches(2, 200);
  SplitTail split(conv_bn);
  OneModuleTail one(conv_bn);
  std::vector<Tensor> fp32;
  for (const Tensor& x : eval) fp32.push_back(split(x));
  const std::vector<Tensor> a = calibrate_convert_run(split, calib, eval);
  const std::vector<Tensor> b = calibrate_convert_run(one, calib, eval);
  for (size_t i = 0; i < eval.size(); ++i) {
    EXPECT_EQ(values(a[i]), values(b[i])) << "batch " << i;
    EXPECT_GT(sqnr_of(a[i], fp32[i]), 25.0) << "batch " << i;
  }
  // The batch norm's output exists only inside the kernel; the relu observes the chain's output.
  const SeenOpInfo& bn = bn_record(split);
  const SeenOpInfo& r = relu_record(split);
  EXPECT_EQ(bn.absorbs, r.global_index);
  EXPECT_EQ(r.absorbed_by, bn.global_index);
  EXPECT_EQ(bn.output_observer, -1);
  ASSERT_GE(r.output_observer, 0);
  ASSERT_NE(r.executor, nullptr);
  EXPECT_NE(r.executor->description.find("fused into"), std::string::npos) << r.executor->description;
  ASSERT_NE(r.executor->output_qparams, nullptr);
  EXPECT_EQ(r.executor->output_qparams->zero_point(), 0);  // the relu's range, not the batch norm's
}

INSTANTIATE_TEST_SUITE_P(ConvBnOrBnAlone, CrossModuleTail, ::testing::Bool());

// The batch norm's output also read by a second op in the root: the relu must not fuse.
struct SecondConsumer : nn::CallableModule<SecondConsumer> {
  SecondConsumer() : l(false) { features = register_module("features", std::make_shared<Sequential>(l.conv, l.relu0, l.bn)); }
  Tensor forward(const Tensor& x) {
    Tensor y = (*features)(x);
    return relu(y) + y;
  }
  Layers l;
  std::shared_ptr<Sequential> features;
};

// ... returned from the model next to its relu.
struct ReturnsBoth : nn::CallableModule<ReturnsBoth> {
  ReturnsBoth() : l(false) { features = register_module("features", std::make_shared<Sequential>(l.conv, l.relu0, l.bn)); }
  std::tuple<Tensor, Tensor> forward(const Tensor& x) {
    Tensor y = (*features)(x);
    return {relu(y), y};
  }
  Layers l;
  std::shared_ptr<Sequential> features;
};

// ... read by an untraced module (fp32, outside the records).
struct Untraced : nn::CallableModule<Untraced> {
  Tensor forward(const Tensor& x) { return x * 0.5; }
};
struct ReadByUntraced : nn::CallableModule<ReadByUntraced> {
  ReadByUntraced() : l(false) {
    features = register_module("features", std::make_shared<Sequential>(l.conv, l.relu0, l.bn));
    side = register_module("side", std::make_shared<Untraced>());
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*features)(x);
    return relu(y) + (*side)(y);
  }
  Layers l;
  std::shared_ptr<Sequential> features;
  std::shared_ptr<Untraced> side;
};

template <typename M>
const SeenOpInfo& last_of_features(M& m) {
  return state_of(*m.features).seen_ops().back();
}

TEST(CrossModuleFusion, SecondConsumerInTheParentDoesNotFuse) {
  SecondConsumer m;
  const std::vector<Tensor> calib = batches(4, 100), eval = batches(2, 200);
  std::vector<Tensor> fp32;
  for (const Tensor& x : eval) fp32.push_back(m(x));
  const std::vector<Tensor> q = calibrate_convert_run(m, calib, eval);
  EXPECT_EQ(last_of_features(m).absorbs, -1);
  for (size_t i = 0; i < eval.size(); ++i) EXPECT_GT(sqnr_of(q[i], fp32[i]), 25.0) << i;
}

TEST(CrossModuleFusion, ModelOutputDoesNotFuse) {
  ReturnsBoth m;
  const std::vector<Tensor> calib = batches(4, 100), eval = batches(2, 200);
  std::vector<std::tuple<Tensor, Tensor>> fp32;
  for (const Tensor& x : eval) fp32.push_back(m(x));
  prepare(m, [&] { m(calib[0]); }, default_qconfig_mapping("onednn"));
  for (const Tensor& x : calib) m(x);
  EXPECT_TRUE(last_of_features(m).model_output);
  EXPECT_EQ(last_of_features(m).absorbs, -1);
  convert(m);
  for (size_t i = 0; i < eval.size(); ++i) {
    auto [r, y] = m(eval[i]);
    EXPECT_GT(sqnr_of(r, std::get<0>(fp32[i])), 25.0) << i;
    // With the relu fused into the batch norm, y would be its relu (negative values lost).
    EXPECT_GT(sqnr_of(y, std::get<1>(fp32[i])), 25.0) << i;
  }
}

TEST(CrossModuleFusion, ReadByAnUntracedModuleDoesNotFuse) {
  ReadByUntraced m;
  const std::vector<Tensor> calib = batches(4, 100), eval = batches(2, 200);
  std::vector<Tensor> fp32;
  for (const Tensor& x : eval) fp32.push_back(m(x));
  PrepareOptions opts;
  opts.non_traceable_module_names = {"side"};
  prepare(m, {calib[0]}, default_qconfig_mapping("onednn"), BackendConfig::onednn(), opts);
  for (const Tensor& x : calib) m(x);
  EXPECT_TRUE(last_of_features(m).read_by_fp32);
  EXPECT_EQ(last_of_features(m).absorbs, -1);
  convert(m);
  // (Reading the relu instead, the untraced side loses every negative value: below 10 dB.)
  for (size_t i = 0; i < eval.size(); ++i) EXPECT_GT(sqnr_of(m(eval[i]), fp32[i]), 20.0) << i;
}

// The root applies the relu only when `with_relu`.
struct MaybeRelu : nn::CallableModule<MaybeRelu> {
  MaybeRelu() : l(false) { features = register_module("features", std::make_shared<Sequential>(l.conv, l.relu0, l.bn)); }
  Tensor forward(const Tensor& x) {
    Tensor y = (*features)(x);
    return with_relu ? relu(y) : y;
  }
  bool with_relu = true;
  Layers l;
  std::shared_ptr<Sequential> features;
};

TEST(CrossModuleFusion, PathWithoutTheActivationNeverCalibratedRaises) {
  MaybeRelu m;
  const std::vector<Tensor> calib = batches(4, 100);
  const std::vector<Tensor> q = calibrate_convert_run(m, calib, calib);
  EXPECT_GE(last_of_features(m).absorbs, 0);
  m.with_relu = false;
  // The batch norm's kernel applied the relu: its own output does not exist after convert.
  EXPECT_THROW_MSG(m(calib[0]), ControlFlowError,
                   "an uncalibrated path (the model's output) reads the output of batch_norm (features.2), which "
                   "after convert runs fused");
  m.with_relu = true;
  EXPECT_EQ(values(m(calib[0])), values(q[0]));  // the model is still usable
}

TEST(CrossModuleFusion, PathWithoutTheActivationCalibratedDoesNotFuse) {
  MaybeRelu m;
  const std::vector<Tensor> calib = batches(4, 100), eval = batches(2, 200);
  prepare(m, {calib[0]});
  for (const Tensor& x : calib) {
    m.with_relu = true;
    m(x);
    m.with_relu = false;
    m(x);
  }
  EXPECT_EQ(last_of_features(m).absorbs, -1);
  convert(m);
  for (const bool with : {true, false}) {
    for (const Tensor& x : eval) {
      m.with_relu = with;
      const Tensor q = m(x);
      InterceptorScope none(nullptr);
      Tensor ref = (*m.l.bn)((*m.l.relu0)((*m.l.conv)(x)));
      if (with) ref = relu(ref);
      EXPECT_GT(sqnr_of(q, ref), 25.0) << with;
    }
  }
}

// A child that returns the batch norm's output on one path and another conv's on the other:
// handed the other conv's output (a path never calibrated), the fused relu must compute.
struct Branchy : nn::CallableModule<Branchy> {
  Branchy() : l(false) {
    register_module("conv", l.conv);
    register_module("relu0", l.relu0);
    register_module("bn", l.bn);
    conv2 = register_module("conv2", std::make_shared<Conv2d>(3, 8, 3, 1, 1, 1, 1, true));
  }
  Tensor forward(const Tensor& x) { return alt ? (*conv2)(x) : (*l.bn)((*l.relu0)((*l.conv)(x))); }
  bool alt = false;
  Layers l;
  std::shared_ptr<Conv2d> conv2;
};
struct BranchyParent : nn::CallableModule<BranchyParent> {
  BranchyParent() { features = register_module("features", std::make_shared<Branchy>()); }
  Tensor forward(const Tensor& x) { return relu((*features)(x)); }
  std::shared_ptr<Branchy> features;
};

TEST(CrossModuleFusion, FusedActivationHandedAnotherTensorComputesIt) {
  BranchyParent m;
  const std::vector<Tensor> calib = batches(4, 100);
  calibrate_convert_run(m, calib, calib);
  EXPECT_GE(last_of_features(m).absorbs, 0);
  m.features->alt = true;
  const int64_t before = uncalibrated_ops(m);
  const Tensor q = m(calib[1]);
  EXPECT_GT(uncalibrated_ops(m), before);
  Tensor ref;
  {
    InterceptorScope none(nullptr);
    ref = relu((*m.features->conv2)(calib[1]));
  }
  testing::expect_close(q, ref, 1e-5);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(CrossModuleFusion, QuantStateFileRoundTrips) {
  const std::vector<Tensor> calib = batches(4, 100), eval = batches(2, 200);
  SplitTail a(false);
  prepare(a, {calib[0]});
  for (const Tensor& x : calib) a(x);
  const std::string path = ::testing::TempDir() + "/cross_module_tail.qstate.json";
  save_quant_state(a, path);
  SplitTail b(false);
  prepare(b, {calib[0]});
  load_quant_state(b, path);
  EXPECT_GE(bn_record(b).absorbs, 0);
  const std::string again = path + ".again";
  save_quant_state(b, again);
  EXPECT_EQ(read_text(path), read_text(again));
  convert(a);
  convert(b);
  for (const Tensor& x : eval) EXPECT_EQ(values(a(x)), values(b(x)));
  std::remove(path.c_str());
  std::remove(again.c_str());
}

TEST(CrossModuleFusion, ModelOutputFlagRoundTrips) {
  const std::vector<Tensor> calib = batches(2, 100);
  ReturnsBoth a;
  prepare(a, [&] { a(calib[0]); }, default_qconfig_mapping("onednn"));
  for (const Tensor& x : calib) a(x);
  const std::string path = ::testing::TempDir() + "/returns_both.qstate.json";
  save_quant_state(a, path);
  EXPECT_NE(read_text(path).find("\"model_output\""), std::string::npos);
  ReturnsBoth b;
  prepare(b, [&] { b(calib[0]); }, default_qconfig_mapping("onednn"));
  load_quant_state(b, path);
  EXPECT_TRUE(last_of_features(b).model_output);
  EXPECT_EQ(last_of_features(b).absorbs, -1);
  std::remove(path.c_str());
}

// Before cross-module fusion, the same hole existed inside one module: a path never calibrated
// returning the inner tensor of a fused chain (a conv whose relu runs in its kernel) from the
// model handed out the relu'd values as the conv's.
struct InnerReturned : nn::CallableModule<InnerReturned> {
  InnerReturned() : l(true) {
    register_module("conv", l.conv);
    register_module("bn", l.bn);
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*l.bn)((*l.conv)(x));
    return raw ? y : relu(y);
  }
  bool raw = false;
  Layers l;
};

TEST(FusedInnerTensor, ReturnedFromTheModelOnAnUncalibratedPathRaises) {
  InnerReturned m;
  const std::vector<Tensor> calib = batches(3, 100);
  calibrate_convert_run(m, calib, calib);
  m.raw = true;
  EXPECT_THROW_MSG(m(calib[0]), ControlFlowError, "reads the output of batch_norm (bn), which after convert runs fused as conv2d+batch_norm+relu");
}

// ... or read by an untraced module on a calibrated path (the untraced module read the relu).
struct InnerToUntraced : nn::CallableModule<InnerToUntraced> {
  InnerToUntraced() : l(true) {
    register_module("conv", l.conv);
    register_module("bn", l.bn);
    side = register_module("side", std::make_shared<Untraced>());
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*l.bn)((*l.conv)(x));
    return relu(y) + (*side)(y);
  }
  Layers l;
  std::shared_ptr<Untraced> side;
};

TEST(FusedInnerTensor, ReadByAnUntracedModuleIsNotFused) {
  InnerToUntraced m;
  const std::vector<Tensor> calib = batches(4, 100), eval = batches(2, 200);
  std::vector<Tensor> fp32;
  for (const Tensor& x : eval) fp32.push_back(m(x));
  PrepareOptions opts;
  opts.non_traceable_module_names = {"side"};
  prepare(m, {calib[0]}, default_qconfig_mapping("onednn"), BackendConfig::onednn(), opts);
  for (const Tensor& x : calib) m(x);
  convert(m);
  const AutoQuantizationState& s = state_of(m);
  EXPECT_EQ(s.seen_ops()[0].display_kind(), "conv2d+batch_norm");
  // (Reading the relu instead, the untraced side loses every negative value: below 10 dB.)
  for (size_t i = 0; i < eval.size(); ++i) EXPECT_GT(sqnr_of(m(eval[i]), fp32[i]), 20.0) << i;
}

}  // namespace
}  // namespace dbrq
