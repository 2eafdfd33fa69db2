#include "samples/zoo/decoder_lm.h"

#include <cmath>
#include <string>

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

CausalSelfAttention::CausalSelfAttention(const DecoderConfig& c)
    : num_heads_(c.num_heads), head_dim_(c.num_heads > 0 ? c.d_model / c.num_heads : 0) {
  DBRQ_ENSURE(c.num_heads >= 1 && c.d_model % c.num_heads == 0, dbrq::ValueError,
              "CausalSelfAttention: num_heads (", c.num_heads, ") must be >= 1 and divide d_model (", c.d_model, ")");
  q_proj = register_module("q_proj", std::make_shared<nn::LinearImpl>(c.d_model, c.d_model));
  k_proj = register_module("k_proj", std::make_shared<nn::LinearImpl>(c.d_model, c.d_model));
  v_proj = register_module("v_proj", std::make_shared<nn::LinearImpl>(c.d_model, c.d_model));
  out_proj = register_module("out_proj", std::make_shared<nn::LinearImpl>(c.d_model, c.d_model));
}

Tensor CausalSelfAttention::split_heads(const Tensor& x) const {
  return x.reshape({x.size(0), x.size(1), num_heads_, head_dim_}).permute({0, 2, 1, 3});
}

AttentionOutput CausalSelfAttention::forward(const Tensor& x, const LayerKV& past) {
  const int64_t batch = x.size(0), seq = x.size(1);
  const double scale = std::sqrt(static_cast<double>(head_dim_));
  if (seq == 1 && past.key.defined()) {
    // One token after a cached past, the step generate() repeats: the query sees every key, so
    // there is nothing to narrow, and one position needs no permute ([N, 1, heads, head_dim] and
    // [N, heads, 1, head_dim] are the same memory). Same values as the general path below, with 7
    // ops fewer per call. (Only with a past: a one-token prompt takes the prompt path, so it runs
    // the ops calibration saw on every other prompt.)
    const auto heads = [&](const Tensor& t) { return t.reshape({batch, num_heads_, 1, head_dim_}); };
    const Tensor q = heads((*q_proj)(x));
    const Tensor k = dbrq::cat({past.key, heads((*k_proj)(x))}, 2);
    const Tensor v = dbrq::cat({past.value, heads((*v_proj)(x))}, 2);
    const Tensor scores = dbrq::matmul(q, k.transpose(-1, -2)) / scale;   // [N, heads, 1, past + 1]
    const Tensor context = dbrq::matmul(dbrq::softmax(scores, -1), v);   // [N, heads, 1, head_dim]
    return {(*out_proj)(context.reshape({batch, 1, num_heads_ * head_dim_})), LayerKV{k, v}};
  }
  const Tensor q = split_heads((*q_proj)(x));
  Tensor k = split_heads((*k_proj)(x));
  Tensor v = split_heads((*v_proj)(x));
  if (past.key.defined()) {
    k = dbrq::cat({past.key, k}, 2);
    v = dbrq::cat({past.value, v}, 2);
  }
  const int64_t past_len = k.size(2) - seq;
  // Row i of this call is position past_len + i: it sees keys 0..past_len + i. One row per
  // iteration keeps the scores free of masked entries (see the header). The rows are appended one
  // at a time (a two-input cat per iteration) rather than joined by one cat over all of them: the
  // recorded program keys a cat by its inputs, so a cat of `seq` tensors would be a new op for
  // every prompt length calibration did not see, and run fp32.
  Tensor context;
  for (int64_t i = 0; i < seq; ++i) {
    const int64_t visible = past_len + i + 1;
    const Tensor scores = dbrq::matmul(q.narrow(2, i, 1), k.narrow(2, 0, visible).transpose(-1, -2)) / scale;
    const Tensor row = dbrq::matmul(dbrq::softmax(scores, -1), v.narrow(2, 0, visible));  // [N, heads, 1, head_dim]
    context = i == 0 ? row : dbrq::cat({context, row}, 2);
  }
  const Tensor merged = context.permute({0, 2, 1, 3}).reshape({batch, seq, num_heads_ * head_dim_});
  return {(*out_proj)(merged), LayerKV{k, v}};
}

DecoderMlp::DecoderMlp(const DecoderConfig& c) {
  fc_in = register_module("fc_in", std::make_shared<nn::LinearImpl>(c.d_model, c.d_ff));
  act = register_module("act", std::make_shared<nn::GELUImpl>());
  fc_out = register_module("fc_out", std::make_shared<nn::LinearImpl>(c.d_ff, c.d_model));
}

Tensor DecoderMlp::forward(const Tensor& x) { return (*fc_out)((*act)((*fc_in)(x))); }

DecoderBlock::DecoderBlock(const DecoderConfig& c) {
  ln_1 = register_module("ln_1", std::make_shared<nn::LayerNormImpl>(c.d_model, c.layer_norm_eps));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(c));
  ln_2 = register_module("ln_2", std::make_shared<nn::LayerNormImpl>(c.d_model, c.layer_norm_eps));
  mlp = register_module("mlp", std::make_shared<DecoderMlp>(c));
}

BlockOutput DecoderBlock::forward(const Tensor& x, const LayerKV& past) {
  AttentionOutput a = (*attn)((*ln_1)(x), past);
  const Tensor h1 = x + a.out;
  return {h1 + (*mlp)((*ln_2)(h1)), std::move(a.present)};
}

DecoderLM::DecoderLM(const DecoderConfig& c) : config_(c) {
  DBRQ_ENSURE(c.vocab_size >= 1 && c.d_model >= 1 && c.num_layers >= 0 && c.d_ff >= 1 && c.max_positions >= 1,
              dbrq::ValueError, "DecoderLM: sizes must be positive (vocab_size ", c.vocab_size, ", d_model ", c.d_model,
              ", num_layers ", c.num_layers, ", d_ff ", c.d_ff, ", max_positions ", c.max_positions, ")");
  wte = register_module("wte", std::make_shared<nn::EmbeddingImpl>(c.vocab_size, c.d_model));
  wpe = register_module("wpe", std::make_shared<nn::EmbeddingImpl>(c.max_positions, c.d_model));
  h = register_module("h", std::make_shared<nn::ModuleListImpl>());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    blocks_.push_back(std::make_shared<DecoderBlock>(c));
    h->push_back(blocks_.back());
  }
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNormImpl>(c.d_model, c.layer_norm_eps));
  lm_head = register_module("lm_head", std::make_shared<nn::LinearImpl>(c.d_model, c.vocab_size, /*bias=*/false));
}

void DecoderLM::check_input(const Tensor& ids, const KVCache& past) const {
  DBRQ_ENSURE(ids.defined(), dbrq::ValueError, "DecoderLM: input_ids is undefined");
  DBRQ_ENSURE(ids.dtype() == dbrq::DType::kS64, dbrq::DTypeError, "DecoderLM: input_ids must be s64 token ids, got ",
              dbrq::dtype_name(ids.dtype()));
  DBRQ_ENSURE(ids.dim() == 2, dbrq::ShapeError, "DecoderLM: input_ids must be [batch, seq], got ", ids.shape_string());
  DBRQ_ENSURE(ids.size(0) >= 1 && ids.size(1) >= 1, dbrq::ValueError,
              "DecoderLM: input_ids must hold at least one token per sequence, got ", ids.shape_string());
  const int64_t past_len = past.length();
  DBRQ_ENSURE(past_len + ids.size(1) <= config_.max_positions, dbrq::ValueError, "DecoderLM: ", past_len,
              " cached + ", ids.size(1), " new positions exceed max_positions ", config_.max_positions);
  const std::vector<int64_t> values = ids.to_vector<int64_t>();
  for (size_t i = 0; i < values.size(); ++i) {
    DBRQ_ENSURE(values[i] >= 0 && values[i] < config_.vocab_size, dbrq::IndexError, "DecoderLM: token id ", values[i],
                " at [", static_cast<int64_t>(i) / ids.size(1), ", ", static_cast<int64_t>(i) % ids.size(1),
                "] is outside the vocabulary [0, ", config_.vocab_size, ")");
  }
  if (past.layers.empty()) return;
  DBRQ_ENSURE(static_cast<int64_t>(past.layers.size()) == config_.num_layers, dbrq::ValueError, "DecoderLM: the cache has ",
              past.layers.size(), " layers, the model ", config_.num_layers);
  const int64_t head_dim = config_.d_model / config_.num_heads;
  for (size_t l = 0; l < past.layers.size(); ++l) {
    for (const Tensor* t : {&past.layers[l].key, &past.layers[l].value}) {
      const bool ok = t->defined() && t->dim() == 4 && t->size(0) == ids.size(0) && t->size(1) == config_.num_heads &&
                      t->size(2) == past_len && t->size(3) == head_dim;
      DBRQ_ENSURE(ok, dbrq::ShapeError, "DecoderLM: cache layer ", l, " must hold keys and values of [", ids.size(0), ", ",
                  config_.num_heads, ", ", past_len, ", ", head_dim, "] (batch, heads, cached, head_dim), got ",
                  t->defined() ? t->shape_string() : std::string("undefined"));
    }
  }
}

DecoderOutput DecoderLM::forward(const Tensor& input_ids, const KVCache& past) {
  check_input(input_ids, past);
  const int64_t past_len = past.length(), seq = input_ids.size(1);
  const Tensor positions =
      dbrq::arange(static_cast<double>(past_len), static_cast<double>(past_len + seq), 1.0, dbrq::DType::kS64);
  Tensor x = (*wte)(input_ids) + (*wpe)(positions);  // [N, S, d] + [S, d]
  DecoderOutput out;
  out.cache.layers.reserve(blocks_.size());
  for (size_t l = 0; l < blocks_.size(); ++l) {
    BlockOutput b = (*blocks_[l])(x, past.layers.empty() ? LayerKV{} : past.layers[l]);
    x = std::move(b.hidden);
    out.cache.layers.push_back(std::move(b.present));
  }
  out.logits = (*lm_head)((*ln_f)(x));
  return out;
}

Generation DecoderLM::generate(const std::vector<int64_t>& prompt_ids, int64_t max_new_tokens, int64_t stop_token,
                               bool keep_logits) {
  const int64_t prompt_len = static_cast<int64_t>(prompt_ids.size()), vocab = config_.vocab_size;
  DBRQ_ENSURE(prompt_len >= 1, dbrq::ValueError, "DecoderLM::generate: the prompt is empty");
  DBRQ_ENSURE(max_new_tokens >= 0, dbrq::ValueError, "DecoderLM::generate: max_new_tokens must be >= 0, got ",
              max_new_tokens);
  DBRQ_ENSURE(prompt_len + max_new_tokens <= config_.max_positions, dbrq::ValueError, "DecoderLM::generate: prompt (",
              prompt_len, " tokens) + max_new_tokens (", max_new_tokens, ") exceed max_positions ",
              config_.max_positions);
  DBRQ_ENSURE(stop_token == -1 || (stop_token >= 0 && stop_token < vocab), dbrq::IndexError,
              "DecoderLM::generate: stop_token ", stop_token, " is neither -1 (none) nor in the vocabulary [0, ", vocab,
              ")");
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    DBRQ_ENSURE(prompt_ids[i] >= 0 && prompt_ids[i] < vocab, dbrq::IndexError, "DecoderLM::generate: prompt token ",
                prompt_ids[i], " at position ", i, " is outside the vocabulary [0, ", vocab, ")");
  }
  Generation g;
  std::vector<float> kept;
  Tensor input = dbrq::from_vector(prompt_ids, {1, prompt_len});
  KVCache cache;
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    DecoderOutput out = (*this)(input, cache);
    cache = std::move(out.cache);
    // The last position's row, read in place when the logits are plain f32 (the default); int8
    // logits (ConvertOptions::int8_outputs) or a strided tensor are copied out as real values.
    std::vector<float> copied;
    const float* all = nullptr;
    if (out.logits.dtype() == dbrq::DType::kF32 && !out.logits.is_quantized() && out.logits.is_contiguous()) {
      all = out.logits.data<float>();
    } else {
      copied = out.logits.to_vector<float>();
      all = copied.data();
    }
    const float* last = all + out.logits.numel() - vocab;  // the last position's row
    int64_t best = 0;
    for (int64_t t = 1; t < vocab; ++t) {
      if (last[t] > last[best]) best = t;
    }
    if (keep_logits) kept.insert(kept.end(), last, last + vocab);
    g.tokens.push_back(best);
    if (best == stop_token) {
      g.stopped = true;
      break;
    }
    input = dbrq::from_vector(std::vector<int64_t>{best}, {1, 1});
  }
  if (keep_logits) g.logits = dbrq::from_vector(kept, {static_cast<int64_t>(g.tokens.size()), vocab});
  return g;
}

}  // namespace zoo
