// Shared pieces of the int8 kernel testers (tests/kernels/*_tester.h): seeded data, tensors built
// and read by logical index through their strides (independently of the kernels' own copy and
// reorder code), the double-precision quantization the naive references use, and the one gate
// every u8 result passes.
//
//   std::mt19937 rng(seed);
//   std::vector<int32_t> codes = random_codes(rng, 24);
//   Tensor x = make_u8({1, 2, 3, 4}, codes, QuantParams::per_tensor(0.1f, 3), MemoryFormat::kChannelsLast);
//   RefCodes ref = reference_codes(real_values, out->scale(), out->zero_point());
//   expect_codes("qadd", read_codes(y), ref.codes, &ref.unrounded);
//
// Tolerance (the gate, expect_codes): every u8 code within 1 of the reference, at most 1% of the
// codes off by one, and every off-by-one code at a near-tie of the reference (its unrounded value
// within 1e-3 codes of k + 1/2). The references are exact (integer accumulation, then double
// arithmetic and one round half to even); the kernels compute the final requantization in f32
// (oneDNN's output scale, reciprocal scales rounded to float, FMA dequantization), which moves a
// value by a few f32 ulps (~1e-7 relative, < 1e-4 codes). Only a value that close to a rounding
// boundary can round to the neighbouring code: on random data that is a handful per million
// elements, so an off-by-one away from a tie, more than 1% of them, or any error of 2 codes is a
// real difference in semantics.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iomanip>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/eager.h"

namespace dbrq::kernel_testing {

// ---- data ----

inline std::vector<int32_t> random_codes(std::mt19937& rng, int64_t n, int32_t lo = 0, int32_t hi = 255) {
  std::uniform_int_distribution<int32_t> d(lo, hi);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(d(rng));
  return v;
}

inline double random_double(std::mt19937& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}

// Default shapes of the testers' members. Out of line: GCC 12 reports a bogus
// -Wmaybe-uninitialized when a vector member's initializer list is inlined into a test body.
[[gnu::noinline]] inline std::vector<int64_t> shape_of(std::initializer_list<int64_t> sizes) {
  return std::vector<int64_t>(sizes);
}

inline int64_t numel_of(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// Row-major logical index -> memory offset through t's strides.
inline int64_t offset_of_logical(const Tensor& t, int64_t linear) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    const int64_t s = t.size(d);
    off += (linear % s) * t.stride(d);
    linear /= s;
  }
  return off;
}

// Writes `codes` (logical row-major order) into t's memory through its strides (any layout,
// including permuted views), and attaches `qparams`.
inline Tensor fill_u8(Tensor t, const std::vector<int32_t>& codes, QuantParamsPtr qparams) {
  uint8_t* p = t.raw_mutable_data<uint8_t>();
  for (int64_t i = 0; i < static_cast<int64_t>(codes.size()); ++i) {
    p[offset_of_logical(t, i)] = static_cast<uint8_t>(codes[static_cast<size_t>(i)]);
  }
  return t.with_qparams(std::move(qparams));
}

// A u8 tensor holding `codes` (logical row-major order) in `format`, with `qparams`.
inline Tensor make_u8(const std::vector<int64_t>& sizes, const std::vector<int32_t>& codes, QuantParamsPtr qparams,
                      MemoryFormat format = MemoryFormat::kContiguous) {
  return fill_u8(Tensor::empty(sizes, DType::kU8, format), codes, std::move(qparams));
}

// The same with the last two dims stored transposed (a non-contiguous view, as k.transpose(-2, -1)).
inline Tensor make_u8_transposed(const std::vector<int64_t>& sizes, const std::vector<int32_t>& codes,
                                 QuantParamsPtr qparams) {
  std::vector<int64_t> stored = sizes, perm(sizes.size());
  std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return fill_u8(Tensor::empty(stored, DType::kU8).raw_permute(perm), codes, std::move(qparams));
}

// Memory layouts the elementwise testers feed the kernels.
enum class Layout {
  kContiguous,    // row-major
  kChannelsLast,  // NHWC strides (4-D)
  kTransposed,    // last two dims stored transposed: dense, not contiguous
  kSliced,        // a narrow() of a wider tensor along the last dim: not dense
};

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kChannelsLast:
      return "channels_last";
    case Layout::kTransposed:
      return "transposed";
    case Layout::kSliced:
      return "sliced";
  }
  return "?";
}

// An uninitialized u8 tensor of logical `sizes` in `layout`.
inline Tensor empty_u8(const std::vector<int64_t>& sizes, Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return Tensor::empty(sizes, DType::kU8);
    case Layout::kChannelsLast:
      return Tensor::empty(sizes, DType::kU8, MemoryFormat::kChannelsLast);
    case Layout::kTransposed: {
      std::vector<int64_t> stored = sizes, perm(sizes.size());
      std::swap(stored[stored.size() - 1], stored[stored.size() - 2]);
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
      std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
      return Tensor::empty(stored, DType::kU8).raw_permute(perm);
    }
    case Layout::kSliced: {
      std::vector<int64_t> wide = sizes;
      wide.back() += 3;
      return Tensor::empty(wide, DType::kU8).raw_narrow(static_cast<int64_t>(sizes.size()) - 1, 1, sizes.back());
    }
  }
  return Tensor();
}

inline Tensor make_u8(const std::vector<int64_t>& sizes, const std::vector<int32_t>& codes, QuantParamsPtr qparams,
                      Layout layout) {
  return fill_u8(empty_u8(sizes, layout), codes, std::move(qparams));
}

inline Tensor make_f32(const std::vector<int64_t>& sizes, const std::vector<float>& values,
                       MemoryFormat format = MemoryFormat::kContiguous) {
  Tensor t = Tensor::empty(sizes, DType::kF32, format);
  float* p = t.raw_mutable_data<float>();
  for (int64_t i = 0; i < static_cast<int64_t>(values.size()); ++i) {
    p[offset_of_logical(t, i)] = values[static_cast<size_t>(i)];
  }
  return t;
}

// Codes of a u8 tensor in logical row-major order (read through its strides).
inline std::vector<int32_t> read_codes(const Tensor& t) {
  const uint8_t* p = static_cast<const uint8_t*>(t.data_ptr());
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = p[offset_of_logical(t, i)];
  return v;
}

inline std::vector<float> read_floats(const Tensor& t) {
  const float* p = static_cast<const float*>(t.data_ptr());
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = p[offset_of_logical(t, i)];
  return v;
}

inline std::vector<int64_t> sizes_of(const Tensor& t) { return std::vector<int64_t>(t.sizes().begin(), t.sizes().end()); }

// ---- quantization in double (the references' arithmetic) ----

inline double dequantize(int32_t code, double scale, int32_t zero_point) {
  return (static_cast<double>(code) - zero_point) * scale;
}

// Round half to even (the default floating-point rounding mode), then saturate to u8.
inline int32_t quantize_u8(double real, double scale, int32_t zero_point) {
  if (std::isnan(real)) return zero_point;
  const double q = std::nearbyint(real / scale) + zero_point;
  return static_cast<int32_t>(std::min(std::max(q, 0.0), 255.0));
}

// u8 parameters covering [lo, hi] (widened to include 0), as an observer would pick them.
inline QuantParamsPtr qparams_for_range(double lo, double hi) {
  lo = std::min(lo, 0.0);
  hi = std::max(hi, 0.0);
  const double scale = std::max((hi - lo) / 255.0, 1e-6);
  const int32_t zp = static_cast<int32_t>(std::min(std::max(std::nearbyint(-lo / scale), 0.0), 255.0));
  return QuantParams::per_tensor(static_cast<float>(scale), zp);
}

// ---- fused activations (post-ops of conv / linear) on real values ----

enum class Post { kNone, kRelu, kRelu6, kHardswish };

inline const char* post_name(Post p) {
  switch (p) {
    case Post::kNone:
      return "none";
    case Post::kRelu:
      return "relu";
    case Post::kRelu6:
      return "relu6";
    case Post::kHardswish:
      return "hardswish";
  }
  return "?";
}

inline kernels::PostOps post_ops(Post p) {
  switch (p) {
    case Post::kNone:
      return {};
    case Post::kRelu:
      return {kernels::PostOp::relu()};
    case Post::kRelu6:
      return {kernels::PostOp::clip(0.f, 6.f)};
    case Post::kHardswish:
      return {kernels::PostOp::hardswish()};
  }
  return {};
}

// PyTorch's definitions, in double.
inline double apply_post(Post p, double x) {
  switch (p) {
    case Post::kNone:
      return x;
    case Post::kRelu:
      return std::max(x, 0.0);
    case Post::kRelu6:
      return std::min(std::max(x, 0.0), 6.0);
    case Post::kHardswish:
      return x * std::min(std::max(x + 3.0, 0.0), 6.0) / 6.0;
  }
  return x;
}

// ---- the gate ----

// A reference value (in code units, before rounding) this close to k + 1/2 is a near-tie: f32
// arithmetic (a few ulps of error) may legitimately round it to either neighbour.
constexpr double kNearTie = 1e-3;

inline bool near_tie(double code_units) {
  if (!std::isfinite(code_units) || code_units < -0.5 - kNearTie || code_units > 255.5 + kNearTie) return false;
  return std::abs(code_units - std::floor(code_units) - 0.5) <= kNearTie;
}

struct CodeStats {
  int64_t n = 0, identical = 0, off_by_one = 0, worse = 0, max_diff = 0;
  int64_t off_by_one_at_ties = 0;  // off by one where the reference is a near-tie (when known)
  std::string first_mismatches;    // "[i] expected e, got g" for the first few differing elements
  std::string first_unexplained;   // the same for off-by-one elements away from a near-tie
};

inline CodeStats compare_codes(const std::vector<int32_t>& got, const std::vector<int32_t>& expected,
                               const std::vector<double>* unrounded = nullptr) {
  CodeStats s;
  s.n = static_cast<int64_t>(expected.size());
  std::ostringstream os, un;
  int shown = 0, shown_un = 0;
  for (size_t i = 0; i < expected.size() && i < got.size(); ++i) {
    const int64_t d = std::abs(static_cast<int64_t>(got[i]) - expected[i]);
    s.identical += d == 0;
    s.off_by_one += d == 1;
    s.worse += d > 1;
    s.max_diff = std::max(s.max_diff, d);
    if (d != 0 && shown < 8) {
      os << " [" << i << "] expected " << expected[i] << ", got " << got[i];
      if (unrounded != nullptr) os << " (reference " << std::setprecision(9) << (*unrounded)[i] << ")";
      os << ";";
      ++shown;
    }
    if (d == 1 && unrounded != nullptr) {
      if (near_tie((*unrounded)[i])) {
        ++s.off_by_one_at_ties;
      } else if (shown_un < 8) {
        un << " [" << i << "] expected " << expected[i] << ", got " << got[i] << " (reference " << std::setprecision(9)
           << (*unrounded)[i] << ");";
        ++shown_un;
      }
    }
  }
  s.first_mismatches = os.str();
  s.first_unexplained = un.str();
  return s;
}

// One line per checked result, so a run's log shows the measured agreement ("[ kernels  ] ...").
inline void report(const std::string& label, const CodeStats& s) {
  std::cout << "[ kernels  ] " << std::left << std::setw(60) << label << std::right << " " << s.identical << "/" << s.n
            << " identical, " << s.off_by_one << " off by 1 (" << s.off_by_one_at_ties << " at near-ties), " << s.worse
            << " worse" << std::endl;
}

// Where both sides compute exactly (e.g. ties built from power-of-two scales), every code must match.
inline void expect_codes_exact(const std::string& label, const std::vector<int32_t>& got,
                               const std::vector<int32_t>& expected) {
  ASSERT_EQ(got.size(), expected.size()) << label;
  const CodeStats s = compare_codes(got, expected);
  report(label + " (exact)", s);
  EXPECT_EQ(s.identical, s.n) << label << ": " << s.n - s.identical << " of " << s.n
                              << " codes differ where an exact match is required:" << s.first_mismatches;
}

// The gate (see the file comment):
//  - no code more than 1 away from the reference;
//  - at most `max_off_by_one` (a fraction, 1% by default) of the codes off by one;
//  - given the reference's unrounded values (code units, before rounding: real / scale + zp),
//    every off-by-one code must sit at a near-tie (within kNearTie of k + 1/2), the only place
//    where f32 arithmetic may round the other way. Test data built on exact real ties (scale
//    ratios such as 0.05 / 0.02) pass max_off_by_one = 1 and check the tie-breaking separately
//    against the kernel's documented f32 formula.
inline void expect_codes(const std::string& label, const std::vector<int32_t>& got,
                         const std::vector<int32_t>& expected, const std::vector<double>* unrounded = nullptr,
                         double max_off_by_one = 0.01) {
  ASSERT_EQ(got.size(), expected.size()) << label;
  if (unrounded != nullptr) {
    ASSERT_EQ(unrounded->size(), expected.size()) << label;
  }
  const CodeStats s = compare_codes(got, expected, unrounded);
  report(label, s);
  EXPECT_EQ(s.worse, 0) << label << ": " << s.worse << " codes differ by more than 1 (max " << s.max_diff << "):"
                        << s.first_mismatches;
  EXPECT_LE(static_cast<double>(s.off_by_one), max_off_by_one * static_cast<double>(s.n))
      << label << ": " << s.off_by_one << " of " << s.n << " codes off by one (more than " << 100 * max_off_by_one
      << "%):" << s.first_mismatches;
  if (unrounded != nullptr) {
    EXPECT_EQ(s.off_by_one, s.off_by_one_at_ties)
        << label << ": " << s.off_by_one - s.off_by_one_at_ties
        << " codes off by one away from any rounding tie:" << s.first_unexplained;
  }
}

// Reference codes and their unrounded values (code units) from real values.
struct RefCodes {
  std::vector<int32_t> codes;
  std::vector<double> unrounded;
};

inline RefCodes reference_codes(const std::vector<double>& real, double scale, int32_t zero_point) {
  RefCodes r;
  r.codes.resize(real.size());
  r.unrounded.resize(real.size());
  for (size_t i = 0; i < real.size(); ++i) {
    r.codes[i] = quantize_u8(real[i], scale, zero_point);
    r.unrounded[i] = real[i] / scale + zero_point;
  }
  return r;
}

// f32 results: |got - expected| <= tol * bound[i] for each element, where the caller states the
// per-element error bound (e.g. the magnitude of the terms before cancellation). Reports the worst
// ratio |error| / bound (must be <= tol).
inline void expect_floats(const std::string& label, const std::vector<float>& got, const std::vector<double>& expected,
                          const std::vector<double>& bound, double tol) {
  ASSERT_EQ(got.size(), expected.size()) << label;
  double worst = 0.0;
  int64_t bad = 0;
  std::ostringstream os;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - expected[i]);
    const double ratio = err / bound[i];
    worst = std::max(worst, ratio);
    if (!(err <= tol * bound[i])) {
      if (bad < 8) os << " [" << i << "] expected " << expected[i] << ", got " << got[i] << ";";
      ++bad;
    }
  }
  std::cout << "[ kernels  ] " << std::left << std::setw(60) << label << std::right << " worst error "
            << std::scientific << std::setprecision(2) << worst << " of bound (tolerance " << tol << ")"
            << std::defaultfloat << std::endl;
  EXPECT_EQ(bad, 0) << label << ": " << bad << " of " << expected.size() << " values outside tolerance:" << os.str();
}

}  // namespace dbrq::kernel_testing
