// The byte-level language model trained on Debian's license texts (tools/train_text_lm.py) and its
// metric, bits per character on held-out windows; shared by //bench:text_lm_eval and
// tests/models/text_lm_test.cc. See docs/text_lm.md.
//
//   text_lm::TextLmData d = text_lm::load_text_lm_data("tests/models/golden/text_lm_golden.safetensors");
//   std::shared_ptr<zoo::DecoderLM> lm = text_lm::make_text_lm("samples/data/text_lm.safetensors");
//   double fp32 = text_lm::bits_per_char(*lm, d.eval);                 // every held-out window
//   dbrq::prepare(*lm, {d.calib}, dbrq::default_qconfig_mapping("onednn"));
//   (*lm)(d.calib);                                                   // the one calibration batch
//   dbrq::convert(*lm);
//   double int8 = text_lm::bits_per_char(*lm, d.eval);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/decoder_lm.h"

namespace text_lm {

// The trained model's configuration (tools/train_text_lm.py CONFIG): bytes in, 64 positions.
zoo::DecoderConfig text_lm_config();
inline constexpr int64_t kTextLmContext = 64;

struct TextLmData {
  dbrq::Tensor eval;                            // s64 [W, 65] held-out windows: the model predicts bytes 1..64 of each
  dbrq::Tensor calib;                           // s64 [32, 64] calibration windows from the training split
  std::vector<double> fp32_nll;                 // PyTorch's fp32 summed NLL (nats) per eval window
  std::vector<double> fx_nll;                   // the same for PyTorch FX static int8 (onednn default qconfig)
  std::vector<double> dynamic_nll;              // and for quantize_dynamic
  std::map<std::string, std::string> metadata;  // fp32_bpc, fx_bpc, dynamic_bpc, ... (strings)
  // A metadata value as a number; throws dbrq::ValueError naming the key when it is absent or not one.
  double number(const std::string& key) const;
};

// Reads the golden file; throws dbrq::FileFormatError when a tensor is missing or has the wrong shape.
TextLmData load_text_lm_data(const std::string& path);

// A DecoderLM with text_lm_config() and the weights of `path` (F16 in the file, f32 in memory), eval mode.
std::shared_ptr<zoo::DecoderLM> make_text_lm(const std::string& weights_path);

// Rows [first, first + count) of `windows` (count -1: to the end) as one batch each of at most
// `batch` windows; returns the summed NLL in nats of each window's bytes 1..64 given the bytes before
// them, computed in double from the model's logits. `model` is a DecoderLM or anything whose first
// output tensor for a [N, 64] s64 input is [N, 64, 256] logits. Throws dbrq::ValueError for a range
// outside the windows or batch < 1, dbrq::ShapeError for windows that are not [W, 65].
std::vector<double> window_nll(dbrq::nn::Module& model, const dbrq::Tensor& windows, int64_t first = 0,
                               int64_t count = -1, int64_t batch = 64);

// Bits per character: the NLL summed over windows, / (64 * windows) / ln 2.
double bits_per_char(const std::vector<double>& nll);
double bits_per_char(dbrq::nn::Module& model, const dbrq::Tensor& windows, int64_t first = 0, int64_t count = -1,
                     int64_t batch = 64);

// Windows of `windows` with even (parity 0) or odd (1) row index, as one tensor.
dbrq::Tensor every_other(const dbrq::Tensor& windows, int parity);

}  // namespace text_lm
