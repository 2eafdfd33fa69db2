// ResNet-18 with torchvision's architecture and state-dict keys, so torchvision checkpoints load
// unchanged:
//
//   auto model = std::make_shared<zoo::ResNet18>();   // base width 64, 1000 classes
//   model->load_state_dict(dbrq::load_safetensors("resnet18.safetensors"));  // "layer1.0.conv1.weight", ...
//   model->eval();
//   dbrq::Tensor logits = (*model)(dbrq::randn({1, 3, 224, 224}, 0));        // [1, 1000]
//
// ResNet18Config{.base_width = 8} gives a narrow variant (layerN has base_width << (N - 1)
// channels) with the same key names; the golden tests use it to stay small.
#pragma once

#include <cstdint>
#include <memory>

#include "dbrq.h"

namespace zoo {

struct ResNet18Config {
  int64_t base_width = 64;  // channels of conv1 and layer1 (torchvision: 64)
  int64_t num_classes = 1000;
};

// Two 3x3 convolutions with a residual connection; `downsample` (conv1x1 + BN, or null) adapts
// the identity when the block changes resolution or width.
struct BasicBlock : dbrq::nn::CallableModule<BasicBlock> {
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<dbrq::nn::SequentialImpl> downsample);
  dbrq::Tensor forward(const dbrq::Tensor& x);

  std::shared_ptr<dbrq::nn::Conv2dImpl> conv1;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> bn1;
  // Called twice per forward, as in torchvision; a layer holds no per-call state.
  std::shared_ptr<dbrq::nn::ReLUImpl> relu;
  std::shared_ptr<dbrq::nn::Conv2dImpl> conv2;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> bn2;
  std::shared_ptr<dbrq::nn::SequentialImpl> downsample;  // null when the identity fits
};

struct ResNet18 : dbrq::nn::CallableModule<ResNet18> {
  explicit ResNet18(const ResNet18Config& config = {});
  // [N, 3, H, W] images (H, W >= 32 keep every stage non-empty) -> [N, num_classes] logits.
  dbrq::Tensor forward(const dbrq::Tensor& x);

  const ResNet18Config& config() const { return config_; }

  std::shared_ptr<dbrq::nn::Conv2dImpl> conv1;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> bn1;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu;
  std::shared_ptr<dbrq::nn::MaxPool2dImpl> maxpool;
  std::shared_ptr<dbrq::nn::SequentialImpl> layer1, layer2, layer3, layer4;
  std::shared_ptr<dbrq::nn::AdaptiveAvgPool2dImpl> avgpool;
  std::shared_ptr<dbrq::nn::LinearImpl> fc;

 private:
  std::shared_ptr<dbrq::nn::SequentialImpl> make_layer(int64_t planes, int64_t stride);

  ResNet18Config config_;
  int64_t inplanes_;  // input channels of the next block make_layer creates
};

}  // namespace zoo
