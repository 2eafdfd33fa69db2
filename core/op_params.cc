#include "core/op_params.h"

#include <cstring>

#include "core/tensor.h"  // QuantParams

namespace dbrq {
namespace {

uint64_t bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof(b));
  return b;
}

template <typename C>
uint64_t mix_all(uint64_t h, const C& values) {
  h = fingerprint_mix(h, static_cast<uint64_t>(values.size()));
  for (int64_t v : values) h = fingerprint_mix(h, static_cast<uint64_t>(v));
  return h;
}

}  // namespace

uint64_t fingerprint(const Conv2dParams& p) {
  uint64_t h = mix_all(kFingerprintSeed, p.stride);
  h = mix_all(h, p.padding);
  h = mix_all(h, p.dilation);
  return fingerprint_mix(h, static_cast<uint64_t>(p.groups));
}
uint64_t fingerprint(const Pool2dParams& p) {
  uint64_t h = mix_all(kFingerprintSeed, p.kernel_size);
  h = mix_all(h, p.stride);
  h = mix_all(h, p.padding);
  h = mix_all(h, p.dilation);
  return fingerprint_mix(h, (p.ceil_mode ? 1u : 0u) | (p.count_include_pad ? 2u : 0u));
}
uint64_t fingerprint(const AdaptivePool2dParams& p) { return mix_all(kFingerprintSeed, p.output_size); }
uint64_t fingerprint(const NormParams& p) {
  return mix_all(fingerprint_mix(kFingerprintSeed, bits(p.eps)), p.normalized_shape);
}
uint64_t fingerprint(const DimParams& p) {
  return fingerprint_mix(mix_all(kFingerprintSeed, p.dims), (p.keepdim ? 1u : 0u) | (p.unbiased ? 2u : 0u));
}
uint64_t fingerprint(const ShapeParams& p) {
  uint64_t h = mix_all(kFingerprintSeed, p.sizes);
  h = fingerprint_mix(h, static_cast<uint64_t>(p.start));
  return fingerprint_mix(h, static_cast<uint64_t>(p.length));
}
uint64_t fingerprint(const ActivationParams& p) {
  uint64_t h = fingerprint_mix(kFingerprintSeed, bits(p.alpha));
  h = fingerprint_mix(h, bits(p.beta));
  return fingerprint_mix(h, p.approximate_tanh ? 1u : 0u);
}
uint64_t fingerprint(const DropoutParams& p) {
  return fingerprint_mix(fingerprint_mix(kFingerprintSeed, bits(p.p)), p.training ? 1u : 0u);
}
uint64_t fingerprint(const ConvertParams& p) {
  uint64_t h = fingerprint_mix(kFingerprintSeed, static_cast<uint64_t>(p.dtype));
  h = fingerprint_mix(h, static_cast<uint64_t>(p.memory_format));
  h = fingerprint_mix(h, bits(p.value));
  if (p.qparams != nullptr) {
    for (float s : p.qparams->scales) h = fingerprint_mix(h, bits(s));
    for (int32_t z : p.qparams->zero_points) h = fingerprint_mix(h, static_cast<uint64_t>(z));
    h = fingerprint_mix(h, static_cast<uint64_t>(p.qparams->axis));
  }
  return h;
}

bool operator==(const Conv2dParams& a, const Conv2dParams& b) {
  return a.stride == b.stride && a.padding == b.padding && a.dilation == b.dilation && a.groups == b.groups;
}
bool operator==(const Pool2dParams& a, const Pool2dParams& b) {
  return a.kernel_size == b.kernel_size && a.stride == b.stride && a.padding == b.padding &&
         a.dilation == b.dilation && a.ceil_mode == b.ceil_mode && a.count_include_pad == b.count_include_pad;
}
bool operator==(const AdaptivePool2dParams& a, const AdaptivePool2dParams& b) {
  return a.output_size == b.output_size;
}
bool operator==(const NormParams& a, const NormParams& b) {
  return a.eps == b.eps && a.normalized_shape == b.normalized_shape;
}
bool operator==(const DimParams& a, const DimParams& b) {
  return a.dims == b.dims && a.keepdim == b.keepdim && a.unbiased == b.unbiased;
}
bool operator==(const ShapeParams& a, const ShapeParams& b) {
  return a.sizes == b.sizes && a.start == b.start && a.length == b.length;
}
bool operator==(const ActivationParams& a, const ActivationParams& b) {
  return a.alpha == b.alpha && a.beta == b.beta && a.approximate_tanh == b.approximate_tanh;
}
bool operator==(const DropoutParams& a, const DropoutParams& b) { return a.p == b.p && a.training == b.training; }
bool operator==(const ConvertParams& a, const ConvertParams& b) {
  return a.dtype == b.dtype && a.memory_format == b.memory_format && a.qparams == b.qparams && a.value == b.value;
}

}  // namespace dbrq
