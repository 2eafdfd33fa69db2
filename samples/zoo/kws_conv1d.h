// A keyword-spotting net over MFCC features (speech commands style: 40 coefficients x 98 frames of
// 10 ms), built from Conv1d + BatchNorm1d + ReLU blocks, 1-D max pooling and a global average:
//
//   auto kws = std::make_shared<zoo::KwsConv1d>();            // 40 MFCCs, 64 channels, 12 keywords
//   kws->eval();
//   dbrq::Tensor logits = (*kws)(dbrq::randn({8, 40, 98}, 0));  // [8, 12]
//
//   conv1 (n_mfcc -> c, 3, pad 1) + bn1 + relu1                 98 frames
//   conv2 (c -> c, 3, pad 1) + bn2 + relu2, pool1 (max 2)        49
//   conv3 (c -> 2c, 3, pad 1) + bn3 + relu3, pool2 (max 2)       24
//   conv4 (2c -> 2c, 3, pad 1) + bn4 + relu4                     24
//   avgpool (adaptive 1), flatten, fc (2c -> num_classes)
#pragma once

#include <cstdint>
#include <memory>

#include "dbrq.h"

namespace zoo {

struct KwsConv1dConfig {
  int64_t n_mfcc = 40;
  int64_t channels = 64;
  int64_t num_classes = 12;  // the 10 Speech Commands keywords + "silence" + "unknown"
};

struct KwsConv1d : dbrq::nn::CallableModule<KwsConv1d> {
  explicit KwsConv1d(const KwsConv1dConfig& config = {});
  // [N, n_mfcc, frames] (frames >= 4) -> [N, num_classes] logits; any number of frames.
  dbrq::Tensor forward(const dbrq::Tensor& x);

  const KwsConv1dConfig& config() const { return config_; }

  std::shared_ptr<dbrq::nn::Conv1dImpl> conv1;
  std::shared_ptr<dbrq::nn::BatchNorm1dImpl> bn1;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu1;
  std::shared_ptr<dbrq::nn::Conv1dImpl> conv2;
  std::shared_ptr<dbrq::nn::BatchNorm1dImpl> bn2;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu2;
  std::shared_ptr<dbrq::nn::MaxPool1dImpl> pool1;
  std::shared_ptr<dbrq::nn::Conv1dImpl> conv3;
  std::shared_ptr<dbrq::nn::BatchNorm1dImpl> bn3;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu3;
  std::shared_ptr<dbrq::nn::MaxPool1dImpl> pool2;
  std::shared_ptr<dbrq::nn::Conv1dImpl> conv4;
  std::shared_ptr<dbrq::nn::BatchNorm1dImpl> bn4;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu4;
  std::shared_ptr<dbrq::nn::AdaptiveAvgPool1dImpl> avgpool;
  std::shared_ptr<dbrq::nn::LinearImpl> fc;

 private:
  KwsConv1dConfig config_;
};

}  // namespace zoo
