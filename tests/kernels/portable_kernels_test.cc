// The portable loops of the int8 batch norm (kernels/int8_norm.cc) and the int8 average pooling
// (kernels/int8_pool.cc) against their AVX-512 loops: the same kernel run both ways gives the same
// bytes, on channel counts and window widths around the 16- and 64-lane vector widths, both
// layouts, every zero point class, relu on and off. (The loops of kernels/simd.h are covered by
// simd_dispatch_test, the int8 layer/group/instance norms by Int8NormsGolden.*PortableLoops.) On a
// CPU without AVX-512 only the portable loops exist and the tests skip.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kernels/int8.h"
#include "kernels/simd.h"
#include "tests/kernels/kernel_test_util.h"

namespace dbrq::kernel_testing {
namespace {

class PortableKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::simd::cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512: only the portable loops exist";
  }
  void TearDown() override { kernels::simd::force_portable(false); }

  // `run` once on each path; the codes must be identical.
  template <typename F>
  void expect_same_both_ways(const std::string& label, F run) {
    kernels::simd::force_portable(false);
    ASSERT_TRUE(kernels::simd::use_avx512());
    const Tensor vec = run();
    kernels::simd::force_portable(true);
    const Tensor portable = run();
    kernels::simd::force_portable(false);
    ASSERT_EQ(sizes_of(vec), sizes_of(portable)) << label;
    EXPECT_EQ(read_codes(vec), read_codes(portable)) << label;
    ++cases_;
  }
  std::mt19937 rng_{77};
  int cases_ = 0;
};

TEST_F(PortableKernels, BatchNormAffineGivesTheSameCodes) {
  for (int64_t c : {1, 7, 15, 16, 17, 33, 64, 65, 130}) {
    for (Layout layout : {Layout::kChannelsLast, Layout::kContiguous}) {
      for (int32_t zp : {0, 128, 255}) {
        for (bool relu : {false, true}) {
          const std::vector<int64_t> sizes = {2, c, 3, layout == Layout::kContiguous ? 37 : 5};
          const Tensor mean = make_f32({c}, random_floats(rng_, c, -1.0, 1.0));
          const Tensor var = make_f32({c}, random_floats(rng_, c, 0.1, 3.0));
          const Tensor w = make_f32({c}, random_floats(rng_, c, -2.0, 2.0));
          const Tensor b = make_f32({c}, random_floats(rng_, c, -1.0, 1.0));
          const QuantParamsPtr in = QuantParams::per_tensor(0.03f, zp);
          const QuantParamsPtr out = QuantParams::per_tensor(0.05f, 100);
          const kernels::QChannelAffine k(kernels::batch_norm_affine(mean, var, w, b, 1e-5, in->scale(), out->scale()),
                                          in, out, relu);
          const Tensor x = make_u8(sizes, random_codes(rng_, numel_of(sizes)), in, layout);
          expect_same_both_ways(std::string("batch_norm c=") + std::to_string(c) + " " + layout_name(layout) +
                                    " zp=" + std::to_string(zp) + (relu ? " relu" : ""),
                                [&] { return k.run(x); });
        }
      }
    }
  }
  EXPECT_EQ(cases_, 9 * 2 * 3 * 2);
}

TEST_F(PortableKernels, AveragePoolingGivesTheSameCodes) {
  struct Window {
    int64_t k, s, p;
    bool ceil, include_pad;
  };
  const std::vector<Window> windows = {
      {2, 2, 0, false, true}, {3, 2, 1, false, true}, {3, 2, 1, true, false}, {3, 1, 1, false, false}, {5, 3, 2, true, true}};
  for (int64_t c : {1, 15, 16, 17, 63, 64, 65, 129}) {
    for (const Window& win : windows) {
      for (int32_t zp : {0, 3, 128}) {
        const std::vector<int64_t> sizes = {2, c, 9, 11};
        const QuantParamsPtr qp = QuantParams::per_tensor(0.02f, zp);
        const Tensor x = make_u8(sizes, random_codes(rng_, numel_of(sizes)), qp, Layout::kChannelsLast);
        Pool2dParams p;
        p.kernel_size = {win.k, win.k};
        p.stride = {win.s, win.s};
        p.padding = {win.p, win.p};
        p.ceil_mode = win.ceil;
        p.count_include_pad = win.include_pad;
        expect_same_both_ways("avg_pool2d c=" + std::to_string(c) + " k=" + std::to_string(win.k) +
                                  " zp=" + std::to_string(zp),
                              [&] { return kernels::qavg_pool2d(x, p); });
      }
    }
    const std::vector<int64_t> sizes = {1, c, 7, 7};
    const QuantParamsPtr qp = QuantParams::per_tensor(0.02f, 9);
    const Tensor x = make_u8(sizes, random_codes(rng_, numel_of(sizes)), qp, Layout::kChannelsLast);
    expect_same_both_ways("adaptive_avg_pool2d c=" + std::to_string(c),
                          [&] { return kernels::qadaptive_avg_pool2d(x, {3, 2}); });
  }
  EXPECT_EQ(cases_, 8 * (5 * 3 + 1));
}

}  // namespace
}  // namespace dbrq::kernel_testing
