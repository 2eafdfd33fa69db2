// nn::LSTM and nn::GRU against PyTorch 1.13 (tests/rnn/golden, make_rnn_goldens.py): one and two
// layers, batch_first both ways, bidirectional, without biases, unbatched input, with and without
// initial states, per-sequence lengths (PyTorch's packed sequences); weights loaded from PyTorch's
// state dict under its own names. Also names, printing, dropout between layers and the layers'
// independence from the batch.
#include <gtest/gtest.h>

#include <iostream>

#include "dbrq.h"
#include "tests/rnn/rnn_cases.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using testing::RnnCase;

// max|dbrq - ref| / max|ref|: the reference is float64 PyTorch on the same f32 values; dbrq's f32
// (oneDNN's summation order) stays within ~1e-6 of it over these short recurrences.
constexpr double kTolerance = 1e-5;

class RnnGolden : public ::testing::TestWithParam<RnnCase> {};

TEST_P(RnnGolden, MatchesPyTorch) {
  const RnnCase& c = GetParam();
  const testing::RnnGolden g = testing::load_rnn_golden(c.name);
  auto m = testing::make_rnn(c, g);
  // PyTorch's state_dict order, key for key.
  std::vector<std::string> keys, golden_keys;
  for (const auto& [k, t] : m->state_dict()) keys.push_back(k);
  for (const auto& [k, t] : g.state_dict) golden_keys.push_back(k);
  EXPECT_EQ(keys, golden_keys);

  const std::vector<Tensor> out = testing::run_rnn(*m, g);
  testing::expect_close(out[0], g.at("output"), kTolerance, c.name + " output");
  testing::expect_close(out[1], g.at("h_n"), kTolerance, c.name + " h_n");
  if (c.lstm) testing::expect_close(out[2], g.at("c_n"), kTolerance, c.name + " c_n");
  std::cout << "[ golden   ] " << c.name << ": output " << out[0].shape_string() << ", max relative error "
            << testing::relative_error(out[0], g.at("output")) << "\n";
}

INSTANTIATE_TEST_SUITE_P(Cases, RnnGolden, ::testing::ValuesIn(testing::rnn_cases()),
                         [](const ::testing::TestParamInfo<RnnCase>& info) { return info.param.name; });

TEST(Rnn, ParameterNamesAndShapesArePyTorchs) {
  nn::LSTMImpl lstm(nn::LSTMOptions(3, 4).num_layers(2).bidirectional(true));
  std::vector<std::string> names;
  for (const auto& [k, t] : lstm.state_dict()) names.push_back(k + " " + t.shape_string());
  EXPECT_EQ(names, (std::vector<std::string>{
                       "weight_ih_l0 [16, 3]", "weight_hh_l0 [16, 4]", "bias_ih_l0 [16]", "bias_hh_l0 [16]",
                       "weight_ih_l0_reverse [16, 3]", "weight_hh_l0_reverse [16, 4]", "bias_ih_l0_reverse [16]",
                       "bias_hh_l0_reverse [16]", "weight_ih_l1 [16, 8]", "weight_hh_l1 [16, 4]", "bias_ih_l1 [16]",
                       "bias_hh_l1 [16]", "weight_ih_l1_reverse [16, 8]", "weight_hh_l1_reverse [16, 4]",
                       "bias_ih_l1_reverse [16]", "bias_hh_l1_reverse [16]"}));
  nn::GRUImpl gru(nn::GRUOptions(3, 4).bias(false));
  names.clear();
  for (const auto& [k, t] : gru.state_dict()) names.push_back(k + " " + t.shape_string());
  EXPECT_EQ(names, (std::vector<std::string>{"weight_ih_l0 [12, 3]", "weight_hh_l0 [12, 4]"}));
  // The typed accessor sees the registered tensors (which load_state_dict fills in place).
  EXPECT_EQ(lstm.weights(1, 1).weight_ih.storage(), lstm.state_dict()[12].second.storage());
  EXPECT_FALSE(gru.weights(0).bias_ih.defined());
  EXPECT_THROW_MSG(lstm.weights(2, 0), IndexError, "LSTM::weights(2, 0): out of range for 2 layer(s)");
}

TEST(Rnn, DefaultInitializationIsPyTorchs) {
  // U(-1/sqrt(hidden), 1/sqrt(hidden)) for every tensor.
  manual_seed(5);
  nn::GRUImpl gru(nn::GRUOptions(10, 25).num_layers(2));
  for (const auto& [k, t] : gru.state_dict()) {
    const std::vector<float> v = t.to_vector<float>();
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    EXPECT_GE(*lo, -0.2f) << k;
    EXPECT_LE(*hi, 0.2f) << k;
    EXPECT_LT(*lo, -0.15f) << k;  // spread over the range, not a constant
    EXPECT_GT(*hi, 0.15f) << k;
  }
}

TEST(Rnn, PrintsLikePyTorch) {
  nn::LSTMImpl lstm(nn::LSTMOptions(8, 16).num_layers(2).batch_first(true).bidirectional(true));
  EXPECT_EQ(lstm.to_string(), "LSTM(8, 16, num_layers=2, batch_first=True, bidirectional=True)");
  nn::GRUImpl gru(nn::GRUOptions(4, 6).bias(false).dropout(0.25));
  EXPECT_EQ(gru.to_string(), "GRU(4, 6, bias=False, dropout=0.25)");
}

// Lengths all equal to T compute what no lengths compute; a sequence's results do not depend on
// the other sequences of the batch (or on the padding after its end).
TEST(Rnn, SequencesAreIndependentOfTheBatch) {
  manual_seed(9);
  nn::GRUImpl gru(nn::GRUOptions(5, 7).num_layers(2).bidirectional(true).batch_first(true));
  gru.eval();
  const Tensor x = randn({3, 6, 5}, 1);
  auto [out, h] = gru(x);
  auto [out_l, h_l] = gru(x, Tensor(), std::vector<int64_t>{6, 6, 6});
  testing::expect_equal(out_l, out, "lengths all T");
  testing::expect_equal(h_l, h, "lengths all T");
  // Sequence 1 alone, cut at its length 4, vs inside a batch with padding garbage after step 4.
  auto [out_b, h_b] = gru(x, Tensor(), std::vector<int64_t>{6, 4, 2});
  const Tensor x1 = x.narrow(0, 1, 1).narrow(1, 0, 4).contiguous();
  auto [out_1, h_1] = gru(x1);
  testing::expect_close(out_b.narrow(0, 1, 1).narrow(1, 0, 4), out_1, 1e-5, "sequence 1 output");
  testing::expect_close(h_b.narrow(1, 1, 1), h_1, 1e-5, "sequence 1 h_n");
  // Beyond its length its output is zero.
  for (float v : out_b.narrow(0, 1, 1).narrow(1, 4, 2).contiguous().to_vector<float>()) EXPECT_EQ(v, 0.f);
}

// Dropout between layers: only in training mode, only on the outputs of layers before the last.
TEST(Rnn, DropoutBetweenLayersOnlyWhenTraining) {
  manual_seed(11);
  nn::LSTMImpl with(nn::LSTMOptions(4, 8).num_layers(2).dropout(0.5));
  nn::LSTMImpl without(nn::LSTMOptions(4, 8).num_layers(2));
  without.load_state_dict(with.state_dict());
  const Tensor x = randn({5, 2, 4}, 3);
  with.eval();
  without.eval();
  testing::expect_equal(std::get<0>(with(x)), std::get<0>(without(x)), "eval: no dropout");
  with.train();
  const Tensor trained = std::get<0>(with(x));
  EXPECT_GT(testing::relative_error(trained, std::get<0>(without(x))), 1e-3);
  // One layer: nothing to drop between layers.
  nn::GRUImpl single(nn::GRUOptions(4, 8).dropout(0.9));
  nn::GRUImpl plain(nn::GRUOptions(4, 8));
  plain.load_state_dict(single.state_dict());
  single.train();
  testing::expect_equal(std::get<0>(single(x)), std::get<0>(plain(x)), "one layer");
}

}  // namespace
}  // namespace dbrq
