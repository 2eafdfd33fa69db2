// struct Derived : Base, Base a CallableModule<Base>: Derived's forward would never run. Registering
// such a class as a child is refused at compile time.
// expect-error: its call operator would run the base's forward, never X's
#include <memory>

#include "runtime/nn.h"

struct Base : dbrq::nn::CallableModule<Base> {
  dbrq::Tensor forward(const dbrq::Tensor& x) { return x; }
};
struct Derived : Base {
  dbrq::Tensor forward(const dbrq::Tensor& x) { return x * 2.0; }
};
struct Net : dbrq::nn::CallableModule<Net> {
  Net() { d = register_module("d", std::make_shared<Derived>()); }
  dbrq::Tensor forward(const dbrq::Tensor& x) { return (*d)(x); }
  std::shared_ptr<Derived> d;
};

int main() { Net n; }
