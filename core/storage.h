// Reference-counted, 64-byte aligned tensor storage with a caching allocator.
//
//   auto s = dbrq::Storage::allocate(1 << 20);   // reuses a cached block when one fits
//   float* p = static_cast<float*>(s->data());
//
// Why a cache of our own: glibc returns large buffers to the kernel (mmap/munmap), and every
// inference then pays page faults for its activations (15% of ResNet-18 batch 8 here). Freed
// blocks of at least kMinCachedBytes (64 KiB) go to a size-keyed free list bounded by
// set_allocator_cache_limit(). Smaller blocks are rounded up to a power of two and kept on the
// freeing thread's own lists (no lock; at most 32 blocks per size and 1 MiB per thread), because
// glibc's aligned allocation of a small block cost ~22% of a 64-element converted op.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace dbrq {

class Storage {
 public:
  // Allocates `nbytes` (rounded up to 64) aligned to 64 bytes. Contents are uninitialized.
  static std::shared_ptr<Storage> allocate(size_t nbytes);
  // Wraps memory owned elsewhere; `release` runs when the storage dies (may be empty).
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, std::function<void()> release);
  // Allocates like allocate(), with contents computed on first access: `fill.fn(fill, data)` runs
  // once, when data() is first called (from any thread; the others wait), and never if nobody
  // reads the storage. A converted model's f32 outputs are filled this way (kernels::dequantize_lazy),
  // so an output the caller only hands back to the model (a key / value cache) is never dequantized.
  struct LazyFill;
  static std::shared_ptr<Storage> allocate(size_t nbytes, LazyFill fill);

  // Constructed through allocate() and wrap() only: Private's constructor is private and
  // user-provided (a defaulted one would let `Private{}` aggregate-initialize from anywhere).
  struct Private {
   private:
    Private() {}
    friend class Storage;
  };
  explicit Storage(Private);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const {
    if (__builtin_expect(lazy_state_.load(std::memory_order_acquire) != kReady, 0)) materialize();
    return data_;
  }
  // False while a lazily filled storage has not run its fill (or after supersede()).
  bool materialized() const { return lazy_state_.load(std::memory_order_acquire) == kReady; }
  // Marks the contents as replaced elsewhere: an in-place op after convert wrote its result into
  // new storage that its parameters cannot share (tracer::write_back_inplace), so every other
  // tensor still on this storage holds stale values. From then on data() raises ControlFlowError.
  void supersede() { lazy_state_.store(kSuperseded, std::memory_order_release); }
  bool superseded() const { return lazy_state_.load(std::memory_order_acquire) == kSuperseded; }
  size_t nbytes() const { return nbytes_; }
  // Memory owned elsewhere (wrap(), Tensor::from_blob): its owner can read and write it directly.
  bool wraps_memory() const { return !owned_; }

  // Bumped by every write through dbrq's API (in-place ops, copies, load_state_dict, mutable data
  // access). Caches of derived data (prepacked weights) compare it to detect stale entries.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  void bump_version() { version_.fetch_add(1, std::memory_order_acq_rel); }
  // Unique for the process's lifetime (unlike the address, which a later storage may reuse).
  uint64_t id() const { return id_; }
  // Holds a parameter or buffer of a prepared model (set by prepare, never cleared). The tracer
  // looks a storage up in its tables of parameters only when this is set, so the tensors that
  // are not parameters (nearly all of a converted call's) cost no lookup.
  void mark_model_state() { model_state_.store(true, std::memory_order_relaxed); }
  bool model_state() const { return model_state_.load(std::memory_order_relaxed); }

 private:
  enum : int { kReady = 0, kPending = 1, kFilling = 2, kSuperseded = 3 };
  void materialize() const;
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  int8_t small_class_ = -1;  // the per-thread size class of a small block; -1: the large cache
  bool owned_ = true;        // false for wrapped memory
  std::atomic<bool> model_state_{false};
  std::function<void()> release_;
  std::atomic<uint64_t> version_{0};
  uint64_t id_;
  mutable std::atomic<int> lazy_state_{kReady};
  std::unique_ptr<LazyFill> fill_;  // lazy storages only; read by the one thread that fills
};

// What a lazily filled storage runs on first access: fn(*this, data). Plain data and a function
// pointer, so that describing the fill allocates nothing of its own (a converted call's outputs
// allocate only their storage). The fields describe a source range of another storage, kept alive
// until the fill has run.
struct Storage::LazyFill {
  void (*fn)(const LazyFill& fill, void* data) = nullptr;
  std::shared_ptr<Storage> source;
  uint64_t source_version = 0;  // the source's version when the fill was described
  int64_t offset = 0;           // in elements of the source's dtype
  int64_t numel = 0;
  int dtype = 0;                // the source's DType
  double scale = 0;
  int64_t zero_point = 0;
};

struct AllocatorStats {
  uint64_t allocations = 0;   // Storage::allocate calls
  uint64_t cache_hits = 0;    // served from the free list
  uint64_t bytes_cached = 0;  // currently idle in the free list
  uint64_t bytes_in_use = 0;  // currently held by live storages (large blocks)
  uint64_t small_cache_hits = 0;  // small blocks served from a thread's own lists
};

AllocatorStats allocator_stats();
// Upper bound on idle cached large-block bytes (default 1 GiB). 0 disables caching (small blocks
// too) and frees the cache as release_cached_memory() does.
void set_allocator_cache_limit(size_t bytes);
// Returns every idle cached block to the system: at once for the large cache and the calling
// thread's small lists, at their next allocation or free for other threads' small lists.
void release_cached_memory();

// A 64-bit hash of `n` bytes, the same on every platform and in every process (little-endian
// 64-bit words; 4 lanes, ~10 GB/s). Not cryptographic: it tells values calibration saw from other
// values (tracer: calibrated parameter values), not adversarial inputs.
uint64_t hash_bytes(const void* data, size_t n);

}  // namespace dbrq
