// bf16 vs fp32 vs int8 for one layer in dbrq: a BERT-base FFN linear (768 -> 3072 over 128 tokens)
// and a ResNet 3x3 conv (64 -> 64 on 56x56), each as a one-layer model run fp32 (unprepared), int8
// (default mapping, converted) and bf16 (QConfig::bf16()). Prints one JSON line per case:
// medians (of 5 interleaved rounds of --iters calls) and minimum ms and the SQNR of bf16 / int8 outputs vs fp32. bench/bf16_compare.py
// runs it next to PyTorch 1.13 (fp32 and bf16) and reports ratios.
//
//   bazel run -c opt //bench:bf16_bench -- 50 /tmp/inputs_dir
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"

namespace {

struct OneLayer : dbrq::nn::CallableModule<OneLayer> {
  explicit OneLayer(std::shared_ptr<dbrq::nn::Module> layer) : layer_(register_module("layer", std::move(layer))) {}
  dbrq::Tensor forward(const dbrq::Tensor& x) { return layer_->forward_unary(x); }
  std::shared_ptr<dbrq::nn::Module> layer_;
};

// Median and min of `iters` timed calls (min: what the hardware does when the shared machine lets
// it; the median is what contention leaves).
struct Times {
  double median = 0, min = 0;
};

Times time_ms(OneLayer& m, const dbrq::Tensor& x, int iters) {
  m(x);  // primitives, packed weights
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto s = std::chrono::steady_clock::now();
    m(x);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t[0]};
}

template <typename MakeLayer>
void run_case(const char* name, MakeLayer make, const dbrq::Tensor& x, int iters, const std::string& dir) {
  dbrq::manual_seed(7);
  auto fp32 = std::make_shared<OneLayer>(make());
  fp32->eval();
  auto clone = [&] {
    auto m = std::make_shared<OneLayer>(make());
    m->load_state_dict(fp32->state_dict());
    m->eval();
    return m;
  };
  auto int8 = clone();
  dbrq::prepare(*int8, {x});
  (*int8)(x);
  dbrq::convert(*int8);
  auto bf16 = clone();
  dbrq::QConfigMapping mapping = dbrq::default_qconfig_mapping("onednn");
  mapping.set_module_name("layer", dbrq::QConfig::bf16());
  dbrq::prepare(*bf16, {x}, mapping);
  (*bf16)(x);
  dbrq::convert(*bf16);
  const dbrq::Tensor ref = (*fp32)(x);
  if (!dir.empty()) {
    dbrq::NamedTensors t = fp32->state_dict();
    t.emplace_back("input", x.contiguous());
    dbrq::save_safetensors(dir + "/" + name + ".safetensors", t);
  }
  // Interleaved in rounds so that contention hits the three alike.
  Times f{1e30, 1e30}, b{1e30, 1e30}, q{1e30, 1e30};
  std::vector<double> fm, bm, qm;
  for (int round = 0; round < 5; ++round) {
    const Times tf = time_ms(*fp32, x, iters), tb = time_ms(*bf16, x, iters), tq = time_ms(*int8, x, iters);
    fm.push_back(tf.median), bm.push_back(tb.median), qm.push_back(tq.median);
    f.min = std::min(f.min, tf.min), b.min = std::min(b.min, tb.min), q.min = std::min(q.min, tq.min);
  }
  for (auto* v : {&fm, &bm, &qm}) std::sort(v->begin(), v->end());
  std::printf(
      "{\"case\": \"%s\", \"bf16_hardware\": %s, \"dbrq_fp32_ms\": %.4f, \"dbrq_bf16_ms\": %.4f, \"dbrq_int8_ms\": %.4f, "
      "\"dbrq_fp32_min_ms\": %.4f, \"dbrq_bf16_min_ms\": %.4f, \"dbrq_int8_min_ms\": %.4f, "
      "\"dbrq_bf16_sqnr_db\": %.2f, \"dbrq_int8_sqnr_db\": %.2f}\n",
      name, dbrq::bf16_supported() ? "true" : "false", fm[2], bm[2], qm[2], f.min, b.min, q.min,
      dbrq::sqnr_db(ref, (*bf16)(x)), dbrq::sqnr_db(ref, (*int8)(x)));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  const std::string dir = argc > 2 ? argv[2] : "";
  run_case("linear_768x3072_m128", [] { return std::make_shared<dbrq::nn::LinearImpl>(768, 3072); },
           dbrq::randn({128, 768}, 1), iters, dir);
  run_case("conv3x3_64_56x56", [] { return std::make_shared<dbrq::nn::Conv2dImpl>(64, 64, 3, 1, 1); },
           dbrq::randn({1, 64, 56, 56}, 2), iters, dir);
  return 0;
}
