// libtorch's `struct X : SequentialImpl { Tensor forward(..) }`: with dbrq's Sequential this used
// to compile and silently run Sequential::forward. SequentialImpl is not final (its holder,
// nn::Sequential, wraps it), so registering such a subclass is refused at compile time and calling
// one throws UsageError; SequentialBase<X> is the base for a Sequential with its own forward.
// expect-error: its call operator would run the base's forward, never X's
#include <memory>

#include "runtime/nn.h"

struct DenseLayer : dbrq::nn::SequentialImpl {
  dbrq::Tensor forward(const dbrq::Tensor& x) { return dbrq::cat({x, SequentialImpl::forward(x)}, 1); }
};
struct Net : dbrq::nn::CallableModule<Net> {
  Net() { d = register_module("d", std::make_shared<DenseLayer>()); }
  dbrq::Tensor forward(const dbrq::Tensor& x) { return (*d)(x); }
  std::shared_ptr<DenseLayer> d;
};

int main() { Net n; }
