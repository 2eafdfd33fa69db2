// A converted model's outputs are dequantized for the caller, and the calling thread keeps their u8
// codes (tracer::dequantize_returned_output): an output passed back into the next call unchanged
// (the decoder's key / value cache) is not quantized again, its codes are reused. These tests check
// that this is exact (the codes are what quantizing the f32 output gives, for every code, zero point
// and a wide range of scales), that it is used by greedy decoding and gives bit-identical results to
// a cache that is copied before every call (which never reuses codes), and that it never serves a
// stale or different tensor: written in place, a view of it, other parameters, or codes written in
// place. Codes that only the returned output holds are dequantized when that output is first read
// (kernels::dequantize_lazy): a cache handed back unread is never dequantized.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dbrq.h"
#include "kernels/int8.h"
#include "samples/zoo/zoo.h"
#include "tracer/executors.h"

namespace {

using dbrq::DType;
using dbrq::MemoryFormat;
using dbrq::QuantParams;
using dbrq::Tensor;
using dbrq::tracer::dequantize_returned_output;
using dbrq::tracer::forget_returned_outputs;
using dbrq::tracer::InputSpec;
using dbrq::tracer::prepare_input;
using dbrq::tracer::returned_output_stats;

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return ac.dtype() == bc.dtype() && ac.sizes() == bc.sizes() &&
         std::memcmp(ac.data_ptr(), bc.data_ptr(), static_cast<size_t>(ac.numel()) * dbrq::dtype_size(ac.dtype())) == 0;
}

// Every u8 code, dequantized and quantized again with the same parameters, comes back unchanged:
// what makes reusing the codes exact. Scales from 1e-7 to 1e4 (log-uniform), every zero point.
TEST(ReturnedCodes, QuantizingADequantizedTensorGivesItsCodesBack) {
  std::vector<uint8_t> codes(256 * 3);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i % 256);
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> log_scale(std::log(1e-7), std::log(1e4));
  for (int trial = 0; trial < 2000; ++trial) {
    const float scale = static_cast<float>(std::exp(log_scale(gen)));
    const int32_t zp = trial % 256;
    auto qp = QuantParams::per_tensor(scale, zp);
    Tensor q = dbrq::from_vector(codes, {static_cast<int64_t>(codes.size())}).with_qparams(qp);
    const Tensor again = dbrq::kernels::quantize_to(dbrq::dequantize(q), qp, DType::kU8, MemoryFormat::kPreserve);
    ASSERT_TRUE(same_bytes(q, again)) << "scale " << scale << " zero point " << zp;
  }
}

class ReturnedCodesPrepare : public ::testing::Test {
 protected:
  void SetUp() override {
    forget_returned_outputs();
    qp_ = QuantParams::per_tensor(0.05f, 100);
    std::vector<float> v(2 * 3 * 40);
    std::mt19937 gen(7);
    std::normal_distribution<float> d(0.f, 2.f);
    for (float& x : v) x = d(gen);
    codes_ = dbrq::kernels::quantize_to(dbrq::from_vector(v, {2, 3, 40}), qp_, DType::kU8, MemoryFormat::kPreserve);
  }
  void TearDown() override { forget_returned_outputs(); }
  InputSpec spec(dbrq::QuantParamsPtr qp = nullptr) const { return InputSpec{qp ? qp : qp_, MemoryFormat::kPreserve}; }
  // What prepare_input gives without kept codes: quantizing the f32 tensor.
  Tensor fresh(const Tensor& f, const dbrq::QuantParamsPtr& qp) const {
    return dbrq::kernels::quantize_to(f, qp, DType::kU8, MemoryFormat::kPreserve);
  }

  dbrq::QuantParamsPtr qp_;
  Tensor codes_;
};

TEST_F(ReturnedCodesPrepare, TheReturnedTensorGetsItsCodes) {
  const Tensor f = dequantize_returned_output(codes_);
  EXPECT_EQ(f.dtype(), DType::kF32);
  EXPECT_TRUE(same_bytes(f, dbrq::dequantize(codes_)));
  const Tensor p = prepare_input(f, spec());
  EXPECT_EQ(p.data_ptr(), codes_.data_ptr());  // the kept codes, not a new quantization
  EXPECT_EQ(p.qparams_ptr(), qp_);
  EXPECT_TRUE(same_bytes(p, fresh(f, qp_)));
  EXPECT_EQ(returned_output_stats().reused, 1u);
  // Equal parameters in another object: the codes too, carrying the spec's parameters.
  auto equal = QuantParams::per_tensor(0.05f, 100);
  EXPECT_EQ(prepare_input(f, spec(equal)).qparams_ptr(), equal);
  EXPECT_EQ(returned_output_stats().reused, 2u);
}

// A large output: the same values as dequantize(), and its codes come back.
TEST_F(ReturnedCodesPrepare, LargeOutputsDequantizeAsDequantizeDoes) {
  std::vector<uint8_t> codes(3 * 40001);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 7919) % 256);
  const Tensor q = dbrq::from_vector(codes, {3, 40001}).with_qparams(QuantParams::per_tensor(0.0123f, 77));
  const Tensor f = dequantize_returned_output(q);
  EXPECT_TRUE(same_bytes(f, dbrq::dequantize(q)));
  EXPECT_EQ(prepare_input(f, InputSpec{q.qparams_ptr(), MemoryFormat::kPreserve}).data_ptr(), q.data_ptr());
}

TEST_F(ReturnedCodesPrepare, OtherParametersQuantizeAfresh) {
  const Tensor f = dequantize_returned_output(codes_);
  auto other = QuantParams::per_tensor(0.04f, 100);
  const Tensor p = prepare_input(f, spec(other));
  EXPECT_NE(p.data_ptr(), codes_.data_ptr());
  EXPECT_TRUE(same_bytes(p, fresh(f, other)));
  EXPECT_EQ(returned_output_stats().reused, 0u);
}

TEST_F(ReturnedCodesPrepare, AWriteToTheOutputIsSeen) {
  Tensor f = dequantize_returned_output(codes_);
  f.mul_(3.0);  // in place: the codes no longer describe it
  const Tensor p = prepare_input(f, spec());
  EXPECT_TRUE(same_bytes(p, fresh(f, qp_)));
  EXPECT_FALSE(same_bytes(p, codes_));
  EXPECT_EQ(returned_output_stats().reused, 0u);
}

TEST_F(ReturnedCodesPrepare, AWriteThroughAViewIsSeen) {
  Tensor f = dequantize_returned_output(codes_);
  Tensor row = f.select(0, 1);
  row.fill_(-1.0);
  const Tensor p = prepare_input(f, spec());
  EXPECT_TRUE(same_bytes(p, fresh(f, qp_)));
  EXPECT_EQ(returned_output_stats().reused, 0u);
}

TEST_F(ReturnedCodesPrepare, ViewsOfTheOutputQuantizeAfresh) {
  const Tensor f = dequantize_returned_output(codes_);
  for (const Tensor& v : {f.narrow(2, 1, 30), f.select(0, 1), f.transpose(1, 2), f.reshape({6, 40})}) {
    const Tensor p = prepare_input(v, spec());
    EXPECT_TRUE(same_bytes(p, fresh(v, qp_))) << v.shape_string();
  }
  EXPECT_EQ(returned_output_stats().reused, 0u);
}

// Codes that only the returned slot holds: the f32 output is filled when first read, not at the
// return, and handing it back to the model reuses the codes without reading it.
TEST_F(ReturnedCodesPrepare, UnsharedCodesAreDequantizedWhenFirstRead) {
  Tensor q = dbrq::kernels::quantize_to(dbrq::dequantize(codes_), qp_, DType::kU8, MemoryFormat::kPreserve);
  ASSERT_EQ(q.storage().use_count(), 1);
  const Tensor want = dbrq::dequantize(q);
  const void* code_bytes = q.data_ptr();
  const Tensor f = dequantize_returned_output(std::move(q));  // as the model's return does
  EXPECT_FALSE(f.storage()->materialized());
  EXPECT_EQ(prepare_input(f, spec()).data_ptr(), code_bytes);
  EXPECT_FALSE(f.storage()->materialized());
  EXPECT_TRUE(same_bytes(f, want));
  EXPECT_TRUE(f.storage()->materialized());
}

TEST_F(ReturnedCodesPrepare, CodesWrittenInPlaceAreNotReused) {
  const Tensor f = dequantize_returned_output(codes_);
  // The caller keeps the codes (a copy went in): dequantized at the return, so the write below
  // cannot reach f.
  EXPECT_TRUE(f.storage()->materialized());
  Tensor codes = codes_;
  std::memset(codes.mutable_data_ptr(), 7, static_cast<size_t>(codes.numel()));  // bumps the codes' version
  const Tensor p = prepare_input(f, spec());
  EXPECT_TRUE(same_bytes(p, fresh(f, qp_)));
  EXPECT_EQ(returned_output_stats().reused, 0u);
}

TEST_F(ReturnedCodesPrepare, AnotherThreadQuantizes) {
  const Tensor f = dequantize_returned_output(codes_);
  Tensor p;
  uint64_t reused = 99;
  std::thread t([&] {
    p = prepare_input(f, spec());
    reused = returned_output_stats().reused;
  });
  t.join();
  EXPECT_EQ(reused, 0u);
  EXPECT_TRUE(same_bytes(p, codes_));  // the same values all the same
}

TEST_F(ReturnedCodesPrepare, ACopyOfTheOutputQuantizesAfresh) {
  const Tensor f = dequantize_returned_output(codes_);
  const Tensor c = f.clone();
  const Tensor p = prepare_input(c, spec());
  EXPECT_NE(p.data_ptr(), codes_.data_ptr());
  EXPECT_TRUE(same_bytes(p, codes_));
  EXPECT_EQ(returned_output_stats().reused, 0u);
}

// ---- greedy decoding -----------------------------------------------------------------------------

Tensor ids(const std::vector<int64_t>& v) { return dbrq::from_vector(v, {1, static_cast<int64_t>(v.size())}); }

std::shared_ptr<zoo::DecoderLM> int8_decoder() {
  static const auto* model = new std::shared_ptr<zoo::DecoderLM>([] {
    auto lm = std::make_shared<zoo::DecoderLM>(zoo::decoder_lm_config(zoo::Variant::kTiny));
    lm->eval();
    dbrq::prepare(*lm, [&] { (*lm)(ids({3, 9, 4, 1})); }, dbrq::default_qconfig_mapping("onednn"));
    lm->generate({3, 9, 4, 1}, 12);
    lm->generate({7, 2}, 12);
    lm->generate({5, 5, 8, 30, 11, 6}, 12);
    dbrq::convert(*lm);
    return lm;
  }());
  return *model;
}

// generate() reads the last position's logits in place when they are f32 and copies them out as
// real values when they are u8 (ConvertOptions::int8_outputs): both give the tokens and logits of
// stepping by hand.
void expect_generate_matches_hand_steps(zoo::DecoderLM& lm) {
  const std::vector<int64_t> prompt = {4, 8, 15, 16, 23};
  const zoo::Generation g = lm.generate(prompt, 6, -1, /*keep_logits=*/true);
  ASSERT_EQ(g.tokens.size(), 6u);
  zoo::DecoderOutput o = lm(ids(prompt));
  const int64_t vocab = lm.config().vocab_size;
  for (size_t i = 0; i < g.tokens.size(); ++i) {
    const std::vector<float> row = o.logits.select(1, o.logits.size(1) - 1).to_vector<float>();
    const std::vector<float> kept = g.logits.select(0, static_cast<int64_t>(i)).to_vector<float>();
    ASSERT_EQ(row.size(), static_cast<size_t>(vocab));
    EXPECT_EQ(0, std::memcmp(row.data(), kept.data(), row.size() * sizeof(float))) << "token " << i;
    const int64_t best = std::max_element(row.begin(), row.end()) - row.begin();
    EXPECT_EQ(g.tokens[i], best) << "token " << i;
    o = lm(ids({g.tokens[i]}), o.cache);
  }
}

TEST(ReturnedCodesDecoder, GenerateReadsF32AndInt8Logits) {
  auto lm = int8_decoder();
  expect_generate_matches_hand_steps(*lm);
  auto lm8 = std::make_shared<zoo::DecoderLM>(zoo::decoder_lm_config(zoo::Variant::kTiny));
  lm8->eval();
  dbrq::prepare(*lm8, [&] { (*lm8)(ids({3, 9, 4, 1})); }, dbrq::default_qconfig_mapping("onednn"));
  lm8->generate({3, 9, 4, 1}, 8);
  lm8->generate({7, 2, 5}, 8);
  dbrq::ConvertOptions options;
  options.int8_outputs = true;
  dbrq::convert(*lm8, options);
  ASSERT_TRUE((*lm8)(ids({1, 2})).logits.is_quantized());
  expect_generate_matches_hand_steps(*lm8);
}

zoo::KVCache copied(const zoo::KVCache& c) {
  zoo::KVCache out;
  for (const zoo::LayerKV& l : c.layers) out.layers.push_back({l.key.clone(), l.value.clone()});
  return out;
}

// Steps through the cache as generate() does, feeding the given tokens; `copy` clones the cache
// before every call (so no call can reuse codes), `scale_layer0_key` multiplies layer 0's returned
// keys in place by 0.5 after every call (a caller editing the cache).
std::vector<Tensor> steps(zoo::DecoderLM& lm, bool copy, bool scale_layer0_key) {
  std::vector<Tensor> out;
  zoo::DecoderOutput o = lm(ids({4, 8, 15, 16, 23}));
  out.push_back(o.logits);
  for (int64_t t : {42, 7, 1, 19, 3, 28, 11}) {
    if (scale_layer0_key) o.cache.layers[0].key.mul_(0.5);
    o = lm(ids({t}), copy ? copied(o.cache) : o.cache);
    out.push_back(o.logits);
    for (const zoo::LayerKV& l : o.cache.layers) {
      out.push_back(l.key);
      out.push_back(l.value);
    }
  }
  return out;
}

TEST(ReturnedCodesDecoder, GreedyStepsReuseTheCacheCodesBitIdentically) {
  auto lm = int8_decoder();
  forget_returned_outputs();
  const std::vector<Tensor> reference = steps(*lm, /*copy=*/true, false);
  EXPECT_EQ(returned_output_stats().reused, 0u);
  const std::vector<Tensor> reused = steps(*lm, /*copy=*/false, false);
  // Every step after the first reads the previous one's keys and values of every layer as they
  // came back (the step after the prompt call too, when the records share parameters).
  const int64_t layers = lm->config().num_layers;
  EXPECT_GE(returned_output_stats().reused, static_cast<uint64_t>(2 * layers * 6));
  ASSERT_EQ(reference.size(), reused.size());
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_TRUE(same_bytes(reference[i], reused[i])) << "tensor " << i;
  EXPECT_EQ(dbrq::uncalibrated_ops(*lm), 0);
  forget_returned_outputs();
}

// Greedy steps that never read the cache: no step's returned keys and values are ever
// dequantized (each was handed back, its codes reused), while the logits read by the caller are.
TEST(ReturnedCodesDecoder, ACacheHandedBackUnreadIsNeverDequantized) {
  auto lm = int8_decoder();
  forget_returned_outputs();
  zoo::DecoderOutput o = (*lm)(ids({4, 8, 15, 16, 23}));
  std::vector<Tensor> handed_back;
  for (int64_t t : {42, 7, 1, 19}) {
    for (const zoo::LayerKV& l : o.cache.layers) {
      handed_back.push_back(l.key);
      handed_back.push_back(l.value);
    }
    o = (*lm)(ids({t}), o.cache);
    EXPECT_EQ(o.logits.to_vector<float>().size(), static_cast<size_t>(o.logits.numel()));
    EXPECT_TRUE(o.logits.storage()->materialized());
  }
  ASSERT_EQ(handed_back.size(), static_cast<size_t>(4 * 2 * lm->config().num_layers));
  // The prompt call's cache comes from other records than the one-token steps' (their parameters
  // may differ, and then the first step quantizes it afresh, reading it); every later step's cache
  // is handed back as it came.
  const size_t per_step = static_cast<size_t>(2 * lm->config().num_layers);
  for (size_t i = 0; i < handed_back.size(); ++i) {
    EXPECT_EQ(handed_back[i].dtype(), DType::kF32);
    if (i >= per_step) EXPECT_FALSE(handed_back[i].storage()->materialized()) << "cache tensor " << i;
  }
  // Read now, they hold their codes' values (GreedyStepsReuseTheCacheCodesBitIdentically compares
  // them with a run that never reuses codes).
  for (const Tensor& c : handed_back) EXPECT_TRUE(std::isfinite(c.to_vector<float>()[0]));
  EXPECT_GE(returned_output_stats().reused, handed_back.size() - 2 * lm->config().num_layers);
  forget_returned_outputs();
}

TEST(ReturnedCodesDecoder, AnEditedCacheIsQuantizedAsEdited) {
  auto lm = int8_decoder();
  forget_returned_outputs();
  const std::vector<Tensor> reference = steps(*lm, /*copy=*/true, /*scale_layer0_key=*/true);
  const std::vector<Tensor> edited = steps(*lm, /*copy=*/false, /*scale_layer0_key=*/true);
  ASSERT_EQ(reference.size(), edited.size());
  for (size_t i = 0; i < reference.size(); ++i) EXPECT_TRUE(same_bytes(reference[i], edited[i])) << "tensor " << i;
  // The edit matters (else this test could not fail): unedited steps differ.
  const std::vector<Tensor> plain = steps(*lm, /*copy=*/true, false);
  bool differs = false;
  for (size_t i = 0; i < plain.size(); ++i) differs = differs || !same_bytes(plain[i], edited[i]);
  EXPECT_TRUE(differs);
  forget_returned_outputs();
}

}  // namespace
