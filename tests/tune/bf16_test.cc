// bf16 as a middle precision (QConfig::bf16()): the bf16 kernels against a naive reference on
// bf16-rounded operands and against fp32 (within bf16's 8-bit mantissa); a marked op in a converted
// model computes in bf16 with f32 tensors at its boundaries (its neighbours are unchanged); on a CPU
// without bf16 (forced) the same model gives exactly the fp32 results; a mapping with bf16 entries
// round-trips through its JSON document, and with it a quant-state file reproduces the model.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "dbrq.h"
#include "kernels/bf16.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using kernels::round_to_bf16;

std::vector<float> values(const Tensor& t) { return t.contiguous().to_vector<float>(); }

// max |a - b| / max |ref|.
double rel_max_error(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& ref) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(double(a[i]) - double(b[i])));
    mag = std::max(mag, std::abs(double(ref[i])));
  }
  return err / mag;
}

// Forces the fp32 fallback for one scope.
struct NoBf16 {
  NoBf16() { force_bf16_fallback(true); }
  ~NoBf16() { force_bf16_fallback(false); }
};

TEST(Bf16Kernels, RoundToBf16IsRoundHalfToEven) {
  EXPECT_EQ(round_to_bf16(1.0f), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: to the even one (1 + 2^-6).
  EXPECT_EQ(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -12)), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_TRUE(std::isnan(round_to_bf16(NAN)));
}

TEST(Bf16Kernels, LinearMatchesNaiveBf16ReferenceAndFp32WithinBf16Tolerance) {
  if (!bf16_supported()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  const int64_t m = 7, k = 45, n = 13;
  const Tensor x = randn({m, k}, 1), w = randn({n, k}, 2), b = randn({n}, 3);
  const Tensor y = kernels::linear_bf16(x, w, b);
  ASSERT_EQ(y.dtype(), DType::kF32);
  ASSERT_EQ(y.sizes(), (IntArrayRef{m, n}));
  const std::vector<float> xv = values(x), wv = values(w), bv = values(b);
  std::vector<float> ref(m * n), ref32(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = bv[j], s32 = bv[j];
      for (int64_t c = 0; c < k; ++c) {
        s += double(round_to_bf16(xv[i * k + c])) * double(round_to_bf16(wv[j * k + c]));
        s32 += double(xv[i * k + c]) * double(wv[j * k + c]);
      }
      ref[i * n + j] = float(s);
      ref32[i * n + j] = float(s32);
    }
  }
  const std::vector<float> yv = values(y);
  // Products of bf16 values are exact in f32; only f32 accumulation differs from the reference.
  EXPECT_LT(rel_max_error(yv, ref, ref), 1e-5);
  // Against fp32: bf16's relative step is 2^-8; it is really bf16 (not the fp32 kernel).
  const double vs32 = rel_max_error(yv, ref32, ref32);
  EXPECT_LT(vs32, 2e-2);
  EXPECT_GT(vs32, 1e-5) << "the bf16 kernel computed fp32 results";
  EXPECT_LT(rel_max_error(values(kernels::linear(x, w, b)), ref32, ref32), 1e-5);
}

TEST(Bf16Kernels, Conv2dMatchesNaiveBf16Reference) {
  if (!bf16_supported()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  const int64_t N = 2, C = 4, H = 6, W = 5, K = 6, R = 3;
  const Tensor x = randn({N, C, H, W}, 4), w = randn({K, C, R, R}, 5), b = randn({K}, 6);
  Conv2dParams p;
  p.stride = {1, 1};
  p.padding = {1, 1};
  const Tensor y = kernels::conv2d_bf16(x, w, b, p);
  ASSERT_EQ(y.sizes(), (IntArrayRef{N, K, H, W}));
  const std::vector<float> xv = values(x), wv = values(w), bv = values(b), yv = values(y);
  std::vector<float> ref(N * K * H * W), ref32(ref.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t oh = 0; oh < H; ++oh)
        for (int64_t ow = 0; ow < W; ++ow) {
          double s = bv[k], s32 = bv[k];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t r = 0; r < R; ++r)
              for (int64_t q = 0; q < R; ++q) {
                const int64_t ih = oh + r - 1, iw = ow + q - 1;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const float xi = xv[((n * C + c) * H + ih) * W + iw], wi = wv[((k * C + c) * R + r) * R + q];
                s += double(round_to_bf16(xi)) * double(round_to_bf16(wi));
                s32 += double(xi) * double(wi);
              }
          ref[((n * K + k) * H + oh) * W + ow] = float(s);
          ref32[((n * K + k) * H + oh) * W + ow] = float(s32);
        }
  EXPECT_LT(rel_max_error(yv, ref, ref), 1e-5);
  const double vs32 = rel_max_error(yv, ref32, ref32);
  EXPECT_LT(vs32, 2e-2);
  EXPECT_GT(vs32, 1e-5);
}

TEST(Bf16Kernels, BatchedMatmulMatchesNaiveBf16Reference) {
  if (!bf16_supported()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  const int64_t B = 3, M = 5, K = 33, N = 4;
  const Tensor a = randn({B, M, K}, 7), bm = randn({K, N}, 8);  // b broadcast over the batch
  const Tensor y = kernels::matmul_bf16(a, bm);
  ASSERT_EQ(y.sizes(), (IntArrayRef{B, M, N}));
  const std::vector<float> av = values(a), bv = values(bm), yv = values(y);
  std::vector<float> ref(B * M * N);
  for (int64_t i = 0; i < B * M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t c = 0; c < K; ++c) s += double(round_to_bf16(av[i * K + c])) * double(round_to_bf16(bv[c * N + j]));
      ref[i * N + j] = float(s);
    }
  EXPECT_LT(rel_max_error(yv, ref, ref), 1e-5);
}

TEST(Bf16Kernels, BadInputsThrowLikeTheFp32Kernels) {
  EXPECT_THROW_MSG(kernels::linear_bf16(randn({2, 3}, 1), randn({4, 5}, 2), Tensor()), ShapeError, "linear");
  EXPECT_THROW_MSG(kernels::matmul_bf16(randn({2, 3}, 1), randn({4, 5}, 2)), ShapeError, "matmul");
  EXPECT_THROW_MSG(kernels::linear_bf16(zeros({2, 3}, DType::kS32), randn({4, 3}, 2), Tensor()), DTypeError,
                   "linear");
}

// conv -> relu -> flatten -> fc1 -> relu -> fc2 -> two functional matmuls.
struct Bf16Net : nn::CallableModule<Bf16Net> {
  Bf16Net() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(3, 8, 3, 1, 1));
    fc1 = register_module("fc1", std::make_shared<nn::LinearImpl>(8 * 5 * 5, 32));
    fc2 = register_module("fc2", std::make_shared<nn::LinearImpl>(32, 16));
  }
  Tensor forward(const Tensor& x) {
    Tensor h = relu((*conv)(x));
    h = relu((*fc1)(flatten(h, 1)));
    Tensor a = (*fc2)(h);
    Tensor g = matmul(a, transpose(a, 0, 1));
    return matmul(g, a);
  }
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<nn::LinearImpl> fc1, fc2;
};

std::shared_ptr<Bf16Net> make_net() {
  manual_seed(11);
  auto m = std::make_shared<Bf16Net>();
  m->eval();
  return m;
}

std::shared_ptr<Bf16Net> converted(const QConfigMapping& mapping, const std::vector<Tensor>& calib) {
  auto m = make_net();
  prepare(*m, {calib[0]}, mapping);
  for (const Tensor& x : calib) (*m)(x);
  convert(*m);
  return m;
}

QConfigMapping with_fc1(QConfigPtr q) {
  QConfigMapping mapping = default_qconfig_mapping("onednn");
  mapping.set_module_name("fc1", q);
  mapping.set_object_type(OpKind::kMatmul, q);
  return mapping;
}

TEST(Bf16Models, MarkedOpsLeaveInt8WithF32Boundaries) {
  const auto calib = testing::random_batches(4, 21, {4, 3, 5, 5});
  auto m = make_net();
  prepare(*m, {calib[0]}, with_fc1(QConfig::bf16()));
  // fc1 and the matmuls are not seen ops; conv and fc2 are.
  for (const QuantizedOpInfo& op : quantized_ops(*m)) {
    EXPECT_NE(op.fqn, "fc1");
    EXPECT_NE(op.kind, OpKind::kMatmul);
  }
  int bf16_listed = 0;
  for (const NonQuantOpInfo& o : testing::state_of(*m).non_quant_ops()) bf16_listed += o.reason == "qconfig is bf16";
  EXPECT_EQ(bf16_listed, 3);  // fc1's linear, two matmuls
  EXPECT_EQ(QConfig::bf16()->to_string(), "QConfig(bf16)");
  EXPECT_FALSE(*QConfig::bf16() == *default_qconfig());
}

TEST(Bf16Models, FallbackWithoutBf16GivesExactlyTheFp32Results) {
  const auto calib = testing::random_batches(4, 22, {4, 3, 5, 5});
  auto fp32_marked = converted(with_fc1(nullptr), calib);
  auto bf16_marked = converted(with_fc1(QConfig::bf16()), calib);
  {
    NoBf16 off;
    EXPECT_FALSE(bf16_supported());
    for (const Tensor& x : calib) testing::expect_equal((*bf16_marked)(x), (*fp32_marked)(x), "forced fallback");
  }
}

TEST(Bf16Models, Bf16OpsAreWithinBf16ToleranceOfFp32AndNeighboursUnchanged) {
  if (!bf16_supported()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  const auto calib = testing::random_batches(4, 23, {4, 3, 5, 5});
  auto fp32_marked = converted(with_fc1(nullptr), calib);
  auto bf16_marked = converted(with_fc1(QConfig::bf16()), calib);
  for (const Tensor& x : calib) {
    const Tensor a = (*fp32_marked)(x), b = (*bf16_marked)(x);
    const double s = sqnr_db(a, b);
    EXPECT_GT(s, 30.0);             // bf16 (~8 bits of mantissa) through three ops
    EXPECT_TRUE(std::isfinite(s));  // really bf16, not fp32
  }
  // Same quantization parameters elsewhere: the int8 neighbours did not notice.
  const auto qa = quantized_ops(*fp32_marked), qb = quantized_ops(*bf16_marked);
  ASSERT_EQ(qa.size(), qb.size());
  for (size_t i = 0; i < qa.size(); ++i) {
    EXPECT_EQ(qa[i].executor, qb[i].executor);
    if (qa[i].output_qparams && qb[i].output_qparams) {
      EXPECT_EQ(qa[i].output_qparams->scales, qb[i].output_qparams->scales);
    }
  }
}

TEST(Bf16Models, OnlyABf16LinearMatchesTheBf16Kernel) {
  if (!bf16_supported()) GTEST_SKIP() << "no AVX512_BF16 on this CPU";
  // Everything fp32 except fc2 in bf16: fc2's output is exactly linear_bf16 of fc1's fp32 output.
  struct Probe : nn::CallableModule<Probe> {
    Probe() { fc = register_module("fc", std::make_shared<nn::LinearImpl>(24, 9)); }
    Tensor forward(const Tensor& x) { return (*fc)(relu(x)); }
    std::shared_ptr<nn::LinearImpl> fc;
  };
  manual_seed(3);
  auto m = std::make_shared<Probe>();
  m->eval();
  QConfigMapping mapping;
  mapping.set_global(nullptr).set_module_name("fc", QConfig::bf16());
  const Tensor x = randn({5, 24}, 9);
  prepare(*m, {x}, mapping);
  (*m)(x);
  convert(*m);
  testing::expect_equal((*m)(x), kernels::linear_bf16(relu(x), m->fc->weight, m->fc->bias), "bf16 fc");
}

TEST(Bf16Mapping, JsonRoundTripKeepsBf16Entries) {
  QConfigMapping m = default_qconfig_mapping("onednn");
  m.set_module_name("fc1", QConfig::bf16())
      .set_module_name("conv", nullptr)
      .set_object_type(OpKind::kMatmul, QConfig::bf16())
      .set_object_type("Conv2d", QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max()))
      .set_module_name_regex("layer[0-9]\\..*", QConfig::bf16());
  const std::string doc = qconfig_mapping_to_json(m);
  const QConfigMapping back = qconfig_mapping_from_json(doc, "test");
  EXPECT_EQ(qconfig_mapping_to_json(back), doc);
  EXPECT_EQ(back.to_string(), m.to_string());
  EXPECT_TRUE(back.for_module("Linear", "fc1")->is_bf16());
  EXPECT_TRUE(back.for_module("Linear", "layer1.fc")->is_bf16());
  EXPECT_EQ(back.for_module("Conv2d", "conv"), nullptr);
  EXPECT_TRUE(back.for_op(OpKind::kMatmul, "Net", "")->is_bf16());
  EXPECT_EQ(back.for_module("Conv2d", "other")->activation.kind, ObserverKind::kMinMax);
  const std::string path = testing::temp_file("mapping.json");
  save_qconfig_mapping(m, path);
  EXPECT_EQ(qconfig_mapping_to_json(load_qconfig_mapping(path)), doc);
}

TEST(Bf16Mapping, BadDocumentsAreFileFormatErrors) {
  EXPECT_THROW_MSG(qconfig_mapping_from_json("{", "a.json"), FileFormatError, "qconfig mapping a.json is not valid JSON");
  EXPECT_THROW_MSG(qconfig_mapping_from_json("{\"format\": \"x\"}", "a.json"), FileFormatError,
                   "is not a dbrq qconfig mapping");
  std::string doc = qconfig_mapping_to_json(with_fc1(QConfig::bf16()));
  // Version 2 exists since call-site entries (callsite_mapping_test), 3 since (module type, op)
  // entries (the default mapping has some: qconfig_mapping_test).
  std::string v4 = doc;
  v4.replace(v4.find("\"version\": 3"), 12, "\"version\": 4");
  EXPECT_THROW_MSG(qconfig_mapping_from_json(v4, "a.json"), FileFormatError, "has version 4");
  std::string int4 = doc;
  int4.replace(int4.find("\"bf16\""), 6, "\"int4\"");
  EXPECT_THROW_MSG(qconfig_mapping_from_json(int4, "a.json"), FileFormatError, "a qconfig must be null, \"bf16\"");
  std::string op = doc;
  op.replace(op.find("\"matmul\""), 8, "\"matmol\"");
  EXPECT_THROW_MSG(qconfig_mapping_from_json(op, "a.json"), FileFormatError, "unknown op \"matmol\"");
  EXPECT_THROW_MSG(load_qconfig_mapping(testing::temp_file("missing/none.json")), IOError, "cannot open qconfig mapping");
}

TEST(Bf16Mapping, QuantStateWithBf16PartsReproducesTheModel) {
  const auto calib = testing::random_batches(4, 24, {4, 3, 5, 5});
  const QConfigMapping mapping = with_fc1(QConfig::bf16());
  auto a = converted(mapping, calib);
  const std::string state = testing::temp_file("bf16.qstate.json"), map = testing::temp_file("bf16.mapping.json");
  save_quant_state(*a, state);
  save_qconfig_mapping(mapping, map);
  auto b = make_net();
  prepare(*b, {calib[0]}, load_qconfig_mapping(map));
  load_quant_state(*b, state);
  convert(*b);
  for (const Tensor& x : calib) testing::expect_equal((*b)(x), (*a)(x), "reloaded");
}

}  // namespace
}  // namespace dbrq
