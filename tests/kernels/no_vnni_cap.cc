// Linked into the *_no_vnni_test targets: caps oneDNN below VNNI before its first use, whatever
// ONEDNN_MAX_CPU_ISA says (a --test_env such as the sanitizer configs' AVX512_CORE_BF16 replaces
// the target's env), so those targets always run the saturating-pairs paths.
#include <dnnl.h>
#include <gtest/gtest.h>

#include "kernels/int8.h"

namespace {

const bool kCapped = dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core) == dnnl_success;

TEST(NoVnniCap, OneDnnRunsWithoutVnni) {
  EXPECT_TRUE(kCapped);
  EXPECT_TRUE(dbrq::kernels::int8_pairs_saturate());
}

}  // namespace
