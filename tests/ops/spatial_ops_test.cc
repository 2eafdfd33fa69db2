// The spatial ops of issue 12 (conv_transpose2d, ...): fp32 against PyTorch 1.13 goldens
// (golden/ops.safetensors, cases appended by make_op_goldens.py; parameters below mirror the
// script's tables), their layers, and every bad argument with its error type and message.
#include <optional>
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
  auto layer = std::make_shared<nn::ConvTranspose2dImpl>(
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
  nn::ConvTranspose2dImpl a(nn::ConvTranspose2dOptions(8, 4, 4).stride(2).padding(1).bias(false));
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
  nn::ConvTranspose2dImpl b(
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
  EXPECT_THROW_MSG(nn::ConvTranspose2dImpl(nn::ConvTranspose2dOptions(0, 4, 3)), ValueError,
                   "ConvTranspose2d: in_channels and out_channels must be >= 1, got 0 and 4");
  EXPECT_THROW_MSG(nn::ConvTranspose2dImpl(nn::ConvTranspose2dOptions(4, 6, 3).groups(4)), ValueError,
                   "ConvTranspose2d: in_channels (4) and out_channels (6) must be divisible by groups (4)");
  EXPECT_THROW_MSG(nn::ConvTranspose2dImpl(nn::ConvTranspose2dOptions(4, 6, 0)), ValueError,
                   "ConvTranspose2d: kernel_size must be >= 1, got (0, 0)");
  EXPECT_THROW_MSG(nn::ConvTranspose2dImpl(nn::ConvTranspose2dOptions(4, 6, 3).stride(0)), ValueError,
                   "ConvTranspose2d: stride and dilation must be >= 1 and padding >= 0, got stride (0, 0)");
  EXPECT_THROW_MSG(nn::ConvTranspose2dImpl(nn::ConvTranspose2dOptions(4, 6, 3).stride(2).output_padding(2)), ValueError,
                   "ConvTranspose2d: output_padding must be >= 0 and smaller than either stride or dilation, got "
                   "output_padding (2, 2), stride (2, 2), dilation (1, 1)");
  nn::ConvTranspose2dImpl ok(nn::ConvTranspose2dOptions(4, 6, 3));
  EXPECT_THROW_MSG(ok(f32({1, 3, 5, 5})), ShapeError, "conv_transpose2d: input has 3 channels but the weight expects 4");
}

// ---- conv1d and 1-D pooling ----------------------------------------------------------------------

struct Conv1dCase {
  const char* name;
  Conv1dParams p;  // stride, padding, dilation, groups
};

const Conv1dCase kConv1dCases[] = {
    {"c1d_basic", {1, 1, 1, 1}},
    {"c1d_s2_d2", {2, 2, 2, 1}},
    {"c1d_groups2", {1, 0, 1, 2}},
    {"c1d_depthwise_nobias", {1, 2, 1, 4}},
};

// The same values with strides (L*C, 1, C): the layout conv1d outputs have.
Tensor channels_last_1d(const Tensor& t) { return t.permute({0, 2, 1}).contiguous().permute({0, 2, 1}); }

TEST(SpatialOpsGolden, Conv1d) {
  for (const Conv1dCase& c : kConv1dCases) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor x = G(n + ".x"), w = G(n + ".w"), b = maybe(n + ".b"), want = G(n + ".out");
    EXPECT_EQ(b.defined(), n != "c1d_depthwise_nobias");
    const Tensor y = conv1d(x, w, b, c.p);
    EXPECT_EQ(y.sizes(), want.sizes());
    testing::expect_close(y, want, kTol, n);
    const Tensor xl = channels_last_1d(x);
    EXPECT_FALSE(xl.is_contiguous());
    testing::expect_close(conv1d(xl, w, b, c.p), want, kTol, n + " channels-last input");
    // Its output feeds the next conv1d and every other op with its logical meaning.
    testing::expect_close(y.contiguous(), want, kTol, n + " contiguous()");
    testing::expect_close(y.reshape({-1}), want.reshape({-1}), kTol, n + " reshape");
  }
}

TEST(SpatialOpsGolden, Conv1dLayer) {
  nn::Conv1dImpl layer(nn::Conv1dOptions(4, 5, 3).stride(2).padding(2).dilation(2));
  EXPECT_EQ(layer.weight.sizes(), (DimVector{5, 4, 3}));
  layer.weight.copy_(G("c1d_s2_d2.w"));
  layer.bias.copy_(G("c1d_s2_d2.b"));
  testing::expect_close(layer(G("c1d_s2_d2.x")), G("c1d_s2_d2.out"), kTol, "layer");
  EXPECT_EQ(layer.extra_repr(), "4, 5, kernel_size=(3,), stride=(2,), padding=(2,), dilation=(2,)");
  nn::Conv1dImpl dw(nn::Conv1dOptions(4, 8, 5).groups(4).bias(false));
  EXPECT_EQ(dw.weight.sizes(), (DimVector{8, 1, 5}));
  EXPECT_EQ(dw.extra_repr(), "4, 8, kernel_size=(5,), stride=(1,), groups=4, bias=False");
  // PyTorch's init bound 1/sqrt(fan_in), fan_in = in/groups * kL = 5.
  for (float v : dw.weight.to_vector<float>()) EXPECT_LE(std::abs(v), 1.0 / std::sqrt(5.0));
}

TEST(SpatialOpsGolden, Pool1d) {
  struct Max {
    const char* name;
    int64_t k, s, p, d;
    bool ceil;
  };
  for (const Max& c : {Max{"mp1d_k3_s2_p1", 3, 2, 1, 1, false}, Max{"mp1d_ceil_dil2", 3, 2, 0, 2, true}}) {
    const std::string n = c.name;
    const Tensor want = G(n + ".out");
    testing::expect_close(max_pool1d(G(n + ".x"), c.k, c.s, c.p, c.d, c.ceil), want, kTol, n);
    nn::MaxPool1dImpl layer(c.k, c.s, c.p, c.d, c.ceil);
    testing::expect_close(layer(G(n + ".x")), want, kTol, n + " layer");
  }
  struct Avg {
    const char* name;
    int64_t k, s, p;
    bool ceil, count;
  };
  for (const Avg& c : {Avg{"ap1d_k3_s2_p1", 3, 2, 1, false, true}, Avg{"ap1d_ceil_nocount", 4, 3, 2, true, false}}) {
    const std::string n = c.name;
    const Tensor want = G(n + ".out");
    testing::expect_close(avg_pool1d(G(n + ".x"), c.k, c.s, c.p, c.ceil, c.count), want, kTol, n);
    nn::AvgPool1dImpl layer(c.k, c.s, c.p, c.ceil, c.count);
    testing::expect_close(layer(G(n + ".x")), want, kTol, n + " layer");
  }
  testing::expect_close(adaptive_avg_pool1d(G("aap1d_4.x"), 4), G("aap1d_4.out"), kTol, "aap1d_4");
  testing::expect_close(nn::AdaptiveAvgPool1dImpl(3)(G("aap1d_3_from_11.x")), G("aap1d_3_from_11.out"), kTol,
                        "aap1d_3_from_11");
  // Default stride = kernel size.
  const Tensor x = G("mp1d_k3_s2_p1.x");
  EXPECT_EQ(max_pool1d(x, 3).sizes(), (DimVector{2, 3, 3}));
  EXPECT_EQ(nn::MaxPool1dImpl(3).extra_repr(), "kernel_size=3, stride=3, padding=0, dilation=1, ceil_mode=False");
  EXPECT_EQ(nn::AvgPool1dImpl(4, 2, 1).extra_repr(), "kernel_size=(4,), stride=(2,), padding=(1,)");
  EXPECT_EQ(nn::AdaptiveAvgPool1dImpl(7).extra_repr(), "output_size=7");
}

TEST(SpatialOpErrors, Conv1d) {
  const Tensor x = f32({1, 4, 10}), w = f32({6, 4, 3});
  EXPECT_THROW_MSG(conv1d(Tensor(), w), ValueError, "conv1d: input is an undefined tensor");
  EXPECT_THROW_MSG(conv1d(f32({1, 4, 10, 1}), w), ShapeError, "conv1d: input must be 3-D (N, C, L), got sizes [1, 4, 10, 1]");
  EXPECT_THROW_MSG(conv1d(x, f32({6, 4})), ShapeError, "conv1d: weight must be 3-D (out_channels, in_channels/groups, kL)");
  EXPECT_THROW_MSG(conv1d(x, f32({6, 3, 3})), ShapeError,
                   "conv1d: input has 4 channels but the weight expects in_channels/groups * groups = 3 * 1 = 3");
  EXPECT_THROW_MSG(conv1d(x, w, f32({5})), ShapeError, "conv1d: bias must have sizes [6], got [5]");
  EXPECT_THROW_MSG(conv1d(f32({1, 4, 1}), w), ShapeError,
                   "conv1d: padded input length 1 is smaller than the dilated kernel 3");
  Conv1dParams p;
  p.stride = 0;
  EXPECT_THROW_MSG(conv1d(x, w, Tensor(), p), ValueError, "conv1d: stride must be >= 1, got 0");
  p = {};
  p.padding = -1;
  EXPECT_THROW_MSG(conv1d(x, w, Tensor(), p), ValueError, "conv1d: padding must be >= 0, got -1");
  p = {};
  p.dilation = 0;
  EXPECT_THROW_MSG(conv1d(x, w, Tensor(), p), ValueError, "conv1d: dilation must be >= 1, got 0");
  p = {};
  p.groups = 0;
  EXPECT_THROW_MSG(conv1d(x, w, Tensor(), p), ValueError, "conv1d: groups must be >= 1, got 0");
  p.groups = 4;
  EXPECT_THROW_MSG(conv1d(x, f32({6, 1, 3}), Tensor(), p), ShapeError,
                   "conv1d: out_channels (6) must be divisible by groups (4)");
  EXPECT_THROW_MSG(conv1d(zeros({1, 4, 10}, DType::kU8), w), DTypeError, "conv1d: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(nn::Conv1dImpl(nn::Conv1dOptions(4, 6, 3).groups(4)), ValueError,
                   "Conv1d: in_channels (4) and out_channels (6) must be divisible by groups (4)");
  EXPECT_THROW_MSG(nn::Conv1dImpl(nn::Conv1dOptions(0, 6, 3)), ValueError,
                   "Conv1d: in_channels and out_channels must be >= 1, got 0 and 6");
  EXPECT_THROW_MSG(nn::Conv1dImpl(nn::Conv1dOptions(4, 6, 0)), ValueError, "Conv1d: kernel_size must be >= 1, got 0");
  EXPECT_THROW_MSG(nn::Conv1dImpl(nn::Conv1dOptions(4, 6, 3).stride(0)), ValueError,
                   "Conv1d: stride and dilation must be >= 1 and padding >= 0, got stride 0");
  EXPECT_EQ(conv1d(x, w).sizes(), (DimVector{1, 6, 8}));  // still usable
}

TEST(SpatialOpErrors, Pool1d) {
  const Tensor x = f32({1, 3, 8});
  EXPECT_THROW_MSG(max_pool1d(f32({1, 3, 8, 8}), 2), ShapeError, "max_pool1d: input must be 3-D (N, C, L), got sizes [1, 3, 8, 8]");
  EXPECT_THROW_MSG(max_pool1d(Tensor(), 2), ValueError, "max_pool1d: input is an undefined tensor");
  EXPECT_THROW_MSG(max_pool1d(x, 0), ValueError, "max_pool1d: kernel_size must be >= 1, got 0");
  EXPECT_THROW_MSG(max_pool1d(x, 2, 0), ValueError, "max_pool1d: stride must be >= 1, got 0");
  EXPECT_THROW_MSG(max_pool1d(x, 2, 1, 0, 0), ValueError, "max_pool1d: dilation must be >= 1, got 0");
  EXPECT_THROW_MSG(max_pool1d(x, 2, 1, 2), ValueError,
                   "max_pool1d: padding must be >= 0 and at most half the kernel size, got padding 2 for kernel_size 2");
  EXPECT_THROW_MSG(max_pool1d(f32({1, 3, 2}), 3), ShapeError, "max_pool1d: padded input length 2 is smaller than the (dilated) kernel 3");
  EXPECT_THROW_MSG(avg_pool1d(f32({3, 8}), 2), ShapeError, "avg_pool1d: input must be 3-D (N, C, L), got sizes [3, 8]");
  EXPECT_THROW_MSG(avg_pool1d(x, 2, -1), ValueError, "avg_pool1d: stride must be >= 1, got -1");
  EXPECT_THROW_MSG(adaptive_avg_pool1d(f32({3, 8}), 2), ShapeError, "adaptive_avg_pool1d: input must be 3-D (N, C, L)");
  EXPECT_THROW_MSG(adaptive_avg_pool1d(x, 0), ValueError, "adaptive_avg_pool1d: output_size must be >= 1, got 0");
  EXPECT_THROW_MSG(nn::MaxPool1dImpl(0), ValueError, "MaxPool1d: kernel_size and dilation must be >= 1");
  EXPECT_THROW_MSG(nn::AvgPool1dImpl(2, 1, 3), ValueError,
                   "AvgPool1d: padding must be >= 0 and at most half the kernel size, got padding 3 for kernel_size 2");
  EXPECT_THROW_MSG(nn::AdaptiveAvgPool1dImpl(0), ValueError, "AdaptiveAvgPool1d: output_size must be >= 1, got 0");
}

// ---- interpolate / Upsample -------------------------------------------------------------------------

struct InterpCase {
  const char* name;
  std::optional<std::array<int64_t, 2>> size;
  std::optional<std::array<double, 2>> scale;
  const char* mode;
  std::optional<bool> align_corners;
};

const InterpCase kInterpCases[] = {
    {"interp_nearest_s2", std::nullopt, std::array<double, 2>{2.0, 2.0}, "nearest", std::nullopt},
    {"interp_nearest_size", std::array<int64_t, 2>{7, 9}, std::nullopt, "nearest", std::nullopt},
    {"interp_nearest_s1_5_2_5", std::nullopt, std::array<double, 2>{1.5, 2.5}, "nearest", std::nullopt},
    {"interp_bilinear_s2", std::nullopt, std::array<double, 2>{2.0, 2.0}, "bilinear", false},
    {"interp_bilinear_ac_size", std::array<int64_t, 2>{9, 7}, std::nullopt, "bilinear", true},
    {"interp_bilinear_down", std::array<int64_t, 2>{5, 4}, std::nullopt, "bilinear", false},
    {"interp_bilinear_s1_7_1_3", std::nullopt, std::array<double, 2>{1.7, 1.3}, "bilinear", false},
};

TEST(SpatialOpsGolden, Interpolate) {
  for (const InterpCase& c : kInterpCases) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor x = G(n + ".x"), want = G(n + ".out");
    const Tensor y = interpolate(x, c.size, c.scale, c.mode, c.align_corners);
    EXPECT_EQ(y.sizes(), want.sizes());
    testing::expect_close(y, want, kTol, n);
    const Tensor y_cl = interpolate(x.contiguous(MemoryFormat::kChannelsLast), c.size, c.scale, c.mode,
                                    c.align_corners);
    testing::expect_close(y_cl, want, kTol, n + " channels-last");
    if (x.size(1) > 1) {
      EXPECT_TRUE(y_cl.is_channels_last()) << "the output keeps the input layout";
    }
    nn::UpsampleOptions o;
    if (c.size) o.size(*c.size);
    if (c.scale) o.scale_factor(*c.scale);
    o.mode(c.mode);
    if (c.align_corners) o.align_corners(*c.align_corners);
    testing::expect_close(nn::UpsampleImpl(o)(x), want, kTol, n + " layer");
  }
  // Nearest is a gather: exact.
  EXPECT_EQ(interpolate(G("interp_nearest_size.x"), std::array<int64_t, 2>{7, 9}).to_vector<float>(),
            G("interp_nearest_size.out").to_vector<float>());
}

// Bilinear with a scale factor that leaves one dimension's size unchanged (5 * 1.1 -> 5): PyTorch
// 1.13 copies that dimension (torch: interpolate(arange(25).view(1, 1, 5, 5), scale_factor=(1.1,
// 2.0), mode="bilinear")[0, 0, :, 0] == [0, 5, 10, 15, 20]); dbrq resampled it with 1 / 1.1
// ([0, 4.32, 8.86, 13.41, 17.95]), no error. The int8 form (on the codes) follows the float one
// (PyTorch's quantized kernel resamples it, unlike its float one).
TEST(SpatialOpsGolden, BilinearCopiesADimensionThatKeepsItsSize) {
  const Tensor x = arange(25).reshape({1, 1, 5, 5});
  for (MemoryFormat f : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
    const Tensor y = interpolate(x.contiguous(f), std::nullopt, std::array<double, 2>{1.1, 2.0}, "bilinear", false);
    ASSERT_EQ(y.sizes(), IntArrayRef(std::vector<int64_t>{1, 1, 5, 10}));
    for (int64_t h = 0; h < 5; ++h) EXPECT_EQ(y.at<float>({0, 0, h, 0}), 5.f * static_cast<float>(h)) << h;
    // The same as resampling W alone (sizes given: H's scale is 1).
    EXPECT_EQ(y.to_vector<float>(),
              interpolate(x, std::array<int64_t, 2>{5, 10}, std::nullopt, "bilinear", false).to_vector<float>());
    const Tensor q = quantize_per_tensor(x.contiguous(f), 0.125f, 0, DType::kU8);
    const Tensor yq = interpolate(q, std::nullopt, std::array<double, 2>{1.1, 2.0}, "bilinear", false);
    testing::expect_close(yq.dequantize(), y, 0.0625, "int8");
  }
  // A single factor on a 5 x 20 input: H stays, W becomes 22.
  const Tensor r = randn({1, 2, 5, 20}, 7);
  EXPECT_EQ(interpolate(r, std::nullopt, std::array<double, 2>{1.1, 1.1}, "bilinear", false).to_vector<float>(),
            interpolate(r, std::nullopt, std::array<double, 2>{1.0, 1.1}, "bilinear", false).to_vector<float>());
}

// Nearest with a scale factor whose output size is the input's or twice it (5 * 1.1 -> 5,
// 5 * 2.1 -> 10): PyTorch 1.13's NCHW kernel (3 channels) and its quantized kernel take
// floor(dst / scale_factor) (torch: H indices [0, 0, 1, 2, 3] and [0, 0, 0, 1, 1, 2, 2, 3, 3, 4]);
// dbrq copied and halved ([0..4], [0, 0, 1, 1, ..]), as only PyTorch's channels-last kernel does.
TEST(SpatialOpsGolden, NearestWithAScaleFactorFollowsTheNchwKernel) {
  const Tensor x = arange(75).reshape({1, 3, 5, 5});
  auto column0 = [](const Tensor& y) {
    std::vector<float> c;
    for (int64_t h = 0; h < y.size(2); ++h) c.push_back(y.at<float>({0, 1, h, 0}));
    return c;
  };
  for (MemoryFormat f : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
    const Tensor a = interpolate(x.contiguous(f), std::nullopt, std::array<double, 2>{1.1, 2.0}, "nearest");
    EXPECT_EQ(column0(a), (std::vector<float>{25, 25, 30, 35, 40}));
    const Tensor b = interpolate(x.contiguous(f), std::nullopt, std::array<double, 2>{2.1, 2.1}, "nearest");
    EXPECT_EQ(column0(b), (std::vector<float>{25, 25, 25, 30, 30, 35, 35, 40, 40, 45}));
    // The same indices on int8 codes (PyTorch's quantized kernel).
    const Tensor q = quantize_per_tensor(x.contiguous(f), 1.f, 0, DType::kU8);
    EXPECT_EQ(column0(interpolate(q, std::nullopt, std::array<double, 2>{2.1, 2.1}, "nearest").dequantize()),
              column0(b));
  }
  // Without a scale factor (sizes given) a same or double size copies and halves.
  EXPECT_EQ(column0(interpolate(x, std::array<int64_t, 2>{10, 5}, std::nullopt, "nearest")),
            (std::vector<float>{25, 25, 30, 30, 35, 35, 40, 40, 45, 45}));
}

TEST(SpatialOpsGolden, UpsamplePrinting) {
  EXPECT_EQ(nn::UpsampleImpl(nn::UpsampleOptions().scale_factor(2.0)).extra_repr(), "scale_factor=2.0, mode='nearest'");
  EXPECT_EQ(nn::UpsampleImpl(nn::UpsampleOptions().scale_factor(1.5).mode("bilinear").align_corners(true)).extra_repr(),
            "scale_factor=1.5, mode='bilinear'");
  EXPECT_EQ(nn::UpsampleImpl(nn::UpsampleOptions().scale_factor({2.0, 3.0})).extra_repr(),
            "scale_factor=(2.0, 3.0), mode='nearest'");
  EXPECT_EQ(nn::UpsampleImpl(nn::UpsampleOptions().size(8)).extra_repr(), "size=8, mode='nearest'");
  EXPECT_EQ(nn::UpsampleImpl(nn::UpsampleOptions().size({4, 6}).mode("bilinear")).to_string(),
            "Upsample(size=(4, 6), mode='bilinear')");
}

TEST(SpatialOpErrors, Interpolate) {
  const Tensor x = f32({1, 2, 4, 4});
  const std::array<double, 2> s2{2.0, 2.0};
  EXPECT_THROW_MSG(interpolate(Tensor(), std::nullopt, s2), ValueError, "interpolate: input is an undefined tensor");
  EXPECT_THROW_MSG(interpolate(f32({2, 4, 4}), std::nullopt, s2), ShapeError,
                   "interpolate: input must be 4-D (N, C, H, W), got sizes [2, 4, 4]");
  EXPECT_THROW_MSG(interpolate(x, std::nullopt), ValueError, "interpolate: either size or scale_factor should be defined");
  EXPECT_THROW_MSG(interpolate(x, std::array<int64_t, 2>{8, 8}, s2), ValueError,
                   "interpolate: only one of size or scale_factor should be defined");
  EXPECT_THROW_MSG(interpolate(x, std::nullopt, s2, "bicubic"), ValueError,
                   "interpolate: mode must be \"nearest\" or \"bilinear\", got \"bicubic\"");
  EXPECT_THROW_MSG(interpolate(x, std::nullopt, s2, "nearest", true), ValueError,
                   "interpolate: align_corners option can only be set with the interpolating mode \"bilinear\"");
  EXPECT_THROW_MSG(interpolate(x, std::array<int64_t, 2>{0, 3}), ValueError, "interpolate: size must be >= 1, got (0, 3)");
  EXPECT_THROW_MSG(interpolate(x, std::nullopt, std::array<double, 2>{2.0, -1.0}), ValueError,
                   "interpolate: scale_factor must be finite and > 0, got (2, -1)");
  EXPECT_THROW_MSG(interpolate(x, std::nullopt, std::array<double, 2>{0.1, 1.0}), ShapeError,
                   "interpolate: output size 0 (input 4 * scale_factor 0.1) must be >= 1");
  EXPECT_THROW_MSG(interpolate(zeros({1, 2, 4, 4}, DType::kS64), std::nullopt, s2), DTypeError,
                   "interpolate: input must have dtype f32, u8 or s8, got s64");
  EXPECT_THROW_MSG(interpolate(zeros({1, 2, 4, 4}, DType::kU8), std::nullopt, s2, "bilinear"), DTypeError,
                   "interpolate (bilinear): input must have dtype f32 or be a quantized u8 tensor, got u8");
  EXPECT_THROW_MSG(nn::UpsampleImpl(nn::UpsampleOptions()), ValueError,
                   "Upsample: either size or scale_factor should be defined");
  EXPECT_THROW_MSG(nn::UpsampleImpl(nn::UpsampleOptions().size(4).scale_factor(2.0)), ValueError,
                   "Upsample: only one of size or scale_factor should be defined");
  EXPECT_THROW_MSG(nn::UpsampleImpl(nn::UpsampleOptions().size(4).mode("area")), ValueError,
                   "Upsample: mode must be \"nearest\" or \"bilinear\", got \"area\"");
  EXPECT_THROW_MSG(nn::UpsampleImpl(nn::UpsampleOptions().size(4).align_corners(false)), ValueError,
                   "Upsample: align_corners option can only be set with the interpolating mode \"bilinear\"");
  EXPECT_THROW_MSG(nn::UpsampleImpl(nn::UpsampleOptions().scale_factor(0.0)), ValueError,
                   "Upsample: scale_factor must be finite and > 0, got 0");
  EXPECT_EQ(interpolate(x, std::nullopt, s2).sizes(), (DimVector{1, 2, 8, 8}));
}

// ---- group_norm / instance_norm -------------------------------------------------------------------

TEST(SpatialOpsGolden, GroupNorm) {
  struct Case {
    const char* name;
    int64_t groups;
    double eps;
  };
  for (const Case& c : {Case{"gn_4d_g2", 2, 1e-5}, Case{"gn_3d_g3_noaffine", 3, 1e-5}, Case{"gn_per_channel_eps", 4, 1e-3}}) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor x = G(n + ".x"), w = maybe(n + ".w"), b = maybe(n + ".b"), want = G(n + ".out");
    testing::expect_close(group_norm(x, c.groups, w, b, c.eps), want, kTol, n);
    if (x.dim() == 4) {
      const Tensor y = group_norm(x.contiguous(MemoryFormat::kChannelsLast), c.groups, w, b, c.eps);
      testing::expect_close(y, want, kTol, n + " channels-last");
      EXPECT_TRUE(y.is_channels_last()) << "the output keeps the input's layout";
    }
    nn::GroupNormImpl layer(c.groups, x.size(1), c.eps, w.defined());
    if (w.defined()) {
      layer.weight.copy_(w);
      layer.bias.copy_(b);
    }
    testing::expect_close(layer(x), want, kTol, n + " layer");
  }
  EXPECT_EQ(nn::GroupNormImpl(2, 6).extra_repr(), "2, 6, eps=1e-05, affine=True");
  EXPECT_EQ(nn::GroupNormImpl(3, 6, 1e-3, false).to_string(), "GroupNorm(3, 6, eps=0.001, affine=False)");
}

TEST(SpatialOpsGolden, InstanceNorm) {
  const Tensor x = G("in_4d.x");
  testing::expect_close(instance_norm(x), G("in_4d.out"), kTol, "in_4d");
  nn::InstanceNorm2dImpl layer(3);
  testing::expect_close(layer(x), G("in_4d.out"), kTol, "layer");
  // An unbatched [C, H, W] input, as PyTorch accepts.
  testing::expect_close(layer(x.select(0, 1)), G("in_4d.out").select(0, 1), kTol, "unbatched");
  EXPECT_TRUE(layer.named_parameters().empty());
  EXPECT_EQ(layer.extra_repr(), "3, eps=1e-05, momentum=0.1, affine=False, track_running_stats=False");

  const Tensor xa = G("in_4d_affine.x"), w = G("in_4d_affine.w"), b = G("in_4d_affine.b");
  testing::expect_close(instance_norm(xa, w, b), G("in_4d_affine.out"), kTol, "in_4d_affine");
  nn::InstanceNorm2dImpl affine(4, 1e-5, 0.1, true);
  affine.weight.copy_(w);
  affine.bias.copy_(b);
  testing::expect_close(affine(xa.contiguous(MemoryFormat::kChannelsLast)), G("in_4d_affine.out"), kTol, "affine layer");
  // track_running_stats: inference (eval) uses the running statistics (batch_norm).
  nn::InstanceNorm2dImpl tracked(4, 1e-5, 0.1, true, true);
  tracked.eval();
  tracked.running_mean.copy_(from_vector<float>({0.5f, -0.5f, 1.f, 0.f}));
  tracked.running_var.copy_(from_vector<float>({1.f, 4.f, 0.25f, 2.f}));
  testing::expect_close(tracked(xa),
                        batch_norm(xa, tracked.running_mean, tracked.running_var, tracked.weight, tracked.bias), 1e-6,
                        "tracked");
  EXPECT_EQ(tracked.extra_repr(), "4, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True");
}

TEST(SpatialOpErrors, GroupNormAndInstanceNorm) {
  const Tensor x = f32({2, 6, 4, 4});
  EXPECT_THROW_MSG(group_norm(x, 4), ShapeError, "group_norm: 6 channels are not divisible into 4 groups");
  EXPECT_THROW_MSG(group_norm(x, 0), ValueError, "group_norm: num_groups must be >= 1, got 0");
  EXPECT_THROW_MSG(group_norm(f32({6}), 2), ShapeError, "group_norm: input must have at least 2 dims (N, C, *), got sizes [6]");
  EXPECT_THROW_MSG(group_norm(x, 2, f32({5})), ShapeError, "group_norm: weight must have sizes [6], got [5]");
  EXPECT_THROW_MSG(group_norm(x, 2, Tensor(), f32({6, 1})), ShapeError, "group_norm: bias must have sizes [6], got [6, 1]");
  EXPECT_THROW_MSG(group_norm(x, 2, Tensor(), Tensor(), -1.0), ValueError, "group_norm: eps must be finite and >= 0, got -1");
  EXPECT_THROW_MSG(group_norm(zeros({2, 6, 4, 4}, DType::kU8), 2), DTypeError, "group_norm: input must have dtype f32, got u8");
  EXPECT_THROW_MSG(group_norm(Tensor(), 2), ValueError, "group_norm: input is an undefined tensor");
  EXPECT_THROW_MSG(instance_norm(x, f32({4})), ShapeError, "instance_norm: weight must have sizes [6], got [4]");
  EXPECT_THROW_MSG(instance_norm(zeros({2, 6, 4}, DType::kS64)), DTypeError, "instance_norm: input must have dtype f32, got s64");
  EXPECT_THROW_MSG(nn::GroupNormImpl(4, 6), ValueError, "GroupNorm: num_channels (6) must be divisible by num_groups (4)");
  EXPECT_THROW_MSG(nn::InstanceNorm2dImpl(0), ValueError, "InstanceNorm2d: num_features must be >= 1, got 0");
  nn::InstanceNorm2dImpl in(6);
  EXPECT_THROW_MSG(in(f32({2, 5, 4, 4})), ShapeError, "InstanceNorm2d: expected 6 channels, got input sizes [2, 5, 4, 4]");
  EXPECT_THROW_MSG(in(f32({2, 6})), ShapeError, "InstanceNorm2d: input must be 3-D or 4-D ((N,) C, H, W), got sizes [2, 6]");
  EXPECT_EQ(in(x).sizes(), x.sizes());
}

}  // namespace
}  // namespace dbrq
