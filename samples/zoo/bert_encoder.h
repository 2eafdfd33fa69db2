// A BERT-style transformer encoder (post-LayerNorm, GELU feed-forward) with HuggingFace BERT's
// module and key names ("embeddings.word_embeddings.weight",
// "encoder.layer.0.attention.self.query.weight", "encoder.layer.0.output.LayerNorm.bias", ...):
//
//   auto model = std::make_shared<zoo::BertEncoder>();   // 4 layers, d_model 256, 4 heads, FFN 1024
//   model->eval();
//   dbrq::Tensor ids = dbrq::zeros({2, 16}, dbrq::DType::kS64);   // token ids, [batch, seq]
//   dbrq::Tensor hidden = (*model)(ids);                          // [2, 16, 256]
//
// Attention is written out with Linear q/k/v, reshape/permute, matmul, scaling and softmax (no
// fused attention op), so each step is visible to quantization. There is no attention mask (every
// token attends to every token), token types are all 0, and there is no pooler: the output is the
// last hidden state. Unlike HuggingFace there is no "embeddings.position_ids" buffer; positions
// are computed from the sequence length.
#pragma once

#include <cstdint>
#include <memory>

#include "dbrq.h"

namespace zoo {

struct BertConfig {
  // bert-base-uncased's WordPiece vocabulary size, so its tokenizer's ids are valid inputs.
  int64_t vocab_size = 30522;
  int64_t hidden_size = 256;  // d_model
  int64_t num_layers = 4;
  int64_t num_heads = 4;  // must divide hidden_size
  int64_t intermediate_size = 1024;
  int64_t max_position = 128;  // longest sequence
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;  // HuggingFace BERT's value
  double dropout = 0.1;           // active only in train(), which dbrq never needs
};

// word + position + token-type embeddings, LayerNorm, dropout.
struct BertEmbeddings : dbrq::nn::CallableModule<BertEmbeddings> {
  explicit BertEmbeddings(const BertConfig& config);
  // [N, S] s64 token ids -> [N, S, hidden].
  dbrq::Tensor forward(const dbrq::Tensor& input_ids);

  std::shared_ptr<dbrq::nn::EmbeddingImpl> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<dbrq::nn::LayerNormImpl> LayerNorm;  // HuggingFace's key name
  std::shared_ptr<dbrq::nn::DropoutImpl> dropout;

 private:
  int64_t max_position_;
};

// Multi-head scaled dot-product self-attention; returns the heads' concatenated contexts.
struct BertSelfAttention : dbrq::nn::CallableModule<BertSelfAttention> {
  explicit BertSelfAttention(const BertConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& hidden);  // [N, S, hidden] -> [N, S, hidden]

  std::shared_ptr<dbrq::nn::LinearImpl> query, key, value;
  std::shared_ptr<dbrq::nn::DropoutImpl> dropout;  // on the attention probabilities

 private:
  // [N, S, hidden] -> [N, heads, S, head_size]
  dbrq::Tensor split_heads(const dbrq::Tensor& x) const;

  int64_t num_heads_, head_size_;
};

// Dense projection, dropout, then LayerNorm over the sum with the sub-layer's input. HuggingFace
// uses this shape twice: BertSelfOutput (after attention) and BertOutput (after the FFN).
struct BertResidualOutput : dbrq::nn::CallableModule<BertResidualOutput> {
  BertResidualOutput(int64_t in_features, const BertConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& hidden, const dbrq::Tensor& residual);

  std::shared_ptr<dbrq::nn::LinearImpl> dense;
  std::shared_ptr<dbrq::nn::LayerNormImpl> LayerNorm;
  std::shared_ptr<dbrq::nn::DropoutImpl> dropout;
};

struct BertAttention : dbrq::nn::CallableModule<BertAttention> {
  explicit BertAttention(const BertConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& hidden);

  std::shared_ptr<BertSelfAttention> self;
  std::shared_ptr<BertResidualOutput> output;
};

// The first half of the feed-forward block: dense (hidden -> intermediate) and GELU (erf form).
struct BertIntermediate : dbrq::nn::CallableModule<BertIntermediate> {
  explicit BertIntermediate(const BertConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& hidden);

  std::shared_ptr<dbrq::nn::LinearImpl> dense;
  std::shared_ptr<dbrq::nn::GELUImpl> intermediate_act_fn;
};

struct BertLayer : dbrq::nn::CallableModule<BertLayer> {
  explicit BertLayer(const BertConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& hidden);

  std::shared_ptr<BertAttention> attention;
  std::shared_ptr<BertIntermediate> intermediate;
  std::shared_ptr<BertResidualOutput> output;
};

// Holds the layers under "layer.<i>", as HuggingFace's BertEncoder does.
struct BertLayerStack : dbrq::nn::CallableModule<BertLayerStack> {
  explicit BertLayerStack(const BertConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& hidden);

  std::shared_ptr<dbrq::nn::ModuleListImpl> layer;
};

struct BertEncoder : dbrq::nn::CallableModule<BertEncoder> {
  explicit BertEncoder(const BertConfig& config = {});
  // [N, S] s64 token ids (S <= max_position) -> [N, S, hidden] last hidden state.
  dbrq::Tensor forward(const dbrq::Tensor& input_ids);

  const BertConfig& config() const { return config_; }

  std::shared_ptr<BertEmbeddings> embeddings;
  std::shared_ptr<BertLayerStack> encoder;

 private:
  BertConfig config_;
};

}  // namespace zoo
