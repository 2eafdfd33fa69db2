// A program outside the dbrq workspace: a tiny user module built on dbrq's public header only.
//
//   cd samples/external_client && bazel run //:client
#include <iostream>
#include <memory>

#include "dbrq.h"

// conv -> BN -> ReLU -> global average pool -> linear, with a residual add inside.
struct TinyNet : dbrq::nn::CallableModule<TinyNet> {
  TinyNet() {
    conv = register_module("conv",
                           std::make_shared<dbrq::nn::Conv2dImpl>(dbrq::nn::Conv2dOptions(3, 8, 3).padding(1).bias(false)));
    bn = register_module("bn", std::make_shared<dbrq::nn::BatchNorm2dImpl>(8));
    relu = register_module("relu", std::make_shared<dbrq::nn::ReLUImpl>());
    fc = register_module("fc", std::make_shared<dbrq::nn::LinearImpl>(8, 4));
  }

  dbrq::Tensor forward(const dbrq::Tensor& x) {
    dbrq::Tensor y = (*relu)((*bn)((*conv)(x)));
    y = y + (*relu)(y);  // a residual-style add, to exercise a binary op on channels-last tensors
    y = dbrq::adaptive_avg_pool2d(y, {1, 1}).flatten(1);
    return dbrq::softmax((*fc)(y), -1);
  }

  std::shared_ptr<dbrq::nn::Conv2dImpl> conv;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> bn;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu;
  std::shared_ptr<dbrq::nn::LinearImpl> fc;
};

int main() {
  try {
    dbrq::manual_seed(0);
    auto net = std::make_shared<TinyNet>();
    net->eval();
    const dbrq::Tensor x = dbrq::randn({2, 3, 16, 16}, /*seed=*/1);
    const dbrq::Tensor probs = (*net)(x);
    std::cout << *net << "\n";
    std::cout << "input " << x.shape_string() << " -> output " << probs.shape_string() << "\n" << probs << "\n";
    // Each row is a softmax, so it sums to 1: a quick self-check that the run was sane.
    const dbrq::Tensor row_sums = dbrq::sum(probs, {1});
    for (int64_t i = 0; i < row_sums.numel(); ++i) {
      const double s = row_sums.at<float>({i});
      if (s < 0.999 || s > 1.001) {
        std::cerr << "row " << i << " sums to " << s << ", expected 1\n";
        return 1;
      }
    }
    std::cout << "ok\n";
    return 0;
  } catch (const dbrq::Error& e) {
    std::cerr << "client: " << e.what() << "\n";
    return 1;
  }
}
