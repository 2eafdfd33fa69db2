// The non-tensor parameters of ops, shared by the functional API, the kernels and the recorded
// program of the quantization tracer (which keeps a copy of each seen op's parameters).
//
//   dbrq::Conv2dParams p;
//   p.stride = {2, 2};
//   p.padding = {3, 3};
//   dbrq::Tensor y = dbrq::conv2d(x, w, b, p);
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dim_vector.h"

namespace dbrq {

struct Conv2dParams {
  std::array<int64_t, 2> stride = {1, 1};
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> dilation = {1, 1};
  int64_t groups = 1;
};

struct Pool2dParams {
  std::array<int64_t, 2> kernel_size = {1, 1};
  std::array<int64_t, 2> stride = {1, 1};  // PyTorch's default stride = kernel_size; set by callers
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> dilation = {1, 1};  // max pooling only
  bool ceil_mode = false;
  bool count_include_pad = true;  // average pooling only
};

struct AdaptivePool2dParams {
  std::array<int64_t, 2> output_size = {1, 1};
};

struct NormParams {
  double eps = 1e-5;
  DimVector normalized_shape;  // layer_norm only
};

struct DimParams {
  DimVector dims;  // softmax/cat/flatten/...: the dims the op works on
  bool keepdim = false;       // reductions
  bool unbiased = true;       // std
};

struct ShapeParams {
  DimVector sizes;  // reshape target (may contain one -1), permute order, ...
  int64_t start = 0;           // narrow / select / flatten start
  int64_t length = 0;          // narrow length / flatten end
};

struct ActivationParams {
  double alpha = 0.0;  // negative slope, or the lower bound of a clamp
  double beta = 0.0;   // the upper bound of a clamp
  bool approximate_tanh = false;  // gelu
};

struct DropoutParams {
  double p = 0.5;
  bool training = false;
};

struct QuantParams;

struct ConvertParams {
  int dtype = 0;          // DType as int, for kTo / kQuantize
  int memory_format = 0;  // MemoryFormat as int, for kContiguous
  std::shared_ptr<const QuantParams> qparams;  // kQuantize
  double value = 0.0;     // kFill
};

// A stable 64-bit fingerprint of parameters (the same in every process): part of how the
// quantization tracer identifies an op and how its files name it.
uint64_t fingerprint(const Conv2dParams& p);
uint64_t fingerprint(const Pool2dParams& p);
uint64_t fingerprint(const AdaptivePool2dParams& p);
uint64_t fingerprint(const NormParams& p);
uint64_t fingerprint(const DimParams& p);
uint64_t fingerprint(const ShapeParams& p);
uint64_t fingerprint(const ActivationParams& p);
uint64_t fingerprint(const DropoutParams& p);
uint64_t fingerprint(const ConvertParams& p);
// One more 64-bit value into a fingerprint: a multiply-xorshift mix (two multiplies; the tracer
// runs it for every op call after convert, so no byte-at-a-time FNV).
inline uint64_t fingerprint_mix(uint64_t h, uint64_t v) {
  h ^= v * 0x9E3779B97F4A7C15ull;
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}
inline constexpr uint64_t kFingerprintSeed = 0xcbf29ce484222325ull;

// Equality of parameters (a converted op checks that later calls pass what the first run passed).
bool operator==(const Conv2dParams& a, const Conv2dParams& b);
bool operator==(const Pool2dParams& a, const Pool2dParams& b);
bool operator==(const AdaptivePool2dParams& a, const AdaptivePool2dParams& b);
bool operator==(const NormParams& a, const NormParams& b);
bool operator==(const DimParams& a, const DimParams& b);
bool operator==(const ShapeParams& a, const ShapeParams& b);
bool operator==(const ActivationParams& a, const ActivationParams& b);
bool operator==(const DropoutParams& a, const DropoutParams& b);
bool operator==(const ConvertParams& a, const ConvertParams& b);

}  // namespace dbrq
