// The residual digits CNN of issue 13, the C++ twin of tools/train_digits_residual.py's
// DigitsResidual (same layer names and order, so its trained weights load with strict keys):
//
//   auto model = std::make_shared<dbrq::testing::DigitsResidual>();
//   model->load_state_dict(dbrq::load_safetensors("samples/data/digits_residual.safetensors"), true);
//   model->eval();
//   dbrq::Tensor logits = (*model)(images);   // [N, 1, 8, 8] -> [N, 10]
//
//   conv1 (1->16, 3x3, pad 1) + bn1 + relu1     8x8
//   conv2 (16->32, 3x3, pad 1) + bn2 + relu2    8x8
//   pool (max 2x2)                              4x4
//   y + relu3(bn3(conv3(y)))                    conv3 32->32
//   conv4 (32->64, 3x3, pad 1) + relu4
//   avgpool (adaptive 1x1), flatten, fc (64->10)
#pragma once

#include <memory>

#include "dbrq.h"

namespace dbrq::testing {

struct DigitsResidual : nn::CallableModule<DigitsResidual> {
  DigitsResidual() {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(1, 16, 3).padding(1).bias(false)));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2dImpl>(16));
    relu1 = register_module("relu1", std::make_shared<nn::ReLUImpl>());
    conv2 = register_module("conv2", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(16, 32, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2dImpl>(32));
    relu2 = register_module("relu2", std::make_shared<nn::ReLUImpl>());
    pool = register_module("pool", std::make_shared<nn::MaxPool2dImpl>(2));
    conv3 = register_module("conv3", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(32, 32, 3).padding(1).bias(false)));
    bn3 = register_module("bn3", std::make_shared<nn::BatchNorm2dImpl>(32));
    relu3 = register_module("relu3", std::make_shared<nn::ReLUImpl>());
    conv4 = register_module("conv4", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(32, 64, 3).padding(1)));
    relu4 = register_module("relu4", std::make_shared<nn::ReLUImpl>());
    avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2dImpl>(1));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(64, 10));
  }

  Tensor forward(const Tensor& x) {
    Tensor y = (*relu1)((*bn1)((*conv1)(x)));
    y = (*pool)((*relu2)((*bn2)((*conv2)(y))));
    y = y + (*relu3)((*bn3)((*conv3)(y)));
    y = (*relu4)((*conv4)(y));
    return (*fc)((*avgpool)(y).flatten(1));
  }

  std::shared_ptr<nn::Conv2dImpl> conv1, conv2, conv3, conv4;
  std::shared_ptr<nn::BatchNorm2dImpl> bn1, bn2, bn3;
  std::shared_ptr<nn::ReLUImpl> relu1, relu2, relu3, relu4;
  std::shared_ptr<nn::MaxPool2dImpl> pool;
  std::shared_ptr<nn::AdaptiveAvgPool2dImpl> avgpool;
  std::shared_ptr<nn::LinearImpl> fc;
};

}  // namespace dbrq::testing
