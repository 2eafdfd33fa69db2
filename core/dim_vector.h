// DimVector: sizes, strides or dims held inline (up to kMaxDims without an allocation), for shape
// rules and op parameters that every call builds.
#pragma once

#include <cstdint>

#include "absl/container/inlined_vector.h"

namespace dbrq {

inline constexpr int kMaxDims = 8;
using DimVector = absl::InlinedVector<int64_t, kMaxDims>;

}  // namespace dbrq
