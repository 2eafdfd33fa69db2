// A DCGAN generator (Radford et al., 2016) for 32x32 images, laid out as PyTorch's DCGAN example
// writes it: one Sequential `main`, so its state-dict keys are "main.0.weight", "main.1.running_mean", ...
//
//   auto g = std::make_shared<zoo::DcganGenerator>();          // nz 64, ngf 32, 3 channels
//   g->eval();
//   dbrq::Tensor images = (*g)(dbrq::randn({4, 64, 1, 1}, 0));  // [4, 3, 32, 32] in (-1, 1)
//
//   main.0  ConvTranspose2d(nz -> 4 ngf, 4, stride 1, pad 0) + main.1 BN + main.2 ReLU    4x4
//   main.3  ConvTranspose2d(4 ngf -> 2 ngf, 4, stride 2, pad 1) + main.4 BN + main.5 ReLU  8x8
//   main.6  ConvTranspose2d(2 ngf -> ngf, 4, stride 2, pad 1) + main.7 BN + main.8 ReLU    16x16
//   main.9  ConvTranspose2d(ngf -> nc, 4, stride 2, pad 1) + main.10 Tanh                   32x32
// No transposed conv has a bias (batch norm's shift replaces it; the last one has none in DCGAN).
#pragma once

#include <cstdint>
#include <memory>

#include "dbrq.h"

namespace zoo {

struct DcganGeneratorConfig {
  int64_t nz = 64;   // latent channels
  int64_t ngf = 32;  // feature maps of the last hidden block (the first has 4 ngf)
  int64_t nc = 3;    // image channels
};

struct DcganGenerator : dbrq::nn::CallableModule<DcganGenerator> {
  explicit DcganGenerator(const DcganGeneratorConfig& config = {});
  // [N, nz, 1, 1] latents -> [N, nc, 32, 32] images in (-1, 1). Throws dbrq::ShapeError on another
  // input shape (a [N, nz] latent needs .view({N, nz, 1, 1}) first).
  dbrq::Tensor forward(const dbrq::Tensor& z);

  const DcganGeneratorConfig& config() const { return config_; }

  std::shared_ptr<dbrq::nn::SequentialImpl> main;

 private:
  DcganGeneratorConfig config_;
};

}  // namespace zoo
