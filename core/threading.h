// Thread settings: one knob for every parallel kernel.
//
//   dbrq::set_num_threads(2);          // all later ops, on every calling thread
//   int n = dbrq::get_num_threads();   // defaults to the number of cores
//
// oneDNN (OpenMP build) reads OpenMP's per-thread setting; kernels call apply_thread_setting()
// before executing, which costs one thread-local compare when nothing changed.
#pragma once

#include <atomic>

namespace dbrq {

void set_num_threads(int n);  // n >= 1; throws ValueError otherwise
int get_num_threads();

namespace detail {
extern std::atomic<int> g_num_threads;
inline thread_local int tls_applied_threads = 0;
void apply_thread_setting_slow(int n);
}  // namespace detail

// Makes the calling thread's OpenMP team size match get_num_threads().
inline void apply_thread_setting() {
  const int n = detail::g_num_threads.load(std::memory_order_relaxed);
  if (__builtin_expect(detail::tls_applied_threads != n, 0)) detail::apply_thread_setting_slow(n);
}

}  // namespace dbrq
