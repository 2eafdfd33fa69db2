// Error paths of every eager op: each bad input raises the documented dbrq error type with a message
// that names the op and the offending value, and leaves its arguments untouched and usable.
#include <cmath>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace dbrq {
namespace {

Tensor f32(std::initializer_list<int64_t> sizes) { return zeros(sizes); }
Tensor u8(std::initializer_list<int64_t> sizes) { return zeros(sizes, DType::kU8); }
Tensor qu8(std::initializer_list<int64_t> sizes) {
  return zeros(sizes, DType::kU8).with_qparams(QuantParams::per_tensor(0.1f, 0));
}

// ---- conv2d / linear / matmul -------------------------------------------------------------------

TEST(OpErrors, Conv2dShapes) {
  const Tensor x = f32({1, 3, 8, 8}), w = f32({4, 3, 3, 3});
  EXPECT_THROW_MSG(conv2d(f32({3, 8, 8}), w), ShapeError,
                   "conv2d: input must be 4-D (N, C, H, W), got sizes [3, 8, 8]");
  EXPECT_THROW_MSG(conv2d(x, f32({4, 3, 3})), ShapeError, "conv2d: weight must be 4-D");
  EXPECT_THROW_MSG(conv2d(x, f32({4, 2, 3, 3})), ShapeError,
                   "conv2d: input has 3 channels but the weight expects in_channels/groups * groups = 2 * 1 = 2");
  EXPECT_THROW_MSG(conv2d(x, w, f32({3})), ShapeError, "conv2d: bias must have sizes [4], got [3]");
  EXPECT_THROW_MSG(conv2d(x, w, f32({4, 1})), ShapeError, "conv2d: bias must have sizes [4], got [4, 1]");
  EXPECT_THROW_MSG(conv2d(f32({1, 3, 2, 2}), w), ShapeError,
                   "conv2d: padded input 2x2 is smaller than the dilated kernel 3x3");
  Conv2dParams dil;
  dil.dilation = {3, 3};
  EXPECT_THROW_MSG(conv2d(f32({1, 3, 6, 6}), w, Tensor(), dil), ShapeError, "smaller than the dilated kernel 7x7");
}

TEST(OpErrors, Conv2dParams) {
  const Tensor x = f32({1, 4, 8, 8});
  Conv2dParams p;
  p.groups = 0;
  EXPECT_THROW_MSG(conv2d(x, f32({4, 4, 3, 3}), Tensor(), p), ValueError, "conv2d: groups must be >= 1, got 0");
  p.groups = 2;
  EXPECT_THROW_MSG(conv2d(x, f32({5, 2, 3, 3}), Tensor(), p), ShapeError,
                   "conv2d: out_channels (5) must be divisible by groups (2)");
  EXPECT_THROW_MSG(conv2d(x, f32({4, 4, 3, 3}), Tensor(), p), ShapeError,
                   "conv2d: input has 4 channels but the weight expects in_channels/groups * groups = 4 * 2 = 8");
  p = {};
  p.stride = {0, 1};
  EXPECT_THROW_MSG(conv2d(x, f32({4, 4, 3, 3}), Tensor(), p), ValueError, "conv2d: stride must be >= 1, got (0, 1)");
  p.stride = {1, -2};
  EXPECT_THROW_MSG(conv2d(x, f32({4, 4, 3, 3}), Tensor(), p), ValueError, "conv2d: stride must be >= 1, got (1, -2)");
  p = {};
  p.padding = {-1, 0};
  EXPECT_THROW_MSG(conv2d(x, f32({4, 4, 3, 3}), Tensor(), p), ValueError, "conv2d: padding must be >= 0, got (-1, 0)");
  p = {};
  p.dilation = {1, 0};
  EXPECT_THROW_MSG(conv2d(x, f32({4, 4, 3, 3}), Tensor(), p), ValueError, "conv2d: dilation must be >= 1, got (1, 0)");
}

TEST(OpErrors, Conv2dDtypesAndUndefined) {
  const Tensor x = f32({1, 3, 8, 8}), w = f32({4, 3, 3, 3});
  EXPECT_THROW_MSG(conv2d(u8({1, 3, 8, 8}), w), DTypeError, "conv2d: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(conv2d(qu8({1, 3, 8, 8}), w), DTypeError, "conv2d: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(conv2d(x, zeros({4, 3, 3, 3}, DType::kS8)), DTypeError,
                   "conv2d: weight must have dtype f32, got s8");
  EXPECT_THROW_MSG(conv2d(x, w, zeros({4}, DType::kS32)), DTypeError, "conv2d: bias must have dtype f32, got s32");
  EXPECT_THROW_MSG(conv2d(Tensor(), w), ValueError, "conv2d: input is an undefined tensor");
  EXPECT_THROW_MSG(conv2d(x, Tensor()), ValueError, "conv2d: weight is an undefined tensor");
}

TEST(OpErrors, Linear) {
  const Tensor x = f32({2, 5}), w = f32({3, 5});
  EXPECT_THROW_MSG(linear(x, f32({4, 4})), ShapeError,
                   "linear: input has 5 features in its last dim but the weight expects in_features = 4");
  EXPECT_THROW_MSG(linear(x, f32({15})), ShapeError,
                   "linear: weight must be 2-D (out_features, in_features), got sizes [15]");
  EXPECT_THROW_MSG(linear(x, w, f32({4})), ShapeError, "linear: bias must have sizes [3], got [4]");
  EXPECT_THROW_MSG(linear(full({}, 1.0), w), ShapeError, "linear: input must have at least 1 dim, got sizes []");
  EXPECT_THROW_MSG(linear(u8({2, 5}), w), DTypeError, "linear: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(linear(x, zeros({3, 5}, DType::kS8)), DTypeError, "linear: weight must have dtype f32, got s8");
  EXPECT_THROW_MSG(linear(x, w, zeros({3}, DType::kS32)), DTypeError, "linear: bias must have dtype f32, got s32");
  EXPECT_THROW_MSG(linear(Tensor(), w), ValueError, "linear: input is an undefined tensor");
  EXPECT_THROW_MSG(linear(x, Tensor()), ValueError, "linear: weight is an undefined tensor");
}

TEST(OpErrors, Matmul) {
  EXPECT_THROW_MSG(matmul(f32({2, 3}), f32({4, 5})), ShapeError,
                   "matmul: inner dims differ: sizes [2, 3] and [4, 5] (3 vs 4)");
  EXPECT_THROW_MSG(matmul(f32({3}), f32({4})), ShapeError, "matmul: inner dims differ: sizes [3] and [4] (3 vs 4)");
  EXPECT_THROW_MSG(matmul(f32({2, 3, 4}), f32({3, 4, 5})), ShapeError,
                   "matmul (batch dims): sizes [2] and [3] cannot be broadcast together");
  EXPECT_THROW_MSG(matmul(full({}, 1.0), f32({3})), ShapeError, "matmul: both arguments need at least 1 dim");
  EXPECT_THROW_MSG(matmul(zeros({2, 3}, DType::kS32), f32({3, 2})), DTypeError,
                   "matmul: input must have dtype f32, got s32");
  EXPECT_THROW_MSG(matmul(f32({2, 3}), u8({3, 2})), DTypeError, "matmul: other must have dtype f32, got u8");
  EXPECT_THROW_MSG(matmul(Tensor(), f32({3})), ValueError, "matmul: input is an undefined tensor");
  EXPECT_THROW_MSG(matmul(f32({3}), Tensor()), ValueError, "matmul: other is an undefined tensor");
}

// ---- elementwise --------------------------------------------------------------------------------

TEST(OpErrors, BinaryBroadcastAndDtypes) {
  const Tensor a = f32({2, 3});
  EXPECT_THROW_MSG(add(a, f32({4})), ShapeError,
                   "add: sizes [2, 3] and [4] cannot be broadcast together (dim 1: 3 vs 4)");
  EXPECT_THROW_MSG(sub(f32({5, 1, 3}), f32({4, 2, 3})), ShapeError,
                   "sub: sizes [5, 1, 3] and [4, 2, 3] cannot be broadcast");
  EXPECT_THROW_MSG(a * f32({3, 3}), ShapeError,
                   "mul: sizes [2, 3] and [3, 3] cannot be broadcast together (dim 0: 2 vs 3)");
  EXPECT_THROW_MSG(a / f32({2}), ShapeError, "div: sizes [2, 3] and [2] cannot be broadcast");
  EXPECT_THROW_MSG(add(u8({2, 3}), a), DTypeError, "add: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(mul(a, zeros({2, 3}, DType::kS64)), DTypeError, "mul: other must have dtype f32, got s64");
  EXPECT_THROW_MSG(qu8({2, 3}) + 1.0, DTypeError, "add: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(2.0 / zeros({2}, DType::kS32), DTypeError, "div: input must have dtype f32, got s32");
  EXPECT_THROW_MSG(add(Tensor(), a), ValueError, "add: input is an undefined tensor");
  EXPECT_THROW_MSG(sub(a, Tensor()), ValueError, "sub: other is an undefined tensor");
  EXPECT_THROW_MSG(mul(Tensor(), 2.0), ValueError, "mul: input is an undefined tensor");
}

TEST(OpErrors, InPlaceOpsRejectAndLeaveSelfUnchanged) {
  Tensor a = from_vector<float>({1, 2, 3}, {3, 1});
  const uint64_t version = a.storage()->version();
  EXPECT_THROW_MSG(a.add_(f32({3, 4})), ShapeError,
                   "add_: result sizes [3, 4] differ from the in-place tensor's sizes [3, 1]");
  EXPECT_THROW_MSG(a.mul_(f32({2})), ShapeError, "mul_: result sizes [3, 2] differ");
  EXPECT_THROW_MSG(a.sub_(f32({4, 1})), ShapeError, "sub: sizes [3, 1] and [4, 1] cannot be broadcast");
  EXPECT_THROW_MSG(a.add_(u8({3, 1})), DTypeError, "add: other must have dtype f32, got u8");
  EXPECT_THROW_MSG(a.clamp_(2.0, 1.0), ValueError, "clamp_: min (2) must be <= max (1)");
  EXPECT_THROW_MSG(a.copy_(f32({2, 3, 1})), ShapeError,
                   "copy_: source sizes [2, 3, 1] do not broadcast to destination sizes [3, 1]");
  EXPECT_THROW_MSG(a.copy_(f32({4})), ShapeError,
                   "copy_: source sizes [4] do not broadcast to destination sizes [3, 1]");
  EXPECT_THROW_MSG(a.copy_(f32({2, 1})), ShapeError, "copy_: sizes [3, 1] and [2, 1] cannot be broadcast");
  EXPECT_THROW_MSG(a.copy_(Tensor()), ValueError, "copy_: src is an undefined tensor");
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(a.storage()->version(), version);
  a.add_(1.0);  // still usable
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{2, 3, 4}));

  Tensor i = zeros({3}, DType::kS32);
  EXPECT_THROW_MSG(i.add_(1.0), DTypeError, "add: self must have dtype f32, got s32");
  EXPECT_THROW_MSG(i.relu_(), DTypeError, "relu: self must have dtype f32, got s32");
  EXPECT_THROW_MSG(i.clamp_(0.0, 1.0), DTypeError, "clamp: self must have dtype f32, got s32");
  Tensor undefined;
  EXPECT_THROW_MSG(undefined.fill_(1.0), ValueError, "fill_: self is an undefined tensor");
  EXPECT_THROW_MSG(undefined.relu_(), ValueError, "relu: self is an undefined tensor");
}

TEST(OpErrors, Activations) {
  const Tensor x = f32({4});
  EXPECT_THROW_MSG(hardtanh(x, 1.0, -1.0), ValueError, "hardtanh: min_val (1) must be <= max_val (-1)");
  EXPECT_THROW_MSG(clamp(x, 0.5, 0.25), ValueError, "clamp: min (0.5) must be <= max (0.25)");
  EXPECT_THROW_MSG(gelu(x, "fast"), ValueError, "gelu: approximate must be \"none\" or \"tanh\", got \"fast\"");
  EXPECT_THROW_MSG(gelu(x, "Tanh"), ValueError, "got \"Tanh\"");
  // Every activation names itself when given an int8 or integer tensor.
  EXPECT_THROW_MSG(relu(u8({4})), DTypeError, "relu: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(relu6(u8({4})), DTypeError, "relu6: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(hardtanh(zeros({4}, DType::kS8)), DTypeError, "hardtanh: input must have dtype f32, got s8");
  EXPECT_THROW_MSG(clamp(zeros({4}, DType::kS32), 0.0, 1.0), DTypeError, "clamp: input must have dtype f32, got s32");
  EXPECT_THROW_MSG(leaky_relu(qu8({4})), DTypeError, "leaky_relu: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(sigmoid(u8({4})), DTypeError, "sigmoid: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(dbrq::tanh(u8({4})), DTypeError, "tanh: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(hardsigmoid(u8({4})), DTypeError, "hardsigmoid: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(hardswish(u8({4})), DTypeError, "hardswish: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(silu(zeros({4}, DType::kS64)), DTypeError, "silu: input must have dtype f32, got s64");
  EXPECT_THROW_MSG(gelu(u8({4})), DTypeError, "gelu: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(relu(Tensor()), ValueError, "relu: input is an undefined tensor");
  EXPECT_THROW_MSG(relu6(Tensor()), ValueError, "relu6: input is an undefined tensor");
  EXPECT_THROW_MSG(sigmoid(Tensor()), ValueError, "sigmoid: input is an undefined tensor");
}

TEST(OpErrors, SoftmaxAndLogSoftmax) {
  const Tensor x = f32({2, 3});
  EXPECT_THROW_MSG(softmax(x, 2), IndexError, "dim 2 is out of range for a 2-D tensor (valid: -2 to 1)");
  EXPECT_THROW_MSG(log_softmax(x, -3), IndexError, "dim -3 is out of range for a 2-D tensor");
  EXPECT_THROW_MSG(softmax(u8({2, 3}), 1), DTypeError, "softmax: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(log_softmax(u8({2, 3}), 1), DTypeError, "log_softmax: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(softmax(Tensor(), 0), ValueError, "softmax: input is an undefined tensor");
}

// ---- normalization ------------------------------------------------------------------------------

TEST(OpErrors, LayerNorm) {
  const Tensor x = f32({2, 5});
  EXPECT_THROW_MSG(layer_norm(x, {4}), ShapeError,
                   "layer_norm: input sizes [2, 5] do not end with normalized_shape [4]");
  EXPECT_THROW_MSG(layer_norm(x, {}), ShapeError, "layer_norm: normalized_shape [] does not fit input sizes [2, 5]");
  EXPECT_THROW_MSG(layer_norm(x, {1, 2, 5}), ShapeError, "layer_norm: normalized_shape [1, 2, 5] does not fit");
  EXPECT_THROW_MSG(layer_norm(x, {5}, f32({4})), ShapeError, "layer_norm: weight must have sizes [5], got [4]");
  EXPECT_THROW_MSG(layer_norm(x, {5}, f32({5}), f32({1, 5})), ShapeError,
                   "layer_norm: bias must have sizes [5], got [1, 5]");
  EXPECT_THROW_MSG(layer_norm(x, {5}, zeros({5}, DType::kU8)), DTypeError,
                   "layer_norm: weight must have dtype f32, got u8");
  EXPECT_THROW_MSG(layer_norm(x, {5}, Tensor(), Tensor(), -1.0), ValueError, "layer_norm: eps must be >= 0, got -1");
  EXPECT_THROW_MSG(layer_norm(u8({2, 5}), {5}), DTypeError, "layer_norm: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(layer_norm(Tensor(), {5}), ValueError, "layer_norm: input is an undefined tensor");
}

TEST(OpErrors, BatchNorm) {
  const Tensor x = f32({2, 3, 4, 4}), m = f32({3}), v = ones({3});
  EXPECT_THROW_MSG(batch_norm(f32({4}), f32({4}), ones({4})), ShapeError,
                   "batch_norm: input must have 2 to 5 dims (N, C, ...), got sizes [4]");
  EXPECT_THROW_MSG(batch_norm(x, f32({4}), v), ShapeError,
                   "batch_norm: running_mean must have sizes [3] for an input with 3 channels, got [4]");
  EXPECT_THROW_MSG(batch_norm(x, m, ones({3, 1})), ShapeError, "batch_norm: running_var must have sizes [3]");
  EXPECT_THROW_MSG(batch_norm(x, m, v, f32({2})), ShapeError, "batch_norm: weight must have sizes [3]");
  EXPECT_THROW_MSG(batch_norm(x, m, v, Tensor(), f32({5})), ShapeError, "batch_norm: bias must have sizes [3]");
  EXPECT_THROW_MSG(batch_norm(x, m, Tensor()), ValueError, "batch_norm: running_var is an undefined tensor");
  EXPECT_THROW_MSG(batch_norm(x, zeros({3}, DType::kS64), v), DTypeError,
                   "batch_norm: running_mean must have dtype f32, got s64");
  EXPECT_THROW_MSG(batch_norm(u8({2, 3, 4, 4}), m, v), DTypeError, "batch_norm: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(batch_norm(x, m, v, Tensor(), Tensor(), -0.5), ValueError, "batch_norm: eps must be >= 0, got -0.5");
  EXPECT_THROW_MSG(batch_norm(Tensor(), m, v), ValueError, "batch_norm: input is an undefined tensor");
}

// ---- pooling ------------------------------------------------------------------------------------

TEST(OpErrors, MaxPool2d) {
  const Tensor x = f32({1, 2, 8, 8});
  EXPECT_THROW_MSG(max_pool2d(f32({2, 8, 8}), {2, 2}), ShapeError,
                   "max_pool2d: input must be 4-D (N, C, H, W), got sizes [2, 8, 8]");
  EXPECT_THROW_MSG(max_pool2d(x, {0, 2}), ValueError, "max_pool2d: kernel_size must be >= 1, got (0, 2)");
  EXPECT_THROW_MSG(max_pool2d(x, {2, 2}, {0, 1}), ValueError, "max_pool2d: stride must be >= 1, got (0, 1)");
  EXPECT_THROW_MSG(max_pool2d(x, {2, 2}, {-1, -1}), ValueError, "max_pool2d: stride must be >= 1, got (-1, -1)");
  EXPECT_THROW_MSG(max_pool2d(x, {2, 2}, {1, 1, 1}), ValueError,
                   "max_pool2d: stride must have 2 values or none, got [1, 1, 1]");
  EXPECT_THROW_MSG(
      max_pool2d(x, {3, 3}, {1, 1}, {2, 2}), ValueError,
      "max_pool2d: padding must be >= 0 and at most half the kernel size, got padding (2, 2) for kernel_size (3, 3)");
  EXPECT_THROW_MSG(max_pool2d(x, {3, 3}, {1, 1}, {-1, 0}), ValueError, "max_pool2d: padding must be >= 0");
  EXPECT_THROW_MSG(max_pool2d(x, {3, 3}, {1, 1}, {0, 0}, {0, 1}), ValueError,
                   "max_pool2d: dilation must be >= 1, got (0, 1)");
  EXPECT_THROW_MSG(max_pool2d(f32({1, 1, 2, 2}), {3, 3}), ShapeError,
                   "max_pool2d: input sizes [1, 1, 2, 2] are smaller than the kernel (3, 3) plus padding");
  EXPECT_THROW_MSG(max_pool2d(zeros({1, 2, 8, 8}, DType::kS32), {2, 2}), DTypeError,
                   "max_pool2d: input must be f32, s8 or u8, got s32");
  EXPECT_THROW_MSG(max_pool2d(Tensor(), {2, 2}), ValueError, "max_pool2d: input is an undefined tensor");
}

TEST(OpErrors, AvgPool2d) {
  const Tensor x = f32({1, 2, 8, 8});
  EXPECT_THROW_MSG(avg_pool2d(f32({8, 8}), {2, 2}), ShapeError,
                   "avg_pool2d: input must be 4-D (N, C, H, W), got sizes [8, 8]");
  EXPECT_THROW_MSG(avg_pool2d(x, {2, -2}), ValueError, "avg_pool2d: kernel_size must be >= 1, got (2, -2)");
  EXPECT_THROW_MSG(avg_pool2d(x, {2, 2}, {1, 0}), ValueError, "avg_pool2d: stride must be >= 1, got (1, 0)");
  EXPECT_THROW_MSG(avg_pool2d(x, {2, 2}, {1}), ValueError, "avg_pool2d: stride must have 2 values or none, got [1]");
  EXPECT_THROW_MSG(avg_pool2d(x, {2, 2}, {}, {2, 0}), ValueError, "avg_pool2d: padding must be >= 0 and at most half");
  EXPECT_THROW_MSG(avg_pool2d(f32({1, 1, 1, 5}), {2, 2}), ShapeError,
                   "avg_pool2d: input sizes [1, 1, 1, 5] are smaller");
  EXPECT_THROW_MSG(avg_pool2d(u8({1, 2, 8, 8}), {2, 2}), DTypeError, "avg_pool2d: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(avg_pool2d(Tensor(), {2, 2}), ValueError, "avg_pool2d: input is an undefined tensor");
}

TEST(OpErrors, AdaptiveAvgPool2d) {
  EXPECT_THROW_MSG(adaptive_avg_pool2d(f32({1, 2, 4, 4}), {0, 1}), ValueError,
                   "adaptive_avg_pool2d: output_size must be >= 1, got (0, 1)");
  EXPECT_THROW_MSG(adaptive_avg_pool2d(f32({2, 4, 4}), {1, 1}), ShapeError,
                   "adaptive_avg_pool2d: input must be 4-D (N, C, H, W), got sizes [2, 4, 4]");
  EXPECT_THROW_MSG(adaptive_avg_pool2d(f32({1, 2, 0, 4}), {1, 1}), ShapeError,
                   "adaptive_avg_pool2d: input sizes [1, 2, 0, 4] have an empty spatial dim");
  EXPECT_THROW_MSG(adaptive_avg_pool2d(u8({1, 2, 4, 4}), {1, 1}), DTypeError,
                   "adaptive_avg_pool2d: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(adaptive_avg_pool2d(Tensor(), {1, 1}), ValueError,
                   "adaptive_avg_pool2d: input is an undefined tensor");
}

// ---- reductions ---------------------------------------------------------------------------------

TEST(OpErrors, Reductions) {
  const Tensor x = f32({2, 3, 4});
  EXPECT_THROW_MSG(mean(x, {3}), IndexError, "dim 3 is out of range for a 3-D tensor");
  EXPECT_THROW_MSG(sum(x, {-4}), IndexError, "dim -4 is out of range for a 3-D tensor");
  EXPECT_THROW_MSG(mean(x, {1, 1}), ValueError, "mean: dim 1 appears twice in [1, 1]");
  EXPECT_THROW_MSG(sum(x, {2, -1}), ValueError, "sum: dim 2 appears twice in [2, -1]");
  EXPECT_THROW_MSG(dbrq::std(x, {0, -3}), ValueError, "std: dim 0 appears twice in [0, -3]");
  EXPECT_THROW_MSG(mean(u8({2, 3}), {1}), DTypeError, "mean: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(sum(zeros({2}, DType::kS64)), DTypeError, "sum: input must have dtype f32, got s64");
  EXPECT_THROW_MSG(dbrq::std(u8({2, 3})), DTypeError, "std: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(mean(Tensor()), ValueError, "mean: input is an undefined tensor");
  EXPECT_THROW_MSG(dbrq::std(Tensor()), ValueError, "std: input is an undefined tensor");
}

// ---- joining and shape ops ----------------------------------------------------------------------

TEST(OpErrors, Cat) {
  const Tensor a = f32({2, 3});
  EXPECT_THROW_MSG(cat({}), ValueError, "cat: needs at least one tensor");
  EXPECT_THROW_MSG(cat({a, u8({2, 3})}), DTypeError, "cat: tensors[1] has dtype u8 but tensors[0] has f32");
  EXPECT_THROW_MSG(cat({a, f32({2})}), ShapeError, "cat: tensors[1] has sizes [2] but tensors[0] has [2, 3]");
  EXPECT_THROW_MSG(cat({a, a, f32({3, 3})}, 1), ShapeError,
                   "cat: tensors[2] has sizes [3, 3] but tensors[0] has [2, 3]; only dim 1 may differ");
  EXPECT_THROW_MSG(cat({a, Tensor()}), ValueError, "cat: tensors[1] is undefined");
  EXPECT_THROW_MSG(cat({Tensor(), a}), ValueError, "cat: tensors[0] is an undefined tensor");
  EXPECT_THROW_MSG(cat({a, a}, 2), IndexError, "dim 2 is out of range for a 2-D tensor");
  EXPECT_THROW_MSG(cat({zeros({2}, DType::kS64), zeros({2}, DType::kS64)}), DTypeError,
                   "cat: dtype s64 is not supported (f32, s32, s8, u8)");
  const Tensor q1 = u8({2}).with_qparams(QuantParams::per_tensor(0.1f, 0));
  const Tensor q2 = u8({2}).with_qparams(QuantParams::per_tensor(0.2f, 0));
  EXPECT_THROW_MSG(
      cat({q1, q2}), DTypeError,
      "cat: quantized inputs must share quantization parameters; tensors[1] has scale=0.2, zero_point=0 but "
      "tensors[0] has scale=0.1, zero_point=0");
  EXPECT_THROW_MSG(cat({q1, u8({2})}), DTypeError, "tensors[1] has none");
}

TEST(OpErrors, ReshapeAndView) {
  const Tensor x = f32({2, 3});
  EXPECT_THROW_MSG(x.reshape({4}), ShapeError,
                   "reshape: cannot reshape sizes [2, 3] (6 elements) into [4] (4 elements)");
  EXPECT_THROW_MSG(reshape(x, {4, -1}), ShapeError, "reshape: cannot reshape sizes [2, 3] (6 elements) into [4, -1]");
  EXPECT_THROW_MSG(x.reshape({-1, -1}), ValueError, "reshape: only one dim may be -1, got [-1, -1]");
  EXPECT_THROW_MSG(x.reshape({-2, -3}), ValueError, "reshape: invalid size -2 in [-2, -3]");
  EXPECT_THROW_MSG(x.reshape({0, -1}), ShapeError, "reshape: cannot reshape sizes [2, 3] (6 elements) into [0, -1]");
  EXPECT_THROW_MSG(x.view({7}), ShapeError, "cannot reshape sizes [2, 3] (6 elements) into [7] (7 elements)");
  EXPECT_THROW_MSG(x.transpose(0, 1).view({6}), ShapeError,
                   "view: sizes [6] are not compatible with the strides of a tensor of sizes [3, 2]; use reshape()");
  EXPECT_THROW_MSG(Tensor().reshape({1}), ValueError, "reshape: input is an undefined tensor");
  EXPECT_THROW_MSG(Tensor().view({1}), ValueError, "view: input is an undefined tensor");
  const Tensor pc = quantize_per_channel(ones({2, 3}), {0.1f, 0.2f}, {0, 0}, 0, DType::kS8);
  EXPECT_THROW_MSG(pc.reshape({6}), DTypeError, "reshape: per-channel quantized tensors cannot be reshaped");
  EXPECT_THROW_MSG(pc.flatten(), DTypeError, "per-channel quantized tensors cannot be reshaped");
}

TEST(OpErrors, FlattenPermuteTranspose) {
  const Tensor x = f32({2, 3, 4});
  EXPECT_THROW_MSG(x.flatten(2, 1), ValueError, "flatten: start_dim (2) must not come after end_dim (1)");
  EXPECT_THROW_MSG(x.flatten(0, 3), IndexError, "dim 3 is out of range for a 3-D tensor");
  EXPECT_THROW_MSG(flatten(Tensor()), ValueError, "flatten: input is an undefined tensor");
  EXPECT_THROW_MSG(x.permute({0, 1}), ShapeError, "permute: 2 dims given for a 3-D tensor");
  EXPECT_THROW_MSG(x.permute({0, 0, 1}), ValueError, "permute: dim 0 appears twice in [0, 0, 1]");
  EXPECT_THROW_MSG(x.permute({0, -3, 1}), ValueError, "permute: dim 0 appears twice in [0, -3, 1]");
  EXPECT_THROW_MSG(x.permute({0, 1, 3}), IndexError, "dim 3 is out of range for a 3-D tensor");
  EXPECT_THROW_MSG(permute(Tensor(), {0}), ValueError, "permute: input is an undefined tensor");
  EXPECT_THROW_MSG(x.transpose(0, 3), IndexError, "dim 3 is out of range for a 3-D tensor");
  EXPECT_THROW_MSG(transpose(Tensor(), 0, 1), ValueError, "transpose: input is an undefined tensor");
}

TEST(OpErrors, NarrowSliceSelectSqueeze) {
  const Tensor x = f32({3, 4});
  EXPECT_THROW_MSG(x.narrow(1, 2, 3), IndexError, "narrow: range [2, 5) is out of bounds for dim 1 of size 4");
  EXPECT_THROW_MSG(x.narrow(1, 0, -1), IndexError, "narrow: range [0, -1) is out of bounds for dim 1 of size 4");
  EXPECT_THROW_MSG(x.narrow(1, -5, 1), IndexError, "narrow: range [-1, 0) is out of bounds");
  EXPECT_THROW_MSG(x.narrow(2, 0, 1), IndexError, "dim 2 is out of range for a 2-D tensor");
  EXPECT_THROW_MSG(x.slice(1, 0, 4, 0), ValueError, "slice: step must be >= 1, got 0");
  EXPECT_THROW_MSG(x.slice(1, 0, 4, -1), ValueError, "slice: step must be >= 1, got -1");
  EXPECT_THROW_MSG(x.select(0, 3), IndexError, "select: index 3 is out of range for dim 0 of size 3");
  EXPECT_THROW_MSG(x.select(1, -5), IndexError, "select: index -5 is out of range for dim 1 of size 4");
  EXPECT_THROW_MSG(full({}, 1.0).select(0, 0), ShapeError, "select: cannot select from a 0-D tensor");
  EXPECT_THROW_MSG(x.unsqueeze(3), IndexError, "unsqueeze: dim 3 is out of range for a 2-D tensor");
  EXPECT_THROW_MSG(x.unsqueeze(-4), IndexError, "unsqueeze: dim -4 is out of range for a 2-D tensor");
  EXPECT_THROW_MSG(x.squeeze(2), IndexError, "dim 2 is out of range for a 2-D tensor");
  const Tensor pc = quantize_per_channel(ones({2, 3}), {0.1f, 0.2f}, {0, 0}, 0, DType::kS8);
  EXPECT_THROW_MSG(pc.select(1, 0), DTypeError, "select: per-channel quantized tensors cannot be reshaped");
  EXPECT_THROW_MSG(pc.unsqueeze(0), DTypeError, "unsqueeze: per-channel quantized tensors cannot be reshaped");
  const Tensor u;
  EXPECT_THROW_MSG(u.narrow(0, 0, 1), ValueError, "narrow: input is an undefined tensor");
  EXPECT_THROW_MSG(u.slice(0, 0, 1), ValueError, "slice: input is an undefined tensor");
  EXPECT_THROW_MSG(u.select(0, 0), ValueError, "select: input is an undefined tensor");
  EXPECT_THROW_MSG(u.unsqueeze(0), ValueError, "unsqueeze: input is an undefined tensor");
  EXPECT_THROW_MSG(u.squeeze(0), ValueError, "squeeze: input is an undefined tensor");
}

TEST(OpErrors, CopiesConversionsDropout) {
  EXPECT_THROW_MSG(Tensor().contiguous(), ValueError, "contiguous: input is an undefined tensor");
  EXPECT_THROW_MSG(Tensor().clone(), ValueError, "clone: input is an undefined tensor");
  EXPECT_THROW_MSG(Tensor().to(DType::kS32), ValueError, "to: input is an undefined tensor");
  EXPECT_THROW_MSG(f32({2, 3}).contiguous(MemoryFormat::kChannelsLast), ShapeError,
                   "channels-last layout needs a 4-D tensor, got sizes [2, 3]");
  EXPECT_THROW_MSG(dropout(f32({3}), 1.5), ValueError, "dropout: probability must be in [0, 1], got 1.5");
  EXPECT_THROW_MSG(dropout(f32({3}), -0.1, true), ValueError, "dropout: probability must be in [0, 1], got -0.1");
  EXPECT_THROW_MSG(dropout(u8({3}), 0.5, true), DTypeError, "dropout: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(dropout(Tensor(), 0.5), ValueError, "dropout: input is an undefined tensor");
  EXPECT_THROW_MSG(identity(Tensor()), ValueError, "identity: input is an undefined tensor");
  // A quantized tensor's integers are not its values.
  EXPECT_THROW_MSG(
      qu8({3}).to(DType::kF32), DTypeError,
      "to(f32): the tensor is quantized (u8, scale=0.1, zero_point=0); use dequantize() to get real values");
}

// In-place writes whose result would depend on the visiting order raise, as in PyTorch (dbrq gave
// a running sum, or pairwise sums, depending on the vector width; or the last value of an expand).
TEST(OpErrors, InPlaceWritesOverlappingTheirInput) {
  Tensor x = arange(8);
  EXPECT_THROW_MSG(x.narrow(0, 1, 3).add_(x.narrow(0, 0, 3)), ValueError,
                   "add: unsupported operation: some elements of the input tensor and the written-to tensor refer to a "
                   "single memory location (sizes [3] and [3] overlapping in one storage); clone() the input first");
  Tensor y = arange(9).reshape({3, 3});
  EXPECT_THROW_MSG(y.copy_(y.transpose(0, 1)), ValueError, "copy_: unsupported operation: some elements of the input tensor");
  Tensor z = arange(4).reshape({1, 4});
  Tensor e = z.expand({3, 4});
  EXPECT_THROW_MSG(e.add_(1.0), ValueError,
                   "add: unsupported operation: more than one element of the written-to tensor refers to a single "
                   "memory location (an expanded tensor, sizes [3, 4]); clone() it first");
  EXPECT_THROW_MSG(e.copy_(ones({3, 4})), ValueError, "copy_: unsupported operation: more than one element");
  // Allowed, as in PyTorch: the very same view, disjoint parts, interleaved views, fill_ of an expand.
  Tensor a = arange(6);
  a.add_(a);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 2, 4, 6, 8, 10}));
  Tensor b = arange(6);
  b.narrow(0, 3, 3).add_(b.narrow(0, 0, 3));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 5, 7}));
  Tensor c = arange(12).reshape({3, 4});
  Tensor even = c.raw_as_strided({3, 2}, {4, 2}, 0), odd = c.raw_as_strided({3, 2}, {4, 2}, 1);
  even.add_(odd);
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{1, 1, 5, 3, 9, 5, 13, 7, 17, 9, 21, 11}));
  e.fill_(2.0);
  EXPECT_EQ(z.to_vector<float>(), (std::vector<float>{2, 2, 2, 2}));
}

TEST(OpErrors, Embedding) {
  const Tensor w = f32({10, 4});
  EXPECT_THROW_MSG(embedding(from_vector<int64_t>({1, 10}), w), IndexError,
                   "embedding: index 10 at position 1 is out of range for 10 embeddings");
  EXPECT_THROW_MSG(embedding(from_vector<int32_t>({-1}), w), IndexError,
                   "embedding: index -1 at position 0 is out of range for 10 embeddings");
  EXPECT_THROW_MSG(embedding(from_vector<float>({1.f}), w), DTypeError,
                   "embedding: indices must be s64 or s32, got f32");
  EXPECT_THROW_MSG(embedding(from_vector<uint8_t>({1}), w), DTypeError,
                   "embedding: indices must be s64 or s32, got u8");
  // libtorch's argument order (weight, indices): the message says to swap them.
  EXPECT_THROW_MSG(embedding(w, from_vector<int64_t>({1, 2})), DTypeError,
                   "embedding: indices have dtype f32 and weight s64: dbrq::embedding takes (indices, weight), "
                   "libtorch's torch::embedding (weight, indices); swap them");
  EXPECT_THROW_MSG(embedding(from_vector<int64_t>({1}), f32({40})), ShapeError,
                   "embedding: weight must be 2-D (num_embeddings, embedding_dim), got sizes [40]");
  EXPECT_THROW_MSG(embedding(from_vector<int64_t>({1}), u8({10, 4})), DTypeError,
                   "embedding: weight must have dtype f32, got u8");
  EXPECT_THROW_MSG(embedding(Tensor(), w), ValueError, "embedding: indices is an undefined tensor");
  EXPECT_THROW_MSG(embedding(from_vector<int64_t>({1}), Tensor()), ValueError,
                   "embedding: weight is an undefined tensor");
}

// ---- quantization -------------------------------------------------------------------------------

TEST(OpErrors, QuantizePerTensor) {
  const Tensor x = f32({2, 3});
  EXPECT_THROW_MSG(quantize_per_tensor(x, 0.1f, 256, DType::kU8), ValueError,
                   "quantize: zero point 256 is outside the u8 range [0, 255]");
  EXPECT_THROW_MSG(quantize_per_tensor(x, 0.1f, -1, DType::kU8), ValueError,
                   "quantize: zero point -1 is outside the u8 range");
  EXPECT_THROW_MSG(quantize_per_tensor(x, 0.1f, 128, DType::kS8), ValueError,
                   "quantize: zero point 128 is outside the s8 range [-128, 127]");
  EXPECT_THROW_MSG(quantize_per_tensor(x, 0.f, 0, DType::kU8), ValueError,
                   "quantization scale must be finite and > 0, got 0");
  EXPECT_THROW_MSG(quantize_per_tensor(x, -0.5f, 0, DType::kU8), ValueError, "scale must be finite and > 0, got -0.5");
  EXPECT_THROW_MSG(quantize_per_tensor(x, INFINITY, 0, DType::kU8), ValueError,
                   "scale must be finite and > 0, got inf");
  EXPECT_THROW_MSG(quantize_per_tensor(x, 0.1f, 0, DType::kF32), DTypeError,
                   "quantize: target dtype must be s8 or u8, got f32");
  EXPECT_THROW_MSG(quantize_per_tensor(x, 0.1f, 0, DType::kS32), DTypeError,
                   "quantize: target dtype must be s8 or u8, got s32");
  EXPECT_THROW_MSG(quantize_per_tensor(qu8({2}), 0.1f, 0, DType::kU8), DTypeError,
                   "quantize: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(quantize_per_tensor(Tensor(), 0.1f, 0, DType::kU8), ValueError,
                   "quantize: input is an undefined tensor");
}

TEST(OpErrors, QuantizePerChannel) {
  const Tensor x = f32({2, 3});
  EXPECT_THROW_MSG(quantize_per_channel(x, {0.1f, 0.1f}, {0, 0}, 1, DType::kS8), ShapeError,
                   "per-channel parameters along axis 1 have 2 scales for sizes [2, 3]");
  EXPECT_THROW_MSG(quantize_per_channel(x, {0.1f, 0.1f}, {0}, 0, DType::kS8), ValueError,
                   "needs as many zero points as scales, got 2 scales and 1 zero points");
  EXPECT_THROW_MSG(quantize_per_channel(x, {0.1f, 0.1f}, {0, 200}, 0, DType::kS8), ValueError,
                   "quantize: zero point 200 is outside the s8 range [-128, 127]");
  EXPECT_THROW_MSG(quantize_per_channel(x, {0.1f, 0.f}, {0, 0}, 0, DType::kS8), ValueError,
                   "quantization scale must be finite and > 0, got 0 for channel 1");
  EXPECT_THROW_MSG(quantize_per_channel(x, {0.1f, 0.1f}, {0, 0}, 2, DType::kS8), IndexError,
                   "dim 2 is out of range for a 2-D tensor");
  EXPECT_THROW_MSG(quantize_per_channel(x, {0.1f, 0.1f}, {0, 0}, 0, DType::kF32), DTypeError,
                   "quantize: target dtype must be s8 or u8, got f32");
  EXPECT_THROW_MSG(quantize_per_channel(Tensor(), {0.1f}, {0}, 0, DType::kS8), ValueError,
                   "quantize_per_channel: input is an undefined tensor");
}

TEST(OpErrors, Dequantize) {
  EXPECT_THROW_MSG(dequantize(f32({2})), DTypeError,
                   "dequantize: input must be a quantized s8/u8 tensor, got dtype f32");
  EXPECT_THROW_MSG(dequantize(u8({2})), DTypeError,
                   "dequantize: input must be a quantized s8/u8 tensor, got dtype u8 without quantization parameters");
  EXPECT_THROW_MSG(f32({2}).dequantize(), DTypeError, "dequantize: input must be a quantized s8/u8 tensor");
  EXPECT_THROW_MSG(dequantize(Tensor()), ValueError, "dequantize: input is an undefined tensor");
}

TEST(OpErrors, TensorCreation) {
  EXPECT_THROW_MSG(Tensor::empty({2, -1}), ShapeError, "tensor sizes must be >= 0, got [2, -1]");
  EXPECT_THROW_MSG(zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}), ShapeError, "tensors have at most 8 dims, got 9");
  EXPECT_THROW_MSG(Tensor::empty_strided({2, 3}, {1}), ShapeError, "empty_strided: 2 sizes but 1 strides");
  EXPECT_THROW_MSG(Tensor::empty_strided({2, 3}, {3, -1}), ShapeError, "empty_strided: strides must be >= 0");
  EXPECT_THROW_MSG(dtype_from_name("f16"), ValueError, "unknown dtype name \"f16\"");
}

// ---- issue 12 op families ------------------------------------------------------------------------

TEST(OpErrors, Stack) {
  EXPECT_THROW_MSG(stack({}, 0), ValueError, "stack: expects a non-empty list of tensors");
  EXPECT_THROW_MSG(stack({f32({2, 3}), f32({2, 4})}, 0), ShapeError,
                   "stack: every tensor must have the same sizes, got [2, 3] at index 0 and [2, 4] at index 1");
  EXPECT_THROW_MSG(stack({f32({2, 3}), f32({2, 3})}, 3), IndexError,
                   "stack: dim 3 is out of range for 2-D tensors (expected in [-3, 2])");
  EXPECT_THROW_MSG(stack({f32({2, 3}), f32({2, 3})}, -4), IndexError, "stack: dim -4 is out of range");
  EXPECT_THROW_MSG(stack({f32({2}), Tensor()}, 0), ValueError, "stack: tensor is an undefined tensor");
  EXPECT_THROW_MSG(stack({qu8({2}), f32({2})}, 0), DTypeError, "cat: tensors[1] has dtype f32 but tensors[0] has u8");
  const Tensor pc = zeros({2, 3}, DType::kS8).with_qparams(QuantParams::per_channel({0.1f, 0.2f}, {0, 0}, 0));
  EXPECT_THROW_MSG(stack({pc, pc}, 0), DTypeError, "stack: per-channel quantized tensors cannot be reshaped");
}

TEST(OpErrors, SqueezeUnsqueeze) {
  EXPECT_THROW_MSG(Tensor().squeeze(), ValueError, "squeeze: input is an undefined tensor");
  EXPECT_THROW_MSG(squeeze(f32({2, 1}), 2), IndexError, "dim 2 is out of range for a 2-D tensor");
  EXPECT_THROW_MSG(unsqueeze(f32({2, 1}), 3), IndexError, "unsqueeze: dim 3 is out of range for a 2-D tensor");
  const Tensor pc = zeros({1, 2}, DType::kS8).with_qparams(QuantParams::per_channel({0.1f, 0.2f}, {0, 0}, 1));
  EXPECT_THROW_MSG(pc.squeeze(), DTypeError, "squeeze: per-channel quantized tensors cannot be reshaped");
}

TEST(OpErrors, Expand) {
  const Tensor x = f32({2, 3});
  EXPECT_THROW_MSG(x.expand({3}), ShapeError,
                   "expand: the number of sizes provided (1) must be greater or equal to the number of dimensions in "
                   "the tensor (2)");
  EXPECT_THROW_MSG(x.expand({2, 4}), ShapeError,
                   "expand: the expanded size of the tensor (4) must match the existing size (3) at non-singleton "
                   "dimension 1. Target sizes: [2, 4]. Tensor sizes: [2, 3]");
  EXPECT_THROW_MSG(expand(x, {-1, 2, 3}), ShapeError,
                   "expand: size -1 is not allowed in a leading, non-existing dimension 0");
  EXPECT_THROW_MSG(expand(f32({2, 1}), {2, -2}), ShapeError, "expand: sizes must be >= -1, got -2 at dim 1");
  EXPECT_THROW_MSG(expand(Tensor(), {2}), ValueError, "expand: input is an undefined tensor");
}

TEST(OpErrors, Repeat) {
  const Tensor x = f32({2, 3});
  EXPECT_THROW_MSG(x.repeat({2}), ShapeError,
                   "repeat: number of repeats (1) must be at least the number of dims of the tensor (2)");
  EXPECT_THROW_MSG(repeat(x, {1, -1}), ValueError, "repeat: repeats must be >= 0, got -1 at dim 1");
  EXPECT_THROW_MSG(repeat(Tensor(), {1}), ValueError, "repeat: input is an undefined tensor");
  EXPECT_THROW_MSG(repeat(zeros({2}, DType::kBF16), {2}), DTypeError, "repeat: dtype bf16 is not supported");
}

TEST(OpErrors, Pad) {
  const Tensor x = f32({1, 2, 3, 4});
  EXPECT_THROW_MSG(pad(x, {1, 1, 1}), ValueError, "pad: the pads must come in (left, right) pairs, got 3 values");
  EXPECT_THROW_MSG(pad(f32({3}), {1, 1, 1, 1}), ShapeError, "pad: 2 pairs of pads for a 1-D tensor of sizes [3]");
  EXPECT_THROW_MSG(pad(x, {-3, -2}), ShapeError, "pad: dim 3 of size 4 with pads (-3, -2) would have a negative size");
  EXPECT_THROW_MSG(pad(x, {4, 0, 0, 0}, PadMode::kReflect), ValueError,
                   "pad: reflect mode needs pads smaller than the dim they pad, got (4, 0) for dim 3 of size 4");
  EXPECT_THROW_MSG(pad(x, {0, 0, 3, 0}, "reflect"), ValueError,
                   "pad: reflect mode needs pads smaller than the dim they pad, got (3, 0) for dim 2 of size 3");
  EXPECT_THROW_MSG(pad(x, {-1, 0, 0, 0}, PadMode::kReplicate), ValueError,
                   "pad: replicate mode needs pads >= 0, got (-1, 0) for dim 3");
  EXPECT_THROW_MSG(pad(f32({4}), {1, 1}, PadMode::kReflect), ShapeError,
                   "pad: reflect mode pads the last 1, 2 or 3 dims of a (C, ...) or (N, C, ...) tensor; got 1 pairs "
                   "of pads for sizes [4]");
  EXPECT_THROW_MSG(pad(x, {1, 1, 1, 1, 1, 1, 1, 1}, PadMode::kReplicate), ShapeError,
                   "pad: replicate mode pads the last 1, 2 or 3 dims");
  EXPECT_THROW_MSG(pad(zeros({1, 2, 0}), {1, 1}, PadMode::kReplicate), ShapeError,
                   "pad: replicate mode cannot pad dim 2 of size 0");
  EXPECT_THROW_MSG(pad(x, {1, 1}, "circular"), ValueError,
                   "pad: mode must be \"constant\", \"reflect\" or \"replicate\", got \"circular\"");
  EXPECT_THROW_MSG(pad(x, {1, 1}, static_cast<PadMode>(7)), ValueError, "pad: unknown mode 7");
  EXPECT_THROW_MSG(pad(Tensor(), {1, 1}), ValueError, "pad: input is an undefined tensor");
  // The input is untouched and usable after each error.
  EXPECT_EQ(pad(x, {1, 1}).sizes(), IntArrayRef({1, 2, 3, 6}));
}

TEST(OpErrors, PreluSoftplusMish) {
  EXPECT_THROW_MSG(prelu(f32({2, 3, 4}), f32({2})), ShapeError,
                   "prelu: weight has 2 elements but the input has 3 channels (dim 1 of [2, 3, 4]); it needs 1 or 3");
  EXPECT_THROW_MSG(prelu(f32({2, 3}), f32({3, 1})), ShapeError, "prelu: weight must be 1-D, got sizes [3, 1]");
  EXPECT_THROW_MSG(prelu(u8({2, 3}), f32({3})), DTypeError, "prelu: input must have dtype f32");
  EXPECT_THROW_MSG(prelu(f32({2, 3}), Tensor()), ValueError, "prelu: weight is an undefined tensor");
  EXPECT_THROW_MSG(nn::PReLUImpl(0), ValueError, "PReLU: num_parameters must be >= 1, got 0");
  EXPECT_THROW_MSG(softplus(f32({2}), 0.0), ValueError, "softplus: beta must be nonzero and finite, got 0");
  EXPECT_THROW_MSG(softplus(f32({2}), 1.0, std::nan("")), ValueError, "softplus: threshold must not be NaN");
  EXPECT_THROW_MSG(softplus(u8({2})), DTypeError, "softplus: input must have dtype f32");
  EXPECT_THROW_MSG(mish(u8({2})), DTypeError, "mish: input must have dtype f32");
  EXPECT_THROW_MSG(mish(Tensor()), ValueError, "mish: input");
}

TEST(OpErrors, WherePowSqrtExp) {
  const Tensor m = u8({2, 3}), a = f32({2, 3});
  EXPECT_THROW_MSG(where(m, a, f32({4})), ShapeError, "where");
  EXPECT_THROW_MSG(where(qu8({2, 3}), a, a), DTypeError,
                   "where: condition must be a mask (unquantized u8, s8, s32, s64 or f32; nonzero is true), got a "
                   "quantized u8");
  EXPECT_THROW_MSG(where(m, u8({2, 3}), a), DTypeError, "where: input must have dtype f32");
  EXPECT_THROW_MSG(where(m, a, u8({2, 3})), DTypeError, "where: other must have dtype f32");
  EXPECT_THROW_MSG(where(Tensor(), a, a), ValueError, "where: condition is an undefined tensor");
  EXPECT_THROW_MSG(pow(a, f32({4})), ShapeError, "pow");
  EXPECT_THROW_MSG(pow(u8({2}), 2.0), DTypeError, "pow: input must have dtype f32");
  EXPECT_THROW_MSG(pow(2.0, u8({2})), DTypeError, "pow: exponent must have dtype f32");
  EXPECT_THROW_MSG(sqrt(u8({2})), DTypeError, "sqrt: input must have dtype f32");
  EXPECT_THROW_MSG(exp(Tensor()), ValueError, "exp: input");
}

TEST(OpErrors, Indexing) {
  const Tensor x = f32({2, 3});
  EXPECT_THROW_MSG(argmax(x, 2), IndexError, "dim 2 is out of range for a 2-D tensor");
  EXPECT_THROW_MSG(max(f32({2, 0}), 1), ShapeError, "max: cannot reduce dim 1 of size 0 (sizes [2, 0])");
  EXPECT_THROW_MSG(argmax(u8({2}), 0), DTypeError, "argmax: input must have dtype f32");
  EXPECT_THROW_MSG(topk(x, 4, 1), ValueError, "topk: k (4) is out of range for dim 1 of size 3");
  EXPECT_THROW_MSG(topk(x, -1, 1), ValueError, "topk: k (-1) is out of range");
  EXPECT_THROW_MSG(index_select(x, 1, from_vector<int64_t>({3})), IndexError,
                   "index_select: index 3 is out of range for dim 1 of size 3");
  EXPECT_THROW_MSG(index_select(x, 1, from_vector<int64_t>({-1})), IndexError, "index_select: index -1 is out of range");
  EXPECT_THROW_MSG(index_select(x, 1, f32({2})), DTypeError, "index_select: index must be s64 (or s32), got f32");
  EXPECT_THROW_MSG(index_select(full({}, 3.0), 0, from_vector<int64_t>(std::vector<int64_t>(64, 0))), IndexError,
                   "index_select: a 0-D input takes exactly one index value, got 64");
  EXPECT_EQ(index_select(full({}, 3.0), 0, from_vector<int64_t>({0})).item<float>(), 3.f);
  EXPECT_THROW_MSG(index_select(x, 1, zeros({1, 1}, DType::kS64)), ShapeError,
                   "index_select: index must be 1-D, got sizes [1, 1]");
  EXPECT_THROW_MSG(gather(x, 1, zeros({2}, DType::kS64)), ShapeError,
                   "gather: index must have as many dims as the input (2), got sizes [2]");
  EXPECT_THROW_MSG(gather(x, 1, zeros({3, 1}, DType::kS64)), ShapeError,
                   "gather: index sizes [3, 1] exceed the input's [2, 3] at dim 0");
  EXPECT_THROW_MSG(gather(x, 0, full({1, 1}, 2.0, DType::kS64)), IndexError,
                   "gather: index 2 is out of range for dim 0 of size 2");
  EXPECT_THROW_MSG(gather(Tensor(), 0, zeros({1}, DType::kS64)), ValueError, "gather: input is an undefined tensor");
}

}  // namespace
}  // namespace dbrq
