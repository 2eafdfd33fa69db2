// overhead_bench: what dbrq's interception costs per op, measured on a model that is nothing but
// a chain of tiny adds, against the same kernels called directly in a loop.
//
//   bazel build -c opt //bench:overhead_bench
//   bazel-out/k8-opt/bin/bench/overhead_bench [--ops=1000] [--numel=64] [--reps=1000] [--threads=1]
//
// Four timings per repetition, interleaved so that machine noise hits them alike:
//   int8_model    the converted AddChain: input quantization, `ops` int8 adds through the
//                 convert-mode op hook (record lookup, argument checks, kernels::qadd), output
//                 dequantization, plus the module call hooks;
//   int8_direct   the same work with the kernels called directly: quantize x and y, `ops` calls of
//                 kernels::qadd (each with its own output parameters, as the converted adds have),
//                 dequantize;
//   fp32_model    an unprepared AddChain: `ops` fp32 adds through the dispatcher's no-interceptor
//                 path (a thread-local load and an indirect call);
//   fp32_direct   `ops` calls of kernels::binary(kAdd) directly.
// The per-op overhead is the median over repetitions of (model - direct) / ops, in ns. The one
// JSON line on stdout holds every number; bench/compare.py parses it.
//
// This is the one bench/ program that includes kernels/ headers: it needs the kernels the
// converted model calls in order to call them directly.
//
// `--profile=1` runs only the converted model, `reps` times, and prints nothing: a target for
// `perf record` that holds the convert-mode path alone.
//
// `--avg_pool=1` times the int8 average pooling kernel instead (not part of compare.sh): Inception's
// pool branches (3x3, stride 1, padding 1) on channels-last u8, the vectorized path
// (kernels/int8_pool.cc) against the strided scalar loop that ran every layout before it (fed the
// same codes through a channels-last view with one channel sliced off, so the view is not dense
// and takes that loop), interleaved; prints one JSON line with the medians and their ratio.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "dbrq.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "nlohmann/json.hpp"

namespace {

using dbrq::Tensor;
using Clock = std::chrono::steady_clock;

// x + y + y + ... : `n` quantizeable adds inside one module's forward.
struct AddChain : dbrq::nn::CallableModule<AddChain> {
  explicit AddChain(int n) : n_(n) {}
  Tensor forward(const Tensor& x, const Tensor& y) {
    Tensor z = x;
    for (int i = 0; i < n_; ++i) z = z + y;
    return z;
  }
  int n_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <typename F>
double time_ns(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

// Inception-style pool branches: vectorized channels-last path vs the strided scalar loop.
int avg_pool_bench(int reps, int threads) {
  nlohmann::json rows = nlohmann::json::array();
  struct Shape {
    int64_t n, c, h, w;
  };
  for (const Shape s : {Shape{4, 192, 35, 35}, Shape{4, 768, 17, 17}, Shape{4, 2048, 8, 8}}) {
    const auto qp = dbrq::QuantParams::per_tensor(0.03f, 117);
    const Tensor f = dbrq::randn({s.n, s.c + 1, s.h, s.w}, 3);
    const Tensor wide = dbrq::kernels::quantize_to(f, qp, dbrq::DType::kU8, dbrq::MemoryFormat::kChannelsLast);
    const Tensor strided = wide.raw_narrow(1, 0, s.c);  // channels-last strides, not dense
    const Tensor dense = dbrq::kernels::copy(strided, dbrq::MemoryFormat::kChannelsLast, dbrq::DType::kU8);
    dbrq::Pool2dParams p;
    p.kernel_size = {3, 3};
    p.stride = {1, 1};
    p.padding = {1, 1};
    for (int w = 0; w < 3; ++w) {
      dbrq::kernels::qavg_pool2d(dense, p);
      dbrq::kernels::qavg_pool2d(strided, p);
    }
    std::vector<double> vec, scalar, ratio;
    for (int r = 0; r < reps; ++r) {
      double a, b;
      if (r % 2 == 0) {
        a = time_ns([&] { dbrq::kernels::qavg_pool2d(dense, p); });
        b = time_ns([&] { dbrq::kernels::qavg_pool2d(strided, p); });
      } else {
        b = time_ns([&] { dbrq::kernels::qavg_pool2d(strided, p); });
        a = time_ns([&] { dbrq::kernels::qavg_pool2d(dense, p); });
      }
      vec.push_back(a);
      scalar.push_back(b);
      ratio.push_back(a / b);
    }
    rows.push_back({{"shape", {s.n, s.c, s.h, s.w}},
                    {"vectorized_us", median(vec) / 1e3},
                    {"scalar_us", median(scalar) / 1e3},
                    {"vectorized_over_scalar", median(ratio)}});
  }
  std::cout << nlohmann::json{{"avg_pool", rows}, {"reps", reps}, {"threads", threads}}.dump() << std::endl;
  return 0;
}

int count_substr(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  int ops = 1000, numel = 64, reps = 1000, threads = 1, avg_pool = 0, profile = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const size_t eq = a.find('=');
    std::string k = eq == std::string::npos ? a : a.substr(0, eq);
    int v = 0;
    if (eq == std::string::npos || !absl::SimpleAtoi(a.substr(eq + 1), &v) || v < 1) k.clear();
    if (k == "--ops") {
      ops = v;
    } else if (k == "--numel") {
      numel = v;
    } else if (k == "--reps") {
      reps = v;
    } else if (k == "--threads") {
      threads = v;
    } else if (k == "--profile") {
      profile = v;
    } else if (k == "--avg_pool") {
      avg_pool = v;
    } else {
      std::cerr << "usage: overhead_bench [--ops=1000] [--numel=64] [--reps=1000] [--threads=1] [--avg_pool=1] [--profile=1]\n";
      return 2;
    }
  }
  dbrq::set_num_threads(threads);
  if (avg_pool != 0) return avg_pool_bench(std::min(reps, 50), threads);
  const Tensor x = dbrq::randn({1, numel}, 1), y = dbrq::randn({1, numel}, 2);

  // The int8 model: prepared, calibrated on a few inputs, converted.
  AddChain qmodel(ops);
  qmodel.eval();
  dbrq::prepare(qmodel, {x, y}, dbrq::default_qconfig_mapping("onednn"));
  for (uint64_t s = 0; s < 4; ++s) qmodel(dbrq::randn({1, numel}, 10 + s), dbrq::randn({1, numel}, 20 + s));
  dbrq::convert(qmodel);
  if (profile != 0) {
    for (int r = 0; r < reps; ++r) qmodel(x, y);
    return 0;
  }
  const int int8_adds = count_substr(dbrq::quant_state_to_string(qmodel), "-> int8 add");

  AddChain fmodel(ops);
  fmodel.eval();

  // Direct calls: parameters like the converted model's (values do not change the kernels' cost).
  const auto in_qp = dbrq::QuantParams::per_tensor(0.02f, 128);
  std::vector<dbrq::QuantParamsPtr> out_qp;
  for (int i = 0; i < ops; ++i) out_qp.push_back(dbrq::QuantParams::per_tensor(0.02f * (1 + i), 128));
  using dbrq::kernels::BinaryAlg;
  auto int8_direct = [&] {
    const Tensor yq = dbrq::kernels::quantize_to(y, in_qp, dbrq::DType::kU8, dbrq::MemoryFormat::kPreserve);
    Tensor z = dbrq::kernels::quantize_to(x, in_qp, dbrq::DType::kU8, dbrq::MemoryFormat::kPreserve);
    for (int i = 0; i < ops; ++i) z = dbrq::kernels::qadd(z, yq, out_qp[i], false);
    return dbrq::kernels::dequantize(z);
  };
  auto fp32_direct = [&] {
    Tensor z = x;
    for (int i = 0; i < ops; ++i) z = dbrq::kernels::binary(BinaryAlg::kAdd, z, y);
    return z;
  };

  // Same results both ways (a cheap check that the direct loops do the model's work).
  const Tensor ref_q = qmodel(x, y), ref_f = fmodel(x, y);
  if (ref_q.dtype() != dbrq::DType::kF32 || ref_f.numel() != numel || fp32_direct().numel() != numel ||
      int8_direct().numel() != numel) {
    std::cerr << "overhead_bench: unexpected result shapes\n";
    return 1;
  }

  for (int w = 0; w < 20; ++w) {  // warm-up (allocator, caches)
    qmodel(x, y);
    int8_direct();
    fmodel(x, y);
    fp32_direct();
  }
  std::vector<double> qm, qd, fm, fd, qdiff, fdiff;
  for (int r = 0; r < reps; ++r) {
    // Alternate the order so neither side always runs first.
    double a, b, c, d;
    if (r % 2 == 0) {
      a = time_ns([&] { qmodel(x, y); });
      b = time_ns(int8_direct);
      c = time_ns([&] { fmodel(x, y); });
      d = time_ns(fp32_direct);
    } else {
      d = time_ns(fp32_direct);
      c = time_ns([&] { fmodel(x, y); });
      b = time_ns(int8_direct);
      a = time_ns([&] { qmodel(x, y); });
    }
    qm.push_back(a);
    qd.push_back(b);
    fm.push_back(c);
    fd.push_back(d);
    qdiff.push_back((a - b) / ops);
    fdiff.push_back((c - d) / ops);
  }
  nlohmann::json out = {
      {"ops", ops},
      {"numel", numel},
      {"reps", reps},
      {"threads", threads},
      {"int8_adds_converted", int8_adds},
      {"int8_model_ns_per_op", median(qm) / ops},
      {"int8_direct_ns_per_op", median(qd) / ops},
      {"fp32_model_ns_per_op", median(fm) / ops},
      {"fp32_direct_ns_per_op", median(fd) / ops},
      {"convert_overhead_ns_per_op", median(qdiff)},
      {"fp32_dispatch_overhead_ns_per_op", median(fdiff)},
  };
  std::cout << out.dump() << std::endl;
  return 0;
}
