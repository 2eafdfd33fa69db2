// The nn.LSTM / nn.GRU cases of tests/rnn/golden/rnn.safetensors (make_rnn_goldens.py writes them;
// keep the two tables in sync), and running one through dbrq's layer of the same kind.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"

namespace dbrq::testing {

struct RnnCase {
  std::string name;
  bool lstm = false;
  nn::RNNOptions options{1, 1};
};

// Every case, in the script's order.
const std::vector<RnnCase>& rnn_cases();

// One case's tensors from the golden file: "input", "h0", "c0", "lengths", "output", ... (the
// case prefix removed; absent ones are not in the map) and its state dict in file order.
struct RnnGolden {
  std::map<std::string, Tensor> tensors;
  NamedTensors state_dict;
  bool has(const std::string& k) const { return tensors.count(k) != 0; }
  const Tensor& at(const std::string& k) const { return tensors.at(k); }
};
RnnGolden load_rnn_golden(const std::string& case_name);

// The case's module (nn::LSTM or nn::GRU), weights loaded strictly from the golden state dict.
std::shared_ptr<nn::Module> make_rnn(const RnnCase& c, const RnnGolden& g);

// Runs the module on the case's input (with h0 / c0 / lengths when the case has them) through its
// call operator. Returns {output, h_n} or {output, h_n, c_n}.
std::vector<Tensor> run_rnn(nn::Module& module, const RnnGolden& g);

}  // namespace dbrq::testing
