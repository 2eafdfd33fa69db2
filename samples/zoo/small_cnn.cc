#include "samples/zoo/small_cnn.h"

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

SmallCnn::SmallCnn(const SmallCnnConfig& config) : config_(config) {
  DBRQ_ENSURE(config.in_channels >= 1 && config.num_classes >= 1, dbrq::ValueError,
              "SmallCnn: in_channels and num_classes must be >= 1, got ", config.in_channels, " and ",
              config.num_classes);
  // Convs followed by BN carry no bias, as BN's shift makes it redundant (and fusion folds BN in).
  conv1 = register_module(
      "conv1", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(config.in_channels, 16, 3).padding(1).bias(false)));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2dImpl>(16));
  relu1 = register_module("relu1", std::make_shared<nn::ReLUImpl>());
  conv2 = register_module("conv2", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(16, 32, 3).padding(1).bias(false)));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2dImpl>(32));
  relu2 = register_module("relu2", std::make_shared<nn::ReLUImpl>());
  pool = register_module("pool", std::make_shared<nn::MaxPool2dImpl>(2));
  conv3 = register_module("conv3", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(32, 64, 3).padding(1)));
  relu3 = register_module("relu3", std::make_shared<nn::ReLUImpl>());
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2dImpl>(1));
  fc = register_module("fc", std::make_shared<nn::LinearImpl>(64, config.num_classes));
}

Tensor SmallCnn::forward(const Tensor& x) {
  Tensor y = (*relu1)((*bn1)((*conv1)(x)));
  y = (*pool)((*relu2)((*bn2)((*conv2)(y))));
  y = (*relu3)((*conv3)(y));
  return (*fc)((*avgpool)(y).flatten(1));
}

}  // namespace zoo
