// Control: declared structs (with tensors, nested, or without tensors), SequentialBase subclasses
// and std containers compile.
#include <map>
#include <memory>
#include <optional>
#include <variant>

#include "runtime/nn.h"

namespace user {
struct Aux {
  std::vector<dbrq::Tensor> maps;
};
DBRQ_TENSOR_STRUCT(Aux, maps)
struct Outputs {
  dbrq::Tensor logits;
  Aux aux;
  int steps = 0;
};
DBRQ_TENSOR_STRUCT(Outputs, logits, aux)
struct Config {
  double scale = 1.0;
  std::string name;
};
DBRQ_NO_TENSORS(Config)
}  // namespace user

struct Dense : dbrq::nn::SequentialBase<Dense> {
  dbrq::Tensor forward(const dbrq::Tensor& x) { return dbrq::cat({x, SequentialBase::forward(x)}, 1); }
};

struct Net : dbrq::nn::CallableModule<Net> {
  Net() { d = register_module("d", std::make_shared<Dense>()); }
  user::Outputs forward(const dbrq::Tensor& x, const user::Config& c, std::optional<dbrq::Tensor> mask,
                        std::map<std::string, dbrq::Tensor> extra, std::variant<int, dbrq::Tensor> v) {
    return {(*d)(x) * c.scale, {{x}}, 1};
  }
  std::shared_ptr<Dense> d;
};

int main() {
  Net n;
  user::Outputs o = n(dbrq::zeros({1, 2}), user::Config{}, std::nullopt, std::map<std::string, dbrq::Tensor>{}, 3);
  (void)o;
}
