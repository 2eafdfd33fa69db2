#include "samples/zoo/mobilenet_v2.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

namespace {

// torchvision's Conv2dNormActivation with its defaults: conv (no bias, "same" padding), BN, ReLU6.
std::shared_ptr<nn::SequentialImpl> conv_bn_relu6(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups) {
  auto conv = std::make_shared<nn::Conv2dImpl>(
      nn::Conv2dOptions(in, out, kernel).stride(stride).padding((kernel - 1) / 2).groups(groups).bias(false));
  return std::make_shared<nn::SequentialImpl>(std::vector<std::shared_ptr<nn::Module>>{
      conv, std::make_shared<nn::BatchNorm2dImpl>(out), std::make_shared<nn::ReLU6Impl>()});
}

}  // namespace

int64_t make_divisible(double v, int64_t divisor) {
  // Python's int(v + divisor / 2) truncates toward zero; v is positive here.
  int64_t new_v = static_cast<int64_t>(v + static_cast<double>(divisor) / 2) / divisor * divisor;
  new_v = std::max(divisor, new_v);
  if (static_cast<double>(new_v) < 0.9 * v) new_v += divisor;
  return new_v;
}

InvertedResidual::InvertedResidual(int64_t inp, int64_t oup, int64_t stride, int64_t expand_ratio)
    : use_res_connect_(stride == 1 && inp == oup) {
  DBRQ_ENSURE(stride == 1 || stride == 2, dbrq::ValueError, "InvertedResidual: stride must be 1 or 2, got ", stride);
  // Python's round() rounds half to even, as std::nearbyint does in the default rounding mode.
  const auto hidden = static_cast<int64_t>(std::nearbyint(static_cast<double>(inp) * expand_ratio));
  conv = std::make_shared<nn::SequentialImpl>();
  if (expand_ratio != 1) conv->push_back(conv_bn_relu6(inp, hidden, 1, 1, 1));
  conv->push_back(conv_bn_relu6(hidden, hidden, 3, stride, hidden));
  conv->push_back(std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(hidden, oup, 1).bias(false)));
  conv->push_back(std::make_shared<nn::BatchNorm2dImpl>(oup));
  register_module("conv", conv);
}

Tensor InvertedResidual::forward(const Tensor& x) {
  if (use_res_connect_) return x + (*conv)(x);
  return (*conv)(x);
}

MobileNetV2::MobileNetV2(const MobileNetV2Config& config) : config_(config) {
  DBRQ_ENSURE(config.width_mult > 0 && config.num_classes >= 1, dbrq::ValueError,
              "MobileNetV2: width_mult must be > 0 and num_classes >= 1, got ", config.width_mult, " and ",
              config.num_classes);
  struct Stage {
    int64_t expand_ratio, channels, repeats, stride;  // torchvision's t, c, n, s
  };
  static constexpr Stage kStages[] = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                      {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  int64_t input_channel = make_divisible(32 * config.width_mult);
  last_channel_ = make_divisible(1280 * std::max(1.0, config.width_mult));

  features = std::make_shared<nn::SequentialImpl>();
  features->push_back(conv_bn_relu6(3, input_channel, 3, 2, 1));
  for (const Stage& s : kStages) {
    const int64_t output_channel = make_divisible(static_cast<double>(s.channels) * config.width_mult);
    for (int64_t i = 0; i < s.repeats; ++i) {
      features->push_back(
          std::make_shared<InvertedResidual>(input_channel, output_channel, i == 0 ? s.stride : 1, s.expand_ratio));
      input_channel = output_channel;
    }
  }
  features->push_back(conv_bn_relu6(input_channel, last_channel_, 1, 1, 1));
  register_module("features", features);

  classifier = register_module("classifier", std::make_shared<nn::SequentialImpl>(std::vector<std::shared_ptr<nn::Module>>{
                                                 std::make_shared<nn::DropoutImpl>(0.2),
                                                 std::make_shared<nn::LinearImpl>(last_channel_, config.num_classes)}));
}

Tensor MobileNetV2::forward(const Tensor& x) {
  Tensor y = (*features)(x);
  y = dbrq::adaptive_avg_pool2d(y, {1, 1}).flatten(1);
  return (*classifier)(y);
}

}  // namespace zoo
