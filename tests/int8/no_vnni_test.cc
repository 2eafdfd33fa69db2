// Int8 on a CPU without VNNI (oneDNN capped at AVX512_CORE by tests/kernels:no_vnni_cap): oneDNN's
// u8 x s8 kernels there sum pairs of products in saturating 16 bits (vpmaddubsw), and 255 * 127 * 2
// does not fit. With same-signed weights and large activations every output saturated, with no
// error. The kernels quantize weights to [-64, 64] there (kernels::weight_qparams_for_isa), and
// int8 matmul sums in 32 bits (its direct loop).
#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "kernels/int8.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using testing::sqnr_of;

// Positive inputs and positive weights: the worst case for saturating pairs.
Tensor positive(const std::vector<int64_t>& sizes, uint64_t seed) {
  Generator gen(seed);
  Tensor t = Tensor::empty(sizes);
  return nn::init::uniform_(t, 0.5, 2.0, &gen);
}

void make_positive(Tensor& w, uint64_t seed) {
  Generator gen(seed);
  nn::init::uniform_(w, 0.0, 1.0, &gen);
}

struct Layers : nn::CallableModule<Layers> {
  Layers() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(16, 8, 3, 1, 1));
    deconv = register_module("deconv", std::make_shared<nn::ConvTranspose2dImpl>(nn::ConvTranspose2dOptions(8, 8, 2).stride(2)));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(64, 16));
    make_positive(conv->weight, 1);
    make_positive(deconv->weight, 2);
    make_positive(fc->weight, 3);
  }
  // Each layer's output is a model output, so each is checked on its own.
  std::vector<Tensor> forward(const Tensor& x) {
    const Tensor c = (*conv)(x);
    const Tensor d = (*deconv)(c);
    const Tensor f = (*fc)(d.flatten(2));
    const Tensor m = matmul(f, f.transpose(-1, -2));
    return {c, d, f, m};
  }
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<nn::ConvTranspose2dImpl> deconv;
  std::shared_ptr<nn::LinearImpl> fc;
};

// (tests/kernels:no_vnni_cap caps oneDNN and checks that pairs saturate.)
TEST(NoVnni, WeightParametersDoubleTheirScales) {
  ASSERT_TRUE(kernels::int8_pairs_saturate());
  const QuantParamsPtr q = QuantParams::per_channel({0.5f, 0.25f}, {0, 0}, 0);
  EXPECT_EQ(kernels::weight_qparams_for_isa(q)->scales, (std::vector<float>{1.f, 0.5f}));
  EXPECT_EQ(kernels::weight_qparams_for_isa(QuantParams::per_tensor(0.5f, 0))->scale(), 1.f);
  EXPECT_EQ(kernels::weight_qparams_for_isa(nullptr), nullptr);
}

TEST(NoVnni, SameSignedWeightsAndLargeActivationsDoNotSaturate) {
  manual_seed(4);
  Layers m;
  const std::vector<Tensor> calib = {positive({2, 16, 4, 4}, 10), positive({2, 16, 4, 4}, 11)};
  const Tensor x = positive({2, 16, 4, 4}, 12);
  const std::vector<Tensor> want = m(x);
  prepare(m, {calib[0]});
  for (const Tensor& c : calib) m(c);
  convert(m);
  const std::vector<Tensor> got = m(x);
  const char* names[] = {"conv2d", "conv_transpose2d", "linear", "matmul"};
  // (Saturating: 27.1, 18.6, 22.0 and 16.4 dB.)
  for (size_t i = 0; i < want.size(); ++i) {
    const double db = sqnr_of(got[i], want[i]);
    std::cout << names[i] << ": " << db << " dB\n";
    EXPECT_GT(db, 30.0) << names[i];
  }
}

// K beyond the direct loop's exact 32-bit range (32768): f32 on the dequantized codes.
struct LongProduct : nn::CallableModule<LongProduct> {
  Tensor forward(const Tensor& x, const Tensor& y) { return matmul(x, y); }
};

TEST(NoVnni, AProductLongerThanTheDirectLoopDoesNotSaturate) {
  LongProduct m;
  const int64_t k = 40000;
  const Tensor x = positive({2, k}, 20), y = positive({k, 3}, 21);
  const Tensor want = m(x, y);
  prepare(m, {x, y});
  m(x, y);
  m(positive({2, k}, 22), positive({k, 3}, 23));
  convert(m);
  const double db = sqnr_of(m(x, y), want);
  std::cout << "matmul, K = " << k << ": " << db << " dB\n";
  EXPECT_GT(db, 50.0);  // 57.5 dB; oneDNN's saturating path gave 44.5 dB
}

}  // namespace
}  // namespace dbrq
