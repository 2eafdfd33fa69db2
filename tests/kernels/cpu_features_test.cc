// kernels/cpu_features.h: the one run-time CPU check. decide_cpu_features() is fed register
// values (an injectable CPUID / XGETBV report), so every combination that must say no is checked
// on any machine: a CPU listing AVX-512 under an OS that does not save its state (XCR0 bits 1, 2,
// 5, 6, 7), no XGETBV (OSXSAVE clear), missing CPUID bits, no leaf 7. simd::use_avx512() and
// cpu_has_bf16() must both answer from it.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/cpu_features.h"
#include "kernels/simd.h"

namespace dbrq::kernels {
namespace {

constexpr uint32_t kOsxsave = 1u << 27;
constexpr uint32_t kAvx512f = 1u << 16, kAvx512bw = 1u << 30;
constexpr uint32_t kAmxBf16 = 1u << 22, kAvx512Bf16 = 1u << 5;
constexpr uint64_t kX87 = 1;

// A Zen 4 as a Linux kernel with AVX-512 support reports it.
CpuReport zen4() {
  CpuReport r;
  r.max_leaf = 16;
  r.leaf1_ecx = kOsxsave | (1u << 28);  // OSXSAVE, AVX
  r.leaf7_ebx = kAvx512f | kAvx512bw | (1u << 17) | (1u << 31);
  r.leaf7_1_eax = kAvx512Bf16;
  r.xcr0 = kX87 | kXcr0Avx512State;
  return r;
}

TEST(CpuFeatures, AFullReportSaysYes) {
  const CpuFeatures f = decide_cpu_features(zen4());
  EXPECT_TRUE(f.avx512);
  EXPECT_TRUE(f.bf16);
}

TEST(CpuFeatures, EveryMissingAvx512StateBitSaysNo) {
  const std::vector<uint64_t> bits = {kXcr0Sse, kXcr0Avx, kXcr0Opmask, kXcr0ZmmHi256, kXcr0Hi16Zmm};
  // Every non-empty subset of the five state components cleared (31 cases).
  for (uint32_t mask = 1; mask < (1u << bits.size()); ++mask) {
    CpuReport r = zen4();
    for (size_t i = 0; i < bits.size(); ++i) {
      if ((mask >> i) & 1u) r.xcr0 &= ~bits[i];
    }
    const CpuFeatures f = decide_cpu_features(r);
    EXPECT_FALSE(f.avx512) << "xcr0 " << std::hex << r.xcr0;
    EXPECT_FALSE(f.bf16) << "xcr0 " << std::hex << r.xcr0;
  }
}

TEST(CpuFeatures, WithoutOsxsaveXcr0IsNotTrusted) {
  CpuReport r = zen4();
  r.leaf1_ecx &= ~kOsxsave;  // XGETBV would fault; whatever xcr0 holds is not the OS's answer
  EXPECT_FALSE(decide_cpu_features(r).avx512);
  EXPECT_FALSE(decide_cpu_features(r).bf16);
}

TEST(CpuFeatures, MissingCpuidBitsSayNo) {
  for (uint32_t cleared : {kAvx512f, kAvx512bw}) {
    CpuReport r = zen4();
    r.leaf7_ebx &= ~cleared;
    EXPECT_FALSE(decide_cpu_features(r).avx512) << std::hex << cleared;
  }
  CpuReport no_f = zen4();
  no_f.leaf7_ebx &= ~kAvx512f;
  EXPECT_FALSE(decide_cpu_features(no_f).bf16);  // AVX512_BF16 without AVX512F is not usable
  CpuReport no_bf16 = zen4();
  no_bf16.leaf7_1_eax = 0;
  EXPECT_TRUE(decide_cpu_features(no_bf16).avx512);
  EXPECT_FALSE(decide_cpu_features(no_bf16).bf16);
  CpuReport old = zen4();
  old.max_leaf = 6;  // leaf 7 does not exist: its registers mean nothing
  EXPECT_FALSE(decide_cpu_features(old).avx512);
  EXPECT_FALSE(decide_cpu_features(old).bf16);
  EXPECT_FALSE(decide_cpu_features(CpuReport{}).avx512);
}

TEST(CpuFeatures, AmxBf16NeedsTheTileStateToo) {
  CpuReport r = zen4();
  r.leaf7_1_eax = 0;
  r.leaf7_edx = kAmxBf16;
  EXPECT_FALSE(decide_cpu_features(r).bf16);  // tiles not enabled by the OS
  r.xcr0 |= kXcr0TileCfg;
  EXPECT_FALSE(decide_cpu_features(r).bf16);
  r.xcr0 |= kXcr0TileData;
  EXPECT_TRUE(decide_cpu_features(r).bf16);
  r.xcr0 &= ~kXcr0Opmask;
  EXPECT_FALSE(decide_cpu_features(r).bf16);  // and the AVX-512 state
}

TEST(CpuFeatures, TheKernelsAskTheOneCheck) {
  const CpuFeatures f = decide_cpu_features(read_cpu_report());
  EXPECT_EQ(cpu_features().avx512, f.avx512);
  EXPECT_EQ(cpu_features().bf16, f.bf16);
#ifdef DBRQ_AVX512
  EXPECT_EQ(simd::cpu_has_avx512(), f.avx512);
#endif
  EXPECT_EQ(cpu_has_bf16(), f.bf16);
  const CpuReport r = read_cpu_report();
  // Only read XCR0 when XGETBV exists; when it does, x87 state is always enabled.
  if ((r.leaf1_ecx & kOsxsave) != 0) EXPECT_NE(r.xcr0 & kX87, 0u);
  else EXPECT_EQ(r.xcr0, 0u);
}

}  // namespace
}  // namespace dbrq::kernels
