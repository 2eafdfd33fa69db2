#include "kernels/dnnl_utils.h"

#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"

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

namespace {

// Descriptors through the C API, from arrays on the stack (the C++ constructors take dims vectors,
// an allocation per descriptor on every call).
dnnl::memory::desc checked(dnnl_status_t status, const dnnl_memory_desc_t& md, const char* what) {
  if (status != dnnl_success) {
    DBRQ_THROW(BackendError, "oneDNN failed describing ", what, " (status ", static_cast<int>(status), ")");
  }
  return dnnl::memory::desc(md);
}

}  // namespace

dnnl::memory::desc desc_of(const Tensor& t, DType as) {
  dnnl_memory_desc_t md;
  const int64_t one = 1;
  const bool scalar = t.dim() == 0;  // oneDNN has no 0-D tensors
  const int n = scalar ? 1 : static_cast<int>(t.dim());
  const dnnl_status_t st =
      dnnl_memory_desc_init_by_strides(&md, n, scalar ? &one : t.sizes().data(), static_cast<dnnl_data_type_t>(to_dnnl(as)),
                                       scalar ? &one : t.strides().data());
  return checked(st, md, "a tensor");
}

dnnl::memory::desc plain_desc(IntArrayRef dims, DType t, tag format) {
  dnnl_memory_desc_t md;
  const dnnl_status_t st =
      dnnl_memory_desc_init_by_tag(&md, static_cast<int>(dims.size()), dims.data(),
                                   static_cast<dnnl_data_type_t>(to_dnnl(t)), static_cast<dnnl_format_tag_t>(format));
  return checked(st, md, "a plain layout");
}

dnnl::memory mem_of(const dnnl::memory::desc& d, const Tensor& t) {
  // oneDNN takes a non-const pointer for every argument; inputs are only read.
  return dnnl::memory(d, cpu_engine(), const_cast<void*>(t.data_ptr()));
}

dnnl::memory reused_mem(const dnnl::memory::desc& d, int arg, const Tensor& t) {
  struct Slot {
    dnnl::memory::desc desc;
    dnnl::memory mem;
  };
  constexpr size_t kMaxSlots = 1024;
  thread_local absl::flat_hash_map<std::pair<const void*, int>, Slot> table;
  if (table.size() >= kMaxSlots) table.clear();
  void* data = const_cast<void*>(t.data_ptr());  // oneDNN takes a non-const pointer; inputs are only read
  auto [it, fresh] = table.try_emplace(std::make_pair(static_cast<const void*>(&d), arg));
  Slot& slot = it->second;
  if (fresh || slot.desc != d) {
    slot.desc = d;
    slot.mem = dnnl::memory(d, cpu_engine(), data);
  } else {
    slot.mem.set_data_handle(data);
  }
  return slot.mem;
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

void execute(const dnnl::primitive& p, size_t scratchpad_bytes, ExecArgs args) {
  apply_thread_setting();
  if (scratchpad_bytes > 0) {
    // Grow-only per calling thread: oneDNN's worker threads never call execute, and two calling
    // threads never share a scratchpad. Its memory object is made once per size, not per call.
    thread_local Scratchpad pad;
    thread_local dnnl::memory pad_mem;
    thread_local size_t pad_mem_bytes = 0;
    if (pad.bytes < scratchpad_bytes) {
      pad.storage = Storage::allocate(scratchpad_bytes);
      pad.bytes = scratchpad_bytes;
    }
    if (pad_mem_bytes != pad.bytes) {
      // Described with the whole buffer's size: oneDNN takes a scratchpad at least as large as it asks.
      const int64_t n = static_cast<int64_t>(pad.bytes);
      pad_mem = dnnl::memory(plain_desc(IntArrayRef(&n, 1), DType::kU8, tag::x), cpu_engine(), pad.storage->data());
      pad_mem_bytes = pad.bytes;
    }
    args.emplace(DNNL_ARG_SCRATCHPAD, pad_mem);
  }
  // The C API takes the arguments as an array (the C++ one as an unordered_map).
  dnnl_exec_arg_t c_args[16];
  DBRQ_CHECK(args.size() <= 16, "too many primitive arguments");
  for (size_t i = 0; i < args.size(); ++i) c_args[i] = {args[i].first, args[i].second.get()};
  dnnl_status_t st = dnnl_primitive_execute(p.get(), thread_stream().get(), static_cast<int>(args.size()), c_args);
  if (st == dnnl_success) st = dnnl_stream_wait(thread_stream().get());
  if (st != dnnl_success) rethrow_dnnl("executing a primitive", dnnl::error(st, "could not execute a primitive"));
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
    // Memory the caller owns (Tensor::from_blob) may be rewritten without the storage version
    // moving: packed on every call, never served from the cache (a refilled weight buffer ran the
    // first call's weights).
    if (w.storage()->wraps_memory()) return pack(w, user, want);
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
    dnnl::memory packed = pack(w, user, want);
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
  static dnnl::memory pack(const Tensor& w, const dnnl::memory::desc& user, const dnnl::memory::desc& want) {
    dnnl::memory packed(want, cpu_engine());
    dnnl::memory src = mem_of(user, w);
    apply_thread_setting();
    dnnl::reorder(src, packed).execute(thread_stream(), src, packed);
    thread_stream().wait();
    return packed;
  }

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
  // Reorder primitives are cached like every other (creating one costs far more than small copies).
  PrimitiveKey key("reorder");
  key.add(src).add(dst).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    try {
      const dnnl::memory::desc src_md = desc_of(src), dst_md = desc_of(dst);
      dnnl::reorder::primitive_desc pd(cpu_engine(), src_md, cpu_engine(), dst_md, base_attr());
      auto e = std::make_shared<PrimitiveEntry>();
      e->prim = dnnl::reorder(pd);
      e->scratchpad_bytes = pd.scratchpad_desc().get_size();
      e->src_desc = src_md;
      e->dst_desc = dst_md;
      return e;
    } catch (const dnnl::error& err) {
      rethrow_dnnl("creating a reorder", err);
    }
  });
  // The key holds both layouts, so the entry's descs are those of src and dst: their memory objects
  // are made once per thread (a converted call's residual copy runs here every call).
  execute(entry->prim, entry->scratchpad_bytes,
          {{DNNL_ARG_FROM, reused_mem(entry->src_desc, DNNL_ARG_FROM, src)},
           {DNNL_ARG_TO, reused_mem(entry->dst_desc, DNNL_ARG_TO, dst)}});
}

}  // namespace dbrq::kernels
