#include "kernels/cpu_features.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <cpuid.h>
#define DBRQ_X86_CPUID 1
#endif

namespace dbrq::kernels {
namespace {

bool bit(uint32_t reg, int b) { return ((reg >> b) & 1u) != 0; }
bool all(uint64_t reg, uint64_t mask) { return (reg & mask) == mask; }

}  // namespace

CpuFeatures decide_cpu_features(const CpuReport& r) {
  CpuFeatures f;
  if (r.max_leaf < 7 || !bit(r.leaf1_ecx, 27)) return f;  // no leaf 7, or no XGETBV
  const bool avx512_state = all(r.xcr0, kXcr0Avx512State);
  const bool avx512f = bit(r.leaf7_ebx, 16), avx512bw = bit(r.leaf7_ebx, 30);
  f.avx512 = avx512_state && avx512f && avx512bw;
  const bool avx512_bf16 = bit(r.leaf7_1_eax, 5) && avx512f;
  const bool amx_bf16 = bit(r.leaf7_edx, 22) && all(r.xcr0, kXcr0TileCfg | kXcr0TileData);
  f.bf16 = avx512_state && (avx512_bf16 || amx_bf16);
  return f;
}

CpuReport read_cpu_report() {
  CpuReport r;
#ifdef DBRQ_X86_CPUID
  unsigned a = 0, b = 0, c = 0, d = 0;
  r.max_leaf = __get_cpuid_max(0, nullptr);
  if (r.max_leaf >= 1) {
    __cpuid(1, a, b, c, d);
    r.leaf1_ecx = c;
  }
  if (r.max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    r.leaf7_ebx = b;
    r.leaf7_edx = d;
    __cpuid_count(7, 1, a, b, c, d);
    r.leaf7_1_eax = a;
  }
  if (bit(r.leaf1_ecx, 27)) {  // XGETBV exists only with OSXSAVE
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    r.xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  }
#endif
  return r;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = decide_cpu_features(read_cpu_report());
  return features;
}

}  // namespace dbrq::kernels
