// MobileNetV2 with torchvision's architecture and state-dict keys ("features.0.0.weight",
// "features.1.conv.0.0.weight", "classifier.1.weight", ...), so torchvision checkpoints load unchanged:
//
//   auto model = std::make_shared<zoo::MobileNetV2>();                   // width 1.0, 1000 classes
//   model->load_state_dict(dbrq::load_safetensors("mobilenet_v2.safetensors"));
//   model->eval();
//   dbrq::Tensor logits = (*model)(dbrq::randn({1, 3, 224, 224}, 0));   // [1, 1000]
//
// width_mult scales every channel count and rounds it to a multiple of 8 exactly as torchvision's
// _make_divisible does, so MobileNetV2Config{0.25, 10} matches torchvision.models.MobileNetV2(10, 0.25).
#pragma once

#include <cstdint>
#include <memory>

#include "dbrq.h"

namespace zoo {

struct MobileNetV2Config {
  double width_mult = 1.0;
  int64_t num_classes = 1000;
};

// torchvision's _make_divisible: `v` rounded to the nearest multiple of `divisor`, at least
// `divisor`, and never more than 10% below `v`.
int64_t make_divisible(double v, int64_t divisor = 8);

// Expand (1x1, skipped when expand_ratio is 1), depthwise 3x3, project (1x1, linear); the input is
// added back when the block keeps resolution and width.
struct InvertedResidual : dbrq::nn::CallableModule<InvertedResidual> {
  InvertedResidual(int64_t inp, int64_t oup, int64_t stride, int64_t expand_ratio);
  dbrq::Tensor forward(const dbrq::Tensor& x);

  bool use_res_connect() const { return use_res_connect_; }

  std::shared_ptr<dbrq::nn::SequentialImpl> conv;

 private:
  bool use_res_connect_;
};

struct MobileNetV2 : dbrq::nn::CallableModule<MobileNetV2> {
  explicit MobileNetV2(const MobileNetV2Config& config = {});
  // [N, 3, H, W] images -> [N, num_classes] logits.
  dbrq::Tensor forward(const dbrq::Tensor& x);

  const MobileNetV2Config& config() const { return config_; }
  int64_t last_channel() const { return last_channel_; }

  std::shared_ptr<dbrq::nn::SequentialImpl> features;
  std::shared_ptr<dbrq::nn::SequentialImpl> classifier;  // Dropout(0.2), Linear

 private:
  MobileNetV2Config config_;
  int64_t last_channel_;
};

}  // namespace zoo
