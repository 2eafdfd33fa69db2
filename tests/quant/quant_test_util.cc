#include "tests/quant/quant_test_util.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace dbrq::testing {

double sqnr_of(const Tensor& actual, const Tensor& reference) {
  const std::vector<double> a = actual.to_vector<double>(), r = reference.to_vector<double>();
  if (a.size() != r.size()) return -std::numeric_limits<double>::infinity();
  double sig = 0.0, noise = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    sig += r[i] * r[i];
    noise += (a[i] - r[i]) * (a[i] - r[i]);
  }
  if (noise == 0.0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(sig / noise);
}

namespace {

void fill_from(Tensor& t, const Tensor& src) {
  const std::vector<float> v = src.to_vector<float>();
  float* d = t.mutable_data<float>();
  for (size_t i = 0; i < v.size(); ++i) d[i] = v[i];
}

}  // namespace

void randomize_bn(nn::BatchNorm2dImpl& bn, uint64_t seed) {
  const int64_t c = bn.num_features();
  fill_from(bn.running_mean, rand_uniform({c}, -0.5, 0.5, seed));
  fill_from(bn.running_var, rand_uniform({c}, 0.5, 2.0, seed + 1));
  if (bn.weight.defined()) fill_from(bn.weight, rand_uniform({c}, 0.5, 1.5, seed + 2));
  if (bn.bias.defined()) fill_from(bn.bias, rand_uniform({c}, -0.3, 0.3, seed + 3));
}

std::vector<OpKind> seen_kinds(const AutoQuantizationState& s) {
  std::vector<OpKind> out;
  for (const SeenOpInfo& op : s.seen_ops()) out.push_back(op.kind);
  return out;
}

std::vector<std::string> display_kinds(const AutoQuantizationState& s) {
  std::vector<std::string> out;
  for (const SeenOpInfo& op : s.seen_ops()) {
    if (op.fusion.fused() && op.fusion.position > 0) continue;
    out.push_back(op.display_kind());
  }
  return out;
}

std::set<int> fed_roots(ModelQuantState& m) {
  std::set<int> out;
  for (AutoQuantizationState* s : m.states()) {
    for (const SeenOpInfo& op : s->seen_ops()) {
      for (int k : op.input_observers) {
        if (k >= 0) out.insert(m.find(k));
      }
      if (op.output_observer >= 0) out.insert(m.find(op.output_observer));
    }
  }
  return out;
}

AutoQuantizationState& state_of(const nn::Module& m) {
  AutoQuantizationState* s = quant_state_of(m);
  if (s == nullptr) throw std::runtime_error("module " + m.type_name() + " has no AutoQuantizationState");
  return *s;
}

void calibrate(nn::Module& model, const std::vector<int64_t>& sizes, int n, uint64_t seed) {
  for (int i = 0; i < n; ++i) model.forward_tensors({randn(IntArrayRef(sizes), seed + i)});
}

std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace dbrq::testing
