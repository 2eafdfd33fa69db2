// The tensor core against naive expectations: creation helpers, sizes/strides and layouts, views
// (and when they must copy), element access, quantization parameters, printing, in-place ops with
// their storage-version bumps, and the caching allocator.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace dbrq {
namespace {

using V = std::vector<int64_t>;

V sizes_of(const Tensor& t) { return V(t.sizes().begin(), t.sizes().end()); }
V strides_of(const Tensor& t) { return V(t.strides().begin(), t.strides().end()); }

// 0, 1, 2, ... in logical order, f32.
Tensor iota(std::initializer_list<int64_t> sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.f);
  return from_vector(v, sizes);
}

std::string str(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

// ---- creation -----------------------------------------------------------------------------------

TEST(TensorCreation, ZerosOnesFull) {
  const Tensor z = zeros({2, 3});
  EXPECT_EQ(sizes_of(z), (V{2, 3}));
  EXPECT_EQ(z.dtype(), DType::kF32);
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(6, 0.f));
  EXPECT_EQ(ones({4}, DType::kS32).to_vector<int32_t>(), std::vector<int32_t>(4, 1));
  const Tensor f = full({2, 2}, -1.5);
  EXPECT_EQ(f.to_vector<float>(), std::vector<float>(4, -1.5f));
  EXPECT_EQ(full({3}, 200.0, DType::kU8).to_vector<int>(), (std::vector<int>{200, 200, 200}));
  EXPECT_EQ(full({2}, -7.0, DType::kS64).to_vector<int64_t>(), (std::vector<int64_t>{-7, -7}));
  // Zero-size and 0-D tensors are valid.
  EXPECT_EQ(zeros({0, 3}).numel(), 0);
  const Tensor scalar = full({}, 4.0);
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.item<float>(), 4.f);
}

TEST(TensorCreation, Arange) {
  EXPECT_EQ(arange(5).to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1.0, 2.0, 0.25).to_vector<float>(), (std::vector<float>{1.f, 1.25f, 1.5f, 1.75f}));
  EXPECT_EQ(arange(5.0, 0.0, -2.0).to_vector<float>(), (std::vector<float>{5, 3, 1}));
  const Tensor i = arange(0.0, 7.0, 3.0, DType::kS64);
  EXPECT_EQ(i.dtype(), DType::kS64);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(arange(3.0, 1.0).numel(), 0);  // empty range, not an error
  EXPECT_THROW_MSG(arange(0.0, 1.0, 0.0), ValueError, "arange: step must be finite and non-zero, got 0");
}

TEST(TensorCreation, RandnIsDeterministicAndStandardNormal) {
  const Tensor a = randn({10001}, 7), b = randn({10001}, 7), c = randn({10001}, 8);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  // A prefix of a longer draw is the shorter draw (same generator sequence), odd sizes included.
  const std::vector<float> all = a.to_vector<float>();
  EXPECT_EQ(randn({3}, 7).to_vector<float>(), std::vector<float>(all.begin(), all.begin() + 3));
  double s = 0, s2 = 0;
  for (float v : a.to_vector<float>()) {
    ASSERT_TRUE(std::isfinite(v));
    s += v;
    s2 += static_cast<double>(v) * v;
  }
  const double mean = s / a.numel(), var = s2 / a.numel() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(var, 1.0, 0.05);
}

TEST(TensorCreation, RandUniform) {
  const Tensor a = rand_uniform({5000}, -2.0, 3.0, 1);
  EXPECT_EQ(a.to_vector<float>(), rand_uniform({5000}, -2.0, 3.0, 1).to_vector<float>());
  const auto v = a.to_vector<float>();
  EXPECT_GE(*std::min_element(v.begin(), v.end()), -2.f);
  EXPECT_LT(*std::max_element(v.begin(), v.end()), 3.f);
  EXPECT_NEAR(std::accumulate(v.begin(), v.end(), 0.0) / v.size(), 0.5, 0.1);
  EXPECT_THROW_MSG(rand_uniform({2}, 1.0, 1.0, 0), ValueError, "rand_uniform: low (1) must be < high (1)");
}

TEST(TensorCreation, FromVector) {
  const Tensor t = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(sizes_of(t), (V{2, 3}));
  EXPECT_EQ(t.at<float>({1, 0}), 4.f);
  const Tensor i = from_vector<int64_t>({5, -1});
  EXPECT_EQ(i.dtype(), DType::kS64);
  EXPECT_EQ(sizes_of(i), (V{2}));
  EXPECT_EQ(from_vector<uint8_t>({1, 255}).dtype(), DType::kU8);
  EXPECT_THROW_MSG(from_vector<float>({1, 2, 3}, {2, 2}), ShapeError, "3 values do not fill sizes [2, 2]");
}

// ---- sizes, strides, layouts --------------------------------------------------------------------

TEST(TensorLayout, ContiguousAndChannelsLastStrides) {
  const Tensor t = Tensor::empty({2, 3, 4, 5});
  EXPECT_EQ(strides_of(t), (V{60, 20, 5, 1}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_FALSE(t.is_channels_last());
  EXPECT_EQ(t.suggest_memory_format(), MemoryFormat::kContiguous);
  EXPECT_EQ(t.numel(), 120);
  EXPECT_EQ(t.nbytes(), 480u);
  EXPECT_EQ(t.element_size(), 4u);
  EXPECT_EQ(t.size(-1), 5);
  EXPECT_EQ(t.stride(-3), 20);

  const Tensor cl = Tensor::empty({2, 3, 4, 5}, DType::kF32, MemoryFormat::kChannelsLast);
  EXPECT_EQ(sizes_of(cl), (V{2, 3, 4, 5}));  // sizes stay logical NCHW
  EXPECT_EQ(strides_of(cl), (V{60, 1, 15, 3}));
  EXPECT_TRUE(cl.is_channels_last());
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_TRUE(cl.is_non_overlapping_and_dense());
  EXPECT_EQ(cl.suggest_memory_format(), MemoryFormat::kChannelsLast);
  EXPECT_EQ(strides_for(V{2, 3, 4, 5}, MemoryFormat::kChannelsLast), (V{60, 1, 15, 3}));

  // One channel: both layouts describe the same memory; the suggestion stays contiguous.
  const Tensor c1 = Tensor::empty({2, 1, 4, 5}, DType::kF32, MemoryFormat::kChannelsLast);
  EXPECT_TRUE(c1.is_contiguous());
  EXPECT_TRUE(c1.is_channels_last());
  EXPECT_EQ(c1.suggest_memory_format(), MemoryFormat::kContiguous);

  EXPECT_THROW_MSG(Tensor::empty({2, 3}, DType::kF32, MemoryFormat::kChannelsLast), ShapeError,
                   "channels-last layout needs a 4-D tensor, got sizes [2, 3]");
  EXPECT_THROW_MSG(t.size(4), IndexError, "dim 4 is out of range for a 4-D tensor (valid: -4 to 3)");
  EXPECT_THROW_MSG(t.stride(-5), IndexError, "dim -5 is out of range");
}

TEST(TensorLayout, NonOverlappingAndDense) {
  const Tensor t = iota({2, 3, 4});
  EXPECT_TRUE(t.is_non_overlapping_and_dense());
  EXPECT_TRUE(t.permute({2, 0, 1}).is_non_overlapping_and_dense());
  EXPECT_FALSE(t.permute({2, 0, 1}).is_contiguous());
  EXPECT_FALSE(t.slice(2, 0, 4, 2).is_non_overlapping_and_dense());  // gaps
  EXPECT_FALSE(t.narrow(1, 0, 2).is_non_overlapping_and_dense());
  EXPECT_TRUE(t.narrow(0, 1, 1).is_non_overlapping_and_dense());  // a dense block at an offset
  // Stride 0 (broadcast) overlaps.
  const Tensor row = iota({4});
  EXPECT_FALSE(row.raw_as_strided({3, 4}, {0, 1}, 0).is_non_overlapping_and_dense());
  EXPECT_FALSE(Tensor().is_non_overlapping_and_dense());
  EXPECT_FALSE(Tensor().is_contiguous());
}

// ---- views --------------------------------------------------------------------------------------

TEST(TensorViews, ReshapeIsAViewWhenStridesAllow) {
  const Tensor t = iota({2, 3, 4});
  const Tensor r = t.reshape({6, -1});
  EXPECT_EQ(sizes_of(r), (V{6, 4}));
  EXPECT_EQ(r.storage(), t.storage());
  EXPECT_EQ(r.to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(sizes_of(t.reshape({-1})), (V{24}));
  EXPECT_EQ(sizes_of(reshape(t, {4, -1, 2})), (V{4, 3, 2}));
  EXPECT_EQ(sizes_of(t.view({2, 12})), (V{2, 12}));
  // A narrowed tensor whose rows stay contiguous can still be viewed.
  const Tensor n = t.narrow(0, 1, 1);
  EXPECT_EQ(n.view({3, 4}).at<float>({0, 0}), 12.f);
}

TEST(TensorViews, ReshapeCopiesWhenStridesForbidAView) {
  const Tensor t = iota({3, 4});
  const Tensor tt = t.transpose(0, 1);  // [4, 3], column-major
  const Tensor r = tt.reshape({12});
  EXPECT_NE(r.storage(), t.storage());
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_THROW_MSG(tt.view({12}), ShapeError, "view: sizes [12] are not compatible with the strides");
  // Channels-last flattening over C, H, W needs a copy too; values stay in logical order.
  const Tensor x = iota({1, 2, 2, 2});
  const Tensor cl = x.contiguous(MemoryFormat::kChannelsLast);
  EXPECT_EQ(cl.flatten(1).to_vector<float>(), x.flatten(1).to_vector<float>());
}

// dbrq keeps conv outputs channels-last internally, but the tensor a user holds is NCHW: view()
// must mean what it means on an NCHW tensor (it used to throw "use reshape()").
TEST(TensorViews, ViewOfAChannelsLastActivationMeansTheLogicalNchwView) {
  const Tensor x = iota({2, 3, 2, 2});
  const Tensor cl = x.contiguous(MemoryFormat::kChannelsLast);
  ASSERT_TRUE(cl.is_channels_last());
  EXPECT_EQ(cl.view({2, -1}).to_vector<float>(), x.view({2, -1}).to_vector<float>());
  EXPECT_EQ(sizes_of(cl.view({2, -1})), (V{2, 12}));
  EXPECT_EQ(cl.view({6, 4}).to_vector<float>(), x.view({6, 4}).to_vector<float>());
  // A conv's output, as a user's forward sees it.
  const Tensor y = conv2d(randn({2, 3, 5, 5}, 1), randn({4, 3, 3, 3}, 2));
  ASSERT_TRUE(y.is_channels_last());
  EXPECT_EQ(y.view({2, -1}).to_vector<float>(), y.contiguous().view({2, -1}).to_vector<float>());
  // Views that PyTorch refuses on an NCHW tensor are still refused.
  EXPECT_THROW_MSG(x.transpose(2, 3).view({2, 12}), ShapeError, "use reshape()");
}

// A quantized tensor reads as real values with any element type, as an f32 tensor holding those
// values does, so user code never mistakes int8 codes for values: after convert, `item<int64_t>()`
// of a tensor that was f32 in the fp32 model returned its code. int_repr() gives the codes.
TEST(TensorAccess, QuantizedTensorsReadAsRealValues) {
  const Tensor q = quantize_per_tensor(from_vector<float>({-1.f, 0.f, 0.31f, 2.f}, {2, 2}), 0.01f, 100, DType::kU8);
  const std::vector<float> real = q.to_vector<float>();
  EXPECT_FLOAT_EQ(real[0], -1.f);
  EXPECT_FLOAT_EQ(real[2], 0.31f);
  EXPECT_EQ(q.int_repr().to_vector<int>(), (std::vector<int>{0, 100, 131, 255}));
  EXPECT_FALSE(q.int_repr().is_quantized());
  EXPECT_FLOAT_EQ(q.at<float>({1, 0}), 0.31f);
  EXPECT_FLOAT_EQ(q.at<float>({-1, -2}), 0.31f);
  EXPECT_EQ(q.int_repr().at<int>({1, 0}), 131);
  EXPECT_FLOAT_EQ(q.narrow(0, 1, 1).narrow(1, 0, 1).item<float>(), 0.31f);
  EXPECT_EQ(q.narrow(0, 1, 1).narrow(1, 0, 1).int_repr().item<int>(), 131);
  // Integer and bool reads convert the real value, as from an f32 tensor: -1 -> -1, 0.31 -> 0, and
  // 2 (clipped to code 255: 1.55) -> 1.
  EXPECT_EQ(q.to_vector<int>(), (std::vector<int>{-1, 0, 0, 1}));
  EXPECT_EQ(q.to_vector<int>(), dequantize(q).to_vector<int>());
  EXPECT_EQ(q.at<int64_t>({1, 1}), 1);
  EXPECT_EQ(q.narrow(0, 0, 1).narrow(1, 1, 1).item<int64_t>(), 0);  // code 100, the zero point
  EXPECT_TRUE(q.narrow(0, 1, 1).narrow(1, 0, 1).item<bool>());
  EXPECT_FALSE(q.narrow(0, 0, 1).narrow(1, 1, 1).item<bool>());
  EXPECT_THROW_MSG(from_vector<float>({1.f}).int_repr(), DTypeError, "int_repr(): the tensor is not quantized (dtype f32");
  // Per-channel parameters: each element with its channel's.
  const Tensor pc = quantize_per_channel(from_vector<float>({1.f, 2.f, 3.f, 4.f}, {2, 2}), {0.5f, 0.25f}, {0, 2}, 1,
                                         DType::kS8);
  EXPECT_EQ(pc.to_vector<float>(), (std::vector<float>{1.f, 2.f, 3.f, 4.f}));
  EXPECT_FLOAT_EQ(pc.at<double>({1, 1}), 4.0);
  EXPECT_EQ(pc.int_repr().to_vector<int>(), (std::vector<int>{2, 10, 6, 18}));
  EXPECT_EQ(pc.to_vector<int>(), (std::vector<int>{1, 2, 3, 4}));
}

// copy_ and fill_ move real values, as reads do: copying an int8 model output (int8_outputs) into
// an f32 buffer gave its codes (5 for 0.11), and fill_(0) of a quantized tensor the code 0.
TEST(TensorAccess, CopyAndFillMoveRealValuesBetweenQuantizedAndFloat) {
  const Tensor x = from_vector<float>({-1.f, 0.f, 0.31f, 1.2f}, {2, 2});
  const Tensor q = quantize_per_tensor(x, 0.01f, 100, DType::kU8);
  Tensor f = zeros({2, 2});
  f.copy_(q);
  EXPECT_EQ(f.to_vector<float>(), dequantize(q).to_vector<float>());
  Tensor broadcast = zeros({3, 2, 2});
  broadcast.copy_(q);
  EXPECT_EQ(broadcast.narrow(0, 2, 1).reshape({2, 2}).to_vector<float>(), dequantize(q).to_vector<float>());
  // Into a quantized tensor: the values quantized with its own parameters.
  Tensor dst = quantize_per_tensor(zeros({2, 2}), 0.02f, 50, DType::kU8);
  dst.copy_(x);
  EXPECT_EQ(dst.int_repr().to_vector<int>(), quantize_per_tensor(x, 0.02f, 50, DType::kU8).int_repr().to_vector<int>());
  EXPECT_EQ(dst.q_scale(), 0.02f);
  dst.copy_(q);  // other parameters: requantized from the real values
  EXPECT_EQ(dst.int_repr().to_vector<int>(), (std::vector<int>{0, 50, 66, 110}));  // -1 clips to code 0
  Tensor same = quantize_per_tensor(zeros({2, 2}), 0.01f, 100, DType::kU8);
  same.copy_(q);  // equal parameters: the codes as they are
  EXPECT_EQ(same.int_repr().to_vector<int>(), q.int_repr().to_vector<int>());
  // fill_: the code of the value (0.55 / 0.1 + 100 = 105.5, half to even: 106).
  Tensor filled = quantize_per_tensor(zeros({3}), 0.1f, 100, DType::kU8);
  filled.fill_(0.55);
  EXPECT_EQ(filled.int_repr().to_vector<int>(), (std::vector<int>{106, 106, 106}));
  filled.fill_(0.0);
  EXPECT_EQ(filled.to_vector<float>(), (std::vector<float>{0.f, 0.f, 0.f}));
  Tensor pc = quantize_per_channel(zeros({2, 2}), {0.5f, 0.25f}, {0, 2}, 1, DType::kS8);
  pc.fill_(1.0);
  EXPECT_EQ(pc.int_repr().to_vector<int>(), (std::vector<int>{2, 6, 2, 6}));
  EXPECT_EQ(pc.to_vector<float>(), (std::vector<float>{1.f, 1.f, 1.f, 1.f}));
  Tensor plain = zeros({2});
  plain.fill_(1.5);
  EXPECT_EQ(plain.to_vector<float>(), (std::vector<float>{1.5f, 1.5f}));
  EXPECT_THROW_MSG(dst.copy_(zeros({3})), ShapeError, "copy_");
}

TEST(TensorViews, FlattenPermuteTranspose) {
  const Tensor t = iota({2, 3, 4});
  EXPECT_EQ(sizes_of(t.flatten()), (V{24}));
  EXPECT_EQ(sizes_of(t.flatten(1)), (V{2, 12}));
  EXPECT_EQ(sizes_of(t.flatten(0, 1)), (V{6, 4}));
  EXPECT_EQ(sizes_of(flatten(full({}, 1.0))), (V{1}));

  const Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(sizes_of(p), (V{4, 2, 3}));
  EXPECT_EQ(strides_of(p), (V{1, 12, 4}));
  EXPECT_EQ(p.storage(), t.storage());
  EXPECT_EQ(p.at<float>({3, 1, 2}), t.at<float>({1, 2, 3}));
  EXPECT_EQ(sizes_of(t.permute({-1, 0, 1})), (V{4, 2, 3}));

  const Tensor tr = t.transpose(0, -1);
  EXPECT_EQ(sizes_of(tr), (V{4, 3, 2}));
  EXPECT_EQ(tr.at<float>({3, 2, 1}), t.at<float>({1, 2, 3}));
  EXPECT_EQ(sizes_of(transpose(t, 1, 1)), (V{2, 3, 4}));
}

TEST(TensorViews, NarrowSliceSelect) {
  const Tensor t = iota({4, 5});
  const Tensor n = t.narrow(1, 1, 3);
  EXPECT_EQ(sizes_of(n), (V{4, 3}));
  EXPECT_EQ(n.storage_offset(), 1);
  EXPECT_EQ(n.at<float>({2, 0}), 11.f);
  EXPECT_EQ(t.narrow(0, -1, 1).to_vector<float>(), (std::vector<float>{15, 16, 17, 18, 19}));  // negative start

  const Tensor s = t.slice(1, 0, 5, 2);
  EXPECT_EQ(sizes_of(s), (V{4, 3}));
  EXPECT_EQ(strides_of(s), (V{5, 2}));
  EXPECT_EQ(s.select(0, 1).to_vector<float>(), (std::vector<float>{5, 7, 9}));
  // Python slicing: negative indices count from the end, out-of-range ends clamp.
  EXPECT_EQ(t.select(0, 0).slice(0, -3, -1).to_vector<float>(), (std::vector<float>{2, 3}));
  EXPECT_EQ(t.select(0, 0).slice(0, 1, 100, 3).to_vector<float>(), (std::vector<float>{1, 4}));
  EXPECT_EQ(t.select(0, 0).slice(0, 4, 2).numel(), 0);
  EXPECT_EQ(t.slice(0, 1, 4, 2).to_vector<float>(), (std::vector<float>{5, 6, 7, 8, 9, 15, 16, 17, 18, 19}));
  EXPECT_EQ(t.slice(-1, -2, 5).to_vector<float>(), (std::vector<float>{3, 4, 8, 9, 13, 14, 18, 19}));

  const Tensor row = t.select(0, -1);
  EXPECT_EQ(sizes_of(row), (V{5}));
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{15, 16, 17, 18, 19}));
  EXPECT_EQ(t.select(1, 2).to_vector<float>(), (std::vector<float>{2, 7, 12, 17}));
  EXPECT_EQ(row.storage(), t.storage());
}

TEST(TensorViews, UnsqueezeSqueeze) {
  const Tensor t = iota({2, 3});
  EXPECT_EQ(sizes_of(t.unsqueeze(0)), (V{1, 2, 3}));
  EXPECT_EQ(sizes_of(t.unsqueeze(1)), (V{2, 1, 3}));
  EXPECT_EQ(sizes_of(t.unsqueeze(2)), (V{2, 3, 1}));
  EXPECT_EQ(sizes_of(t.unsqueeze(-1)), (V{2, 3, 1}));
  EXPECT_EQ(sizes_of(t.unsqueeze(-3)), (V{1, 2, 3}));
  EXPECT_TRUE(t.unsqueeze(1).is_contiguous());
  EXPECT_EQ(t.unsqueeze(1).to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(sizes_of(t.unsqueeze(1).squeeze(1)), (V{2, 3}));
  EXPECT_EQ(sizes_of(t.unsqueeze(0).squeeze(-3)), (V{2, 3}));
  EXPECT_EQ(sizes_of(t.squeeze(0)), (V{2, 3}));  // size 2: nothing to squeeze, like PyTorch
  EXPECT_EQ(sizes_of(full({}, 1.0).unsqueeze(0)), (V{1}));
}

TEST(TensorViews, ContiguousBothFormats) {
  const Tensor x = iota({2, 3, 2, 2});
  EXPECT_EQ(x.contiguous().storage(), x.storage());  // already contiguous: no copy
  const Tensor cl = x.contiguous(MemoryFormat::kChannelsLast);
  EXPECT_NE(cl.storage(), x.storage());
  EXPECT_EQ(strides_of(cl), (V{12, 1, 6, 3}));
  EXPECT_EQ(cl.to_vector<float>(), x.to_vector<float>());
  // Memory order is NHWC: channel values of pixel (0, 0) come first.
  const float* raw = cl.raw_data<float>();
  EXPECT_EQ((std::vector<float>(raw, raw + 3)), (std::vector<float>{0, 4, 8}));
  EXPECT_EQ(cl.contiguous(MemoryFormat::kChannelsLast).storage(), cl.storage());
  const Tensor back = cl.contiguous();
  EXPECT_TRUE(back.is_contiguous());
  EXPECT_EQ(back.to_vector<float>(), x.to_vector<float>());
  // kPreserve keeps a dense layout; clone() copies it.
  const Tensor c = cl.clone();
  EXPECT_NE(c.storage(), cl.storage());
  EXPECT_TRUE(c.is_channels_last());
  EXPECT_EQ(c.to_vector<float>(), x.to_vector<float>());
  const Tensor t = x.transpose(1, 2).contiguous();
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.at<float>({1, 0, 2, 1}), x.at<float>({1, 2, 0, 1}));
}

// ---- element access -----------------------------------------------------------------------------

TEST(TensorAccess, AtItemToVectorValueAt) {
  const Tensor t = iota({2, 3});
  EXPECT_EQ(t.at<float>({1, 2}), 5.f);
  EXPECT_EQ(t.at<float>({-1, -3}), 3.f);
  EXPECT_EQ(t.at<int>({0, 1}), 1);
  EXPECT_EQ(t.transpose(0, 1).to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(t.transpose(0, 1).value_at(1), 3.0);
  EXPECT_EQ(t.narrow(0, 1, 1).narrow(1, 2, 1).item<float>(), 5.f);
  const Tensor q = from_vector<int8_t>({-3, 7}).with_qparams(QuantParams::per_tensor(0.5f, 1));
  EXPECT_EQ(q.value_at(0), -3.0);  // raw integers, not real values
  EXPECT_EQ(q.int_repr().to_vector<int>(), (std::vector<int>{-3, 7}));
  EXPECT_EQ(q.to_vector<int>(), (std::vector<int>{-2, 3}));  // (-3 - 1) * 0.5, (7 - 1) * 0.5

  EXPECT_THROW_MSG(t.at<float>({2, 0}), IndexError, "index 2 is out of range for dim 0 of size 2");
  EXPECT_THROW_MSG(t.at<float>({0}), IndexError, "has 1 entries for a 2-D tensor");
  EXPECT_THROW_MSG(t.item<float>(), ShapeError, "item(): tensor must have exactly one element, got sizes [2, 3]");
  EXPECT_THROW_MSG(t.value_at(6), IndexError, "element 6 is out of range for 6 elements");
  EXPECT_THROW_MSG(t.data<int8_t>(), DTypeError, "tensor has dtype f32 but was accessed as s8");
  EXPECT_THROW_MSG(Tensor().to_vector<float>(), ValueError, "to_vector(): tensor is undefined");
  EXPECT_THROW_MSG(Tensor().data_ptr(), ValueError, "data access on an undefined tensor");
}

// ---- quantization parameters --------------------------------------------------------------------

TEST(TensorQuantParams, WithQparamsAndAccessors) {
  const Tensor raw = from_vector<uint8_t>({0, 128, 255}, {3});
  EXPECT_FALSE(raw.is_quantized());
  const Tensor q = raw.with_qparams(QuantParams::per_tensor(0.25f, 128));
  EXPECT_TRUE(q.is_quantized());
  EXPECT_EQ(q.storage(), raw.storage());
  EXPECT_EQ(q.q_scale(), 0.25f);
  EXPECT_EQ(q.q_zero_point(), 128);
  EXPECT_EQ(q.dequantize().to_vector<float>(), (std::vector<float>{-32.f, 0.f, 31.75f}));
  EXPECT_FALSE(q.with_qparams(nullptr).is_quantized());
  // Shape ops keep the parameters, also when reshape has to copy.
  EXPECT_EQ(q.narrow(0, 1, 2).q_scale(), 0.25f);
  EXPECT_EQ(q.reshape({3, 1}).q_zero_point(), 128);
  const Tensor q2 = from_vector<uint8_t>({1, 2, 3, 4, 5, 6}, {2, 3}).with_qparams(QuantParams::per_tensor(0.5f, 3));
  const Tensor copied = q2.transpose(0, 1).reshape({6});
  EXPECT_NE(copied.storage(), q2.storage());
  EXPECT_EQ(copied.q_scale(), 0.5f);
  EXPECT_EQ(copied.q_zero_point(), 3);
  EXPECT_EQ(copied.int_repr().to_vector<int>(), (std::vector<int>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(q2.contiguous(MemoryFormat::kContiguous).q_scale(), 0.5f);

  EXPECT_THROW_MSG(zeros({3}).with_qparams(QuantParams::per_tensor(0.1f, 0)), DTypeError,
                   "quantization parameters need an s8 or u8 tensor, got f32");
  EXPECT_THROW_MSG(zeros({3}).q_scale(), DTypeError, "q_scale(): tensor is not per-tensor quantized (dtype f32)");
  EXPECT_THROW_MSG(raw.q_zero_point(), DTypeError, "q_zero_point(): tensor is not per-tensor quantized (dtype u8)");
  EXPECT_THROW_MSG(QuantParams::per_tensor(0.f, 0), ValueError, "quantization scale must be finite and > 0, got 0");
  EXPECT_THROW_MSG(QuantParams::per_tensor(NAN, 0), ValueError, "quantization scale must be finite and > 0");
  EXPECT_THROW_MSG(QuantParams::per_channel({0.1f, 0.2f}, {0}, 0), ValueError,
                   "needs as many zero points as scales, got 2 scales and 1 zero points");
  EXPECT_THROW_MSG(QuantParams::per_channel({0.1f, -1.f}, {0, 0}, 0), ValueError,
                   "quantization scale must be finite and > 0, got -1 for channel 1");
  EXPECT_THROW_MSG(QuantParams::per_channel({0.1f}, {0}, -1), ValueError, "axis must be >= 0, got -1");
}

TEST(TensorQuantParams, PerChannel) {
  const Tensor x = iota({2, 3, 1, 1});
  const Tensor q = quantize_per_channel(x, {0.5f, 1.f, 2.f}, {0, 0, 0}, 1, DType::kS8);
  EXPECT_THROW_MSG(q.q_scale(), DTypeError, "q_scale(): tensor is not per-tensor quantized (dtype s8)");
  EXPECT_EQ(q.int_repr().to_vector<int>(), (std::vector<int>{0, 1, 1, 6, 4, 2}));  // 2/2 = 1 and 5/2 = 2.5 -> 2 (half to even)
  EXPECT_THROW_MSG(q.with_qparams(QuantParams::per_channel({1.f, 1.f}, {0, 0}, 1)), ShapeError,
                   "per-channel parameters along axis 1 have 2 scales for sizes [2, 3, 1, 1]");
  // Permuting moves the channel axis with its dim.
  const Tensor p = q.permute({1, 0, 2, 3});
  ASSERT_TRUE(p.is_quantized());
  EXPECT_EQ(p.qparams()->axis, 0);
  EXPECT_EQ(q.qparams()->axis, 1);  // the original is untouched
  EXPECT_EQ(q.transpose(1, 3).qparams()->axis, 3);
  EXPECT_EQ(q.permute({2, 3, 0, 1}).qparams()->axis, 3);
  testing::expect_close(p.dequantize(), q.dequantize().permute({1, 0, 2, 3}), 0.0, "dequantize after permute");
  // Reshapes would lose track of the channel dim: refused rather than silently wrong.
  EXPECT_THROW_MSG(q.reshape({6}), DTypeError, "reshape: per-channel quantized tensors cannot be reshaped");
}

TEST(TensorQuantParams, PerChannelNarrowAlongTheChannelAxis) {
  // Rows 3..5 of a per-channel weight must dequantize with scales 3..5, not 0..2.
  const Tensor w = rand_uniform({6, 4}, -1.0, 1.0, 3);
  const std::vector<float> scales = {0.01f, 0.02f, 0.03f, 0.04f, 0.05f, 0.06f};
  const Tensor q = quantize_per_channel(w, scales, std::vector<int32_t>(6, 0), 0, DType::kS8);
  const Tensor full_dq = q.dequantize();
  testing::expect_close(q.narrow(0, 3, 3).dequantize(), full_dq.narrow(0, 3, 3), 0.0, "narrow along axis");
  testing::expect_close(q.narrow(1, 1, 2).dequantize(), full_dq.narrow(1, 1, 2), 0.0, "narrow across axis");
  testing::expect_close(q.slice(0, 1, 6, 2).dequantize(), full_dq.slice(0, 1, 6, 2), 0.0, "strided slice");
  const Tensor rows = q.slice(0, 1, 6, 2);
  EXPECT_EQ(rows.qparams()->scales, (std::vector<float>{0.02f, 0.04f, 0.06f}));
  EXPECT_EQ(q.narrow(0, 4, 2).qparams()->scales, (std::vector<float>{0.05f, 0.06f}));
  EXPECT_EQ(q.qparams()->scales, scales);  // the original keeps all six
}

// ---- printing -----------------------------------------------------------------------------------

TEST(TensorPrinting, ContainsSizesDtypeAndQparams) {
  const std::string s = str(from_vector<float>({1.5f, -2, 3, 4}, {2, 2}));
  EXPECT_NE(s.find("sizes=[2, 2]"), std::string::npos) << s;
  EXPECT_NE(s.find("dtype=f32"), std::string::npos) << s;
  EXPECT_NE(s.find("1.5"), std::string::npos) << s;
  EXPECT_NE(s.find("-2"), std::string::npos) << s;
  EXPECT_EQ(s.find("..."), std::string::npos) << s;
  EXPECT_EQ(s, from_vector<float>({1.5f, -2, 3, 4}, {2, 2}).to_string());

  const std::string q = str(quantize_per_tensor(ones({3}), 0.5f, 10, DType::kU8));
  EXPECT_NE(q.find("dtype=u8"), std::string::npos) << q;
  EXPECT_NE(q.find("scale=0.5, zero_point=10"), std::string::npos) << q;
  EXPECT_NE(q.find("[12, 12, 12]"), std::string::npos) << q;  // raw integers

  const std::string pc = str(quantize_per_channel(ones({2, 2}), {0.5f, 0.25f}, {0, 0}, 0, DType::kS8));
  EXPECT_NE(pc.find("per-channel axis=0, 2 scales in [0.25, 0.5]"), std::string::npos) << pc;

  // Long dims show their ends only.
  const std::string big = str(arange(100));
  EXPECT_NE(big.find("..."), std::string::npos) << big;
  EXPECT_NE(big.find("99"), std::string::npos) << big;
  EXPECT_EQ(big.find("50"), std::string::npos) << big;
  EXPECT_NE(big.find("sizes=[100]"), std::string::npos) << big;

  EXPECT_NE(str(zeros({1, 2, 2, 2}).contiguous(MemoryFormat::kChannelsLast)).find("channels_last"), std::string::npos);
  EXPECT_EQ(str(Tensor()), "tensor(undefined)");
  EXPECT_NE(str(zeros({0, 3})).find("[]"), std::string::npos);
  EXPECT_EQ(zeros({2, 3}).shape_string(), "[2, 3]");
}

// ---- in-place ops -------------------------------------------------------------------------------

TEST(TensorInPlace, ArithmeticWithBroadcastAndVersionBumps) {
  Tensor a = iota({2, 3});
  const Tensor alias = a;  // shares storage, like `b = a` in PyTorch
  uint64_t v = a.storage()->version();
  a.add_(from_vector<float>({10, 20, 30}));
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{10, 21, 32, 13, 24, 35}));
  EXPECT_GT(a.storage()->version(), v);
  v = a.storage()->version();
  a.mul_(2.0);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{20, 42, 64, 26, 48, 70}));
  EXPECT_GT(a.storage()->version(), v);
  a.sub_(from_vector<float>({1, 2}, {2, 1}));
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{19, 41, 63, 24, 46, 68}));
  a.div_(2.0);
  a.sub_(10.0);
  a.add_(0.5);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 11, 22, 2.5, 13.5, 24.5}));
  a.mul_(from_vector<float>({1, -1, 1}));
  a += 1.0;
  a -= 1.0;
  a *= 2.0;
  a /= 2.0;
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, -11, 22, 2.5, -13.5, 24.5}));
  EXPECT_EQ(a.storage(), alias.storage());  // truly in place

  v = a.storage()->version();
  a.relu_();
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 0, 22, 2.5, 0, 24.5}));
  EXPECT_GT(a.storage()->version(), v);
  v = a.storage()->version();
  a.clamp_(1.0, 20.0);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 1, 20, 2.5, 1, 20}));
  EXPECT_GT(a.storage()->version(), v);
  v = a.storage()->version();
  a.fill_(7.0);
  EXPECT_EQ(alias.to_vector<float>(), std::vector<float>(6, 7.f));
  EXPECT_GT(a.storage()->version(), v);
  a.zero_();
  EXPECT_EQ(alias.to_vector<float>(), std::vector<float>(6, 0.f));
}

TEST(TensorInPlace, OnViewsTouchOnlyTheView) {
  const Tensor base = iota({3, 4});
  Tensor cols = base.slice(1, 0, 4, 2);  // columns 0 and 2: not dense
  cols.add_(100.0);
  cols.mul_(from_vector<float>({1, -1}));
  EXPECT_EQ(base.to_vector<float>(), (std::vector<float>{100, 1, -102, 3, 104, 5, -106, 7, 108, 9, -110, 11}));
  Tensor row = base.select(0, 1);
  row.relu_();
  row.clamp_(0.0, 6.0);
  EXPECT_EQ(base.select(0, 1).to_vector<float>(), (std::vector<float>{6, 5, 0, 6}));
  Tensor col = base.select(1, 3);
  col.fill_(-1.0);
  EXPECT_EQ(base.select(1, 3).to_vector<float>(), (std::vector<float>{-1, -1, -1}));
  EXPECT_EQ(base.at<float>({0, 1}), 1.f);
}

TEST(TensorInPlace, CopyBroadcastsAndConvertsDtype) {
  Tensor dst = zeros({2, 3});
  uint64_t v = dst.storage()->version();
  dst.copy_(from_vector<float>({1, 2, 3}));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  EXPECT_GT(dst.storage()->version(), v);
  dst.copy_(from_vector<float>({7, 8}, {2, 1}));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{7, 7, 7, 8, 8, 8}));
  dst.copy_(full({}, 4.0));
  EXPECT_EQ(dst.to_vector<float>(), std::vector<float>(6, 4.f));

  Tensor i = zeros({3}, DType::kS32);
  i.copy_(from_vector<int64_t>({5, -6, 7}));
  EXPECT_EQ(i.dtype(), DType::kS32);
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{5, -6, 7}));
  Tensor f = zeros({2, 2});
  f.copy_(from_vector<int32_t>({1, -2, 3, -4}, {2, 2}).transpose(0, 1));
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1, 3, -2, -4}));
  // Float to integer truncates toward zero, as PyTorch's copy_ does, whatever the path taken
  // (same-size reorder or broadcasting loop).
  Tensor t = zeros({4}, DType::kS32);
  t.copy_(from_vector<float>({2.7f, -2.7f, 0.5f, 1.5f}));
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 0, 1}));
  Tensor tb = zeros({2, 2}, DType::kS32);
  tb.copy_(from_vector<float>({2.7f, -2.7f}));
  EXPECT_EQ(tb.to_vector<int32_t>(), (std::vector<int32_t>{2, -2, 2, -2}));
  EXPECT_EQ(from_vector<float>({2.7f, -2.7f}).to(DType::kS32).to_vector<int32_t>(), (std::vector<int32_t>{2, -2}));
  // Out-of-range values wrap through int64 like torch.tensor([300., -1.]).to(torch.uint8) == [44, 255].
  EXPECT_EQ(from_vector<float>({300.f, -1.f}).to(DType::kU8).to_vector<int>(), (std::vector<int>{44, 255}));
  // Into a channels-last destination, by logical index.
  Tensor cl = Tensor::empty({1, 2, 2, 2}, DType::kF32, MemoryFormat::kChannelsLast);
  cl.copy_(iota({1, 2, 2, 2}));
  EXPECT_EQ(cl.to_vector<float>(), iota({1, 2, 2, 2}).to_vector<float>());
}

TEST(TensorInPlace, CopiesKeepLargeInt64Exact) {
  // 2^53 + 1 has no double representation; copies must not pass through one.
  const int64_t big = (int64_t{1} << 53) + 1;
  const Tensor t = from_vector<int64_t>({big, -big, 3, 4}, {2, 2});
  EXPECT_EQ(t.transpose(0, 1).reshape({4}).to_vector<int64_t>(), (std::vector<int64_t>{big, 3, -big, 4}));
  EXPECT_EQ(t.transpose(0, 1).contiguous().at<int64_t>({0, 0}), big);
  Tensor dst = zeros({2, 2}, DType::kS64);
  dst.copy_(from_vector<int64_t>({big, 1}));
  EXPECT_EQ(dst.to_vector<int64_t>(), (std::vector<int64_t>{big, 1, big, 1}));
}

TEST(TensorInPlace, ToConvertsDtype) {
  const Tensor i = from_vector<int64_t>({3, -1});
  const Tensor f = i.to(DType::kF32);
  EXPECT_EQ(f.dtype(), DType::kF32);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{3, -1}));
  const Tensor same = f.to(DType::kF32);
  EXPECT_EQ(same.storage(), f.storage());  // no-op conversion shares storage
  EXPECT_EQ(f.to(DType::kS64).to_vector<int64_t>(), (std::vector<int64_t>{3, -1}));
}

// ---- caching allocator --------------------------------------------------------------------------

TEST(TensorAllocator, ReusesAFreedLargeBlock) {
  constexpr int64_t kFloats = 1 << 18;  // 1 MiB: above the caching threshold
  set_allocator_cache_limit(size_t{1} << 30);
  const AllocatorStats before = allocator_stats();
  {
    Tensor big = Tensor::empty({kFloats});
    const AllocatorStats live = allocator_stats();
    EXPECT_EQ(live.allocations, before.allocations + 1);
    EXPECT_GE(live.bytes_in_use, before.bytes_in_use + kFloats * 4);
  }
  const AllocatorStats freed = allocator_stats();
  EXPECT_GE(freed.bytes_cached, static_cast<uint64_t>(kFloats * 4));
  EXPECT_EQ(freed.bytes_in_use, before.bytes_in_use);
  {
    Tensor again = Tensor::empty({kFloats});
    const AllocatorStats after = allocator_stats();
    EXPECT_EQ(after.cache_hits, freed.cache_hits + 1);
    EXPECT_EQ(after.bytes_cached, freed.bytes_cached - kFloats * 4);
  }
  // Small tensors bypass the large cache (they have per-thread lists: below).
  const AllocatorStats s0 = allocator_stats();
  { Tensor small = Tensor::empty({16}); }
  { Tensor small = Tensor::empty({16}); }
  EXPECT_EQ(allocator_stats().cache_hits, s0.cache_hits);
  // Releasing empties the cache; a limit of 0 disables it.
  release_cached_memory();
  EXPECT_EQ(allocator_stats().bytes_cached, 0u);
  set_allocator_cache_limit(0);
  { Tensor big = Tensor::empty({kFloats}); }
  EXPECT_EQ(allocator_stats().bytes_cached, 0u);
  set_allocator_cache_limit(size_t{1} << 30);
}

TEST(TensorAllocator, ReusesASmallBlockOnTheSameThread) {
  set_allocator_cache_limit(size_t{1} << 30);
  const void* first = nullptr;
  { first = Tensor::empty({100}).raw_data<float>(); }  // 400 bytes: the 512-byte class
  const AllocatorStats before = allocator_stats();
  {
    const Tensor again = Tensor::empty({120});  // 480 bytes: the same class
    EXPECT_EQ(again.raw_data<float>(), first);
    const AllocatorStats after = allocator_stats();
    EXPECT_EQ(after.small_cache_hits, before.small_cache_hits + 1);
    EXPECT_EQ(after.allocations, before.allocations + 1);
    EXPECT_EQ(after.cache_hits, before.cache_hits);  // not the large cache
  }
  // Another class does not take it.
  const AllocatorStats s0 = allocator_stats();
  { const Tensor bigger = Tensor::empty({200}); }  // 800 bytes: the 1 KiB class, empty so far here
  EXPECT_EQ(allocator_stats().small_cache_hits, s0.small_cache_hits);
  // Blocks are 64-byte aligned in every class.
  for (int64_t n : {1, 16, 17, 1000, 16383}) {
    const Tensor t = Tensor::empty({n});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data<float>()) % 64, 0u) << n;
  }
}

// The caches keep freed blocks from malloc; they poison them, so AddressSanitizer still reports a
// read of a dead tensor's storage (the ASan pass of tools/run_tests.sh runs this).
TEST(TensorAllocator, AReadOfAFreedCachedBlockIsReportedUnderAsan) {
#if !defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer builds only";
#else
  set_allocator_cache_limit(size_t{1} << 30);
  for (const int64_t n : {int64_t{100}, int64_t{1} << 18}) {  // a small list's block, a large cache's
    EXPECT_DEATH(
        {
          const float* p = nullptr;
          {
            const Tensor t = Tensor::empty({n});
            p = t.raw_data<float>();
          }
          volatile float v = p[n / 2];
          (void)v;
        },
        "use-after-poison")
        << n;
  }
#endif
}

TEST(TensorAllocator, SmallBlockFreedOnAnotherThreadJoinsThatThreadsList) {
  set_allocator_cache_limit(size_t{1} << 30);
  Tensor made_here = Tensor::empty({3000});  // 12000 bytes: the 16 KiB class
  const void* p = made_here.raw_data<float>();
  const void* reused = nullptr;
  uint64_t hits_there = 0;
  std::thread([&] {
    made_here = Tensor();  // freed on this thread
    const uint64_t h0 = allocator_stats().small_cache_hits;
    const Tensor t = Tensor::empty({4000});  // 16000 bytes: the same class
    reused = t.raw_data<float>();
    hits_there = allocator_stats().small_cache_hits - h0;
  }).join();  // the thread's list is freed at its exit (ASan's leak check would report it otherwise)
  EXPECT_EQ(reused, p);
  EXPECT_EQ(hits_there, 1u);
}

TEST(TensorAllocator, ReleasingOrALimitOfZeroEmptiesSmallLists) {
  set_allocator_cache_limit(size_t{1} << 30);
  // Another thread's list is emptied at its next allocation.
  std::atomic<int> step{0};
  uint64_t hits_after_release = 1;
  std::thread other([&] {
    { const Tensor t = Tensor::empty({50}); }  // kept on this thread's list
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    const uint64_t h0 = allocator_stats().small_cache_hits;
    const Tensor t = Tensor::empty({50});
    hits_after_release = allocator_stats().small_cache_hits - h0;
  });
  while (step.load() != 1) std::this_thread::yield();
  release_cached_memory();
  step = 2;
  other.join();
  EXPECT_EQ(hits_after_release, 0u);
  // This thread's list is emptied at once; with a limit of 0 freed blocks are not kept.
  { const Tensor t = Tensor::empty({70}); }
  set_allocator_cache_limit(0);
  const uint64_t h0 = allocator_stats().small_cache_hits;
  { const Tensor t = Tensor::empty({70}); }
  { const Tensor t = Tensor::empty({70}); }
  EXPECT_EQ(allocator_stats().small_cache_hits, h0);
  set_allocator_cache_limit(size_t{1} << 30);
  { const Tensor t = Tensor::empty({70}); }
  { const Tensor t = Tensor::empty({70}); }
  EXPECT_EQ(allocator_stats().small_cache_hits, h0 + 1);
}

}  // namespace
}  // namespace dbrq
