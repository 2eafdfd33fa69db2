#include "samples/zoo/dcgan_generator.h"

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

DcganGenerator::DcganGenerator(const DcganGeneratorConfig& config) : config_(config) {
  DBRQ_ENSURE(config.nz >= 1 && config.ngf >= 1 && config.nc >= 1, dbrq::ValueError,
              "DcganGenerator: nz, ngf and nc must be >= 1, got ", config.nz, ", ", config.ngf, " and ", config.nc);
  const int64_t ngf = config.ngf;
  auto up = [](int64_t in, int64_t out, int64_t stride, int64_t padding) {
    return std::make_shared<nn::ConvTranspose2dImpl>(
        nn::ConvTranspose2dOptions(in, out, 4).stride(stride).padding(padding).bias(false));
  };
  main = register_module("main", std::make_shared<nn::SequentialImpl>());
  main->push_back(up(config.nz, ngf * 4, 1, 0));
  main->push_back(std::make_shared<nn::BatchNorm2dImpl>(ngf * 4));
  main->push_back(std::make_shared<nn::ReLUImpl>());
  main->push_back(up(ngf * 4, ngf * 2, 2, 1));
  main->push_back(std::make_shared<nn::BatchNorm2dImpl>(ngf * 2));
  main->push_back(std::make_shared<nn::ReLUImpl>());
  main->push_back(up(ngf * 2, ngf, 2, 1));
  main->push_back(std::make_shared<nn::BatchNorm2dImpl>(ngf));
  main->push_back(std::make_shared<nn::ReLUImpl>());
  main->push_back(up(ngf, config.nc, 2, 1));
  main->push_back(std::make_shared<nn::TanhImpl>());
}

Tensor DcganGenerator::forward(const Tensor& z) {
  DBRQ_ENSURE(z.dim() == 4 && z.size(1) == config_.nz && z.size(2) == 1 && z.size(3) == 1, dbrq::ShapeError,
              "DcganGenerator: expected latents [N, ", config_.nz, ", 1, 1], got ", z.shape_string());
  return (*main)(z);
}

}  // namespace zoo
