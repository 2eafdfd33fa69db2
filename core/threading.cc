#include "core/threading.h"

#include <omp.h>

#include <cstdlib>

#include "core/error.h"

namespace dbrq {
namespace detail {
namespace {

int default_threads() {
  // OMP_NUM_THREADS wins when set, as users of oneDNN and PyTorch expect.
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr && std::atoi(env) > 0) {
    return std::atoi(env);
  }
  return omp_get_num_procs();
}

}  // namespace

std::atomic<int> g_num_threads{default_threads()};

void apply_thread_setting_slow(int n) {
  omp_set_num_threads(n);
  tls_applied_threads = n;
}

}  // namespace detail

void set_num_threads(int n) {
  DBRQ_ENSURE(n >= 1, ValueError, "set_num_threads: need at least 1 thread, got ", n);
  detail::g_num_threads.store(n, std::memory_order_relaxed);
}

int get_num_threads() { return detail::g_num_threads.load(std::memory_order_relaxed); }

}  // namespace dbrq
