// Concurrency: a converted model serving 8 threads at once, and calibration sharded over threads.
//
//   - Serving: one converted model (small CNN, ResNet-18 tiny, BERT tiny) is called from 8 threads
//     that start together; every result is bit-identical to the single-threaded result for the
//     same request. A variant mixes bad requests (which throw, located) into the good ones.
//   - Sharded calibration: 4 threads each prepare their own replica of the model and calibrate it
//     on their shard of the data; merge_calibration folds the replicas into a freshly prepared
//     model. Min/max observers give exactly the parameters of one pass over all the data (and the
//     converted models are bit-identical); histogram observers give a quantization range within 1%
//     of the one-pass range.
//
// Tagged "tsan": tools/run_tests.sh also runs this suite under --config=tsan, which must report no
// data race. Each test prints a "[concurrency] ..." line with its measurements.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/zoo.h"
#include "tests/reliability/reliability_util.h"

namespace dbrq {
namespace {

using testing::bit_identical;
using testing::observer_roots;
// Sanitizer builds run fewer rounds (TSan is 5-15x slower); the threads and the checks are the same.
constexpr bool kSlow = testing::kUnderTsan || testing::kUnderAsan;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Starts `n` threads running body(thread_index) at the same moment and joins them.
void run_together(int n, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < n) std::this_thread::yield();
      body(t);
    });
  }
  for (auto& th : threads) th.join();
}

struct Subject {
  std::string name;
  const zoo::ModelSpec* spec;
  std::shared_ptr<nn::Module> model;
  Tensor input(int64_t batch, uint64_t seed) const {
    if (name == "resnet18") return randn({batch, 3, 32, 32}, seed);  // kTiny takes any size >= 32
    return spec->example_input(zoo::Variant::kTiny, batch, seed);
  }
  Tensor run(const Tensor& x) const { return spec->run(*model, x); }
};

Subject make(const std::string& name, uint64_t seed) {
  Subject s{name, &zoo::find_model(name), nullptr};
  manual_seed(seed);
  s.model = s.spec->make(zoo::Variant::kTiny);
  s.model->eval();
  return s;
}

Subject converted(const std::string& name) {
  Subject s = make(name, 3);
  prepare(*s.model, {s.input(2, 1)});
  for (uint64_t seed = 10; seed < 14; ++seed) s.run(s.input(2, seed));
  convert(*s.model);
  return s;
}

// ---- serving ---------------------------------------------------------------------------------

constexpr int kServerThreads = 8;

void serve(const std::string& name, int requests, int rounds) {
  Subject s = converted(name);
  std::vector<Tensor> in, expected;
  for (int i = 0; i < requests; ++i) in.push_back(s.input(1 + i % 3, 100 + i));  // batch sizes 1, 2, 3
  for (const Tensor& x : in) expected.push_back(s.run(x));  // also creates the primitives for each size

  std::atomic<int> calls{0}, mismatches{0}, errors{0};
  const auto t8 = Clock::now();
  run_together(kServerThreads, [&](int t) {
    for (int r = 0; r < rounds; ++r) {
      for (int k = 0; k < requests; ++k) {
        const int i = (k + t) % requests;  // each thread walks the requests from another start
        try {
          if (!bit_identical(s.run(in[i]), expected[i])) mismatches.fetch_add(1);
        } catch (const std::exception& e) {
          errors.fetch_add(1);
        }
        calls.fetch_add(1);
      }
    }
  });
  const double threaded_ms = ms_since(t8);
  std::cout << "[concurrency] serve " << name << ": " << kServerThreads << " threads x " << rounds * requests
            << " calls = " << calls.load() << " calls in " << threaded_ms << " ms; mismatches " << mismatches.load()
            << ", errors " << errors.load() << std::endl;
  EXPECT_EQ(calls.load(), kServerThreads * rounds * requests);
  EXPECT_EQ(mismatches.load(), 0) << "results differ from the single-threaded run";
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(current_interceptor(), nullptr);
}

TEST(Serve, SmallCnnFromEightThreadsIsBitIdentical) { serve("small_cnn", 12, kSlow ? 4 : 50); }

TEST(Serve, ResNet18TinyFromEightThreadsIsBitIdentical) { serve("resnet18", 6, kSlow ? 2 : 10); }

TEST(Serve, BertTinyFromEightThreadsIsBitIdentical) { serve("bert_encoder", 6, kSlow ? 2 : 10); }

TEST(Serve, BadRequestsFromSomeThreadsDoNotDisturbTheOthers) {
  Subject s = converted("small_cnn");
  std::vector<Tensor> in, expected;
  for (int i = 0; i < 6; ++i) in.push_back(s.input(2, 200 + i));
  for (const Tensor& x : in) expected.push_back(s.run(x));
  const Tensor bad = randn({2, 3, 8, 8}, 1);  // 3 channels for a 1-channel conv
  const int rounds = kSlow ? 4 : 40;
  std::atomic<int> mismatches{0}, located{0}, bad_calls{0}, other{0};
  run_together(kServerThreads, [&](int t) {
    for (int r = 0; r < rounds; ++r) {
      for (size_t i = 0; i < in.size(); ++i) {
        if (t % 2 == 1 && (i + r) % 2 == 0) {
          bad_calls.fetch_add(1);
          try {
            s.run(bad);
          } catch (const ShapeError& e) {
            if (std::string(e.what()).rfind("in module \"\" (SmallCnn), op 0 conv2d (conv1): conv2d: input has 3", 0) ==
                0) {
              located.fetch_add(1);
            }
          } catch (...) {
            other.fetch_add(1);
          }
          continue;
        }
        try {
          if (!bit_identical(s.run(in[i]), expected[i])) mismatches.fetch_add(1);
        } catch (...) {
          other.fetch_add(1);
        }
      }
    }
  });
  std::cout << "[concurrency] serve small_cnn with bad requests: " << bad_calls.load() << " bad calls (" << located.load()
            << " ShapeErrors naming module and op) among good ones on " << kServerThreads << " threads; mismatches "
            << mismatches.load() << ", other errors " << other.load() << std::endl;
  EXPECT_GT(bad_calls.load(), 0);
  EXPECT_EQ(located.load(), bad_calls.load());
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(other.load(), 0);
}

// ---- sharded calibration -----------------------------------------------------------------------

constexpr int kShards = 4;

struct ShardResult {
  double worst_range_error = 0.0;  // max over observers of the range endpoints' error / range width
  int observers = 0;
  int exact = 0;         // observers whose scale and zero point match exactly
  bool converted_identical = false;
  double calibrate_ms = 0.0;
};

// The real range an observer's parameters represent: [(qmin - zp) * scale, (qmax - zp) * scale].
std::pair<double, double> represented_range(const QuantParams& q, DType dtype) {
  const double qmin = dtype == DType::kU8 ? 0 : -128, qmax = dtype == DType::kU8 ? 255 : 127;
  return {(qmin - q.zero_point()) * q.scale(), (qmax - q.zero_point()) * q.scale()};
}

ShardResult calibrate_sharded(const std::string& name, const QConfigMapping& mapping, int batches) {
  ShardResult result;
  auto data_of = [&](const Subject& s) {
    std::vector<Tensor> d;
    for (int i = 0; i < batches; ++i) d.push_back(s.input(2, 500 + i) * (0.5 + 0.1 * (i % 7)));
    return d;
  };
  // One pass over all the data.
  Subject whole = make(name, 11);
  const std::vector<Tensor> data = data_of(whole);
  prepare(*whole.model, {whole.input(2, 1)}, mapping);
  for (const Tensor& x : data) whole.run(x);

  // Replicas: built here (construction draws from the global seed), prepared and calibrated on
  // their own threads, shard k taking batches k, k + 4, ...
  std::vector<Subject> replicas;
  for (int k = 0; k < kShards; ++k) replicas.push_back(make(name, 11));
  std::atomic<int> failures{0};
  const auto t0 = Clock::now();
  run_together(kShards, [&](int k) {
    try {
      Subject& r = replicas[k];
      prepare(*r.model, {r.input(2, 1)}, mapping);
      for (int i = k; i < batches; i += kShards) r.run(data[i]);
    } catch (const std::exception& e) {
      failures.fetch_add(1);
    }
  });
  result.calibrate_ms = ms_since(t0);
  EXPECT_EQ(failures.load(), 0);

  Subject merged = make(name, 11);
  prepare(*merged.model, {merged.input(2, 1)}, mapping);
  for (const Subject& r : replicas) merge_calibration(*merged.model, *r.model);

  ModelQuantState& a = model_quant_state(*merged.model);
  ModelQuantState& b = model_quant_state(*whole.model);
  const std::set<int> roots = observer_roots(*merged.model);
  EXPECT_EQ(roots, observer_roots(*whole.model));
  for (int slot : roots) {
    const Observer& oa = *a.slot(slot).observer;
    const Observer& ob = *b.slot(slot).observer;
    EXPECT_EQ(oa.num_batches(), ob.num_batches()) << "slot " << slot;
    const QuantParamsPtr qa = oa.calculate_qparams(), qb = ob.calculate_qparams();
    if (qa == nullptr || qb == nullptr) continue;  // fixed / dynamic: nothing calibrated
    ++result.observers;
    if (qa->scale() == qb->scale() && qa->zero_point() == qb->zero_point()) ++result.exact;
    const auto [lo_a, hi_a] = represented_range(*qa, oa.spec().dtype);
    const auto [lo_b, hi_b] = represented_range(*qb, ob.spec().dtype);
    const double err = std::max(std::abs(lo_a - lo_b), std::abs(hi_a - hi_b)) / (hi_b - lo_b);
    result.worst_range_error = std::max(result.worst_range_error, err);
  }
  convert(*merged.model);
  convert(*whole.model);
  const Tensor x = merged.input(3, 77);
  result.converted_identical = bit_identical(merged.run(x), whole.run(x));
  return result;
}

QConfigMapping min_max_mapping() {
  QConfigMapping m = default_qconfig_mapping("onednn");
  m.set_global(QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max()));
  return m;
}

void report(const std::string& what, const ShardResult& r) {
  std::cout << "[concurrency] sharded calibration " << what << ": " << kShards << " threads, " << r.observers
            << " observers, " << r.exact << " with identical scale and zero point, worst range error "
            << 100.0 * r.worst_range_error << "% of the range, converted outputs "
            << (r.converted_identical ? "bit-identical" : "differ") << " (calibration " << r.calibrate_ms << " ms)"
            << std::endl;
}

TEST(ShardedCalibration, MinMaxMergeEqualsOnePassExactly) {
  for (const std::string name : {"small_cnn", "resnet18"}) {
    const ShardResult r = calibrate_sharded(name, min_max_mapping(), kSlow ? 8 : 16);
    report(name + " min/max", r);
    EXPECT_GT(r.observers, 0);
    EXPECT_EQ(r.exact, r.observers) << name;
    EXPECT_EQ(r.worst_range_error, 0.0) << name;
    EXPECT_TRUE(r.converted_identical) << name;
  }
}

TEST(ShardedCalibration, HistogramMergeIsWithinOnePercentOfOnePass) {
  for (const std::string name : {"small_cnn", "resnet18"}) {
    const ShardResult r = calibrate_sharded(name, default_qconfig_mapping("onednn"), kSlow ? 8 : 16);
    report(name + " histogram", r);
    EXPECT_GT(r.observers, 0);
    EXPECT_LE(r.worst_range_error, 0.01) << name;
  }
}

}  // namespace
}  // namespace dbrq
