// Cross-layer equalization (Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization
// and Bias Correction"), run on an fp32 model before prepare:
//
//   model->eval();
//   dbrq::EqualizeReport r = dbrq::equalize(*model, {example});   // fp32 function unchanged
//   std::cout << r.to_string();                                    // the pairs and their ranges
//   dbrq::prepare(*model, {example}, mapping);  ...  dbrq::convert(*model);
//
// For each pair conv -> [batch_norm] -> [relu] -> conv (or linear -> [relu] -> linear) where the
// intermediate tensors have no other reader, output channel i of the first layer is divided by
// s_i = sqrt(r1_i / r2_i) and input channel i of the second multiplied by it, r1_i being the range
// (max |w|) of the first layer's output channel i and r2_i that of the second's input channel i,
// both after folding a following batch norm (as convert will quantize them). Afterwards both ranges
// are sqrt(r1_i r2_i): channels that per-tensor weight quantization would crush get their share of
// the range. ReLU is positive-homogeneous (relu(x / s) s = relu(x) for s > 0), so the fp32 function
// is unchanged. Pairs are found from the data flow of one run on `example_inputs` (not module
// order); a chain whose intermediate is read by anything else (a residual add, a model output, a
// second layer) is left alone. Pairs sharing a layer are iterated until the factors settle.
//
// ReLU6 (and hardtanh(0, 6)) is not positive-homogeneous: relu6(x / s) s = clamp(x, 0, 6 s). By
// default such pairs are skipped (reported); Relu6Policy::kAsRelu equalizes them anyway, as AIMET
// does after replacing ReLU6 by ReLU: the fp32 function then changes where a pre-activation lies
// between 6 and 6 s_i, and the report measures by how much on the example.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "runtime/module.h"

namespace dbrq {

enum class Relu6Policy {
  kSkip,    // pairs through relu6 / hardtanh(0, 6) are not equalized (exact)
  kAsRelu,  // equalized as if the activation were relu (changes the fp32 function; measured)
};

struct EqualizeOptions {
  Relu6Policy relu6 = Relu6Policy::kSkip;
  int max_iterations = 20;   // rounds over all pairs (a layer in two pairs moves twice per round)
  double tolerance = 1e-4;   // stop when every factor of a round is within 1 +- tolerance
  // With exact pairs only (no kAsRelu pair), the model's outputs on the example are compared before
  // and after; a relative change (max |after - before| / max |before|) above this means something
  // read an equalized tensor outside dbrq's ops: the weights are restored and ValueError thrown.
  double max_output_change = 1e-4;
};

struct EqualizedPair {
  std::string first, second;  // layers (fqn, or "module:op#node" for functional calls)
  std::string via;            // what lies between: "batch_norm+relu", "relu", "" (nothing)
  int64_t channels = 0;
  // max over channels of max(r1_i / r2_i, r2_i / r1_i): 1 when perfectly equalized.
  double imbalance_before = 0.0, imbalance_after = 0.0;
  bool exact = true;  // false for a relu6 pair equalized under kAsRelu
};

struct EqualizeReport {
  std::vector<EqualizedPair> pairs;
  std::vector<std::string> skipped;  // candidate pairs left alone, each with the reason
  int iterations = 0;
  double output_change = 0.0;  // relative max abs change of the outputs on the example
  std::string to_string() const;
};

// Equalizes `model` in place (eval mode, not prepared). `example_inputs`: the 1 to 4 tensors its
// forward takes. Finding no pair is not an error: the report says so (pairs empty, skipped lists
// candidates and why). Throws UsageError for a prepared model, ValueError for empty inputs or bad
// options, and whatever the model's forward throws on the example (the model is then unchanged).
EqualizeReport equalize(nn::Module& model, const std::vector<Tensor>& example_inputs,
                        const EqualizeOptions& options = {});

// The same from several example batches (each the tensors forward takes), for a model with
// data-dependent control flow: pass one batch per path (the calibration data will do). A pair is
// equalized only if every batch that runs either of its layers finds the same pair; one that is
// not a pair on some path (there the first layer's output has another reader, or the second layer
// reads something else) is skipped with the reason. A path no batch takes is not seen: equalize
// cannot know about it. The output check runs on every batch.
EqualizeReport equalize(nn::Module& model, const std::vector<std::vector<Tensor>>& examples,
                        const EqualizeOptions& options = {});

}  // namespace dbrq
