// Every bad argument of nn::LSTM and nn::GRU raises a dbrq error of the documented type whose
// message says what was wrong, with which value: options, input rank, dtype and feature size,
// empty inputs, initial states of the wrong rank or size, lengths. In a prepared or converted model
// the message also names the module, and the model stays usable after the error.
#include <gtest/gtest.h>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using GRU = nn::GRUImpl;
using nn::GRUOptions;
using LSTM = nn::LSTMImpl;
using nn::LSTMOptions;

TEST(RnnErrors, BadOptions) {
  EXPECT_THROW_MSG(GRU(GRUOptions(0, 4)), ValueError, "GRU: input_size must be >= 1, got 0");
  EXPECT_THROW_MSG(LSTM(LSTMOptions(3, 0)), ValueError, "LSTM: hidden_size must be >= 1, got 0");
  EXPECT_THROW_MSG(LSTM(LSTMOptions(3, -2)), ValueError, "LSTM: hidden_size must be >= 1, got -2");
  EXPECT_THROW_MSG(GRU(GRUOptions(3, 4).num_layers(0)), ValueError, "GRU: num_layers must be >= 1, got 0");
  EXPECT_THROW_MSG(LSTM(LSTMOptions(3, 4).dropout(1.5)), ValueError,
                   "LSTM: dropout must be a probability in [0, 1], got 1.5");
  EXPECT_THROW_MSG(GRU(GRUOptions(3, 4).dropout(-0.1)), ValueError,
                   "GRU: dropout must be a probability in [0, 1], got -0.1");
}

TEST(RnnErrors, BadInput) {
  GRU gru(GRUOptions(3, 4).num_layers(2));
  EXPECT_THROW_MSG(gru(Tensor()), ValueError, "GRU: input is undefined");
  EXPECT_THROW_MSG(gru(randn({2, 3, 1, 3}, 1)), ShapeError,
                   "GRU: expected input to be 2-D (unbatched: [T, input_size]) or 3-D (batched), got a 4-D tensor "
                   "[2, 3, 1, 3]");
  EXPECT_THROW_MSG(gru(randn({3}, 1)), ShapeError, "got a 1-D tensor [3]");
  EXPECT_THROW_MSG(gru(randn({5, 2, 7}, 1)), ShapeError,
                   "GRU: input.size(-1) must be equal to input_size. Expected 3, got 7 (input [5, 2, 7])");
  EXPECT_THROW_MSG(gru(zeros({5, 2, 3}, DType::kS64)), DTypeError, "GRU: input must have dtype f32, got s64");
  EXPECT_THROW_MSG(gru(zeros({0, 2, 3})), ShapeError,
                   "GRU: input [0, 2, 3] has no time steps or no sequences (sequence length 0, batch 2)");
  LSTM lstm(LSTMOptions(3, 4).batch_first(true));
  EXPECT_THROW_MSG(lstm(zeros({0, 5, 3})), ShapeError, "(sequence length 5, batch 0)");
  EXPECT_THROW_MSG(lstm(randn({2, 5, 4}, 1)), ShapeError,
                   "LSTM: input.size(-1) must be equal to input_size. Expected 3");
}

TEST(RnnErrors, BadInitialState) {
  GRU gru(GRUOptions(3, 4).num_layers(2).bidirectional(true));
  const Tensor x = randn({5, 2, 3}, 1);
  EXPECT_THROW_MSG(
      gru(x, zeros({2, 2, 4})), ShapeError,
      "GRU: expected hx of size [4, 2, 4] (num_layers * num_directions, batch, hidden_size), got [2, 2, 4]");
  EXPECT_THROW_MSG(gru(x, zeros({4, 3, 4})), ShapeError, "expected hx of size [4, 2, 4]");
  EXPECT_THROW_MSG(gru(x, zeros({4, 2, 5})), ShapeError, "got [4, 2, 5]");
  EXPECT_THROW_MSG(gru(x, zeros({4, 4})), ShapeError,
                   "GRU: for batched 3-D input, hx should also be 3-D but got a 2-D tensor [4, 4]");
  EXPECT_THROW_MSG(gru(randn({5, 3}, 1), zeros({4, 1, 4})), ShapeError,
                   "GRU: for unbatched 2-D input, hx should also be 2-D but got a 3-D tensor [4, 1, 4]");
  EXPECT_THROW_MSG(gru(randn({5, 3}, 1), zeros({4, 5})), ShapeError,
                   "GRU: expected hx of size [4, 4] (num_layers * num_directions, hidden_size), got [4, 5]");
  EXPECT_THROW_MSG(gru(x, zeros({4, 2, 4}, DType::kS64)), DTypeError, "GRU: hx must have dtype f32, got s64");

  LSTM lstm(LSTMOptions(3, 4));
  const Tensor h = zeros({1, 2, 4});
  EXPECT_THROW_MSG(lstm(x, std::make_tuple(zeros({1, 3, 4}), h)), ShapeError,
                   "LSTM: expected hx[0] (h0) of size [1, 2, 4]");
  EXPECT_THROW_MSG(lstm(x, std::make_tuple(h, zeros({2, 2, 4}))), ShapeError,
                   "LSTM: expected hx[1] (c0) of size [1, 2, 4] (num_layers * num_directions, batch, hidden_size), got "
                   "[2, 2, 4]");
  EXPECT_THROW_MSG(lstm(x, std::make_tuple(h, Tensor())), ValueError,
                   "LSTM: hx must hold both h0 and c0 (or be absent), but hx[1] (c0) is undefined");
  EXPECT_THROW_MSG(lstm(x, std::make_tuple(Tensor(), h)), ValueError, "but hx[0] (h0) is undefined");
}

TEST(RnnErrors, BadLengths) {
  GRU gru(GRUOptions(3, 4));
  const Tensor x = randn({5, 2, 3}, 1);
  EXPECT_THROW_MSG(gru(x, Tensor(), std::vector<int64_t>{5}), ValueError,
                   "GRU: got 1 lengths for a batch of 2 sequences");
  EXPECT_THROW_MSG(gru(x, Tensor(), std::vector<int64_t>{5, 0}), ValueError,
                   "GRU: lengths[1] = 0 is out of range [1, 5] (the input's sequence length)");
  EXPECT_THROW_MSG(gru(x, Tensor(), std::vector<int64_t>{6, 1}), ValueError, "lengths[0] = 6 is out of range [1, 5]");
  EXPECT_THROW_MSG(gru(randn({5, 3}, 1), Tensor(), std::vector<int64_t>{5}), ValueError,
                   "GRU: lengths need a batched (3-D) input, got [5, 3]");
}

// Inside a prepared (then converted) model the error names the module; a failed call leaves no
// trace, and the next good call gives the same result as before.
struct Net : nn::CallableModule<Net> {
  Net() { gru = register_module("encoder", std::make_shared<GRU>(GRUOptions(3, 4))); }
  Tensor forward(const Tensor& x) { return std::get<1>((*gru)(x)); }
  std::shared_ptr<GRU> gru;
};

TEST(RnnErrors, InAPreparedModelTheModuleIsNamed) {
  manual_seed(3);
  Net net;
  net.eval();
  const Tensor x = randn({4, 2, 3}, 2);
  prepare(net, {x}, default_dynamic_qconfig_mapping());
  const Tensor before = net(x);
  EXPECT_THROW_MSG(net(randn({4, 2, 5}, 2)), ShapeError,
                   "in module \"encoder\" (GRU): GRU: input.size(-1) must be equal to input_size. Expected 3, got 5");
  testing::expect_equal(net(x), before, "after the error");
  convert(net);
  const Tensor converted = net(x);
  EXPECT_THROW_MSG(net(randn({4, 2, 2, 3}, 2)), ShapeError,
                   "in module \"encoder\" (GRU): GRU: expected input to be 2-D");
  testing::expect_equal(net(x), converted, "after the error, converted");
}

}  // namespace
}  // namespace dbrq
