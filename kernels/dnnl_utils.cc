#include "kernels/dnnl_utils.h"

#include <string_view>

namespace dbrq::kernels {

dnnl::engine& cpu_engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

dt to_dnnl(DType t) {
  switch (t) {
    case DType::kF32:
      return dt::f32;
    case DType::kS8:
      return dt::s8;
    case DType::kU8:
      return dt::u8;
    case DType::kS32:
      return dt::s32;
    case DType::kBF16:
      return dt::bf16;
    case DType::kS64:
      break;
  }
  DBRQ_THROW(DTypeError, "oneDNN kernels do not take dtype ", dtype_name(t));
}

dnnl::memory::desc desc_of(const Tensor& t) { return desc_of(t, t.dtype()); }

dnnl::memory::desc desc_of(const Tensor& t, DType as) {
  dnnl::memory::dims dims(t.sizes().begin(), t.sizes().end());
  dnnl::memory::dims strides(t.strides().begin(), t.strides().end());
  if (dims.empty()) {  // oneDNN has no 0-D tensors
    dims = {1};
    strides = {1};
  }
  return dnnl::memory::desc(dims, to_dnnl(as), strides);
}

dnnl::memory::desc plain_desc(IntArrayRef dims, DType t, tag format) {
  return dnnl::memory::desc(dnnl::memory::dims(dims.begin(), dims.end()), to_dnnl(t), format);
}

dnnl::memory mem_of(const dnnl::memory::desc& d, const Tensor& t) {
  // oneDNN takes a non-const pointer for every argument; inputs are only read.
  return dnnl::memory(d, cpu_engine(), const_cast<void*>(t.data_ptr()));
}

dnnl::primitive_attr base_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

namespace {

struct Scratchpad {
  std::shared_ptr<Storage> storage;
  size_t bytes = 0;
};

}  // namespace

void execute(const dnnl::primitive& p, size_t scratchpad_bytes, std::unordered_map<int, dnnl::memory> args) {
  apply_thread_setting();
  if (scratchpad_bytes > 0) {
    // Grow-only per calling thread: oneDNN's worker threads never call execute, and two calling
    // threads never share a scratchpad.
    thread_local Scratchpad pad;
    if (pad.bytes < scratchpad_bytes) {
      pad.storage = Storage::allocate(scratchpad_bytes);
      pad.bytes = scratchpad_bytes;
    }
    dnnl::memory::desc d({static_cast<int64_t>(scratchpad_bytes)}, dt::u8, tag::x);
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(d, cpu_engine(), pad.storage->data()));
  }
  try {
    p.execute(thread_stream(), args);
    thread_stream().wait();
  } catch (const dnnl::error& e) {
    rethrow_dnnl("executing a primitive", e);
  }
}

void rethrow_dnnl(const char* what, const dnnl::error& e) {
  DBRQ_THROW(BackendError, "oneDNN failed ", what, ": ", e.what(), " (status ", static_cast<int>(e.status), ")");
}

PrimitiveKey& PrimitiveKey::add(const Tensor& t) {
  v_.push_back(static_cast<int64_t>(t.dtype()));
  add(t.sizes());
  add(t.strides());
  return *this;
}

PrimitiveKey& PrimitiveKey::add_string(const char* s) {
  v_.push_back(static_cast<int64_t>(std::hash<std::string_view>()(s)));
  return *this;
}

LruCache<PrimitiveEntry>& primitive_cache() {
  static auto* cache = new LruCache<PrimitiveEntry>(4096);
  return *cache;
}

namespace {

struct PackedEntry {
  std::weak_ptr<Storage> storage;
  uint64_t version = 0;
  dnnl::memory packed;
};

class WeightPackCache {
 public:
  dnnl::memory get(const Tensor& w, const dnnl::memory::desc& user, const dnnl::memory::desc& want) {
    std::string key(reinterpret_cast<const char*>(&want.data), sizeof(want.data));
    // The user layout too: two views at the same address with different strides differ in content.
    key.append(reinterpret_cast<const char*>(&user.data), sizeof(user.data));
    const void* ptr = w.storage().get();
    key.append(reinterpret_cast<const char*>(&ptr), sizeof(ptr));
    const int64_t off = w.storage_offset();
    key.append(reinterpret_cast<const char*>(&off), sizeof(off));
    const uint64_t version = w.storage()->version();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(key);
      if (it != map_.end() && it->second.version == version && it->second.storage.lock() == w.storage()) {
        return it->second.packed;
      }
    }
    dnnl::memory packed(want, cpu_engine());
    dnnl::memory src = mem_of(user, w);
    apply_thread_setting();
    dnnl::reorder(src, packed).execute(thread_stream(), src, packed);
    thread_stream().wait();
    std::lock_guard<std::mutex> lock(mu_);
    bytes_ += want.get_size();
    if (bytes_ > kMaxBytes) {  // rare: a model larger than the cache; start over
      map_.clear();
      bytes_ = want.get_size();
    }
    map_[key] = PackedEntry{w.storage(), version, packed};
    return packed;
  }

 private:
  static constexpr size_t kMaxBytes = size_t{512} << 20;
  std::mutex mu_;
  absl::flat_hash_map<std::string, PackedEntry> map_;
  size_t bytes_ = 0;
};

}  // namespace

dnnl::memory packed_weights(const Tensor& w, const dnnl::memory::desc& user_desc, const dnnl::memory::desc& want) {
  if (want == user_desc) return mem_of(user_desc, w);
  static auto* cache = new WeightPackCache();
  try {
    return cache->get(w, user_desc, want);
  } catch (const dnnl::error& e) {
    rethrow_dnnl("reordering weights", e);
  }
}

void reorder_into(const Tensor& src, Tensor& dst) {
  try {
    dnnl::memory s = mem_of(src), d = mem_of(dst);
    apply_thread_setting();
    dnnl::reorder(s, d).execute(thread_stream(), s, d);
    thread_stream().wait();
  } catch (const dnnl::error& e) {
    rethrow_dnnl("reordering", e);
  }
}

}  // namespace dbrq::kernels
