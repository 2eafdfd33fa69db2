// A text classifier over variable-length token sequences: embedding, a two-layer GRU, and a linear
// head on the last layer's final hidden state of each sequence, taken at that sequence's own end:
//
//   auto model = std::make_shared<zoo::GruClassifier>();     // vocab 10000, 128-d, GRU 2 x 128, 4 classes
//   model->eval();
//   dbrq::Tensor ids = ...;                                 // [B, T] s64, padded with 0 at the end
//   dbrq::Tensor logits = (*model)(ids);                    // [B, 4]
//
//   embedding (vocab -> E)
//   gru (E -> H, num_layers, batch_first), per-sequence lengths
//   classifier (H -> classes) on h_n of the last layer
//
// Each sequence's length is the number of tokens before its first padding id (0); it must be at
// least 1. The GRU runs max(length) steps, and each sequence's recurrence ends at its own length
// (nn::GRU's lengths: PyTorch's pack_padded_sequence), so the loop's trip count depends on the
// data. tools/torch_zoo.py has the PyTorch twin (same state-dict keys, pack_padded_sequence).
//
// Quantization: dynamic (dbrq::default_dynamic_qconfig_mapping()) makes every GRU matrix product
// and the head dynamic int8, as PyTorch's quantize_dynamic does (nothing to calibrate); static
// (default_qconfig_mapping) also makes the gate arithmetic int8, and a model calibrated on batches
// of one padded width runs any batch size and lengths without an uncalibrated op. Measured SQNR
// and speed: docs/recurrent.md.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dbrq.h"

namespace zoo {

struct GruClassifierConfig {
  int64_t vocab_size = 10000;
  int64_t embedding_dim = 128;
  int64_t hidden_size = 128;
  int64_t num_layers = 2;
  int64_t num_classes = 4;
};

struct GruClassifier : dbrq::nn::CallableModule<GruClassifier> {
  explicit GruClassifier(const GruClassifierConfig& config = {});
  // [B, T] s64 token ids, 0-padded at the end -> [B, num_classes] logits.
  dbrq::Tensor forward(const dbrq::Tensor& ids);

  // Tokens before the first padding id, per row of `ids` ([B, T] s64). Throws ValueError for an
  // empty sequence.
  static std::vector<int64_t> lengths_of(const dbrq::Tensor& ids);

  const GruClassifierConfig& config() const { return config_; }

  std::shared_ptr<dbrq::nn::EmbeddingImpl> embedding;
  std::shared_ptr<dbrq::nn::GRUImpl> gru;
  std::shared_ptr<dbrq::nn::LinearImpl> classifier;

 private:
  GruClassifierConfig config_;
};

}  // namespace zoo
