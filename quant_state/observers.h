// Observers: record statistics of f32 tensors during calibration and turn them into
// quantization parameters.
//
//   auto obs = dbrq::make_observer(dbrq::ObserverSpec::histogram());
//   for (auto& batch : data) obs->observe(batch);
//   dbrq::QuantParamsPtr qp = obs->calculate_qparams();   // scale, zero point for u8
//   std::cout << obs->describe();                           // "Histogram[min=-2.1 max=3.4]"
//
// Kinds (ObserverKind):
//   MinMax, MovingAverageMinMax (PyTorch's averaging_constant), Histogram (PyTorch's 2048-bin
//   histogram with the L2-error range search), PerChannelMinMax (weights), Percentile (clips to a
//   percentile of the histogram), Entropy (TensorRT's KL-divergence threshold search),
//   Mse (the clip range on the histogram with the smallest expected squared error of the real
//   values, rounding and clipping included, as NNCF / OpenVINO and TensorRT's MSE calibrators),
//   FixedQParams (sigmoid / tanh / softmax outputs), Placeholder (dynamic quantization: records
//   nothing; qparams come from each call's data).
//
// Every observer can merge another of the same spec (calibration shards run in parallel), and
// skips NaN and Inf values, counting them and logging one warning per observer.
//
// PyTorch 1.13's HistogramObserver truncates its histogram edges to integers (`min=int(min_val)`
// in torch.histc), which drops values and stretches bins for non-integer ranges. dbrq bins over
// the real range; set ObserverSpec::torch_integer_edges to reproduce 1.13 exactly. See
// docs/observers.md.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "quant_state/qparams.h"
#include "core/tensor.h"

namespace dbrq {

enum class ObserverKind : uint8_t {
  kMinMax,
  kMovingAverageMinMax,
  kHistogram,
  kPerChannelMinMax,
  kPercentile,
  kEntropy,
  kFixedQParams,
  kPlaceholder,
  kMse,  // appended: files name kinds by name, and earlier values keep their numbers
};

const char* observer_kind_name(ObserverKind k);
ObserverKind observer_kind_from_name(const std::string& name);  // throws ValueError

// What to build: kind, target dtype and scheme, and the kind's own arguments. Comparable and
// printable, so qconfigs can be saved and checked.
struct ObserverSpec {
  ObserverKind kind = ObserverKind::kMinMax;
  DType dtype = DType::kU8;
  QScheme qscheme = QScheme::kPerTensorAffine;
  bool reduce_range = false;
  int64_t ch_axis = 0;                // per-channel kinds
  double averaging_constant = 0.01;   // MovingAverageMinMax
  int bins = 2048;                    // histogram-based kinds (Histogram, Percentile, Entropy, Mse)
  int upsample_rate = 128;            // histogram-based kinds: resolution when ranges grow
  double percentile = 99.99;          // Percentile: kept mass, in percent
  bool torch_integer_edges = false;   // Histogram: reproduce PyTorch 1.13's integer histc edges
  float fixed_scale = 0.f;            // FixedQParams
  int32_t fixed_zero_point = 0;

  static ObserverSpec min_max(DType dtype = DType::kU8, QScheme qscheme = QScheme::kPerTensorAffine);
  static ObserverSpec moving_average_min_max(double averaging_constant = 0.01, DType dtype = DType::kU8);
  static ObserverSpec histogram(DType dtype = DType::kU8, bool reduce_range = false);
  static ObserverSpec per_channel_min_max(DType dtype = DType::kS8,
                                          QScheme qscheme = QScheme::kPerChannelSymmetric, int64_t ch_axis = 0);
  static ObserverSpec percentile_of(double percentile = 99.99, DType dtype = DType::kU8);
  static ObserverSpec entropy(DType dtype = DType::kU8);
  static ObserverSpec fixed(float scale, int32_t zero_point, DType dtype = DType::kU8);
  static ObserverSpec placeholder(DType dtype = DType::kU8);
  static ObserverSpec mse(DType dtype = DType::kU8, bool reduce_range = false);

  bool operator==(const ObserverSpec& o) const;
  bool operator!=(const ObserverSpec& o) const { return !(*this == o); }
  // "Histogram(dtype=u8, qscheme=per_tensor_affine, bins=2048)"
  std::string to_string() const;
};

class Observer {
 public:
  explicit Observer(ObserverSpec spec) : spec_(std::move(spec)) {}
  virtual ~Observer() = default;
  Observer(const Observer&) = delete;
  Observer& operator=(const Observer&) = delete;

  const ObserverSpec& spec() const { return spec_; }
  // Records an f32 tensor (any layout). Empty tensors are ignored; NaN/Inf are skipped and counted.
  void observe(const Tensor& x);
  // Quantization parameters from what was observed. Throws NotCalibratedError when nothing was.
  virtual QuantParamsPtr calculate_qparams() const = 0;
  virtual bool has_data() const = 0;
  // Folds another observer's statistics in. Throws ValueError when the specs differ.
  void merge(const Observer& other);
  // A fresh observer with the same spec.
  std::unique_ptr<Observer> clone_empty() const;
  // One-line summary with the current range: "Histogram[min=-2.1 max=3.4]".
  virtual std::string describe() const = 0;
  // Observed range (per tensor); {+inf, -inf} before any data.
  virtual float min_val() const = 0;
  virtual float max_val() const = 0;

  int64_t num_batches() const { return num_batches_; }
  int64_t nan_count() const { return nan_count_; }
  int64_t inf_count() const { return inf_count_; }
  // Tensors (of 16 values or more) whose values fell in two groups: negative ones at the low end
  // (at least two, within 1/16 of the range of the minimum) and the rest, not all equal, spanning
  // at most 1/64 of the gap between the groups. An additive mask written with a finite stand-in
  // for -inf (-1e9, -1e4, the lowest float) added to scores looks like this; int8 over such a
  // range leaves the rest at most 4 codes. Outputs of relu, softmax or sigmoid (never negative)
  // cannot; per-channel (weight), fixed-parameter and placeholder observers do not count.
  int64_t mask_count() const { return mask_count_; }

  // Raw statistics for saving and restoring calibration (see quant_state/serialization.h):
  // named float vectors plus the counters above.
  struct Stats {
    std::vector<std::pair<std::string, std::vector<double>>> fields;
    int64_t num_batches = 0, nan_count = 0, inf_count = 0, mask_count = 0;
  };
  Stats stats() const;
  void load_stats(const Stats& stats);  // throws FileFormatError when fields do not fit

 protected:
  // `data` holds `n` finite values of a tensor with sizes/strides `t` describes (dense layout).
  virtual void observe_finite(const float* data, int64_t n, const Tensor& t) = 0;
  virtual void merge_from(const Observer& other) = 0;
  virtual void save_fields(Stats* s) const = 0;
  virtual void load_fields(const Stats& s) = 0;

  ObserverSpec spec_;
  int64_t num_batches_ = 0;
  int64_t nan_count_ = 0;
  int64_t inf_count_ = 0;
  int64_t mask_count_ = 0;
  bool warned_ = false;
};

std::unique_ptr<Observer> make_observer(const ObserverSpec& spec);

}  // namespace dbrq
