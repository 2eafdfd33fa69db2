// A libtorch-style module (deriving from nn::Module, made callable by its DBRQ_MODULE holder) whose
// forward returns a user struct dbrq cannot see: through the holder (`net->forward(x)`, `net(x)`)
// it is the same hooked call as CallableModule's, so it is refused the same way (after convert the
// caller could otherwise receive int8 codes as values).
// expect-error: dbrq cannot see the tensors inside this type
#include "runtime/nn.h"

struct Outputs {
  dbrq::Tensor logits, aux;
};

struct NetImpl : dbrq::nn::Module {
  Outputs forward(const dbrq::Tensor& x) { return {x, x}; }
};
DBRQ_MODULE(Net);

int main() {
  Net n;
  Outputs o = n->forward(dbrq::zeros({1}));
  (void)o;
}
