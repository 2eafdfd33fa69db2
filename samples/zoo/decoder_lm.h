// A decoder-only transformer language model (GPT-2 style: learned positions, pre-LayerNorm blocks,
// GELU MLP) with a key/value cache and greedy generation, written against the public API only.
//
//   auto lm = std::make_shared<zoo::DecoderLM>();             // 4 layers, d_model 256, 4 heads, vocab 1024
//   lm->eval();
//   zoo::Generation g = lm->generate({5, 17, 42}, /*max_new_tokens=*/20, /*stop_token=*/0);
//   for (int64_t t : g.tokens) std::cout << t << " ";          // greedy continuation of the prompt
//
//   // One step by hand: the prompt fills the cache, then one token per call.
//   zoo::DecoderOutput out = (*lm)(dbrq::from_vector<int64_t>({5, 17, 42}, {1, 3}));   // logits [1, 3, vocab]
//   out = (*lm)(dbrq::from_vector<int64_t>({7}, {1, 1}), out.cache);                    // logits [1, 1, vocab]
//
// Quantizing it: prepare on a prompt, calibrate by generating (so the prompt call and the one-token
// calls with every cache length are seen), convert; generate() then runs int8.
//
//   dbrq::prepare(*lm, [&] { (*lm)(prompt); }, dbrq::default_qconfig_mapping("onednn"));
//   for (const auto& p : calibration_prompts) lm->generate(p, 24);
//   dbrq::convert(*lm);
//
// The cache crosses module boundaries as declared structs (LayerKV, KVCache, DecoderOutput) so the
// tracer sees every tensor in it; it is returned by each call and passed to the next, never kept
// inside the modules. Causal attention is computed row by row: query position i attends to the
// keys 0..past+i through narrow(), so there is no mask to add (an additive -inf or -1e4 mask would
// stretch the quantization range of the scores and flatten int8 attention). The prompt call loops
// over its rows; a one-token call with a cache (each generated token) sees every key and skips the
// narrows and permutes (same values, fewer ops). Module and state-dict names follow
// GPT-2's layout ("wte.weight", "h.0.ln_1.weight", "h.0.attn.q_proj.weight", "h.0.mlp.fc_in.bias",
// "ln_f.weight", "lm_head.weight") with separate q / k / v projections; tools/torch_zoo.py has the
// PyTorch twin with the same keys.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dbrq.h"

namespace zoo {

struct DecoderConfig {
  int64_t vocab_size = 1024;
  int64_t d_model = 256;
  int64_t num_layers = 4;
  int64_t num_heads = 4;        // must divide d_model
  int64_t d_ff = 1024;          // MLP width, 4 * d_model as in GPT-2
  int64_t max_positions = 256;  // longest sequence (prompt + generated tokens)
  double layer_norm_eps = 1e-5;
};

// One layer's keys and values, [batch, heads, length, head_dim] each; both undefined when nothing
// is cached yet.
struct LayerKV {
  dbrq::Tensor key, value;
};
DBRQ_TENSOR_STRUCT(LayerKV, key, value)

// Every layer's cache. Empty (no layers) before the first call.
struct KVCache {
  std::vector<LayerKV> layers;
  // Cached positions: 0 when empty.
  int64_t length() const { return layers.empty() || !layers[0].key.defined() ? 0 : layers[0].key.size(2); }
};
DBRQ_TENSOR_STRUCT(KVCache, layers)

struct DecoderOutput {
  dbrq::Tensor logits;  // [batch, seq, vocab]
  KVCache cache;        // the past plus this call's positions
};
DBRQ_TENSOR_STRUCT(DecoderOutput, logits, cache)

struct AttentionOutput {
  dbrq::Tensor out;  // [batch, seq, d_model]
  LayerKV present;   // past and new keys / values
};
DBRQ_TENSOR_STRUCT(AttentionOutput, out, present)

// Multi-head causal self-attention with a cache: the new keys and values are appended to the
// past ones with cat, and query i of this call sees positions 0..past+i.
struct CausalSelfAttention : dbrq::nn::CallableModule<CausalSelfAttention> {
  explicit CausalSelfAttention(const DecoderConfig& config);
  AttentionOutput forward(const dbrq::Tensor& x, const LayerKV& past);

  std::shared_ptr<dbrq::nn::LinearImpl> q_proj, k_proj, v_proj, out_proj;

 private:
  // [N, S, d_model] -> [N, heads, S, head_dim]
  dbrq::Tensor split_heads(const dbrq::Tensor& x) const;

  int64_t num_heads_, head_dim_;
};

// Linear(d, d_ff) -> GELU (erf form) -> Linear(d_ff, d).
struct DecoderMlp : dbrq::nn::CallableModule<DecoderMlp> {
  explicit DecoderMlp(const DecoderConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& x);

  std::shared_ptr<dbrq::nn::LinearImpl> fc_in;
  std::shared_ptr<dbrq::nn::GELUImpl> act;
  std::shared_ptr<dbrq::nn::LinearImpl> fc_out;
};

struct BlockOutput {
  dbrq::Tensor hidden;  // [batch, seq, d_model]
  LayerKV present;
};
DBRQ_TENSOR_STRUCT(BlockOutput, hidden, present)

// x + attn(ln_1(x)), then h + mlp(ln_2(h)).
struct DecoderBlock : dbrq::nn::CallableModule<DecoderBlock> {
  explicit DecoderBlock(const DecoderConfig& config);
  BlockOutput forward(const dbrq::Tensor& x, const LayerKV& past);

  std::shared_ptr<dbrq::nn::LayerNormImpl> ln_1;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<dbrq::nn::LayerNormImpl> ln_2;
  std::shared_ptr<DecoderMlp> mlp;
};

// What generate() produced.
struct Generation {
  std::vector<int64_t> tokens;  // the new tokens (not the prompt), ending with the stop token if it came
  bool stopped = false;         // the stop token ended generation (else max_new_tokens did)
  // With keep_logits: [tokens.size(), vocab], row i the logits tokens[i] was the argmax of (the
  // prompt call's last position for row 0). Undefined otherwise.
  dbrq::Tensor logits;
};

struct DecoderLM : dbrq::nn::CallableModule<DecoderLM> {
  explicit DecoderLM(const DecoderConfig& config = {});

  // input_ids: [N, S] s64 ids in [0, vocab_size), S >= 1, with past.length() + S <= max_positions.
  // past: the cache a previous call returned (same batch), or empty. Throws DTypeError, ShapeError,
  // ValueError or IndexError for inputs outside those rules.
  DecoderOutput forward(const dbrq::Tensor& input_ids, const KVCache& past = {});

  // Greedy decoding of one sequence: one call on the whole prompt (filling the cache), then one call
  // per token, each time taking the argmax of the last position's logits (the first index on ties).
  // Stops after max_new_tokens tokens or when stop_token (-1: none) is produced. Requires a non-empty
  // prompt of ids in [0, vocab_size), max_new_tokens >= 0 and prompt + max_new_tokens <= max_positions;
  // throws ValueError / IndexError before running anything otherwise.
  Generation generate(const std::vector<int64_t>& prompt_ids, int64_t max_new_tokens, int64_t stop_token = -1,
                      bool keep_logits = false);

  const DecoderConfig& config() const { return config_; }

  std::shared_ptr<dbrq::nn::EmbeddingImpl> wte, wpe;
  std::shared_ptr<dbrq::nn::ModuleListImpl> h;
  std::shared_ptr<dbrq::nn::LayerNormImpl> ln_f;
  std::shared_ptr<dbrq::nn::LinearImpl> lm_head;

 private:
  void check_input(const dbrq::Tensor& input_ids, const KVCache& past) const;

  DecoderConfig config_;
  std::vector<std::shared_ptr<DecoderBlock>> blocks_;  // h's children, typed
};

}  // namespace zoo
