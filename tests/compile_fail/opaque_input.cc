// A struct argument hiding tensors is refused the same way as a struct result.
// expect-error: dbrq cannot see the tensors inside this type
#include "runtime/nn.h"

struct Pair {
  dbrq::Tensor a, b;
};

struct Net : dbrq::nn::CallableModule<Net> {
  dbrq::Tensor forward(const Pair& p) { return p.a + p.b; }
};

int main() {
  Net n;
  n(Pair{dbrq::zeros({1}), dbrq::zeros({1})});
}
