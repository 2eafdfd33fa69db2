// Every eager op in runtime/ops.h against PyTorch 1.13 reference outputs (golden/ops.safetensors,
// made by make_op_goldens.py; case parameters below mirror the script's tables). Float ops must
// agree to a relative error of 1e-4; quantization must be bit-exact. Each case also runs with
// channels-last and non-dense (strided) inputs where the op accepts 4-D or strided tensors, because
// the kernels take different paths for those layouts.
#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
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
bool has(const std::string& name) { return goldens().count(name) > 0; }

void close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  testing::expect_close(actual, expected, kTol, what);
}

Tensor channels_last(const Tensor& t) {
  Tensor cl = t.contiguous(MemoryFormat::kChannelsLast);
  EXPECT_TRUE(cl.is_channels_last());
  if (t.size(1) > 1 && t.size(2) * t.size(3) > 1) {
    EXPECT_FALSE(cl.is_contiguous());
  }
  return cl;
}

// The same values as `t` in a view whose last dim has stride 2 (not dense), so kernels must either
// handle arbitrary strides or copy first.
Tensor strided(const Tensor& t) {
  if (t.dim() == 0) return t;  // a scalar has no dim to stride
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  const int64_t n = sizes.back();
  sizes.back() = 2 * n;
  Tensor big = full(sizes, -777.0, t.dtype());
  Tensor view = big.slice(-1, 0, 2 * n, 2);
  view.copy_(t);
  if (t.numel() > 1) {
    EXPECT_FALSE(view.is_non_overlapping_and_dense());
  }
  return view;
}

// The same values as a 2-D+ tensor `t` with its last two dims laid out column-major.
Tensor col_major(const Tensor& t) {
  Tensor v = t.transpose(-2, -1).contiguous().transpose(-2, -1);
  EXPECT_FALSE(v.is_contiguous());
  return v;
}

Tensor maybe(const std::string& name) { return has(name) ? G(name) : Tensor(); }

// ---- conv2d -------------------------------------------------------------------------------------

struct ConvCase {
  const char* name;
  Conv2dParams p;
};

const ConvCase kConvCases[] = {
    {"conv_basic", {{1, 1}, {1, 1}, {1, 1}, 1}},      {"conv_stride2_pad1", {{2, 2}, {1, 1}, {1, 1}, 1}},
    {"conv_nobias", {{1, 1}, {0, 0}, {1, 1}, 1}},     {"conv_dilation2", {{1, 1}, {2, 2}, {2, 2}, 1}},
    {"conv_asymmetric", {{2, 1}, {1, 0}, {1, 2}, 1}}, {"conv_groups2", {{1, 1}, {1, 1}, {1, 1}, 2}},
    {"conv_depthwise", {{1, 1}, {1, 1}, {1, 1}, 6}},  {"conv_depthwise_mult2_s2", {{2, 2}, {1, 1}, {1, 1}, 4}},
    {"conv_1x1", {{1, 1}, {0, 0}, {1, 1}, 1}},        {"conv_7x7_s2", {{2, 2}, {3, 3}, {1, 1}, 1}},
    {"conv_nonsquare", {{2, 2}, {1, 1}, {1, 1}, 1}},
};

TEST(OpsGolden, Conv2d) {
  for (const ConvCase& c : kConvCases) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor x = G(n + ".x"), w = G(n + ".w"), b = maybe(n + ".b"), want = G(n + ".out");
    EXPECT_EQ(b.defined(), n != "conv_nobias" && n != "conv_7x7_s2" && n != "conv_depthwise_mult2_s2");
    const Tensor y = conv2d(x, w, b, c.p);
    close(y, want, n + " contiguous");
    // Documented: 4-D conv outputs are channels-last so the next conv reads them without a reorder.
    EXPECT_TRUE(y.is_channels_last()) << n;
    close(conv2d(channels_last(x), w, b, c.p), want, n + " channels-last input");
    close(conv2d(strided(x), w, b, c.p), want, n + " strided input");
  }
  // A weight that is not contiguous (channels-last, as a checkpoint converted with
  // memory_format=channels_last would be) must be read by its logical layout.
  const Tensor x = G("conv_basic.x"), w = G("conv_basic.w"), b = G("conv_basic.b");
  close(conv2d(x, channels_last(w), strided(b), kConvCases[0].p), G("conv_basic.out"), "channels-last weight");
  // The default parameters are stride 1, no padding.
  close(conv2d(G("conv_nobias.x"), G("conv_nobias.w")), G("conv_nobias.out"), "default params");
}

// Weights are prepacked and cached per storage: a weight written in place must not be served stale.
TEST(OpsGolden, Conv2dAndLinearSeeInPlaceWeightUpdates) {
  const Tensor x = G("conv_basic.x"), b = G("conv_basic.b");
  Tensor w = G("conv_basic.w").clone();
  close(conv2d(x, w, b, kConvCases[0].p), G("conv_basic.out"), "before");
  w.mul_(2.0);
  close(conv2d(x, w, b, kConvCases[0].p), G("conv_basic.out") * 2.0 - b.reshape({1, 6, 1, 1}), "after w *= 2");

  const Tensor lx = G("linear_2d.x"), lb = G("linear_2d.b");
  Tensor lw = G("linear_2d.w").clone();
  close(linear(lx, lw, lb), G("linear_2d.out"), "linear before");
  lw.fill_(0.0);
  close(linear(lx, lw, lb), zeros({4, 6}) + lb, "linear after w = 0");
}

// Weights in caller-owned memory (Tensor::from_blob), rewritten by their owner between calls: no
// dbrq write, no version bump. The prepacked-weight cache served the first call's weights to
// every later conv (and conv_transpose2d): y2 equalled y1 where PyTorch gives 2 * y1.
TEST(OpsGolden, FromBlobWeightsRewrittenByTheirOwnerAreReadAgain) {
  const Tensor x = randn({1, 3, 8, 8}, 4).contiguous(MemoryFormat::kChannelsLast);
  std::vector<float> buf(16 * 3 * 3 * 3, 0.5f);
  const Tensor w = Tensor::from_blob(buf.data(), {16, 3, 3, 3}, DType::kF32);
  const Tensor y1 = conv2d(x, w);
  std::fill(buf.begin(), buf.end(), 1.0f);
  close(conv2d(x, w), y1 * 2.0, "conv2d after the owner doubled the weights");
  std::vector<float> dbuf(3 * 8 * 2 * 2, 0.5f);
  const Tensor dw = Tensor::from_blob(dbuf.data(), {3, 8, 2, 2}, DType::kF32);
  const Tensor d1 = conv_transpose2d(x, dw);
  std::fill(dbuf.begin(), dbuf.end(), 1.0f);
  close(conv_transpose2d(x, dw), d1 * 2.0, "conv_transpose2d after the owner doubled the weights");
  std::vector<float> lbuf(32 * 64, 0.5f);
  const Tensor lw = Tensor::from_blob(lbuf.data(), {32, 64}, DType::kF32);
  const Tensor lx = randn({5, 64}, 6);
  const Tensor l1 = linear(lx, lw);
  std::fill(lbuf.begin(), lbuf.end(), 1.0f);
  close(linear(lx, lw), l1 * 2.0, "linear after the owner doubled the weights");
}

// Two weight views of one storage with equal sizes and offset but different row strides hold
// different values; the prepacked-weight cache must tell them apart.
TEST(OpsGolden, LinearWeightViewsSharingStorage) {
  const Tensor x = G("linear_nobias.x");     // [3, 7]
  const Tensor base = randn({8, 7}, 11);     // 56 floats
  const Tensor rows = base.narrow(0, 0, 4);  // [4, 7], strides [7, 1]
  const Tensor w2 = base.reshape({56}).narrow(0, 0, 28).reshape({4, 7});
  const Tensor wide = randn({4, 14}, 12);
  const Tensor cols = wide.narrow(1, 0, 7);                                   // [4, 7], strides [14, 1], offset 0
  const Tensor packed = wide.reshape({56}).narrow(0, 0, 28).reshape({4, 7});  // [4, 7], strides [7, 1]
  close(linear(x, rows), linear(x, rows.contiguous().clone()), "rows");
  close(linear(x, w2), linear(x, rows.clone()), "same memory, same strides");
  const Tensor y_cols = linear(x, cols);
  const Tensor y_packed = linear(x, packed);
  close(y_cols, linear(x, cols.contiguous()), "column view [14, 1] strides");
  close(y_packed, linear(x, packed.clone()), "flat view [7, 1] strides after the column view");
}

// ---- linear / matmul ----------------------------------------------------------------------------

TEST(OpsGolden, Linear) {
  for (const char* name : {"linear_2d", "linear_3d", "linear_nobias", "linear_1d"}) {
    SCOPED_TRACE(name);
    const std::string n = name;
    const Tensor x = G(n + ".x"), w = G(n + ".w"), b = maybe(n + ".b"), want = G(n + ".out");
    close(linear(x, w, b), want, n);
    close(linear(strided(x), w, b), want, n + " strided input");
    close(linear(x, col_major(w), b), want, n + " column-major weight");
    if (x.dim() >= 2) close(linear(col_major(x), w, b), want, n + " column-major input");
  }
}

TEST(OpsGolden, Matmul) {
  for (const char* name : {"mm_2d", "mm_3d", "mm_4d", "mm_bcast_batch", "mm_3d_2d", "mm_2d_3d", "mm_1d_left",
                           "mm_1d_right", "mm_1d_1d", "mm_2d_1d", "mm_1d_2d"}) {
    SCOPED_TRACE(name);
    const std::string n = name;
    const Tensor a = G(n + ".a"), b = G(n + ".b"), want = G(n + ".out");
    const Tensor y = matmul(a, b);
    EXPECT_EQ(y.sizes(), want.sizes()) << n << ": " << y.shape_string() << " vs " << want.shape_string();
    close(y, want, n);
    if (a.dim() >= 2 && b.dim() >= 2) close(matmul(col_major(a), col_major(b)), want, n + " column-major operands");
    close(matmul(strided(a), strided(b)), want, n + " strided operands");
  }
  // Attention scores: q @ k^T with k^T a transposed view, not a copy.
  const Tensor k = G("mm_kt.b");
  const Tensor kt = k.transpose(-2, -1);
  EXPECT_EQ(kt.storage(), k.storage());
  close(matmul(G("mm_kt.a"), kt), G("mm_kt.out"), "q @ k.transpose(-2, -1)");
  close(matmul(G("mm_at.a").transpose(-2, -1), G("mm_at.b")), G("mm_at.out"), "a.transpose(-2, -1) @ b");
}

// ---- binary elementwise -------------------------------------------------------------------------

TEST(OpsGolden, BinaryTensorTensor) {
  for (const char* name :
       {"bin_same", "bin_bcast_b", "bin_bcast_a", "bin_bcast_both", "bin_channel", "bin_channel_first", "bin_0d"}) {
    SCOPED_TRACE(name);
    const std::string n = name;
    const Tensor a = G(n + ".a"), b = G(n + ".b");
    close(add(a, b), G(n + ".add"), n + " add");
    close(sub(a, b), G(n + ".sub"), n + " sub");
    close(mul(a, b), G(n + ".mul"), n + " mul");
    close(div(a, b), G(n + ".div"), n + " div");
    // The operators are the same ops.
    close(a + b, G(n + ".add"), n + " operator+");
    close(a - b, G(n + ".sub"), n + " operator-");
    close(a * b, G(n + ".mul"), n + " operator*");
    close(a / b, G(n + ".div"), n + " operator/");
    // Non-dense operands on either side.
    close(sub(strided(a), b), G(n + ".sub"), n + " sub strided a");
    close(div(a, strided(b)), G(n + ".div"), n + " div strided b");
  }
  // Channels-last activation with a per-channel [C, 1, 1] operand on either side (the second side
  // makes the kernel materialize the broadcast operand in the activation's layout).
  const Tensor a = G("bin_channel.a"), b = G("bin_channel.b");
  for (const char* op : {"add", "sub", "mul", "div"}) {
    SCOPED_TRACE(op);
    const std::string s = op;
    const Tensor acl = channels_last(a);
    const Tensor y = s == "add" ? add(acl, b) : s == "sub" ? sub(acl, b) : s == "mul" ? mul(acl, b) : div(acl, b);
    close(y, G("bin_channel." + s), "channels-last a " + s);
    const Tensor a2 = G("bin_channel_first.a"), b2 = channels_last(G("bin_channel_first.b"));
    const Tensor y2 = s == "add" ? add(a2, b2) : s == "sub" ? sub(a2, b2) : s == "mul" ? mul(a2, b2) : div(a2, b2);
    close(y2, G("bin_channel_first." + s), "channels-last b " + s);
  }
  // Both channels-last, same shape (b expanded by adding zeros).
  const Tensor b_full = b + zeros({2, 3, 4, 4});
  close(channels_last(a) * channels_last(b_full), G("bin_channel.mul"), "both channels-last");
  close(channels_last(a) - b_full, G("bin_channel.sub"), "channels-last minus contiguous");
  close(a / channels_last(b_full), G("bin_channel.div"), "contiguous over channels-last");
}

TEST(OpsGolden, BinaryTensorScalar) {
  const Tensor x = G("scalar.x");
  const double s = 2.5;  // SCALAR in the script
  close(add(x, s), G("scalar.add"), "add(x, s)");
  close(add(s, x), G("scalar.radd"), "add(s, x)");
  close(sub(x, s), G("scalar.sub"), "sub(x, s)");
  close(sub(s, x), G("scalar.rsub"), "sub(s, x)");
  close(mul(x, -s), G("scalar.mul"), "mul(x, -s)");
  close(mul(-s, x), G("scalar.rmul"), "mul(-s, x)");
  close(div(x, s), G("scalar.div"), "div(x, s)");
  close(div(s, x), G("scalar.rdiv"), "div(s, x)");
  close(x + s, G("scalar.add"), "x + s");
  close(s + x, G("scalar.radd"), "s + x");
  close(x - s, G("scalar.sub"), "x - s");
  close(s - x, G("scalar.rsub"), "s - x");
  close(x * -s, G("scalar.mul"), "x * -s");
  close(-s * x, G("scalar.rmul"), "-s * x");
  close(x / s, G("scalar.div"), "x / s");
  close(s / x, G("scalar.rdiv"), "s / x");
  close(-x, G("scalar.neg"), "-x");
  close(s - strided(x), G("scalar.rsub"), "s - strided x");
  close(s / col_major(x), G("scalar.rdiv"), "s / column-major x");
}

// ---- activations --------------------------------------------------------------------------------

TEST(OpsGolden, UnaryActivations) {
  const Tensor x = G("unary.x");
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"relu", [](const Tensor& t) { return relu(t); }},
      {"relu6", [](const Tensor& t) { return relu6(t); }},
      {"hardtanh_default", [](const Tensor& t) { return hardtanh(t); }},
      {"hardtanh", [](const Tensor& t) { return hardtanh(t, -0.5, 0.8); }},
      {"leaky_relu_default", [](const Tensor& t) { return leaky_relu(t); }},
      {"leaky_relu", [](const Tensor& t) { return leaky_relu(t, 0.2); }},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }},
      {"tanh", [](const Tensor& t) { return dbrq::tanh(t); }},
      {"hardsigmoid", [](const Tensor& t) { return hardsigmoid(t); }},
      {"hardswish", [](const Tensor& t) { return hardswish(t); }},
      {"silu", [](const Tensor& t) { return silu(t); }},
      {"gelu", [](const Tensor& t) { return gelu(t); }},
      {"gelu_tanh", [](const Tensor& t) { return gelu(t, "tanh"); }},
      {"clamp", [](const Tensor& t) { return clamp(t, -1.2, 0.7); }},
      {"elu", [](const Tensor& t) { return elu(t); }},
      {"elu_alpha", [](const Tensor& t) { return elu(t, 0.5); }},
  };
  for (const auto& [name, f] : ops) {
    SCOPED_TRACE(name);
    const Tensor want = G("unary." + name);
    const Tensor y = f(x);
    close(y, want, name);
    close(f(channels_last(x)), want, name + " channels-last");
    close(f(strided(x)), want, name + " strided");
    // A narrowed view (non-zero storage offset) sees only its own elements.
    close(f(x.narrow(1, 1, 2)), want.narrow(1, 1, 2), name + " narrowed");
  }
  // "none" is the default and the erf form.
  close(gelu(x, "none"), G("unary.gelu"), "gelu none");
}

// NaN passes through the activations and max pooling as in PyTorch (relu(NaN) = NaN, a window
// holding NaN pools to NaN): oneDNN's kernels returned 0, the lower bound, or skipped it, so a NaN
// from a broken input or weight vanished where PyTorch shows it.
TEST(OpsGolden, NaNPropagatesAsInPyTorch) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v(64, 0.5f);
  for (size_t i = 0; i < v.size(); i += 3) v[i] = -2.f;
  v[5] = nan;
  v[17] = nan;
  const Tensor x = from_vector<float>(v).reshape({1, 4, 4, 4});
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"relu", [](const Tensor& t) { return relu(t); }},
      {"relu6", [](const Tensor& t) { return relu6(t); }},
      {"hardtanh", [](const Tensor& t) { return hardtanh(t); }},
      {"leaky_relu", [](const Tensor& t) { return leaky_relu(t, 0.2); }},
      {"clamp", [](const Tensor& t) { return clamp(t, -1.2, 0.7); }},
      {"elu", [](const Tensor& t) { return elu(t); }},
  };
  for (const auto& [name, f] : ops) {
    for (const Tensor& in : {x, x.contiguous(MemoryFormat::kChannelsLast)}) {
      const Tensor y = f(in).contiguous();
      const std::vector<float> got = y.to_vector<float>();
      for (size_t i = 0; i < v.size(); ++i) {
        if (std::isnan(v[i])) {
          EXPECT_TRUE(std::isnan(got[i])) << name << " [" << i << "] = " << got[i];
        } else {
          EXPECT_FALSE(std::isnan(got[i])) << name << " [" << i << "]";
        }
      }
    }
  }
  // In place too.
  Tensor r = x.clone();
  r.relu_();
  EXPECT_TRUE(std::isnan(r.contiguous().to_vector<float>()[5]));
  // max_pool2d: a window with a NaN gives NaN (element 5 is (row 1, col 1) of channel 0).
  for (const Tensor& in : {x, x.contiguous(MemoryFormat::kChannelsLast)}) {
    const std::vector<float> p = max_pool2d(in, {2, 2}).contiguous().to_vector<float>();
    ASSERT_EQ(p.size(), 16u);
    EXPECT_TRUE(std::isnan(p[0])) << p[0];
    EXPECT_FALSE(std::isnan(p[1])) << p[1];
  }
  // Padding, stride, dilation and ceil_mode against a naive max that keeps NaN.
  std::vector<float> img(2 * 7 * 7);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<float>((i * 37) % 23) - 11.f;
  img[0] = nan;       // a corner: reached through the padding
  img[6 * 7 + 6] = nan;  // the last pixel of channel 0: only ceil_mode windows reach it with stride 2
  img[49 + 24] = nan;    // the centre of channel 1
  const Tensor im = from_vector<float>(img).reshape({1, 2, 7, 7});
  struct P {
    int64_t k, s, pad, dil;
    bool ceil;
  };
  for (const P& q : {P{3, 2, 1, 1, false}, P{3, 2, 1, 1, true}, P{2, 2, 0, 1, true}, P{3, 1, 1, 2, false},
                     P{2, 3, 1, 1, true}}) {
    const Tensor got = max_pool2d(im.contiguous(MemoryFormat::kChannelsLast), {q.k, q.k}, {q.s, q.s}, {q.pad, q.pad},
                                  {q.dil, q.dil}, q.ceil)
                           .contiguous();
    const int64_t oh = got.size(2), ow = got.size(3);
    const std::vector<float> g = got.to_vector<float>();
    for (int64_t c = 0; c < 2; ++c) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          float want = -std::numeric_limits<float>::infinity();
          for (int64_t r = 0; r < q.k; ++r) {
            for (int64_t t = 0; t < q.k; ++t) {
              const int64_t hi = i * q.s - q.pad + r * q.dil, wi = j * q.s - q.pad + t * q.dil;
              if (hi < 0 || hi >= 7 || wi < 0 || wi >= 7) continue;
              const float v = img[static_cast<size_t>(c * 49 + hi * 7 + wi)];
              want = std::isnan(v) || std::isnan(want) ? nan : std::max(want, v);
            }
          }
          const float have = g[static_cast<size_t>((c * oh + i) * ow + j)];
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(have)) << "k" << q.k << " s" << q.s << " p" << q.pad << " d" << q.dil << " ceil"
                                          << q.ceil << " at " << c << "," << i << "," << j;
          } else {
            EXPECT_EQ(have, want) << "k" << q.k << " s" << q.s << " p" << q.pad << " d" << q.dil << " at " << c << ","
                                  << i << "," << j;
          }
        }
      }
    }
  }
}

TEST(OpsGolden, SoftmaxAndLogSoftmax) {
  const Tensor x = G("softmax.x");
  for (int64_t d : {0, 1, 2, -1}) {
    const std::string tag = d < 0 ? "dimm" + std::to_string(-d) : "dim" + std::to_string(d);
    SCOPED_TRACE(tag);
    close(softmax(x, d), G("softmax." + tag), "softmax " + tag);
    close(log_softmax(x, d), G("log_softmax." + tag), "log_softmax " + tag);
    close(softmax(channels_last(x), d), G("softmax." + tag), "softmax channels-last " + tag);
    close(log_softmax(strided(x), d), G("log_softmax." + tag), "log_softmax strided " + tag);
  }
  // Dim 3 of x is dim 1 of the transposed view.
  close(softmax(x.transpose(1, 3), 1), G("softmax.dimm1").transpose(1, 3), "softmax over a transposed view");
  close(softmax(x, 3), G("softmax.dimm1"), "softmax dim 3 == dim -1");
  close(softmax(G("softmax2d.x"), 1), G("softmax2d.out"), "softmax 2-D");
  close(log_softmax(G("softmax2d.x"), -1), G("softmax2d.log"), "log_softmax 2-D");
  close(softmax(G("softmax1d.x"), 0), G("softmax1d.out"), "softmax 1-D");
  close(log_softmax(G("softmax1d.x"), -1), G("softmax1d.log"), "log_softmax 1-D");
}

// ---- normalization ------------------------------------------------------------------------------

TEST(OpsGolden, LayerNorm) {
  struct Case {
    const char* name;
    std::vector<int64_t> shape;
    double eps;
  };
  const Case cases[] = {
      {"ln_affine_1d", {8}, 1e-5},   {"ln_plain_1d", {6}, 1e-5},    {"ln_affine_2d", {4, 5}, 1e-5},
      {"ln_plain_2d", {4, 6}, 1e-3}, {"ln_weight_only", {7}, 1e-5},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor x = G(n + ".x"), w = maybe(n + ".w"), b = maybe(n + ".b"), want = G(n + ".out");
    close(layer_norm(x, c.shape, w, b, c.eps), want, n);
    close(layer_norm(strided(x), c.shape, w, b, c.eps), want, n + " strided input");
  }
  // The 2-D-normalized case with a channels-last 4-D input.
  close(layer_norm(channels_last(G("ln_affine_2d.x")), {4, 5}, G("ln_affine_2d.w"), G("ln_affine_2d.b")),
        G("ln_affine_2d.out"), "channels-last input");
}

TEST(OpsGolden, BatchNormInference) {
  struct Case {
    const char* name;
    double eps;
  };
  for (const Case& c : {Case{"bn_4d", 1e-5}, Case{"bn_2d", 1e-5}, Case{"bn_plain", 1e-3}}) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor x = G(n + ".x"), mean = G(n + ".mean"), var = G(n + ".var");
    const Tensor w = maybe(n + ".w"), b = maybe(n + ".b"), want = G(n + ".out");
    close(batch_norm(x, mean, var, w, b, c.eps), want, n);
    close(batch_norm(strided(x), mean, var, w, b, c.eps), want, n + " strided input");
    if (x.dim() == 4) {
      const Tensor y = batch_norm(channels_last(x), mean, var, w, b, c.eps);
      close(y, want, n + " channels-last");
      EXPECT_TRUE(y.is_channels_last()) << "batch_norm should keep the channels-last layout";
    }
  }
}

// ---- pooling ------------------------------------------------------------------------------------

struct MaxPoolCase {
  const char* name;
  std::array<int64_t, 2> k, s, p, d;
  bool ceil;
};
const MaxPoolCase kMaxPoolCases[] = {
    {"mp_k2", {2, 2}, {2, 2}, {0, 0}, {1, 1}, false},       {"mp_k3s2p1", {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
    {"mp_ceil", {3, 3}, {2, 2}, {0, 0}, {1, 1}, true},      {"mp_ceil_pad", {2, 2}, {2, 2}, {1, 1}, {1, 1}, true},
    {"mp_dilation", {3, 3}, {1, 1}, {1, 1}, {2, 2}, false}, {"mp_asymmetric", {2, 3}, {2, 1}, {1, 1}, {1, 1}, false},
};

struct AvgPoolCase {
  const char* name;
  std::array<int64_t, 2> k, s, p;
  bool ceil, include_pad;
};
const AvgPoolCase kAvgPoolCases[] = {
    {"ap_k2", {2, 2}, {2, 2}, {0, 0}, false, true},           {"ap_k3s2p1_incl", {3, 3}, {2, 2}, {1, 1}, false, true},
    {"ap_k3s2p1_excl", {3, 3}, {2, 2}, {1, 1}, false, false}, {"ap_ceil_incl", {3, 3}, {2, 2}, {0, 0}, true, true},
    {"ap_ceil_excl", {3, 3}, {2, 2}, {0, 0}, true, false},    {"ap_ceil_pad_incl", {3, 3}, {2, 2}, {1, 1}, true, true},
    {"ap_asymmetric", {2, 3}, {2, 1}, {1, 1}, false, true},
};

std::vector<int64_t> vec(const std::array<int64_t, 2>& a) { return {a[0], a[1]}; }

TEST(OpsGolden, MaxPool2d) {
  for (const MaxPoolCase& c : kMaxPoolCases) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor x = G(n + ".x"), want = G(n + ".out");
    close(max_pool2d(x, c.k, vec(c.s), c.p, c.d, c.ceil), want, n);
    const Tensor ycl = max_pool2d(channels_last(x), c.k, vec(c.s), c.p, c.d, c.ceil);
    close(ycl, want, n + " channels-last");
    EXPECT_TRUE(ycl.is_channels_last()) << "pooling keeps the channels-last layout";
    close(max_pool2d(strided(x), c.k, vec(c.s), c.p, c.d, c.ceil), want, n + " strided");
    // Max commutes with a monotonic quantization, so int8 max pooling of quantize(x) must equal
    // quantize(max_pool2d(x)) bit for bit, with the input's parameters kept.
    const Tensor qx = quantize_per_tensor(x, 0.02f, 120, DType::kU8);
    const Tensor qy = max_pool2d(qx, c.k, vec(c.s), c.p, c.d, c.ceil);
    ASSERT_EQ(qy.dtype(), DType::kU8);
    EXPECT_EQ(qy.q_scale(), 0.02f);
    EXPECT_EQ(qy.q_zero_point(), 120);
    testing::expect_equal(qy, quantize_per_tensor(want, 0.02f, 120, DType::kU8), n + " u8");
    const Tensor qcl = max_pool2d(qx.contiguous(MemoryFormat::kChannelsLast), c.k, vec(c.s), c.p, c.d, c.ceil);
    testing::expect_equal(qcl, qy, n + " u8 channels-last");
  }
  // The stride defaults to the kernel size.
  close(max_pool2d(G("mp_k2.x"), {2, 2}), G("mp_k2.out"), "default stride");
}

TEST(OpsGolden, AvgPool2d) {
  for (const AvgPoolCase& c : kAvgPoolCases) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor x = G(n + ".x"), want = G(n + ".out");
    close(avg_pool2d(x, c.k, vec(c.s), c.p, c.ceil, c.include_pad), want, n);
    close(avg_pool2d(channels_last(x), c.k, vec(c.s), c.p, c.ceil, c.include_pad), want, n + " channels-last");
    close(avg_pool2d(strided(x), c.k, vec(c.s), c.p, c.ceil, c.include_pad), want, n + " strided");
  }
  close(avg_pool2d(G("ap_k2.x"), {2, 2}), G("ap_k2.out"), "default stride");
}

TEST(OpsGolden, AdaptiveAvgPool2d) {
  struct Case {
    const char* name;
    std::array<int64_t, 2> out;
  };
  for (const Case& c : {Case{"aap_1x1", {1, 1}}, Case{"aap_divisible", {4, 3}}, Case{"aap_nondivisible", {3, 4}},
                        Case{"aap_upsample", {5, 4}}}) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const Tensor x = G(n + ".x"), want = G(n + ".out");
    close(adaptive_avg_pool2d(x, c.out), want, n);
    close(adaptive_avg_pool2d(channels_last(x), c.out), want, n + " channels-last");
    close(adaptive_avg_pool2d(strided(x), c.out), want, n + " strided");
    const int64_t ch = x.size(1) - 1;
    close(adaptive_avg_pool2d(x.narrow(1, 1, ch), c.out), want.narrow(1, 1, ch), n + " narrowed channels");
  }
}

// ---- joining, shape, reductions, embedding ------------------------------------------------------

// A u8 tensor's codes in logical (NCHW) order.
std::vector<uint8_t> codes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::vector<uint8_t>(c.raw_data<uint8_t>(), c.raw_data<uint8_t>() + c.numel());
}

// Channels-last inputs joined along channels take a per-pixel copy (kernels::cat): every channel
// count (runs of 17, 1, 32 and 3 bytes or floats: whole 16-byte moves and tails), u8 codes and f32,
// equal element for element to the cat of the same inputs in NCHW.
TEST(OpsGolden, CatOfChannelsLastInputsAlongChannels) {
  for (const DType dt : {DType::kF32, DType::kU8}) {
    std::vector<Tensor> nchw, nhwc;
    uint64_t seed = 40;
    for (const int64_t c : {17, 1, 32, 3}) {  // the first decides the layout (c = 1 is also NCHW)
      Tensor x = randn({2, c, 5, 3}, seed++);
      if (dt == DType::kU8) x = quantize_per_tensor(x, 0.05f, 120, DType::kU8);
      nchw.push_back(x);
      nhwc.push_back(channels_last(x));
    }
    SCOPED_TRACE(dtype_name(dt));
    const Tensor want = cat(nchw, 1), got = cat(nhwc, 1);
    ASSERT_TRUE(got.is_channels_last());
    ASSERT_EQ(got.sizes(), want.sizes());
    if (dt == DType::kU8) {
      EXPECT_EQ(got.q_scale(), want.q_scale());
      EXPECT_EQ(codes_of(got), codes_of(want));
    } else {
      EXPECT_EQ(got.contiguous().to_vector<float>(), want.to_vector<float>());
    }
  }
}

// A DenseNet layer's cat: the block's first features and many 32-channel outputs (a zero-channel
// input among them), several pixel tasks on two threads: every pixel gets every input's run at its
// offset.
TEST(OpsGolden, CatOfManyChannelsLastInputsOnTwoThreads) {
  const int saved = get_num_threads();
  set_num_threads(2);
  std::vector<Tensor> nchw, nhwc;
  for (int i = 0; i < 14; ++i) {
    const int64_t c = i == 0 ? 64 : i == 5 ? 0 : 32;
    const Tensor x = quantize_per_tensor(randn({1, c, 20, 20}, 60 + static_cast<uint64_t>(i)), 0.05f, 0, DType::kU8);
    nchw.push_back(x);
    nhwc.push_back(channels_last(x));
  }
  const Tensor want = cat(nchw, 1), got = cat(nhwc, 1);
  set_num_threads(saved);
  ASSERT_TRUE(got.is_channels_last());
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ(codes_of(got), codes_of(want));
}

TEST(OpsGolden, Cat) {
  struct Case {
    const char* name;
    int n;
    int64_t dim;
  };
  for (const Case& c : {Case{"cat_dim0", 3, 0}, Case{"cat_dim1", 3, 1}, Case{"cat_last", 2, -1},
                        Case{"cat_channels", 3, 1}, Case{"cat_spatial", 2, 2}, Case{"cat_with_empty", 3, 1}}) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    std::vector<Tensor> in, in_strided;
    for (int i = 0; i < c.n; ++i) {
      in.push_back(G(n + ".in" + std::to_string(i)));
      in_strided.push_back(strided(in.back()));
    }
    const Tensor want = G(n + ".out");
    close(cat(in, c.dim), want, n);
    close(cat(in_strided, c.dim), want, n + " strided inputs");
    if (in[0].dim() == 4) {
      std::vector<Tensor> cl, mixed;
      for (int i = 0; i < c.n; ++i) {
        cl.push_back(channels_last(in[i]));
        mixed.push_back(i % 2 ? in[i] : channels_last(in[i]));
      }
      const Tensor y = cat(cl, c.dim);
      close(y, want, n + " channels-last");
      EXPECT_TRUE(y.is_channels_last()) << "cat of channels-last inputs stays channels-last";
      close(cat(mixed, c.dim), want, n + " mixed layouts");
      // Quantized tensors with equal parameters concatenate without requantization.
      std::vector<Tensor> q;
      for (const Tensor& t : in) q.push_back(quantize_per_tensor(t, 0.03f, 128, DType::kU8));
      const Tensor qy = cat(q, c.dim);
      EXPECT_EQ(qy.q_scale(), 0.03f);
      testing::expect_equal(qy, quantize_per_tensor(want, 0.03f, 128, DType::kU8), n + " u8");
    }
  }
  // A single tensor is a copy of itself.
  close(cat({G("cat_dim0.in0")}, 0), G("cat_dim0.in0"), "single tensor");
}

TEST(OpsGolden, Flatten) {
  const Tensor x = G("flatten.x");
  close(flatten(x, 1), G("flatten.from1"), "flatten(x, 1)");
  close(flatten(x), G("flatten.all"), "flatten(x)");
  close(flatten(x, 0, 2), G("flatten.0to2"), "flatten(x, 0, 2)");
  close(flatten(x, -2, -1), G("flatten.last2"), "flatten(x, -2, -1)");
  close(x.flatten(1), G("flatten.from1"), "x.flatten(1)");
  // Logical (NCHW) order, whatever the layout: channels-last needs a copy, not a view.
  close(flatten(channels_last(x), 1), G("flatten.from1"), "channels-last flatten(x, 1)");
  close(flatten(strided(x)), G("flatten.all"), "strided flatten(x)");
  // A contiguous flatten is a view.
  EXPECT_EQ(flatten(x, 1).storage(), x.storage());
}

// Large sums and means, as PyTorch's cascade sum computes them: oneDNN's reference reduction (a
// channels-last input, dims that are not the trailing ones) kept one f32 accumulator per output,
// its vectorized one f32 lanes: 0.02% to 1.7% off on these sums (the whole sum 206133 for 209715).
// Checked against a double-precision sum, relative 1e-6.
TEST(OpsGolden, LargeSumsAndMeansKeepFloatPrecision) {
  const Tensor x = full({2, 4, 512, 512}, 0.1);  // 2^18 terms per (n, c), 2^19 per c, 2^21 in all
  const double t = static_cast<double>(0.1f);
  for (const Tensor& in : {x, x.contiguous(MemoryFormat::kChannelsLast)}) {
    const std::string layout = in.is_contiguous() ? "nchw" : "channels-last";
    auto near = [&](float got, double want) { EXPECT_NEAR(got, want, 1e-6 * want) << layout; };
    for (float h : sum(in, {2, 3}).contiguous().to_vector<float>()) near(h, t * (1 << 18));
    for (float c : sum(in, {0, 2, 3}).to_vector<float>()) near(c, t * (1 << 19));
    near(in.sum().item<float>(), t * (1 << 21));
    near(in.mean().item<float>(), t);
    for (float m : mean(in, {0, 2, 3}).to_vector<float>()) near(m, t);
  }
}

TEST(OpsGolden, Reductions) {
  const Tensor x = G("reduce.x");
  struct Case {
    const char* tag;
    std::vector<int64_t> dims;
    bool keepdim;
  };
  const Case cases[] = {
      {"d1", {1}, false}, {"d23_keep", {2, 3}, true}, {"all", {}, false}, {"dm1", {-1}, false}, {"d02", {0, 2}, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tag);
    const std::string t = c.tag;
    close(mean(x, c.dims, c.keepdim), G("mean." + t), "mean " + t);
    close(sum(x, c.dims, c.keepdim), G("sum." + t), "sum " + t);
    close(dbrq::std(x, c.dims, true, c.keepdim), G("std." + t), "std " + t);
    close(mean(channels_last(x), c.dims, c.keepdim), G("mean." + t), "mean channels-last " + t);
    close(sum(strided(x), c.dims, c.keepdim), G("sum." + t), "sum strided " + t);
    close(dbrq::std(strided(x), c.dims, true, c.keepdim), G("std." + t), "std strided " + t);
    close(dbrq::std(channels_last(x), c.dims, true, c.keepdim), G("std." + t), "std channels-last " + t);
  }
  close(dbrq::std(x, {1}, false, false), G("std.d1_biased"), "std unbiased=false");
}

TEST(OpsGolden, Embedding) {
  const Tensor w = G("embedding.w");
  close(embedding(G("embedding.idx2"), w), G("embedding.out2"), "2-D s64 indices");
  close(embedding(G("embedding.idx1"), w), G("embedding.out1"), "1-D s64 indices");
  close(embedding(G("embedding.idx2").to(DType::kS32), w), G("embedding.out2"), "s32 indices");
  close(embedding(G("embedding.idx2").transpose(0, 1), w), G("embedding.out2").transpose(0, 1), "transposed indices");
  close(embedding(G("embedding.idx1"), col_major(w)), G("embedding.out1"), "column-major weight");
}

// ---- quantization -------------------------------------------------------------------------------

DType dtype_of_case(const std::string& name) { return name.find("_u8") != std::string::npos ? DType::kU8 : DType::kS8; }

TEST(OpsGolden, QuantizePerTensorBitExact) {
  for (const char* name : {"q_u8", "q_s8", "q_u8_ties", "q_s8_ties", "q_u8_saturate", "q_s8_saturate", "q_u8_4d"}) {
    SCOPED_TRACE(name);
    const std::string n = name;
    const DType dt = dtype_of_case(n);
    const Tensor x = G(n + ".x"), want = G(n + ".q");
    ASSERT_EQ(want.dtype(), dt);
    const float scale = G(n + ".scale").item<float>();
    const int32_t zp = G(n + ".zero_point").item<int32_t>();
    const Tensor q = quantize_per_tensor(x, scale, zp, dt);
    ASSERT_EQ(q.dtype(), dt);
    EXPECT_EQ(q.q_scale(), scale);
    EXPECT_EQ(q.q_zero_point(), zp);
    testing::expect_equal(q, want, n);
    testing::expect_equal(quantize_per_tensor(strided(x), scale, zp, dt), want, n + " strided");
    if (x.dim() == 4) {
      const Tensor qcl = quantize_per_tensor(channels_last(x), scale, zp, dt);
      testing::expect_equal(qcl, want, n + " channels-last");
      EXPECT_TRUE(qcl.is_channels_last());
    }
  }
}

TEST(OpsGolden, QuantizePerChannelBitExact) {
  struct Case {
    const char* name;
    int64_t axis;
  };
  for (const Case& c :
       {Case{"qpc_s8_axis0", 0}, Case{"qpc_s8_axis1", 1}, Case{"qpc_u8_axis1", 1}, Case{"qpc_s8_axis_last", 1}}) {
    SCOPED_TRACE(c.name);
    const std::string n = c.name;
    const DType dt = dtype_of_case(n);
    const Tensor x = G(n + ".x"), want = G(n + ".q");
    const std::vector<float> scales = G(n + ".scales").to_vector<float>();
    const std::vector<int32_t> zps = G(n + ".zero_points").to_vector<int32_t>();
    const Tensor q = quantize_per_channel(x, scales, zps, c.axis, dt);
    ASSERT_EQ(q.dtype(), dt);
    ASSERT_TRUE(q.is_quantized());
    EXPECT_EQ(q.qparams()->axis, c.axis);
    EXPECT_EQ(q.qparams()->scales, scales);
    EXPECT_EQ(q.qparams()->zero_points, zps);
    testing::expect_equal(q, want, n);
    // A negative axis names the same dim.
    testing::expect_equal(quantize_per_channel(x, scales, zps, c.axis - x.dim(), dt), want, n + " negative axis");
    testing::expect_equal(quantize_per_channel(strided(x), scales, zps, c.axis, dt), want, n + " strided");
    if (x.dim() == 4) {
      // In channels-last memory the channel is the fastest dim: the kernel must map memory order
      // back to the logical channel.
      testing::expect_equal(quantize_per_channel(channels_last(x), scales, zps, c.axis, dt), want,
                            n + " channels-last");
    }
    if (x.dim() >= 2) {
      testing::expect_equal(quantize_per_channel(col_major(x), scales, zps, c.axis, dt), want, n + " column-major");
    }
  }
}

TEST(OpsGolden, Dequantize) {
  for (const char* name : {"q_u8", "q_s8", "q_u8_ties", "q_s8_saturate", "q_u8_4d"}) {
    SCOPED_TRACE(name);
    const std::string n = name;
    const float scale = G(n + ".scale").item<float>();
    const int32_t zp = G(n + ".zero_point").item<int32_t>();
    const Tensor q = G(n + ".q").with_qparams(QuantParams::per_tensor(scale, zp));
    close(dequantize(q), G(n + ".dq"), n);
    close(q.dequantize(), G(n + ".dq"), n + " method");
    close(dequantize(strided(G(n + ".q")).with_qparams(q.qparams_ptr())), G(n + ".dq"), n + " strided");
    // Round trip through dbrq's own quantize.
    close(dequantize(quantize_per_tensor(G(n + ".x"), scale, zp, dtype_of_case(n))), G(n + ".dq"), n + " round trip");
  }
  for (const auto& [name, axis] : std::vector<std::pair<std::string, int64_t>>{
           {"qpc_s8_axis0", 0}, {"qpc_s8_axis1", 1}, {"qpc_u8_axis1", 1}, {"qpc_s8_axis_last", 1}}) {
    SCOPED_TRACE(name);
    const auto qp = QuantParams::per_channel(G(name + ".scales").to_vector<float>(),
                                             G(name + ".zero_points").to_vector<int32_t>(), axis);
    const Tensor q = G(name + ".q").with_qparams(qp);
    close(dequantize(q), G(name + ".dq"), name);
    if (q.dim() == 4) {
      const Tensor qcl = channels_last(G(name + ".q")).with_qparams(qp);
      close(dequantize(qcl), G(name + ".dq"), name + " channels-last");
    }
  }
}

// Guards against a golden file that silently lost cases (e.g. a script edit that skipped a family).
TEST(OpsGolden, GoldenFileIsComplete) {
  int64_t count = 0;
  for (const auto& [name, t] : goldens()) {
    EXPECT_TRUE(t.defined()) << name;
    ++count;
  }
  EXPECT_GE(count, 300);
  for (const char* prefix :
       {"conv_", "linear_", "mm_",  "bin_",     "scalar.", "unary.", "softmax.", "log_softmax.", "ln_", "bn_", "mp_",
        "ap_",   "aap_",    "cat_", "flatten.", "mean.",   "sum.",   "std.",     "embedding.",   "q_",  "qpc_"}) {
    bool found = false;
    for (const auto& [name, t] : goldens()) found = found || name.rfind(prefix, 0) == 0;
    EXPECT_TRUE(found) << "no golden tensors start with " << prefix;
  }
}

}  // namespace
}  // namespace dbrq
