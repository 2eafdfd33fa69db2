// SmoothQuant: migrates activation outliers of linear inputs into the weights, before prepare.
//
//   auto report = dbrq::smooth_quant(*model, {{batch0}, {batch1}}, dbrq::SmoothQuantOptions{});
//   std::cout << report.to_string();          // what was smoothed, with which alpha; what was skipped
//   dbrq::prepare(*model, {example}, dbrq::default_qconfig_mapping("onednn"));   // as usual
//
// For each tensor X that feeds only linears (as their input), and that a foldable producer made (a
// LayerNorm with affine parameters over the last dim, or a Linear), every input channel j gets a
// factor s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) (max|W_j| over the consumers' weight columns
// j): X_j / s_j has a flatter range across channels, which per-tensor u8 activations quantize with
// less error, and W[:, j] * s_j absorbs the factor. The division is folded into the producer
// (LayerNorm gamma and beta, or the producing Linear's weight rows and bias), the multiplication
// into the consumers' weights: the fp32 function is unchanged (up to rounding) and inference costs
// nothing extra. Statistics come from running `calibration` in fp32.
//
// With search_alpha, each group gets the alpha of `alpha_grid` whose simulated int8 output (u8
// per-tensor min-max activations, s8 per-channel symmetric weights) is closest, in squared error,
// to the fp32 output of its linears on (a sample of) the calibration rows.
//
// Linears whose input is not such a tensor (model input, after an activation or a reshape, a
// tensor also read by something else, e.g. a post-LayerNorm transformer's residual add) are left
// alone and listed in the report with the reason, as are layers whose parameters something else
// also uses (a head tied to its embedding, a weight another op reads): rescaling them would change
// that other user. Limits: docs/smooth_quant.md.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "runtime/module.h"

namespace dbrq {

struct SmoothQuantOptions {
  double alpha = 0.5;  // migration strength in [0, 1]: 0 leaves activations, 1 flattens them fully
  bool search_alpha = false;  // per group, the alpha of alpha_grid with the smallest output error
  std::vector<double> alpha_grid = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  // Rows of each smoothed input kept for the alpha search (the first ones of calibration).
  int64_t search_rows = 512;
  // Also smooth a Linear -> Linear pair, folding into the producer's weight rows and bias. Off by
  // default: on the test model (tests/quant/smooth_quant_test.cc) it lowered the consumer's
  // measured int8 SQNR by 4.4 dB although the simulated error fell 3x (docs/smooth_quant.md).
  bool fold_into_linears = false;
};

// One smoothed tensor: its producer, the linears reading it, and the factors applied.
struct SmoothedGroup {
  std::string producer;                // fqn of the LayerNorm or Linear folded into
  std::string producer_kind;           // "layer_norm" or "linear"
  std::vector<std::string> consumers;  // fqns of the linears whose weights absorbed the factors
  double alpha = 0.5;
  std::vector<float> factors;          // s_j per input channel
  std::vector<float> act_absmax;       // max|X_j| observed in calibration
  std::vector<float> weight_absmax;    // max over consumers of max|W[:, j]|
  // Squared error of the simulated int8 outputs vs fp32, summed over the consumers and the kept
  // rows, before smoothing (alpha 0 leaves X unchanged) and with the chosen alpha. Filled only
  // with search_alpha.
  double error_before = 0.0, error_after = 0.0;
};

struct SkippedLinear {
  std::string linear;  // fqn
  std::string reason;
};

struct SmoothQuantReport {
  std::vector<SmoothedGroup> groups;
  std::vector<SkippedLinear> skipped;
  std::string to_string() const;
};

// Runs `model` (fp32, not prepared) on every entry of `calibration` (one tensor list per call),
// then folds the factors into its parameters in place. Throws ValueError for alpha (or a grid
// value) outside [0, 1], an empty grid with search_alpha, search_rows < 1, or no calibration data;
// UsageError when the model is prepared. An exception from a calibration run leaves the
// parameters unchanged.
SmoothQuantReport smooth_quant(nn::Module& model, const std::vector<std::vector<Tensor>>& calibration,
                               const SmoothQuantOptions& options = {});

}  // namespace dbrq
