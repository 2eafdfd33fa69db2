#include "samples/zoo/resnet.h"

#include <utility>

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

namespace {

std::shared_ptr<nn::Conv2dImpl> conv3x3(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

std::shared_ptr<nn::Conv2dImpl> conv1x1(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false));
}

}  // namespace

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride,
                       std::shared_ptr<nn::SequentialImpl> downsample_module) {
  // Registration order follows torchvision so state_dict() lists keys in the same order.
  conv1 = register_module("conv1", conv3x3(inplanes, planes, stride));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2dImpl>(planes));
  relu = register_module("relu", std::make_shared<nn::ReLUImpl>());
  conv2 = register_module("conv2", conv3x3(planes, planes, 1));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2dImpl>(planes));
  if (downsample_module != nullptr) downsample = register_module("downsample", std::move(downsample_module));
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = (*relu)((*bn1)((*conv1)(x)));
  out = (*bn2)((*conv2)(out));
  const Tensor identity = downsample != nullptr ? (*downsample)(x) : x;
  return (*relu)(out + identity);
}

ResNet18::ResNet18(const ResNet18Config& config) : config_(config), inplanes_(config.base_width) {
  DBRQ_ENSURE(config.base_width >= 1 && config.num_classes >= 1, dbrq::ValueError,
              "ResNet18: base_width and num_classes must be >= 1, got ", config.base_width, " and ",
              config.num_classes);
  const int64_t w = config.base_width;
  conv1 = register_module("conv1",
                          std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(3, w, 7).stride(2).padding(3).bias(false)));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2dImpl>(w));
  relu = register_module("relu", std::make_shared<nn::ReLUImpl>());
  maxpool = register_module("maxpool", std::make_shared<nn::MaxPool2dImpl>(3, 2, 1));
  layer1 = register_module("layer1", make_layer(w, 1));
  layer2 = register_module("layer2", make_layer(2 * w, 2));
  layer3 = register_module("layer3", make_layer(4 * w, 2));
  layer4 = register_module("layer4", make_layer(8 * w, 2));
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2dImpl>(1));
  fc = register_module("fc", std::make_shared<nn::LinearImpl>(8 * w, config.num_classes));
}

std::shared_ptr<nn::SequentialImpl> ResNet18::make_layer(int64_t planes, int64_t stride) {
  constexpr int kBlocksPerLayer = 2;  // ResNet-18: [2, 2, 2, 2]
  std::shared_ptr<nn::SequentialImpl> downsample;
  if (stride != 1 || inplanes_ != planes) {
    downsample = std::make_shared<nn::SequentialImpl>(std::vector<std::shared_ptr<nn::Module>>{
        conv1x1(inplanes_, planes, stride), std::make_shared<nn::BatchNorm2dImpl>(planes)});
  }
  auto layer = std::make_shared<nn::SequentialImpl>();
  layer->push_back(std::make_shared<BasicBlock>(inplanes_, planes, stride, std::move(downsample)));
  inplanes_ = planes;
  for (int i = 1; i < kBlocksPerLayer; ++i) layer->push_back(std::make_shared<BasicBlock>(planes, planes, 1, nullptr));
  return layer;
}

Tensor ResNet18::forward(const Tensor& x) {
  Tensor y = (*maxpool)((*relu)((*bn1)((*conv1)(x))));
  y = (*layer4)((*layer3)((*layer2)((*layer1)(y))));
  y = (*avgpool)(y).flatten(1);
  return (*fc)(y);
}

}  // namespace zoo
