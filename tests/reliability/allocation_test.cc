// A converted model's call allocates only activations (issue 10): no strings, no bookkeeping, and
// nothing that grows with module names. This binary replaces operator new with a counting one that,
// while a test enables it, walks each allocation's call stack and files it as
//   activation  the storage of a tensor an op returns (under dbrq::Storage::allocate),
//   oneDNN      made by oneDNN or its OpenMP runtime themselves (a frame in libdnnl.so / libgomp.so
//               or in oneDNN's C++ API: its execution context and memory handles, outside dbrq's
//               control),
//   dbrq        anything else: bookkeeping by dbrq's own code, which must be none.
// The same model with 2-letter and 300-letter module names must allocate exactly alike.
#include <dlfcn.h>
#include <execinfo.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>

#include "dbrq.h"
#include "tests/test_util.h"

namespace {

struct Counts {
  int64_t activation = 0, onednn = 0, dbrq = 0;
  std::map<std::string, int> dbrq_sites;  // symbolized stacks of dbrq's own allocations
};

thread_local Counts* g_counts = nullptr;  // non-null: counting on this thread
thread_local bool g_in_hook = false;

// A frame of oneDNN or its OpenMP runtime: inside libdnnl.so / libgomp.so (matched on the file's
// base name: a dynamically linked Bazel test also loads dbrq's own `libkernels_Slibdnnl_Uutils.so`,
// which is dbrq's code), or in oneDNN's C++ API (namespace dnnl, header code compiled into dbrq's
// objects: a dnnl::memory handle's reference count).
bool from_onednn(const Dl_info& info) {
  if (info.dli_fname != nullptr) {
    const char* slash = std::strrchr(info.dli_fname, '/');
    const char* base = slash != nullptr ? slash + 1 : info.dli_fname;
    if (std::strncmp(base, "libdnnl.so", 10) == 0 || std::strncmp(base, "libgomp.so", 10) == 0) return true;
  }
  // dnnl::... functions, and library templates instantiated for oneDNN's C handles (the
  // std::shared_ptr<dnnl_memory> inside a dnnl::memory).
  return info.dli_sname != nullptr &&
         (std::strncmp(info.dli_sname, "_ZN4dnnl", 8) == 0 || std::strstr(info.dli_sname, "dnnl_") != nullptr);
}

void classify() {
  g_in_hook = true;
  void* frames[48];
  const int n = backtrace(frames, 48);
  bool activation = false, onednn = false;
  for (int i = 1; i < n; ++i) {
    Dl_info info;
    if (dladdr(frames[i], &info) == 0) continue;
    if (info.dli_sname != nullptr && std::strstr(info.dli_sname, "Storage8allocate") != nullptr) activation = true;
    if (from_onednn(info)) onednn = true;
    // The direct caller of operator new is kernels::mem_of, whose only work is constructing a
    // dnnl::memory: oneDNN's header code (the handle's std::shared_ptr), inlined there in -c opt.
    if (i == 2 && info.dli_sname != nullptr && std::strncmp(info.dli_sname, "_ZN4dbrq7kernels6mem_of", 23) == 0) {
      onednn = true;
    }
  }
  if (activation) {
    ++g_counts->activation;
  } else if (onednn) {
    ++g_counts->onednn;
  } else {
    ++g_counts->dbrq;
    std::string site;
    for (int i = 2; i < n && i < 7; ++i) {
      Dl_info info;
      if (dladdr(frames[i], &info) != 0 && info.dli_sname != nullptr) {
        site += info.dli_sname;
      } else {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "?+%#lx", static_cast<unsigned long>(reinterpret_cast<uintptr_t>(frames[i]) - reinterpret_cast<uintptr_t>(dladdr(frames[i], &info) ? info.dli_fbase : nullptr)));
        site += buf;
      }
      site += " <- ";
    }
    ++g_counts->dbrq_sites[site];
  }
  g_in_hook = false;
}

}  // namespace

// The whole family of (unaligned) operator new / delete, so every pair matches (AddressSanitizer
// checks that memory from one is released by its own counterpart).
void* counted_new(size_t n) {
  if (g_counts != nullptr && !g_in_hook) classify();
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new(size_t n) {
  void* p = counted_new(n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t n) { return operator new(n); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return counted_new(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return counted_new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;

// Names every child `prefix + role`: the same model with short or very long module names.
struct Block : nn::CallableModule<Block> {
  Block(int64_t c, const std::string& prefix) {
    conv1 = register_module(prefix + "conv1", std::make_shared<Conv2d>(c, c, 3, 1, 1, 1, 1, false));
    bn1 = register_module(prefix + "bn1", std::make_shared<BatchNorm2d>(c));
    conv2 = register_module(prefix + "conv2", std::make_shared<Conv2d>(c, c, 3, 1, 1, 1, 1, false));
    bn2 = register_module(prefix + "bn2", std::make_shared<BatchNorm2d>(c));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = relu((*bn1)((*conv1)(x)));
    return relu((*bn2)((*conv2)(y)) + x);
  }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
};

struct Net : nn::CallableModule<Net> {
  explicit Net(const std::string& prefix) {
    stem = register_module(prefix + "stem", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    pool = register_module(prefix + "pool", std::make_shared<nn::MaxPool2dImpl>(2));
    block = register_module(prefix + "block", std::make_shared<Block>(8, prefix));
    side = register_module(prefix + "side", std::make_shared<Conv2d>(8, 8, 1));
    fc = register_module(prefix + "fc", std::make_shared<Linear>(16, 5));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*block)((*pool)(relu((*stem)(x))));
    Tensor z = cat({y, sigmoid((*side)(y))}, 1);  // functional ops, a fixed-parameter table, cat
    z = flatten(adaptive_avg_pool2d(z, {1, 1}), 1);
    return (*fc)(z * 0.5);
  }
  std::shared_ptr<Conv2d> stem, side;
  std::shared_ptr<nn::MaxPool2dImpl> pool;
  std::shared_ptr<Block> block;
  std::shared_ptr<Linear> fc;
};

Counts converted_call_allocations(const std::string& prefix) {
  manual_seed(7);
  Net m(prefix);
  m.eval();
  const Tensor x = randn({2, 3, 16, 16}, 1);
  prepare(m, {x});
  for (int i = 0; i < 3; ++i) m(randn({2, 3, 16, 16}, 2 + i));
  convert(m);
  for (int i = 0; i < 3; ++i) m(x);  // primitives, caches and thread-local buffers are made by now
  Counts c;
  Tensor y;
  g_counts = &c;
  y = m(x);
  g_counts = nullptr;
  EXPECT_EQ(y.dtype(), DType::kF32);
  return c;
}

TEST(Allocation, ConvertedCallAllocatesOnlyActivations) {
  {
    void* frames[4];
    backtrace(frames, 4);  // loads the unwinder before anything is counted
  }
  const Counts c = converted_call_allocations("m");
  std::string sites;
  for (const auto& [s, n] : c.dbrq_sites) sites += std::to_string(n) + "x " + s + "\n";
  EXPECT_EQ(c.dbrq, 0) << "dbrq's own allocations in a converted call:\n" << sites;
  // Every op's output is a new activation: about one storage per op.
  EXPECT_GE(c.activation, 10);
  std::cout << "converted call: " << c.activation << " activation storages, " << c.onednn
            << " allocations inside oneDNN / OpenMP, " << c.dbrq << " by dbrq's own code\n";

  // 300-letter names change nothing.
  const Counts l = converted_call_allocations(std::string(300, 'x'));
  EXPECT_EQ(l.dbrq, 0);
  EXPECT_EQ(l.activation, c.activation);
  EXPECT_EQ(l.onednn, c.onednn);
}

// z = z + y in a loop: the loop's adds are one record (one consumer), and y, the same small
// tensor every iteration, is quantized once per call (the memo compares its values), not once per
// iteration: each iteration allocates only its add's output.
struct AddLoop : nn::CallableModule<AddLoop> {
  explicit AddLoop(int n) : n(n) {}
  Tensor forward(const Tensor& x, const Tensor& y) {
    Tensor z = x;
    for (int i = 0; i < n; ++i) z = z + y;
    return z;
  }
  int n;
};

int64_t add_loop_activations(int n) {
  AddLoop m(n);
  m.eval();
  const Tensor x = randn({1, 64}, 1), y = randn({1, 64}, 2);
  prepare(m, {x, y});
  for (uint64_t s = 0; s < 3; ++s) m(randn({1, 64}, 10 + s), randn({1, 64}, 20 + s));
  convert(m);
  for (int i = 0; i < 3; ++i) m(x, y);
  Counts c;
  g_counts = &c;
  const Tensor z = m(x, y);
  g_counts = nullptr;
  EXPECT_EQ(c.dbrq, 0);
  EXPECT_EQ(z.dtype(), DType::kF32);
  return c.activation;
}

TEST(Allocation, ALoopsUnchangedOperandIsQuantizedOncePerCall) {
  EXPECT_EQ(add_loop_activations(20) - add_loop_activations(10), 10);
}

}  // namespace
}  // namespace dbrq
