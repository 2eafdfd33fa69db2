// libtorch C++ frontend models, written as libtorch's docs and examples write them: the DCGAN
// generator and discriminator of pytorch/examples' cpp/dcgan (the C++ frontend tutorial), and a
// small ResNet of BasicBlocks written as torchvision's C++ port writes its blocks (holders,
// options, Sequential, nn::init over modules(), torch::relu, x.view).
//
// This file is NOT compiled: it is the libtorch source. libtorch_models.h is its dbrq port, and
// //tests/porting:port_diff_test checks that the port is this file with only the include and the
// namespace changed (port_diff.sh applies exactly those substitutions and diffs).
#pragma once

#include <torch/torch.h>

namespace ported {

using namespace torch;

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

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(batch_norm1(conv1(x)));
    x = torch::relu(batch_norm2(conv2(x)));
    x = torch::relu(batch_norm3(conv3(x)));
    x = torch::tanh(conv4(x));
    return x;
  }

  nn::ConvTranspose2d conv1, conv2, conv3, conv4;
  nn::BatchNorm2d batch_norm1, batch_norm2, batch_norm3;
};

TORCH_MODULE(DCGANGenerator);

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

struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t inplanes, int64_t planes, int64_t stride = 1,
                 torch::nn::Sequential downsample = nullptr)
      : conv1(torch::nn::Conv2dOptions(inplanes, planes, 3).stride(stride).padding(1).bias(false)),
        bn1(planes),
        conv2(torch::nn::Conv2dOptions(planes, planes, 3).stride(1).padding(1).bias(false)),
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

  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor identity = x;

    torch::Tensor out = conv1->forward(x);
    out = bn1->forward(out);
    out = torch::relu(out);

    out = conv2->forward(out);
    out = bn2->forward(out);

    if (!downsample.is_empty()) {
      identity = downsample->forward(x);
    }

    out += identity;
    return torch::relu(out);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::BatchNorm2d bn1, bn2;
  torch::nn::Sequential downsample;
};
TORCH_MODULE(BasicBlock);

struct TinyResNetImpl : torch::nn::Module {
  explicit TinyResNetImpl(int64_t num_classes = 10)
      : conv1(torch::nn::Conv2dOptions(3, 16, 3).stride(1).padding(1).bias(false)),
        bn1(16),
        layer1(BasicBlock(16, 16), BasicBlock(16, 16)),
        layer2(BasicBlock(16, 32, 2,
                          torch::nn::Sequential(
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 1).stride(2).bias(false)),
                              torch::nn::BatchNorm2d(32))),
               BasicBlock(32, 32)),
        fc(32, num_classes) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("layer1", layer1);
    register_module("layer2", layer2);
    register_module("fc", fc);

    for (auto& module : modules(/*include_self=*/false)) {
      if (auto M = dynamic_cast<torch::nn::Conv2dImpl*>(module.get())) {
        torch::nn::init::kaiming_normal_(M->weight, /*a=*/0, torch::kFanOut, torch::kReLU);
      } else if (auto M = dynamic_cast<torch::nn::BatchNorm2dImpl*>(module.get())) {
        torch::nn::init::constant_(M->weight, 1);
        torch::nn::init::constant_(M->bias, 0);
      }
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    x = conv1->forward(x);
    x = bn1->forward(x);
    x = torch::relu(x);

    x = layer1->forward(x);
    x = layer2->forward(x);

    x = torch::adaptive_avg_pool2d(x, {1, 1});
    x = x.view({x.size(0), -1});
    x = fc->forward(x);
    return x;
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Sequential layer1, layer2;
  torch::nn::Linear fc;
};
TORCH_MODULE(TinyResNet);

}  // namespace ported
