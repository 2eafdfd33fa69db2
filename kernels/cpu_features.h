// Run-time CPU checks, in one place: whether this process may run the AVX-512 loops
// (kernels/simd.h) and whether oneDNN's bf16 primitives have native support (kernels/bf16.h).
//
//   if (dbrq::kernels::cpu_features().avx512) ...   // or simd::use_avx512(), which honours overrides
//
// CPUID says what the CPU implements; whether the OS saves the registers on a context switch is a
// separate question that only XGETBV answers. A kernel (or hypervisor) without AVX-512 support
// leaves XCR0's opmask / ZMM_Hi256 / Hi16_ZMM bits clear, and an AVX-512 instruction then raises
// SIGILL although CPUID lists AVX-512F. So every feature here needs both: the CPUID bits and the
// OS-enabled state bits of XCR0 (read only when CPUID.1:ECX.OSXSAVE says XGETBV exists).
//
// decide_cpu_features() is a pure function of the registers read (CpuReport), so tests check every
// combination that must say no without such a machine. Internal to kernels/.
#pragma once

#include <cstdint>

namespace dbrq::kernels {

// The registers the decision reads, as CPUID and XGETBV return them.
struct CpuReport {
  uint32_t max_leaf = 0;     // CPUID.0:EAX, the highest basic leaf
  uint32_t leaf1_ecx = 0;    // CPUID.1:ECX: bit 27 OSXSAVE (XGETBV usable)
  uint32_t leaf7_ebx = 0;    // CPUID.(7,0):EBX: bit 16 AVX512F, bit 30 AVX512BW
  uint32_t leaf7_edx = 0;    // CPUID.(7,0):EDX: bit 22 AMX-BF16
  uint32_t leaf7_1_eax = 0;  // CPUID.(7,1):EAX: bit 5 AVX512_BF16
  uint64_t xcr0 = 0;         // XGETBV(0); 0 when OSXSAVE is clear (XGETBV would fault)
};

// XCR0 state components the OS must enable.
inline constexpr uint64_t kXcr0Sse = 1u << 1, kXcr0Avx = 1u << 2;
inline constexpr uint64_t kXcr0Opmask = 1u << 5, kXcr0ZmmHi256 = 1u << 6, kXcr0Hi16Zmm = 1u << 7;
inline constexpr uint64_t kXcr0Avx512State = kXcr0Sse | kXcr0Avx | kXcr0Opmask | kXcr0ZmmHi256 | kXcr0Hi16Zmm;
inline constexpr uint64_t kXcr0TileCfg = uint64_t{1} << 17, kXcr0TileData = uint64_t{1} << 18;

struct CpuFeatures {
  // AVX512F and AVX512BW, with the OS saving the AVX-512 state: simd.h's loops may run.
  bool avx512 = false;
  // Native bf16 dot products: AVX512_BF16 (with the AVX-512 state enabled), or AMX-BF16 (with
  // the AVX-512 and the tile state enabled).
  bool bf16 = false;
};

CpuFeatures decide_cpu_features(const CpuReport& report);
// This CPU's registers (all zero on a CPU that is not x86).
CpuReport read_cpu_report();
// decide_cpu_features(read_cpu_report()), computed once per process.
const CpuFeatures& cpu_features();

}  // namespace dbrq::kernels
