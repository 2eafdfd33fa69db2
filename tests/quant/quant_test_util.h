// Helpers shared by the quantization suites in tests/quant: SQNR, batch-norm statistics that are not
// the identity, seen-op summaries and observer-slot counting over the AutoQuantizationState API.
//
//   dbrq::testing::randomize_bn(*block->bn, /*seed=*/3);
//   EXPECT_EQ(dbrq::testing::seen_kinds(*dbrq::quant_state_of(*model)),
//             (std::vector<dbrq::OpKind>{dbrq::OpKind::kConv2d, dbrq::OpKind::kRelu}));
//   EXPECT_GT(dbrq::testing::sqnr_of(int8_out, fp32_out), 30.0);
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"  // observer_roots, random_batches
#include "tracer/internal.h"  // tests may look at the recorded program

namespace dbrq::testing {

// 10 log10(sum ref^2 / sum (actual - ref)^2); +inf when identical. Sizes must match.
double sqnr_of(const Tensor& actual, const Tensor& reference);

// Non-trivial running statistics and affine parameters (so folding batch norm matters).
void randomize_bn(nn::BatchNorm2dImpl& bn, uint64_t seed);

// Op kinds of a module's seen ops, in order.
std::vector<OpKind> seen_kinds(const AutoQuantizationState& s);
// display_kind() of every seen op that is not a fused follower ("conv2d+batch_norm+relu", "add").
std::vector<std::string> display_kinds(const AutoQuantizationState& s);

// Roots of every observer slot some seen op feeds (input or output), over every module state.
std::set<int> fed_roots(ModelQuantState& m);

// The state of a prepared module; throws std::runtime_error (failing the test) when it has none.
AutoQuantizationState& state_of(const nn::Module& m);

// Runs `model` on `n` random batches of `sizes` (seeds seed, seed+1, ...).
void calibrate(nn::Module& model, const std::vector<int64_t>& sizes, int n, uint64_t seed);

// One relu record after two calls of one batch norm: after conv + max_pool (an int8 input: the
// bn + relu chain is fused with this base) and on the model's input (f32: that base runs fp32 and
// the relu after it must compute). Inputs [N, 4, H, W]; returns {u, v}.
struct SharedBn : nn::CallableModule<SharedBn> {
  SharedBn() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(4, 4, 3, 1, 1));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2dImpl>(4));
  }
  std::vector<Tensor> forward(const Tensor& x) {
    Tensor u = relu((*bn)(max_pool2d((*conv)(x), {2, 2})));
    Tensor v = relu((*bn)(x));
    return {u, v};
  }
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<nn::BatchNorm2dImpl> bn;
};

// Values of an f32 tensor (any layout) in logical order.
std::vector<float> values(const Tensor& t);

}  // namespace dbrq::testing
