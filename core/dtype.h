// Element types of dbrq tensors.
//
//   dbrq::Tensor t = dbrq::zeros({2, 3}, dbrq::DType::kU8);
//   std::cout << dbrq::dtype_name(t.dtype());   // "u8"
//
// Names follow oneDNN's vocabulary (f32, s8, u8, s32). bf16 is storage-only for now: tensors can hold
// it (safetensors loads convert it to f32), ops do not take it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dbrq {

enum class DType : uint8_t {
  kF32 = 0,
  kS8,
  kU8,
  kS32,
  kS64,
  kBF16,
};

inline constexpr int kNumDTypes = 6;

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses a name as printed by dtype_name ("f32", "u8", ...); throws ValueError otherwise.
DType dtype_from_name(const std::string& name);

inline bool is_quantized_dtype(DType t) { return t == DType::kU8 || t == DType::kS8; }
inline bool is_integral_dtype(DType t) {
  return t == DType::kS8 || t == DType::kU8 || t == DType::kS32 || t == DType::kS64;
}

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kS8;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kS32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kS64;
};

// Calls f(T{}) with T the C++ type of `t` (f32, s8, u8, s32, s64); throws DTypeError for bf16.
template <typename F>
decltype(auto) visit_dtype(DType t, F&& f);

}  // namespace dbrq

#include "core/dtype_inl.h"
