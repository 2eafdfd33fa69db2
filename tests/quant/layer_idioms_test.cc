// Layer idioms of real models that converted wrongly or not at all (found by review): two conv
// chains meeting at one add (RepVGG / ACNet blocks, flat ResNet shortcuts), a conv plus a
// broadcast per-channel operand (a U-Net time embedding), per-channel weights observed along
// another axis than the output channels, and an untraced module writing its input in place.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using testing::sqnr_of;

std::vector<Tensor> images(int n, uint64_t seed) { return testing::random_batches(n, seed, {2, 4, 8, 8}); }

// relu(bn1(conv1(x)) + bn2(conv2(x))), or without batch norms conv2(x) + conv1(x): both operands
// of the add come from a conv chain of this module.
struct TwoBranches : nn::CallableModule<TwoBranches> {
  explicit TwoBranches(bool with_bn) : with_bn(with_bn) {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2dImpl>(4, 8, 3, 1, 1));
    conv2 = register_module("conv2", std::make_shared<nn::Conv2dImpl>(4, 8, 1));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2dImpl>(8));
    bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2dImpl>(8));
    testing::randomize_bn(*bn1, 3);
    testing::randomize_bn(*bn2, 4);
  }
  Tensor forward(const Tensor& x) {
    if (with_bn) return relu((*bn1)((*conv1)(x)) + (*bn2)((*conv2)(x)));
    return (*conv2)(x) + (*conv1)(x);
  }
  bool with_bn;
  std::shared_ptr<nn::Conv2dImpl> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2dImpl> bn1, bn2;
};

TEST(TwoChainsOneAdd, BothOperandsFromConvChainsConvertAndCompute) {
  for (bool with_bn : {true, false}) {
    SCOPED_TRACE(with_bn ? "relu(bn1(conv1(x)) + bn2(conv2(x)))" : "conv2(x) + conv1(x)");
    manual_seed(5);
    TwoBranches m(with_bn);
    m.eval();
    const std::vector<Tensor> calib = images(4, 10), eval = images(2, 20);
    std::vector<Tensor> want;
    for (const Tensor& x : eval) want.push_back(m(x));
    prepare(m, {calib[0]});
    for (const Tensor& x : calib) m(x);
    convert(m);
    for (size_t i = 0; i < eval.size(); ++i) EXPECT_GT(sqnr_of(m(eval[i]), want[i]), 25.0) << i;
    EXPECT_EQ(uncalibrated_ops(m), 0);
    // One chain ends in the add, the other is its residual (fused on its own).
    int into_add = 0;
    for (const SeenOpInfo& op : testing::state_of(m).seen_ops()) {
      if (op.kind == OpKind::kConv2d && op.fusion.fused() && op.fusion.pattern.back() == OpKind::kAdd) ++into_add;
      if (op.kind == OpKind::kConv2d && op.fusion.fused() && op.fusion.pattern.size() > 1 &&
          op.fusion.pattern[op.fusion.pattern.size() - 2] == OpKind::kAdd) {
        ++into_add;
      }
    }
    EXPECT_EQ(into_add, 1);
  }
}

// conv(x) + t with t of sizes [N, C, 1, 1] (a time or class embedding): the add broadcasts, which
// a fused residual (an operand of the output's sizes) cannot.
struct BroadcastShift : nn::CallableModule<BroadcastShift> {
  BroadcastShift() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(4, 8, 3, 1, 1));
    emb = register_module("emb", std::make_shared<nn::LinearImpl>(6, 8));
  }
  Tensor forward(const Tensor& x, const Tensor& e) {
    const Tensor t = (*emb)(e).view({x.size(0), 8, 1, 1});
    return relu((*conv)(x) + t);
  }
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<nn::LinearImpl> emb;
};

TEST(BroadcastResidual, AConvPlusAPerChannelOperandConvertsAndComputes) {
  manual_seed(6);
  BroadcastShift m;
  const std::vector<Tensor> calib = images(4, 30), eval = images(2, 40);
  const std::vector<Tensor> es = testing::random_batches(4, 50, {2, 6});
  std::vector<Tensor> want;
  for (size_t i = 0; i < eval.size(); ++i) want.push_back(m(eval[i], es[i]));
  prepare(m, {calib[0], es[0]});
  for (size_t i = 0; i < calib.size(); ++i) m(calib[i], es[i]);
  convert(m);
  for (size_t i = 0; i < eval.size(); ++i) EXPECT_GT(sqnr_of(m(eval[i], es[i]), want[i]), 25.0) << i;
  EXPECT_EQ(uncalibrated_ops(m), 0);
  // The deploy flow keeps the add apart too: files say which adds broadcast.
  const std::string path = testing::temp_file("broadcast_shift.qstate.json");
  save_quant_state(m, path);
  EXPECT_NE(testing::read_text(path).find("\"broadcasts\": true"), std::string::npos);
  manual_seed(6);
  BroadcastShift deployed;
  prepare(deployed, {calib[0], es[0]});
  load_quant_state(deployed, path);
  convert(deployed);
  for (size_t i = 0; i < eval.size(); ++i) testing::expect_equal(deployed(eval[i], es[i]), m(eval[i], es[i]), "deployed");
}

// Per-channel weights observed along the input channels: the int8 kernels take one scale per
// output channel. A square layer would accept the vector and scale every output by the wrong
// channel's factor; the qconfig is refused for the op, which runs fp32.
struct Square : nn::CallableModule<Square> {
  Square() { fc = register_module("fc", std::make_shared<nn::LinearImpl>(16, 16)); }
  Tensor forward(const Tensor& x) { return (*fc)(x); }
  std::shared_ptr<nn::LinearImpl> fc;
};

TEST(PerChannelWeights, AnAxisOtherThanTheOutputChannelsIsRefused) {
  manual_seed(7);
  Square m;
  m.fc->weight.narrow(1, 0, 1).mul_(10.0);  // input columns with different ranges
  const std::vector<Tensor> xs = testing::random_batches(4, 60, {8, 16});
  std::vector<Tensor> want;
  for (const Tensor& x : xs) want.push_back(m(x));
  QConfigMapping map;
  map.set_global(QConfig::make(ObserverSpec::histogram(),
                               ObserverSpec::per_channel_min_max(DType::kS8, QScheme::kPerChannelSymmetric, 1)));
  BackendConfig backend = BackendConfig::onednn();
  EXPECT_EQ(backend.unsupported_reason(OpKind::kLinear, *map.global()),
            "linear: backend onednn needs per-channel weights along axis 0 (output channels), got ch_axis 1");
  prepare(m, {xs[0]}, map);
  for (const Tensor& x : xs) m(x);
  convert(m);
  for (size_t i = 0; i < xs.size(); ++i) testing::expect_close(m(xs[i]), want[i], 1e-5, "fp32 linear");
}

// An untraced module that scales its input in place: in fp32 the caller's tensor changes too.
struct ScaleInPlace : nn::CallableModule<ScaleInPlace> {
  Tensor forward(Tensor x) {
    x.mul_(2.0);
    return x;
  }
};

struct WritesThroughUntraced : nn::CallableModule<WritesThroughUntraced> {
  WritesThroughUntraced() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(4, 8, 3, 1, 1));
    side = register_module("side", std::make_shared<ScaleInPlace>());
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    Tensor z = (*side)(y);
    return y + z;
  }
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<ScaleInPlace> side;
};

TEST(UntracedModule, AnInPlaceWriteToItsInputReachesTheCaller) {
  manual_seed(8);
  WritesThroughUntraced m;
  const std::vector<Tensor> calib = images(4, 70), eval = images(2, 80);
  std::vector<Tensor> want;
  for (const Tensor& x : eval) want.push_back(m(x));
  PrepareOptions opts;
  opts.non_traceable_module_names = {"side"};
  prepare(m, {calib[0]}, default_qconfig_mapping("onednn"), BackendConfig::onednn(), opts);
  for (const Tensor& x : calib) m(x);
  convert(m);
  // fp32: y + z = 4 conv(x). Losing the write gives 3 conv(x) (about 12 dB).
  for (size_t i = 0; i < eval.size(); ++i) EXPECT_GT(sqnr_of(m(eval[i]), want[i]), 25.0) << i;
}

}  // namespace
}  // namespace dbrq
