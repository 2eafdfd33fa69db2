// Reference-counted, 64-byte aligned tensor storage with a caching allocator.
//
//   auto s = dbrq::Storage::allocate(1 << 20);   // reuses a cached block when one fits
//   float* p = static_cast<float*>(s->data());
//
// Why a cache of our own: glibc returns large buffers to the kernel (mmap/munmap), and every
// inference then pays page faults for its activations (15% of ResNet-18 batch 8 here). Freed
// blocks of at least kMinCachedBytes go to a size-keyed free list bounded by
// set_allocator_cache_limit(); smaller blocks go straight back to malloc.
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

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }

  // Bumped by every write through dbrq's API (in-place ops, copies, load_state_dict, mutable data
  // access). Caches of derived data (prepacked weights) compare it to detect stale entries.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  void bump_version() { version_.fetch_add(1, std::memory_order_acq_rel); }
  // Unique for the process's lifetime (unlike the address, which a later storage may reuse).
  uint64_t id() const { return id_; }

 private:
  Storage();
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  bool cached_ = false;  // came from the caching allocator
  bool owned_ = true;    // false for wrapped memory
  std::function<void()> release_;
  std::atomic<uint64_t> version_{0};
  uint64_t id_;
};

struct AllocatorStats {
  uint64_t allocations = 0;   // Storage::allocate calls
  uint64_t cache_hits = 0;    // served from the free list
  uint64_t bytes_cached = 0;  // currently idle in the free list
  uint64_t bytes_in_use = 0;  // currently held by live storages
};

AllocatorStats allocator_stats();
// Upper bound on idle cached bytes (default 1 GiB). 0 disables caching and frees the cache.
void set_allocator_cache_limit(size_t bytes);
// Returns every idle cached block to the system.
void release_cached_memory();

}  // namespace dbrq
