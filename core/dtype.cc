#include "core/dtype.h"

#include "core/error.h"

namespace dbrq {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kS32:
      return 4;
    case DType::kS8:
    case DType::kU8:
      return 1;
    case DType::kS64:
      return 8;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kS8:
      return "s8";
    case DType::kU8:
      return "u8";
    case DType::kS32:
      return "s32";
    case DType::kS64:
      return "s64";
    case DType::kBF16:
      return "bf16";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    if (name == dtype_name(t)) return t;
  }
  DBRQ_THROW(ValueError, "unknown dtype name \"", name, "\"; expected one of f32, s8, u8, s32, s64, bf16");
}

}  // namespace dbrq
