// Entropy observer (TensorRT's KL-divergence calibrator) against an independent NumPy port of NVIDIA
// pytorch-quantization's _compute_amax_entropy (tests/quant/make_entropy_goldens.py): on the same
// histogram of |x| dbrq must pick the same threshold bin. Plus the failure that motivated the
// port: on ReLU outputs (a spike of zeros, 256 unsigned levels) the old search clipped to a
// quarter of the range; Entropy must keep all but a small fraction of the samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using testing::golden;

const std::map<std::string, Tensor>& goldens() {
  static const auto* g =
      new std::map<std::string, Tensor>(testing::load_golden("tests/quant/golden/entropy.safetensors"));
  return *g;
}

float scalar(const std::string& name) { return golden(goldens(), name).to_vector<float>().at(0); }

// An Entropy observer holding the golden case's histogram, as if it had seen the data.
std::unique_ptr<Observer> loaded(const std::string& c) {
  auto obs = make_observer(ObserverSpec::entropy());
  Observer::Stats s;
  const std::vector<float> h = golden(goldens(), c + ".hist").to_vector<float>();
  s.fields = {{"min", {scalar(c + ".min")}},
              {"max", {scalar(c + ".max")}},
              {"abs_min", {0.0}},
              {"abs_max", {scalar(c + ".abs_max")}},
              {"abs_histogram", std::vector<double>(h.begin(), h.end())}};
  s.num_batches = 1;
  obs->load_stats(s);
  return obs;
}

class EntropyReference : public ::testing::TestWithParam<std::string> {};

TEST_P(EntropyReference, PicksTheSameThresholdAsPytorchQuantization) {
  const std::string c = GetParam();
  auto obs = loaded(c);
  const float mn = scalar(c + ".min"), mx = scalar(c + ".max"), abs_max = scalar(c + ".abs_max");
  const int64_t bin = golden(goldens(), c + ".bin").to_vector<int64_t>().at(0);
  const double t = abs_max * static_cast<double>(bin) / 2048.0;
  QuantParamsPtr qp = obs->calculate_qparams();
  const double lo = -qp->zero_point() * qp->scale(), hi = (255 - qp->zero_point()) * qp->scale();
  // The range is [-t, t] cut to the data; dbrq::calculate_qparams then widens it to include 0 and
  // rounds the zero point, so compare the width (exact up to float rounding) rather than the ends.
  const double want = std::min<double>(mx, t) - std::max<double>(std::min(mn, 0.f), -t);
  const double one_bin = abs_max / 2048.0;
  EXPECT_NEAR(hi - lo, want, 1e-4 * want) << c << ": reference bin " << bin << " (t=" << t << "), dbrq range ["
                                           << lo << ", " << hi << "], bin width " << one_bin;
  // And each end on its own, within the zero point's rounding (one step): the width alone would
  // not see a range shifted to one side (the signed cases clip both ends, so both are checked).
  const double want_lo = std::max<double>(std::min(mn, 0.f), -t), want_hi = std::min<double>(mx, t);
  EXPECT_NEAR(lo, want_lo, qp->scale()) << c;
  EXPECT_NEAR(hi, want_hi, qp->scale()) << c;
}

INSTANTIATE_TEST_SUITE_P(Goldens, EntropyReference,
                         ::testing::Values("relu_normal", "relu_exponential", "halfnormal_outliers", "signed_outliers",
                                           "signed_laplace"));

double clipped_fraction(const std::vector<float>& v, double hi) {
  int64_t n = 0;
  for (float x : v) n += x > hi;
  return static_cast<double>(n) / static_cast<double>(v.size());
}

// ReLU of a normal: half the samples are exactly 0. The old search (zero spike merged into the
// first level, one histogram bin per level below bin 512) clipped at about 0.55 of the maximum,
// cutting ~1% of the samples; TensorRT's search keeps nearly everything.
TEST(EntropyOnReluData, KeepsAllButATinyFractionOfTheSamples) {
  for (int seed : {3, 17}) {
    std::vector<float> v = randn({100000}, seed).to_vector<float>();
    for (float& x : v) x = std::max(x, 0.f);
    auto obs = make_observer(ObserverSpec::entropy());
    obs->observe(from_vector<float>(v));
    QuantParamsPtr qp = obs->calculate_qparams();
    EXPECT_EQ(qp->zero_point(), 0);
    const double hi = 255 * qp->scale();
    EXPECT_LT(clipped_fraction(v, hi), 1e-3) << "seed " << seed << ": threshold " << hi << " of max "
                                              << obs->max_val();
  }
}

TEST(EntropyOnReluData, ExponentialWithZerosKeepsAllButATinyFraction) {
  // Exponential quantiles (-log(1 - u) on a uniform grid of u), 40% of the samples set to 0.
  const int n = 100000;
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = i % 5 < 2 ? 0.f : static_cast<float>(-std::log1p(-(i + 0.5) / n));
  auto obs = make_observer(ObserverSpec::entropy());
  obs->observe(from_vector<float>(v));
  const double hi = 255 * obs->calculate_qparams()->scale();
  EXPECT_LT(clipped_fraction(v, hi), 1e-3) << "threshold " << hi << " of max " << obs->max_val();
}

}  // namespace
}  // namespace dbrq
