// A U-Net-style segmentation net (Ronneberger et al., 2015) with three resolution levels: two
// max-pool down steps, two stride-2 transposed-conv up steps that concatenate the encoder's skip
// features, and a 1x1 conv head giving per-pixel class logits.
//
//   auto net = std::make_shared<zoo::UNet>();                    // 3 -> 4 classes, base width 32
//   net->eval();
//   dbrq::Tensor logits = (*net)(dbrq::randn({2, 3, 128, 128}, 0));  // [2, 4, 128, 128]
//
//   inc    DoubleConv(in -> b)                                          H x W
//   down1  MaxPool2d(2), DoubleConv(b -> 2b)                            H/2
//   down2  MaxPool2d(2), DoubleConv(2b -> 4b)                           H/4
//   up1    ConvTranspose2d(4b -> 2b, 2, stride 2), cat(down1 out, .), DoubleConv(4b -> 2b)   H/2
//   up2    ConvTranspose2d(2b -> b, 2, stride 2), cat(inc out, .), DoubleConv(2b -> b)       H
//   outc   Conv2d(b -> num_classes, 1)
// A DoubleConv is conv1 (3x3, pad 1, no bias) + bn1 + relu1 + conv2 + bn2 + relu2.
#pragma once

#include <cstdint>
#include <memory>

#include "dbrq.h"

namespace zoo {

struct UNetConfig {
  int64_t in_channels = 3;
  int64_t num_classes = 4;
  int64_t base_width = 32;  // channels of the first level (levels have b, 2b, 4b)
};

struct UNetDoubleConv : dbrq::nn::CallableModule<UNetDoubleConv> {
  UNetDoubleConv(int64_t in_channels, int64_t out_channels);
  dbrq::Tensor forward(const dbrq::Tensor& x);

  std::shared_ptr<dbrq::nn::Conv2dImpl> conv1;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> bn1;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu1;
  std::shared_ptr<dbrq::nn::Conv2dImpl> conv2;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> bn2;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu2;
};

// Max pool 2x2, then a DoubleConv.
struct UNetDown : dbrq::nn::CallableModule<UNetDown> {
  UNetDown(int64_t in_channels, int64_t out_channels);
  dbrq::Tensor forward(const dbrq::Tensor& x);

  std::shared_ptr<dbrq::nn::MaxPool2dImpl> pool;
  std::shared_ptr<UNetDoubleConv> conv;
};

// Upsamples x 2x with a transposed conv (in -> in/2 channels), concatenates the skip features
// (skip_channels) in front of it and runs a DoubleConv to out_channels.
struct UNetUp : dbrq::nn::CallableModule<UNetUp> {
  UNetUp(int64_t in_channels, int64_t skip_channels, int64_t out_channels);
  // x [N, in, h, w], skip [N, skip_channels, 2h, 2w] -> [N, out, 2h, 2w]
  dbrq::Tensor forward(const dbrq::Tensor& x, const dbrq::Tensor& skip);

  std::shared_ptr<dbrq::nn::ConvTranspose2dImpl> up;
  std::shared_ptr<UNetDoubleConv> conv;
};

struct UNet : dbrq::nn::CallableModule<UNet> {
  explicit UNet(const UNetConfig& config = {});
  // [N, in_channels, H, W] with H and W multiples of 4 -> [N, num_classes, H, W] logits; throws
  // dbrq::ShapeError otherwise.
  dbrq::Tensor forward(const dbrq::Tensor& x);

  const UNetConfig& config() const { return config_; }

  std::shared_ptr<UNetDoubleConv> inc;
  std::shared_ptr<UNetDown> down1, down2;
  std::shared_ptr<UNetUp> up1, up2;
  std::shared_ptr<dbrq::nn::Conv2dImpl> outc;

 private:
  UNetConfig config_;
};

}  // namespace zoo
