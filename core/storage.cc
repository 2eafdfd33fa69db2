#include "core/storage.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "core/error.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace dbrq {
namespace {

// Idle cached blocks (both caches) are poisoned for AddressSanitizer: they never go back to malloc,
// whose freed-memory check would otherwise catch a read of a dead tensor's storage.
#if defined(__SANITIZE_ADDRESS__)
void mark_idle(void* p, size_t n) { ASAN_POISON_MEMORY_REGION(p, n); }
void mark_in_use(void* p, size_t n) { ASAN_UNPOISON_MEMORY_REGION(p, n); }
#else
void mark_idle(void*, size_t) {}
void mark_in_use(void*, size_t) {}
#endif

constexpr size_t kAlignment = 64;
constexpr size_t kMinCachedBytes = 64 * 1024;
// A cached block may serve a request this much smaller than itself (keeps waste bounded).
constexpr size_t kMaxWasteRatio = 2;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// ---- small blocks: per-thread free lists ------------------------------------------------------
//
// Blocks below kMinCachedBytes are rounded up to a power of two (64 B .. 64 KiB, one class each)
// and, when freed, kept on the freeing thread's list for that class, so that a converted model's
// small activations (a decoder's one-token steps, a GRU's gates) cost a pop and a push instead of
// glibc's memalign (which splits and consolidates chunks: ~22% of a 64-element int8 op before).
// No locks: each thread touches only its own lists. A block may be freed by another thread than
// the one that allocated it; it then joins the freeing thread's list. Each list is bounded
// (kSmallSlots blocks and kSmallBytesPerThread bytes over all classes); beyond that, blocks go
// back to malloc. release_cached_memory() and set_allocator_cache_limit() reach other threads'
// lists through an epoch: each thread empties its lists at its next allocation or free.
constexpr int kSmallClasses = 11;  // 64 B << 10 = 64 KiB: every size below kMinCachedBytes
constexpr int kSmallSlots = 32;
constexpr size_t kSmallBytesPerThread = size_t{1} << 20;

int small_class(size_t nbytes) {
  size_t size = kAlignment;
  int c = 0;
  while (size < nbytes) {
    size <<= 1;
    ++c;
  }
  return c;
}
size_t small_class_bytes(int c) { return kAlignment << c; }

std::atomic<uint64_t> g_small_epoch{0};
std::atomic<bool> g_small_enabled{true};
// Counts of threads that have exited.
std::atomic<uint64_t> g_small_hits_retired{0};
std::atomic<uint64_t> g_small_allocations_retired{0};

class SmallCache;
std::mutex g_small_registry_mu;
std::vector<SmallCache*>* g_small_registry = new std::vector<SmallCache*>();  // leaked on purpose

class SmallCache {
 public:
  SmallCache() : epoch_(g_small_epoch.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(g_small_registry_mu);
    g_small_registry->push_back(this);
  }
  ~SmallCache() {
    drop();
    {
      std::lock_guard<std::mutex> lock(g_small_registry_mu);
      auto& r = *g_small_registry;
      for (size_t i = 0; i < r.size(); ++i) {
        if (r[i] == this) {
          r[i] = r.back();
          r.pop_back();
          break;
        }
      }
      g_small_hits_retired.fetch_add(hits(), std::memory_order_relaxed);
      g_small_allocations_retired.fetch_add(allocations(), std::memory_order_relaxed);
    }
    destroyed() = true;
  }

  // A block of class c, or nullptr when this thread's list is empty.
  void* pop(int c) {
    sync();
    if (count_[c] == 0) return nullptr;
    bytes_ -= small_class_bytes(c);
    bump(hits_);
    void* p = slots_[c][--count_[c]];
    mark_in_use(p, small_class_bytes(c));
    return p;
  }
  // Keeps the block of class c; false when the list is full (the caller frees it).
  bool push(int c, void* p) {
    sync();
    const size_t b = small_class_bytes(c);
    if (!g_small_enabled.load(std::memory_order_relaxed) || count_[c] == kSmallSlots ||
        bytes_ + b > kSmallBytesPerThread) {
      return false;
    }
    mark_idle(p, b);
    slots_[c][count_[c]++] = p;
    bytes_ += b;
    return true;
  }
  void drop() {
    for (int c = 0; c < kSmallClasses; ++c) {
      while (count_[c] > 0) {
        void* p = slots_[c][--count_[c]];
        mark_in_use(p, small_class_bytes(c));
        std::free(p);
      }
    }
    bytes_ = 0;
  }
  uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  uint64_t allocations() const { return allocations_.load(std::memory_order_relaxed); }
  void count_allocation() { bump(allocations_); }

  // Set once this thread's cache is gone (frees during later thread-exit destructors use malloc).
  static bool& destroyed() {
    static thread_local bool d = false;
    return d;
  }

 private:
  void sync() {
    const uint64_t e = g_small_epoch.load(std::memory_order_acquire);
    if (__builtin_expect(e != epoch_, 0)) {
      drop();
      epoch_ = e;
    }
  }
  void* slots_[kSmallClasses][kSmallSlots];
  int count_[kSmallClasses] = {};
  size_t bytes_ = 0;
  uint64_t epoch_;
  // Written by their thread only (a plain load and store), read by allocator_stats().
  static void bump(std::atomic<uint64_t>& n) { n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> allocations_{0};
};

SmallCache* small_cache() {
  if (SmallCache::destroyed()) return nullptr;
  static thread_local SmallCache cache;
  return &cache;
}

struct SmallCounts {
  uint64_t allocations = 0, hits = 0;
};
SmallCounts small_counts() {
  std::lock_guard<std::mutex> lock(g_small_registry_mu);
  SmallCounts n{g_small_allocations_retired.load(std::memory_order_relaxed),
                g_small_hits_retired.load(std::memory_order_relaxed)};
  for (const SmallCache* c : *g_small_registry) {
    n.allocations += c->allocations();
    n.hits += c->hits();
  }
  return n;
}

void* allocate_small(int c) {
  SmallCache* cache = small_cache();
  if (cache != nullptr) {
    cache->count_allocation();
    if (void* p = cache->pop(c)) return p;
  }
  void* p = std::aligned_alloc(kAlignment, small_class_bytes(c));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void release_small(int c, void* p) {
  SmallCache* cache = small_cache();
  if (cache == nullptr || !cache->push(c, p)) std::free(p);
}

// Empties this thread's small lists now and every other thread's at its next allocation or free.
void drop_small_caches() {
  g_small_epoch.fetch_add(1, std::memory_order_acq_rel);
  if (SmallCache* cache = small_cache()) cache->drop();
}

class CachingAllocator {
 public:
  // Blocks of at least kMinCachedBytes.
  void* allocate(size_t nbytes) {
    ++allocations_;
    nbytes = round_up(nbytes, 4096);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(nbytes);
    if (it != free_.end() && it->first <= nbytes * kMaxWasteRatio) {
      void* p = it->second;
      bytes_cached_ -= it->first;
      bytes_in_use_ += it->first;
      sizes_[p] = it->first;
      free_.erase(it);
      ++cache_hits_;
      mark_in_use(p, sizes_[p]);
      return p;
    }
    void* p = std::aligned_alloc(kAlignment, nbytes);
    if (p == nullptr) throw std::bad_alloc();
    sizes_[p] = nbytes;
    bytes_in_use_ += nbytes;
    return p;
  }

  void release(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(p);
    size_t nbytes = it->second;
    sizes_.erase(it);
    bytes_in_use_ -= nbytes;
    if (bytes_cached_ + nbytes > limit_) {
      std::free(p);
      return;
    }
    mark_idle(p, nbytes);
    free_.emplace(nbytes, p);
    bytes_cached_ += nbytes;
  }

  void set_limit(size_t bytes) {
    g_small_enabled.store(bytes > 0, std::memory_order_relaxed);
    if (bytes == 0) drop_small_caches();
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
    trim_locked(limit_);
  }

  void release_all() {
    drop_small_caches();
    std::lock_guard<std::mutex> lock(mu_);
    trim_locked(0);
  }

  AllocatorStats stats() {
    const SmallCounts small = small_counts();
    std::lock_guard<std::mutex> lock(mu_);
    return {allocations_.load() + small.allocations, cache_hits_, bytes_cached_, bytes_in_use_, small.hits};
  }

 private:
  void trim_locked(size_t keep) {
    // Free the largest blocks first: they are the ones most worth returning.
    while (bytes_cached_ > keep && !free_.empty()) {
      auto it = std::prev(free_.end());
      bytes_cached_ -= it->first;
      mark_in_use(it->second, it->first);
      std::free(it->second);
      free_.erase(it);
    }
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  std::map<void*, size_t> sizes_;  // live cached blocks and their rounded sizes
  std::atomic<uint64_t> allocations_{0};
  uint64_t cache_hits_ = 0;
  size_t bytes_cached_ = 0;
  size_t bytes_in_use_ = 0;
  size_t limit_ = size_t{1} << 30;
};

CachingAllocator& allocator() {
  // Leaked on purpose: storages may die during static destruction.
  static auto* a = new CachingAllocator();
  return *a;
}

}  // namespace

std::shared_ptr<Storage> Storage::allocate(size_t nbytes) {
  auto s = std::make_shared<Storage>(Private{});
  s->nbytes_ = nbytes;
  if (nbytes < kMinCachedBytes) {
    s->small_class_ = static_cast<int8_t>(small_class(nbytes));
    s->data_ = allocate_small(s->small_class_);
  } else {
    s->data_ = allocator().allocate(nbytes);
  }
  return s;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, std::function<void()> release) {
  auto s = std::make_shared<Storage>(Private{});
  s->data_ = data;
  s->nbytes_ = nbytes;
  s->release_ = std::move(release);
  s->owned_ = false;
  return s;
}

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, LazyFill fill) {
  std::shared_ptr<Storage> s = allocate(nbytes);
  s->fill_ = std::make_unique<LazyFill>(std::move(fill));
  s->lazy_state_.store(kPending, std::memory_order_release);
  return s;
}

void Storage::materialize() const {
  for (;;) {
    int state = kPending;
    if (lazy_state_.compare_exchange_strong(state, kFilling, std::memory_order_acq_rel)) {
      try {
        fill_->fn(*fill_, data_);
      } catch (...) {
        lazy_state_.store(kPending, std::memory_order_release);  // the next access tries again
        throw;
      }
      fill_->source.reset();  // the source is no longer needed
      lazy_state_.store(kReady, std::memory_order_release);
      return;
    }
    if (state == kReady) return;
    if (state == kSuperseded) {
      DBRQ_THROW(ControlFlowError, "tensor values were replaced in place after convert: an in-place op on another "
                 "tensor sharing this storage (a copy of the handle, or a view) computed int8 values with other "
                 "parameters, which live in the tensor it returned, so this one holds stale values. Read the tensor "
                 "the in-place op was called on, or write the op out of place (y = y + z, not y += z)");
    }
    std::this_thread::yield();  // another thread is filling
  }
}

Storage::Storage(Private) {
  // Ids are taken from the shared counter in blocks, so that a storage costs no atomic operation.
  constexpr uint64_t kBlock = 1024;
  static std::atomic<uint64_t> next{1};
  static thread_local uint64_t cur = 0, end = 0;
  if (cur == end) {
    cur = next.fetch_add(kBlock, std::memory_order_relaxed);
    end = cur + kBlock;
  }
  id_ = cur++;
}

Storage::~Storage() {
  if (!owned_) {
    if (release_) release_();
  } else if (small_class_ >= 0) {
    release_small(small_class_, data_);
  } else {
    allocator().release(data_);
  }
}

AllocatorStats allocator_stats() { return allocator().stats(); }

namespace {

constexpr uint64_t kHashPrime1 = 0x9E3779B185EBCA87ull, kHashPrime2 = 0xC2B2AE3D27D4EB4Full;

uint64_t hash_round(uint64_t acc, uint64_t word) {
  acc += word * kHashPrime2;
  acc = (acc << 31) | (acc >> 33);
  return acc * kHashPrime1;
}

uint64_t load_le64(const unsigned char* p) {
  uint64_t w = 0;
  for (int i = 7; i >= 0; --i) w = (w << 8) | p[i];  // compiles to one load on little-endian targets
  return w;
}

}  // namespace

uint64_t hash_bytes(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {kHashPrime1 + kHashPrime2, kHashPrime2, 0, 0 - kHashPrime1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) lane[k] = hash_round(lane[k], load_le64(p + i + 8 * k));
  }
  uint64_t h = static_cast<uint64_t>(n) * kHashPrime1;
  for (int k = 0; k < 4; ++k) h = hash_round(h ^ lane[k], static_cast<uint64_t>(k + 1));
  for (; i + 8 <= n; i += 8) h = hash_round(h, load_le64(p + i));
  for (; i < n; ++i) h = hash_round(h, p[i]);
  h ^= h >> 33;
  h *= kHashPrime2;
  h ^= h >> 29;
  return h;
}
void set_allocator_cache_limit(size_t bytes) { allocator().set_limit(bytes); }
void release_cached_memory() { allocator().release_all(); }

}  // namespace dbrq
