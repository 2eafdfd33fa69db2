// Fusion across module boundaries (docs/architecture.md, "Fusion across modules"): an activation in
// one module that is the only reader of a chain ending in another module (DenseNet's norm5 in the
// `features` Sequential, F.relu in the root's forward) runs in that chain's kernel, and its output
// observer gives the chain its parameters, exactly as if both were in one module. Where the
// activation is not the only reader on every path seen (a second consumer, a model output, an
// untraced module, a path without it) nothing fuses, and a path never calibrated that would need
// the unfused value raises ControlFlowError instead of returning a wrong one.
#include <gtest/gtest.h>

#include <cmath>
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
  split.eval();
  OneModuleTail one(conv_bn);
  one.eval();
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
  m.eval();
  const std::vector<Tensor> calib = batches(4, 100), eval = batches(2, 200);
  std::vector<Tensor> fp32;
  for (const Tensor& x : eval) fp32.push_back(m(x));
  const std::vector<Tensor> q = calibrate_convert_run(m, calib, eval);
  EXPECT_EQ(last_of_features(m).absorbs, -1);
  for (size_t i = 0; i < eval.size(); ++i) EXPECT_GT(sqnr_of(q[i], fp32[i]), 25.0) << i;
}

TEST(CrossModuleFusion, ModelOutputDoesNotFuse) {
  ReturnsBoth m;
  m.eval();
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
  m.eval();
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
  m.eval();
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
  m.eval();
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
  m.eval();
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
  a.eval();
  prepare(a, {calib[0]});
  for (const Tensor& x : calib) a(x);
  const std::string path = ::testing::TempDir() + "/cross_module_tail.qstate.json";
  save_quant_state(a, path);
  SplitTail b(false);
  b.eval();
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
  a.eval();
  prepare(a, [&] { a(calib[0]); }, default_qconfig_mapping("onednn"));
  for (const Tensor& x : calib) a(x);
  const std::string path = ::testing::TempDir() + "/returns_both.qstate.json";
  save_quant_state(a, path);
  EXPECT_NE(read_text(path).find("\"model_output\""), std::string::npos);
  ReturnsBoth b;
  b.eval();
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
  m.eval();
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
  m.eval();
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

// ---- A residual add in the parent, its conv (+ batch norm) in a child (MobileNetV2's
// `x + conv(x)`, the Sequential `conv` ending in conv + batch norm) ----

// Inputs with the conv's 8 channels, so the block's input is the residual.
std::vector<Tensor> residual_batches(int n, uint64_t seed) {
  std::vector<Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(randn({2, 8, 6, 6}, seed + static_cast<uint64_t>(i)));
  return out;
}

// conv (8 -> 8) and the batch norm after it, built the same way for every model below.
struct BodyLayers {
  BodyLayers() {
    conv = std::make_shared<Conv2d>(8, 8, 3, 1, 1, 1, 1, true);
    conv->weight.copy_(randn({8, 8, 3, 3}, 21) * 0.2);
    conv->bias.copy_(randn({8}, 22) * 0.1);
    bn = std::make_shared<BatchNorm2d>(8);
    randomize_bn(*bn, 7);
  }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;
};

// How the parent combines the block's input x with the body's output y.
struct ResidualForm {
  bool bn;          // the body is conv + batch norm (else the conv alone)
  bool relu;        // relu(x + y)
  bool body_first;  // y + x (else x + y)
};

Tensor combine(const ResidualForm& f, const Tensor& x, const Tensor& y) {
  Tensor s = f.body_first ? y + x : x + y;
  return f.relu ? relu(s) : s;
}

// The body in a child Sequential, the add (and relu) in the root's forward.
struct SplitResidual : nn::CallableModule<SplitResidual> {
  explicit SplitResidual(ResidualForm f) : form(f) {
    body = register_module("body", f.bn ? std::make_shared<Sequential>(l.conv, l.bn) : std::make_shared<Sequential>(l.conv));
  }
  Tensor forward(const Tensor& x) { return combine(form, x, (*body)(x)); }
  ResidualForm form;
  BodyLayers l;
  std::shared_ptr<Sequential> body;
};

// The same function written in one module.
struct OneModuleResidual : nn::CallableModule<OneModuleResidual> {
  explicit OneModuleResidual(ResidualForm f) : form(f) {
    register_module("conv", l.conv);
    if (f.bn) register_module("bn", l.bn);
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*l.conv)(x);
    if (form.bn) y = (*l.bn)(y);
    return combine(form, x, y);
  }
  ResidualForm form;
  BodyLayers l;
};

const SeenOpInfo& body_last(SplitResidual& m) { return state_of(*m.body).seen_ops().back(); }
const SeenOpInfo& root_add(SplitResidual& m) { return state_of(m).seen_ops().front(); }

class CrossModuleResidual : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {
 protected:
  ResidualForm form() const {
    return ResidualForm{std::get<0>(GetParam()), std::get<1>(GetParam()), std::get<2>(GetParam())};
  }
};

TEST_P(CrossModuleResidual, SplitModelIsBitIdenticalToOneModule) {
  const ResidualForm f = form();
  const std::vector<Tensor> calib = residual_batches(4, 300), eval = residual_batches(2, 400);
  SplitResidual split(f);
  split.eval();
  OneModuleResidual one(f);
  one.eval();
  std::vector<Tensor> fp32;
  for (const Tensor& x : eval) fp32.push_back(split(x));
  const std::vector<Tensor> a = calibrate_convert_run(split, calib, eval);
  const std::vector<Tensor> b = calibrate_convert_run(one, calib, eval);
  for (size_t i = 0; i < eval.size(); ++i) {
    EXPECT_EQ(values(a[i]), values(b[i])) << "batch " << i;
    EXPECT_GT(sqnr_of(a[i], fp32[i]), 25.0) << "batch " << i;
  }
  // The body's result exists only inside the conv's kernel, which the root's add completes.
  const SeenOpInfo& last = body_last(split);
  const SeenOpInfo& add = root_add(split);
  EXPECT_EQ(add.kind, OpKind::kAdd);
  EXPECT_EQ(last.absorbs, add.global_index);
  EXPECT_EQ(add.absorbed_by, last.global_index);
  EXPECT_EQ(add.absorbed_input, f.body_first ? 0 : 1);
  EXPECT_EQ(last.output_observer, -1);
  EXPECT_EQ(add.output_observer >= 0, !f.relu);  // with a relu, the relu observes the chain's output
  ASSERT_NE(add.executor, nullptr);
  const std::string chain = std::string(f.bn ? "conv2d+batch_norm" : "conv2d") + "+add" + (f.relu ? "+relu" : "");
  EXPECT_EQ(add.executor->description,
            "residual add fused into " + chain + " (conv2d in module \"body\") (sum post-op)");
  const SeenOpInfo& conv = state_of(*split.body).seen_ops().front();
  ASSERT_NE(conv.executor, nullptr);
  EXPECT_NE(conv.executor->description.find("waits for its residual"), std::string::npos) << conv.executor->description;
  if (f.relu) {
    ASSERT_NE(state_of(split).seen_ops().back().executor->output_qparams, nullptr);
    EXPECT_EQ(state_of(split).seen_ops().back().executor->output_qparams->zero_point(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(BnReluOrder, CrossModuleResidual,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Bool()));

// The body's output also read by a second op in the root: the add must not fuse.
struct ResidualReadTwice : nn::CallableModule<ResidualReadTwice> {
  ResidualReadTwice() { body = register_module("body", std::make_shared<Sequential>(l.conv, l.bn)); }
  Tensor forward(const Tensor& x) {
    Tensor y = (*body)(x);
    return (x + y) + y;
  }
  BodyLayers l;
  std::shared_ptr<Sequential> body;
};

TEST(CrossModuleResidualAdd, SecondConsumerDoesNotFuse) {
  ResidualReadTwice m;
  m.eval();
  const std::vector<Tensor> calib = residual_batches(4, 300), eval = residual_batches(2, 400);
  std::vector<Tensor> fp32;
  for (const Tensor& x : eval) fp32.push_back(m(x));
  const std::vector<Tensor> q = calibrate_convert_run(m, calib, eval);
  EXPECT_EQ(state_of(*m.body).seen_ops().back().absorbs, -1);
  for (size_t i = 0; i < eval.size(); ++i) EXPECT_GT(sqnr_of(q[i], fp32[i]), 20.0) << i;
}

// The root adds the body's output on one path and returns it unchanged on another.
struct MaybeResidual : nn::CallableModule<MaybeResidual> {
  MaybeResidual() {
    body = register_module("body", std::make_shared<Sequential>(l.conv, l.bn));
    other = register_module("other", std::make_shared<Conv2d>(8, 8, 1, 1, 0, 1, 1, true));
  }
  Tensor forward(const Tensor& x) {
    if (alt_body) return x + (*other)(x);
    Tensor y = (*body)(x);
    return raw ? y : x + y;
  }
  bool raw = false, alt_body = false;
  BodyLayers l;
  std::shared_ptr<Sequential> body;
  std::shared_ptr<Conv2d> other;
};

TEST(CrossModuleResidualAdd, PathWithoutTheAddNeverCalibratedRaises) {
  MaybeResidual m;
  m.eval();
  const std::vector<Tensor> calib = residual_batches(4, 300);
  const std::vector<Tensor> q = calibrate_convert_run(m, calib, calib);
  EXPECT_GE(state_of(*m.body).seen_ops().back().absorbs, 0);
  m.raw = true;
  // The conv waits for its residual: its own output is never computed after convert.
  EXPECT_THROW_MSG(m(calib[0]), ControlFlowError,
                   "an uncalibrated path (the model's output) reads the output of batch_norm (body.1), which after "
                   "convert runs fused");
  m.raw = false;
  EXPECT_EQ(values(m(calib[0])), values(q[0]));  // the model is still usable
}

TEST(CrossModuleResidualAdd, PathWithoutTheAddCalibratedDoesNotFuse) {
  MaybeResidual m;
  m.eval();
  // (Evaluated on calibration inputs: both paths' ranges are then observed, not clipped.)
  const std::vector<Tensor> calib = residual_batches(4, 300), eval = residual_batches(2, 300);
  prepare(m, {calib[0]});
  for (const Tensor& x : calib) {
    m.raw = false;
    m(x);
    m.raw = true;
    m(x);
  }
  EXPECT_EQ(state_of(*m.body).seen_ops().back().absorbs, -1);
  convert(m);
  for (const bool raw : {false, true}) {
    for (const Tensor& x : eval) {
      m.raw = raw;
      const Tensor q = m(x);
      InterceptorScope none(nullptr);
      Tensor ref = (*m.l.bn)((*m.l.conv)(x));
      if (!raw) ref = x + ref;
      EXPECT_GT(sqnr_of(q, ref), 25.0) << raw;
    }
  }
}

// The add is its own record on the path that reads another module's conv: that path, never
// calibrated, runs fp32 and is counted; the fused path is unaffected.
TEST(CrossModuleResidualAdd, AnotherProducerOnAnUncalibratedPathRunsFp32) {
  MaybeResidual m;
  m.eval();
  const std::vector<Tensor> calib = residual_batches(4, 300);
  const std::vector<Tensor> q = calibrate_convert_run(m, calib, calib);
  m.alt_body = true;
  const int64_t before = uncalibrated_ops(m);
  const Tensor out = m(calib[1]);
  EXPECT_GT(uncalibrated_ops(m), before);
  Tensor ref;
  {
    InterceptorScope none(nullptr);
    ref = calib[1] + (*m.other)(calib[1]);
  }
  testing::expect_close(out, ref, 1e-5);
  m.alt_body = false;
  EXPECT_EQ(values(m(calib[0])), values(q[0]));
}

// A child returning the conv's output on one path and another tensor on another, to one add
// record: handed the other tensor (never calibrated), the absorbed add computes itself in fp32.
struct BranchyBody : nn::CallableModule<BranchyBody> {
  BranchyBody() {
    register_module("conv", l.conv);
    register_module("bn", l.bn);
  }
  Tensor forward(const Tensor& x) { return alt ? x * 0.5 : (*l.bn)((*l.conv)(x)); }
  bool alt = false;
  BodyLayers l;
};
struct BranchyResidual : nn::CallableModule<BranchyResidual> {
  BranchyResidual() { body = register_module("body", std::make_shared<BranchyBody>()); }
  Tensor forward(const Tensor& x) { return x + (*body)(x); }
  std::shared_ptr<BranchyBody> body;
};

TEST(CrossModuleResidualAdd, AbsorbedAddHandedAnotherTensorComputesIt) {
  BranchyResidual m;
  m.eval();
  const std::vector<Tensor> calib = residual_batches(4, 300);
  const std::vector<Tensor> q = calibrate_convert_run(m, calib, calib);
  ASSERT_GE(state_of(m).seen_ops().front().absorbed_by, 0);
  m.body->alt = true;
  const int64_t before = uncalibrated_ops(m);
  const Tensor out = m(calib[1]);
  EXPECT_GT(uncalibrated_ops(m), before);
  testing::expect_close(out, calib[1] * 1.5, 1e-5);
  m.body->alt = false;
  EXPECT_EQ(values(m(calib[0])), values(q[0]));  // no pending result was left behind
}

TEST(CrossModuleResidualAdd, QuantStateFileRoundTrips) {
  const std::vector<Tensor> calib = residual_batches(4, 300), eval = residual_batches(2, 400);
  const ResidualForm f{true, true, false};
  SplitResidual a(f);
  a.eval();
  prepare(a, {calib[0]});
  for (const Tensor& x : calib) a(x);
  const std::string path = ::testing::TempDir() + "/cross_module_residual.qstate.json";
  save_quant_state(a, path);
  SplitResidual b(f);
  b.eval();
  prepare(b, {calib[0]});
  load_quant_state(b, path);
  EXPECT_GE(body_last(b).absorbs, 0);
  const std::string again = path + ".again";
  save_quant_state(b, again);
  EXPECT_EQ(read_text(path), read_text(again));
  convert(a);
  convert(b);
  for (const Tensor& x : eval) EXPECT_EQ(values(a(x)), values(b(x)));
  std::remove(path.c_str());
  std::remove(again.c_str());
}

// A body with two paths (its input scaled or not, on the data's sign), both ending in the conv +
// batch norm whose add is in the root.
struct TwoPathBody : nn::CallableModule<TwoPathBody> {
  TwoPathBody() {
    register_module("conv", l.conv);
    register_module("bn", l.bn);
  }
  Tensor forward(const Tensor& x) {
    const Tensor h = x.mean().item<float>() > 0.f ? x * 0.5 : x;
    return (*l.bn)((*l.conv)(h));
  }
  BodyLayers l;
};
struct TwoPathResidual : nn::CallableModule<TwoPathResidual> {
  TwoPathResidual() { body = register_module("body", std::make_shared<TwoPathBody>()); }
  Tensor forward(const Tensor& x) { return x + (*body)(x); }
  std::shared_ptr<TwoPathBody> body;
};

// compare_numerics compares what exists: the add's fused result, not the batch norm's output
// (it holds the sum), and the body's outputs on its paths are "n/a", not a wrong SQNR.
TEST(CrossModuleResidualAdd, CompareNumericsSkipsTheOutputThatOnlyTheKernelHas) {
  std::vector<Tensor> calib = residual_batches(4, 300);
  for (size_t i = 0; i < calib.size(); ++i) calib[i] = calib[i] + (i % 2 == 0 ? 1.0 : -1.0);
  TwoPathResidual fp32, q;
  fp32.eval();
  q.eval();
  calibrate_convert_run(q, calib, calib);
  int absorbing = 0;  // the batch norm (its conv has a record per path)
  for (const SeenOpInfo& op : state_of(*q.body).seen_ops()) absorbing += op.absorbs >= 0;
  ASSERT_EQ(absorbing, 1);
  std::vector<std::vector<Tensor>> inputs;
  for (const Tensor& x : calib) inputs.push_back({x});
  const NumericReport r = compare_numerics(fp32, q, inputs);
  EXPECT_GT(r.output_sqnr_db, 25.0);
  bool add_reported = false;
  for (const OpNumerics& o : r.ops) {
    EXPECT_NE(o.fqn, "body.bn") << "the batch norm's output exists only inside the conv's kernel";
    EXPECT_NE(o.fqn, "body.conv");
    if (o.module_fqn.empty() && o.op == "add") {
      add_reported = true;
      EXPECT_NEAR(o.sqnr_db, r.output_sqnr_db, 1e-9);  // the add is the model's output
    }
  }
  EXPECT_TRUE(add_reported);
  int body_paths = 0;
  for (const PathNumerics& p : r.paths) {
    if (p.module_fqn != "body") continue;
    ++body_paths;
    EXPECT_TRUE(std::isnan(p.sqnr_db)) << p.sqnr_db;
    EXPECT_EQ(p.calls, 2);
  }
  EXPECT_EQ(body_paths, 2);
  EXPECT_NE(r.to_table().find("n/a"), std::string::npos) << r.to_table();
}

// The same two paths written in one module: the conv's two records (one per path) share the
// batch norm and the add. The add used to complete only the first record's kernel, so the other
// path raised ControlFlowError after convert ("the add received a tensor that is not ...").
struct TwoPathOneModule : nn::CallableModule<TwoPathOneModule> {
  TwoPathOneModule() {
    register_module("conv", l.conv);
    register_module("bn", l.bn);
  }
  Tensor forward(const Tensor& x) {
    const Tensor h = x.mean().item<float>() > 0.f ? x * 0.5 : x;
    return x + (*l.bn)((*l.conv)(h));
  }
  BodyLayers l;
};

TEST(ResidualAdd, TwoRecordsOfTheConvShareTheAddOnBothPaths) {
  std::vector<Tensor> calib = residual_batches(4, 300);
  for (size_t i = 0; i < calib.size(); ++i) calib[i] = calib[i] + (i % 2 == 0 ? 1.0 : -1.0);
  TwoPathOneModule one;
  one.eval();
  TwoPathResidual split;
  split.eval();
  std::vector<Tensor> fp32;
  for (const Tensor& x : calib) fp32.push_back(one(x));
  const std::vector<Tensor> a = calibrate_convert_run(one, calib, calib);
  const std::vector<Tensor> b = calibrate_convert_run(split, calib, calib);
  int convs = 0;
  for (const SeenOpInfo& op : state_of(one).seen_ops()) convs += op.kind == OpKind::kConv2d;
  EXPECT_EQ(convs, 2);
  for (size_t i = 0; i < calib.size(); ++i) {
    EXPECT_GT(sqnr_of(a[i], fp32[i]), 25.0) << i;
    EXPECT_EQ(values(a[i]), values(b[i])) << i;  // and the split model computes the same
  }
}

}  // namespace
}  // namespace dbrq
