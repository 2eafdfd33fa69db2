#pragma once

#include "core/error.h"

namespace dbrq {

template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f(float{});
    case DType::kS8:
      return f(int8_t{});
    case DType::kU8:
      return f(uint8_t{});
    case DType::kS32:
      return f(int32_t{});
    case DType::kS64:
      return f(int64_t{});
    case DType::kBF16:
      break;
  }
  DBRQ_THROW(DTypeError, "dtype ", dtype_name(t), " is storage-only; convert it to f32 first");
}

}  // namespace dbrq
