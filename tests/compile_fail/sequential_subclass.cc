// libtorch's `struct X : SequentialImpl { Tensor forward(..) }`: with dbrq's Sequential this used
// to compile and silently run Sequential::forward. Sequential is final now.
// expect-error: cannot derive from 'final' base 'dbrq::nn::SequentialImpl'
#include "runtime/nn.h"

struct DenseLayer : dbrq::nn::SequentialImpl {
  dbrq::Tensor forward(const dbrq::Tensor& x) { return dbrq::cat({x, SequentialImpl::forward(x)}, 1); }
};

int main() { DenseLayer d; }
