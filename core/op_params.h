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
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dim_vector.h"

namespace dbrq {

struct Conv2dParams {
  std::array<int64_t, 2> stride = {1, 1};
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> dilation = {1, 1};
  int64_t groups = 1;
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("stride", p.stride);
    f("padding", p.padding);
    f("dilation", p.dilation);
    f("groups", p.groups);
  }
};

// conv_transpose2d (PyTorch's F.conv_transpose2d): the output grows by
// (in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1 per spatial dim.
struct ConvTranspose2dParams {
  std::array<int64_t, 2> stride = {1, 1};
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> output_padding = {0, 0};  // < stride or < dilation (PyTorch's rule)
  std::array<int64_t, 2> dilation = {1, 1};
  int64_t groups = 1;
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("stride", p.stride);
    f("padding", p.padding);
    f("output_padding", p.output_padding);
    f("dilation", p.dilation);
    f("groups", p.groups);
  }
};

// conv1d (F.conv1d); runs as conv2d with H = 1.
struct Conv1dParams {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("stride", p.stride);
    f("padding", p.padding);
    f("dilation", p.dilation);
    f("groups", p.groups);
  }
};

// interpolate (F.interpolate, 4-D): the output size is resolved by the functional (from `size`, or
// floor(in * scale_factor)); scale_h / scale_w keep a given scale factor (0: none), which PyTorch's
// kernels use for the source index.
struct InterpolateParams {
  std::array<int64_t, 2> size = {1, 1};
  double scale_h = 0.0, scale_w = 0.0;
  int64_t mode = 0;  // 0 nearest, 1 bilinear
  bool align_corners = false;
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("size", p.size);
    f("scale_h", p.scale_h);
    f("scale_w", p.scale_w);
    f("mode", p.mode);
    f("align_corners", p.align_corners);
  }
};

// group_norm (F.group_norm): statistics over each group of channels (and all spatial positions) per
// sample; instance_norm is group_norm with one group per channel.
struct GroupNormParams {
  int64_t num_groups = 1;
  double eps = 1e-5;
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("num_groups", p.num_groups);
    f("eps", p.eps);
  }
};

struct Pool2dParams {
  std::array<int64_t, 2> kernel_size = {1, 1};
  std::array<int64_t, 2> stride = {1, 1};  // PyTorch's default stride = kernel_size; set by callers
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> dilation = {1, 1};  // max pooling only
  bool ceil_mode = false;
  bool count_include_pad = true;  // average pooling only
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("kernel_size", p.kernel_size);
    f("stride", p.stride);
    f("padding", p.padding);
    f("dilation", p.dilation);
    f("ceil_mode", p.ceil_mode);
    f("count_include_pad", p.count_include_pad);
  }
};

struct AdaptivePool2dParams {
  std::array<int64_t, 2> output_size = {1, 1};
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("output_size", p.output_size);
  }
};

struct NormParams {
  double eps = 1e-5;
  DimVector normalized_shape;  // layer_norm only
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("eps", p.eps);
    f("normalized_shape", p.normalized_shape);
  }
};

struct DimParams {
  DimVector dims;  // softmax/cat/flatten/...: the dims the op works on
  bool keepdim = false;       // reductions
  bool unbiased = true;       // std
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("dims", p.dims);
    f("keepdim", p.keepdim);
    f("unbiased", p.unbiased);
  }
};

struct ShapeParams {
  DimVector sizes;  // reshape target (may contain one -1), permute order, ...
  int64_t start = 0;           // narrow / select / flatten start
  int64_t length = 0;          // narrow length / flatten end
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("sizes", p.sizes);
    f("start", p.start);
    f("length", p.length);
  }
};

struct ActivationParams {
  double alpha = 0.0;  // negative slope, or the lower bound of a clamp
  double beta = 0.0;   // the upper bound of a clamp
  bool approximate_tanh = false;  // gelu
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("alpha", p.alpha);
    f("beta", p.beta);
    f("approximate_tanh", p.approximate_tanh);
  }
};

struct DropoutParams {
  double p = 0.5;
  bool training = false;
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("p", p.p);
    f("training", p.training);
  }
};

// pad: F.pad's pads (last dim first: left, right, then the dim before, ...), mode and fill value.
struct PadParams {
  DimVector pads;
  int64_t mode = 0;     // PadMode as int: 0 constant, 1 reflect, 2 replicate
  double value = 0.0;   // constant mode's fill (a quantized input fills with its code)
  template <typename Self, typename F>
  static void fields(Self& p, F&& f) {
    f("pads", p.pads);
    f("mode", p.mode);
    f("value", p.value);
  }
};

struct QuantParams;

struct ConvertParams {
  int dtype = 0;          // DType as int, for kTo / kQuantize
  int memory_format = 0;  // MemoryFormat as int, for kContiguous
  std::shared_ptr<const QuantParams> qparams;  // kQuantize
  double value = 0.0;     // kFill
};

// Every parameter struct above (not ConvertParams) lists its fields once, in fields(p, f): f is
// called with each field's name and value (an int64_t, bool or double, a std::array<int64_t, N>
// or a DimVector). Equality, fingerprints and the portable form below all walk them.
//
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
uint64_t fingerprint(const PadParams& p);
uint64_t fingerprint(const ConvertParams& p);
uint64_t fingerprint(const ConvTranspose2dParams& p);
uint64_t fingerprint(const Conv1dParams& p);
uint64_t fingerprint(const InterpolateParams& p);
uint64_t fingerprint(const GroupNormParams& p);

// Parameters in a portable form, field by field, every value a double (integers up to 2^53
// exactly): what quant-state files store. from_fields checks names, counts and values and throws
// ValueError naming the field.
using ParamFields = std::vector<std::pair<std::string, std::vector<double>>>;
template <typename P>
ParamFields to_fields(const P& p);
template <typename P>
P from_fields(const ParamFields& fields);
// Whether P lists its fields (ConvertParams does not: its ops are never recorded).
template <typename P, typename = void>
struct has_param_fields : std::false_type {};

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
// A stable fingerprint of a name (a module's or parameter's fqn, an op's name): FNV-1a.
uint64_t name_fingerprint(const std::string& name);

// Equality of parameters (a converted op checks that later calls pass what the first run passed).
bool operator==(const Conv2dParams& a, const Conv2dParams& b);
bool operator==(const Pool2dParams& a, const Pool2dParams& b);
bool operator==(const AdaptivePool2dParams& a, const AdaptivePool2dParams& b);
bool operator==(const NormParams& a, const NormParams& b);
bool operator==(const DimParams& a, const DimParams& b);
bool operator==(const ShapeParams& a, const ShapeParams& b);
bool operator==(const ActivationParams& a, const ActivationParams& b);
bool operator==(const DropoutParams& a, const DropoutParams& b);
bool operator==(const PadParams& a, const PadParams& b);
bool operator==(const ConvertParams& a, const ConvertParams& b);
bool operator==(const ConvTranspose2dParams& a, const ConvTranspose2dParams& b);
bool operator==(const Conv1dParams& a, const Conv1dParams& b);
bool operator==(const InterpolateParams& a, const InterpolateParams& b);
bool operator==(const GroupNormParams& a, const GroupNormParams& b);

// ---- implementation of the field walk ------------------------------------------------------

namespace params_detail {
struct Ignore {
  template <typename T>
  void operator()(const char*, const T&) const {}
};
}  // namespace params_detail

template <typename P>
struct has_param_fields<P, std::void_t<decltype(P::fields(std::declval<const P&>(), params_detail::Ignore{}))>>
    : std::true_type {};

namespace params_detail {

inline void append(std::vector<double>* out, int64_t v) { out->push_back(static_cast<double>(v)); }
inline void append(std::vector<double>* out, bool v) { out->push_back(v ? 1.0 : 0.0); }
inline void append(std::vector<double>* out, double v) { out->push_back(v); }
template <size_t N>
void append(std::vector<double>* out, const std::array<int64_t, N>& v) {
  for (int64_t x : v) out->push_back(static_cast<double>(x));
}
inline void append(std::vector<double>* out, const DimVector& v) {
  for (int64_t x : v) out->push_back(static_cast<double>(x));
}

// Reading back; `what` names the field in errors (thrown by the .cc, which knows ValueError).
void read(const std::vector<double>& in, const std::string& what, int64_t* v);
void read(const std::vector<double>& in, const std::string& what, bool* v);
void read(const std::vector<double>& in, const std::string& what, double* v);
void read(const std::vector<double>& in, const std::string& what, DimVector* v);
void read_array(const std::vector<double>& in, const std::string& what, int64_t* v, size_t n);
template <size_t N>
void read(const std::vector<double>& in, const std::string& what, std::array<int64_t, N>* v) {
  read_array(in, what, v->data(), N);
}
[[noreturn]] void throw_field_error(const std::string& message);

}  // namespace params_detail

template <typename P>
ParamFields to_fields(const P& p) {
  ParamFields out;
  P::fields(p, [&](const char* name, const auto& v) {
    out.emplace_back(name, std::vector<double>{});
    params_detail::append(&out.back().second, v);
  });
  return out;
}

template <typename P>
P from_fields(const ParamFields& fields) {
  P p;
  size_t used = 0;
  P::fields(p, [&](const char* name, auto& v) {
    for (const auto& [n, values] : fields) {
      if (n == name) {
        params_detail::read(values, n, &v);
        ++used;
        return;
      }
    }
    params_detail::throw_field_error(std::string("parameter field \"") + name + "\" is missing");
  });
  if (used != fields.size()) {
    params_detail::throw_field_error("parameters have " + std::to_string(fields.size()) + " fields, expected " +
                                     std::to_string(used));
  }
  return p;
}

}  // namespace dbrq
