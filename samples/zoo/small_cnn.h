// A small CNN for 8x8 single-channel digit images (scikit-learn's digits data set, 10 classes),
// built from ops that all have int8 kernels so it can be quantized end to end:
//
//   auto model = std::make_shared<zoo::SmallCnn>();
//   model->eval();
//   dbrq::Tensor logits = (*model)(dbrq::randn({4, 1, 8, 8}, 0));   // [4, 10]
//
//   conv1 (1->16, 3x3, pad 1) + bn1 + relu1     8x8
//   conv2 (16->32, 3x3, pad 1) + bn2 + relu2    8x8
//   pool (max 2x2)                              4x4
//   conv3 (32->64, 3x3, pad 1) + relu3          4x4
//   avgpool (adaptive 1x1), flatten, fc (64->10)
//
// Every ReLU is its own module so conv-bn-relu fusion patterns see distinct call sites.
#pragma once

#include <cstdint>
#include <memory>

#include "dbrq.h"

namespace zoo {

struct SmallCnnConfig {
  int64_t in_channels = 1;
  int64_t num_classes = 10;
};

struct SmallCnn : dbrq::nn::CallableModule<SmallCnn> {
  explicit SmallCnn(const SmallCnnConfig& config = {});
  // [N, in_channels, H, W] (H, W >= 2) -> [N, num_classes] logits.
  dbrq::Tensor forward(const dbrq::Tensor& x);

  const SmallCnnConfig& config() const { return config_; }

  std::shared_ptr<dbrq::nn::Conv2dImpl> conv1;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> bn1;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu1;
  std::shared_ptr<dbrq::nn::Conv2dImpl> conv2;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> bn2;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu2;
  std::shared_ptr<dbrq::nn::MaxPool2dImpl> pool;
  std::shared_ptr<dbrq::nn::Conv2dImpl> conv3;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu3;
  std::shared_ptr<dbrq::nn::AdaptiveAvgPool2dImpl> avgpool;
  std::shared_ptr<dbrq::nn::LinearImpl> fc;

 private:
  SmallCnnConfig config_;
};

}  // namespace zoo
