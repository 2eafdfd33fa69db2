// Models with data-dependent control flow, shared by control_flow_test (calibrate, convert, run)
// and control_flow_state_test (save, load, merge): an if/else on the input's mean, a three-way
// switch in a child module, a loop over the sequence length, two loops sharing a layer with an
// early exit and a module called a data-dependent number of times.
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include "dbrq.h"

namespace dbrq::control_flow_models {

using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;

// An input whose mean is positive or negative (which branch IfElse takes).
inline Tensor signed_input(std::vector<int64_t> sizes, uint64_t seed, double sign) {
  return randn(sizes, seed) * 0.5 + sign * 0.8;
}

// The model's outputs on each input.
template <typename M>
std::vector<Tensor> run_all(M& model, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> out;
  for (const Tensor& x : inputs) out.push_back(model(x));
  return out;
}

struct IfElse : nn::CallableModule<IfElse> {
  IfElse() {
    a = register_module("a", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    b = register_module("b", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    head = register_module("head", std::make_shared<Conv2d>(8, 4, 1));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = mean(x).item<float>() > 0 ? (*a)(x) : relu((*b)(x));
    return (*head)(y);
  }
  std::shared_ptr<Conv2d> a, b, head;
};

struct Switch3 : nn::CallableModule<Switch3> {
  Switch3() {
    c1 = register_module("c1", std::make_shared<Conv2d>(4, 4, 1));
    c2 = register_module("c2", std::make_shared<Conv2d>(4, 4, 3, 1, 1));
  }
  Tensor forward(const Tensor& x) {
    const float m = mean(x).item<float>();
    if (m > 0.4f) return relu((*c1)(x));
    if (m < -0.4f) return sigmoid((*c2)(x));
    return (*c1)(x) + (*c2)(x);
  }
  std::shared_ptr<Conv2d> c1, c2;
};

struct Parent : nn::CallableModule<Parent> {
  Parent() {
    sw = register_module("sw", std::make_shared<Switch3>());
    tail = register_module("tail", std::make_shared<Conv2d>(4, 2, 1));
  }
  Tensor forward(const Tensor& x) { return (*tail)((*sw)(x * 1.0)); }
  std::shared_ptr<Conv2d> tail;
  std::shared_ptr<Switch3> sw;
};

struct Rnn : nn::CallableModule<Rnn> {
  Rnn() { cell = register_module("cell", std::make_shared<Linear>(8, 8)); }
  Tensor forward(const Tensor& x) {  // x: [T, 8]
    Tensor h = zeros({1, 8});
    for (int64_t t = 0; t < x.size(0); ++t) h = tanh((*cell)(h) + x.narrow(0, t, 1));
    return h;
  }
  std::shared_ptr<Linear> cell;
};

struct Block : nn::CallableModule<Block> {
  Block() { conv = register_module("conv", std::make_shared<Conv2d>(4, 4, 3, 1, 1)); }
  Tensor forward(const Tensor& x) { return relu((*conv)(x)) * 0.5 + x; }
  std::shared_ptr<Conv2d> conv;
};

struct Loops : nn::CallableModule<Loops> {
  Loops() {
    shared = register_module("shared", std::make_shared<Conv2d>(4, 4, 1));
    block = register_module("block", std::make_shared<Block>());
  }
  Tensor forward(const Tensor& x) {
    Tensor y = x;
    for (int i = 0; i < 2; ++i) y = relu((*shared)(y));           // loop 1
    const int n = 1 + static_cast<int>(std::abs(x.at<float>({0, 0, 0, 0})) * 3) % 4;
    for (int i = 0; i < n; ++i) y = (*block)(y);                   // a module called n times
    for (int i = 0; i < 3; ++i) {                                  // loop 2, same layer, early exit
      y = (*shared)(y) + y;
      if (mean(y).item<float>() > 2.0f) break;
    }
    return y;
  }
  std::shared_ptr<Conv2d> shared;
  std::shared_ptr<Block> block;
};

}  // namespace dbrq::control_flow_models
