// A holder holds HookedForward<Conv2dImpl> (so holder->forward is the hooked call); a plain
// Conv2dImpl made by std::make_shared has no such forward, so a holder must not adopt it.
// expect-error: a holder cannot adopt a module made by std::make_shared<XImpl>
#include <memory>

#include "runtime/nn.h"

int main() { dbrq::nn::Conv2d c(std::make_shared<dbrq::nn::Conv2dImpl>(3, 3, 1)); }
