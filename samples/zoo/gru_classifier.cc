#include "samples/zoo/gru_classifier.h"

#include <algorithm>

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

GruClassifier::GruClassifier(const GruClassifierConfig& config) : config_(config) {
  embedding = register_module("embedding", std::make_shared<nn::EmbeddingImpl>(config.vocab_size, config.embedding_dim));
  gru = register_module(
      "gru",
      std::make_shared<nn::GRUImpl>(
          nn::GRUOptions(config.embedding_dim, config.hidden_size).num_layers(config.num_layers).batch_first(true)));
  classifier = register_module("classifier", std::make_shared<nn::LinearImpl>(config.hidden_size, config.num_classes));
}

std::vector<int64_t> GruClassifier::lengths_of(const Tensor& ids) {
  DBRQ_ENSURE(ids.defined() && ids.dim() == 2 && ids.dtype() == dbrq::DType::kS64, dbrq::ValueError,
              "GruClassifier: expected [batch, steps] s64 token ids, got ",
              ids.defined() ? ids.shape_string() + " " + dbrq::dtype_name(ids.dtype()) : std::string("undefined"));
  const std::vector<int64_t> v = ids.contiguous().to_vector<int64_t>();
  const int64_t batch = ids.size(0), steps = ids.size(1);
  std::vector<int64_t> lengths(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const auto row = v.begin() + b * steps;
    lengths[static_cast<size_t>(b)] = std::find(row, row + steps, int64_t{0}) - row;
    DBRQ_ENSURE(lengths[static_cast<size_t>(b)] >= 1, dbrq::ValueError, "GruClassifier: sequence ", b,
                " is empty (its first token is the padding id 0)");
  }
  return lengths;
}

Tensor GruClassifier::forward(const Tensor& ids) {
  const std::vector<int64_t> lengths = lengths_of(ids);
  // Only as many steps as the longest sequence: the trip count follows the data. (narrow and
  // contiguous even when they change nothing: every call runs the same ops.)
  const int64_t steps = *std::max_element(lengths.begin(), lengths.end());
  const Tensor x = (*embedding)(ids.narrow(1, 0, steps).contiguous());
  auto [out, h_n] = (*gru)(x, Tensor(), lengths);
  return (*classifier)(h_n.select(0, config_.num_layers - 1));
}

}  // namespace zoo
