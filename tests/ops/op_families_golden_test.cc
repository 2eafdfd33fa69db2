// Issue 12's op families (stack, squeeze / unsqueeze, expand, repeat, pad, prelu, softplus, mish,
// where, pow, sqrt, exp, max, argmax, topk, index_select, gather) against PyTorch 1.13 reference outputs in golden/ops.safetensors (the
// cases make_op_goldens.py's make_*_families append; parameters mirrored here next to each case). Each op also runs on channels-last
// and strided inputs, and on int8 codes where it passes them through.
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "tests/test_util.h"

namespace dbrq {
namespace {

constexpr double kTol = 1e-4;
constexpr const char* kGoldenPath = "tests/ops/golden/ops.safetensors";

const std::map<std::string, Tensor>& goldens() {
  static const auto* g = new std::map<std::string, Tensor>(testing::load_golden(kGoldenPath));
  return *g;
}

Tensor G(const std::string& name) { return testing::golden(goldens(), name); }

void close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  testing::expect_close(actual, expected, kTol, what);
}

// The same values in a view whose last dim has stride 2 (not dense).
Tensor strided(const Tensor& t) {
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes.back() *= 2;
  Tensor big = full(sizes, -777.0, t.dtype());
  Tensor view = big.slice(-1, 0, sizes.back(), 2);
  view.copy_(t);
  return view;
}

TEST(OpFamiliesGolden, Stack) {
  const Tensor a = G("stack.a"), b = G("stack.b"), c = G("stack.c");
  for (const auto& [name, dim] : std::vector<std::pair<std::string, int64_t>>{
           {"d0", 0}, {"d1", 1}, {"d3", 3}, {"dm1", -1}, {"dm4", -4}}) {
    close(stack({a, b, c}, dim), G("stack." + name), "stack " + name);
    close(stack({strided(a), b, strided(c)}, dim), G("stack." + name), "stack strided " + name);
  }
  std::vector<Tensor> list = {a, b, c};
  close(stack(list, 1), G("stack.d1"), "stack of a vector");
  const Tensor x4 = G("stack4.x");
  close(stack({x4, x4 * 2.0}, 2), G("stack4.out"), "stack 4-D");
  const Tensor cl = x4.contiguous(MemoryFormat::kChannelsLast);
  close(stack({cl, cl * 2.0}, 2), G("stack4.out"), "stack channels-last");
}

TEST(OpFamiliesGolden, SqueezeUnsqueeze) {
  const Tensor x = G("squeeze.x");
  close(x.squeeze(), G("squeeze.all"), "squeeze()");
  close(squeeze(x), G("squeeze.all"), "squeeze(x)");
  EXPECT_EQ(x.squeeze().sizes(), G("squeeze.all").sizes());
  close(squeeze(x, 2), G("squeeze.d2"), "squeeze(x, 2)");
  close(x.squeeze(1), G("squeeze.d1"), "squeeze(1) of a size-3 dim");
  close(unsqueeze(x, 0), G("unsqueeze.d0"), "unsqueeze(x, 0)");
  close(x.unsqueeze(-1), G("unsqueeze.dm1"), "unsqueeze(-1)");
  close(strided(x).squeeze(), G("squeeze.all"), "squeeze() strided");
  // A tensor of only size-1 dims squeezes to 0-D.
  const Tensor one = full({1, 1, 1}, 2.5);
  EXPECT_EQ(one.squeeze().dim(), 0);
  EXPECT_EQ(one.squeeze().item<float>(), 2.5f);
}

TEST(OpFamiliesGolden, Expand) {
  const Tensor x = G("expand.x");
  const Tensor e = x.expand({3, 5, 4});
  close(e, G("expand.same"), "expand");
  EXPECT_EQ(e.stride(1), 0) << "expand is a view";
  EXPECT_EQ(e.storage(), x.storage());
  close(expand(x, {2, 3, 5, -1}), G("expand.lead"), "expand with a leading dim");
  // Elementwise kernels and contiguous() read the stride-0 dims.
  close(relu(x.expand({2, 3, 5, 4})), G("expand.relu"), "relu of an expanded view");
  close(x.expand({2, 3, 5, 4}).contiguous(), G("expand.lead").expand({2, 3, 5, 4}).contiguous(), "contiguous");
  close(strided(x).expand({3, 5, 4}), G("expand.same"), "expand strided");
}

TEST(OpFamiliesGolden, Repeat) {
  const Tensor x = G("repeat.x");
  close(x.repeat({2, 1, 3}), G("repeat.same"), "repeat");
  close(repeat(x, {2, 1, 2, 1}), G("repeat.lead"), "repeat with a leading dim");
  const Tensor z = x.repeat({1, 0, 1});
  EXPECT_EQ(z.sizes(), G("repeat.zero").sizes());
  EXPECT_EQ(z.numel(), 0);
  close(strided(x).repeat({2, 1, 3}), G("repeat.same"), "repeat strided");
  close(x.transpose(0, 2).contiguous().transpose(0, 2).repeat({2, 1, 3}), G("repeat.same"), "repeat col-major");
}

TEST(OpFamiliesGolden, Pad) {
  const Tensor x = G("pad.x");
  struct Case {
    const char* name;
    std::vector<int64_t> pads;
    PadMode mode;
    double value;
  };
  const Case cases[] = {
      {"const_last", {1, 2}, PadMode::kConstant, 0.0},
      {"const_2d", {1, 2, 3, 0}, PadMode::kConstant, 0.75},
      {"const_4d", {1, 0, 0, 1, 2, 1, 1, 1}, PadMode::kConstant, -1.5},
      {"const_neg", {-1, 2, 1, -2}, PadMode::kConstant, 0.0},
      {"reflect_2d", {2, 1, 3, 4}, PadMode::kReflect, 0.0},
      {"replicate_2d", {2, 1, 3, 4}, PadMode::kReplicate, 0.0},
  };
  for (const Case& c : cases) {
    const Tensor want = G(std::string("pad.") + c.name);
    close(pad(x, c.pads, c.mode, c.value), want, c.name);
    close(pad(strided(x), c.pads, c.mode, c.value), want, std::string(c.name) + " strided");
    const Tensor y = pad(x.contiguous(MemoryFormat::kChannelsLast), c.pads, c.mode, c.value);
    close(y, want, std::string(c.name) + " channels-last");
    EXPECT_TRUE(y.is_channels_last()) << c.name << ": a channels-last activation stays channels-last";
  }
  close(pad(x, {2, 1, 3, 4}, "reflect"), G("pad.reflect_2d"), "mode by name");
  close(pad(x, {1, 2, 3, 0}, "constant", 0.75), G("pad.const_2d"), "constant by name");
  const Tensor x3 = G("pad.x3");
  close(pad(x3, {3, 2}, PadMode::kReflect), G("pad.reflect_1d"), "reflect 1-d");
  close(pad(x3, {0, 5}, "replicate"), G("pad.replicate_1d"), "replicate 1-d");
  const Tensor x5 = G("pad.x5");
  close(pad(x5, {1, 2, 2, 1, 1, 1}, PadMode::kReflect), G("pad.reflect_3d"), "reflect 3-d");
  close(pad(x5, {1, 2, 2, 1, 1, 1}, PadMode::kReplicate), G("pad.replicate_3d"), "replicate 3-d");
}

// int8 codes pass through stack / expand / repeat / pad with their parameters; a constant pad
// fills with the code of its value (0.55 / 0.1 + 100 = 105.5 rounds half to even: 106).
TEST(OpFamiliesGolden, QuantizedPassThrough) {
  const auto qp = QuantParams::per_tensor(0.1f, 100);
  const Tensor q = quantize_per_tensor(G("pad.x"), 0.1f, 100, DType::kU8);
  const Tensor y = pad(q, {1, 1}, PadMode::kConstant, 0.55);
  ASSERT_TRUE(y.is_quantized());
  EXPECT_EQ(*y.qparams(), *qp);
  EXPECT_EQ(y.int_repr().at<uint8_t>({0, 0, 0, 0}), 106);
  EXPECT_EQ(y.int_repr().at<uint8_t>({1, 2, 4, 7}), 106);
  EXPECT_EQ(y.int_repr().at<uint8_t>({0, 1, 2, 3}), q.int_repr().at<uint8_t>({0, 1, 2, 2}));
  EXPECT_EQ(pad(q, {1, 1}).int_repr().at<uint8_t>({0, 0, 0, 0}), 100) << "a zero fill is the zero point";
  testing::expect_equal(dequantize(pad(q, {2, 1, 3, 4}, PadMode::kReflect)), pad(dequantize(q), {2, 1, 3, 4}, PadMode::kReflect),
                        "reflect on codes");
  testing::expect_equal(dequantize(q.repeat({1, 2, 1, 1})), dequantize(q).repeat({1, 2, 1, 1}), "repeat on codes");
  testing::expect_equal(dequantize(q.narrow(3, 0, 1).expand({2, 3, 5, 4})),
                        dequantize(q).narrow(3, 0, 1).expand({2, 3, 5, 4}), "expand on codes");
  const Tensor s = stack({q, q}, 1);
  ASSERT_TRUE(s.is_quantized());
  testing::expect_equal(dequantize(s), stack({dequantize(q), dequantize(q)}, 1), "stack on codes");
}

TEST(OpFamiliesGolden, Prelu) {
  const Tensor x = G("act12.x"), w3 = G("prelu.w3");
  close(prelu(x, w3), G("prelu.per_channel"), "prelu per channel");
  close(prelu(x.contiguous(MemoryFormat::kChannelsLast), w3), G("prelu.per_channel"), "prelu channels-last");
  close(prelu(strided(x), w3), G("prelu.per_channel"), "prelu strided");
  // Dense but permuted memory (channels neither outermost-after-batch nor innermost): the kernel
  // found each element's channel as if the memory were row-major (wrong slopes, no error).
  close(prelu(x.transpose(1, 2).contiguous().transpose(1, 2), w3), G("prelu.per_channel"), "prelu permuted");
  close(prelu(G("prelu.x2").transpose(0, 1).contiguous().transpose(0, 1), w3), G("prelu.out2"), "prelu 2-D transposed");
  close(prelu(x, from_vector<float>({0.1f})), G("prelu.one"), "prelu one weight");
  close(prelu(G("prelu.x2"), w3), G("prelu.out2"), "prelu 2-D");
  nn::PReLUImpl layer(3);
  EXPECT_EQ(layer.weight.to_vector<float>(), std::vector<float>(3, 0.25f)) << "init 0.25";
  layer.weight.copy_(w3);
  close(layer(x), G("prelu.per_channel"), "PReLU layer");
  EXPECT_EQ(layer.to_string(), "PReLU(num_parameters=3)");
  EXPECT_EQ(nn::PReLUImpl().num_parameters(), 1);
}

TEST(OpFamiliesGolden, SoftplusMish) {
  const Tensor x = G("act12.x"), t = G("act12.tails");
  close(softplus(x), G("softplus.default"), "softplus");
  close(softplus(x, 2.0, 5.0), G("softplus.beta2"), "softplus beta 2 threshold 5");
  close(softplus(x, 0.5, 1.0), G("softplus.beta_half"), "softplus beta 0.5 threshold 1");
  close(softplus(x.contiguous(MemoryFormat::kChannelsLast)), G("softplus.default"), "softplus channels-last");
  close(softplus(t), G("softplus.tails"), "softplus tails");
  close(mish(x), G("mish.out"), "mish");
  close(mish(strided(x)), G("mish.out"), "mish strided");
  close(mish(t), G("mish.tails"), "mish tails");
  nn::SoftplusImpl sp(2.0, 5.0);
  close(sp(x), G("softplus.beta2"), "Softplus layer");
  EXPECT_EQ(sp.to_string(), "Softplus(beta=2, threshold=5)");
  nn::MishImpl m;
  close(m(x), G("mish.out"), "Mish layer");
  EXPECT_EQ(m.to_string(), "Mish()");
}

TEST(OpFamiliesGolden, Where) {
  const Tensor a = G("where.a"), b = G("where.b"), mask = G("where.mask");
  ASSERT_EQ(mask.dtype(), DType::kU8);
  close(where(mask, a, b), G("where.out"), "where broadcast");
  close(a.where(mask, b), G("where.out"), "Tensor::where");
  close(where(mask, strided(a), b), G("where.out"), "where strided");
  close(where(mask.to(DType::kF32), a, b), G("where.out"), "where with an f32 mask");
  close(where(mask, a, -2.5), G("where.scalar_other"), "where scalar other");
  close(where(mask, 0.75, a), G("where.scalar_input"), "where scalar input");
}

TEST(OpFamiliesGolden, PowSqrtExp) {
  const Tensor x = G("pow.x"), e = G("pow.e"), s = G("pow.signed");
  close(pow(x, 2.0), G("pow.sq"), "pow 2");
  close(x.pow(0.5), G("pow.half"), "pow 0.5");
  close(pow(x, -1.5), G("pow.neg"), "pow -1.5");
  close(pow(x, e), G("pow.tensor"), "pow tensor");
  close(x.pow(e), G("pow.tensor"), "Tensor::pow tensor");
  close(pow(strided(x), e), G("pow.tensor"), "pow strided");
  close(pow(2.0, e), G("pow.base"), "scalar ^ tensor");
  close(pow(s, 3.0), G("pow.signed_cube"), "pow of negatives, integral exponent");
  close(sqrt(x), G("sqrt.out"), "sqrt");
  close(x.sqrt(), G("sqrt.out"), "Tensor::sqrt");
  close(exp(G("exp.x")), G("exp.out"), "exp");
  close(strided(G("exp.x")).exp(), G("exp.out"), "exp strided");
  EXPECT_TRUE(std::isnan(sqrt(from_vector<float>({-1.f})).item<float>())) << "sqrt of a negative is NaN, as PyTorch";
}

TEST(OpFamiliesGolden, MaxArgmaxTopk) {
  const Tensor x = G("idx.x");
  for (const auto& [name, dim, keep] : std::vector<std::tuple<std::string, int64_t, bool>>{{"d1", 1, false}, {"dm1k", -1, true}}) {
    const auto [v, i] = max(x, dim, keep);
    close(v, G("max." + name + ".values"), "max values " + name);
    ASSERT_EQ(i.dtype(), DType::kS64);
    testing::expect_equal(i, G("max." + name + ".indices"), "max indices " + name);
    testing::expect_equal(std::get<1>(strided(x).max(dim, keep)), G("max." + name + ".indices"), "max strided " + name);
  }
  testing::expect_equal(argmax(x, 0), G("argmax.d0"), "argmax 0");
  testing::expect_equal(x.argmax(2, true), G("argmax.d2k"), "argmax 2 keepdim");
  {
    const auto [v, i] = topk(x, 3, 1);
    close(v, G("topk.k3d1.values"), "topk values");
    testing::expect_equal(i, G("topk.k3d1.indices"), "topk indices");
  }
  {
    const auto [v, i] = x.topk(2, -1, /*largest=*/false);
    close(v, G("topk.k2small.values"), "topk smallest values");
    testing::expect_equal(i, G("topk.k2small.indices"), "topk smallest indices");
  }
  // NaN is the largest, as in PyTorch.
  const Tensor nan = from_vector<float>({1.f, std::nanf(""), 3.f});
  EXPECT_EQ(argmax(nan, 0).item<int64_t>(), 1);
}

TEST(OpFamiliesGolden, IndexSelectGather) {
  const Tensor x = G("idx.x"), sel = G("index_select.index");
  ASSERT_EQ(sel.dtype(), DType::kS64);
  close(index_select(x, 1, sel), G("index_select.d1"), "index_select 1");
  close(strided(x).index_select(1, sel), G("index_select.d1"), "index_select strided");
  close(index_select(x, 2, from_vector<int64_t>({3, 1})), G("index_select.d2"), "index_select 2");
  close(index_select(x, 2, from_vector<int32_t>({3, 1})), G("index_select.d2"), "index_select s32 index");
  close(gather(x, 1, G("gather.index")), G("gather.d1"), "gather 1");
  close(x.gather(0, G("gather.index0")), G("gather.d0"), "gather 0");
  close(gather(strided(x), 1, G("gather.index")), G("gather.d1"), "gather strided");
  // Codes and parameters pass through on a quantized input.
  const Tensor q = quantize_per_tensor(x, 0.05f, 128, DType::kU8);
  const Tensor qs = index_select(q, 1, sel);
  ASSERT_TRUE(qs.is_quantized());
  testing::expect_equal(dequantize(qs), index_select(dequantize(q), 1, sel), "index_select on codes");
  testing::expect_equal(dequantize(gather(q, 1, G("gather.index"))), gather(dequantize(q), 1, G("gather.index")),
                        "gather on codes");
}

}  // namespace
}  // namespace dbrq
