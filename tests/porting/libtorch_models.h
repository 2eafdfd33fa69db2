// The dbrq port of libtorch_models.torch.h (libtorch's DCGAN example and a torchvision-style
// ResNet of BasicBlocks): that file with `#include <torch/torch.h>` -> `#include "dbrq.h"`,
// `torch::` -> `dbrq::` and TORCH_MODULE -> DBRQ_MODULE, nothing else (checked by
// //tests/porting:port_diff_test). Run against PyTorch twins by verbatim_port_test.cc.
#pragma once

#include "dbrq.h"

namespace ported {

using namespace dbrq;

struct DCGANGeneratorImpl : nn::Module {
  DCGANGeneratorImpl(int kNoiseSize)
      : conv1(nn::ConvTranspose2dOptions(kNoiseSize, 256, 4)
                  .bias(false)),
        batch_norm1(256),
        conv2(nn::ConvTranspose2dOptions(256, 128, 3)
                  .stride(2)
                  .padding(1)
                  .bias(false)),
        batch_norm2(128),
        conv3(nn::ConvTranspose2dOptions(128, 64, 4)
                  .stride(2)
                  .padding(1)
                  .bias(false)),
        batch_norm3(64),
        conv4(nn::ConvTranspose2dOptions(64, 1, 4)
                  .stride(2)
                  .padding(1)
                  .bias(false))
  {
    // register_module() is needed if we want to use the parameters() method later on
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv3", conv3);
    register_module("conv4", conv4);
    register_module("batch_norm1", batch_norm1);
    register_module("batch_norm2", batch_norm2);
    register_module("batch_norm3", batch_norm3);
  }

  dbrq::Tensor forward(dbrq::Tensor x) {
    x = dbrq::relu(batch_norm1(conv1(x)));
    x = dbrq::relu(batch_norm2(conv2(x)));
    x = dbrq::relu(batch_norm3(conv3(x)));
    x = dbrq::tanh(conv4(x));
    return x;
  }

  nn::ConvTranspose2d conv1, conv2, conv3, conv4;
  nn::BatchNorm2d batch_norm1, batch_norm2, batch_norm3;
};

DBRQ_MODULE(DCGANGenerator);

inline nn::Sequential make_discriminator() {
  nn::Sequential discriminator(
      // Layer 1
      nn::Conv2d(
          nn::Conv2dOptions(1, 64, 4).stride(2).padding(1).bias(false)),
      nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
      // Layer 2
      nn::Conv2d(
          nn::Conv2dOptions(64, 128, 4).stride(2).padding(1).bias(false)),
      nn::BatchNorm2d(128),
      nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
      // Layer 3
      nn::Conv2d(
          nn::Conv2dOptions(128, 256, 4).stride(2).padding(1).bias(false)),
      nn::BatchNorm2d(256),
      nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
      // Layer 4
      nn::Conv2d(
          nn::Conv2dOptions(256, 1, 3).stride(1).padding(0).bias(false)),
      nn::Sigmoid());
  return discriminator;
}

struct BasicBlockImpl : dbrq::nn::Module {
  BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride = 1,
                 dbrq::nn::Sequential downsample = nullptr)
      : conv1(dbrq::nn::Conv2dOptions(inplanes, planes, 3).stride(stride).padding(1).bias(false)),
        bn1(planes),
        conv2(dbrq::nn::Conv2dOptions(planes, planes, 3).stride(1).padding(1).bias(false)),
        bn2(planes),
        downsample(downsample) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (!downsample.is_empty()) {
      register_module("downsample", downsample);
    }
  }

  dbrq::Tensor forward(dbrq::Tensor x) {
    dbrq::Tensor identity = x;

    dbrq::Tensor out = conv1->forward(x);
    out = bn1->forward(out);
    out = dbrq::relu(out);

    out = conv2->forward(out);
    out = bn2->forward(out);

    if (!downsample.is_empty()) {
      identity = downsample->forward(x);
    }

    out += identity;
    return dbrq::relu(out);
  }

  dbrq::nn::Conv2d conv1, conv2;
  dbrq::nn::BatchNorm2d bn1, bn2;
  dbrq::nn::Sequential downsample;
};
DBRQ_MODULE(BasicBlock);

struct TinyResNetImpl : dbrq::nn::Module {
  explicit TinyResNetImpl(int64_t num_classes = 10)
      : conv1(dbrq::nn::Conv2dOptions(3, 16, 3).stride(1).padding(1).bias(false)),
        bn1(16),
        layer1(BasicBlock(16, 16), BasicBlock(16, 16)),
        layer2(BasicBlock(16, 32, 2,
                          dbrq::nn::Sequential(
                              dbrq::nn::Conv2d(dbrq::nn::Conv2dOptions(16, 32, 1).stride(2).bias(false)),
                              dbrq::nn::BatchNorm2d(32))),
               BasicBlock(32, 32)),
        fc(32, num_classes) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("layer1", layer1);
    register_module("layer2", layer2);
    register_module("fc", fc);

    for (auto& module : modules(/*include_self=*/false)) {
      if (auto M = dynamic_cast<dbrq::nn::Conv2dImpl*>(module.get())) {
        dbrq::nn::init::kaiming_normal_(M->weight, /*a=*/0, dbrq::kFanOut, dbrq::kReLU);
      } else if (auto M = dynamic_cast<dbrq::nn::BatchNorm2dImpl*>(module.get())) {
        dbrq::nn::init::constant_(M->weight, 1);
        dbrq::nn::init::constant_(M->bias, 0);
      }
    }
  }

  dbrq::Tensor forward(dbrq::Tensor x) {
    x = conv1->forward(x);
    x = bn1->forward(x);
    x = dbrq::relu(x);

    x = layer1->forward(x);
    x = layer2->forward(x);

    x = dbrq::adaptive_avg_pool2d(x, {1, 1});
    x = x.view({x.size(0), -1});
    x = fc->forward(x);
    return x;
  }

  dbrq::nn::Conv2d conv1;
  dbrq::nn::BatchNorm2d bn1;
  dbrq::nn::Sequential layer1, layer2;
  dbrq::nn::Linear fc;
};
DBRQ_MODULE(TinyResNet);

}  // namespace ported
