// Int8 layer_norm / group_norm / instance_norm (kernels/int8_normalize.cc) against PyTorch 1.13's
// quantized::layer_norm / group_norm / instance_norm on the same codes and parameters
// (tests/int8/golden/int8_norms.safetensors, written by tests/int8/make_norm_goldens.py), on both
// the AVX-512 loops and the portable ones: at least 99.9% of codes bit-identical over all cases and
// never more than one step off; the two loops bit-identical to each other.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <type_traits>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dbrq.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "kernels/simd.h"
#include "tests/test_util.h"

namespace {

using dbrq::DType;
using dbrq::MemoryFormat;
using dbrq::QuantParams;
using dbrq::QuantParamsPtr;
using dbrq::Tensor;
namespace kernels = dbrq::kernels;

constexpr char kGolden[] = "tests/int8/golden/int8_norms.safetensors";

const std::map<std::string, Tensor>& golden_file() {
  static const auto* g = new std::map<std::string, Tensor>(dbrq::testing::load_golden(kGolden));
  return *g;
}

const std::map<std::string, std::string>& golden_meta() {
  static const auto* m = new std::map<std::string, std::string>(dbrq::load_safetensors_metadata(kGolden));
  return *m;
}

Tensor g(const std::string& name) { return dbrq::testing::golden(golden_file(), name); }
bool has(const std::string& name) { return golden_file().count(name) > 0; }

QuantParamsPtr qparams_of(const std::string& c, const std::string& role) {
  return QuantParams::per_tensor(g(c + "." + role + "_scale").item<float>(), g(c + "." + role + "_zp").item<int32_t>());
}

enum class Op { kLayer, kGroup, kInstance };
struct Case {
  const char* name;
  Op op;
  std::vector<int64_t> shape;  // layer norm: normalized_shape
  int64_t groups;              // group norm
  double eps;
  const char* desc;            // the script's metadata for the case
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"ln_affine", Op::kLayer, {64}, 0, 1e-5, "layer_norm normalized_shape=64 eps=1e-05"},
      {"ln_plain_tail", Op::kLayer, {37}, 0, 1e-5, "layer_norm normalized_shape=37 eps=1e-05"},
      {"ln_two_dims", Op::kLayer, {6, 5}, 0, 1e-5, "layer_norm normalized_shape=6,5 eps=1e-05"},
      {"ln_vit", Op::kLayer, {192}, 0, 1e-6, "layer_norm normalized_shape=192 eps=1e-06"},
      {"ln_bert", Op::kLayer, {200}, 0, 1e-12, "layer_norm normalized_shape=200 eps=1e-12"},
      {"ln_narrow_range", Op::kLayer, {48}, 0, 1e-5, "layer_norm normalized_shape=48 eps=1e-05"},
      {"gn_affine", Op::kGroup, {}, 2, 1e-5, "group_norm num_groups=2 eps=1e-05"},
      {"gn_plain_1d", Op::kGroup, {}, 3, 1e-5, "group_norm num_groups=3 eps=1e-05"},
      {"gn_wide", Op::kGroup, {}, 8, 1e-5, "group_norm num_groups=8 eps=1e-05"},
      {"gn_one_group", Op::kGroup, {}, 1, 1e-3, "group_norm num_groups=1 eps=0.001"},
      {"in_affine_2d", Op::kInstance, {}, 0, 1e-5, "instance_norm eps=1e-05"},
      {"in_plain_1d", Op::kInstance, {}, 0, 1e-5, "instance_norm eps=1e-05"},
      {"in_wide", Op::kInstance, {}, 0, 1e-5, "instance_norm eps=1e-05"},
  };
  return c;
}

Tensor run_case(const Case& c, MemoryFormat format = MemoryFormat::kContiguous) {
  Tensor x = g(std::string(c.name) + ".x").with_qparams(qparams_of(c.name, "x"));
  if (format != MemoryFormat::kContiguous) x = kernels::copy(x, format, DType::kU8).with_qparams(x.qparams_ptr());
  const Tensor w = has(std::string(c.name) + ".w") ? g(std::string(c.name) + ".w") : Tensor();
  const Tensor b = has(std::string(c.name) + ".b") ? g(std::string(c.name) + ".b") : Tensor();
  const QuantParamsPtr out = qparams_of(c.name, "out");
  switch (c.op) {
    case Op::kLayer:
      return kernels::qlayer_norm(x, c.shape, w, b, c.eps, out);
    case Op::kGroup:
      return kernels::qgroup_norm("group_norm", x, c.groups, w, b, c.eps, out);
    case Op::kInstance:
      return kernels::qgroup_norm("instance_norm", x, x.size(1), w, b, c.eps, out);
  }
  return Tensor();
}

struct Stats {
  int64_t n = 0, identical = 0, max_diff = 0;
};

Stats compare(const Tensor& y, const Tensor& expected) {
  Stats s;
  const std::vector<int32_t> a = dbrq::testing::codes(y), e = dbrq::testing::codes(expected);
  EXPECT_EQ(a.size(), e.size());
  for (size_t i = 0; i < a.size() && i < e.size(); ++i) {
    const int64_t d = std::abs(static_cast<int64_t>(a[i]) - e[i]);
    ++s.n;
    s.identical += d == 0;
    s.max_diff = std::max(s.max_diff, d);
  }
  return s;
}

class ForcePortable {
 public:
  explicit ForcePortable(bool on) { kernels::simd::force_portable(on); }
  ~ForcePortable() { kernels::simd::force_portable(false); }
};

void check_against_pytorch(bool portable) {
  ForcePortable force(portable);
  Stats total;
  for (const Case& c : cases()) {
    auto it = golden_meta().find(c.name);
    ASSERT_NE(it, golden_meta().end()) << c.name << " is not in " << kGolden;
    EXPECT_EQ(it->second, c.desc) << c.name << ": the script and the test describe different parameters";
    const Tensor y = run_case(c);
    ASSERT_EQ(y.dtype(), DType::kU8);
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *qparams_of(c.name, "out")) << c.name;
    EXPECT_EQ(y.sizes(), g(std::string(c.name) + ".x").sizes()) << c.name;
    const Stats s = compare(y, g(std::string(c.name) + ".out"));
    std::cout << "[ norm     ] " << (portable ? "portable " : kernels::simd::isa_name()) << " " << std::left
              << std::setw(16) << c.name << std::right << s.identical << "/" << s.n << " identical, max diff "
              << s.max_diff << "\n";
    EXPECT_LE(s.max_diff, 1) << c.name;
    total.n += s.n;
    total.identical += s.identical;
  }
  std::cout << "[ norm     ] all cases: " << total.identical << "/" << total.n << " identical\n";
  EXPECT_GE(static_cast<double>(total.identical), 0.999 * static_cast<double>(total.n));
}

TEST(Int8NormsGolden, MatchesPyTorchVectorLoops) { check_against_pytorch(false); }
TEST(Int8NormsGolden, MatchesPyTorchPortableLoops) { check_against_pytorch(true); }

TEST(Int8NormsGolden, CoversEveryGoldenCase) {
  for (const auto& [name, desc] : golden_meta()) {
    if (name == "generator" || name == "torch" || name == "__metadata__") continue;
    bool found = false;
    for (const Case& c : cases()) found = found || name == c.name;
    EXPECT_TRUE(found) << "golden case " << name << " has no test";
  }
}

// Channels-last input: the same codes as row-major (group / instance norm keep the layout).
TEST(Int8NormsGolden, ChannelsLastInputSameCodes) {
  for (const Case& c : cases()) {
    if (c.op == Op::kLayer || g(std::string(c.name) + ".x").dim() != 4) continue;
    const Tensor a = run_case(c);
    const Tensor b = run_case(c, MemoryFormat::kChannelsLast);
    EXPECT_TRUE(b.is_channels_last()) << c.name;
    EXPECT_EQ(dbrq::testing::codes(a), dbrq::testing::codes(b)) << c.name;
  }
}

// A group of 180000 codes: the vector sums flush their 32-bit lanes to 64 bits every 4096 blocks;
// both loops agree bit for bit and stay within one step of the formula evaluated in double.
TEST(Int8NormsKernel, LongRowsVectorEqualsPortableAndReference) {
  const int64_t c = 2, hw = 300 * 300;
  std::vector<uint8_t> codes(static_cast<size_t>(c * hw));
  uint32_t state = 12345;
  for (auto& q : codes) {
    state = state * 1664525u + 1013904223u;
    q = static_cast<uint8_t>(200 + (state >> 24) % 56);  // large codes: large sums of squares
  }
  Tensor x = Tensor::empty({1, c, 300, 300}, DType::kU8);
  std::copy(codes.begin(), codes.end(), static_cast<uint8_t*>(x.mutable_data_ptr()));
  x = x.with_qparams(QuantParams::per_tensor(0.05f, 3));
  const Tensor w = dbrq::from_vector<float>({1.5f, -0.5f}, {2});
  const Tensor b = dbrq::from_vector<float>({0.25f, 1.0f}, {2});
  const QuantParamsPtr out = QuantParams::per_tensor(0.03f, 120);
  Tensor vec, port;
  {
    ForcePortable force(false);
    vec = kernels::qgroup_norm("group_norm", x, 1, w, b, 1e-5, out);
  }
  {
    ForcePortable force(true);
    port = kernels::qgroup_norm("group_norm", x, 1, w, b, 1e-5, out);
  }
  const std::vector<int32_t> a = dbrq::testing::codes(vec), p = dbrq::testing::codes(port);
  EXPECT_EQ(a, p);
  double sum = 0, sq = 0;
  for (uint8_t q : codes) {
    sum += (q - 3) * 0.05;
    sq += ((q - 3) * 0.05) * ((q - 3) * 0.05);
  }
  const double n = static_cast<double>(codes.size()), mean = sum / n, rstd = 1.0 / std::sqrt(sq / n - mean * mean + 1e-5);
  int64_t worst = 0;
  const float wv[] = {1.5f, -0.5f}, bv[] = {0.25f, 1.0f};
  for (size_t i = 0; i < codes.size(); ++i) {
    const size_t ch = i / static_cast<size_t>(hw);
    const double y = ((codes[i] - 3) * 0.05 - mean) * rstd * wv[ch] + bv[ch];
    const double ref = std::min(255.0, std::max(0.0, std::nearbyint(y / 0.03) + 120));
    worst = std::max<int64_t>(worst, std::llabs(static_cast<int64_t>(ref) - a[i]));
  }
  EXPECT_LE(worst, 1);
}

// Every bad input is a typed error naming the op and the value.
TEST(Int8NormsKernel, BadInputs) {
  const QuantParamsPtr qp = QuantParams::per_tensor(0.1f, 128);
  const Tensor xq = Tensor::empty({2, 4, 8}, DType::kU8).with_qparams(qp);
  const Tensor xf = Tensor::empty({2, 4, 8}, DType::kF32);
  const Tensor raw = Tensor::empty({2, 4, 8}, DType::kU8);
  const Tensor w8 = Tensor::empty({8}, DType::kF32);
  auto expect_error = [](auto fn, auto* type_tag, const std::string& needle) {
    using E = std::remove_pointer_t<decltype(type_tag)>;
    try {
      fn();
      ADD_FAILURE() << "no error; expected one containing: " << needle;
    } catch (const E& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "wrong error type: " << e.what();
    }
  };
  expect_error([&] { kernels::qlayer_norm(xf, {8}, Tensor(), Tensor(), 1e-5, qp); }, static_cast<dbrq::DTypeError*>(nullptr),
               "quantized layer_norm: needs a per-tensor quantized u8 input, got f32");
  expect_error([&] { kernels::qlayer_norm(raw, {8}, Tensor(), Tensor(), 1e-5, qp); }, static_cast<dbrq::DTypeError*>(nullptr),
               "(not quantized)");
  expect_error([&] { kernels::qlayer_norm(xq, {4}, Tensor(), Tensor(), 1e-5, qp); }, static_cast<dbrq::ShapeError*>(nullptr),
               "do not end with normalized_shape [4]");
  expect_error([&] { kernels::qlayer_norm(xq, {1, 2, 4, 8}, Tensor(), Tensor(), 1e-5, qp); }, static_cast<dbrq::ShapeError*>(nullptr),
               "does not fit input sizes [2, 4, 8]");
  expect_error([&] { kernels::qlayer_norm(xq, {8}, Tensor::empty({7}, DType::kF32), Tensor(), 1e-5, qp); },
               static_cast<dbrq::ShapeError*>(nullptr), "weight must have sizes [8], got [7]");
  expect_error([&] { kernels::qlayer_norm(xq, {8}, w8, Tensor::empty({8}, DType::kU8), 1e-5, qp); },
               static_cast<dbrq::DTypeError*>(nullptr), "quantized layer_norm: bias must have dtype f32");
  expect_error([&] { kernels::qlayer_norm(xq, {8}, w8, Tensor(), -1.0, qp); }, static_cast<dbrq::ValueError*>(nullptr),
               "eps must be finite and >= 0, got -1");
  expect_error([&] { kernels::qlayer_norm(xq, {8}, w8, Tensor(), 1e-5, nullptr); }, static_cast<dbrq::ValueError*>(nullptr),
               "needs per-tensor output parameters");
  expect_error(
      [&] {
        kernels::qlayer_norm(xq, {8}, w8, Tensor(), 1e-5, QuantParams::per_channel({0.1f, 0.2f}, {0, 0}, 0));
      },
      static_cast<dbrq::ValueError*>(nullptr), "needs per-tensor output parameters");
  expect_error([&] { kernels::qgroup_norm("group_norm", xq, 3, Tensor(), Tensor(), 1e-5, qp); }, static_cast<dbrq::ShapeError*>(nullptr),
               "quantized group_norm: 4 channels are not divisible into 3 groups");
  expect_error([&] { kernels::qgroup_norm("group_norm", xq, 0, Tensor(), Tensor(), 1e-5, qp); }, static_cast<dbrq::ValueError*>(nullptr),
               "num_groups must be >= 1, got 0");
  expect_error([&] { kernels::qgroup_norm("instance_norm", xq, 4, w8, Tensor(), 1e-5, qp); }, static_cast<dbrq::ShapeError*>(nullptr),
               "quantized instance_norm: weight must have sizes [4], got [8]");
  expect_error(
      [&] { kernels::qgroup_norm("group_norm", Tensor::empty({4}, DType::kU8).with_qparams(qp), 1, Tensor(), Tensor(), 1e-5, qp); },
      static_cast<dbrq::ShapeError*>(nullptr), "input must have at least 2 dims (N, C, *), got sizes [4]");
  expect_error([&] { kernels::qgroup_norm("instance_norm", xf, 4, Tensor(), Tensor(), 1e-5, qp); }, static_cast<dbrq::DTypeError*>(nullptr),
               "quantized instance_norm: needs a per-tensor quantized u8 input");
}

}  // namespace
