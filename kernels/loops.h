// Plain-loop helpers for the kernels that do not map onto a oneDNN primitive. Internal.
#pragma once

#include <omp.h>

#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "core/threading.h"

namespace dbrq::kernels {

// Calls f(off_0, ..., off_{N-1}) for every logical index of `sizes`, where off_i is the element
// offset of that index under strides[i] (stride 0 broadcasts). Serial; for rare paths.
template <size_t N, typename F>
void for_each_offset(IntArrayRef sizes, const std::array<IntArrayRef, N>& strides, F&& f) {
  const int nd = static_cast<int>(sizes.size());
  int64_t total = 1;
  for (int64_t s : sizes) total *= s;
  if (total == 0) return;
  int64_t idx[kMaxDims] = {};
  std::array<int64_t, N> off{};
  for (int64_t i = 0; i < total; ++i) {
    f(off);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < sizes[d]) {
        for (size_t k = 0; k < N; ++k) off[k] += strides[k][d];
        break;
      }
      for (size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * (sizes[d] - 1);
      idx[d] = 0;
    }
  }
}

// Strides of `t` broadcast to `sizes` (0 where t has size 1 or lacks the dim).
std::vector<int64_t> broadcast_strides(const Tensor& t, IntArrayRef sizes);

// Parallel loop over [0, n) in chunks; serial below `grain` elements.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= grain || get_num_threads() == 1) {
    f(int64_t{0}, n);
    return;
  }
  apply_thread_setting();
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t begin = t * chunk, end = begin + chunk < n ? begin + chunk : n;
    if (begin < end) f(begin, end);
  }
}

}  // namespace dbrq::kernels
