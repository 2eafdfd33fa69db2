// A model with one fragile layer, for autotune tests that need the search to reach stage 3
// (tests/tune/autotune_test.cc, autotune_executor_test.cc, tests/distributed/tune_worker.cc).
//
//   dbrq::fragile::Setup f;   // calibration, test inputs, fp32 outputs
//   dbrq::autotune(dbrq::fragile::make, f.calib, f.sqnr(), dbrq::TuneCriterion::at_least(dbrq::fragile::kTarget), {});
//
// fc1 -> relu -> fc2 -> relu -> fc3. fc1's channel 0 is always 0 (zero weights, bias -1, relu),
// and fc2 has a weight of 100 on it in every row: harmless in fp32, but every row's int8 scale
// rounds all its real weights to 0. No observer or weight scheme saves fc2; moving fc2 out does.
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq::fragile {

struct Fragile : nn::CallableModule<Fragile> {
  Fragile() {
    fc1 = register_module("fc1", std::make_shared<nn::LinearImpl>(16, 32));
    fc2 = register_module("fc2", std::make_shared<nn::LinearImpl>(32, 32));
    fc3 = register_module("fc3", std::make_shared<nn::LinearImpl>(32, 8));
  }
  Tensor forward(const Tensor& x) { return (*fc3)(relu((*fc2)(relu((*fc1)(x))))); }
  std::shared_ptr<nn::LinearImpl> fc1, fc2, fc3;
};

inline std::shared_ptr<nn::Module> make() {
  manual_seed(5);
  auto m = std::make_shared<Fragile>();
  float* w1 = m->fc1->weight.mutable_data<float>();
  for (int c = 0; c < 16; ++c) w1[c] = 0.f;
  m->fc1->bias.mutable_data<float>()[0] = -1.f;
  float* w2 = m->fc2->weight.mutable_data<float>();
  for (int r = 0; r < 32; ++r) w2[r * 32] = 100.f;
  m->eval();
  return m;
}

// Every observer / weight config gives ~5 dB; with fc2 out of int8, well above.
constexpr double kTarget = 15.0;

struct Setup {
  std::vector<std::vector<Tensor>> calib;
  std::vector<Tensor> test;
  std::vector<Tensor> ref;
  Setup() {
    for (const Tensor& x : testing::random_batches(8, 31, {64, 16})) calib.push_back({x});
    test = testing::random_batches(3, 32, {32, 16});
    auto fp32 = make();
    for (const Tensor& x : test) ref.push_back(fp32->forward_tensors({x})[0]);
  }
  // SQNR of the model's outputs vs fp32 over the test inputs (+inf for the fp32 model itself).
  EvaluateFn sqnr() const {
    return [this](nn::Module& m) {
      double sig = 0, err = 0;
      for (size_t i = 0; i < test.size(); ++i) {
        const std::vector<float> a = ref[i].contiguous().to_vector<float>();
        const std::vector<float> b = m.forward_tensors({test[i]})[0].contiguous().to_vector<float>();
        for (size_t k = 0; k < a.size(); ++k) {
          sig += double(a[k]) * a[k];
          err += (double(a[k]) - b[k]) * (double(a[k]) - b[k]);
        }
      }
      return err == 0 ? INFINITY : 10 * std::log10(sig / err);
    };
  }
};

}  // namespace dbrq::fragile
