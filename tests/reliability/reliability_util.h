// Helpers shared by the reliability suites (tests/reliability): bit-exact tensor comparison, the
// statistics of every observer of a prepared model, and which sanitizer the binary was built with.
//
//   EXPECT_TRUE(dbrq::testing::bit_identical(y, reference));
//   EXPECT_EQ(dbrq::testing::observer_stats(*model), dbrq::testing::observer_stats(*twin));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"  // observer_roots
#include "tracer/internal.h"  // tests may look at the recorded program

namespace dbrq::testing {

// Same dtype, sizes and bytes of every element (in logical order); NaN payloads compare as bits.
bool bit_identical(const Tensor& a, const Tensor& b);

// One root observer slot of a prepared model: its kind and statistics, comparable with ==.
struct ObserverRecord {
  int slot = -1;
  std::string describe;  // "Histogram[min=.. max=..]"
  Observer::Stats stats;
};
bool operator==(const ObserverRecord& a, const ObserverRecord& b);
inline bool operator!=(const ObserverRecord& a, const ObserverRecord& b) { return !(a == b); }
// Every root observer slot of a prepared (not necessarily calibrated) model, in slot order.
std::vector<ObserverRecord> observer_stats(const nn::Module& model);

// Whether this binary runs under AddressSanitizer / ThreadSanitizer (RSS and timing checks do
// not apply there).
constexpr bool kUnderAsan =
#if defined(__SANITIZE_ADDRESS__)
    true;
#else
    false;
#endif
constexpr bool kUnderTsan =
#if defined(__SANITIZE_THREAD__)
    true;
#else
    false;
#endif

}  // namespace dbrq::testing
