// dbrq's int8 kernels against PyTorch 1.13's quantized ops on the onednn engine, case by case, on
// the same codes and quantization parameters (tests/int8/golden/int8_ops.safetensors, written by
// make_int8_goldens.py). Every case must give bit-identical u8 codes on at least 99.9% of its
// elements and never be more than 1 LSB off; each case prints its match rate.
//
// conv2d and linear are oneDNN primitives in both runtimes. add, mul, cat, pooling, clamps, the
// elementwise activations, softmax and (de/re)quantization are PyTorch's own CPU kernels: dbrq
// mirrors their arithmetic (FMA dequantization, reciprocal scales, round half to even). matmul of
// two activations has no int8 kernel in PyTorch: the reference is FX's lowering (dequantize, fp32
// matmul, quantize), which dbrq replaces by a oneDNN u8 x s8 matmul.
//
// Ops are driven the way a converted model drives them (tracer/convert.cc, tracer/executors.cc):
// the same kernel classes, the same tables (elementwise_fn through make_lut), the same input
// preparation (prepare_input).
#include <gtest/gtest.h>


#include <array>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dbrq.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "core/op_shapes.h"
#include "runtime/op_registry.h"
#include "tests/test_util.h"
#include "tracer/executors.h"

namespace {

using dbrq::DType;
using dbrq::MemoryFormat;
using dbrq::OpKind;
using dbrq::QuantParams;
using dbrq::QuantParamsPtr;
using dbrq::Tensor;
namespace kernels = dbrq::kernels;

constexpr char kGolden[] = "tests/int8/golden/int8_ops.safetensors";
constexpr double kMinIdentical = 0.999;  // fraction of bit-identical codes per case

const std::map<std::string, Tensor>& golden_file() {
  static const auto* g = new std::map<std::string, Tensor>(dbrq::testing::load_golden(kGolden));
  return *g;
}

const std::map<std::string, std::string>& golden_meta() {
  static const auto* m = new std::map<std::string, std::string>(dbrq::load_safetensors_metadata(kGolden));
  return *m;
}

// Cases the tests below have run; CoversEveryGoldenCase checks that none was left out.
std::set<std::string>& tested_cases() {
  static std::set<std::string> s;
  return s;
}

Tensor g(const std::string& name) { return dbrq::testing::golden(golden_file(), name); }

QuantParamsPtr qparams_of(const std::string& c, const std::string& role) {
  return QuantParams::per_tensor(g(c + "." + role + "_scale").item<float>(),
                                 g(c + "." + role + "_zp").item<int32_t>());
}

// The u8 codes of `role` as a quantized tensor, in `format` (the golden holds NCHW order).
Tensor qinput(const std::string& c, const std::string& role, MemoryFormat format = MemoryFormat::kContiguous) {
  Tensor codes = g(c + "." + role).with_qparams(qparams_of(c, role));
  return format == MemoryFormat::kContiguous ? codes : kernels::copy(codes, format, DType::kU8);
}

QuantParamsPtr weight_qparams(const std::string& c) {
  const std::vector<float> s = g(c + ".w_scales").to_vector<float>();
  const std::vector<int32_t> z = g(c + ".w_zps").to_vector<int32_t>();
  if (s.size() == 1) return QuantParams::per_tensor(s[0], z[0]);
  return QuantParams::per_channel(s, z, 0);
}

// Starts a case: its metadata must be the description the test holds (same parameters on both
// sides), and the case counts as covered.
void begin_case(const std::string& c, const std::string& desc) {
  tested_cases().insert(c);
  auto it = golden_meta().find(c);
  ASSERT_NE(it, golden_meta().end()) << "case " << c << " is not in " << kGolden;
  EXPECT_EQ(it->second, desc) << "case " << c << ": the script and the test describe different parameters";
}

struct MatchStats {
  int64_t n = 0, identical = 0, off_by_one = 0, worse = 0, max_diff = 0;
  double rate() const { return n == 0 ? 1.0 : static_cast<double>(identical) / static_cast<double>(n); }
};

MatchStats match(const Tensor& actual, const Tensor& expected) {
  MatchStats m;
  const std::vector<int32_t> a = dbrq::testing::codes(actual), e = dbrq::testing::codes(expected);
  m.n = static_cast<int64_t>(e.size());
  for (size_t i = 0; i < a.size() && i < e.size(); ++i) {
    const int64_t d = std::abs(static_cast<int64_t>(a[i]) - e[i]);
    m.identical += d == 0;
    m.off_by_one += d == 1;
    m.worse += d > 1;
    m.max_diff = std::max(m.max_diff, d);
  }
  return m;
}

void report(const std::string& label, const MatchStats& m) {
  std::cout << "[ int8     ] " << std::left << std::setw(34) << label << std::right << std::setw(6) << m.identical << "/"
            << std::setw(6) << m.n << " identical (" << std::fixed << std::setprecision(3) << 100.0 * m.rate()
            << "%), " << m.off_by_one << " off by 1 LSB, " << m.worse << " worse" << std::endl;
}

// The gate every case passes: same sizes and qparams, >= 99.9% bit-identical, nothing > 1 LSB off.
//
// `pytorch_scalar_tail`: PyTorch's elementwise CPU kernels (add, mul, activations) run a vector
// loop over 2 x 32 u8 lanes (AVX2) and a scalar loop over the last numel % 64 elements of a
// contiguous tensor; the scalar loop dequantizes without an FMA, so on exact ties those elements
// round differently from the rest of the same tensor. dbrq computes every element like the vector
// loop. For a case built on ties, the last `pytorch_scalar_tail` elements are reported separately:
// they must be within 1 LSB, the rest must meet the usual gate.
void expect_codes(const std::string& c, const Tensor& actual, int64_t pytorch_scalar_tail = 0) {
  SCOPED_TRACE(c);
  const Tensor expected = g(c + ".out");
  ASSERT_TRUE(actual.defined());
  ASSERT_EQ(actual.sizes(), expected.sizes()) << actual.shape_string() << " vs " << expected.shape_string();
  ASSERT_EQ(actual.dtype(), DType::kU8);
  ASSERT_TRUE(actual.is_quantized());
  const QuantParamsPtr out = qparams_of(c, "out");
  EXPECT_EQ(actual.q_scale(), out->scale());
  EXPECT_EQ(actual.q_zero_point(), out->zero_point());
  const MatchStats all = match(actual, expected);
  report(c, all);
  EXPECT_EQ(all.worse, 0) << "max difference " << all.max_diff << " LSB";
  if (pytorch_scalar_tail == 0) {
    EXPECT_GE(all.rate(), kMinIdentical) << all.n - all.identical << " of " << all.n << " codes differ";
    return;
  }
  const int64_t n = expected.numel(), head = n - pytorch_scalar_tail;
  const Tensor a = actual.reshape({n}), e = expected.reshape({n});
  const MatchStats vec = match(a.narrow(0, 0, head), e.narrow(0, 0, head));
  const MatchStats tail = match(a.narrow(0, head, pytorch_scalar_tail), e.narrow(0, head, pytorch_scalar_tail));
  report("  PyTorch vector loop", vec);
  report("  PyTorch scalar tail (no FMA)", tail);
  EXPECT_GE(vec.rate(), kMinIdentical) << vec.n - vec.identical << " of " << vec.n << " codes differ";
}

std::string yes(bool b) { return b ? "1" : "0"; }

// ---------------------------------------------------------------------------------------------
// conv2d and linear (oneDNN in both)

struct ConvCase {
  const char* name;
  int64_t kernel, stride, padding, dilation, groups;
  bool bias, relu, per_channel, relu6;
};

constexpr ConvCase kConvCases[] = {
    // name                  k  s  p  d  g   bias   relu   per_ch relu6
    {"conv3x3_pad1",         3, 1, 1, 1, 1,  true,  false, true,  false},
    {"conv3x3_pad1_relu",    3, 1, 1, 1, 1,  true,  true,  true,  false},
    {"conv7x7_s2_c3",        7, 2, 3, 1, 1,  true,  false, true,  false},  // input zero point 114
    {"conv7x7_s2_c3_nobias", 7, 2, 3, 1, 1,  false, false, true,  false},
    {"conv1x1",              1, 1, 0, 1, 1,  false, false, true,  false},
    {"conv1x1_s2_bias",      1, 2, 0, 1, 1,  true,  false, true,  false},
    {"conv_grouped",         3, 1, 1, 1, 4,  true,  false, true,  false},
    {"conv_depthwise_relu",  3, 2, 1, 1, 16, true,  true,  true,  false},
    {"conv_dilated",         3, 1, 2, 2, 1,  true,  false, true,  false},
    {"conv3x3_per_tensor",   3, 1, 1, 1, 1,  true,  false, false, false},
    {"conv3x3_zp0",          3, 1, 1, 1, 1,  true,  false, true,  false},  // input zero point 0
    {"conv3x3_relu6",        3, 1, 1, 1, 1,  true,  false, true,  true},   // PyTorch: conv, then relu6
};

std::string conv_desc(const ConvCase& c) {
  std::ostringstream s;
  s << "conv2d kernel=" << c.kernel << " stride=" << c.stride << " padding=" << c.padding
    << " dilation=" << c.dilation << " groups=" << c.groups << " bias=" << yes(c.bias) << " relu=" << yes(c.relu)
    << " per_channel=" << yes(c.per_channel) << " relu6=" << yes(c.relu6);
  return s.str();
}

kernels::QConvOptions conv_options(const ConvCase& c, const QuantParamsPtr& dst) {
  const std::string n = c.name;
  kernels::QConvOptions o;
  o.params.stride = {c.stride, c.stride};
  o.params.padding = {c.padding, c.padding};
  o.params.dilation = {c.dilation, c.dilation};
  o.params.groups = c.groups;
  o.weight = g(n + ".w");
  if (c.bias) o.bias = g(n + ".b");
  o.weight_qparams = weight_qparams(n);
  o.src_qparams = qparams_of(n, "x");
  o.dst_qparams = dst;
  if (c.relu) o.post = {kernels::PostOp::relu()};
  return o;
}

TEST(Int8OpsGolden, Conv2d) {
  for (const ConvCase& c : kConvCases) {
    const std::string n = c.name;
    begin_case(n, conv_desc(c));
    SCOPED_TRACE(n);
    kernels::QConv2d conv(conv_options(c, qparams_of(n, "out")));
    // dbrq quantizes the f32 weights itself: the codes must be PyTorch's.
    dbrq::testing::expect_equal(conv.quantized_weight(), g(n + ".wq"), n + " weight codes");
    for (MemoryFormat f : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
      Tensor y = conv.run(qinput(n, "x", f));
      if (c.relu6) y = kernels::qclamp(y, 0.0, 6.0);  // the unfused equivalent of PyTorch's graph
      expect_codes(n, y);
    }
  }
}

// dbrq fuses relu6 into the conv as a clip post-op on real values (PyTorch has no fused relu6):
// the same result up to the rounding of the two-step scaling.
TEST(Int8OpsGolden, Conv2dFusedRelu6AgreesWithUnfused) {
  const ConvCase& c = kConvCases[std::size(kConvCases) - 1];
  ASSERT_TRUE(c.relu6);
  const std::string n = c.name;
  kernels::QConvOptions o = conv_options(c, qparams_of(n, "out"));
  o.post = {kernels::PostOp::clip(0.f, 6.f)};
  kernels::QConv2d conv(std::move(o));
  const Tensor y = conv.run(qinput(n, "x"));
  const MatchStats m = match(y, g(n + ".out"));
  report(n + " (fused clip)", m);
  EXPECT_GE(m.rate(), 0.99);
  EXPECT_EQ(m.worse, 0);
}

struct LinearCase {
  const char* name;
  bool bias, relu, per_channel;
};

constexpr LinearCase kLinearCases[] = {
    {"linear", true, false, true},
    {"linear_relu", true, true, true},
    {"linear_nobias_3d", false, false, true},  // [2, 3, 40] input
    {"linear_per_tensor", true, false, false},
};

TEST(Int8OpsGolden, Linear) {
  for (const LinearCase& c : kLinearCases) {
    const std::string n = c.name;
    begin_case(n, "linear bias=" + yes(c.bias) + " relu=" + yes(c.relu) + " per_channel=" + yes(c.per_channel));
    SCOPED_TRACE(n);
    kernels::QLinearOptions o;
    o.weight = g(n + ".w");
    if (c.bias) o.bias = g(n + ".b");
    o.weight_qparams = weight_qparams(n);
    o.src_qparams = qparams_of(n, "x");
    o.dst_qparams = qparams_of(n, "out");
    if (c.relu) o.post = {kernels::PostOp::relu()};
    kernels::QLinear linear(std::move(o));
    dbrq::testing::expect_equal(linear.quantized_weight(), g(n + ".wq"), n + " weight codes");
    expect_codes(n, linear.run(qinput(n, "x")));
  }
}

// ---------------------------------------------------------------------------------------------
// add, mul, cat (PyTorch CPU kernels)

TEST(Int8OpsGolden, AddMul) {
  struct Case {
    const char* name;
    const char* op;
    bool channels_last;
  };
  for (const Case& c : {Case{"add", "add", false}, Case{"add_relu", "add_relu", false}, Case{"add_nhwc", "add", true},
                        Case{"add_ties", "add", false},
                        Case{"mul", "mul", false}, Case{"mul_relu", "mul_relu", false}}) {
    const std::string n = c.name, op = c.op;
    begin_case(n, op + " channels_last=" + yes(c.channels_last));
    const MemoryFormat f = c.channels_last ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
    const Tensor a = qinput(n, "x", f), b = qinput(n, "y", f);
    const bool relu = op.find("relu") != std::string::npos;
    const Tensor y = op.rfind("add", 0) == 0 ? kernels::qadd(a, b, qparams_of(n, "out"), relu)
                                             : kernels::qmul(a, b, qparams_of(n, "out"), relu);
    // add_ties: contiguous, 2592 elements, so PyTorch's last 2592 % 64 = 32 take its scalar loop.
    expect_codes(n, y, n == "add_ties" ? y.numel() % 64 : 0);
  }
}

TEST(Int8OpsGolden, Cat) {
  for (bool shared : {true, false}) {
    const std::string n = shared ? "cat_shared" : "cat_requant";
    begin_case(n, "cat dim=1 shared=" + yes(shared));
    // As CatExec: every input is brought to the shared output parameters, then concatenated.
    const dbrq::tracer::InputSpec spec{qparams_of(n, "out"), MemoryFormat::kPreserve};
    const Tensor a = dbrq::tracer::prepare_input(qinput(n, "x"), spec);
    const Tensor b = dbrq::tracer::prepare_input(qinput(n, "y"), spec);
    const Tensor* parts[] = {&a, &b};
    expect_codes(n, kernels::cat(parts, 1));
  }
}

// ---------------------------------------------------------------------------------------------
// pooling (PyTorch CPU kernels; the NCHW and NHWC inputs take different code paths there)

TEST(Int8OpsGolden, MaxPool2d) {
  struct Case {
    const char* name;
    int64_t k, s, p;
    bool channels_last;
  };
  for (const Case& c : {Case{"max_pool3x3_s2", 3, 2, 1, false}, Case{"max_pool2x2", 2, 2, 0, true}}) {
    const std::string n = c.name;
    std::ostringstream d;
    d << "max_pool2d kernel=" << c.k << " stride=" << c.s << " padding=" << c.p;
    begin_case(n, d.str());
    dbrq::Pool2dParams p;
    p.kernel_size = {c.k, c.k};
    p.stride = {c.s, c.s};
    p.padding = {c.p, c.p};
    expect_codes(n, kernels::max_pool2d(qinput(n, "x", c.channels_last ? MemoryFormat::kChannelsLast
                                                                        : MemoryFormat::kContiguous),
                                        p));
  }
}

TEST(Int8OpsGolden, AvgPool2d) {
  struct Case {
    const char* base;
    int64_t k, s, p;
    bool include_pad;
  };
  for (bool cl : {false, true}) {
    const std::string suffix = cl ? "_nhwc" : "";
    const MemoryFormat f = cl ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
    for (const Case& c : {Case{"avg_pool3x3_s2_incl1", 3, 2, 1, true}, Case{"avg_pool3x3_s2_incl0", 3, 2, 1, false},
                          Case{"avg_pool2x2", 2, 2, 0, true}}) {
      const std::string n = c.base + suffix;
      std::ostringstream d;
      d << "avg_pool2d kernel=" << c.k << " stride=" << c.s << " padding=" << c.p
        << " count_include_pad=" << yes(c.include_pad) << " channels_last=" << yes(cl);
      begin_case(n, d.str());
      dbrq::Pool2dParams p;
      p.kernel_size = {c.k, c.k};
      p.stride = {c.s, c.s};
      p.padding = {c.p, c.p};
      p.count_include_pad = c.include_pad;
      expect_codes(n, kernels::qavg_pool2d(qinput(n, "x", f), p));
    }
    for (std::array<int64_t, 2> os : {std::array<int64_t, 2>{1, 1}, {3, 2}, {4, 5}}) {
      std::ostringstream name, d;
      name << "adaptive_avg_pool_" << os[0] << "x" << os[1] << suffix;
      d << "adaptive_avg_pool2d output=" << os[0] << "," << os[1] << " channels_last=" << yes(cl);
      begin_case(name.str(), d.str());
      expect_codes(name.str(), kernels::qadaptive_avg_pool2d(qinput(name.str(), "x", f), os));
    }
    const std::string n = "adaptive_avg_pool_6x41win" + suffix;  // 12 x 82 -> 2 x 2
    begin_case(n, "adaptive_avg_pool2d output=2,2 channels_last=" + yes(cl));
    expect_codes(n, kernels::qadaptive_avg_pool2d(qinput(n, "x", f), {2, 2}));
  }
}

// ---------------------------------------------------------------------------------------------
// activations

// relu / relu6 / hardtanh keep the input's parameters: clamps on codes (as ShareExec runs them).
TEST(Int8OpsGolden, Clamps) {
  struct Case {
    const char* name;
    const char* desc;
    double lo, hi;
  };
  const double inf = std::numeric_limits<double>::infinity();
  for (const Case& c : {Case{"relu", "relu", 0.0, inf}, Case{"relu6", "relu6", 0.0, 6.0},
                        Case{"relu6_saturating", "relu6", 0.0, 6.0},
                        Case{"hardtanh", "hardtanh min=-0.5 max=1", -0.5, 1.0}}) {
    begin_case(c.name, c.desc);
    expect_codes(c.name, kernels::qclamp(qinput(c.name, "x"), c.lo, c.hi));
  }
}

// Elementwise functions with their own output parameters: the 256-entry tables convert() builds
// (make_lut over the reference function of the op's OpDef eltwise).
TEST(Int8OpsGolden, LookupTableActivations) {
  struct Case {
    const char* name;
    const char* desc;
    OpKind kind;
    std::optional<dbrq::ActivationParams> params;
  };
  auto act = [](double alpha, bool tanh_approx) {
    dbrq::ActivationParams p;
    p.alpha = alpha;
    p.approximate_tanh = tanh_approx;
    return std::optional<dbrq::ActivationParams>(p);
  };
  const Case cases[] = {
      {"sigmoid", "sigmoid", OpKind::kSigmoid, {}},
      {"sigmoid_wide", "sigmoid", OpKind::kSigmoid, {}},
      {"tanh", "tanh", OpKind::kTanh, {}},
      {"hardsigmoid", "hardsigmoid", OpKind::kHardsigmoid, {}},
      {"hardswish", "hardswish", OpKind::kHardswish, {}},
      {"leaky_relu", "leaky_relu slope=0.1", OpKind::kLeakyRelu, act(0.1, false)},
      {"leaky_relu_ties", "leaky_relu slope=0.5", OpKind::kLeakyRelu, act(0.5, false)},
      {"gelu", "gelu", OpKind::kGelu, act(0.0, false)},
      {"gelu_tanh", "gelu approximate=tanh", OpKind::kGelu, act(0.0, true)},
      {"elu", "elu alpha=1", OpKind::kElu, act(1.0, false)},
      {"elu_alpha", "elu alpha=0.5", OpKind::kElu, act(0.5, false)},
  };
  for (const Case& c : cases) {
    begin_case(c.name, c.desc);
    const QuantParamsPtr in = qparams_of(c.name, "x"), out = qparams_of(c.name, "out");
    const kernels::Eltwise e = dbrq::op_def(c.kind).eltwise(c.params ? &*c.params : nullptr);
    const kernels::Lut lut = kernels::make_lut(*in, *out, [e](float x) { return kernels::eltwise_reference(e, x); });
    expect_codes(c.name, kernels::apply_lut(qinput(c.name, "x"), lut, out));
  }
}

TEST(Int8OpsGolden, Softmax) {
  for (auto [name, dim] : {std::pair<const char*, int64_t>{"softmax", 3}, {"softmax_dim1", 1}}) {
    begin_case(name, "softmax dim=" + std::to_string(dim));
    expect_codes(name, kernels::qsoftmax(qinput(name, "x"), dim, qparams_of(name, "out")));
  }
}

// ---------------------------------------------------------------------------------------------
// quantize / dequantize / requantize

TEST(Int8OpsGolden, QuantizePerTensor) {
  const std::string n = "quantize";
  begin_case(n, "quantize_per_tensor");
  const Tensor xf = g(n + ".xf");
  const QuantParamsPtr qp = qparams_of(n, "out");
  // quantize_to: what a converted model runs on fp32 arrivals (NCHW -> NHWC for a conv input too).
  expect_codes(n, kernels::quantize_to(xf, qp, DType::kU8, MemoryFormat::kPreserve));
  expect_codes(n, kernels::quantize_to(xf, qp, DType::kU8, MemoryFormat::kChannelsLast));
  expect_codes(n, kernels::quantize(xf, qp, DType::kU8));
}

TEST(Int8OpsGolden, Dequantize) {
  const std::string n = "dequantize";
  begin_case(n, "dequantize");
  const Tensor actual = kernels::dequantize(qinput(n, "x"));
  const std::vector<float> a = actual.to_vector<float>(), e = g(n + ".outf").to_vector<float>();
  ASSERT_EQ(a.size(), e.size());
  int64_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += std::memcmp(&a[i], &e[i], sizeof(float)) == 0;
  std::cout << "[ int8     ] " << std::left << std::setw(34) << n << std::right << std::setw(6) << same << "/"
            << std::setw(6) << a.size() << " bit-identical f32 values" << std::endl;
  EXPECT_EQ(same, static_cast<int64_t>(a.size()));
}

TEST(Int8OpsGolden, Requantize) {
  for (const char* n : {"requantize", "requantize_coarser", "requantize_ties"}) {
    begin_case(n, "requantize");
    const QuantParamsPtr qp = qparams_of(n, "out");
    expect_codes(n, kernels::requantize(qinput(n, "x"), qp));
    // prepare_input: the path a u8 tensor with other parameters takes into an int8 op.
    expect_codes(n, dbrq::tracer::prepare_input(qinput(n, "x"), dbrq::tracer::InputSpec{qp, MemoryFormat::kPreserve}));
  }
}

// ---------------------------------------------------------------------------------------------
// matmul of two activations (reference: FX's dequantize -> fp32 matmul -> quantize)

TEST(Int8OpsGolden, Matmul) {
  for (const char* n : {"matmul", "matmul_bcast"}) {
    begin_case(n, "matmul reference=fx");
    kernels::QMatmul mm(qparams_of(n, "x"), qparams_of(n, "y"), qparams_of(n, "out"), /*dynamic=*/false);
    expect_codes(n, mm.run(qinput(n, "x"), qinput(n, "y")));
  }
}

// ---------------------------------------------------------------------------------------------
// issue 12 op families: stack (as CatExec runs it), clamp (the registry's int8 form: a clamp on
// codes), pad and repeat (their eager kernels on codes, as ShareExec runs them)

TEST(Int8OpsGolden, Stack) {
  for (auto [n, dim] : {std::pair<const char*, int64_t>{"stack_requant", 1}, {"stack_last", -1}}) {
    begin_case(n, "stack dim=" + std::to_string(dim));
    const dbrq::tracer::InputSpec spec{qparams_of(n, "out"), MemoryFormat::kPreserve};
    const Tensor a = dbrq::tracer::prepare_input(qinput(n, "x"), spec);
    const Tensor b = dbrq::tracer::prepare_input(qinput(n, "y"), spec);
    expect_codes(n, dbrq::stack({a, b}, dim));
  }
}

TEST(Int8OpsGolden, Clamp) {
  for (auto [n, desc, lo, hi] : {std::tuple<const char*, const char*, double, double>{"clamp", "clamp min=-1.5 max=2", -1.5, 2.0},
                                 {"clamp_narrow", "clamp min=0.3 max=0.9", 0.3, 0.9}}) {
    begin_case(n, desc);
    const dbrq::OpDef& d = dbrq::op_def(OpKind::kClamp);
    ASSERT_EQ(d.role, dbrq::QuantRole::kShare);
    dbrq::ActivationParams p;
    p.alpha = lo;
    p.beta = hi;
    expect_codes(n, d.int8_share(qinput(n, "x"), &p));
  }
}

TEST(Int8OpsGolden, PadRepeat) {
  struct Case {
    const char* name;
    const char* desc;
    std::vector<int64_t> pads;
    dbrq::PadMode mode;
    double value;
    MemoryFormat format;
  };
  const Case cases[] = {
      {"pad_constant", "pad pads=1,2,0,1 mode=constant value=0.55", {1, 2, 0, 1}, dbrq::PadMode::kConstant, 0.55,
       MemoryFormat::kContiguous},
      {"pad_constant_zero", "pad pads=2,2,2,2 mode=constant value=0", {2, 2, 2, 2}, dbrq::PadMode::kConstant, 0.0,
       MemoryFormat::kChannelsLast},
      {"pad_reflect", "pad pads=3,1,2,2 mode=reflect value=0", {3, 1, 2, 2}, dbrq::PadMode::kReflect, 0.0,
       MemoryFormat::kContiguous},
      {"pad_replicate", "pad pads=1,2,3,0 mode=replicate value=0", {1, 2, 3, 0}, dbrq::PadMode::kReplicate, 0.0,
       MemoryFormat::kChannelsLast},
  };
  for (const Case& c : cases) {
    begin_case(c.name, c.desc);
    expect_codes(c.name, dbrq::pad(qinput(c.name, "x", c.format), c.pads, c.mode, c.value));
  }
  begin_case("repeat", "repeat repeats=1,2,1,3");
  expect_codes("repeat", qinput("repeat", "x").repeat({1, 2, 1, 3}));
}

// prelu: kernels::QPReLU (what convert builds) with PyTorch's per-tensor quint8 weight parameters.
TEST(Int8OpsGolden, Prelu) {
  for (auto [n, count] : {std::pair<const char*, int>{"prelu", 8}, {"prelu_one", 1}}) {
    begin_case(n, "prelu weights=" + std::to_string(count));
    // PyTorch's weights are quint8 with a zero point; dbrq's are s8 symmetric with the same scale:
    // the same integers (q_w - zp_w), so the same arithmetic.
    const QuantParamsPtr wq = qparams_of(n, "w");
    std::vector<float> w;
    std::vector<int32_t> centered;
    for (int32_t code : g(std::string(n) + ".w_codes").to_vector<int32_t>()) {
      centered.push_back(code - wq->zero_point());
      w.push_back(static_cast<float>(code - wq->zero_point()) * wq->scale());
    }
    kernels::QWeightedOptions o;
    o.weight = dbrq::from_vector<float>(w);
    o.weight_qparams = QuantParams::per_tensor(wq->scale(), 0);
    o.src_qparams = qparams_of(n, "x");
    o.dst_qparams = qparams_of(n, "out");
    kernels::QPReLU k(o);
    EXPECT_EQ(k.quantized_weight().dtype(), DType::kS8);
    EXPECT_EQ(k.quantized_weight().int_repr().to_vector<int32_t>(), centered);
    expect_codes(n, k.run(qinput(n, "x")));
    expect_codes(n, k.run(qinput(n, "x", MemoryFormat::kChannelsLast)));
    // Dense permuted memory: channels found by row-major arithmetic got other channels' tables.
    expect_codes(n, k.run(qinput(n, "x").transpose(1, 2).contiguous().transpose(1, 2)));
  }
}

// softplus and mish: the tables convert() builds, against FX's dequantize -> fp32 -> quantize.
TEST(Int8OpsGolden, SoftplusMish) {
  struct Case {
    const char* name;
    const char* desc;
    OpKind kind;
    double beta, threshold;
  };
  for (const Case& c : {Case{"softplus", "softplus beta=1 threshold=20 reference=fx_fma", OpKind::kSoftplus, 1.0, 20.0},
                        Case{"softplus_beta", "softplus beta=2 threshold=3 reference=fx_fma", OpKind::kSoftplus, 2.0, 3.0},
                        Case{"mish", "mish reference=fx_fma", OpKind::kMish, 0.0, 0.0}}) {
    begin_case(c.name, c.desc);
    dbrq::ActivationParams p;
    p.alpha = c.beta;
    p.beta = c.threshold;
    ASSERT_EQ(dbrq::op_def(c.kind).role, dbrq::QuantRole::kLut);
    const QuantParamsPtr in = qparams_of(c.name, "x"), out = qparams_of(c.name, "out");
    const kernels::Eltwise e = dbrq::op_def(c.kind).eltwise(&p);
    const kernels::Lut lut = kernels::make_lut(*in, *out, [e](float x) { return kernels::eltwise_reference(e, x); });
    expect_codes(c.name, kernels::apply_lut(qinput(c.name, "x"), lut, out));
  }
}

// ---------------------------------------------------------------------------------------------
// batch_norm on its own (+ relu): the OpDef's int8_affine kernel, as ChannelAffineExec builds it

TEST(Int8OpsGolden, BatchNorm) {
  struct Case {
    const char* name;
    bool relu, affine;
    double eps;
  };
  const Case cases[] = {
      {"bn2d", false, true, 1e-5},   {"bn2d_relu", true, true, 1e-5}, {"bn2d_no_affine", false, false, 1e-3},
      {"bn1d", false, true, 1e-5},   {"bn1d_ncl_relu", true, true, 1e-5},
  };
  for (const Case& c : cases) {
    const std::string n = c.name;
    std::ostringstream desc;
    desc << "batch_norm relu=" << yes(c.relu) << " affine=" << yes(c.affine) << " eps=" << c.eps;
    begin_case(n, desc.str());
    std::vector<Tensor> stats = {g(n + ".mean"), g(n + ".var"), c.affine ? g(n + ".w") : Tensor(),
                                 c.affine ? g(n + ".b") : Tensor()};
    dbrq::NormParams p;
    p.eps = c.eps;
    const auto k = dbrq::op_def(OpKind::kBatchNorm).int8_affine(stats, &p, qparams_of(n, "x"), qparams_of(n, "out"),
                                                                  c.relu);
    const Tensor x = qinput(n, "x");
    // Row-major input (one channel's positions at a time) and, for 4-D, channels-last (a pixel's
    // channels at a time: what follows a conv or pool in a converted model).
    expect_codes(n, k->run(x));
    if (x.dim() == 4) expect_codes(n, k->run(qinput(n, "x", MemoryFormat::kChannelsLast)));
  }
}

// Last (gtest runs tests in definition order): every case in the file was checked by a test above.
// ---------------------------------------------------------------------------------------------
// conv_transpose2d (oneDNN deconvolution in both; PyTorch 1.13: per-tensor weights, no output_padding)

struct ConvTCase {
  const char* name;
  int64_t kernel, stride, padding, dilation, groups;
  bool bias;
};

constexpr ConvTCase kConvTCases[] = {
    {"convt_k3_s2_p1", 3, 2, 1, 1, 1, true},
    {"convt_dcgan_k4_s2_p1", 4, 2, 1, 1, 1, false},  // input zero point 0
    {"convt_grouped", 3, 1, 1, 1, 2, true},
    {"convt_dilated", 3, 1, 0, 2, 1, true},  // input zero point 200
};

TEST(Int8OpsGolden, ConvTranspose2d) {
  for (const ConvTCase& c : kConvTCases) {
    const std::string n = c.name;
    std::ostringstream desc;
    desc << "conv_transpose2d kernel=" << c.kernel << " stride=" << c.stride << " padding=" << c.padding
         << " dilation=" << c.dilation << " groups=" << c.groups << " bias=" << yes(c.bias);
    begin_case(n, desc.str());
    SCOPED_TRACE(n);
    kernels::QConvTranspose2dOptions o;
    o.params.stride = {c.stride, c.stride};
    o.params.padding = {c.padding, c.padding};
    o.params.dilation = {c.dilation, c.dilation};
    o.params.groups = c.groups;
    // What convert() does: the op's int8_weight_layout (output-major), then quantization.
    o.weight = kernels::deconv_weight_output_major(g(n + ".w"), c.groups);
    if (c.bias) o.bias = g(n + ".b");
    o.weight_qparams = weight_qparams(n);
    o.src_qparams = qparams_of(n, "x");
    o.dst_qparams = qparams_of(n, "out");
    kernels::QConvTranspose2d conv(std::move(o));
    // dbrq quantizes the f32 weights itself: the codes must be PyTorch's (in output-major order).
    const Tensor want_wq = kernels::deconv_weight_output_major(kernels::copy(g(n + ".wq"), MemoryFormat::kContiguous,
                                                                            DType::kF32), c.groups);
    dbrq::testing::expect_equal(kernels::copy(conv.quantized_weight(), MemoryFormat::kContiguous, DType::kF32),
                                want_wq, n + " weight codes");
    for (MemoryFormat f : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
      expect_codes(n, conv.run(qinput(n, "x", f)));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// conv1d (oneDNN in both: dbrq's QConv1d is QConv2d with H = 1) and 1-D pooling, through the
// OpDefs' int8 forms as the converted model runs them.

struct Conv1dCase {
  const char* name;
  int64_t kernel, stride, padding, dilation, groups;
  bool bias, relu, per_channel;
};

constexpr Conv1dCase kConv1dCases[] = {
    {"c1d_k3_p1", 3, 1, 1, 1, 1, true, false, true},
    {"c1d_k5_s2_relu", 5, 2, 2, 1, 1, true, true, true},
    {"c1d_depthwise_dil2", 3, 1, 2, 2, 8, true, false, true},  // input zero point 0
    {"c1d_per_tensor", 3, 1, 0, 1, 1, true, false, false},
};

TEST(Int8OpsGolden, Conv1d) {
  for (const Conv1dCase& c : kConv1dCases) {
    const std::string n = c.name;
    std::ostringstream desc;
    desc << "conv1d kernel=" << c.kernel << " stride=" << c.stride << " padding=" << c.padding
         << " dilation=" << c.dilation << " groups=" << c.groups << " bias=" << yes(c.bias) << " relu=" << yes(c.relu)
         << " per_channel=" << yes(c.per_channel);
    begin_case(n, desc.str());
    SCOPED_TRACE(n);
    kernels::QConv1dOptions o;
    o.params = {c.stride, c.padding, c.dilation, c.groups};
    o.weight = g(n + ".w");
    if (c.bias) o.bias = g(n + ".b");
    o.weight_qparams = weight_qparams(n);
    o.src_qparams = qparams_of(n, "x");
    o.dst_qparams = qparams_of(n, "out");
    if (c.relu) o.post = {kernels::PostOp::relu()};
    kernels::QConv1d conv(std::move(o));
    dbrq::testing::expect_equal(conv.quantized_weight(), g(n + ".wq"), n + " weight codes");
    const Tensor y = conv.run(qinput(n, "x"));
    expect_codes(n, y);
    // conv1d outputs are channels-last 3-D (strides (L*C, 1, C)); such an input gives the same codes.
    EXPECT_EQ(y.stride(1), 1);
    const Tensor x_cl = qinput(n, "x").permute({0, 2, 1}).contiguous().permute({0, 2, 1});
    ASSERT_EQ(x_cl.stride(1), 1);
    expect_codes(n, conv.run(x_cl));
  }
}

TEST(Int8OpsGolden, Pool1d) {
  using dbrq::op_def;
  {
    const std::string n = "max_pool1d_k3_s2_p1";
    begin_case(n, "max_pool1d kernel=3 stride=2 padding=1");
    const Tensor x = qinput(n, "x");
    // kShare without int8_share: the eager kernel takes the u8 codes.
    expect_codes(n, dbrq::max_pool1d(x, 3, 2, 1));
  }
  struct Avg {
    const char* name;
    int64_t k, s, p;
  };
  for (const Avg& c : {Avg{"avg_pool1d_k3_s2_p1", 3, 2, 1}, Avg{"avg_pool1d_k4_nopad", 4, 4, 0}}) {
    const std::string n = c.name;
    std::ostringstream d;
    d << "avg_pool1d kernel=" << c.k << " stride=" << c.s << " padding=" << c.p;
    begin_case(n, d.str());
    const Tensor x = qinput(n, "x");
    const dbrq::Pool2dParams p = dbrq::pool1d_params("avg_pool1d", x, c.k, c.s, c.p, 1, false, true);
    expect_codes(n, op_def(OpKind::kAvgPool1d).int8_share(x, &p));
  }
  const std::string n = "adaptive_avg_pool1d_5";
  begin_case(n, "adaptive_avg_pool1d output=5");
  dbrq::AdaptivePool2dParams p;
  p.output_size = {1, 5};
  expect_codes(n, op_def(OpKind::kAdaptiveAvgPool1d).int8_share(qinput(n, "x"), &p));
}

// interpolate on int8 (the eager kernel takes the codes, as the converted model's ShareExec runs it)
// against PyTorch's quantized upsample_nearest2d / upsample_bilinear2d (NCHW and NHWC kernels).
TEST(Int8OpsGolden, Interpolate) {
  struct Case {
    const char* name;
    const char* desc;
    std::optional<std::array<int64_t, 2>> size;
    std::optional<std::array<double, 2>> scale;
    const char* mode;
    std::optional<bool> align_corners;
    bool channels_last;
  };
  const std::array<double, 2> s2{2.0, 2.0};
  const Case cases[] = {
      {"interp_nearest_s2", "interpolate nearest scale=2 channels_last=0", std::nullopt, s2, "nearest", std::nullopt,
       false},
      {"interp_nearest_size_nhwc", "interpolate nearest size=7,13 channels_last=1", std::array<int64_t, 2>{7, 13},
       std::nullopt, "nearest", std::nullopt, true},
      {"interp_bilinear_s2", "interpolate bilinear scale=2 align_corners=0 channels_last=0", std::nullopt, s2,
       "bilinear", false, false},
      {"interp_bilinear_ac_size", "interpolate bilinear size=9,11 align_corners=1 channels_last=0",
       std::array<int64_t, 2>{9, 11}, std::nullopt, "bilinear", true, false},
      {"interp_bilinear_s2_nhwc", "interpolate bilinear scale=2 align_corners=0 channels_last=1", std::nullopt, s2,
       "bilinear", false, true},
  };
  for (const Case& c : cases) {
    const std::string n = c.name;
    begin_case(n, c.desc);
    for (MemoryFormat f : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
      const Tensor y = dbrq::interpolate(qinput(n, "x", f), c.size, c.scale, c.mode, c.align_corners);
      EXPECT_EQ(y.is_channels_last() && !y.is_contiguous(), f == MemoryFormat::kChannelsLast) << n;
      expect_codes(n, y);
    }
  }
}

TEST(Int8OpsGolden, CoversEveryGoldenCase) {
  if (::testing::GTEST_FLAG(filter) != "*") GTEST_SKIP() << "only meaningful when every test runs";
  std::vector<std::string> missing;
  for (const auto& [name, desc] : golden_meta()) {
    if (name == "generator" || name == "torch") continue;
    if (!tested_cases().count(name)) missing.push_back(name);
  }
  EXPECT_TRUE(missing.empty()) << "golden cases no test ran: " << ::testing::PrintToString(missing);
}

}  // namespace
