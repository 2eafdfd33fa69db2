// A subclass of a built-in layer would have its forward ignored by the layer's call operator.
// expect-error: cannot derive from 'final' base 'dbrq::nn::Conv2dImpl'
#include "runtime/nn.h"

struct MyConv : dbrq::nn::Conv2dImpl {
  MyConv() : Conv2dImpl(3, 3, 1) {}
  dbrq::Tensor forward(const dbrq::Tensor& x) { return Conv2dImpl::forward(x) * 2.0; }
};

int main() { MyConv c; }
