#include "tests/rnn/rnn_cases.h"

#include <gtest/gtest.h>

namespace dbrq::testing {
namespace {

constexpr char kGolden[] = "tests/rnn/golden/rnn.safetensors";

RnnCase make_case(const std::string& name, bool lstm, nn::RNNOptions o) {
  RnnCase c;
  c.name = name;
  c.lstm = lstm;
  c.options = o;
  return c;
}

}  // namespace

const std::vector<RnnCase>& rnn_cases() {
  static const std::vector<RnnCase>* cases = [] {
    auto* v = new std::vector<RnnCase>;
    using O = nn::RNNOptions;
    for (bool lstm : {true, false}) {
      const std::string m = lstm ? "lstm" : "gru";
      v->push_back(make_case(m + "_1l", lstm, O(4, 6)));
      v->push_back(make_case(m + "_2l_hx", lstm, O(5, 8).num_layers(2)));
      v->push_back(make_case(m + "_2l_bf", lstm, O(5, 8).num_layers(2).batch_first(true)));
      v->push_back(make_case(m + "_bi_2l", lstm, O(4, 6).num_layers(2).bidirectional(true)));
      v->push_back(make_case(m + "_bi_bf_nobias", lstm, O(4, 6).bias(false).batch_first(true).bidirectional(true)));
      v->push_back(make_case(m + "_unbatched", lstm, O(3, 5).num_layers(2)));
      v->push_back(make_case(m + "_packed", lstm, O(4, 6).num_layers(2).batch_first(true).bidirectional(true)));
      v->push_back(make_case(m + "_packed_sorted", lstm, O(4, 6)));
    }
    return v;
  }();
  return *cases;
}

RnnGolden load_rnn_golden(const std::string& case_name) {
  static const NamedTensors* file = new NamedTensors(load_safetensors(kGolden));
  RnnGolden g;
  const std::string prefix = case_name + ".";
  static const std::vector<std::string> kData = {
      "input", "h0",         "c0",      "lengths", "output",           "h_n",
      "c_n",   "dyn_output", "dyn_h_n", "dyn_c_n", "torch_dyn_output", "torch_dyn_h_n"};
  for (const auto& [name, t] : *file) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string key = name.substr(prefix.size());
    if (std::find(kData.begin(), kData.end(), key) != kData.end()) {
      g.tensors[key] = t;
    } else {
      g.state_dict.emplace_back(key, t);
    }
  }
  EXPECT_TRUE(g.has("input") && g.has("output")) << case_name << " is not in " << kGolden;
  return g;
}

std::shared_ptr<nn::Module> make_rnn(const RnnCase& c, const RnnGolden& g) {
  std::shared_ptr<nn::Module> m;
  if (c.lstm) {
    m = std::make_shared<nn::LSTMImpl>(c.options);
  } else {
    m = std::make_shared<nn::GRUImpl>(c.options);
  }
  m->load_state_dict(g.state_dict, /*strict=*/true);
  m->eval();
  return m;
}

std::vector<Tensor> run_rnn(nn::Module& module, const RnnGolden& g) {
  std::vector<int64_t> lengths;
  if (g.has("lengths")) lengths = g.at("lengths").to_vector<int64_t>();
  const Tensor h0 = g.has("h0") ? g.at("h0") : Tensor();
  if (auto* lstm = dynamic_cast<nn::LSTMImpl*>(&module)) {
    std::optional<std::tuple<Tensor, Tensor>> hx;
    if (h0.defined()) hx = std::make_tuple(h0, g.at("c0"));
    auto [out, state] = (*lstm)(g.at("input"), hx, lengths);
    return {out, std::get<0>(state), std::get<1>(state)};
  }
  auto& gru = dynamic_cast<nn::GRUImpl&>(module);
  auto [out, h_n] = gru(g.at("input"), h0, lengths);
  return {out, h_n};
}

}  // namespace dbrq::testing
