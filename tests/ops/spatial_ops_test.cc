// The spatial ops of issue 12 (conv_transpose2d, ...): fp32 against PyTorch 1.13 goldens
// (golden/ops.safetensors, cases appended by make_op_goldens.py; parameters below mirror the
// script's tables), their layers, and every bad argument with its error type and message.
#include <string>

#include "tests/test_util.h"

namespace dbrq {
namespace {

constexpr double kTol = 1e-4;

const std::map<std::string, Tensor>& goldens() {
  static const auto* g = new std::map<std::string, Tensor>(testing::load_golden("tests/ops/golden/ops.safetensors"));
  return *g;
}
Tensor G(const std::string& name) { return testing::golden(goldens(), name); }
Tensor maybe(const std::string& name) { return goldens().count(name) > 0 ? G(name) : Tensor(); }
Tensor f32(std::initializer_list<int64_t> sizes) { return zeros(sizes); }

// ---- conv_transpose2d ---------------------------------------------------------------------------

struct ConvTCase {
  const char* name;
  ConvTranspose2dParams p;  // stride, padding, output_padding, dilation, groups
};

const ConvTCase kConvTCases[] = {
    {"convt_basic", {{1, 1}, {0, 0}, {0, 0}, {1, 1}, 1}},
    {"convt_s2_p1_op1", {{2, 2}, {1, 1}, {1, 1}, {1, 1}, 1}},
    {"convt_s2_p0_op1", {{2, 2}, {0, 0}, {1, 1}, {1, 1}, 1}},
    {"convt_dcgan_k4_s2_p1", {{2, 2}, {1, 1}, {0, 0}, {1, 1}, 1}},
    {"convt_groups2", {{1, 1}, {1, 1}, {0, 0}, {1, 1}, 2}},
    {"convt_dilation2", {{1, 1}, {1, 1}, {0, 0}, {2, 2}, 1}},
    {"convt_asymmetric", {{2, 1}, {1, 0}, {1, 0}, {1, 2}, 1}},
};

TEST(SpatialOpsGolden, ConvTranspose2d) {
  for (const ConvTCase& c : kConvTCases) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor x = G(n + ".x"), w = G(n + ".w"), b = maybe(n + ".b"), want = G(n + ".out");
    EXPECT_EQ(b.defined(), n != "convt_dcgan_k4_s2_p1");
    const Tensor y = conv_transpose2d(x, w, b, c.p);
    EXPECT_EQ(y.sizes(), want.sizes());
    testing::expect_close(y, want, kTol, n + " contiguous");
    EXPECT_TRUE(y.is_channels_last()) << "4-D conv outputs are channels-last, as conv2d's";
    testing::expect_close(conv_transpose2d(x.contiguous(MemoryFormat::kChannelsLast), w, b, c.p), want, kTol,
                          n + " channels-last input");
    testing::expect_close(conv_transpose2d(x, w.contiguous(MemoryFormat::kChannelsLast), b, c.p), want, kTol,
                          n + " channels-last weight");
  }
}

TEST(SpatialOpsGolden, ConvTranspose2dLayerMatchesFunctional) {
  const ConvTCase& c = kConvTCases[1];  // stride 2, padding 1, output_padding 1
  auto layer = std::make_shared<nn::ConvTranspose2d>(
      nn::ConvTranspose2dOptions(4, 3, 3).stride(2).padding(1).output_padding(1));
  EXPECT_EQ(layer->weight.sizes(), G("convt_s2_p1_op1.w").sizes());
  EXPECT_EQ(layer->bias.sizes(), G("convt_s2_p1_op1.b").sizes());
  layer->weight.copy_(G("convt_s2_p1_op1.w"));
  layer->bias.copy_(G("convt_s2_p1_op1.b"));
  EXPECT_EQ(layer->params(), c.p);
  testing::expect_close((*layer)(G("convt_s2_p1_op1.x")), G("convt_s2_p1_op1.out"), kTol, "layer");
  // PyTorch's names, so state dicts load unchanged.
  std::vector<std::string> names;
  for (const auto& [name, t] : layer->named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
}

TEST(SpatialOpsGolden, ConvTranspose2dLayerInitAndPrinting) {
  manual_seed(7);
  nn::ConvTranspose2d a(nn::ConvTranspose2dOptions(8, 4, 4).stride(2).padding(1).bias(false));
  EXPECT_EQ(a.weight.sizes(), (DimVector{8, 4, 4, 4}));
  EXPECT_FALSE(a.bias.defined());
  // PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = (out/groups) * kH * kW = 64.
  const std::vector<float> v = a.weight.to_vector<float>();
  float lo = 1, hi = -1;
  for (float e : v) lo = std::min(lo, e), hi = std::max(hi, e);
  EXPECT_GE(lo, -0.125f);
  EXPECT_LE(hi, 0.125f);
  EXPECT_LT(lo, -0.1f);
  EXPECT_GT(hi, 0.1f);
  EXPECT_EQ(a.extra_repr(), "8, 4, kernel_size=(4, 4), stride=(2, 2), padding=(1, 1), bias=False");
  nn::ConvTranspose2d b(
      nn::ConvTranspose2dOptions(4, 6, {3, 2}).stride({2, 1}).output_padding({1, 0}).dilation(2).groups(2));
  EXPECT_EQ(b.weight.sizes(), (DimVector{4, 3, 3, 2}));
  EXPECT_EQ(b.bias.sizes(), (DimVector{6}));
  EXPECT_EQ(b.extra_repr(),
            "4, 6, kernel_size=(3, 2), stride=(2, 1), output_padding=(1, 0), dilation=(2, 2), groups=2");
  EXPECT_NE(b.to_string().find("ConvTranspose2d(4, 6, kernel_size=(3, 2)"), std::string::npos) << b.to_string();
}

TEST(SpatialOpErrors, ConvTranspose2dShapes) {
  const Tensor x = f32({1, 4, 5, 5}), w = f32({4, 3, 3, 3});
  EXPECT_THROW_MSG(conv_transpose2d(Tensor(), w), ValueError, "conv_transpose2d: input is an undefined tensor");
  EXPECT_THROW_MSG(conv_transpose2d(x, Tensor()), ValueError, "conv_transpose2d: weight is an undefined tensor");
  EXPECT_THROW_MSG(conv_transpose2d(f32({4, 5, 5}), w), ShapeError,
                   "conv_transpose2d: input must be 4-D (N, C, H, W), got sizes [4, 5, 5]");
  EXPECT_THROW_MSG(conv_transpose2d(x, f32({4, 3, 3})), ShapeError,
                   "conv_transpose2d: weight must be 4-D (in_channels, out_channels/groups, kH, kW), got sizes [4, 3, 3]");
  EXPECT_THROW_MSG(conv_transpose2d(x, f32({3, 4, 3, 3})), ShapeError,
                   "conv_transpose2d: input has 4 channels but the weight expects 3");
  EXPECT_THROW_MSG(conv_transpose2d(x, w, f32({4})), ShapeError, "conv_transpose2d: bias must have sizes [3], got [4]");
  ConvTranspose2dParams p;
  p.groups = 3;
  EXPECT_THROW_MSG(conv_transpose2d(f32({1, 4, 5, 5}), w, Tensor(), p), ShapeError,
                   "conv_transpose2d: in_channels (4) must be divisible by groups (3)");
  p = {};
  p.padding = {3, 3};  // (1 - 1) * 1 - 6 + 2 + 1 < 1
  EXPECT_THROW_MSG(conv_transpose2d(f32({1, 4, 1, 1}), w, Tensor(), p), ShapeError,
                   "conv_transpose2d: output size -3x-3 is too small");
}

TEST(SpatialOpErrors, ConvTranspose2dParamsAndDtypes) {
  const Tensor x = f32({1, 4, 5, 5}), w = f32({4, 3, 3, 3});
  ConvTranspose2dParams p;
  p.groups = 0;
  EXPECT_THROW_MSG(conv_transpose2d(x, w, Tensor(), p), ValueError, "conv_transpose2d: groups must be >= 1, got 0");
  p = {};
  p.stride = {0, 1};
  EXPECT_THROW_MSG(conv_transpose2d(x, w, Tensor(), p), ValueError, "conv_transpose2d: stride must be >= 1, got (0, 1)");
  p = {};
  p.padding = {0, -1};
  EXPECT_THROW_MSG(conv_transpose2d(x, w, Tensor(), p), ValueError, "conv_transpose2d: padding must be >= 0, got (0, -1)");
  p = {};
  p.dilation = {0, 1};
  EXPECT_THROW_MSG(conv_transpose2d(x, w, Tensor(), p), ValueError, "conv_transpose2d: dilation must be >= 1, got (0, 1)");
  p = {};
  p.stride = {2, 2};
  p.output_padding = {2, 0};
  EXPECT_THROW_MSG(conv_transpose2d(x, w, Tensor(), p), ValueError,
                   "conv_transpose2d: output_padding must be >= 0 and smaller than either stride or dilation, got "
                   "output_padding (2, 0), stride (2, 2), dilation (1, 1)");
  p.output_padding = {-1, 0};
  EXPECT_THROW_MSG(conv_transpose2d(x, w, Tensor(), p), ValueError, "output_padding must be >= 0");
  EXPECT_THROW_MSG(conv_transpose2d(zeros({1, 4, 5, 5}, DType::kU8), w), DTypeError,
                   "conv_transpose2d: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(conv_transpose2d(x, zeros({4, 3, 3, 3}, DType::kU8)), DTypeError,
                   "conv_transpose2d: weight must have dtype f32, got u8");
  EXPECT_THROW_MSG(conv_transpose2d(x, w, zeros({3}, DType::kU8)), DTypeError,
                   "conv_transpose2d: bias must have dtype f32, got u8");
  // The arguments stay usable after an error.
  EXPECT_EQ(conv_transpose2d(x, w).sizes(), (DimVector{1, 3, 7, 7}));
}

TEST(SpatialOpErrors, ConvTranspose2dLayerOptions) {
  EXPECT_THROW_MSG(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(0, 4, 3)), ValueError,
                   "ConvTranspose2d: in_channels and out_channels must be >= 1, got 0 and 4");
  EXPECT_THROW_MSG(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4, 6, 3).groups(4)), ValueError,
                   "ConvTranspose2d: in_channels (4) and out_channels (6) must be divisible by groups (4)");
  EXPECT_THROW_MSG(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4, 6, 0)), ValueError,
                   "ConvTranspose2d: kernel_size must be >= 1, got (0, 0)");
  EXPECT_THROW_MSG(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4, 6, 3).stride(0)), ValueError,
                   "ConvTranspose2d: stride and dilation must be >= 1 and padding >= 0, got stride (0, 0)");
  EXPECT_THROW_MSG(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4, 6, 3).stride(2).output_padding(2)), ValueError,
                   "ConvTranspose2d: output_padding must be >= 0 and smaller than either stride or dilation, got "
                   "output_padding (2, 2), stride (2, 2), dilation (1, 1)");
  nn::ConvTranspose2d ok(nn::ConvTranspose2dOptions(4, 6, 3));
  EXPECT_THROW_MSG(ok(f32({1, 3, 5, 5})), ShapeError, "conv_transpose2d: input has 3 channels but the weight expects 4");
}

}  // namespace
}  // namespace dbrq
