// The worked port of docs/porting_from_libtorch.md: torchvision's SqueezeNet Fire module and a
// small SqueezeNet head, written as in libtorch's C++ frontend with `torch::` replaced by `dbrq::`
// (plus the differences the document lists), then prepared, calibrated and converted.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace {

namespace nn = dbrq::nn;
using dbrq::Tensor;

// ---- the port (as in the document) ----

struct FireImpl : nn::CallableModule<FireImpl> {
  FireImpl(int64_t inplanes, int64_t squeeze_planes, int64_t expand1x1_planes, int64_t expand3x3_planes, bool arrow)
      : FireImpl(inplanes, squeeze_planes, expand1x1_planes, expand3x3_planes) {
    this->arrow = arrow;
  }
  FireImpl(int64_t inplanes, int64_t squeeze_planes, int64_t expand1x1_planes, int64_t expand3x3_planes)
      : squeeze(register_module("squeeze", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(inplanes, squeeze_planes, 1)))),
        expand1x1(register_module("expand1x1",
                                  std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(squeeze_planes, expand1x1_planes, 1)))),
        expand3x3(register_module(
            "expand3x3", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(squeeze_planes, expand3x3_planes, 3).padding(1)))) {}

  Tensor forward(Tensor x) {
    if (arrow) {  // libtorch's other spelling, on built-in layers (see BuiltinArrowForward below)
      x = dbrq::relu(squeeze->forward(x));
      return dbrq::cat({dbrq::relu(expand1x1->forward(x)), dbrq::relu(expand3x3->forward(x))}, 1);
    }
    x = dbrq::relu((*squeeze)(x));
    return dbrq::cat({dbrq::relu((*expand1x1)(x)), dbrq::relu((*expand3x3)(x))}, 1);
  }

  std::shared_ptr<nn::Conv2dImpl> squeeze, expand1x1, expand3x3;
  bool arrow = false;
};
DBRQ_MODULE(Fire);

struct SqueezeNetImpl : nn::CallableModule<SqueezeNetImpl> {
  explicit SqueezeNetImpl(int64_t num_classes = 10)
      : features(std::make_shared<nn::SequentialImpl>(std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(3, 16, 3).stride(2)),
                                std::make_shared<nn::ReLUImpl>(),
                                std::make_shared<nn::FunctionalImpl>(
                                    [](const Tensor& x) { return dbrq::max_pool2d(x, 3, 2, 0, 1, true); }),
                                Fire(16, 8, 16, 16), Fire(32, 8, 16, 16))),
        classifier(std::make_shared<nn::SequentialImpl>(std::make_shared<nn::DropoutImpl>(0.5),
                                  std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(32, num_classes, 1)),
                                  std::make_shared<nn::ReLUImpl>(), std::make_shared<nn::AdaptiveAvgPool2dImpl>(1))) {
    register_module("features", features);
    register_module("classifier", classifier);
  }

  Tensor forward(Tensor x) {
    x = (*features)(x);
    x = (*classifier)(x);
    return x.view({x.size(0), -1});
  }

  std::shared_ptr<nn::SequentialImpl> features, classifier;
};
DBRQ_MODULE(SqueezeNet);

}  // namespace

namespace dbrq {
namespace {

TEST(FirePort, Fp32MatchesFunctionalReference) {
  manual_seed(5);
  Fire fire(16, 4, 8, 8);
  fire->eval();
  const Tensor x = randn({2, 16, 7, 7}, 2);
  const Tensor y = fire(x);
  const Tensor s = relu(conv2d(x, fire->squeeze->weight, fire->squeeze->bias, fire->squeeze->params()));
  const Tensor e1 = relu(conv2d(s, fire->expand1x1->weight, fire->expand1x1->bias, fire->expand1x1->params()));
  const Tensor e3 = relu(conv2d(s, fire->expand3x3->weight, fire->expand3x3->bias, fire->expand3x3->params()));
  testing::expect_close(y, cat({e1, e3}, 1), 1e-6);
  testing::expect_equal(fire->forward(x), y);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 16, 7, 7}));
}

TEST(FirePort, PreparesCalibratesAndConverts) {
  manual_seed(7);
  SqueezeNet net;
  net->eval();
  const std::vector<int64_t> sizes = {2, 3, 33, 33};
  const Tensor x = randn(sizes, 9);
  const Tensor fp32 = net(x);
  ASSERT_EQ(fp32.sizes(), (std::vector<int64_t>{2, 10}));
  prepare(*net, {x});
  // The Fire modules inside the Sequential have their own recorded programs.
  nn::Module* fire0 = net->find_module("features.3");
  ASSERT_NE(fire0, nullptr);
  EXPECT_EQ(fire0->type_name(), "FireImpl");
  EXPECT_EQ(testing::display_kinds(testing::state_of(*fire0)),
            (std::vector<std::string>{"conv2d+relu", "conv2d+relu", "conv2d+relu", "cat"}));
  testing::calibrate(*net, sizes, 8, 200);
  convert(*net);
  const Tensor y = net(x);
  EXPECT_FALSE(y.is_quantized());
  EXPECT_GT(testing::sqnr_of(y, fp32), 20.0);
  int int8_convs = 0;
  for (const QuantizedOpInfo& op : quantized_ops(*net)) {
    if (op.kind == OpKind::kConv2d && !op.input_dtypes.empty() && op.input_dtypes[0] == DType::kU8) ++int8_convs;
  }
  EXPECT_EQ(int8_convs, 8);
  // A new batch size after convert.
  EXPECT_EQ(net(randn({1, 3, 33, 33}, 3)).sizes(), (std::vector<int64_t>{1, 10}));
}

// Built-in layers are held by std::shared_ptr, so `squeeze->forward(x)` is a direct call: the conv
// still runs inside the Fire module's forward, where it is recorded, fused and converted exactly as
// through `(*squeeze)(x)` (identical int8 results). What differs is the layer it is attributed to:
// the enclosing module, so a qconfig set for that layer by name or type does not apply (documented
// in docs/porting_from_libtorch.md; call built-in layers as (*layer)(x)).
TEST(FirePort, BuiltinArrowForwardIsQuantizedTheSame) {
  std::vector<Tensor> results;
  std::vector<std::vector<std::string>> fqns;
  for (bool arrow : {false, true}) {
    manual_seed(5);
    auto seq = std::make_shared<nn::SequentialImpl>(Fire(16, 4, 8, 8, arrow));
    seq->eval();
    const Tensor x = randn({2, 16, 7, 7}, 2);
    prepare(*seq, {x});
    testing::calibrate(*seq, {2, 16, 7, 7}, 4, 300);
    convert(*seq);
    results.push_back((*seq)(x));
    fqns.emplace_back();
    for (const QuantizedOpInfo& op : quantized_ops(*seq)) {
      if (op.kind == OpKind::kConv2d) fqns.back().push_back(op.fqn + ":" + op.op);
    }
  }
  testing::expect_equal(results[0], results[1], "(*conv)(x) vs conv->forward(x)");
  EXPECT_EQ(fqns[0], (std::vector<std::string>{"0.squeeze:conv2d+relu", "0.expand1x1:conv2d+relu",
                                               "0.expand3x3:conv2d+relu"}));
  EXPECT_EQ(fqns[1], (std::vector<std::string>{"0:conv2d+relu", "0:conv2d+relu", "0:conv2d+relu"}));
}

// The same bypass is not silent: prepare warns once per layer when the layer's qconfig is the one
// the op gets anyway, and raises (UsageError naming the layer) when a qconfig set for the layer by
// name or type would not apply.
TEST(FirePort, BuiltinArrowForwardIsReported) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  log()->sinks().push_back(sink);
  {
    manual_seed(5);
    auto seq = std::make_shared<nn::SequentialImpl>(Fire(16, 4, 8, 8, /*arrow=*/true));
    seq->eval();
    prepare(*seq, {randn({2, 16, 7, 7}, 2)});
    (*seq)(randn({2, 16, 7, 7}, 3));
  }
  log()->sinks().pop_back();
  const std::string text = out.str();
  EXPECT_NE(text.find("conv2d in module \"0\" (FireImpl) runs on the parameters of layer \"0.squeeze\" (Conv2d) outside "
                      "that layer's call"),
            std::string::npos)
      << text;
  size_t warnings = 0;
  for (size_t at = text.find("outside that layer's call"); at != std::string::npos;
       at = text.find("outside that layer's call", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 3u) << "once per layer (squeeze, expand1x1, expand3x3), not per call";

  // A qconfig for one layer that the direct call would drop: an error, not a silent default.
  manual_seed(5);
  auto seq = std::make_shared<nn::SequentialImpl>(Fire(16, 4, 8, 8, /*arrow=*/true));
  seq->eval();
  QConfigMapping mapping = default_qconfig_mapping("onednn");
  mapping.set_module_name("0.expand3x3", nullptr);
  try {
    prepare(*seq, {randn({2, 16, 7, 7}, 2)}, mapping);
    ADD_FAILURE() << "prepare did not throw";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    for (const char* part : {"layer \"0.expand3x3\" (Conv2d) outside that layer's call",
                             "the qconfig set for the layer (None) would not apply",
                             "Call the layer as (*layer)(x) or layer(x), not layer->forward(x)"}) {
      EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
    }
  }
  // Called as (*layer)(x), the same mapping prepares, and the layer runs fp32 as asked.
  manual_seed(5);
  auto good = std::make_shared<nn::SequentialImpl>(Fire(16, 4, 8, 8, /*arrow=*/false));
  good->eval();
  prepare(*good, {randn({2, 16, 7, 7}, 2)}, mapping);
}

}  // namespace
}  // namespace dbrq
