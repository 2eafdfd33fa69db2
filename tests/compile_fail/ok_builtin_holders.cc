// Control: libtorch's spellings of built-in holders compile.
#include "runtime/nn.h"

struct NetImpl : dbrq::nn::CallableModule<NetImpl> {
  NetImpl() {
    conv = register_module("conv", dbrq::nn::Conv2d(dbrq::nn::Conv2dOptions(3, 8, 3).stride(2).bias(false)));
    seq = register_module("seq", dbrq::nn::Sequential(dbrq::nn::BatchNorm2d(8), dbrq::nn::ReLU()));
    seq->push_back(dbrq::nn::Conv2d(8, 8, 1));
    raw = register_module("raw", std::make_shared<dbrq::nn::Conv2dImpl>(8, 8, 1));
  }
  dbrq::Tensor forward(const dbrq::Tensor& x) { return (*raw)(seq->forward(conv(x))); }
  dbrq::nn::Conv2d conv{nullptr};
  dbrq::nn::Sequential seq{nullptr};
  std::shared_ptr<dbrq::nn::Conv2dImpl> raw;
};
DBRQ_MODULE(Net);

int main() {
  Net net;
  dbrq::nn::Sequential copy(net->seq);  // shares, as libtorch's holders
  return copy.get() == net->seq.get() ? 0 : 1;
}
