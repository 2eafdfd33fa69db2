#include "samples/zoo/densenet.h"

#include <string>

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

namespace {

std::shared_ptr<nn::Conv2dImpl> conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  return std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
}

}  // namespace

DenseLayer::DenseLayer(int64_t in_features, int64_t growth_rate, int64_t bn_size) {
  norm1 = register_module("norm1", std::make_shared<nn::BatchNorm2dImpl>(in_features));
  relu1 = register_module("relu1", std::make_shared<nn::ReLUImpl>());
  conv1 = register_module("conv1", conv(in_features, bn_size * growth_rate, 1, 1, 0));
  norm2 = register_module("norm2", std::make_shared<nn::BatchNorm2dImpl>(bn_size * growth_rate));
  relu2 = register_module("relu2", std::make_shared<nn::ReLUImpl>());
  conv2 = register_module("conv2", conv(bn_size * growth_rate, growth_rate, 3, 1, 1));
}

Tensor DenseLayer::forward(const std::vector<Tensor>& features) {
  const Tensor x = dbrq::cat(features, 1);
  return (*conv2)((*relu2)((*norm2)((*conv1)((*relu1)((*norm1)(x))))));
}

DenseBlock::DenseBlock(int64_t num_layers, int64_t in_features, int64_t growth_rate, int64_t bn_size) {
  for (int64_t i = 0; i < num_layers; ++i) {
    layers.push_back(register_module("denselayer" + std::to_string(i + 1),
                                     std::make_shared<DenseLayer>(in_features + i * growth_rate, growth_rate, bn_size)));
  }
}

Tensor DenseBlock::forward(const Tensor& x) {
  std::vector<Tensor> features = {x};
  for (const auto& layer : layers) features.push_back((*layer)(features));
  return dbrq::cat(features, 1);
}

Transition::Transition(int64_t in_features, int64_t out_features) {
  norm = register_module("norm", std::make_shared<nn::BatchNorm2dImpl>(in_features));
  relu = register_module("relu", std::make_shared<nn::ReLUImpl>());
  conv = register_module("conv", zoo::conv(in_features, out_features, 1, 1, 0));
  pool = register_module("pool", std::make_shared<nn::AvgPool2dImpl>(2, 2));
}

Tensor Transition::forward(const Tensor& x) { return (*pool)((*conv)((*relu)((*norm)(x)))); }

DenseNetFeatures::DenseNetFeatures(const DenseNetConfig& c) {
  conv0 = register_module("conv0", conv(3, c.num_init_features, 7, 2, 3));
  norm0 = register_module("norm0", std::make_shared<nn::BatchNorm2dImpl>(c.num_init_features));
  relu0 = register_module("relu0", std::make_shared<nn::ReLUImpl>());
  pool0 = register_module("pool0", std::make_shared<nn::MaxPool2dImpl>(3, 2, 1));
  int64_t n = c.num_init_features;
  for (size_t i = 0; i < c.block_config.size(); ++i) {
    blocks.push_back(register_module("denseblock" + std::to_string(i + 1),
                                     std::make_shared<DenseBlock>(c.block_config[i], n, c.growth_rate, c.bn_size)));
    n += c.block_config[i] * c.growth_rate;
    if (i + 1 != c.block_config.size()) {
      transitions.push_back(
          register_module("transition" + std::to_string(i + 1), std::make_shared<Transition>(n, n / 2)));
      n /= 2;
    }
  }
  norm5 = register_module("norm5", std::make_shared<nn::BatchNorm2dImpl>(n));
  num_features = n;
}

Tensor DenseNetFeatures::forward(const Tensor& x) {
  Tensor y = (*pool0)((*relu0)((*norm0)((*conv0)(x))));
  for (size_t i = 0; i < blocks.size(); ++i) {
    y = (*blocks[i])(y);
    if (i < transitions.size()) y = (*transitions[i])(y);
  }
  return (*norm5)(y);
}

DenseNet::DenseNet(const DenseNetConfig& config) : config_(config) {
  DBRQ_ENSURE(config.growth_rate >= 1 && config.num_init_features >= 1 && config.bn_size >= 1 &&
                  config.num_classes >= 1 && !config.block_config.empty(),
              dbrq::ValueError,
              "DenseNet: growth_rate, num_init_features, bn_size and num_classes must be >= 1 and block_config "
              "non-empty");
  features = register_module("features", std::make_shared<DenseNetFeatures>(config));
  classifier = register_module("classifier", std::make_shared<nn::LinearImpl>(features->num_features, config.num_classes));
}

Tensor DenseNet::forward(const Tensor& x) {
  const Tensor f = dbrq::relu((*features)(x));
  return (*classifier)(dbrq::flatten(dbrq::adaptive_avg_pool2d(f, {1, 1}), 1));
}

}  // namespace zoo
