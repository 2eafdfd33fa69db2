// A model whose only fragile op is a functional matmul inside a child module, for the tests of
// call-site qconfigs and of autotune moving functional ops (tests/tune/callsite_mapping_test.cc,
// autotune_ops_test.cc).
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq::opnet {

using Batches = std::vector<std::vector<Tensor>>;

// block: a = matmul(x, w_bad); h = relu(fc(a)); matmul(h, w_good). x's channel 0 is ~100x smaller
// than the others and w_bad's row 0 ~500x larger than the rest, so both of the first matmul's
// operands (the model input and a parameter, quantized per tensor by that matmul) lose the part of
// the product that matters under every observer; bf16 or fp32 keep it. Everything else is benign.
struct OpBlock : nn::CallableModule<OpBlock> {
  OpBlock() {
    Tensor bad = randn({16, 32}, 71);
    float* b = bad.mutable_data<float>();
    for (int i = 0; i < 16 * 32; ++i) b[i] *= 0.2f;
    for (int j = 0; j < 32; ++j) b[j] = 100.f;
    w_bad = register_parameter("w_bad", bad);
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(32, 32));
    Tensor good = randn({32, 8}, 72);
    float* g = good.mutable_data<float>();
    for (int i = 0; i < 32 * 8; ++i) g[i] *= 0.2f;
    w_good = register_parameter("w_good", good);
  }
  Tensor forward(const Tensor& x) { return matmul(relu((*fc)(matmul(x, w_bad))), w_good); }
  Tensor w_bad, w_good;
  std::shared_ptr<nn::LinearImpl> fc;
};

struct OpNet : nn::CallableModule<OpNet> {
  OpNet() {
    block = register_module("block", std::make_shared<OpBlock>());
    head = register_module("head", std::make_shared<nn::LinearImpl>(8, 4));
  }
  Tensor forward(const Tensor& x) { return (*head)((*block)(x)); }
  std::shared_ptr<OpBlock> block;
  std::shared_ptr<nn::LinearImpl> head;
};

inline std::shared_ptr<nn::Module> make_opnet() {
  manual_seed(9);
  auto m = std::make_shared<OpNet>();
  m->eval();
  return m;
}

inline Tensor small_channel0(Tensor x) {
  float* p = x.mutable_data<float>();
  for (int64_t r = 0; r < x.size(0); ++r) p[r * 16] *= 0.01f;
  return x;
}

constexpr double kTarget = 20.0;

struct OpSetup {
  Batches calib;
  std::vector<Tensor> test, ref;
  OpSetup() {
    for (const Tensor& x : testing::random_batches(8, 41, {64, 16})) calib.push_back({small_channel0(x)});
    for (const Tensor& x : testing::random_batches(3, 42, {32, 16})) test.push_back(small_channel0(x));
    auto fp32 = make_opnet();
    for (const Tensor& x : test) ref.push_back(fp32->forward_tensors({x})[0]);
  }
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

// The recorded functional matmuls of `block` by call index (role, or "absent" when not recorded).
inline std::map<int, std::string> block_matmuls(nn::Module& m) {
  std::map<int, std::string> out;
  for (const QuantizedOpInfo& i : quantized_ops(m)) {
    if (i.module == "block" && i.kind == OpKind::kMatmul) out[i.order] = i.role;
  }
  return out;
}

}  // namespace dbrq::opnet
