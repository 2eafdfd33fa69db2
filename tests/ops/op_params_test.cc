// Parameter structs: the field walk behind equality, fingerprints and the portable form
// quant-state files store (to_fields / from_fields, and the registry's params_to_fields).
#include <gtest/gtest.h>

#include "core/op_params.h"
#include "runtime/op_registry.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

Conv2dParams strided_conv() {
  Conv2dParams p;
  p.stride = {2, 1};
  p.padding = {3, 0};
  p.groups = 4;
  return p;
}

TEST(OpParams, FieldsRoundTripEveryStruct) {
  const Conv2dParams c = strided_conv();
  EXPECT_EQ(from_fields<Conv2dParams>(to_fields(c)), c);
  Pool2dParams pool;
  pool.kernel_size = {3, 3};
  pool.ceil_mode = true;
  pool.count_include_pad = false;
  EXPECT_EQ(from_fields<Pool2dParams>(to_fields(pool)), pool);
  NormParams n;
  n.eps = 1e-12;
  n.normalized_shape = {768};
  EXPECT_EQ(from_fields<NormParams>(to_fields(n)), n);
  DimParams d;
  d.dims = {-1, 1};
  d.keepdim = true;
  EXPECT_EQ(from_fields<DimParams>(to_fields(d)), d);
  ShapeParams s;
  s.sizes = {2, -1, 5};
  s.start = 7;
  s.length = -3;
  EXPECT_EQ(from_fields<ShapeParams>(to_fields(s)), s);
  ActivationParams a;
  a.alpha = 0.1;  // not a short binary fraction: must survive exactly
  a.beta = 6.0;
  a.approximate_tanh = true;
  EXPECT_EQ(from_fields<ActivationParams>(to_fields(a)), a);
  DropoutParams dr;
  dr.p = 0.3;
  EXPECT_EQ(from_fields<DropoutParams>(to_fields(dr)), dr);
  AdaptivePool2dParams ap;
  ap.output_size = {7, 5};
  EXPECT_EQ(from_fields<AdaptivePool2dParams>(to_fields(ap)), ap);
}

TEST(OpParams, FieldsAreNamedInDeclarationOrder) {
  const ParamFields f = to_fields(strided_conv());
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].first, "stride");
  EXPECT_EQ(f[0].second, (std::vector<double>{2, 1}));
  EXPECT_EQ(f[3].first, "groups");
  EXPECT_EQ(f[3].second, (std::vector<double>{4}));
}

TEST(OpParams, FingerprintAndEqualityFollowEveryField) {
  const Conv2dParams a = strided_conv();
  Conv2dParams b = a;
  EXPECT_EQ(fingerprint(a), fingerprint(b));
  b.dilation = {1, 2};
  EXPECT_FALSE(a == b);
  EXPECT_NE(fingerprint(a), fingerprint(b));
  // A field's count is part of the fingerprint: {1, 2} then {} differs from {1} then {2}.
  ShapeParams s1, s2;
  s1.sizes = {1, 2};
  s2.sizes = {1};
  s2.start = 2;
  EXPECT_NE(fingerprint(s1), fingerprint(s2));
  // The portable form keeps the fingerprint (a loaded record is identified like the original).
  EXPECT_EQ(fingerprint(a), fingerprint(from_fields<Conv2dParams>(to_fields(a))));
}

TEST(OpParams, FromFieldsRejectsBadFields) {
  ParamFields f = to_fields(strided_conv());
  ParamFields missing(f.begin(), f.end() - 1);
  EXPECT_THROW_MSG(from_fields<Conv2dParams>(missing), ValueError, "parameter field \"groups\" is missing");
  ParamFields extra = f;
  extra.emplace_back("bias", std::vector<double>{1});
  EXPECT_THROW_MSG(from_fields<Conv2dParams>(extra), ValueError, "parameters have 5 fields, expected 4");
  ParamFields short_array = f;
  short_array[0].second = {2};
  EXPECT_THROW_MSG(from_fields<Conv2dParams>(short_array), ValueError,
                   "parameter field \"stride\" has 1 values, expected 2");
  ParamFields fraction = f;
  fraction[3].second = {1.5};
  EXPECT_THROW_MSG(from_fields<Conv2dParams>(fraction), ValueError, "parameter field \"groups\" has 1.5, not an integer");
  ParamFields flag = to_fields(Pool2dParams{});
  flag[4].second = {2};
  EXPECT_THROW_MSG(from_fields<Pool2dParams>(flag), ValueError, "parameter field \"ceil_mode\" has 2, expected 0 or 1");
  ParamFields eps = to_fields(NormParams{});
  eps[0].second = {std::numeric_limits<double>::infinity()};
  EXPECT_THROW_MSG(from_fields<NormParams>(eps), ValueError, "parameter field \"eps\" has inf, not finite");
  ParamFields dims = to_fields(DimParams{});
  dims[0].second.assign(9, 0.0);
  EXPECT_THROW_MSG(from_fields<DimParams>(dims), ValueError, "parameter field \"dims\" has 9 values, more than 8");
}

TEST(OpParams, RegistryExposesThePortableFormOfRecordedOps) {
  const OpDef& conv = op_def(OpKind::kConv2d);
  ASSERT_NE(conv.params_to_fields, nullptr);
  const Conv2dParams p = strided_conv();
  const OpParams back = conv.params_from_fields(conv.params_to_fields(&p));
  EXPECT_EQ(back.as<Conv2dParams>(), p);
  EXPECT_EQ(conv.params_fingerprint(back.get()), fingerprint(p));
  // Ops taking ConvertParams are never recorded and have no portable form.
  EXPECT_EQ(op_def(OpKind::kTo).params_to_fields, nullptr);
}

}  // namespace
}  // namespace dbrq
