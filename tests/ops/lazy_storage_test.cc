// Lazily filled storage (Storage::allocate with a LazyFill, Tensor::empty_lazy) and kernels::dequantize_lazy,
// which a converted model's returned outputs use: the fill runs once, at the first data access,
// from whichever thread comes first (the others wait and see its result), never for metadata, and
// again after a fill that threw. Tagged "tsan": the concurrent first access runs under
// ThreadSanitizer in tools/run_tests.sh.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "dbrq.h"
#include "kernels/eager.h"

namespace {

using dbrq::DType;
using dbrq::QuantParams;
using dbrq::Tensor;

// A fill writing i * 0.5 to element i (numel of them), counted.
std::atomic<int> g_fills{0};
void half_steps(const dbrq::Storage::LazyFill& f, void* data) {
  g_fills.fetch_add(1);
  float* p = static_cast<float*>(data);
  for (int64_t i = 0; i < f.numel; ++i) p[i] = static_cast<float>(i) * 0.5f;
}

Tensor counting_tensor(int64_t n) {
  dbrq::Storage::LazyFill f;
  f.fn = &half_steps;
  f.numel = n;
  return Tensor::empty_lazy({n}, DType::kF32, f);
}

TEST(LazyStorage, FillsOnFirstDataAccessOnly) {
  g_fills = 0;
  Tensor t = counting_tensor(100);
  // Metadata, views and the storage's identity need no data.
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{100}));
  EXPECT_EQ(t.dtype(), DType::kF32);
  EXPECT_TRUE(t.is_contiguous());
  const Tensor view = t.narrow(0, 10, 5);
  EXPECT_EQ(view.storage(), t.storage());
  EXPECT_EQ(t.storage()->version(), 0u);
  EXPECT_FALSE(t.storage()->materialized());
  EXPECT_EQ(g_fills.load(), 0);
  // The first read (through a view) fills; later reads do not.
  EXPECT_EQ(view.to_vector<float>(), (std::vector<float>{5.f, 5.5f, 6.f, 6.5f, 7.f}));
  EXPECT_TRUE(t.storage()->materialized());
  EXPECT_EQ(t.to_vector<float>()[99], 49.5f);
  EXPECT_EQ(g_fills.load(), 1);
  EXPECT_EQ(t.storage()->version(), 0u);  // filling is not a write
  // A write after the fill keeps the write.
  t.fill_(2.0);
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(100, 2.f));
  EXPECT_EQ(g_fills.load(), 1);
}

TEST(LazyStorage, AWriteFirstFillsThenWrites) {
  g_fills = 0;
  Tensor t = counting_tensor(8);
  t.narrow(0, 0, 2).fill_(-1.0);  // the untouched elements keep their filled values
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{-1.f, -1.f, 1.f, 1.5f, 2.f, 2.5f, 3.f, 3.5f}));
  EXPECT_EQ(g_fills.load(), 1);
}

TEST(LazyStorage, NeverReadNeverFilled) {
  g_fills = 0;
  { Tensor t = counting_tensor(1 << 20); }  // 4 MiB: through the caching allocator too
  { Tensor t = counting_tensor(3); }
  EXPECT_EQ(g_fills.load(), 0);
}

// Eight threads read a tensor none has filled: one fill, every thread sees all of it.
TEST(LazyStorage, ConcurrentFirstReadsFillOnce) {
  for (int round = 0; round < 20; ++round) {
    g_fills = 0;
    const Tensor t = counting_tensor(4096);
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int k = 0; k < 8; ++k) {
      threads.emplace_back([&] {
        const float* p = t.data<float>();
        for (int64_t i = 0; i < 4096; ++i) {
          if (p[i] != static_cast<float>(i) * 0.5f) bad.fetch_add(1);
        }
      });
    }
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(g_fills.load(), 1) << "round " << round;
    EXPECT_EQ(bad.load(), 0) << "round " << round;
  }
}

int g_throwing_calls = 0;
void fails_once(const dbrq::Storage::LazyFill& f, void* data) {
  if (++g_throwing_calls == 1) throw std::runtime_error("first fill fails");
  std::memset(data, 0, static_cast<size_t>(f.numel) * sizeof(float));
}

TEST(LazyStorage, AFillThatThrowsIsTriedAgain) {
  dbrq::Storage::LazyFill f;
  f.fn = &fails_once;
  f.numel = 4;
  Tensor t = Tensor::empty_lazy({4}, DType::kF32, f);
  EXPECT_THROW(t.to_vector<float>(), std::runtime_error);
  EXPECT_FALSE(t.storage()->materialized());
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(4, 0.f));
  EXPECT_EQ(g_throwing_calls, 2);
}

Tensor codes(int64_t n, float scale, int32_t zp) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<uint8_t>((i * 37) % 256);
  return dbrq::from_vector(v, {n / 4, 4}).with_qparams(QuantParams::per_tensor(scale, zp));
}

TEST(DequantizeLazy, GivesDequantizesBytes) {
  const Tensor q = codes(1024, 0.031f, 117);
  const Tensor lazy = dbrq::kernels::dequantize_lazy(q);
  EXPECT_FALSE(lazy.storage()->materialized());
  const Tensor eager = dbrq::kernels::dequantize(q);
  EXPECT_EQ(lazy.sizes(), eager.sizes());
  EXPECT_EQ(std::memcmp(lazy.data_ptr(), eager.data_ptr(), 1024 * sizeof(float)), 0);
  // s8 codes and a non-contiguous input (dequantized at once) too.
  const Tensor s8 = dbrq::kernels::quantize(dbrq::randn({3, 5}, 4), QuantParams::per_tensor(0.02f, 0), DType::kS8);
  EXPECT_EQ(dbrq::kernels::dequantize_lazy(s8).to_vector<float>(), dbrq::kernels::dequantize(s8).to_vector<float>());
  const Tensor strided = q.transpose(0, 1);
  const Tensor now = dbrq::kernels::dequantize_lazy(strided);
  EXPECT_TRUE(now.storage()->materialized());
  EXPECT_EQ(now.to_vector<float>(), dbrq::kernels::dequantize(strided).to_vector<float>());
}

TEST(DequantizeLazy, BadInputsAreRejected) {
  try {
    dbrq::kernels::dequantize_lazy(dbrq::randn({2, 2}, 1));
    FAIL() << "expected DTypeError";
  } catch (const dbrq::DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("dequantize: input must be a quantized"), std::string::npos) << e.what();
  }
  try {
    dbrq::kernels::dequantize_lazy(Tensor());
    FAIL() << "expected ValueError";
  } catch (const dbrq::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("dequantize: input is an undefined tensor"), std::string::npos) << e.what();
  }
}

// The codes written before the result is read: the old values are gone, so reading raises
// instead of returning the new codes' values.
TEST(DequantizeLazy, CodesWrittenBeforeTheReadRaise) {
  Tensor q = codes(64, 0.5f, 10);
  const Tensor lazy = dbrq::kernels::dequantize_lazy(q);
  std::memset(q.mutable_data_ptr(), 3, 64);
  try {
    lazy.to_vector<float>();
    FAIL() << "expected UsageError";
  } catch (const dbrq::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("int8 codes were overwritten"), std::string::npos) << e.what();
  }
}

}  // namespace

// hash_bytes names the values calibration saw in quant-state files: the same in every process and
// on every platform (pinned values), and any change of value or length is another hash.
TEST(HashBytes, PinnedValuesAndEveryChangeCounts) {
  std::vector<unsigned char> bytes(100);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 1);
  // (Also what a Python transcription of the algorithm gives.)
  EXPECT_EQ(dbrq::hash_bytes(bytes.data(), bytes.size()), 0x8091186947bdda29ull);
  EXPECT_EQ(dbrq::hash_bytes("dbrq", 4), 0x2b5ddd6d559907aaull);
  EXPECT_EQ(dbrq::hash_bytes(nullptr, 0), 0x85042a7de88d77e0ull);
  const uint64_t h = dbrq::hash_bytes(bytes.data(), bytes.size());
  for (size_t i : {size_t{0}, size_t{31}, size_t{32}, size_t{95}, size_t{99}}) {  // lanes, words, tail
    std::vector<unsigned char> b = bytes;
    b[i] ^= 0x10;
    EXPECT_NE(dbrq::hash_bytes(b.data(), b.size()), h) << "byte " << i;
  }
  const std::vector<unsigned char> zeros(41, 0);
  EXPECT_NE(dbrq::hash_bytes(zeros.data(), 40), dbrq::hash_bytes(zeros.data(), 41));
  std::vector<unsigned char> shifted(bytes.size() + 1);  // any alignment
  std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
  EXPECT_EQ(dbrq::hash_bytes(shifted.data() + 1, bytes.size()), h);
}
