// Every elementwise activation of the op registry (each OpDef whose `eltwise` is set), against
// its reference function kernels::eltwise_reference (PyTorch's formula, kernels/activation_math.h):
//
//  - fp32: the eager kernel, called both directly (kernels::eltwise(def.eltwise(params), x)) and
//    through the op's functional form (OpDef::run with an OpCall, out of place and in place),
//    over a sweep of def.domain [lo, hi]; error |y - ref| / max(1, |ref|) <= tolerance, where the
//    tolerance is def.domain.tolerance unless the table below states (and justifies) another;
//  - int8 (roles kLut, kFixedQParams, kShare): the 256-entry table kernels::make_lut builds from
//    the reference, applied through kernels::apply_lut, against quantize(reference(dequantize(q)))
//    computed in double for every code q: within one code, and an off-by-one only where the
//    reference sits at a near-tie (the gate of kernel_test_util.h). kShare ops also run their
//    int8 form (OpDef::int8_share, a clamp on codes) against the same expectation.
//
// The parameters an op needs (leaky_relu's slope, the clamps' bounds, gelu's approximation) come
// from kActivationCases below. An activation registered without an entry there FAILS this test:
// a new activation cannot escape it.
#include <gtest/gtest.h>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/op_params.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "runtime/dispatcher.h"
#include "runtime/op_registry.h"
#include "tests/kernels/kernel_test_util.h"

namespace dbrq::kernel_testing {
namespace {

// One way of calling an activation.
struct ActivationCase {
  std::string label;
  bool has_params = false;  // pass `params` (else a null parameter pointer, as the public function does)
  ActivationParams params;
  // fp32 tolerance override (0: def.domain.tolerance), with the reason it differs.
  float tolerance = 0.f;
  const char* tolerance_reason = nullptr;
};

ActivationCase no_params() { return {"", false, {}, 0.f, nullptr}; }
ActivationCase with(std::string label, double alpha, double beta, bool approximate_tanh = false) {
  return {std::move(label), true, ActivationParams{alpha, beta, approximate_tanh}, 0.f, nullptr};
}

// Every activation OpDef by name, with the cases to run. Add an entry when registering an
// activation (the test fails until you do).
const std::map<std::string, std::vector<ActivationCase>>& activation_cases() {
  static const auto* cases = new std::map<std::string, std::vector<ActivationCase>>{
      {"relu", {no_params()}},
      {"relu6", {with("", 0.0, 6.0)}},  // relu6() passes {0, 6}; its eltwise ignores them
      {"hardtanh", {with("default [-1, 1]", -1.0, 1.0), with("[-2, 0.5]", -2.0, 0.5)}},
      {"clamp", {with("[-0.5, 2]", -0.5, 2.0), with("[0, 6]", 0.0, 6.0), with("[1.25, 1.25]", 1.25, 1.25)}},
      {"leaky_relu", {with("slope 0.01", 0.01, 0.0), with("slope 0.2", 0.2, 0.0)}},
      {"sigmoid", {no_params()}},
      {"tanh", {no_params()}},
      {"hardsigmoid", {no_params()}},
      {"hardswish", {no_params()}},
      {"silu", {no_params()}},
      {"gelu", {with("approximate none", 0.0, 0.0, false), with("approximate tanh", 0.0, 0.0, true)}},
      {"elu", {with("alpha 1", 1.0, 0.0), with("alpha 0.5", 0.5, 0.0)}},
      {"softplus", {with("beta 1 threshold 20", 1.0, 20.0), with("beta 2 threshold 3", 2.0, 3.0)}},
      {"mish", {no_params()}},
  };
  return *cases;
}

std::vector<OpKind> activation_kinds() {
  std::vector<OpKind> kinds;
  for (const OpDef& d : op_registry().all()) {
    if (d.eltwise != nullptr) kinds.push_back(d.kind);
  }
  return kinds;
}

// The sweep: n evenly spaced points of [lo, hi] plus points where activations have kinks.
std::vector<float> sweep(const ActivationDomain& dom, const ActivationCase& c) {
  constexpr int kPoints = 4001;
  std::vector<float> x;
  for (int i = 0; i < kPoints; ++i) {
    x.push_back(static_cast<float>(dom.lo + (static_cast<double>(dom.hi) - dom.lo) * i / (kPoints - 1)));
  }
  std::vector<double> specials = {0.0, 1e-7, -1e-7, 3.0, -3.0, 6.0, 1.0, -1.0};
  if (c.has_params) {
    specials.push_back(c.params.alpha);
    specials.push_back(c.params.beta);
  }
  for (double v : specials) {
    if (v >= dom.lo && v <= dom.hi) x.push_back(static_cast<float>(v));
  }
  return x;
}

struct FloatCheck {
  double worst = 0.0;
  float worst_x = 0.f, worst_got = 0.f, worst_ref = 0.f;
  int64_t bad = 0;
};

FloatCheck check_floats(const std::vector<float>& x, const std::vector<float>& got, const std::vector<float>& ref,
                        double tol) {
  FloatCheck c;
  for (size_t i = 0; i < x.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - ref[i]) / std::max(1.0, std::abs(static_cast<double>(ref[i])));
    if (!(err <= tol)) ++c.bad;
    if (!(err <= c.worst)) {  // NaN counts as worst
      c.worst = std::isnan(err) ? INFINITY : err;
      c.worst_x = x[i];
      c.worst_got = got[i];
      c.worst_ref = ref[i];
    }
  }
  return c;
}

class ActivationTest : public ::testing::TestWithParam<OpKind> {};

TEST_P(ActivationTest, MatchesReference) {
  const OpDef& def = op_def(GetParam());
  ASSERT_NE(def.eltwise, nullptr);
  auto it = activation_cases().find(def.name);
  if (it == activation_cases().end()) {
    FAIL() << "the activation OpDef \"" << def.name << "\" (OpKind " << static_cast<int>(def.kind)
           << ") has no entry in activation_cases() of tests/kernels/activation_test.cc: add one with the "
              "ActivationParams it needs (and, if its fp32 kernel is less accurate than domain.tolerance, a "
              "justified tolerance).";
  }
  ASSERT_FALSE(it->second.empty()) << def.name << ": no cases";
  const ActivationDomain dom = def.domain;
  ASSERT_LT(dom.lo, dom.hi) << def.name << ": empty domain";
  ASSERT_GT(dom.tolerance, 0.f) << def.name << ": no tolerance";

  for (const ActivationCase& c : it->second) {
    const std::string label = std::string(def.name) + (c.label.empty() ? "" : " (" + c.label + ")");
    SCOPED_TRACE(label);
    const void* params = c.has_params ? &c.params : nullptr;
    const kernels::Eltwise e = def.eltwise(params);
    if (c.tolerance > 0.f) {
      ASSERT_NE(c.tolerance_reason, nullptr) << label << ": a tolerance override needs its reason";
    }
    const double tol = c.tolerance > 0.f ? c.tolerance : dom.tolerance;

    // ---- fp32 ----
    const std::vector<float> xs = sweep(dom, c);
    const int64_t n = static_cast<int64_t>(xs.size());
    const Tensor x = make_f32({n}, xs);
    std::vector<float> ref(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) ref[i] = kernels::eltwise_reference(e, xs[i]);

    const Tensor direct = kernels::eltwise(e, x);
    const Tensor* inputs[] = {&x};
    OpCall call;
    call.kind = def.kind;
    call.inputs = absl::MakeConstSpan(inputs, 1);
    call.params = params;
    call.run = def.run;
    ASSERT_NE(def.run, nullptr) << label;
    const Tensor functional = def.run(call);
    Tensor self = make_f32({n}, xs);
    const Tensor* self_in[] = {&self};
    OpCall inplace = call;
    inplace.inputs = absl::MakeConstSpan(self_in, 1);
    inplace.inplace = true;
    const Tensor inplace_result = def.run(inplace);

    for (const auto& [how, t] : {std::pair<const char*, const Tensor*>{"kernels::eltwise", &direct},
                                 std::pair<const char*, const Tensor*>{"OpDef::run", &functional},
                                 std::pair<const char*, const Tensor*>{"OpDef::run in place", &inplace_result}}) {
      ASSERT_EQ(sizes_of(*t), std::vector<int64_t>{n}) << how;
      ASSERT_EQ(t->dtype(), DType::kF32) << how;
      const FloatCheck fc = check_floats(xs, read_floats(*t), ref, tol);
      std::cout << "[ kernels  ] " << std::left << std::setw(32) << label << std::setw(22) << how << std::right
                << " f32 worst error " << std::scientific << std::setprecision(2) << fc.worst << " at x = "
                << std::setprecision(9) << fc.worst_x << " (tolerance " << std::setprecision(2) << tol << ")"
                << std::defaultfloat << std::endl;
      EXPECT_EQ(fc.bad, 0) << label << " via " << how << ": " << fc.bad << " of " << n
                           << " values beyond tolerance " << tol << "; worst relative error " << fc.worst
                           << " at x = " << std::setprecision(9) << fc.worst_x << ": got " << fc.worst_got
                           << ", reference " << fc.worst_ref;
    }
    EXPECT_EQ(inplace_result.data_ptr(), self.data_ptr()) << label << ": the in-place form must write into its input";

    // ---- int8 ----
    if (def.role != QuantRole::kLut && def.role != QuantRole::kFixedQParams && def.role != QuantRole::kShare) {
      continue;
    }
    const QuantParamsPtr in = qparams_for_range(dom.lo, dom.hi);
    std::vector<double> real(256);
    std::vector<int32_t> all_codes(256);
    double lo = 0.0, hi = 0.0;
    for (int q = 0; q < 256; ++q) {
      all_codes[q] = q;
      real[q] = kernels::eltwise_reference(e, static_cast<float>(dequantize(q, in->scale(), in->zero_point())));
      lo = std::min(lo, real[q]);
      hi = std::max(hi, real[q]);
    }
    QuantParamsPtr out;
    switch (def.role) {
      case QuantRole::kShare:
        out = in;
        break;
      case QuantRole::kFixedQParams:
        out = QuantParams::per_tensor(def.fixed_scale, def.fixed_zero_point);
        break;
      default:
        out = qparams_for_range(lo, hi);
        break;
    }
    const RefCodes expected = reference_codes(real, out->scale(), out->zero_point());
    const kernels::Lut lut =
        kernels::make_lut(*in, *out, [&](float v) { return kernels::eltwise_reference(e, v); });
    const Tensor codes = make_u8({256}, all_codes, in);
    const Tensor y = kernels::apply_lut(codes, lut, out);
    ASSERT_TRUE(y.is_quantized());
    EXPECT_EQ(*y.qparams(), *out);
    expect_codes(label + " int8 table (" + quant_role_name(def.role) + ")", read_codes(y), expected.codes,
                 &expected.unrounded);
    if (def.role == QuantRole::kShare && def.int8_share != nullptr) {
      const Tensor s = def.int8_share(codes, params);
      ASSERT_TRUE(s.is_quantized());
      EXPECT_EQ(*s.qparams(), *in) << label << ": kShare must keep the input's parameters";
      expect_codes(label + " int8_share", read_codes(s), expected.codes, &expected.unrounded);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, ActivationTest, ::testing::ValuesIn(activation_kinds()),
                         [](const ::testing::TestParamInfo<OpKind>& info) {
                           return std::string(op_def(info.param).name);
                         });

TEST(ActivationRegistry, HasActivations) {
  EXPECT_GE(activation_kinds().size(), activation_cases().size())
      << "fewer activation OpDefs in the registry than cases in this test";
  EXPECT_FALSE(activation_kinds().empty());
}

TEST(ActivationRegistry, NoStaleCases) {
  // Every entry of the table names a registered activation (a renamed or removed op must not
  // leave a case that silently tests nothing).
  std::set<std::string> names;
  for (OpKind k : activation_kinds()) names.insert(op_def(k).name);
  for (const auto& [name, cases] : activation_cases()) {
    EXPECT_TRUE(names.count(name) == 1) << "activation_cases() has \"" << name
                                        << "\", which is not an activation OpDef of the registry";
  }
}

}  // namespace
}  // namespace dbrq::kernel_testing
