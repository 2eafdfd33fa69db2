#include "samples/zoo/kws_conv1d.h"

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

namespace {
std::shared_ptr<nn::Conv1dImpl> conv_k3(int64_t in, int64_t out) {
  return std::make_shared<nn::Conv1dImpl>(nn::Conv1dOptions(in, out, 3).padding(1).bias(false));
}
}  // namespace

KwsConv1d::KwsConv1d(const KwsConv1dConfig& config) : config_(config) {
  DBRQ_ENSURE(config.n_mfcc >= 1 && config.channels >= 1 && config.num_classes >= 1, dbrq::ValueError,
              "KwsConv1d: n_mfcc, channels and num_classes must be >= 1, got ", config.n_mfcc, ", ", config.channels,
              " and ", config.num_classes);
  const int64_t c = config.channels;
  conv1 = register_module("conv1", conv_k3(config.n_mfcc, c));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm1dImpl>(c));
  relu1 = register_module("relu1", std::make_shared<nn::ReLUImpl>());
  conv2 = register_module("conv2", conv_k3(c, c));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm1dImpl>(c));
  relu2 = register_module("relu2", std::make_shared<nn::ReLUImpl>());
  pool1 = register_module("pool1", std::make_shared<nn::MaxPool1dImpl>(2));
  conv3 = register_module("conv3", conv_k3(c, 2 * c));
  bn3 = register_module("bn3", std::make_shared<nn::BatchNorm1dImpl>(2 * c));
  relu3 = register_module("relu3", std::make_shared<nn::ReLUImpl>());
  pool2 = register_module("pool2", std::make_shared<nn::MaxPool1dImpl>(2));
  conv4 = register_module("conv4", conv_k3(2 * c, 2 * c));
  bn4 = register_module("bn4", std::make_shared<nn::BatchNorm1dImpl>(2 * c));
  relu4 = register_module("relu4", std::make_shared<nn::ReLUImpl>());
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool1dImpl>(1));
  fc = register_module("fc", std::make_shared<nn::LinearImpl>(2 * c, config.num_classes));
}

Tensor KwsConv1d::forward(const Tensor& x) {
  DBRQ_ENSURE(x.dim() == 3 && x.size(1) == config_.n_mfcc && x.size(2) >= 4, dbrq::ShapeError,
              "KwsConv1d: expected features [N, ", config_.n_mfcc, ", frames >= 4], got ", x.shape_string());
  Tensor y = (*relu1)((*bn1)((*conv1)(x)));
  y = (*pool1)((*relu2)((*bn2)((*conv2)(y))));
  y = (*pool2)((*relu3)((*bn3)((*conv3)(y))));
  y = (*relu4)((*bn4)((*conv4)(y)));
  return (*fc)((*avgpool)(y).flatten(1));
}

}  // namespace zoo
