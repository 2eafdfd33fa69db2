// The Mse observer (issue 13): the clip range chosen on the histogram must be the one with the
// smallest expected squared quantization error. Checked against a brute-force search that scores
// every pair of bin edges with an independent error estimate (each bin's mass spread over many
// points, each point quantized and dequantized the way the int8 kernels do); on real data its range
// must not quantize worse than MinMax or Histogram. Also: NaN / Inf skipped, merge, saved
// statistics, describe / names, and bad specs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

ObserverSpec mse_spec(int bins = 2048) {
  ObserverSpec s = ObserverSpec::mse();
  s.bins = bins;
  return s;
}

// Round half to even, clamp, dequantize: what quantize_per_tensor + dequantize do.
double fake_quant(double x, const QuantParams& qp, const QuantRange& r) {
  const double q = std::nearbyint(x / qp.scale()) + qp.zero_point();
  return (std::min<double>(std::max<double>(q, r.min), r.max) - qp.zero_point()) * qp.scale();
}

double data_error(const std::vector<float>& x, const QuantParams& qp, const ObserverSpec& spec) {
  const QuantRange r = quant_range(spec.dtype, spec.reduce_range);
  double e = 0.0;
  for (float v : x) {
    const double d = v - fake_quant(v, qp, r);
    e += d * d;
  }
  return e;
}

struct Hist {
  double min, max;
  std::vector<double> counts;
};

Hist histogram_of(const Observer& obs) {
  Hist h;
  for (const auto& [name, v] : obs.stats().fields) {
    if (name == "min") h.min = v[0];
    if (name == "max") h.max = v[0];
    if (name == "histogram") h.counts = v;
  }
  return h;
}

// Expected squared error over the histogram: each bin's count spread over `points` evenly spaced
// points (midpoints of `points` sub-cells), each fake-quantized.
double hist_error(const Hist& h, const QuantParams& qp, const ObserverSpec& spec, int points) {
  const QuantRange r = quant_range(spec.dtype, spec.reduce_range);
  const double w = (h.max - h.min) / h.counts.size();
  double e = 0.0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    if (h.counts[i] == 0.0) continue;
    double s = 0.0;
    for (int k = 0; k < points; ++k) {
      const double x = h.min + w * (i + (k + 0.5) / points);
      const double d = x - fake_quant(x, qp, r);
      s += d * d;
    }
    e += h.counts[i] * s / points;
  }
  return e;
}

// The smallest hist_error over every pair of bin edges (lo <= 0 <= hi).
double brute_force_best(const Hist& h, const ObserverSpec& spec, int points) {
  const int bins = static_cast<int>(h.counts.size());
  const double w = (h.max - h.min) / bins;
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= bins; ++i) {
    const float lo = static_cast<float>(h.min + w * i);
    if (lo > 0.f && i > 0) break;
    for (int j = bins; j >= i; --j) {
      const float hi = static_cast<float>(h.min + w * j);
      if (hi < 0.f && j < bins) break;
      const float l = std::min(lo, 0.f), u = std::max(hi, 0.f);
      if (!(u > l)) continue;
      const QuantParamsPtr qp = calculate_qparams({l}, {u}, spec.dtype, spec.qscheme, spec.reduce_range);
      best = std::min(best, hist_error(h, *qp, spec, points));
    }
  }
  return best;
}

std::vector<float> gaussian_with_outliers(int n, int outliers, uint32_t seed, float shift = 0.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(shift, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = nd(gen);
  std::uniform_int_distribution<int> pos(0, n - 1);
  for (int k = 0; k < outliers; ++k) x[pos(gen)] = (k % 2 ? -1.f : 1.f) * (8.f + k);
  return x;
}

Tensor tensor_of(const std::vector<float>& x) { return from_vector<float>(x, {static_cast<int64_t>(x.size())}); }

// Every pair of edges is searched exhaustively when the histogram is small: the chosen range must
// be the brute-force optimum (up to the reference's integration error).
TEST(MseObserver, MatchesBruteForceOnSmallHistograms) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    for (float shift : {0.f, 1.5f, -1.f}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " shift " << shift);
      const ObserverSpec spec = mse_spec(48);
      auto obs = make_observer(spec);
      obs->observe(tensor_of(gaussian_with_outliers(300, 3, seed, shift)));
      const Hist h = histogram_of(*obs);
      const QuantParamsPtr qp = obs->calculate_qparams();
      const double got = hist_error(h, *qp, spec, 512);
      const double best = brute_force_best(h, spec, 512);
      EXPECT_LE(got, best * 1.002) << "chosen scale " << qp->scale() << " zero point " << qp->zero_point();
    }
  }
}

// A larger histogram goes through the coarse-to-fine search: still within 1% of the optimum.
TEST(MseObserver, CoarseToFineSearchNearBruteForce) {
  for (uint32_t seed : {4u, 5u}) {
    SCOPED_TRACE(seed);
    const ObserverSpec spec = mse_spec(192);
    auto obs = make_observer(spec);
    std::vector<float> x = gaussian_with_outliers(2000, 6, seed, 0.5f);
    obs->observe(tensor_of(x));
    const Hist h = histogram_of(*obs);
    const double got = hist_error(h, *obs->calculate_qparams(), spec, 16);
    const double best = brute_force_best(h, spec, 16);
    EXPECT_LE(got, best * 1.01);
  }
}

// One-sided data (after ReLU): the range starts at 0 (zero point 0), the top is clipped below the
// outliers, and the real data quantizes better than with MinMax's or Histogram's range.
TEST(MseObserver, OneSidedDataBeatsMinMaxAndHistogram) {
  std::vector<float> x = gaussian_with_outliers(20000, 4, 7);
  for (float& v : x) v = std::max(v, 0.f);
  const ObserverSpec spec = mse_spec();
  auto mse = make_observer(spec);
  auto mm = make_observer(ObserverSpec::min_max());
  auto hist = make_observer(ObserverSpec::histogram());
  for (auto* o : {mse.get(), mm.get(), hist.get()}) o->observe(tensor_of(x));
  const QuantParamsPtr qp = mse->calculate_qparams();
  EXPECT_EQ(qp->zero_point(), 0);
  EXPECT_LT(qp->scale() * 255.f, mm->max_val());
  const double e = data_error(x, *qp, spec);
  EXPECT_LT(e, data_error(x, *mm->calculate_qparams(), spec));
  EXPECT_LE(e, data_error(x, *hist->calculate_qparams(), spec));
}

TEST(MseObserver, TwoSidedDataBeatsMinMaxAndHistogram) {
  const std::vector<float> x = gaussian_with_outliers(20000, 6, 8, 0.3f);
  const ObserverSpec spec = mse_spec();
  auto mse = make_observer(spec);
  auto mm = make_observer(ObserverSpec::min_max());
  auto hist = make_observer(ObserverSpec::histogram());
  for (auto* o : {mse.get(), mm.get(), hist.get()}) o->observe(tensor_of(x));
  const double e = data_error(x, *mse->calculate_qparams(), spec);
  EXPECT_LT(e, data_error(x, *mm->calculate_qparams(), spec));
  EXPECT_LE(e, data_error(x, *hist->calculate_qparams(), spec));
}

// Without outliers nothing is worth clipping much: a uniform distribution on [-1, 2] keeps its
// range (the optimum trims about 1/600 of it at each end, where clipping costs less than rounding).
TEST(MseObserver, UniformDataKeepsItsRange) {
  std::vector<float> x(4096);
  for (size_t i = 0; i < x.size(); ++i) x[i] = -1.f + 3.f * static_cast<float>(i) / (x.size() - 1);
  auto obs = make_observer(mse_spec());
  obs->observe(tensor_of(x));
  const QuantParamsPtr qp = obs->calculate_qparams();
  EXPECT_NEAR(qp->scale() * 255.f, 3.f, 3.f * 0.01f);
  EXPECT_NEAR(qp->zero_point() * qp->scale(), 1.f, 3.f * 0.01f);
}

TEST(MseObserver, ConstantDataIncludesTheValue) {
  auto obs = make_observer(mse_spec());
  obs->observe(from_vector<float>({2.5f, 2.5f, 2.5f}));
  const QuantParamsPtr qp = obs->calculate_qparams();
  EXPECT_EQ(qp->zero_point(), 0);
  EXPECT_NEAR(qp->scale() * 255.f, 2.5f, 1e-5f);
}

TEST(MseObserver, NaNAndInfAreCountedAndSkipped) {
  std::vector<float> clean = gaussian_with_outliers(1000, 2, 9);
  std::vector<float> dirty = clean;
  dirty.insert(dirty.begin() + 10, kNaN);
  dirty.insert(dirty.begin() + 20, kInf);
  dirty.insert(dirty.begin() + 30, -kInf);
  auto with = make_observer(mse_spec());
  auto without = make_observer(mse_spec());
  with->observe(tensor_of(dirty));
  without->observe(tensor_of(clean));
  EXPECT_EQ(with->nan_count(), 1);
  EXPECT_EQ(with->inf_count(), 2);
  EXPECT_EQ(*with->calculate_qparams(), *without->calculate_qparams());
  auto only_nan = make_observer(mse_spec());
  only_nan->observe(from_vector<float>({kNaN, kInf}));
  EXPECT_FALSE(only_nan->has_data());
  EXPECT_THROW(only_nan->calculate_qparams(), NotCalibratedError);
}

TEST(MseObserver, MergedHalvesWithinOnePercentOfWhole) {
  const std::vector<float> x = gaussian_with_outliers(8000, 4, 10, 0.2f);
  const std::vector<float> a(x.begin(), x.begin() + 4000), b(x.begin() + 4000, x.end());
  auto whole = make_observer(mse_spec());
  whole->observe(tensor_of(x));
  auto left = make_observer(mse_spec());
  auto right = make_observer(mse_spec());
  left->observe(tensor_of(a));
  right->observe(tensor_of(b));
  left->merge(*right);
  EXPECT_EQ(left->num_batches(), 2);
  const QuantParamsPtr w = whole->calculate_qparams(), m = left->calculate_qparams();
  const float range = whole->max_val() - whole->min_val();
  EXPECT_NEAR(m->scale() * 255.f, w->scale() * 255.f, 0.01f * range);
  EXPECT_NEAR(-m->zero_point() * m->scale(), -w->zero_point() * w->scale(), 0.01f * range);
  auto hist = make_observer(ObserverSpec::histogram());
  EXPECT_THROW(
      {
        try {
          left->merge(*hist);
        } catch (const ValueError& e) {
          EXPECT_NE(std::string(e.what()).find("specs differ"), std::string::npos) << e.what();
          throw;
        }
      },
      ValueError);
}

TEST(MseObserver, SavedStatisticsRestoreTheSameQParams) {
  auto obs = make_observer(mse_spec());
  obs->observe(tensor_of(gaussian_with_outliers(3000, 3, 11)));
  const Observer::Stats st = obs->stats();
  auto fresh = make_observer(mse_spec());
  fresh->load_stats(st);
  EXPECT_EQ(*fresh->calculate_qparams(), *obs->calculate_qparams());
  EXPECT_EQ(fresh->num_batches(), 1);
  // A histogram of the wrong size is a file-format error naming the field.
  Observer::Stats bad = st;
  for (auto& [name, v] : bad.fields) {
    if (name == "histogram") v.resize(10);
  }
  EXPECT_THROW(
      {
        try {
          make_observer(mse_spec())->load_stats(bad);
        } catch (const FileFormatError& e) {
          EXPECT_NE(std::string(e.what()).find("\"histogram\" has 10 values, expected 2048"), std::string::npos)
              << e.what();
          throw;
        }
      },
      FileFormatError);
}

TEST(MseObserver, NamesAndDescription) {
  EXPECT_STREQ(observer_kind_name(ObserverKind::kMse), "Mse");
  EXPECT_EQ(observer_kind_from_name("Mse"), ObserverKind::kMse);
  EXPECT_EQ(ObserverSpec::mse().to_string(), "Mse(dtype=u8, qscheme=per_tensor_affine, bins=2048)");
  EXPECT_EQ(ObserverSpec::mse(DType::kU8, true).to_string(),
            "Mse(dtype=u8, qscheme=per_tensor_affine, reduce_range=true, bins=2048)");
  auto obs = make_observer(mse_spec());
  EXPECT_EQ(obs->describe(), "Mse[empty]");
  obs->observe(from_vector<float>({-1.f, 0.5f, 2.f}));
  EXPECT_EQ(obs->describe(), "Mse[min=-1 max=2]");
  EXPECT_NE(ObserverSpec::mse(), ObserverSpec::histogram());
}

TEST(MseObserver, ReducedRangeAndSignedDataStayInRange) {
  const std::vector<float> x = gaussian_with_outliers(5000, 3, 12);
  for (const ObserverSpec& spec : {ObserverSpec::mse(DType::kU8, true), ObserverSpec::mse(DType::kS8)}) {
    SCOPED_TRACE(spec.to_string());
    auto obs = make_observer(spec);
    obs->observe(tensor_of(x));
    const QuantParamsPtr qp = obs->calculate_qparams();
    const QuantRange r = quant_range(spec.dtype, spec.reduce_range);
    EXPECT_GE(qp->zero_point(), r.min);
    EXPECT_LE(qp->zero_point(), r.max);
    auto mm = make_observer(ObserverSpec::min_max(spec.dtype));
    ObserverSpec mm_spec = mm->spec();
    mm_spec.reduce_range = spec.reduce_range;
    auto mm2 = make_observer(mm_spec);
    mm2->observe(tensor_of(x));
    EXPECT_LT(data_error(x, *qp, spec), data_error(x, *mm2->calculate_qparams(), spec));
  }
}

// The search runs its candidates on several threads; the range must not depend on how many.
TEST(MseObserver, SameRangeForAnyThreadCount) {
  const std::vector<float> x = gaussian_with_outliers(50000, 8, 13, 0.4f);
  auto obs = make_observer(mse_spec());
  obs->observe(tensor_of(x));
  set_num_threads(1);
  const QuantParamsPtr one = obs->calculate_qparams();
  set_num_threads(2);
  const QuantParamsPtr two = obs->calculate_qparams();
  EXPECT_EQ(*one, *two);
}

TEST(MseObserver, RejectsBadSpecsAndInputs) {
  ObserverSpec one_bin = mse_spec(1);
  EXPECT_THROW(
      {
        try {
          make_observer(one_bin);
        } catch (const ValueError& e) {
          EXPECT_NE(std::string(e.what()).find("bins >= 2"), std::string::npos) << e.what();
          throw;
        }
      },
      ValueError);
  ObserverSpec per_channel = mse_spec();
  per_channel.qscheme = QScheme::kPerChannelAffine;
  EXPECT_THROW(
      {
        try {
          make_observer(per_channel);
        } catch (const ValueError& e) {
          EXPECT_NE(std::string(e.what()).find("observer Mse does not support qscheme"), std::string::npos)
              << e.what();
          throw;
        }
      },
      ValueError);
  ObserverSpec f32 = mse_spec();
  f32.dtype = DType::kF32;
  EXPECT_THROW(make_observer(f32), DTypeError);
  auto obs = make_observer(mse_spec());
  EXPECT_THROW(
      {
        try {
          obs->calculate_qparams();
        } catch (const NotCalibratedError& e) {
          EXPECT_NE(std::string(e.what()).find("Mse observer has seen no data"), std::string::npos) << e.what();
          throw;
        }
      },
      NotCalibratedError);
  EXPECT_THROW(obs->observe(from_vector<int64_t>({1, 2})), DTypeError);
  EXPECT_THROW(observer_kind_from_name("mse"), ValueError);
}

}  // namespace
}  // namespace dbrq
