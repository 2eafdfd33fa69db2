// A subclass of a built-in layer would have its forward ignored by the layer's call operator.
// Layer classes are not final (a holder wraps them in HookedForward, so that `conv->forward(x)` is
// the hooked call); registering such a subclass as a child is refused at compile time instead, and
// calling one throws UsageError (//tests/porting:builtin_holders_test).
// expect-error: its call operator would run the base's forward, never X's
#include <memory>

#include "runtime/nn.h"

struct MyConv : dbrq::nn::Conv2dImpl {
  MyConv() : Conv2dImpl(3, 3, 1) {}
  dbrq::Tensor forward(const dbrq::Tensor& x) { return Conv2dImpl::forward(x) * 2.0; }
};
struct Net : dbrq::nn::CallableModule<Net> {
  Net() { c = register_module("c", std::make_shared<MyConv>()); }
  dbrq::Tensor forward(const dbrq::Tensor& x) { return (*c)(x); }
  std::shared_ptr<MyConv> c;
};

int main() { Net n; }
