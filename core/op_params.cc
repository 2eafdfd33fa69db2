#include "core/op_params.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/tensor.h"  // QuantParams

namespace dbrq {
namespace {

uint64_t bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, sizeof(b));
  return b;
}

// Feeds a field's values to `f` as doubles (no allocation: fingerprints run on every converted
// call).
template <typename F>
void each_value(int64_t v, F&& f) { f(static_cast<double>(v)); }
template <typename F>
void each_value(bool v, F&& f) { f(v ? 1.0 : 0.0); }
template <typename F>
void each_value(double v, F&& f) { f(v); }
template <size_t N, typename F>
void each_value(const std::array<int64_t, N>& v, F&& f) {
  for (int64_t x : v) f(static_cast<double>(x));
}
template <typename F>
void each_value(const DimVector& v, F&& f) {
  for (int64_t x : v) f(static_cast<double>(x));
}
template <typename T>
size_t count_of(const T&) { return 1; }
template <size_t N>
size_t count_of(const std::array<int64_t, N>&) { return N; }
size_t count_of(const DimVector& v) { return v.size(); }

// Over every field, in order: its value count, then its values, doubles by their bits (what
// to_fields would give, without building it).
template <typename P>
uint64_t fingerprint_fields(const P& p) {
  uint64_t h = kFingerprintSeed;
  P::fields(p, [&](const char*, const auto& v) {
    h = fingerprint_mix(h, count_of(v));
    each_value(v, [&](double x) { h = fingerprint_mix(h, bits(x)); });
  });
  return h;
}

template <typename P>
bool fields_equal(const P& a, const P& b) {
  bool equal = true;
  P::fields(a, [&](const char* name, const auto& va) {
    P::fields(b, [&](const char* n, const auto& vb) {
      if constexpr (std::is_same_v<decltype(va), decltype(vb)>) {
        if (std::strcmp(n, name) == 0 && !(va == vb)) equal = false;
      }
    });
  });
  return equal;
}

}  // namespace

uint64_t fingerprint(const Conv2dParams& p) { return fingerprint_fields(p); }
uint64_t fingerprint(const Pool2dParams& p) { return fingerprint_fields(p); }
uint64_t fingerprint(const AdaptivePool2dParams& p) { return fingerprint_fields(p); }
uint64_t fingerprint(const NormParams& p) { return fingerprint_fields(p); }
uint64_t fingerprint(const DimParams& p) { return fingerprint_fields(p); }
uint64_t fingerprint(const ShapeParams& p) { return fingerprint_fields(p); }
uint64_t fingerprint(const ActivationParams& p) { return fingerprint_fields(p); }
uint64_t fingerprint(const DropoutParams& p) { return fingerprint_fields(p); }
uint64_t fingerprint(const PadParams& p) { return fingerprint_fields(p); }
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

bool operator==(const Conv2dParams& a, const Conv2dParams& b) { return fields_equal(a, b); }
bool operator==(const Pool2dParams& a, const Pool2dParams& b) { return fields_equal(a, b); }
bool operator==(const AdaptivePool2dParams& a, const AdaptivePool2dParams& b) { return fields_equal(a, b); }
bool operator==(const NormParams& a, const NormParams& b) { return fields_equal(a, b); }
bool operator==(const DimParams& a, const DimParams& b) { return fields_equal(a, b); }
bool operator==(const ShapeParams& a, const ShapeParams& b) { return fields_equal(a, b); }
bool operator==(const ActivationParams& a, const ActivationParams& b) { return fields_equal(a, b); }
bool operator==(const DropoutParams& a, const DropoutParams& b) { return fields_equal(a, b); }
bool operator==(const PadParams& a, const PadParams& b) { return fields_equal(a, b); }
bool operator==(const ConvertParams& a, const ConvertParams& b) {
  return a.dtype == b.dtype && a.memory_format == b.memory_format && a.qparams == b.qparams && a.value == b.value;
}

uint64_t fingerprint(const ConvTranspose2dParams& p) { return fingerprint_fields(p); }
bool operator==(const ConvTranspose2dParams& a, const ConvTranspose2dParams& b) { return fields_equal(a, b); }
uint64_t fingerprint(const Conv1dParams& p) { return fingerprint_fields(p); }
bool operator==(const Conv1dParams& a, const Conv1dParams& b) { return fields_equal(a, b); }
uint64_t fingerprint(const InterpolateParams& p) { return fingerprint_fields(p); }
bool operator==(const InterpolateParams& a, const InterpolateParams& b) { return fields_equal(a, b); }
uint64_t fingerprint(const GroupNormParams& p) { return fingerprint_fields(p); }
bool operator==(const GroupNormParams& a, const GroupNormParams& b) { return fields_equal(a, b); }

uint64_t name_fingerprint(const std::string& name) {
  uint64_t h = kFingerprintSeed;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace params_detail {

void throw_field_error(const std::string& message) { DBRQ_THROW(ValueError, message); }

namespace {

int64_t integer(double v, const std::string& what) {
  // Integers a double holds exactly: sizes, dims, strides.
  DBRQ_ENSURE(std::isfinite(v) && v == std::floor(v) && std::abs(v) <= 9007199254740992.0, ValueError,
              "parameter field \"", what, "\" has ", v, ", not an integer");
  return static_cast<int64_t>(v);
}

void expect_count(const std::vector<double>& in, const std::string& what, size_t n) {
  DBRQ_ENSURE(in.size() == n, ValueError, "parameter field \"", what, "\" has ", in.size(), " values, expected ", n);
}

}  // namespace

void read(const std::vector<double>& in, const std::string& what, int64_t* v) {
  expect_count(in, what, 1);
  *v = integer(in[0], what);
}
void read(const std::vector<double>& in, const std::string& what, bool* v) {
  expect_count(in, what, 1);
  DBRQ_ENSURE(in[0] == 0.0 || in[0] == 1.0, ValueError, "parameter field \"", what, "\" has ", in[0],
              ", expected 0 or 1");
  *v = in[0] != 0.0;
}
void read(const std::vector<double>& in, const std::string& what, double* v) {
  expect_count(in, what, 1);
  DBRQ_ENSURE(std::isfinite(in[0]), ValueError, "parameter field \"", what, "\" has ", in[0], ", not finite");
  *v = in[0];
}
void read(const std::vector<double>& in, const std::string& what, DimVector* v) {
  DBRQ_ENSURE(in.size() <= static_cast<size_t>(kMaxDims), ValueError, "parameter field \"", what, "\" has ",
              in.size(), " values, more than ", kMaxDims);
  v->clear();
  for (double x : in) v->push_back(integer(x, what));
}
void read_array(const std::vector<double>& in, const std::string& what, int64_t* v, size_t n) {
  expect_count(in, what, n);
  for (size_t i = 0; i < n; ++i) v[i] = integer(in[i], what);
}

}  // namespace params_detail

}  // namespace dbrq
