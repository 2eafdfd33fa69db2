// Observer numerics against PyTorch 1.13's observers on the same batches (goldens written by
// tests/quant/make_observer_goldens.py): MinMax (u8 affine, s8 symmetric, reduce_range on and off),
// MovingAverageMinMax and PerChannelMinMax (s8 per-channel symmetric, ch_axis 0 and 1) must give
// bit-identical scales and equal zero points; Histogram (2048 bins) must track PyTorch's min_val /
// max_val and choose a range within 1% of PyTorch's (on integer-edged data with dbrq's real-valued
// bins, and on every dataset with torch_integer_edges, which reproduces 1.13's int() truncation).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using testing::golden;

const std::map<std::string, Tensor>& goldens() {
  static const auto* g =
      new std::map<std::string, Tensor>(testing::load_golden("tests/quant/golden/observers.safetensors"));
  return *g;
}

std::vector<Tensor> batches(const std::string& ds) {
  const int64_t n = golden(goldens(), ds + ".num_batches").to_vector<int64_t>().at(0);
  std::vector<Tensor> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(golden(goldens(), ds + ".batch" + std::to_string(i)));
  return out;
}

std::unique_ptr<Observer> fed(const ObserverSpec& spec, const std::vector<Tensor>& data) {
  auto obs = make_observer(spec);
  for (const Tensor& x : data) obs->observe(x);
  return obs;
}

float golden_scalar(const std::string& name) { return golden(goldens(), name).to_vector<float>().at(0); }
int64_t golden_int(const std::string& name) { return golden(goldens(), name).to_vector<int64_t>().at(0); }

ObserverSpec with_reduce_range(ObserverSpec s) {
  s.reduce_range = true;
  return s;
}

struct MinMaxCase {
  const char* name;  // observer name in the golden file
  ObserverSpec spec;
};

std::vector<MinMaxCase> min_max_cases() {
  return {
      {"minmax_u8", ObserverSpec::min_max(DType::kU8, QScheme::kPerTensorAffine)},
      {"minmax_u8_rr", with_reduce_range(ObserverSpec::min_max(DType::kU8, QScheme::kPerTensorAffine))},
      {"minmax_s8_sym", ObserverSpec::min_max(DType::kS8, QScheme::kPerTensorSymmetric)},
      {"minmax_s8_sym_rr", with_reduce_range(ObserverSpec::min_max(DType::kS8, QScheme::kPerTensorSymmetric))},
      {"mavg_u8", ObserverSpec::moving_average_min_max(0.01, DType::kU8)},
      {"mavg_u8_c05", ObserverSpec::moving_average_min_max(0.5, DType::kU8)},
  };
}

class ObserverGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ObserverGoldenTest, MinMaxAndMovingAverageMatchPyTorchExactly) {
  const std::string ds = GetParam();
  const std::vector<Tensor> data = batches(ds);
  ASSERT_GE(data.size(), 3u);
  for (const MinMaxCase& c : min_max_cases()) {
    SCOPED_TRACE(ds + "." + c.name);
    const std::string key = ds + "." + c.name;
    auto obs = fed(c.spec, data);
    EXPECT_EQ(obs->num_batches(), static_cast<int64_t>(data.size()));
    EXPECT_EQ(obs->min_val(), golden_scalar(key + ".min"));
    EXPECT_EQ(obs->max_val(), golden_scalar(key + ".max"));
    QuantParamsPtr qp = obs->calculate_qparams();
    ASSERT_NE(qp, nullptr);
    EXPECT_FALSE(qp->is_per_channel());
    // Bit-identical scale: float == float.
    EXPECT_EQ(qp->scale(), golden_scalar(key + ".scale"));
    EXPECT_EQ(qp->zero_point(), golden_int(key + ".zero_point"));
  }
}

// The range a (scale, zero point) pair represents: [(qmin - zp) * scale, (qmax - zp) * scale].
std::pair<double, double> dequantized_range(double scale, int64_t zp, DType dtype, bool reduce_range) {
  const QuantRange r = quant_range(dtype, reduce_range);
  return {(r.min - zp) * scale, (r.max - zp) * scale};
}

void expect_histogram_matches(const std::string& ds, const std::string& name, ObserverSpec spec) {
  const std::string key = ds + "." + name;
  SCOPED_TRACE(key + (spec.torch_integer_edges ? " (torch_integer_edges)" : " (real edges)"));
  const std::vector<Tensor> data = batches(ds);
  auto obs = fed(spec, data);
  const float tmin = golden_scalar(key + ".min"), tmax = golden_scalar(key + ".max");
  // min_val / max_val: the histogram's own range after PyTorch's _adjust_min_max growth steps.
  const double data_width = static_cast<double>(tmax) - tmin;
  EXPECT_NEAR(obs->min_val(), tmin, 1e-6 * data_width);
  EXPECT_NEAR(obs->max_val(), tmax, 1e-6 * data_width);

  QuantParamsPtr qp = obs->calculate_qparams();
  const double tscale = golden_scalar(key + ".scale");
  const int64_t tzp = golden_int(key + ".zero_point");
  const auto [tlo, thi] = dequantized_range(tscale, tzp, spec.dtype, spec.reduce_range);
  const auto [lo, hi] = dequantized_range(qp->scale(), qp->zero_point(), spec.dtype, spec.reduce_range);
  const double width = thi - tlo;
  EXPECT_NEAR(lo, tlo, 0.01 * width) << "scale " << qp->scale() << " zp " << qp->zero_point() << " vs PyTorch "
                                     << tscale << " / " << tzp;
  EXPECT_NEAR(hi, thi, 0.01 * width) << "scale " << qp->scale() << " zp " << qp->zero_point() << " vs PyTorch "
                                     << tscale << " / " << tzp;
  if (spec.qscheme == QScheme::kPerTensorSymmetric) {
    EXPECT_EQ(qp->zero_point(), 0);
  }
}

ObserverSpec hist_u8() { return ObserverSpec::histogram(DType::kU8, false); }
ObserverSpec hist_s8_sym() {
  ObserverSpec s = ObserverSpec::histogram(DType::kS8, false);
  s.qscheme = QScheme::kPerTensorSymmetric;
  return s;
}
ObserverSpec torch_edges(ObserverSpec s) {
  s.torch_integer_edges = true;
  return s;
}

TEST_P(ObserverGoldenTest, HistogramWithTorchIntegerEdgesMatchesPyTorch) {
  const std::string ds = GetParam();
  expect_histogram_matches(ds, "hist_u8", torch_edges(hist_u8()));
  expect_histogram_matches(ds, "hist_s8_sym", torch_edges(hist_s8_sym()));
}

INSTANTIATE_TEST_SUITE_P(Datasets, ObserverGoldenTest, ::testing::Values("int", "int_pos", "real", "small"));

// On data whose range has integer endpoints 1.13's truncation changes nothing, so dbrq's default
// (real-valued bins) must agree with PyTorch too.
TEST(ObserverGolden, HistogramRealEdgesMatchPyTorchOnIntegerRanges) {
  for (const char* ds : {"int", "int_pos"}) {
    expect_histogram_matches(ds, "hist_u8", hist_u8());
    expect_histogram_matches(ds, "hist_s8_sym", hist_s8_sym());
  }
}

TEST(ObserverGolden, PerChannelSymmetricMatchesPyTorchExactly) {
  const std::vector<Tensor> data = {golden(goldens(), "w.batch0"), golden(goldens(), "w.batch1")};
  for (int64_t axis : {0, 1}) {
    SCOPED_TRACE("ch_axis " + std::to_string(axis));
    const std::string key = "w.pc_s8_ax" + std::to_string(axis);
    auto obs = fed(ObserverSpec::per_channel_min_max(DType::kS8, QScheme::kPerChannelSymmetric, axis), data);
    QuantParamsPtr qp = obs->calculate_qparams();
    ASSERT_TRUE(qp->is_per_channel());
    EXPECT_EQ(qp->axis, axis);
    const std::vector<float> tscale = golden(goldens(), key + ".scale").to_vector<float>();
    const std::vector<int64_t> tzp = golden(goldens(), key + ".zero_point").to_vector<int64_t>();
    ASSERT_EQ(qp->scales.size(), tscale.size());
    ASSERT_EQ(qp->scales.size(), static_cast<size_t>(data[0].size(axis)));
    for (size_t c = 0; c < tscale.size(); ++c) {
      EXPECT_EQ(qp->scales[c], tscale[c]) << "channel " << c;
      EXPECT_EQ(qp->zero_points[c], tzp[c]) << "channel " << c;
    }
    // The per-channel ranges themselves, through the statistics the observer saves.
    const Observer::Stats st = obs->stats();
    const std::vector<float> tmin = golden(goldens(), key + ".min").to_vector<float>();
    const std::vector<float> tmax = golden(goldens(), key + ".max").to_vector<float>();
    for (const auto& [field, v] : st.fields) {
      const std::vector<float>& ref = field == "min" ? tmin : tmax;
      ASSERT_EQ(v.size(), ref.size()) << field;
      for (size_t c = 0; c < v.size(); ++c) EXPECT_EQ(static_cast<float>(v[c]), ref[c]) << field << " channel " << c;
    }
  }
}

}  // namespace
}  // namespace dbrq
