#include "quant_state/observers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <omp.h>

#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "core/threading.h"

namespace dbrq {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Below this many values a scan runs on the calling thread alone.
constexpr int64_t kParallelMin = 1 << 16;

// Threads for a scan over n values (the team follows dbrq::set_num_threads).
int scan_threads(int64_t n) {
  if (n < kParallelMin) return 1;
  apply_thread_setting();
  return get_num_threads();
}

// Min and max of n finite values (n >= 1). Exact in any order, so the split does not matter.
std::pair<float, float> min_max_of(const float* x, int64_t n) {
  float mn = x[0], mx = x[0];
#pragma omp parallel for simd num_threads(scan_threads(n)) reduction(min : mn) reduction(max : mx)
  for (int64_t i = 0; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  return {mn, mx};
}

// ---------------------------------------------------------------------------------------------
// A histogram over [min, max] that grows its range the way PyTorch's HistogramObserver does:
// when new data falls outside, the old histogram is upsampled onto a finer grid aligned with the
// new range and re-binned (without materializing the fine grid).
class RangeHistogram {
 public:
  // anchor_at_zero: the range always includes 0 (for histograms of |x|, whose thresholds count
  // from 0).
  RangeHistogram(int bins, int upsample_rate, bool integer_edges, bool anchor_at_zero = false)
      : bins_(bins),
        upsample_(upsample_rate),
        integer_edges_(integer_edges),
        anchor_at_zero_(anchor_at_zero),
        hist_(bins, 0.0) {}

  bool empty() const { return min_ == kInf && max_ == -kInf; }
  float min() const { return min_; }
  float max() const { return max_; }
  const std::vector<double>& counts() const { return hist_; }
  int bins() const { return bins_; }

  void add(const float* x, int64_t n) {
    if (n == 0) return;
    auto [mn, mx] = min_max_of(x, n);
    if (anchor_at_zero_) mn = std::min(mn, 0.f);
    const bool same_values = min_ == max_;
    if (empty() || same_values) {
      min_ = mn;
      max_ = mx;
      std::fill(hist_.begin(), hist_.end(), 0.0);
      histc(x, n, min_, max_, &hist_, mn, mx);
      return;
    }
    float cmin = std::min(mn, min_), cmax = std::max(mx, max_);
    // _adjust_min_max: make the new range an integer multiple of the old fine grid.
    const float hist_bin_width = (max_ - min_) / static_cast<float>(bins_ * upsample_);
    const double ratio = std::ceil((static_cast<double>(cmax) - cmin) / (static_cast<double>(bins_) * hist_bin_width));
    if (!(ratio <= static_cast<double>(int64_t{1} << 40))) {
      // The new range is so much wider (a -3.4e38 mask value after ordinary data) that the old
      // grid cannot divide it: the old range lies inside one new bin, which takes all its counts.
      std::vector<double> combined(bins_, 0.0);
      histc(x, n, cmin, cmax, &combined, mn, mx);
      const double at = (0.5 * (static_cast<double>(min_) + max_) - cmin) / (static_cast<double>(cmax) - cmin) * bins_;
      const int j = at < 0 ? 0 : at >= bins_ ? bins_ - 1 : static_cast<int>(at);
      for (int i = 0; i < bins_; ++i) combined[static_cast<size_t>(j)] += hist_[static_cast<size_t>(i)];
      hist_ = std::move(combined);
      min_ = cmin;
      max_ = cmax;
      return;
    }
    const int64_t downsample = static_cast<int64_t>(std::ceil((cmax - cmin) / (static_cast<float>(bins_) * hist_bin_width)));
    const float e = static_cast<float>(downsample) * (static_cast<float>(bins_) * hist_bin_width) - (cmax - cmin);
    cmax = cmax + e;
    const int64_t start_idx = static_cast<int64_t>(std::nearbyint((min_ - cmin) / hist_bin_width));
    std::vector<double> combined(bins_, 0.0);
    histc(x, n, cmin, cmax, &combined, mn, mx);
    if (cmin == min_ && cmax == max_) {
      for (int i = 0; i < bins_; ++i) combined[i] += hist_[i];
    } else {
      add_rebinned(hist_, downsample, start_idx, &combined);
    }
    hist_ = std::move(combined);
    min_ = cmin;
    max_ = cmax;
  }

  // Folds another histogram in by treating its bins as data spread uniformly in each bin.
  void merge(const RangeHistogram& o) {
    if (o.empty()) return;
    if (empty()) {
      *this = o;
      return;
    }
    // Re-express both on the union range with our bin count: the other histogram's bins are
    // re-binned exactly (uniform density within a bin), like PyTorch's upsample step.
    const double lo = std::min<double>(min_, o.min_), hi = std::max<double>(max_, o.max_);
    std::vector<double> out(bins_, 0.0);
    rebin_uniform(hist_, min_, max_, lo, hi, &out);
    rebin_uniform(o.hist_, o.min_, o.max_, lo, hi, &out);
    hist_ = std::move(out);
    min_ = static_cast<float>(lo);
    max_ = static_cast<float>(hi);
  }

  void set(float mn, float mx, std::vector<double> counts) {
    min_ = mn;
    max_ = mx;
    hist_ = std::move(counts);
  }

 private:
  // torch.histc over [lo, hi] (values outside are dropped; hi itself lands in the last bin).
  void histc(const float* x, int64_t n, float lo, float hi, std::vector<double>* out, float data_min,
             float data_max) const {
    if (integer_edges_) {
      // PyTorch 1.13 passes min=int(min_val), max=int(max_val) to torch.histc.
      lo = std::trunc(lo);
      hi = std::trunc(hi);
      if (lo == 0.f && hi == 0.f) {
        lo = data_min;
        hi = data_max;
      }
    }
    if (lo == hi) {
      lo -= 1.f;
      hi += 1.f;
    }
    const float width = hi - lo;
    // A range near the float limits (a -3.4e38 mask value): (v - lo) * bins would overflow to inf
    // (and its cast is undefined), so such ranges divide first. Ordinary ranges keep torch.histc's
    // order of operations.
    const bool huge = !(width <= std::numeric_limits<float>::max() / static_cast<float>(bins_));
    // Integer counts per thread, added up at the end: exact, so the split does not matter.
    const int nt = scan_threads(n);
    std::vector<int64_t> counts(static_cast<size_t>(nt) * bins_, 0);
#pragma omp parallel num_threads(nt)
    {
      const int t = omp_get_thread_num(), team = omp_get_num_threads();
      const int64_t chunk = (n + team - 1) / team, begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
      int64_t* c = counts.data() + static_cast<size_t>(t) * bins_;
      for (int64_t i = begin; i < end; ++i) {
        const float v = x[i];
        if (v < lo || v > hi) continue;
        const double f = huge ? (static_cast<double>(v) - lo) / width * bins_
                              : static_cast<double>((v - lo) * static_cast<float>(bins_) / width);
        const int64_t pos = f < static_cast<double>(bins_) ? static_cast<int64_t>(f) : bins_ - 1;
        ++c[pos];
      }
    }
    for (int t = 0; t < nt; ++t) {
      const int64_t* c = counts.data() + static_cast<size_t>(t) * bins_;
      for (int b = 0; b < bins_; ++b) (*out)[b] += static_cast<double>(c[b]);
    }
  }

  // _combine_histograms: old bin i covers fine cells [s + i*up, s + (i+1)*up) of a grid whose
  // output bin j covers cells [j*D, (j+1)*D); each output bin gets (overlap / up) of each old bin.
  void add_rebinned(const std::vector<double>& old, int64_t d, int64_t s, std::vector<double>* out) const {
    const int64_t up = upsample_;
    const int64_t total_cells = static_cast<int64_t>(bins_) * d;
    for (int i = 0; i < bins_; ++i) {
      if (old[i] == 0.0) continue;
      int64_t c0 = s + i * up, c1 = c0 + up;
      c0 = std::max<int64_t>(c0, 0);
      c1 = std::min<int64_t>(c1, total_cells);
      while (c0 < c1) {
        const int64_t j = c0 / d;
        const int64_t next = std::min<int64_t>((j + 1) * d, c1);
        (*out)[j] += old[i] * static_cast<double>(next - c0) / static_cast<double>(up);
        c0 = next;
      }
    }
  }

  void rebin_uniform(const std::vector<double>& src, double smin, double smax, double lo, double hi,
                     std::vector<double>* out) const {
    const int n = static_cast<int>(src.size());
    const double sw = (smax - smin) / n, dw = (hi - lo) / bins_;
    for (int i = 0; i < n; ++i) {
      if (src[i] == 0.0) continue;
      if (sw == 0.0 || dw == 0.0) {
        const int j = dw == 0.0 ? 0 : std::min(bins_ - 1, static_cast<int>((smin - lo) / dw));
        (*out)[j] += src[i];
        continue;
      }
      double a = smin + i * sw;
      const double b = a + sw;
      while (a < b - 1e-12 * std::abs(b)) {
        int j = std::min(bins_ - 1, std::max(0, static_cast<int>((a - lo) / dw)));
        const double edge = std::min(b, lo + (j + 1) * dw);
        const double frac = edge > a ? (edge - a) / sw : 1.0;
        (*out)[j] += src[i] * frac;
        if (edge <= a) break;
        a = edge;
      }
    }
  }

  int bins_, upsample_;
  bool integer_edges_, anchor_at_zero_;
  std::vector<double> hist_;
  float min_ = kInf, max_ = -kInf;
};

// PyTorch's _compute_quantization_error, in float32 like the original.
float quantization_error(const std::vector<double>& hist, float min_val, float max_val, int start_bin, int end_bin,
                         int dst_nbins) {
  const int bins = static_cast<int>(hist.size());
  const float bin_width = (max_val - min_val) / static_cast<float>(bins);
  const float dst_bin_width = bin_width * static_cast<float>(end_bin - start_bin + 1) / static_cast<float>(dst_nbins);
  if (dst_bin_width == 0.f) return 0.f;
  auto get_norm = [](float begin, float end, float density) {
    return density * ((end * end * end - begin * begin * begin) / 3.f);
  };
  float norm_sum = 0.f;
  const float half = dst_bin_width / 2.f;
  for (int i = 0; i < bins; ++i) {
    const float src_begin = static_cast<float>(i - start_bin) * bin_width;
    const float src_end = src_begin + bin_width;
    const float dst_of_begin =
        std::min(std::max(std::floor(src_begin / dst_bin_width), 0.f), static_cast<float>(dst_nbins - 1));
    const float dst_of_end =
        std::min(std::max(std::floor(src_end / dst_bin_width), 0.f), static_cast<float>(dst_nbins - 1));
    const float density = static_cast<float>(hist[i]) / bin_width;
    const float dst_of_begin_center = (dst_of_begin + 0.5f) * dst_bin_width;
    float norm = get_norm(src_begin - dst_of_begin_center, half, density);
    norm += (dst_of_end - dst_of_begin - 1.f) * get_norm(-half, half, density);
    const float dst_of_end_center = dst_of_end * dst_bin_width + half;
    norm += get_norm(-half, src_end - dst_of_end_center, density);
    norm_sum += norm;
  }
  return norm_sum;
}

// PyTorch's _non_linear_param_search: shrink [start_bin, end_bin] from whichever side holds less
// mass while the L2 quantization error keeps decreasing.
std::pair<float, float> l2_range_search(const RangeHistogram& h, int dst_nbins) {
  const std::vector<double>& hist = h.counts();
  const int bins = static_cast<int>(hist.size());
  const float bin_width = (h.max() - h.min()) / static_cast<float>(bins);
  std::vector<double> csum(bins);
  double total = 0.0;
  for (int i = 0; i < bins; ++i) {
    total += hist[i];
    csum[i] = total;
  }
  const double stepsize = 1e-5;
  double alpha = 0.0, beta = 1.0;
  int start_bin = 0, end_bin = bins - 1;
  float norm_min = kInf;
  while (alpha < beta) {
    const double next_alpha = alpha + stepsize, next_beta = beta - stepsize;
    int l = start_bin, r = end_bin;
    while (l < end_bin && csum[l] < next_alpha * total) ++l;
    while (r > start_bin && csum[r] > next_beta * total) --r;
    int next_start = start_bin, next_end = end_bin;
    if ((l - start_bin) > (end_bin - r)) {
      next_start = l;
      alpha = next_alpha;
    } else {
      next_end = r;
      beta = next_beta;
    }
    if (next_start == start_bin && next_end == end_bin) continue;
    const float norm = quantization_error(hist, h.min(), h.max(), next_start, next_end, dst_nbins);
    if (norm > norm_min) break;
    norm_min = norm;
    start_bin = next_start;
    end_bin = next_end;
  }
  return {h.min() + bin_width * static_cast<float>(start_bin), h.min() + bin_width * static_cast<float>(end_bin + 1)};
}

std::string range_string(const char* kind, float lo, float hi) {
  if (lo > hi) return absl::StrFormat("%s[empty]", kind);
  return absl::StrFormat("%s[min=%.4g max=%.4g]", kind, lo, hi);
}

void expect_field(const Observer::Stats& s, const std::string& name, size_t size, const std::vector<double>** out) {
  for (auto& [n, v] : s.fields) {
    if (n == name) {
      DBRQ_ENSURE(size == 0 || v.size() == size, FileFormatError, "observer statistics: field \"", name, "\" has ",
                  v.size(), " values, expected ", size);
      *out = &v;
      return;
    }
  }
  DBRQ_THROW(FileFormatError, "observer statistics: missing field \"", name, "\"");
}

// ---------------------------------------------------------------------------------------------

class MinMaxObserver : public Observer {
 public:
  using Observer::Observer;
  QuantParamsPtr calculate_qparams() const override {
    DBRQ_ENSURE(has_data(), NotCalibratedError, "MinMax observer has seen no data");
    return dbrq::calculate_qparams({min_}, {max_}, spec_.dtype, spec_.qscheme, spec_.reduce_range);
  }
  bool has_data() const override { return min_ <= max_; }
  std::string describe() const override { return range_string(observer_kind_name(spec_.kind), min_, max_); }
  float min_val() const override { return min_; }
  float max_val() const override { return max_; }

 protected:
  void observe_finite(const float* x, int64_t n, const Tensor&) override {
    if (n == 0) return;
    const auto [mn, mx] = min_max_of(x, n);
    update(mn, mx);
  }
  virtual void update(float mn, float mx) {
    min_ = std::min(min_, mn);
    max_ = std::max(max_, mx);
  }
  void merge_from(const Observer& other) override {
    const auto& o = static_cast<const MinMaxObserver&>(other);
    if (!o.has_data()) return;
    if (!has_data()) {
      min_ = o.min_;
      max_ = o.max_;
      return;
    }
    merge_range(o);
  }
  virtual void merge_range(const MinMaxObserver& o) {
    min_ = std::min(min_, o.min_);
    max_ = std::max(max_, o.max_);
  }
  void save_fields(Stats* s) const override {
    s->fields.push_back({"min", {min_}});
    s->fields.push_back({"max", {max_}});
  }
  void load_fields(const Stats& s) override {
    const std::vector<double>*mn, *mx;
    expect_field(s, "min", 1, &mn);
    expect_field(s, "max", 1, &mx);
    min_ = static_cast<float>((*mn)[0]);
    max_ = static_cast<float>((*mx)[0]);
  }

  float min_ = kInf, max_ = -kInf;
};

// PyTorch's MovingAverageMinMaxObserver: the first batch sets the range, later batches move it by
// averaging_constant towards their own.
class MovingAverageMinMaxObserver : public MinMaxObserver {
 public:
  using MinMaxObserver::MinMaxObserver;

 protected:
  void update(float mn, float mx) override {
    if (!has_data()) {
      min_ = mn;
      max_ = mx;
      return;
    }
    const float c = static_cast<float>(spec_.averaging_constant);
    min_ = min_ + c * (mn - min_);
    max_ = max_ + c * (mx - max_);
  }
  // Shards are averaged, weighted by how many batches each saw.
  void merge_range(const MinMaxObserver& o) override {
    const double a = static_cast<double>(num_batches_), b = static_cast<double>(o.num_batches());
    const double w = a + b > 0 ? b / (a + b) : 0.5;
    min_ = static_cast<float>(min_ + w * (o.min_val() - min_));
    max_ = static_cast<float>(max_ + w * (o.max_val() - max_));
  }
};

class PerChannelMinMaxObserver : public Observer {
 public:
  using Observer::Observer;
  QuantParamsPtr calculate_qparams() const override {
    DBRQ_ENSURE(has_data(), NotCalibratedError, "PerChannelMinMax observer has seen no data");
    return dbrq::calculate_qparams(min_, max_, spec_.dtype, spec_.qscheme, spec_.reduce_range, spec_.ch_axis);
  }
  bool has_data() const override { return !min_.empty(); }
  std::string describe() const override {
    if (!has_data()) return "PerChannelMinMax[empty]";
    return absl::StrFormat("PerChannelMinMax[%d channels, min=%.4g max=%.4g]", min_.size(), min_val(), max_val());
  }
  float min_val() const override { return min_.empty() ? kInf : *std::min_element(min_.begin(), min_.end()); }
  float max_val() const override { return max_.empty() ? -kInf : *std::max_element(max_.begin(), max_.end()); }

 protected:
  void observe_finite(const float* x, int64_t n, const Tensor& t) override {
    DBRQ_ENSURE(spec_.ch_axis >= 0 && spec_.ch_axis < t.dim(), ValueError, "PerChannelMinMax: ch_axis ",
                spec_.ch_axis, " is out of range for a tensor of sizes ", t.shape_string());
    const int64_t c = t.size(spec_.ch_axis), st = t.stride(spec_.ch_axis);
    if (min_.empty()) {
      min_.assign(c, kInf);
      max_.assign(c, -kInf);
    }
    DBRQ_ENSURE(static_cast<int64_t>(min_.size()) == c, ShapeError, "PerChannelMinMax: saw ", min_.size(),
                " channels before, now a tensor with ", c, " (sizes ", t.shape_string(), ")");
    for_each_channel_run(n, st, c, [&](int64_t first, int64_t end, int64_t ch) {
      float mn = min_[ch], mx = max_[ch];
      for (int64_t i = first; i < end; ++i) {
        const float v = x[i];
        if (!std::isfinite(v)) continue;
        mn = std::min(mn, v);
        mx = std::max(mx, v);
      }
      min_[ch] = mn;
      max_[ch] = mx;
    });
  }
  void merge_from(const Observer& other) override {
    const auto& o = static_cast<const PerChannelMinMaxObserver&>(other);
    if (!o.has_data()) return;
    if (!has_data()) {
      min_ = o.min_;
      max_ = o.max_;
      return;
    }
    DBRQ_ENSURE(min_.size() == o.min_.size(), ValueError, "PerChannelMinMax merge: ", min_.size(), " vs ",
                o.min_.size(), " channels");
    for (size_t i = 0; i < min_.size(); ++i) {
      min_[i] = std::min(min_[i], o.min_[i]);
      max_[i] = std::max(max_[i], o.max_[i]);
    }
  }
  void save_fields(Stats* s) const override {
    s->fields.push_back({"min", std::vector<double>(min_.begin(), min_.end())});
    s->fields.push_back({"max", std::vector<double>(max_.begin(), max_.end())});
  }
  void load_fields(const Stats& s) override {
    const std::vector<double>*mn, *mx;
    expect_field(s, "min", 0, &mn);
    expect_field(s, "max", mn->size(), &mx);
    min_.assign(mn->begin(), mn->end());
    max_.assign(mx->begin(), mx->end());
  }

  std::vector<float> min_, max_;
};

// Histogram, Percentile and Entropy share the histogram bookkeeping and differ in how they pick
// the range from it.
class HistogramBasedObserver : public Observer {
 public:
  explicit HistogramBasedObserver(ObserverSpec spec)
      : Observer(spec), hist_(spec.bins, spec.upsample_rate, spec.torch_integer_edges) {
    DBRQ_ENSURE(spec.bins >= 2 && spec.upsample_rate >= 1, ValueError, "histogram observers need bins >= 2 and "
                "upsample_rate >= 1, got ", spec.bins, " and ", spec.upsample_rate);
  }
  bool has_data() const override { return !hist_.empty(); }
  float min_val() const override { return hist_.min(); }
  float max_val() const override { return hist_.max(); }
  std::string describe() const override {
    return range_string(observer_kind_name(spec_.kind), hist_.min(), hist_.max());
  }
  QuantParamsPtr calculate_qparams() const override {
    DBRQ_ENSURE(has_data(), NotCalibratedError, observer_kind_name(spec_.kind), " observer has seen no data");
    const auto [lo, hi] = choose_range();
    return dbrq::calculate_qparams({lo}, {hi}, spec_.dtype, spec_.qscheme, spec_.reduce_range);
  }
  const RangeHistogram& histogram() const { return hist_; }

 protected:
  virtual std::pair<float, float> choose_range() const = 0;
  void observe_finite(const float* x, int64_t n, const Tensor&) override { hist_.add(x, n); }
  void merge_from(const Observer& other) override {
    hist_.merge(static_cast<const HistogramBasedObserver&>(other).hist_);
  }
  void save_fields(Stats* s) const override {
    s->fields.push_back({"min", {hist_.min()}});
    s->fields.push_back({"max", {hist_.max()}});
    s->fields.push_back({"histogram", hist_.counts()});
  }
  void load_fields(const Stats& s) override {
    const std::vector<double>*mn, *mx, *h;
    expect_field(s, "min", 1, &mn);
    expect_field(s, "max", 1, &mx);
    expect_field(s, "histogram", static_cast<size_t>(spec_.bins), &h);
    hist_.set(static_cast<float>((*mn)[0]), static_cast<float>((*mx)[0]), *h);
  }

  RangeHistogram hist_;
};

class HistogramObserver : public HistogramBasedObserver {
 public:
  using HistogramBasedObserver::HistogramBasedObserver;

 protected:
  std::pair<float, float> choose_range() const override {
    return l2_range_search(hist_, /*dst_nbins=*/256);  // 2^8 levels, as PyTorch's dst_nbins
  }
};

class PercentileObserver : public HistogramBasedObserver {
 public:
  explicit PercentileObserver(ObserverSpec spec) : HistogramBasedObserver(spec) {
    DBRQ_ENSURE(spec.percentile > 0 && spec.percentile <= 100, ValueError,
                "Percentile observer: percentile must be in (0, 100], got ", spec.percentile);
  }

 protected:
  // Keeps `percentile` percent of the mass, cutting the two tails equally (a one-sided
  // distribution that starts at 0, as after ReLU, keeps its 0).
  std::pair<float, float> choose_range() const override {
    const auto& h = hist_.counts();
    const int bins = static_cast<int>(h.size());
    double total = 0.0;
    for (double v : h) total += v;
    const double tail = total * (100.0 - spec_.percentile) / 100.0 / 2.0;
    const float width = (hist_.max() - hist_.min()) / static_cast<float>(bins);
    int lo_bin = 0, hi_bin = bins - 1;
    double acc = 0.0;
    while (lo_bin < bins - 1 && acc + h[lo_bin] <= tail) acc += h[lo_bin++];
    acc = 0.0;
    while (hi_bin > lo_bin && acc + h[hi_bin] <= tail) acc += h[hi_bin--];
    float lo = hist_.min() + width * static_cast<float>(lo_bin);
    const float hi = hist_.min() + width * static_cast<float>(hi_bin + 1);
    if (hist_.min() >= 0.f) lo = hist_.min();
    return {lo, hi};
  }
};

// Expected squared quantization error of a histogram under one set of qparams. Values are taken
// as spread uniformly inside each bin; each value maps to the nearest representable value of the
// grid (k - zero_point) * scale, k in [qmin, qmax], so values outside the grid are clipped to its
// ends. Exact for that model of the data: per bin, the squared error is integrated in closed form.
class GridError {
 public:
  GridError(double scale, double lo_rep, double hi_rep) : s_(scale), lo_(lo_rep), hi_(hi_rep) {
    cell_ = s_ * s_ * s_ / 12.0;
  }
  // Integral of (x - Q(x))^2 over [a, b] (a <= b).
  double integral(double a, double b) const {
    double e = 0.0;
    if (a < lo_) {
      const double top = std::min(b, lo_);
      e += (cube(lo_ - a) - cube(lo_ - top)) / 3.0;
    }
    if (b > hi_) {
      const double bottom = std::max(a, hi_);
      e += (cube(b - hi_) - cube(bottom - hi_)) / 3.0;
    }
    const double ma = std::max(a, lo_), mb = std::min(b, hi_);
    if (mb > ma) e += inside(mb) - inside(ma);
    return e;
  }

 private:
  static double cube(double v) { return v * v * v; }
  // Integral of the rounding error from the grid's first value lo_ to t (lo_ <= t <= hi_): whole
  // cells contribute s^3/12 each; in a partial cell of length p the nearest value is the cell's
  // start up to s/2, its end after.
  double inside(double t) const {
    const double u = (t - lo_) / s_;
    const double n = std::floor(u);
    const double p = (u - n) * s_;
    const double part = p <= s_ / 2 ? cube(p) / 3.0 : cell_ - cube(s_ - p) / 3.0;
    return n * cell_ + part;
  }
  double s_, lo_, hi_, cell_;
};

// The clip range [lo, hi] (histogram bin edges; the range includes 0) whose qparams give the
// smallest expected squared error over the histogram, rounding and clipping included. The
// candidate pairs are searched coarse to fine: a grid of at most 33 x 33 (65 when only one side can
// move) edges, then windows around the best pair at strides 1/4 of the previous one down to 1.
std::pair<float, float> mse_range_search(const RangeHistogram& h, const ObserverSpec& spec) {
  const std::vector<double>& hist = h.counts();
  const int bins = static_cast<int>(hist.size());
  const double mn = h.min(), mx = h.max();
  const double w = (mx - mn) / bins;
  if (!(w > 0.0)) return {h.min(), h.max()};
  // Non-empty bins only: the error of a candidate is a sum over them.
  std::vector<int> nz;
  for (int i = 0; i < bins; ++i) {
    if (hist[i] > 0.0) nz.push_back(i);
  }
  auto edge = [&](int i) { return static_cast<float>(mn + w * i); };
  // Edges that keep 0 inside: lo from edge 0 up to the last edge <= 0, hi from the first edge >= 0.
  const int lo_last = mn >= 0.0 ? 0 : std::min(bins, static_cast<int>(std::floor(-mn / w)));
  const int hi_first = mx <= 0.0 ? bins : std::max(0, std::min(bins, static_cast<int>(std::ceil(-mn / w))));
  auto error_of = [&](int lo_i, int hi_i) {
    const float lo = std::min(edge(lo_i), 0.f), hi = std::max(edge(hi_i), 0.f);
    if (!(hi > lo)) return std::numeric_limits<double>::infinity();
    const QuantParamsPtr qp = dbrq::calculate_qparams({lo}, {hi}, spec.dtype, spec.qscheme, spec.reduce_range);
    const QuantRange r = quant_range(spec.dtype, spec.reduce_range);
    const double s = qp->scale(), z = qp->zero_point();
    const GridError g(s, (r.min - z) * s, (r.max - z) * s);
    double e = 0.0;
    for (int i : nz) e += hist[i] / w * g.integral(mn + w * i, mn + w * (i + 1));
    return e;
  };
  int best_lo = 0, best_hi = bins;
  double best = error_of(best_lo, best_hi);
  // Each stage scores its candidates in parallel, then picks in candidate order: the same range
  // for any thread count.
  std::vector<std::pair<int, int>> cand;
  std::vector<double> err;
  auto add = [&](int lo_i, int hi_i) {
    cand.emplace_back(std::max(0, std::min(lo_i, lo_last)), std::max(hi_first, std::min(hi_i, bins)));
  };
  auto score = [&] {
    const int64_t n = static_cast<int64_t>(cand.size());
    err.assign(cand.size(), 0.0);
#pragma omp parallel for schedule(dynamic, 4) num_threads(scan_threads(n * static_cast<int64_t>(nz.size())))
    for (int64_t c = 0; c < n; ++c) err[c] = error_of(cand[c].first, cand[c].second);
    for (size_t c = 0; c < cand.size(); ++c) {
      const auto [lo_i, hi_i] = cand[c];
      // Ties keep the wider range (fewer values clipped for the same error).
      if (err[c] < best || (err[c] == best && lo_i <= best_lo && hi_i >= best_hi)) {
        best = err[c];
        best_lo = lo_i;
        best_hi = hi_i;
      }
    }
    cand.clear();
  };
  const int n_lo = lo_last + 1, n_hi = bins - hi_first + 1;
  const int per_axis = (n_lo == 1 || n_hi == 1) ? 64 : 32;
  int stride_lo = std::max(1, (n_lo + per_axis - 1) / per_axis);
  int stride_hi = std::max(1, (n_hi + per_axis - 1) / per_axis);
  for (int a = 0; a < n_lo + stride_lo; a += stride_lo) {
    for (int b = 0; b < n_hi + stride_hi; b += stride_hi) add(std::min(a, lo_last), bins - std::min(b, n_hi - 1));
  }
  score();
  while (stride_lo > 1 || stride_hi > 1) {
    const int wl = stride_lo, wh = stride_hi;
    stride_lo = std::max(1, stride_lo / 4);
    stride_hi = std::max(1, stride_hi / 4);
    const int cl = best_lo, ch = best_hi;
    for (int a = cl - wl; a <= cl + wl; a += stride_lo) {
      for (int b = ch - wh; b <= ch + wh; b += stride_hi) add(a, b);
    }
    score();
  }
  return {edge(best_lo), edge(best_hi)};
}

// Mse: the clip range with the smallest expected squared quantization error (mse_range_search).
class MseObserver : public HistogramBasedObserver {
 public:
  using HistogramBasedObserver::HistogramBasedObserver;

 protected:
  std::pair<float, float> choose_range() const override { return mse_range_search(hist_, spec_); }
};

// TensorRT's entropy calibration: among thresholds t, pick the one whose quantized distribution
// (clipped at t, merged into the available levels) has the smallest KL divergence from the
// clipped reference distribution. The histogram is of |x|; the range is [-t, t] cut to the data.
class EntropyObserver : public Observer {
 public:
  explicit EntropyObserver(ObserverSpec spec)
      : Observer(spec), abs_(spec.bins, spec.upsample_rate, /*integer_edges=*/false, /*anchor_at_zero=*/true) {}
  bool has_data() const override { return min_ <= max_; }
  float min_val() const override { return min_; }
  float max_val() const override { return max_; }
  std::string describe() const override { return range_string("Entropy", min_, max_); }
  QuantParamsPtr calculate_qparams() const override {
    DBRQ_ENSURE(has_data(), NotCalibratedError, "Entropy observer has seen no data");
    const float t = threshold();
    return dbrq::calculate_qparams({std::max(min_, -t)}, {std::min(max_, t)}, spec_.dtype, spec_.qscheme,
                                   spec_.reduce_range);
  }

  // The search of NVIDIA pytorch-quantization's _compute_amax_entropy (calib/histogram.py, the
  // TensorRT entropy calibrator), step for step:
  //  - bin 0 takes bin 1's count, so a spike of exact zeros (ReLU outputs) does not dominate;
  //  - candidates are i = 128 .. bins (threshold = upper edge of bin i-1);
  //  - reference p = the first i bins with the outliers (bins i..) added to bin i-1;
  //  - candidate q: bin j of the first i (without outliers) goes to quantized bin
  //    floor(j * levels / i) (np.digitize on linspace(0, i, levels + 1)), each quantized bin's mass
  //    is spread evenly over its non-empty bins; empty bins stay empty;
  //  - KL(p || q) of the normalized distributions (inf where q is 0 and p is not); the largest i
  //    among equal minima wins.
  // levels is 256 for u8 data that never goes negative, else 128 (one side of zero).
  float threshold() const {
    const auto& h = abs_.counts();
    const int bins = static_cast<int>(h.size());
    constexpr int kStartBin = 128;
    const int levels = (spec_.dtype == DType::kU8 && min_ >= 0.f) ? 256 : 128;
    const float width = (abs_.max() - abs_.min()) / static_cast<float>(bins);
    if (bins <= kStartBin || width == 0.f) return abs_.max();
    std::vector<double> b(h.begin(), h.end());
    b[0] = b[1];
    std::vector<double> tail(bins + 1, 0.0);  // tail[i] = sum of b[i..]
    for (int k = bins - 1; k >= 0; --k) tail[k] = tail[k + 1] + b[k];
    int best = bins;
    double best_kl = std::numeric_limits<double>::infinity();
    std::vector<double> mass(levels), q(bins);
    std::vector<int> nonzero(levels);
    for (int i = kStartBin; i <= bins; ++i) {
      std::fill(mass.begin(), mass.end(), 0.0);
      std::fill(nonzero.begin(), nonzero.end(), 0);
      for (int j = 0; j < i; ++j) {
        if (b[j] == 0.0) continue;
        const int g = static_cast<int>(static_cast<int64_t>(j) * levels / i);
        mass[g] += b[j];
        ++nonzero[g];
      }
      double qs = 0.0;
      for (int j = 0; j < i; ++j) {
        if (b[j] == 0.0) {
          q[j] = 0.0;
          continue;
        }
        const int g = static_cast<int>(static_cast<int64_t>(j) * levels / i);
        q[j] = mass[g] / nonzero[g];
        qs += q[j];
      }
      const double ps = tail[0];
      if (ps == 0.0 || qs == 0.0) continue;
      double kl = 0.0;
      for (int j = 0; j < i; ++j) {
        const double pj = j == i - 1 ? b[j] + tail[i] : b[j];
        if (pj == 0.0) continue;
        if (q[j] == 0.0) {
          kl = std::numeric_limits<double>::infinity();
          break;
        }
        const double pn = pj / ps, qn = q[j] / qs;
        kl += pn * std::log(pn / qn);
      }
      if (kl <= best_kl) {
        best_kl = kl;
        best = i;
      }
    }
    return abs_.min() + width * static_cast<float>(best);
  }

 protected:
  void observe_finite(const float* x, int64_t n, const Tensor&) override {
    std::vector<float> a(n);
    for (int64_t i = 0; i < n; ++i) {
      a[i] = std::abs(x[i]);
      min_ = std::min(min_, x[i]);
      max_ = std::max(max_, x[i]);
    }
    abs_.add(a.data(), n);
  }
  void merge_from(const Observer& other) override {
    const auto& o = static_cast<const EntropyObserver&>(other);
    abs_.merge(o.abs_);
    min_ = std::min(min_, o.min_);
    max_ = std::max(max_, o.max_);
  }
  void save_fields(Stats* s) const override {
    s->fields.push_back({"min", {min_}});
    s->fields.push_back({"max", {max_}});
    s->fields.push_back({"abs_min", {abs_.min()}});
    s->fields.push_back({"abs_max", {abs_.max()}});
    s->fields.push_back({"abs_histogram", abs_.counts()});
  }
  void load_fields(const Stats& s) override {
    const std::vector<double>*mn, *mx, *amn, *amx, *h;
    expect_field(s, "min", 1, &mn);
    expect_field(s, "max", 1, &mx);
    expect_field(s, "abs_min", 1, &amn);
    expect_field(s, "abs_max", 1, &amx);
    expect_field(s, "abs_histogram", static_cast<size_t>(spec_.bins), &h);
    min_ = static_cast<float>((*mn)[0]);
    max_ = static_cast<float>((*mx)[0]);
    abs_.set(static_cast<float>((*amn)[0]), static_cast<float>((*amx)[0]), *h);
  }

 private:
  RangeHistogram abs_;
  float min_ = kInf, max_ = -kInf;
};

class FixedQParamsObserver : public Observer {
 public:
  explicit FixedQParamsObserver(ObserverSpec spec) : Observer(spec) {
    qparams_ = QuantParams::per_tensor(spec.fixed_scale, spec.fixed_zero_point);
    const QuantRange r = quant_range(spec.dtype, false);
    DBRQ_ENSURE(spec.fixed_zero_point >= r.min && spec.fixed_zero_point <= r.max, ValueError,
                "FixedQParams observer: zero point ", spec.fixed_zero_point, " is outside the ",
                dtype_name(spec.dtype), " range");
  }
  QuantParamsPtr calculate_qparams() const override { return qparams_; }
  bool has_data() const override { return true; }
  std::string describe() const override {
    return absl::StrFormat("FixedQParams[scale=%g zero_point=%d]", spec_.fixed_scale, spec_.fixed_zero_point);
  }
  float min_val() const override {
    return (quant_range(spec_.dtype, false).min - spec_.fixed_zero_point) * spec_.fixed_scale;
  }
  float max_val() const override {
    return (quant_range(spec_.dtype, false).max - spec_.fixed_zero_point) * spec_.fixed_scale;
  }

 protected:
  void observe_finite(const float*, int64_t, const Tensor&) override {}
  void merge_from(const Observer&) override {}
  void save_fields(Stats*) const override {}
  void load_fields(const Stats&) override {}

 private:
  QuantParamsPtr qparams_;
};

// Dynamic quantization: parameters come from each call's own data at inference.
class PlaceholderObserver : public Observer {
 public:
  using Observer::Observer;
  QuantParamsPtr calculate_qparams() const override { return nullptr; }
  bool has_data() const override { return true; }
  std::string describe() const override { return "Placeholder[dynamic]"; }
  float min_val() const override { return kInf; }
  float max_val() const override { return -kInf; }

 protected:
  void observe_finite(const float*, int64_t, const Tensor&) override {}
  void merge_from(const Observer&) override {}
  void save_fields(Stats*) const override {}
  void load_fields(const Stats&) override {}
};

// A dense f32 copy of `t` in logical order (observers only need values, plus channel positions,
// which logical order keeps for the per-channel observer).
Tensor dense_values(const Tensor& t) {
  Tensor out = Tensor::empty(t.sizes(), DType::kF32);
  const std::vector<float> v = t.to_vector<float>();
  std::copy(v.begin(), v.end(), out.raw_mutable_data<float>());
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

const char* observer_kind_name(ObserverKind k) {
  switch (k) {
    case ObserverKind::kMinMax:
      return "MinMax";
    case ObserverKind::kMovingAverageMinMax:
      return "MovingAverageMinMax";
    case ObserverKind::kHistogram:
      return "Histogram";
    case ObserverKind::kPerChannelMinMax:
      return "PerChannelMinMax";
    case ObserverKind::kPercentile:
      return "Percentile";
    case ObserverKind::kEntropy:
      return "Entropy";
    case ObserverKind::kFixedQParams:
      return "FixedQParams";
    case ObserverKind::kPlaceholder:
      return "Placeholder";
    case ObserverKind::kMse:
      return "Mse";
  }
  return "?";
}

ObserverKind observer_kind_from_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(ObserverKind::kMse); ++i) {
    const auto k = static_cast<ObserverKind>(i);
    if (name == observer_kind_name(k)) return k;
  }
  DBRQ_THROW(ValueError, "unknown observer kind \"", name,
             "\"; expected MinMax, MovingAverageMinMax, Histogram, PerChannelMinMax, Percentile, Entropy, "
             "FixedQParams, Placeholder or Mse");
}

ObserverSpec ObserverSpec::min_max(DType dtype, QScheme qscheme) {
  ObserverSpec s;
  s.kind = ObserverKind::kMinMax;
  s.dtype = dtype;
  s.qscheme = qscheme;
  return s;
}

ObserverSpec ObserverSpec::moving_average_min_max(double averaging_constant, DType dtype) {
  ObserverSpec s;
  s.kind = ObserverKind::kMovingAverageMinMax;
  s.dtype = dtype;
  s.averaging_constant = averaging_constant;
  return s;
}

ObserverSpec ObserverSpec::histogram(DType dtype, bool reduce_range) {
  ObserverSpec s;
  s.kind = ObserverKind::kHistogram;
  s.dtype = dtype;
  s.reduce_range = reduce_range;
  return s;
}

ObserverSpec ObserverSpec::per_channel_min_max(DType dtype, QScheme qscheme, int64_t ch_axis) {
  ObserverSpec s;
  s.kind = ObserverKind::kPerChannelMinMax;
  s.dtype = dtype;
  s.qscheme = qscheme;
  s.ch_axis = ch_axis;
  return s;
}

ObserverSpec ObserverSpec::percentile_of(double percentile, DType dtype) {
  ObserverSpec s;
  s.kind = ObserverKind::kPercentile;
  s.dtype = dtype;
  s.percentile = percentile;
  return s;
}

ObserverSpec ObserverSpec::entropy(DType dtype) {
  ObserverSpec s;
  s.kind = ObserverKind::kEntropy;
  s.dtype = dtype;
  return s;
}

ObserverSpec ObserverSpec::fixed(float scale, int32_t zero_point, DType dtype) {
  ObserverSpec s;
  s.kind = ObserverKind::kFixedQParams;
  s.dtype = dtype;
  s.fixed_scale = scale;
  s.fixed_zero_point = zero_point;
  return s;
}

ObserverSpec ObserverSpec::mse(DType dtype, bool reduce_range) {
  ObserverSpec s;
  s.kind = ObserverKind::kMse;
  s.dtype = dtype;
  s.reduce_range = reduce_range;
  return s;
}

ObserverSpec ObserverSpec::placeholder(DType dtype) {
  ObserverSpec s;
  s.kind = ObserverKind::kPlaceholder;
  s.dtype = dtype;
  return s;
}

bool ObserverSpec::operator==(const ObserverSpec& o) const {
  return kind == o.kind && dtype == o.dtype && qscheme == o.qscheme && reduce_range == o.reduce_range &&
         ch_axis == o.ch_axis && averaging_constant == o.averaging_constant && bins == o.bins &&
         upsample_rate == o.upsample_rate && percentile == o.percentile &&
         torch_integer_edges == o.torch_integer_edges && fixed_scale == o.fixed_scale &&
         fixed_zero_point == o.fixed_zero_point;
}

std::string ObserverSpec::to_string() const {
  std::string s = absl::StrCat(observer_kind_name(kind), "(dtype=", dtype_name(dtype), ", qscheme=",
                               qscheme_name(qscheme));
  if (reduce_range) absl::StrAppend(&s, ", reduce_range=true");
  switch (kind) {
    case ObserverKind::kMovingAverageMinMax:
      absl::StrAppend(&s, ", averaging_constant=", averaging_constant);
      break;
    case ObserverKind::kHistogram:
      absl::StrAppend(&s, ", bins=", bins, ", upsample_rate=", upsample_rate);
      if (torch_integer_edges) absl::StrAppend(&s, ", torch_integer_edges=true");
      break;
    case ObserverKind::kPercentile:
      absl::StrAppend(&s, ", bins=", bins, ", percentile=", percentile);
      break;
    case ObserverKind::kEntropy:
    case ObserverKind::kMse:
      absl::StrAppend(&s, ", bins=", bins);
      break;
    case ObserverKind::kPerChannelMinMax:
      absl::StrAppend(&s, ", ch_axis=", ch_axis);
      break;
    case ObserverKind::kFixedQParams:
      absl::StrAppend(&s, ", scale=", fixed_scale, ", zero_point=", fixed_zero_point);
      break;
    default:
      break;
  }
  return s + ")";
}

namespace {

// See Observer::mask_count: a group of negative values at the low end, far below the rest.
bool has_far_low_group(const float* data, int64_t n) {
  if (n < 16) return false;
  float lo = data[0], hi = data[0];
#pragma omp simd reduction(min : lo) reduction(max : hi)
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, data[i]);
    hi = std::max(hi, data[i]);
  }
  const double range = static_cast<double>(hi) - lo;
  if (!(range > 0)) return false;
  const float cut = static_cast<float>(lo + range / 16);
  int64_t low = 0;
  float low_max = lo, high_min = hi;
#pragma omp simd reduction(+ : low) reduction(max : low_max) reduction(min : high_min)
  for (int64_t i = 0; i < n; ++i) {
    const float v = data[i];
    const bool is_low = v <= cut;
    low += is_low;
    low_max = std::max(low_max, is_low ? v : lo);
    high_min = std::min(high_min, is_low ? hi : v);
  }
  const double gap = static_cast<double>(high_min) - static_cast<double>(low_max);
  return low >= 2 && low < n && low_max < 0 && high_min < hi && gap >= 64.0 * (static_cast<double>(hi) - high_min);
}

}  // namespace

void Observer::observe(const Tensor& x) {
  DBRQ_ENSURE(x.defined(), ValueError, "observer: tensor is undefined");
  DBRQ_ENSURE(x.dtype() == DType::kF32, DTypeError, "observer: can only observe f32 tensors, got ",
              dtype_name(x.dtype()));
  if (x.numel() == 0) return;
  // Per-channel positions need a layout the stride arithmetic understands: any dense one works.
  const Tensor t = x.is_non_overlapping_and_dense() ? x : dense_values(x);
  const float* data = t.raw_data<float>();
  const int64_t n = t.numel();
  // Non-finite values have all exponent bits set; count them without branches first.
  int64_t nonfinite = 0;
#pragma omp parallel for simd num_threads(scan_threads(n)) reduction(+ : nonfinite)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, data + i, sizeof b);
    nonfinite += (b & 0x7f800000u) == 0x7f800000u;
  }
  int64_t nans = 0, infs = 0;
  if (nonfinite != 0) {
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(data[i])) (std::isnan(data[i]) ? nans : infs)++;
    }
  }
  ++num_batches_;
  const bool per_channel = spec_.kind == ObserverKind::kPerChannelMinMax;
  // A range that cannot stretch (fixed parameters, dynamic placeholders) loses nothing to a mask.
  const bool counts_masks = !per_channel && spec_.kind != ObserverKind::kFixedQParams &&
                            spec_.kind != ObserverKind::kPlaceholder;
  if (nans + infs == 0) {
    if (counts_masks && has_far_low_group(data, n)) ++mask_count_;
    observe_finite(data, n, t);
    return;
  }
  nan_count_ += nans;
  inf_count_ += infs;
  if (!warned_) {
    warned_ = true;
    log()->warn("{} observer: skipped {} NaN and {} Inf values in calibration data (sizes {}); further "
                "occurrences are counted silently",
                observer_kind_name(spec_.kind), nans, infs, x.shape_string());
  }
  if (per_channel) {
    observe_finite(data, n, t);  // skips non-finite values itself, keeping channel positions
    return;
  }
  std::vector<float> finite;
  finite.reserve(n - nans - infs);
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(data[i])) finite.push_back(data[i]);
  }
  if (counts_masks && has_far_low_group(finite.data(), static_cast<int64_t>(finite.size()))) ++mask_count_;
  observe_finite(finite.data(), static_cast<int64_t>(finite.size()), t);
}

void Observer::merge(const Observer& other) {
  DBRQ_ENSURE(spec_ == other.spec_, ValueError, "cannot merge observer ", other.spec_.to_string(), " into ",
              spec_.to_string(), ": specs differ");
  merge_from(other);
  num_batches_ += other.num_batches_;
  nan_count_ += other.nan_count_;
  inf_count_ += other.inf_count_;
  mask_count_ += other.mask_count_;
}

std::unique_ptr<Observer> Observer::clone_empty() const { return make_observer(spec_); }

Observer::Stats Observer::stats() const {
  Stats s;
  save_fields(&s);
  s.num_batches = num_batches_;
  s.nan_count = nan_count_;
  s.inf_count = inf_count_;
  s.mask_count = mask_count_;
  return s;
}

void Observer::load_stats(const Stats& s) {
  load_fields(s);
  num_batches_ = s.num_batches;
  nan_count_ = s.nan_count;
  inf_count_ = s.inf_count;
  mask_count_ = s.mask_count;
}

std::unique_ptr<Observer> make_observer(const ObserverSpec& spec) {
  DBRQ_ENSURE(is_quantized_dtype(spec.dtype), DTypeError, "observer dtype must be u8 or s8, got ",
              dtype_name(spec.dtype));
  const bool per_channel = is_per_channel(spec.qscheme);
  DBRQ_ENSURE(per_channel == (spec.kind == ObserverKind::kPerChannelMinMax), ValueError, "observer ",
              observer_kind_name(spec.kind), " does not support qscheme ", qscheme_name(spec.qscheme));
  switch (spec.kind) {
    case ObserverKind::kMinMax:
      return std::make_unique<MinMaxObserver>(spec);
    case ObserverKind::kMovingAverageMinMax:
      DBRQ_ENSURE(spec.averaging_constant > 0 && spec.averaging_constant <= 1, ValueError,
                  "MovingAverageMinMax: averaging_constant must be in (0, 1], got ", spec.averaging_constant);
      return std::make_unique<MovingAverageMinMaxObserver>(spec);
    case ObserverKind::kHistogram:
      return std::make_unique<HistogramObserver>(spec);
    case ObserverKind::kPerChannelMinMax:
      return std::make_unique<PerChannelMinMaxObserver>(spec);
    case ObserverKind::kPercentile:
      return std::make_unique<PercentileObserver>(spec);
    case ObserverKind::kEntropy:
      return std::make_unique<EntropyObserver>(spec);
    case ObserverKind::kFixedQParams:
      return std::make_unique<FixedQParamsObserver>(spec);
    case ObserverKind::kPlaceholder:
      return std::make_unique<PlaceholderObserver>(spec);
    case ObserverKind::kMse:
      return std::make_unique<MseObserver>(spec);
  }
  DBRQ_THROW(ValueError, "unknown observer kind");
}

}  // namespace dbrq
