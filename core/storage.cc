#include "core/storage.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <thread>

namespace dbrq {
namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kMinCachedBytes = 64 * 1024;
// A cached block may serve a request this much smaller than itself (keeps waste bounded).
constexpr size_t kMaxWasteRatio = 2;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

class CachingAllocator {
 public:
  void* allocate(size_t nbytes, bool* cached) {
    ++allocations_;
    *cached = nbytes >= kMinCachedBytes;
    if (*cached) {
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
        return p;
      }
    }
    void* p = std::aligned_alloc(kAlignment, round_up(nbytes == 0 ? kAlignment : nbytes, kAlignment));
    if (p == nullptr) throw std::bad_alloc();
    if (*cached) {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[p] = nbytes;
      bytes_in_use_ += nbytes;
    }
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
    free_.emplace(nbytes, p);
    bytes_cached_ += nbytes;
  }

  void set_limit(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
    trim_locked(limit_);
  }

  void release_all() {
    std::lock_guard<std::mutex> lock(mu_);
    trim_locked(0);
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {allocations_.load(), cache_hits_, bytes_cached_, bytes_in_use_};
  }

 private:
  void trim_locked(size_t keep) {
    // Free the largest blocks first: they are the ones most worth returning.
    while (bytes_cached_ > keep && !free_.empty()) {
      auto it = std::prev(free_.end());
      bytes_cached_ -= it->first;
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
  std::shared_ptr<Storage> s(new Storage());
  s->nbytes_ = nbytes;
  s->data_ = allocator().allocate(nbytes, &s->cached_);
  return s;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, std::function<void()> release) {
  std::shared_ptr<Storage> s(new Storage());
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
    std::this_thread::yield();  // another thread is filling
  }
}

Storage::Storage() {
  static std::atomic<uint64_t> next{1};
  id_ = next.fetch_add(1, std::memory_order_relaxed);
}

Storage::~Storage() {
  if (!owned_) {
    if (release_) release_();
  } else if (cached_) {
    allocator().release(data_);
  } else {
    std::free(data_);
  }
}

AllocatorStats allocator_stats() { return allocator().stats(); }
void set_allocator_cache_limit(size_t bytes) { allocator().set_limit(bytes); }
void release_cached_memory() { allocator().release_all(); }

}  // namespace dbrq
