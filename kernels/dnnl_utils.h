// Shared oneDNN plumbing for the kernels: engine, per-thread stream, descriptors of dbrq tensors,
// the primitive cache, user-managed scratchpads and error translation. Internal to kernels/.
//
//   PrimitiveKey key("conv2d");
//   key.add(x).add(w).add(params.stride);
//   auto& entry = primitive_cache<ConvEntry>().get_or_create(key, [&] { return make_conv(...); });
//   execute(entry.prim, entry.scratchpad_bytes, {{DNNL_ARG_SRC, mem(x)}, ...});
#pragma once

#include <dnnl.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "core/tensor.h"
#include "core/threading.h"

namespace dbrq::kernels {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dnnl::engine& cpu_engine();

// One stream per calling thread (streams are not thread-safe).
dnnl::stream& thread_stream();

dt to_dnnl(DType t);
// The tensor's logical dims with its real strides (any layout oneDNN can describe).
dnnl::memory::desc desc_of(const Tensor& t);
dnnl::memory::desc desc_of(const Tensor& t, DType as);
// A desc with explicit dims, dtype and layout tag.
dnnl::memory::desc plain_desc(IntArrayRef dims, DType t, tag format);
// Wraps the tensor's memory (no copy).
dnnl::memory mem_of(const dnnl::memory::desc& d, const Tensor& t);
inline dnnl::memory mem_of(const Tensor& t) { return mem_of(desc_of(t), t); }
// Like mem_of, for a desc that lives in a primitive-cache entry: the memory object is made once per
// (desc object, argument) on each thread and pointed at `t`'s data on later calls
// (set_data_handle, ~10 ns; making one costs 250-400 ns, most of it oneDNN's own aligned
// allocations, for every argument of every int8 op). A desc at an address reused by another entry
// is compared in full before its object is reused. Two arguments of one call never share an object
// (the argument is part of the key), nor do two threads (the table is thread-local); it is emptied
// when it reaches 1024 entries.
dnnl::memory reused_mem(const dnnl::memory::desc& d, int arg, const Tensor& t);

// Attributes every dbrq primitive uses: user-managed scratchpad.
dnnl::primitive_attr base_attr();

// A primitive's arguments (DNNL_ARG_* -> memory), kept inline: executing allocates no map.
class ExecArgs {
 public:
  ExecArgs(std::initializer_list<std::pair<int, dnnl::memory>> args) : args_(args.begin(), args.end()) {}
  void emplace(int arg, dnnl::memory m) { args_.emplace_back(arg, std::move(m)); }
  size_t size() const { return args_.size(); }
  const std::pair<int, dnnl::memory>& operator[](size_t i) const { return args_[i]; }

 private:
  absl::InlinedVector<std::pair<int, dnnl::memory>, 8> args_;
};

// Runs a primitive on this thread's stream with a thread-local scratchpad of `scratchpad_bytes`.
void execute(const dnnl::primitive& p, size_t scratchpad_bytes, ExecArgs args);

// Converts a oneDNN failure while creating or running `what` into a dbrq::BackendError.
[[noreturn]] void rethrow_dnnl(const char* what, const dnnl::error& e);

// Cache key: a flat list of integers built from op name, tensor geometry and parameters.
class PrimitiveKey {
 public:
  explicit PrimitiveKey(const char* op) { add_string(op); }
  PrimitiveKey& add(int64_t v) {
    v_.push_back(v);
    return *this;
  }
  PrimitiveKey& add(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v_.push_back(bits);
    return *this;
  }
  PrimitiveKey& add(IntArrayRef vals) {
    v_.push_back(static_cast<int64_t>(vals.size()));
    v_.insert(v_.end(), vals.begin(), vals.end());
    return *this;
  }
  PrimitiveKey& add(const std::array<int64_t, 2>& a) { return add(IntArrayRef(a.data(), 2)); }
  // dtype, sizes and strides (not the data).
  PrimitiveKey& add(const Tensor& t);
  PrimitiveKey& add_string(const char* s);
  IntArrayRef values() const { return IntArrayRef(v_.data(), v_.size()); }
  bool operator==(const PrimitiveKey& o) const { return v_ == o.v_; }
  template <typename H>
  friend H AbslHashValue(H h, const PrimitiveKey& k) {
    return H::combine(std::move(h), k.v_);
  }

 private:
  // Inline: building a key on every call allocates nothing (keys hold ~10-40 values).
  absl::InlinedVector<int64_t, 48> v_;
};

// A bounded LRU map from key to V, safe to use from several threads. Values are shared_ptr so a
// caller keeps using an entry while another thread evicts it.
template <typename V>
class LruCache {
 public:
  explicit LruCache(size_t capacity) : capacity_(capacity) {}

  // `create` runs on a miss only (a template: a std::function would allocate per call).
  template <typename Create>
  std::shared_ptr<V> get_or_create(const PrimitiveKey& key, Create&& create) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end()) {
        order_.splice(order_.begin(), order_, it->second.second);
        ++hits_;
        return it->second.first;
      }
    }
    apply_thread_setting();  // oneDNN sizes its work split by the creating thread's team size
    std::shared_ptr<V> value = create();  // outside the lock: creation can take milliseconds
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second.first;  // another thread won the race
    order_.push_front(key);
    map_.emplace(key, std::make_pair(value, order_.begin()));
    ++misses_;
    while (map_.size() > capacity_) {
      map_.erase(order_.back());
      order_.pop_back();
    }
    return value;
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
  }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
    order_.clear();
  }

 private:
  std::mutex mu_;
  size_t capacity_;
  std::list<PrimitiveKey> order_;  // most recent first
  absl::flat_hash_map<PrimitiveKey, std::pair<std::shared_ptr<V>, typename std::list<PrimitiveKey>::iterator>> map_;
  uint64_t hits_ = 0, misses_ = 0;
};

// A created primitive with what executing it needs.
struct PrimitiveEntry {
  dnnl::primitive prim;
  size_t scratchpad_bytes = 0;
  dnnl::memory::desc src_desc, weights_desc, dst_desc;  // as the primitive wants them
  bool reference_impl = false;  // oneDNN chose its reference ("ref:") implementation
};

// The process-wide cache of eager primitives (bounded; see kernels/cache_stats.h).
LruCache<PrimitiveEntry>& primitive_cache();

// Weights reordered into the layout a primitive wants, cached by (storage, offset, version, desc):
// eager fp32 convs and linears reorder each weight once, not once per call. An entry dies with its
// storage or when the storage's version changes (any write through dbrq's API).
dnnl::memory packed_weights(const Tensor& w, const dnnl::memory::desc& user_desc, const dnnl::memory::desc& want);

// Scalar reorder of `src` into `dst` (same sizes); converts dtypes, keeps each side's layout.
void reorder_into(const Tensor& src, Tensor& dst);

}  // namespace dbrq::kernels
