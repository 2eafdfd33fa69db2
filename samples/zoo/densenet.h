// DenseNet with torchvision's architecture and state-dict keys (DenseNet-121 by default), so
// torchvision checkpoints load unchanged. Its dense layers are pre-activation blocks (batch norm ->
// relu -> conv on the concatenation of every earlier feature map), the case where a batch norm
// cannot be folded into the conv before it and runs as an int8 op of its own:
//
//   auto model = std::make_shared<zoo::DenseNet>();   // DenseNet-121: growth 32, blocks 6-12-24-16
//   model->load_state_dict(dbrq::load_safetensors("densenet121.safetensors"));  // "features.denseblock1...."
//   model->eval();
//   dbrq::Tensor logits = (*model)(dbrq::randn({1, 3, 224, 224}, 0));           // [1, 1000]
//
//   features: conv0 (7x7 / 2) + norm0 + relu0, pool0 (max 3x3 / 2), then per block
//     denseblockK: denselayerJ = cat(features) -> norm1 -> relu1 -> conv1 (1x1, bn_size * growth)
//                                -> norm2 -> relu2 -> conv2 (3x3, growth); the block returns the cat
//     transitionK (between blocks): norm -> relu -> conv (1x1, half the channels) -> pool (avg 2x2 / 2)
//     norm5
//   relu, adaptive average pool 1x1, flatten, classifier (linear)
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dbrq.h"

namespace zoo {

struct DenseNetConfig {
  int64_t growth_rate = 32;                        // channels each dense layer adds
  std::vector<int64_t> block_config = {6, 12, 24, 16};  // dense layers per block
  int64_t num_init_features = 64;                  // channels of conv0
  int64_t bn_size = 4;                             // conv1 has bn_size * growth_rate channels
  int64_t num_classes = 1000;
};

struct DenseLayer : dbrq::nn::CallableModule<DenseLayer> {
  DenseLayer(int64_t in_features, int64_t growth_rate, int64_t bn_size);
  // The cat of every earlier feature map -> growth_rate new channels.
  dbrq::Tensor forward(const std::vector<dbrq::Tensor>& features);

  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> norm1;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu1;
  std::shared_ptr<dbrq::nn::Conv2dImpl> conv1;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> norm2;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu2;
  std::shared_ptr<dbrq::nn::Conv2dImpl> conv2;
};

struct DenseBlock : dbrq::nn::CallableModule<DenseBlock> {
  DenseBlock(int64_t num_layers, int64_t in_features, int64_t growth_rate, int64_t bn_size);
  dbrq::Tensor forward(const dbrq::Tensor& x);

  std::vector<std::shared_ptr<DenseLayer>> layers;  // "denselayer1", ...
};

struct Transition : dbrq::nn::CallableModule<Transition> {
  Transition(int64_t in_features, int64_t out_features);
  dbrq::Tensor forward(const dbrq::Tensor& x);

  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> norm;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu;
  std::shared_ptr<dbrq::nn::Conv2dImpl> conv;
  std::shared_ptr<dbrq::nn::AvgPool2dImpl> pool;
};

// torchvision's `features` Sequential: its children in order, keyed conv0, norm0, ..., norm5.
struct DenseNetFeatures : dbrq::nn::CallableModule<DenseNetFeatures> {
  explicit DenseNetFeatures(const DenseNetConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& x);

  std::shared_ptr<dbrq::nn::Conv2dImpl> conv0;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> norm0;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu0;
  std::shared_ptr<dbrq::nn::MaxPool2dImpl> pool0;
  std::vector<std::shared_ptr<DenseBlock>> blocks;        // "denseblock1", ...
  std::vector<std::shared_ptr<Transition>> transitions;   // "transition1", ... (one fewer)
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> norm5;
  int64_t num_features = 0;  // channels of the output
};

struct DenseNet : dbrq::nn::CallableModule<DenseNet> {
  explicit DenseNet(const DenseNetConfig& config = {});
  // [N, 3, H, W] (H, W >= 32 for 4 blocks) -> [N, num_classes] logits.
  dbrq::Tensor forward(const dbrq::Tensor& x);
  const DenseNetConfig& config() const { return config_; }

  std::shared_ptr<DenseNetFeatures> features;
  std::shared_ptr<dbrq::nn::LinearImpl> classifier;

 private:
  DenseNetConfig config_;
};

}  // namespace zoo
