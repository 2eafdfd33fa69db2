// Dynamic int8 quantization of nn::LSTM and nn::GRU (default_dynamic_qconfig_mapping, or a dynamic
// qconfig for the layer's type): every matrix product runs as oneDNN's dynamic int8 linear (the
// input quantized per call from its own range, per-channel s8 weights), the gate arithmetic stays
// fp32, as PyTorch's quantize_dynamic does for LSTM / GRU.
//
// References (tests/rnn/golden, make_rnn_goldens.py):
//   dyn_*        the same algorithm written with PyTorch's own int8 operator
//                (quantized::linear_dynamic, per-channel weights, no reduce_range): dbrq must agree
//                with it to float rounding (here within 1.2e-7, ~140 dB), apart from an
//                occasional input code that could round the other way on another CPU, which would
//                move a result by about one quantization step (~60 dB);
//   torch_dyn_*  PyTorch's quantize_dynamic(per_channel_dynamic_qconfig): it quantizes activations
//                with reduce_range (7 bits instead of 8), so it is about as far from dbrq as from
//                fp32; reported, and bounded loosely;
//   output       fp32 (float64 PyTorch): dynamic int8 must stay above 35 dB SQNR.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/rnn/rnn_cases.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using testing::RnnCase;
using testing::sqnr_of;

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  const std::vector<float> x = a.contiguous().to_vector<float>(), y = b.contiguous().to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, static_cast<double>(std::abs(x[i] - y[i])));
  return m;
}

// The converted layer's ops: every linear dynamic int8, nothing else int8.
void expect_dynamic_linears_only(const nn::Module& m, int64_t expected_linears) {
  int64_t linears = 0;
  for (const QuantizedOpInfo& op : quantized_ops(m)) {
    if (op.kind == OpKind::kLinear) {
      ++linears;
      EXPECT_TRUE(op.dynamic) << op.fqn;
      EXPECT_EQ(op.executor.rfind("dynamic int8 linear", 0), 0u) << op.executor;
      EXPECT_EQ(op.output_dtype, DType::kF32);
    } else {
      EXPECT_EQ(op.role, "fp32") << op.op << " " << op.executor;
    }
  }
  EXPECT_EQ(linears, expected_linears);
}

class RnnDynamic : public ::testing::TestWithParam<RnnCase> {};

TEST_P(RnnDynamic, MatchesPyTorchsDynamicInt8) {
  const RnnCase& c = GetParam();
  const testing::RnnGolden g = testing::load_rnn_golden(c.name);
  auto m = testing::make_rnn(c, g);
  prepare(
      *m, [&] { testing::run_rnn(*m, g); }, default_dynamic_qconfig_mapping());
  convert(*m);  // dynamic: nothing to calibrate
  const std::vector<Tensor> out = testing::run_rnn(*m, g);
  EXPECT_EQ(uncalibrated_ops(*m), 0);
  // One linear per weight: the input projection and the hidden projection of each layer and
  // direction, whatever the number of steps.
  const int64_t directions = c.options.bidirectional() ? 2 : 1;
  expect_dynamic_linears_only(*m, 2 * c.options.num_layers() * directions);

  const Tensor& fp32 = g.at("output");
  const Tensor& emulated = g.at("dyn_output");
  const double vs_emulated = max_abs_diff(out[0], emulated);
  const double sqnr_fp32 = sqnr_of(out[0], fp32);
  // Float rounding alone gives ~140 dB; one input code rounding the other way ~60 dB.
  EXPECT_GT(sqnr_of(out[0], emulated), 60.0) << "vs PyTorch's linear_dynamic, max abs diff " << vs_emulated;
  EXPECT_LT(vs_emulated, 1e-2);
  EXPECT_GT(sqnr_of(out[1], g.at("dyn_h_n")), 60.0);
  if (c.lstm) {
    EXPECT_GT(sqnr_of(out[2], g.at("dyn_c_n")), 60.0);
  }
  EXPECT_GT(sqnr_fp32, 38.0);
  std::string torch_note = "n/a (PyTorch's dynamic RNNs need biases and a batch)";
  if (g.has("torch_dyn_output")) {
    const Tensor& t = g.at("torch_dyn_output");
    EXPECT_GT(sqnr_of(out[0], t), 33.0);
    torch_note = absl::StrCat(sqnr_of(t, fp32), " dB; dbrq vs quantize_dynamic: max abs diff ", max_abs_diff(out[0], t),
                              ", SQNR ", sqnr_of(out[0], t), " dB");
  }
  std::cout << "[ dynamic  ] " << c.name << ": dbrq vs fp32 " << sqnr_fp32 << " dB; vs PyTorch linear_dynamic "
            << "emulation max abs diff " << vs_emulated << " (SQNR " << sqnr_of(out[0], emulated)
            << " dB); quantize_dynamic vs fp32 " << torch_note << "\n";
}

INSTANTIATE_TEST_SUITE_P(Cases, RnnDynamic, ::testing::ValuesIn(testing::rnn_cases()),
                         [](const ::testing::TestParamInfo<RnnCase>& info) { return info.param.name; });

// Prepared on one short, unpacked batch and converted at once: every other input (longer, packed
// and unsorted, with initial states, another batch size) runs the same dynamic int8 linears, and
// nothing falls back to fp32.
TEST(RnnDynamic, OnePreparingCallCoversEveryPath) {
  for (const char* name : {"gru_packed", "lstm_packed"}) {
    SCOPED_TRACE(name);
    const RnnCase* c = nullptr;
    for (const RnnCase& k : testing::rnn_cases()) {
      if (k.name == name) c = &k;
    }
    ASSERT_NE(c, nullptr);
    const testing::RnnGolden g = testing::load_rnn_golden(name);
    auto m = testing::make_rnn(*c, g);
    const Tensor example = randn({1, 2, c->options.input_size()}, 7);  // batch_first: B 1, T 2
    prepare(
        *m,
        [&] {
          if (c->lstm)
            (*std::dynamic_pointer_cast<nn::LSTMImpl>(m))(example);
          else
            (*std::dynamic_pointer_cast<nn::GRUImpl>(m))(example);
        },
        default_dynamic_qconfig_mapping());
    convert(*m);
    const std::vector<Tensor> out = testing::run_rnn(*m, g);
    EXPECT_EQ(uncalibrated_ops(*m), 0);
    expect_dynamic_linears_only(*m, 8);
    EXPECT_GT(sqnr_of(out[0], g.at("dyn_output")), 60.0);
  }
}

// A dynamic qconfig for the layer's type (PyTorch's quantize_dynamic({nn.GRU: ...}) idiom): its
// linears are dynamic int8; its elementwise ops have no dynamic form and stay fp32; a Linear
// outside it stays fp32.
struct Tagger : nn::CallableModule<Tagger> {
  Tagger() {
    gru = register_module("gru", std::make_shared<nn::GRUImpl>(nn::GRUOptions(6, 8).num_layers(2)));
    head = register_module("head", std::make_shared<nn::LinearImpl>(8, 3));
  }
  Tensor forward(const Tensor& x) { return (*head)(std::get<0>((*gru)(x))); }
  std::shared_ptr<nn::GRUImpl> gru;
  std::shared_ptr<nn::LinearImpl> head;
};

TEST(RnnDynamic, QConfigForTheLayerType) {
  manual_seed(21);
  Tagger m;
  m.eval();
  const Tensor x = randn({9, 2, 6}, 3);
  const Tensor ref = m(x);
  prepare(m, {randn({4, 2, 6}, 4)}, QConfigMapping().set_object_type<nn::GRUImpl>(default_dynamic_qconfig()));
  convert(m);
  const Tensor y = m(x);
  EXPECT_GT(sqnr_of(y, ref), 38.0);
  int dynamic = 0;
  for (const QuantizedOpInfo& op : quantized_ops(m)) {
    if (op.fqn == "head") {
      EXPECT_EQ(op.role, "fp32");
    } else if (op.kind == OpKind::kLinear) {
      EXPECT_TRUE(op.dynamic);
      EXPECT_EQ(op.executor.rfind("dynamic int8 linear", 0), 0u) << op.executor;
      ++dynamic;
    } else {
      EXPECT_EQ(op.role, "fp32") << op.op;
    }
  }
  EXPECT_EQ(dynamic, 4);
  EXPECT_EQ(uncalibrated_ops(m), 0);
}

// default_dynamic_qconfig_mapping on a model around the layer: the head Linear is dynamic too
// (as PyTorch's quantize_dynamic default: Linear, LSTM, GRU), the embedding stays fp32.
struct Classifier : nn::CallableModule<Classifier> {
  Classifier() {
    embedding = register_module("embedding", std::make_shared<nn::EmbeddingImpl>(20, 6));
    lstm = register_module("lstm", std::make_shared<nn::LSTMImpl>(nn::LSTMOptions(6, 8).batch_first(true)));
    head = register_module("head", std::make_shared<nn::LinearImpl>(8, 3));
  }
  Tensor forward(const Tensor& ids) {
    auto [out, state] = (*lstm)((*embedding)(ids));
    return (*head)(std::get<0>(state).select(0, 0));
  }
  std::shared_ptr<nn::EmbeddingImpl> embedding;
  std::shared_ptr<nn::LSTMImpl> lstm;
  std::shared_ptr<nn::LinearImpl> head;
};

TEST(RnnDynamic, DefaultDynamicMappingAroundTheLayer) {
  manual_seed(22);
  Classifier m;
  m.eval();
  std::vector<int64_t> ids(3 * 7);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + 3) % 20);
  const Tensor x = from_vector(ids, {3, 7});
  const Tensor ref = m(x);
  prepare(m, {x}, default_dynamic_qconfig_mapping());
  convert(m);
  EXPECT_GT(sqnr_of(m(x), ref), 38.0);
  std::vector<std::string> dynamic;
  for (const QuantizedOpInfo& op : quantized_ops(m)) {
    if (op.dynamic && op.role != "fp32") dynamic.push_back(op.fqn + ":" + op.op);
  }
  std::sort(dynamic.begin(), dynamic.end());
  EXPECT_EQ(dynamic, (std::vector<std::string>{"head:linear", "lstm:linear", "lstm:linear"}));
}

}  // namespace
}  // namespace dbrq
