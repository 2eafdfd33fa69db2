#include "samples/zoo/bert_encoder.h"

#include <cmath>

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

BertEmbeddings::BertEmbeddings(const BertConfig& c) : max_position_(c.max_position) {
  word_embeddings = register_module("word_embeddings", std::make_shared<nn::EmbeddingImpl>(c.vocab_size, c.hidden_size));
  position_embeddings =
      register_module("position_embeddings", std::make_shared<nn::EmbeddingImpl>(c.max_position, c.hidden_size));
  token_type_embeddings =
      register_module("token_type_embeddings", std::make_shared<nn::EmbeddingImpl>(c.type_vocab_size, c.hidden_size));
  LayerNorm = register_module("LayerNorm", std::make_shared<nn::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<nn::DropoutImpl>(c.dropout));
}

Tensor BertEmbeddings::forward(const Tensor& input_ids) {
  DBRQ_ENSURE(input_ids.dim() == 2, dbrq::ShapeError, "BertEmbeddings: input_ids must be [batch, seq], got ",
              input_ids.shape_string());
  const int64_t seq = input_ids.size(1);
  DBRQ_ENSURE(seq <= max_position_, dbrq::ShapeError, "BertEmbeddings: sequence length ", seq, " exceeds max_position ",
              max_position_);
  // [S] positions and [N, S] zero token types; their embeddings broadcast against [N, S, hidden].
  const Tensor positions = dbrq::arange(seq, dbrq::DType::kS64);
  const Tensor token_types = dbrq::zeros(input_ids.sizes(), dbrq::DType::kS64);
  Tensor x = (*word_embeddings)(input_ids) + (*position_embeddings)(positions);
  x = x + (*token_type_embeddings)(token_types);
  return (*dropout)((*LayerNorm)(x));
}

BertSelfAttention::BertSelfAttention(const BertConfig& c)
    : num_heads_(c.num_heads), head_size_(c.num_heads > 0 ? c.hidden_size / c.num_heads : 0) {
  DBRQ_ENSURE(c.num_heads >= 1 && c.hidden_size % c.num_heads == 0, dbrq::ValueError, "BertSelfAttention: num_heads (",
              c.num_heads, ") must be >= 1 and divide hidden_size (", c.hidden_size, ")");
  query = register_module("query", std::make_shared<nn::LinearImpl>(c.hidden_size, c.hidden_size));
  key = register_module("key", std::make_shared<nn::LinearImpl>(c.hidden_size, c.hidden_size));
  value = register_module("value", std::make_shared<nn::LinearImpl>(c.hidden_size, c.hidden_size));
  dropout = register_module("dropout", std::make_shared<nn::DropoutImpl>(c.dropout));
}

Tensor BertSelfAttention::split_heads(const Tensor& x) const {
  return x.reshape({x.size(0), x.size(1), num_heads_, head_size_}).permute({0, 2, 1, 3});
}

Tensor BertSelfAttention::forward(const Tensor& hidden) {
  const Tensor q = split_heads((*query)(hidden));
  const Tensor k = split_heads((*key)(hidden));
  const Tensor v = split_heads((*value)(hidden));
  // Scores are scaled by 1/sqrt(head_size) so their variance does not grow with the head size.
  Tensor scores = dbrq::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(head_size_));
  const Tensor probs = (*dropout)(dbrq::softmax(scores, -1));
  const Tensor context = dbrq::matmul(probs, v).permute({0, 2, 1, 3});  // [N, S, heads, head_size]
  return context.reshape({hidden.size(0), hidden.size(1), num_heads_ * head_size_});
}

BertResidualOutput::BertResidualOutput(int64_t in_features, const BertConfig& c) {
  dense = register_module("dense", std::make_shared<nn::LinearImpl>(in_features, c.hidden_size));
  LayerNorm = register_module("LayerNorm", std::make_shared<nn::LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<nn::DropoutImpl>(c.dropout));
}

Tensor BertResidualOutput::forward(const Tensor& hidden, const Tensor& residual) {
  return (*LayerNorm)((*dropout)((*dense)(hidden)) + residual);
}

BertAttention::BertAttention(const BertConfig& c) {
  self = register_module("self", std::make_shared<BertSelfAttention>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c.hidden_size, c));
}

Tensor BertAttention::forward(const Tensor& hidden) { return (*output)((*self)(hidden), hidden); }

BertIntermediate::BertIntermediate(const BertConfig& c) {
  dense = register_module("dense", std::make_shared<nn::LinearImpl>(c.hidden_size, c.intermediate_size));
  intermediate_act_fn = register_module("intermediate_act_fn", std::make_shared<nn::GELUImpl>());
}

Tensor BertIntermediate::forward(const Tensor& hidden) { return (*intermediate_act_fn)((*dense)(hidden)); }

BertLayer::BertLayer(const BertConfig& c) {
  attention = register_module("attention", std::make_shared<BertAttention>(c));
  intermediate = register_module("intermediate", std::make_shared<BertIntermediate>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c.intermediate_size, c));
}

Tensor BertLayer::forward(const Tensor& hidden) {
  const Tensor attended = (*attention)(hidden);
  return (*output)((*intermediate)(attended), attended);
}

BertLayerStack::BertLayerStack(const BertConfig& c) {
  layer = register_module("layer", std::make_shared<nn::ModuleListImpl>());
  for (int64_t i = 0; i < c.num_layers; ++i) layer->push_back(std::make_shared<BertLayer>(c));
}

Tensor BertLayerStack::forward(const Tensor& hidden) {
  Tensor x = hidden;
  for (size_t i = 0; i < layer->size(); ++i) x = (*layer->at<BertLayer>(i))(x);
  return x;
}

BertEncoder::BertEncoder(const BertConfig& config) : config_(config) {
  DBRQ_ENSURE(config.vocab_size >= 1 && config.hidden_size >= 1 && config.num_layers >= 0 &&
                  config.intermediate_size >= 1 && config.max_position >= 1 && config.type_vocab_size >= 1,
              dbrq::ValueError, "BertEncoder: sizes must be positive (vocab_size ", config.vocab_size, ", hidden_size ",
              config.hidden_size, ", num_layers ", config.num_layers, ", intermediate_size ", config.intermediate_size,
              ", max_position ", config.max_position, ")");
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(config));
  encoder = register_module("encoder", std::make_shared<BertLayerStack>(config));
}

Tensor BertEncoder::forward(const Tensor& input_ids) { return (*encoder)((*embeddings)(input_ids)); }

}  // namespace zoo
