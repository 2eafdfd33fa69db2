#include "samples/zoo/unet.h"

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

UNetDoubleConv::UNetDoubleConv(int64_t in_channels, int64_t out_channels) {
  conv1 = register_module(
      "conv1", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(in_channels, out_channels, 3).padding(1).bias(false)));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2dImpl>(out_channels));
  relu1 = register_module("relu1", std::make_shared<nn::ReLUImpl>());
  conv2 = register_module(
      "conv2", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(out_channels, out_channels, 3).padding(1).bias(false)));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2dImpl>(out_channels));
  relu2 = register_module("relu2", std::make_shared<nn::ReLUImpl>());
}

Tensor UNetDoubleConv::forward(const Tensor& x) {
  return (*relu2)((*bn2)((*conv2)((*relu1)((*bn1)((*conv1)(x))))));
}

UNetDown::UNetDown(int64_t in_channels, int64_t out_channels) {
  pool = register_module("pool", std::make_shared<nn::MaxPool2dImpl>(2));
  conv = register_module("conv", std::make_shared<UNetDoubleConv>(in_channels, out_channels));
}

Tensor UNetDown::forward(const Tensor& x) { return (*conv)((*pool)(x)); }

UNetUp::UNetUp(int64_t in_channels, int64_t skip_channels, int64_t out_channels) {
  up = register_module("up", std::make_shared<nn::ConvTranspose2dImpl>(
                                 nn::ConvTranspose2dOptions(in_channels, in_channels / 2, 2).stride(2)));
  conv = register_module("conv", std::make_shared<UNetDoubleConv>(in_channels / 2 + skip_channels, out_channels));
}

Tensor UNetUp::forward(const Tensor& x, const Tensor& skip) { return (*conv)(dbrq::cat({skip, (*up)(x)}, 1)); }

UNet::UNet(const UNetConfig& config) : config_(config) {
  DBRQ_ENSURE(config.in_channels >= 1 && config.num_classes >= 1 && config.base_width >= 1, dbrq::ValueError,
              "UNet: in_channels, num_classes and base_width must be >= 1, got ", config.in_channels, ", ",
              config.num_classes, " and ", config.base_width);
  const int64_t b = config.base_width;
  inc = register_module("inc", std::make_shared<UNetDoubleConv>(config.in_channels, b));
  down1 = register_module("down1", std::make_shared<UNetDown>(b, 2 * b));
  down2 = register_module("down2", std::make_shared<UNetDown>(2 * b, 4 * b));
  up1 = register_module("up1", std::make_shared<UNetUp>(4 * b, 2 * b, 2 * b));
  up2 = register_module("up2", std::make_shared<UNetUp>(2 * b, b, b));
  outc = register_module("outc", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(b, config.num_classes, 1)));
}

Tensor UNet::forward(const Tensor& x) {
  DBRQ_ENSURE(x.dim() == 4 && x.size(1) == config_.in_channels && x.size(2) >= 4 && x.size(3) >= 4 &&
                  x.size(2) % 4 == 0 && x.size(3) % 4 == 0,
              dbrq::ShapeError, "UNet: expected images [N, ", config_.in_channels,
              ", H, W] with H and W positive multiples of 4, got ", x.shape_string());
  const Tensor x1 = (*inc)(x);
  const Tensor x2 = (*down1)(x1);
  const Tensor x3 = (*down2)(x2);
  return (*outc)((*up2)((*up1)(x3, x2), x1));
}

}  // namespace zoo
