// Code written before built-in layers had holders: std::make_shared<nn::Conv2d>(...) now makes a
// shared_ptr to a holder, which must not register as a module. The error says what to write.
// expect-error: std::shared_ptr to a module holder
#include <memory>

#include "runtime/nn.h"

struct Net : dbrq::nn::CallableModule<Net> {
  Net() { c = register_module("c", std::make_shared<dbrq::nn::Conv2d>(3, 3, 1)); }
  dbrq::Tensor forward(const dbrq::Tensor& x) { return (*c)(x); }
  std::shared_ptr<dbrq::nn::Conv2d> c;
};

int main() { Net n; }
