#include "tests/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace dbrq::testing {

double relative_error(const Tensor& actual, const Tensor& expected) {
  // Quantized tensors compare by their codes (an integer read), everything else by value.
  auto values = [](const Tensor& t) {
    if (!t.is_quantized()) return t.to_vector<double>();
    const std::vector<int64_t> codes = t.int_repr().to_vector<int64_t>();
    return std::vector<double>(codes.begin(), codes.end());
  };
  const std::vector<double> a = values(actual), b = values(expected);
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    if (std::isnan(a[i])) continue;
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  if (den == 0.0) return num;
  return num / den;
}

void expect_close(const Tensor& actual, const Tensor& expected, double tol, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": actual is undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes())
      << what << ": sizes " << actual.shape_string() << " vs expected " << expected.shape_string();
  const double err = relative_error(actual, expected);
  EXPECT_LE(err, tol) << what << ": relative error " << err << " exceeds " << tol;
}

void expect_equal(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes())
      << what << ": sizes " << actual.shape_string() << " vs expected " << expected.shape_string();
  // Quantized tensors compare by their codes (an integer read), everything else by value.
  auto values = [](const Tensor& t) {
    if (!t.is_quantized()) return t.to_vector<double>();
    const std::vector<int64_t> codes = t.int_repr().to_vector<int64_t>();
    return std::vector<double>(codes.begin(), codes.end());
  };
  const std::vector<double> a = values(actual), b = values(expected);
  int64_t diff = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++diff;
    }
  }
  EXPECT_EQ(diff, 0) << what << ": " << diff << " of " << a.size() << " elements differ; first at " << first
                     << " (" << (first >= 0 ? a[first] : 0) << " vs " << (first >= 0 ? b[first] : 0) << ")";
}

std::vector<int32_t> codes(const Tensor& t) { return (t.is_quantized() ? t.int_repr() : t).to_vector<int32_t>(); }

std::vector<Tensor> random_batches(int n, uint64_t seed, const std::vector<int64_t>& sizes) {
  std::vector<Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(randn(sizes, seed + static_cast<uint64_t>(i)));
  return out;
}

std::set<int> observer_roots(ModelQuantState& m) {
  std::set<int> out;
  for (size_t i = 0; i < m.num_slots(); ++i) out.insert(m.find(static_cast<int>(i)));
  return out;
}

std::set<int> observer_roots(const nn::Module& model) { return observer_roots(model_quant_state(model)); }

std::map<std::string, Tensor> load_golden(const std::string& path) {
  std::map<std::string, Tensor> out;
  for (auto& [n, t] : load_safetensors(path)) out[n] = t;
  return out;
}

Tensor golden(const std::map<std::string, Tensor>& g, const std::string& name) {
  auto it = g.find(name);
  if (it == g.end()) {
    std::string names;
    for (auto& [n, t] : g) names += n + " ";
    ADD_FAILURE() << "golden tensor \"" << name << "\" not found; have: " << names;
    return Tensor();
  }
  return it->second;
}

std::string temp_file(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

}  // namespace dbrq::testing
