// A forward returning a user struct whose tensors dbrq cannot see: after convert the caller could
// receive int8 codes as if they were values. Refused at compile time until the struct declares them.
// expect-error: dbrq cannot see the tensors inside this type
#include "runtime/nn.h"

struct Outputs {
  dbrq::Tensor logits, aux;
};

struct Net : dbrq::nn::CallableModule<Net> {
  Outputs forward(const dbrq::Tensor& x) { return {x, x}; }
};

int main() {
  Net n;
  Outputs o = n(dbrq::zeros({1}));
  (void)o;
}
