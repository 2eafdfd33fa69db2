// Observer behaviour beyond the PyTorch goldens: NaN / Inf values are counted and skipped; merge()
// of observers fed halves of the data equals one observer fed everything (exact for MinMax and
// PerChannelMinMax, within 1% of the range for Histogram); Percentile and Entropy clip outliers of a
// Gaussian; FixedQParams returns its parameters; make_observer rejects bad specs; calculate_qparams
// on an observer that saw nothing raises NotCalibratedError.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

ObserverSpec hist_spec() { return ObserverSpec::histogram(DType::kU8, false); }

std::vector<ObserverSpec> per_tensor_specs() {
  return {ObserverSpec::min_max(), ObserverSpec::moving_average_min_max(0.01), hist_spec(),
          ObserverSpec::percentile_of(99.9), ObserverSpec::entropy()};
}

TEST(ObserverNonFinite, NaNAndInfAreCountedAndSkipped) {
  const Tensor x = from_vector<float>({1.5f, kNaN, -2.25f, kInf, 0.5f, -kInf, 3.0f, kNaN}, {2, 4});
  for (const ObserverSpec& spec : per_tensor_specs()) {
    SCOPED_TRACE(spec.to_string());
    auto obs = make_observer(spec);
    obs->observe(x);
    EXPECT_EQ(obs->nan_count(), 2);
    EXPECT_EQ(obs->inf_count(), 2);
    EXPECT_EQ(obs->num_batches(), 1);
    EXPECT_TRUE(obs->has_data());
    EXPECT_EQ(obs->min_val(), -2.25f);
    if (spec.kind == ObserverKind::kHistogram || spec.kind == ObserverKind::kPercentile ||
        spec.kind == ObserverKind::kEntropy || spec.kind == ObserverKind::kMinMax ||
        spec.kind == ObserverKind::kMovingAverageMinMax) {
      EXPECT_EQ(obs->max_val(), 3.0f);
    }
    QuantParamsPtr qp = obs->calculate_qparams();
    EXPECT_TRUE(std::isfinite(qp->scale()));
    EXPECT_GT(qp->scale(), 0.f);
    // A second batch keeps counting.
    obs->observe(x);
    EXPECT_EQ(obs->nan_count(), 4);
    EXPECT_EQ(obs->inf_count(), 4);
  }
}

TEST(ObserverNonFinite, MinMaxQParamsIgnoreNonFiniteValues) {
  auto with = make_observer(ObserverSpec::min_max());
  auto without = make_observer(ObserverSpec::min_max());
  with->observe(from_vector<float>({-1.f, kInf, 2.f, kNaN, -kInf}));
  without->observe(from_vector<float>({-1.f, 2.f}));
  EXPECT_EQ(*with->calculate_qparams(), *without->calculate_qparams());
  EXPECT_EQ(without->nan_count(), 0);
  EXPECT_EQ(without->inf_count(), 0);
}

TEST(ObserverNonFinite, PerChannelSkipsNonFiniteKeepingChannelPositions) {
  // [2 channels, 3]: channel 0 = {1, NaN, -4}, channel 1 = {Inf, 2, 0.5}.
  const Tensor w = from_vector<float>({1.f, kNaN, -4.f, kInf, 2.f, 0.5f}, {2, 3});
  auto obs = make_observer(ObserverSpec::per_channel_min_max(DType::kS8, QScheme::kPerChannelSymmetric, 0));
  obs->observe(w);
  EXPECT_EQ(obs->nan_count(), 1);
  EXPECT_EQ(obs->inf_count(), 1);
  QuantParamsPtr qp = obs->calculate_qparams();
  ASSERT_EQ(qp->scales.size(), 2u);
  EXPECT_EQ(qp->scales[0], 4.f / 127.5f);
  EXPECT_EQ(qp->scales[1], 2.f / 127.5f);
}

TEST(ObserverNonFinite, AllNonFiniteBatchLeavesObserverEmpty) {
  auto obs = make_observer(ObserverSpec::min_max());
  obs->observe(from_vector<float>({kNaN, kInf}));
  EXPECT_EQ(obs->num_batches(), 1);
  EXPECT_FALSE(obs->has_data());
  EXPECT_THROW_MSG(obs->calculate_qparams(), NotCalibratedError, "seen no data");
}

// Scores in [-2, 2] (16 values) with `masked` of them replaced by `fill` (or by fill + score).
Tensor scores_with(int masked, float fill, bool add_scores = false) {
  std::vector<float> v = {0.5f, 1.5f, -2.f, 2.f, 0.25f, -1.f, 1.f, -0.5f, 0.75f, -1.5f, 1.25f, 0.f, -0.25f, 1.75f, -1.25f, 0.1f};
  for (int i = 0; i < masked; ++i) v[static_cast<size_t>(3 * i + 1)] = add_scores ? fill + v[static_cast<size_t>(3 * i + 1)] : fill;
  return from_vector<float>(v, {2, 8});
}

// A far group of negative values (a finite -inf stand-in in a mask) is counted; ordinary data is not.
TEST(ObserverMaskValues, AFarLowGroupIsCountedOncePerTensor) {
  for (const ObserverSpec& spec : per_tensor_specs()) {
    SCOPED_TRACE(spec.to_string());
    auto obs = make_observer(spec);
    obs->observe(scores_with(2, -1e9f));
    EXPECT_EQ(obs->mask_count(), 1);
    obs->observe(scores_with(4, -1e4f, /*add_scores=*/true));
    EXPECT_EQ(obs->mask_count(), 2);
    obs->observe(randn({4, 16}, 3));
    EXPECT_EQ(obs->mask_count(), 2);
    EXPECT_EQ(obs->num_batches(), 3);
    // With non-finite values too: they are skipped, the far group still counts.
    std::vector<float> with_nan = scores_with(3, std::numeric_limits<float>::lowest()).to_vector<float>();
    with_nan.push_back(kNaN);
    with_nan.push_back(kInf);
    obs->observe(from_vector<float>(with_nan));
    EXPECT_EQ(obs->mask_count(), 3);
    // Merged and restored, the count goes along.
    auto other = obs->clone_empty();
    other->merge(*obs);
    EXPECT_EQ(other->mask_count(), 3);
    auto loaded = obs->clone_empty();
    loaded->load_stats(obs->stats());
    EXPECT_EQ(loaded->mask_count(), 3);
  }
}

TEST(ObserverMaskValues, OrdinaryRangesAreNotMasks) {
  auto obs = make_observer(ObserverSpec::min_max());
  // The mask itself: two values, nothing else to lose. int8 holds 0 and -1e9 exactly.
  obs->observe(from_vector<float>({0, -1e9f, 0, 0, -1e9f, 0, 0, -1e9f, 0, 0, 0, 0, 0, 0, 0, 0}));
  // One far value alone is an outlier, not a group.
  obs->observe(scores_with(1, -1e9f));
  // A far group at the high end (not how masks are written).
  obs->observe(scores_with(2, 1e9f));
  // A long tail: values in between.
  obs->observe(from_vector<float>({-100.f, -99.f, -60.f, -20.f, 0.f, 1.f, 2.f, 0.5f, -40.f, -80.f, 1.5f, 0.f, -10.f,
                                   -30.f, 0.25f, 1.f}));
  // Not negative: a softmax row whose largest values sit together (like a peaked attention).
  obs->observe(from_vector<float>({0.001f, 0.999f, 0.0005f, 0.9985f, 0.001f, 0.999f, 0.0f, 0.998f, 0.0012f, 0.999f,
                                   0.0007f, 0.9989f, 0.001f, 0.9991f, 0.0f, 0.9986f}));
  // A negative group not far enough below the rest's spread (64x): an activation with a negative
  // channel, which int8 still resolves.
  obs->observe(scores_with(4, -150.f));
  // Constant and small tensors.
  obs->observe(full({16}, -3.f));
  obs->observe(from_vector<float>({-1e9f, -1e9f, 1.f, 2.f, 1.5f, 1.25f, 1.75f, 1.1f}));
  EXPECT_EQ(obs->mask_count(), 0);
  // Per-channel (weight), fixed-parameter and placeholder observers do not look.
  auto pc = make_observer(ObserverSpec::per_channel_min_max(DType::kS8, QScheme::kPerChannelSymmetric, 0));
  pc->observe(scores_with(4, -1e9f));
  EXPECT_EQ(pc->mask_count(), 0);
  auto fixed = make_observer(ObserverSpec::fixed(1.f / 256, 0));
  fixed->observe(scores_with(4, -1e9f));
  EXPECT_EQ(fixed->mask_count(), 0);
  auto placeholder = make_observer(ObserverSpec::placeholder(DType::kU8));
  placeholder->observe(scores_with(4, -1e9f));
  EXPECT_EQ(placeholder->mask_count(), 0);
}

// ---------------------------------------------------------------------------------------------

std::vector<Tensor> gaussian_batches(int n, uint64_t seed) {
  std::vector<Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(randn({2, 4, 8, 8}, seed + i) * (0.6 + 0.25 * i) + 0.2 * i);
  return out;
}

TEST(ObserverMerge, MinMaxHalvesEqualWhole) {
  const std::vector<Tensor> data = gaussian_batches(6, 11);
  auto whole = make_observer(ObserverSpec::min_max());
  auto a = make_observer(ObserverSpec::min_max());
  auto b = make_observer(ObserverSpec::min_max());
  for (size_t i = 0; i < data.size(); ++i) {
    whole->observe(data[i]);
    (i < 3 ? a : b)->observe(data[i]);
  }
  a->merge(*b);
  EXPECT_EQ(a->min_val(), whole->min_val());
  EXPECT_EQ(a->max_val(), whole->max_val());
  EXPECT_EQ(a->num_batches(), whole->num_batches());
  EXPECT_EQ(*a->calculate_qparams(), *whole->calculate_qparams());
}

TEST(ObserverMerge, MergeIntoEmptyAndFromEmpty) {
  const std::vector<Tensor> data = gaussian_batches(2, 3);
  auto full = make_observer(ObserverSpec::min_max());
  for (const Tensor& x : data) full->observe(x);
  auto empty = make_observer(ObserverSpec::min_max());
  auto target = empty->clone_empty();
  target->merge(*full);
  EXPECT_EQ(*target->calculate_qparams(), *full->calculate_qparams());
  full->merge(*empty);
  EXPECT_EQ(*target->calculate_qparams(), *full->calculate_qparams());
}

TEST(ObserverMerge, PerChannelHalvesEqualWhole) {
  const ObserverSpec spec = ObserverSpec::per_channel_min_max(DType::kS8, QScheme::kPerChannelSymmetric, 1);
  auto whole = make_observer(spec);
  auto a = make_observer(spec);
  auto b = make_observer(spec);
  for (int i = 0; i < 4; ++i) {
    const Tensor w = randn({6, 5, 3, 3}, 70 + i) * (1.0 + i);
    whole->observe(w);
    (i % 2 == 0 ? a : b)->observe(w);
  }
  a->merge(*b);
  QuantParamsPtr qa = a->calculate_qparams(), qw = whole->calculate_qparams();
  ASSERT_EQ(qa->scales.size(), 5u);
  EXPECT_EQ(*qa, *qw);
}

TEST(ObserverMerge, HistogramHalvesWithinOnePercent) {
  const std::vector<Tensor> data = gaussian_batches(6, 21);
  for (bool torch_edges : {false, true}) {
    SCOPED_TRACE(torch_edges ? "torch_integer_edges" : "real edges");
    ObserverSpec spec = hist_spec();
    spec.torch_integer_edges = torch_edges;
    auto whole = make_observer(spec);
    auto a = make_observer(spec);
    auto b = make_observer(spec);
    for (size_t i = 0; i < data.size(); ++i) {
      whole->observe(data[i]);
      (i < 3 ? a : b)->observe(data[i]);
    }
    a->merge(*b);
    const double width = whole->max_val() - whole->min_val();
    EXPECT_NEAR(a->min_val(), whole->min_val(), 0.01 * width);
    EXPECT_NEAR(a->max_val(), whole->max_val(), 0.01 * width);
    QuantParamsPtr qa = a->calculate_qparams(), qw = whole->calculate_qparams();
    const double lo_a = -qa->zero_point() * qa->scale(), hi_a = (255 - qa->zero_point()) * qa->scale();
    const double lo_w = -qw->zero_point() * qw->scale(), hi_w = (255 - qw->zero_point()) * qw->scale();
    EXPECT_NEAR(lo_a, lo_w, 0.01 * (hi_w - lo_w));
    EXPECT_NEAR(hi_a, hi_w, 0.01 * (hi_w - lo_w));
  }
}

TEST(ObserverMerge, DifferentSpecsAreRejected) {
  auto a = make_observer(ObserverSpec::min_max());
  auto b = make_observer(hist_spec());
  EXPECT_THROW_MSG(a->merge(*b), ValueError, "specs differ");
}

// ---------------------------------------------------------------------------------------------

// 20000 standard-normal values plus a handful of large outliers on both sides.
Tensor gaussian_with_outliers() {
  std::vector<float> v = randn({20000}, 5).to_vector<float>();
  for (int i = 0; i < 5; ++i) {
    v[i * 97] = 40.f + i;
    v[i * 97 + 1] = -35.f - i;
  }
  return from_vector<float>(v, {20000});
}

TEST(ObserverClipping, PercentileClipsOutliers) {
  auto obs = make_observer(ObserverSpec::percentile_of(99.9));
  obs->observe(gaussian_with_outliers());
  EXPECT_EQ(obs->min_val(), -39.f);
  EXPECT_EQ(obs->max_val(), 44.f);
  QuantParamsPtr qp = obs->calculate_qparams();
  const double lo = -qp->zero_point() * qp->scale(), hi = (255 - qp->zero_point()) * qp->scale();
  // 99.9% of a standard normal lies within about +-3.3; the chosen range must clip the outliers
  // but keep the bulk.
  EXPECT_LT(hi, 6.0);
  EXPECT_GT(hi, 2.5);
  EXPECT_GT(lo, -6.0);
  EXPECT_LT(lo, -2.5);
}

TEST(ObserverClipping, PercentileKeepsZeroForOneSidedData) {
  std::vector<float> v = randn({10000}, 8).to_vector<float>();
  for (float& x : v) x = std::abs(x);
  v[0] = 30.f;
  auto obs = make_observer(ObserverSpec::percentile_of(99.9));
  obs->observe(from_vector<float>(v));
  QuantParamsPtr qp = obs->calculate_qparams();
  EXPECT_EQ(qp->zero_point(), 0);
  EXPECT_LT(255 * qp->scale(), 6.0);
}

TEST(ObserverClipping, EntropyThresholdInsideDataRange) {
  const Tensor x = gaussian_with_outliers();
  auto obs = make_observer(ObserverSpec::entropy());
  obs->observe(x);
  EXPECT_EQ(obs->min_val(), -39.f);
  EXPECT_EQ(obs->max_val(), 44.f);
  QuantParamsPtr qp = obs->calculate_qparams();
  const double lo = -qp->zero_point() * qp->scale(), hi = (255 - qp->zero_point()) * qp->scale();
  // The threshold lies inside the data's range and well below the outliers.
  EXPECT_GT(hi, 1.0);
  EXPECT_LT(hi, 20.0);
  EXPECT_LT(lo, -1.0);
  EXPECT_GT(lo, -20.0);
  EXPECT_GE(lo, obs->min_val() - qp->scale());
  EXPECT_LE(hi, obs->max_val() + qp->scale());
}

TEST(ObserverClipping, HistogramObserverAlsoDropsFarOutliers) {
  auto obs = make_observer(hist_spec());
  obs->observe(gaussian_with_outliers());
  QuantParamsPtr qp = obs->calculate_qparams();
  const double hi = (255 - qp->zero_point()) * qp->scale();
  EXPECT_LT(hi, 44.0);
}

// ---------------------------------------------------------------------------------------------

TEST(FixedQParams, ReturnsItsParametersWithOrWithoutData) {
  auto obs = make_observer(ObserverSpec::fixed(2.f / 256.f, 128));
  EXPECT_TRUE(obs->has_data());
  QuantParamsPtr qp = obs->calculate_qparams();
  EXPECT_EQ(qp->scale(), 2.f / 256.f);
  EXPECT_EQ(qp->zero_point(), 128);
  obs->observe(randn({100}, 1) * 50.0);
  QuantParamsPtr again = obs->calculate_qparams();
  EXPECT_EQ(again->scale(), 2.f / 256.f);
  EXPECT_EQ(again->zero_point(), 128);
  EXPECT_FLOAT_EQ(obs->min_val(), -1.f);
  EXPECT_FLOAT_EQ(obs->max_val(), 127.f / 128.f);
}

TEST(PlaceholderObserver, HasNoStaticParameters) {
  auto obs = make_observer(ObserverSpec::placeholder());
  EXPECT_TRUE(obs->has_data());
  EXPECT_EQ(obs->calculate_qparams(), nullptr);
}

// ---------------------------------------------------------------------------------------------

TEST(MakeObserver, RejectsBadSpecs) {
  EXPECT_THROW_MSG(make_observer(ObserverSpec::min_max(DType::kF32)), DTypeError,
                   "observer dtype must be u8 or s8, got f32");
  EXPECT_THROW_MSG(make_observer(ObserverSpec::min_max(DType::kS32)), DTypeError, "got s32");
  EXPECT_THROW_MSG(make_observer(ObserverSpec::min_max(DType::kU8, QScheme::kPerChannelAffine)), ValueError,
                   "observer MinMax does not support qscheme per_channel_affine");
  EXPECT_THROW_MSG(make_observer(ObserverSpec::per_channel_min_max(DType::kS8, QScheme::kPerTensorSymmetric)),
                   ValueError, "observer PerChannelMinMax does not support qscheme per_tensor_symmetric");
  EXPECT_THROW_MSG(make_observer(ObserverSpec::moving_average_min_max(0.0)), ValueError,
                   "averaging_constant must be in (0, 1], got 0");
  EXPECT_THROW_MSG(make_observer(ObserverSpec::moving_average_min_max(1.5)), ValueError, "got 1.5");
  ObserverSpec bins = hist_spec();
  bins.bins = 1;
  EXPECT_THROW_MSG(make_observer(bins), ValueError, "bins >= 2");
  ObserverSpec up = hist_spec();
  up.upsample_rate = 0;
  EXPECT_THROW_MSG(make_observer(up), ValueError, "upsample_rate >= 1");
  EXPECT_THROW_MSG(make_observer(ObserverSpec::percentile_of(0.0)), ValueError, "percentile must be in (0, 100]");
  EXPECT_THROW_MSG(make_observer(ObserverSpec::percentile_of(100.5)), ValueError, "got 100.5");
  EXPECT_THROW_MSG(make_observer(ObserverSpec::fixed(0.01f, 300)), ValueError,
                   "zero point 300 is outside the u8 range");
  EXPECT_THROW_MSG(make_observer(ObserverSpec::fixed(0.01f, -129, DType::kS8)), ValueError, "outside the s8 range");
  // QConfig::make validates its specs up front.
  EXPECT_THROW_MSG(QConfig::make(ObserverSpec::min_max(DType::kF32), ObserverSpec::per_channel_min_max()), DTypeError,
                   "observer dtype must be u8 or s8");
}

TEST(MakeObserver, ObserveRejectsNonF32) {
  auto obs = make_observer(ObserverSpec::min_max());
  EXPECT_THROW_MSG(obs->observe(zeros({3}, DType::kU8)), DTypeError, "can only observe f32 tensors, got u8");
  EXPECT_THROW_MSG(obs->observe(Tensor()), ValueError, "undefined");
  obs->observe(zeros({0}));  // empty: ignored
  EXPECT_FALSE(obs->has_data());
}

TEST(MakeObserver, PerChannelAxisOutOfRange) {
  auto obs = make_observer(ObserverSpec::per_channel_min_max(DType::kS8, QScheme::kPerChannelSymmetric, 3));
  EXPECT_THROW_MSG(obs->observe(randn({2, 3}, 1)), ValueError, "ch_axis 3 is out of range");
}

TEST(CalculateQParams, EmptyObserverRaisesNotCalibrated) {
  for (const ObserverSpec& spec :
       {ObserverSpec::min_max(), ObserverSpec::moving_average_min_max(), hist_spec(), ObserverSpec::percentile_of(),
        ObserverSpec::entropy(), ObserverSpec::per_channel_min_max()}) {
    SCOPED_TRACE(spec.to_string());
    auto obs = make_observer(spec);
    EXPECT_FALSE(obs->has_data());
    EXPECT_EQ(obs->num_batches(), 0);
    EXPECT_THROW_MSG(obs->calculate_qparams(), NotCalibratedError, "observer has seen no data");
  }
  EXPECT_THROW_MSG(calculate_qparams({1.f}, {-1.f}, DType::kU8, QScheme::kPerTensorAffine, false), NotCalibratedError,
                   "is empty or not finite");
}

TEST(CalculateQParams, KnownValues) {
  // The header's example: [-1, 3] on u8 -> 4/255, zero point 64.
  QuantParamsPtr qp = calculate_qparams({-1.f}, {3.f}, DType::kU8, QScheme::kPerTensorAffine, false);
  EXPECT_EQ(qp->scale(), 4.f / 255.f);
  EXPECT_EQ(qp->zero_point(), 64);
  // A range not containing 0 is widened to include it.
  qp = calculate_qparams({1.f}, {3.f}, DType::kU8, QScheme::kPerTensorAffine, false);
  EXPECT_EQ(qp->scale(), 3.f / 255.f);
  EXPECT_EQ(qp->zero_point(), 0);
  // All-zero data: the eps floor.
  qp = calculate_qparams({0.f}, {0.f}, DType::kU8, QScheme::kPerTensorAffine, false);
  EXPECT_EQ(qp->scale(), kScaleEps);
}

}  // namespace
}  // namespace dbrq
