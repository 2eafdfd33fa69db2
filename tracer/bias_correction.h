// Bias correction (as NNCF's fast bias correction; Nagel et al. 2019's empirical form): quantizing a
// conv's or linear's weights shifts the mean of its outputs, channel by channel; this measures the
// shift on calibration data and moves it into the bias, so the int8 model's outputs are centred
// where the fp32 model's are.
//
//   model->eval();
//   dbrq::equalize(*model, {example});                                  // optional, first
//   auto mapping = dbrq::default_qconfig_mapping("onednn");
//   dbrq::BiasCorrectionReport r = dbrq::correct_bias(*model, calibration, mapping);
//   dbrq::prepare(*model, {example}, mapping);                          // the same mapping
//   for (auto& batch : calibration) (*model)(batch[0]);
//   dbrq::convert(*model);
//   dbrq::save_safetensors("w.safetensors", model->state_dict());      // the corrected biases
//
// For each conv2d / linear that `mapping` quantizes, with W its weights as convert will quantize
// them (a batch norm reading only its output folded in when prepare fuses the two: the mapping
// quantizes the batch norm int8 and one module calls both; PyTorch's arithmetic) and Q(W) their
// quantized values under the mapping's weight observer (per channel or per tensor), the shift of
// output channel o is mean over the calibration inputs x and all output positions of
// conv(x, W - Q(W))[o] (bias excluded; padding included, so it is exact, not E[x]-based). It is
// added to the layer's bias, or to the following batch norm's beta (which moves the folded bias
// by exactly that; for a batch norm that is not fused and a layer without bias, the shift times
// gamma / sigma, what reaches the batch norm's output). Inputs are those of the fp32 model (one pass, all shifts measured before any
// is applied).
//
// Control flow: every batch's run decides where its layers' shifts go. With data-dependent
// branches, a layer corrected one way on one batch's path and another way (or not at all) on
// another's (its batch norm fused on one path, its output also read elsewhere on the other) is
// skipped with the reason. A path no calibration batch takes is not seen.
//
// Where the correction lives: in the model's own parameters. The fp32 model changes by the
// shifts (small: the weight quantization error's mean); the quant-state file format does not
// change; saving the weights (state_dict) with the quant-state file reproduces the int8 model bit
// for bit. Run it before prepare, with the mapping prepare will get, so calibration observes the
// corrected model.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "quant_state/qconfig.h"
#include "runtime/module.h"

namespace dbrq {

struct CorrectedLayer {
  std::string layer;   // fqn of the layer (or "module:op#node" for a functional call)
  std::string target;  // the parameter that received the shift ("conv1.bias", "bn1.bias")
  int64_t channels = 0;
  double max_abs_shift = 0.0;   // over channels
  double mean_abs_shift = 0.0;
};

struct BiasCorrectionReport {
  std::vector<CorrectedLayer> layers;
  std::vector<std::string> skipped;  // layers not corrected, with the reason
  int batches = 0;
  std::string to_string() const;
};

// `calibration`: one tensor list per call (the 1 to 4 tensors forward takes). Throws UsageError
// for a prepared model or one in training mode, ValueError for no calibration data, an empty
// batch, or a mapping naming unknown modules; an error from the model's forward propagates and
// leaves the model unchanged. No layer to correct is not an error (the report says so).
BiasCorrectionReport correct_bias(nn::Module& model, const std::vector<std::vector<Tensor>>& calibration,
                                  const QConfigMapping& mapping = default_qconfig_mapping("onednn"));

}  // namespace dbrq
