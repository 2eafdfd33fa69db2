// The decoder-only LM of the zoo (samples/zoo/decoder_lm.h) against its PyTorch twin
// (tools/torch_zoo.py DecoderLM; goldens from make_model_goldens.py): fp32 prompt logits and greedy
// generations; the KV cache against recomputing the whole sequence; static int8 (prepare on a
// prompt, calibrate by generating, convert) against the twin's fp32 logits token by token; and every
// bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/zoo.h"
#include "tests/test_util.h"

namespace {

using dbrq::Tensor;
using zoo::DecoderLM;
using zoo::DecoderOutput;
using zoo::Generation;

constexpr char kGolden[] = "tests/models/golden/decoder_lm.safetensors";
constexpr int kNumPrompts = 2;  // prompt<p>, tokens<p>, step_logits<p> in the golden file
// max|a - b| / max|b|, as for the other zoo goldens (models_golden_test.cc).
constexpr double kTolerance = 1e-3;
// The int8 model's logits against the fp32 twin's, over every token of a generation (teacher
// forced: the twin's tokens), and for each token alone (128 logits: a noisier figure).
constexpr double kMinInt8Sqnr = 30.0;
constexpr double kMinInt8TokenSqnr = 26.0;

struct DecoderGolden {
  dbrq::NamedTensors weights;  // state-dict entries, file order
  std::map<std::string, Tensor> data;  // everything else
  std::string config;
};

const DecoderGolden& golden() {
  static const DecoderGolden* g = [] {
    auto* out = new DecoderGolden;
    for (auto& [name, t] : dbrq::load_safetensors(kGolden)) {
      const bool data = name == "input" || name == "output" || name.rfind("prompt", 0) == 0 ||
                        name.rfind("tokens", 0) == 0 || name.rfind("step_logits", 0) == 0;
      if (data) {
        out->data[name] = t;
      } else {
        out->weights.emplace_back(name, t);
      }
    }
    out->config = dbrq::load_safetensors_metadata(kGolden)["config"];
    return out;
  }();
  return *g;
}

Tensor golden_tensor(const std::string& name) { return dbrq::testing::golden(golden().data, name); }
std::vector<int64_t> golden_ids(const std::string& name) { return golden_tensor(name).to_vector<int64_t>(); }

// The tiny decoder with the golden weights, in eval mode.
std::shared_ptr<DecoderLM> golden_model() {
  auto lm = std::make_shared<DecoderLM>(zoo::decoder_lm_config(zoo::Variant::kTiny));
  lm->load_state_dict(golden().weights, /*strict=*/true);
  lm->eval();
  return lm;
}

Tensor ids_tensor(const std::vector<int64_t>& ids) {
  return dbrq::from_vector(ids, {1, static_cast<int64_t>(ids.size())});
}

// The last position's logits of a [1, S, vocab] output, as [1, vocab].
Tensor last_row(const Tensor& logits) { return logits.select(1, logits.size(1) - 1).contiguous(); }

// Runs the model on `prompt`, then feeds `tokens` (all but the last) one at a time through the cache,
// as generate() would have if it had chosen them: the logits every token of `tokens` is predicted from,
// [tokens.size(), vocab]. Lets the int8 model be compared with the twin on the twin's own sequence.
Tensor teacher_forced_logits(DecoderLM& lm, const std::vector<int64_t>& prompt, const std::vector<int64_t>& tokens) {
  std::vector<Tensor> rows;
  DecoderOutput out = lm(ids_tensor(prompt));
  rows.push_back(last_row(out.logits));
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    out = lm(ids_tensor({tokens[i]}), out.cache);
    rows.push_back(last_row(out.logits));
  }
  return dbrq::cat(rows, 0);
}

// Random prompts of the given lengths (uniform ids).
std::vector<std::vector<int64_t>> random_prompts(const std::vector<int64_t>& lengths, int64_t vocab, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<std::vector<int64_t>> out;
  for (int64_t n : lengths) {
    std::vector<int64_t> p(static_cast<size_t>(n));
    for (auto& t : p) t = token(gen);
    out.push_back(p);
  }
  return out;
}

// ---- fp32 against the PyTorch twin -------------------------------------------------------------

TEST(DecoderLMGolden, ConfigAndStateDictKeysMatchTheTwin) {
  EXPECT_EQ(golden().config,
            R"({"d_ff": 256, "d_model": 64, "layer_norm_eps": 1e-05, "max_positions": 64, "num_heads": 2, )"
            R"("num_layers": 2, "vocab_size": 128})");
  auto lm = std::make_shared<DecoderLM>(zoo::decoder_lm_config(zoo::Variant::kTiny));
  EXPECT_NO_THROW(lm->load_state_dict(golden().weights, /*strict=*/true));
  std::vector<std::string> model_keys, golden_keys;
  for (const auto& [k, t] : lm->state_dict()) model_keys.push_back(k);
  for (const auto& [k, t] : golden().weights) golden_keys.push_back(k);
  EXPECT_EQ(model_keys, golden_keys);  // names and PyTorch's order
}

TEST(DecoderLMGolden, PromptLogits) {
  auto lm = golden_model();
  const Tensor out = zoo::find_model("decoder_lm").run(*lm, golden_tensor("input"));
  dbrq::testing::expect_close(out, golden_tensor("output"), kTolerance, "prompt logits");
  std::cout << "[ golden   ] decoder_lm prompt logits: max relative error "
            << dbrq::testing::relative_error(out, golden_tensor("output")) << " over " << out.shape_string() << "\n";
}

TEST(DecoderLMGolden, GreedyGenerationMatchesTheTwin) {
  auto lm = golden_model();
  for (int p = 0; p < kNumPrompts; ++p) {
    SCOPED_TRACE("prompt " + std::to_string(p));
    const std::vector<int64_t> prompt = golden_ids("prompt" + std::to_string(p));
    const std::vector<int64_t> expected = golden_ids("tokens" + std::to_string(p));
    const Tensor expected_logits = golden_tensor("step_logits" + std::to_string(p));
    const Generation g = lm->generate(prompt, static_cast<int64_t>(expected.size()), /*stop_token=*/-1,
                                      /*keep_logits=*/true);
    EXPECT_EQ(g.tokens, expected);
    EXPECT_FALSE(g.stopped);
    dbrq::testing::expect_close(g.logits, expected_logits, kTolerance, "per-step logits");
    // Without keep_logits: the same tokens, no logits.
    const Generation plain = lm->generate(prompt, static_cast<int64_t>(expected.size()));
    EXPECT_EQ(plain.tokens, expected);
    EXPECT_FALSE(plain.logits.defined());
  }
}

// The cache path (prompt, then one token per call) computes what one call on the whole sequence
// computes: row by row causal attention equals attention over the cache.
TEST(DecoderLM, CachedStepsEqualOneCallOnTheWholeSequence) {
  auto lm = golden_model();
  const std::vector<int64_t> prompt = golden_ids("prompt0");
  const Generation g = lm->generate(prompt, 12, -1, /*keep_logits=*/true);
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), g.tokens.begin(), g.tokens.end() - 1);
  const Tensor full = (*lm)(ids_tensor(all)).logits;  // [1, prompt + 11, vocab]
  const int64_t n = static_cast<int64_t>(g.tokens.size());
  const Tensor tail = full.narrow(1, static_cast<int64_t>(prompt.size()) - 1, n).reshape({n, full.size(2)});
  dbrq::testing::expect_close(g.logits, tail.contiguous(), 1e-5, "cached steps vs one call");
  // Split elsewhere: 3 tokens, then the rest in one call with the 3-token cache.
  DecoderOutput a = (*lm)(ids_tensor(std::vector<int64_t>(all.begin(), all.begin() + 3)));
  EXPECT_EQ(a.cache.length(), 3);
  DecoderOutput b = (*lm)(ids_tensor(std::vector<int64_t>(all.begin() + 3, all.end())), a.cache);
  EXPECT_EQ(b.cache.length(), static_cast<int64_t>(all.size()));
  dbrq::testing::expect_close(b.logits, full.narrow(1, 3, full.size(1) - 3).contiguous(), 1e-5, "3 + rest");
}

TEST(DecoderLM, BatchedSequencesAreIndependent) {
  auto lm = golden_model();
  const std::vector<int64_t> p0 = golden_ids("prompt0");
  std::vector<int64_t> p1(p0.rbegin(), p0.rend());
  std::vector<int64_t> both = p0;
  both.insert(both.end(), p1.begin(), p1.end());
  const int64_t s = static_cast<int64_t>(p0.size());
  DecoderOutput two = (*lm)(dbrq::from_vector(both, {2, s}));
  DecoderOutput one = (*lm)(ids_tensor(p1));
  dbrq::testing::expect_close(two.logits.narrow(0, 1, 1).contiguous(), one.logits, 1e-5, "row 1 of a batch of 2");
  // And one cached step for both.
  DecoderOutput two_next = (*lm)(dbrq::from_vector<int64_t>({3, 4}, {2, 1}), two.cache);
  DecoderOutput one_next = (*lm)(dbrq::from_vector<int64_t>({4}, {1, 1}), one.cache);
  dbrq::testing::expect_close(two_next.logits.narrow(0, 1, 1).contiguous(), one_next.logits, 1e-5, "cached step");
}

TEST(DecoderLM, StopsAtTheStopToken) {
  auto lm = golden_model();
  const std::vector<int64_t> prompt = golden_ids("prompt0");
  const std::vector<int64_t> expected = golden_ids("tokens0");
  const int64_t stop = expected[5];
  const size_t first = static_cast<size_t>(std::find(expected.begin(), expected.end(), stop) - expected.begin());
  const Generation g = lm->generate(prompt, static_cast<int64_t>(expected.size()), stop, /*keep_logits=*/true);
  EXPECT_TRUE(g.stopped);
  EXPECT_EQ(g.tokens, std::vector<int64_t>(expected.begin(), expected.begin() + first + 1));
  EXPECT_EQ(g.logits.size(0), static_cast<int64_t>(first + 1));
  // max_new_tokens = 0 runs nothing.
  const Generation none = lm->generate(prompt, 0, -1, /*keep_logits=*/true);
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_FALSE(none.stopped);
}

TEST(DecoderLM, FullConfigurationKeysAndSizes) {
  const zoo::DecoderConfig c = zoo::decoder_lm_config(zoo::Variant::kFull);
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(c.d_model, 256);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.vocab_size, 1024);
  EXPECT_GE(c.max_positions, 160);
  const auto lm = zoo::make_model("decoder_lm", zoo::Variant::kFull);
  std::vector<std::string> keys;
  for (const auto& [k, t] : lm->state_dict()) keys.push_back(k);
  const std::vector<std::string> first = {"wte.weight",
                                          "wpe.weight",
                                          "h.0.ln_1.weight",
                                          "h.0.ln_1.bias",
                                          "h.0.attn.q_proj.weight",
                                          "h.0.attn.q_proj.bias",
                                          "h.0.attn.k_proj.weight",
                                          "h.0.attn.k_proj.bias",
                                          "h.0.attn.v_proj.weight",
                                          "h.0.attn.v_proj.bias",
                                          "h.0.attn.out_proj.weight",
                                          "h.0.attn.out_proj.bias",
                                          "h.0.ln_2.weight",
                                          "h.0.ln_2.bias",
                                          "h.0.mlp.fc_in.weight",
                                          "h.0.mlp.fc_in.bias",
                                          "h.0.mlp.fc_out.weight",
                                          "h.0.mlp.fc_out.bias"};
  ASSERT_EQ(keys.size(), 2u + 4u * 16u + 3u);  // embeddings, 16 per block, ln_f (2), lm_head (no bias)
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + first.size()), first);
  EXPECT_EQ(std::vector<std::string>(keys.end() - 3, keys.end()),
            (std::vector<std::string>{"ln_f.weight", "ln_f.bias", "lm_head.weight"}));
  // wte + wpe + 4 blocks (four d x d linears with bias, two LayerNorms, d -> 4d and 4d -> d with bias)
  // + ln_f + lm_head
  const int64_t block = 4 * (256 * 256 + 256) + 4 * 256 + (256 * 1024 + 1024) + (1024 * 256 + 256);
  EXPECT_EQ(zoo::parameter_count(*lm), 1024 * 256 + 256 * 256 + 4 * block + 2 * 256 + 1024 * 256);
  EXPECT_EQ(zoo::parameter_count(*lm), 3749376);
}

// ---- static int8 ---------------------------------------------------------------------------------

// The golden model, prepared on a prompt (default onednn mapping), calibrated by generating from
// prompts of several lengths (so the prompt call with its row loop and the one-token calls at every
// cache length are seen), and converted.
std::shared_ptr<DecoderLM> make_int8_model() {
  auto lm = golden_model();
  const int64_t vocab = lm->config().vocab_size;
  const auto calibration = random_prompts({6, 2, 11, 4, 9, 1, 7, 13}, vocab, /*seed=*/77);
  dbrq::prepare(
      *lm, [&] { (*lm)(ids_tensor(calibration[0])); }, dbrq::default_qconfig_mapping("onednn"));
  for (const auto& p : calibration) lm->generate(p, 24);
  dbrq::convert(*lm);
  return lm;
}

// One converted model for the int8 tests (calibration is the slow part). Converted calls change
// nothing in it but the count of uncalibrated ops, which every test expects to stay 0.
std::shared_ptr<DecoderLM> int8_model() {
  static const std::shared_ptr<DecoderLM>* model = new std::shared_ptr<DecoderLM>(make_int8_model());
  return *model;
}

TEST(DecoderLMInt8, PerTokenLogitsAgainstTheFp32Twin) {
  auto lm = int8_model();
  for (int p = 0; p < kNumPrompts; ++p) {
    SCOPED_TRACE("prompt " + std::to_string(p));
    const std::vector<int64_t> prompt = golden_ids("prompt" + std::to_string(p));
    const std::vector<int64_t> tokens = golden_ids("tokens" + std::to_string(p));
    const Tensor reference = golden_tensor("step_logits" + std::to_string(p));
    const Tensor logits = teacher_forced_logits(*lm, prompt, tokens);
    ASSERT_EQ(logits.shape_string(), reference.shape_string());
    const double overall = dbrq::sqnr_db(reference, logits);
    EXPECT_GE(overall, kMinInt8Sqnr);
    double worst = INFINITY;
    for (int64_t i = 0; i < reference.size(0); ++i) {
      const double sqnr = dbrq::sqnr_db(reference.narrow(0, i, 1), logits.narrow(0, i, 1));
      worst = std::min(worst, sqnr);
      EXPECT_GE(sqnr, kMinInt8TokenSqnr) << "token " << i << " (cache length " << prompt.size() + i - 1 << ")";
    }
    std::cout << "[ int8     ] decoder_lm prompt " << p << ": " << reference.size(0) << " tokens, logits SQNR overall "
              << overall << " dB, worst token " << worst << " dB\n";
  }
  // Every op of these calls ran on a calibrated path.
  EXPECT_EQ(dbrq::uncalibrated_ops(*lm), 0);
}

TEST(DecoderLMInt8, EveryLinearAndAttentionMatmulRunsInt8) {
  auto lm = int8_model();
  const zoo::DecoderConfig& c = lm->config();
  std::map<std::string, int> int8_linears;  // by layer fqn
  int int8_matmuls = 0, fp32_quantizeable = 0;
  for (const dbrq::QuantizedOpInfo& op : dbrq::quantized_ops(*lm)) {
    const bool int8 = op.executor.rfind("int8", 0) == 0 || op.executor.rfind("fused into", 0) == 0;
    if (op.kind == dbrq::OpKind::kLinear && int8) int8_linears[op.fqn]++;
    if (op.kind == dbrq::OpKind::kMatmul && int8) int8_matmuls++;
    if (op.role != "fp32" && !int8) {
      fp32_quantizeable++;
      ADD_FAILURE() << op.module << " #" << op.index << " " << op.op << " (" << op.fqn << "): " << op.executor;
    }
  }
  EXPECT_EQ(static_cast<int64_t>(int8_linears.size()), 6 * c.num_layers + 1);  // q k v out fc_in fc_out, lm_head
  EXPECT_GE(int8_matmuls, 2 * c.num_layers);  // scores and context of every layer (each path has its records)
  EXPECT_EQ(fp32_quantizeable, 0);
}

TEST(DecoderLMInt8, GeneratesAValidSequenceAndStaysOnCalibratedPaths) {
  auto lm = int8_model();
  const int64_t vocab = lm->config().vocab_size;
  const std::vector<int64_t> prompt = golden_ids("prompt0");
  const std::vector<int64_t> fp32_tokens = golden_ids("tokens0");
  const Generation g = lm->generate(prompt, static_cast<int64_t>(fp32_tokens.size()), -1, /*keep_logits=*/true);
  ASSERT_EQ(g.tokens.size(), fp32_tokens.size());
  for (int64_t t : g.tokens) EXPECT_TRUE(t >= 0 && t < vocab) << t;
  EXPECT_EQ(g.logits.size(0), static_cast<int64_t>(g.tokens.size()));
  for (float v : g.logits.to_vector<float>()) ASSERT_TRUE(std::isfinite(v));
  // Greedy int8 follows fp32 at least until the first step whose top two fp32 logits are close; the
  // first token comes from the prompt call alone.
  EXPECT_EQ(g.tokens[0], fp32_tokens[0]);
  size_t agree = 0;
  while (agree < g.tokens.size() && g.tokens[agree] == fp32_tokens[agree]) ++agree;
  std::cout << "[ int8     ] decoder_lm greedy int8 follows fp32 for " << agree << " of " << g.tokens.size()
            << " tokens\n";
  // A prompt of one token and a long one: both paths were calibrated (lengths 1 and 13).
  lm->generate({5}, 10);
  lm->generate(random_prompts({30}, vocab, 5)[0], 30);
  EXPECT_EQ(dbrq::uncalibrated_ops(*lm), 0);
  // The stop token still ends it.
  const Generation stopped = lm->generate(prompt, 20, g.tokens[2]);
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.tokens.back(), g.tokens[2]);
}

// ---- bad inputs -----------------------------------------------------------------------------------

// Each bad input throws the stated error on the fp32 model and on the converted one, and leaves the
// model usable: the same generation afterwards.
void expect_bad_inputs_rejected(DecoderLM& lm, const std::string& what) {
  SCOPED_TRACE(what);
  const zoo::DecoderConfig& c = lm.config();
  const std::vector<int64_t> prompt = golden_ids("prompt0");
  const Generation before = lm.generate(prompt, 6);

  // generate(): checked before anything runs.
  EXPECT_THROW_MSG(lm.generate({}, 4), dbrq::ValueError, "DecoderLM::generate: the prompt is empty");
  EXPECT_THROW_MSG(lm.generate(std::vector<int64_t>(c.max_positions + 1, 1), 1), dbrq::ValueError,
                   "prompt (65 tokens) + max_new_tokens (1) exceed max_positions 64");
  EXPECT_THROW_MSG(lm.generate(std::vector<int64_t>(60, 1), 5), dbrq::ValueError,
                   "prompt (60 tokens) + max_new_tokens (5) exceed max_positions 64");
  EXPECT_THROW_MSG(lm.generate({1, 2, 128}, 4), dbrq::IndexError,
                   "prompt token 128 at position 2 is outside the vocabulary [0, 128)");
  EXPECT_THROW_MSG(lm.generate({1, -3}, 4), dbrq::IndexError,
                   "prompt token -3 at position 1 is outside the vocabulary [0, 128)");
  EXPECT_THROW_MSG(lm.generate({1, 2}, -1), dbrq::ValueError, "max_new_tokens must be >= 0, got -1");
  EXPECT_THROW_MSG(lm.generate({1, 2}, 4, 128), dbrq::IndexError,
                   "stop_token 128 is neither -1 (none) nor in the vocabulary [0, 128)");

  // forward(): ids and cache.
  EXPECT_THROW_MSG(lm(dbrq::zeros({1, 0}, dbrq::DType::kS64)), dbrq::ValueError,
                   "input_ids must hold at least one token per sequence, got [1, 0]");
  EXPECT_THROW_MSG(lm(dbrq::zeros({1, 65}, dbrq::DType::kS64)), dbrq::ValueError,
                   "0 cached + 65 new positions exceed max_positions 64");
  EXPECT_THROW_MSG(lm(dbrq::from_vector<int64_t>({3, 200, 4}, {1, 3})), dbrq::IndexError,
                   "token id 200 at [0, 1] is outside the vocabulary [0, 128)");
  EXPECT_THROW_MSG(lm(dbrq::zeros({1, 4})), dbrq::DTypeError, "input_ids must be s64 token ids, got f32");
  EXPECT_THROW_MSG(lm(dbrq::zeros({4}, dbrq::DType::kS64)), dbrq::ShapeError,
                   "input_ids must be [batch, seq], got [4]");
  EXPECT_THROW_MSG(lm(Tensor()), dbrq::ValueError, "input_ids is undefined");
  DecoderOutput out = lm(ids_tensor(std::vector<int64_t>(40, 2)));
  EXPECT_THROW_MSG(lm(ids_tensor(std::vector<int64_t>(25, 2)), out.cache), dbrq::ValueError,
                   "40 cached + 25 new positions exceed max_positions 64");
  EXPECT_THROW_MSG(lm(dbrq::zeros({2, 1}, dbrq::DType::kS64), out.cache), dbrq::ShapeError,
                   "cache layer 0 must hold keys and values of [2, 2, 40, 32] (batch, heads, cached, head_dim), got "
                   "[1, 2, 40, 32]");
  zoo::KVCache short_cache = out.cache;
  short_cache.layers.pop_back();
  EXPECT_THROW_MSG(lm(ids_tensor({1}), short_cache), dbrq::ValueError, "the cache has 1 layers, the model 2");
  zoo::KVCache holey = out.cache;
  holey.layers[1].value = Tensor();
  EXPECT_THROW_MSG(lm(ids_tensor({1}), holey), dbrq::ShapeError, "cache layer 1 must hold keys and values");

  EXPECT_EQ(lm.generate(prompt, 6).tokens, before.tokens);  // still usable, same result
}

TEST(DecoderLMErrors, BadInputsFp32) {
  auto lm = golden_model();
  expect_bad_inputs_rejected(*lm, "fp32");
}

TEST(DecoderLMErrors, BadInputsInt8) {
  auto lm = int8_model();
  expect_bad_inputs_rejected(*lm, "int8");
  EXPECT_EQ(dbrq::uncalibrated_ops(*lm), 0);
}

TEST(DecoderLMErrors, BadConfiguration) {
  zoo::DecoderConfig c = zoo::decoder_lm_config(zoo::Variant::kTiny);
  c.num_heads = 3;
  EXPECT_THROW_MSG(DecoderLM{c}, dbrq::ValueError, "num_heads (3) must be >= 1 and divide d_model (64)");
  c = zoo::decoder_lm_config(zoo::Variant::kTiny);
  c.max_positions = 0;
  EXPECT_THROW_MSG(DecoderLM{c}, dbrq::ValueError, "DecoderLM: sizes must be positive");
}

}  // namespace
