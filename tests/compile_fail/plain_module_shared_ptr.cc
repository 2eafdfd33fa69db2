// A libtorch-style class deriving from nn::Module itself is callable through its holder only: made
// by std::make_shared and called as child->forward(x), its ops would bypass the module's hooks
// (attributed to the parent, its per-module qconfig ignored). Registering one is refused.
// expect-error: is callable through its holder only
#include <memory>

#include "runtime/nn.h"

struct BlockImpl : dbrq::nn::Module {
  dbrq::Tensor forward(const dbrq::Tensor& x) { return x; }
};
struct Net : dbrq::nn::CallableModule<Net> {
  Net() { b = register_module("b", std::make_shared<BlockImpl>()); }
  dbrq::Tensor forward(const dbrq::Tensor& x) { return b->forward(x); }
  std::shared_ptr<BlockImpl> b;
};

int main() { Net n; }
