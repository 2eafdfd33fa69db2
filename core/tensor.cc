#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <ostream>
#include <random>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dbrq {

// ---------------------------------------------------------------------------------------------
// QuantParams

QuantParamsPtr QuantParams::per_tensor(float scale, int32_t zero_point) {
  DBRQ_ENSURE(std::isfinite(scale) && scale > 0, ValueError, "quantization scale must be finite and > 0, got ",
              scale);
  auto p = std::make_shared<QuantParams>();
  p->scales = {scale};
  p->zero_points = {zero_point};
  return p;
}

QuantParamsPtr QuantParams::per_channel(std::vector<float> scales, std::vector<int32_t> zero_points,
                                        int64_t axis) {
  DBRQ_ENSURE(!scales.empty() && scales.size() == zero_points.size(), ValueError,
              "per-channel quantization needs as many zero points as scales, got ", scales.size(), " scales and ",
              zero_points.size(), " zero points");
  DBRQ_ENSURE(axis >= 0, ValueError, "per-channel quantization axis must be >= 0, got ", axis);
  for (size_t i = 0; i < scales.size(); ++i) {
    DBRQ_ENSURE(std::isfinite(scales[i]) && scales[i] > 0, ValueError,
                "quantization scale must be finite and > 0, got ", scales[i], " for channel ", i);
  }
  auto p = std::make_shared<QuantParams>();
  p->scales = std::move(scales);
  p->zero_points = std::move(zero_points);
  p->axis = axis;
  return p;
}

std::string QuantParams::to_string() const {
  if (!is_per_channel()) return absl::StrFormat("scale=%g, zero_point=%d", scale(), zero_point());
  return absl::StrFormat("per-channel axis=%d, %d scales in [%g, %g]", axis, scales.size(),
                         *std::min_element(scales.begin(), scales.end()),
                         *std::max_element(scales.begin(), scales.end()));
}

// ---------------------------------------------------------------------------------------------
// Construction

std::string shape_to_string(IntArrayRef sizes) { return absl::StrCat("[", absl::StrJoin(sizes, ", "), "]"); }

namespace {

// Strides for `sizes` into `st` (sizes.size() entries; no allocation: hot paths call this).
void strides_into(IntArrayRef sizes, MemoryFormat format, int64_t* st) {
  if (format == MemoryFormat::kChannelsLast && sizes.size() == 4) {
    // NCHW sizes, NHWC order in memory: C fastest, then W, H, N.
    const int64_t c = std::max<int64_t>(sizes[1], 1), h = std::max<int64_t>(sizes[2], 1),
                  w = std::max<int64_t>(sizes[3], 1);
    st[1] = 1;
    st[3] = c;
    st[2] = c * w;
    st[0] = c * w * h;
    return;
  }
  int64_t s = 1;
  for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
    st[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
}

}  // namespace

std::vector<int64_t> strides_for(IntArrayRef sizes, MemoryFormat format) {
  std::vector<int64_t> st(sizes.size());
  strides_into(sizes, format, st.data());
  return st;
}

namespace {

void check_sizes(IntArrayRef sizes) {
  DBRQ_ENSURE(sizes.size() <= static_cast<size_t>(kMaxDims), ShapeError, "tensors have at most ", kMaxDims,
              " dims, got ", sizes.size(), " (sizes ", shape_to_string(sizes), ")");
  for (int64_t s : sizes) {
    DBRQ_ENSURE(s >= 0, ShapeError, "tensor sizes must be >= 0, got ", shape_to_string(sizes));
  }
}

int64_t product(IntArrayRef sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

}  // namespace

void Tensor::set_sizes_strides(IntArrayRef sizes, IntArrayRef strides) {
  check_sizes(sizes);
  ndim_ = static_cast<int8_t>(sizes.size());
  for (int i = 0; i < ndim_; ++i) {
    sizes_[i] = sizes[i];
    strides_[i] = strides[i];
  }
}

Tensor Tensor::empty(IntArrayRef sizes, DType dtype, MemoryFormat format) {
  check_sizes(sizes);
  if (format == MemoryFormat::kPreserve) format = MemoryFormat::kContiguous;
  DBRQ_ENSURE(format != MemoryFormat::kChannelsLast || sizes.size() == 4, ShapeError,
              "channels-last layout needs a 4-D tensor, got sizes ", shape_to_string(sizes));
  Tensor t;
  t.storage_ = Storage::allocate(static_cast<size_t>(product(sizes)) * dtype_size(dtype));
  t.dtype_ = dtype;
  int64_t st[kMaxDims];
  strides_into(sizes, format, st);
  t.set_sizes_strides(sizes, IntArrayRef(st, sizes.size()));
  return t;
}

Tensor Tensor::empty_lazy(IntArrayRef sizes, DType dtype, Storage::LazyFill fill) {
  check_sizes(sizes);
  Tensor t;
  t.storage_ = Storage::allocate(static_cast<size_t>(product(sizes)) * dtype_size(dtype), std::move(fill));
  t.dtype_ = dtype;
  int64_t st[kMaxDims];
  strides_into(sizes, MemoryFormat::kContiguous, st);
  t.set_sizes_strides(sizes, IntArrayRef(st, sizes.size()));
  return t;
}

Tensor Tensor::empty_strided(IntArrayRef sizes, IntArrayRef strides, DType dtype) {
  check_sizes(sizes);
  DBRQ_ENSURE(sizes.size() == strides.size(), ShapeError, "empty_strided: ", sizes.size(), " sizes but ",
              strides.size(), " strides");
  int64_t extent = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) {
      extent = 0;
      break;
    }
    DBRQ_ENSURE(strides[i] >= 0, ShapeError, "empty_strided: strides must be >= 0");
    extent += (sizes[i] - 1) * strides[i];
  }
  Tensor t;
  t.storage_ = Storage::allocate(static_cast<size_t>(extent) * dtype_size(dtype));
  t.dtype_ = dtype;
  t.set_sizes_strides(sizes, strides);
  return t;
}

Tensor Tensor::empty_like(const Tensor& like, DType dtype) {
  if (like.dim() == 4 && like.suggest_memory_format() == MemoryFormat::kChannelsLast) {
    return empty(like.sizes(), dtype, MemoryFormat::kChannelsLast);
  }
  if (like.is_non_overlapping_and_dense() && !like.is_contiguous()) {
    return empty_strided(like.sizes(), like.strides(), dtype);
  }
  return empty(like.sizes(), dtype);
}

Tensor Tensor::from_blob(void* data, IntArrayRef sizes, DType dtype, std::function<void()> release) {
  check_sizes(sizes);
  Tensor t;
  t.storage_ = Storage::wrap(data, static_cast<size_t>(product(sizes)) * dtype_size(dtype), std::move(release));
  t.dtype_ = dtype;
  int64_t st[kMaxDims];
  strides_into(sizes, MemoryFormat::kContiguous, st);
  t.set_sizes_strides(sizes, IntArrayRef(st, sizes.size()));
  return t;
}

// ---------------------------------------------------------------------------------------------
// Metadata

int64_t Tensor::numel() const { return product(sizes()); }

int64_t Tensor::wrap_dim(int64_t d) const {
  const int64_t n = ndim_;
  DBRQ_ENSURE(d >= -n && d < n, IndexError, "dim ", d, " is out of range for a ", n, "-D tensor (valid: ", -n,
              " to ", n - 1, ")");
  return d < 0 ? d + n : d;
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (!defined()) return false;
  if (format == MemoryFormat::kChannelsLast && ndim_ != 4) return false;
  if (format == MemoryFormat::kPreserve) return is_non_overlapping_and_dense();
  int64_t expected[kMaxDims];
  strides_into(sizes(), format, expected);
  for (int i = 0; i < ndim_; ++i) {
    if (sizes_[i] != 1 && strides_[i] != expected[i]) return false;
  }
  return true;
}

bool Tensor::is_non_overlapping_and_dense() const {
  if (!defined()) return false;
  if (numel() == 0) return true;
  // Dims of size 1 do not matter; the others, ordered by stride, must tile memory exactly.
  int perm[kMaxDims];
  int m = 0;
  for (int d = 0; d < ndim_; ++d) {
    if (sizes_[d] != 1) perm[m++] = d;
  }
  // Insertion sort: at most kMaxDims entries (std::sort here also draws a GCC -Warray-bounds false
  // positive for its 16-element threshold).
  for (int i = 1; i < m; ++i) {
    const int v = perm[i];
    int j = i;
    for (; j > 0 && strides_[perm[j - 1]] > strides_[v]; --j) perm[j] = perm[j - 1];
    perm[j] = v;
  }
  int64_t expected = 1;
  for (int i = 0; i < m; ++i) {
    if (strides_[perm[i]] != expected) return false;
    expected *= sizes_[perm[i]];
  }
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  if (ndim_ == 4 && is_channels_last() && !is_contiguous() && sizes_[1] > 1) return MemoryFormat::kChannelsLast;
  return MemoryFormat::kContiguous;
}

const void* Tensor::data_ptr() const {
  DBRQ_ENSURE(defined(), ValueError, "data access on an undefined tensor");
  check_has_values();
  return static_cast<const char*>(storage_->data()) + offset_ * static_cast<int64_t>(element_size());
}

void* Tensor::mutable_data_ptr() {
  DBRQ_ENSURE(defined(), ValueError, "data access on an undefined tensor");
  check_has_values();
  storage_->bump_version();
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(element_size());
}

void Tensor::throw_dtype_access(DType wanted) const {
  DBRQ_THROW(DTypeError, "tensor has dtype ", dtype_name(dtype_), " but was accessed as ", dtype_name(wanted));
}

void Tensor::throw_value_withheld() const {
  DBRQ_THROW(ControlFlowError, "tensor of sizes ", shape_string(),
             " has no values of its own: after convert it is the inner output of a fused int8 chain (a conv "
             "or linear whose batch norm, activation or residual add run in its kernel), so it was never "
             "computed on its own; read the chain's last output instead, or pass this tensor through an op "
             "(e.g. clone()) while calibrating, which keeps it out of the fusion");
}

void Tensor::throw_not_row_major(const char* accessor) const {
  DBRQ_THROW(UsageError, accessor, "<T>() of a tensor that is not contiguous (sizes ", shape_string(), ", strides ",
             shape_to_string(strides()), is_channels_last() ? ": channels-last, dbrq's layout for 4-D activations" : "",
             "): its memory is not in logical row-major order; call contiguous() first for that order, or raw_",
             accessor, "<T>() for memory order");
}

int64_t Tensor::offset_of(IntArrayRef index) const {
  DBRQ_ENSURE(defined(), ValueError, "element access on an undefined tensor");
  check_has_values();
  DBRQ_ENSURE(static_cast<int64_t>(index.size()) == ndim_, IndexError, "index ", shape_to_string(index),
              " has ", index.size(), " entries for a ", static_cast<int>(ndim_), "-D tensor of sizes ",
              shape_string());
  int64_t off = offset_;
  for (int d = 0; d < ndim_; ++d) {
    int64_t i = index[d];
    DBRQ_ENSURE(i >= -sizes_[d] && i < sizes_[d], IndexError, "index ", i, " is out of range for dim ", d,
                " of size ", sizes_[d]);
    if (i < 0) i += sizes_[d];
    off += i * strides_[d];
  }
  return off;
}

double Tensor::real_value(int32_t code, int64_t channel) const {
  const size_t c = qparams_->is_per_channel() ? static_cast<size_t>(channel) : 0;
  return static_cast<float>(code - qparams_->zero_points[c]) * qparams_->scales[c];
}

double Tensor::value_at(int64_t linear) const {
  DBRQ_ENSURE(defined(), ValueError, "element access on an undefined tensor");
  const int64_t n = numel();
  DBRQ_ENSURE(linear >= 0 && linear < n, IndexError, "element ", linear, " is out of range for ", n, " elements");
  check_has_values();
  int64_t off = offset_;
  for (int d = ndim_ - 1; d >= 0; --d) {
    off += (linear % sizes_[d]) * strides_[d];
    linear /= sizes_[d];
  }
  if (dtype_ == DType::kBF16) {
    uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(storage_->data())[off]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  return visit_dtype(dtype_, [&](auto tag) -> double {
    using S = decltype(tag);
    return static_cast<double>(static_cast<const S*>(storage_->data())[off]);
  });
}

float Tensor::q_scale() const {
  DBRQ_ENSURE(qparams_ != nullptr && !qparams_->is_per_channel(), DTypeError,
              "q_scale(): tensor is not per-tensor quantized (dtype ", dtype_name(dtype_), ")");
  return qparams_->scale();
}

int32_t Tensor::q_zero_point() const {
  DBRQ_ENSURE(qparams_ != nullptr && !qparams_->is_per_channel(), DTypeError,
              "q_zero_point(): tensor is not per-tensor quantized (dtype ", dtype_name(dtype_), ")");
  return qparams_->zero_point();
}

Tensor Tensor::int_repr() const {
  DBRQ_ENSURE(is_quantized(), DTypeError, "int_repr(): the tensor is not quantized (dtype ", dtype_name(dtype_),
              ", no quantization parameters)");
  return with_qparams(nullptr);
}

Tensor Tensor::with_qparams(QuantParamsPtr qparams) const {
  if (qparams != nullptr) {
    DBRQ_ENSURE(is_quantized_dtype(dtype_), DTypeError, "quantization parameters need an s8 or u8 tensor, got ",
                dtype_name(dtype_));
    if (qparams->is_per_channel()) {
      DBRQ_ENSURE(qparams->axis < ndim_ && static_cast<int64_t>(qparams->scales.size()) == sizes_[qparams->axis],
                  ShapeError, "per-channel parameters along axis ", qparams->axis, " have ", qparams->scales.size(),
                  " scales for sizes ", shape_string());
    }
  }
  Tensor t = *this;
  t.qparams_ = std::move(qparams);
  return t;
}

// ---------------------------------------------------------------------------------------------
// Raw views

Tensor Tensor::raw_as_strided(IntArrayRef sizes, IntArrayRef strides, int64_t storage_offset) const {
  Tensor t = *this;
  t.set_sizes_strides(sizes, strides);
  t.offset_ = storage_offset;
  t.trace_id_ = 0;
  t.trace_origin_ = 0;
  return t;
}

Tensor Tensor::raw_view(IntArrayRef new_sizes) const {
  // Follows PyTorch's computeStride: group old dims into contiguous chunks and split each chunk
  // into the new dims that cover it.
  check_sizes(new_sizes);
  const int64_t n = numel();
  DBRQ_ENSURE(product(new_sizes) == n, ShapeError, "cannot view a tensor of sizes ", shape_string(), " (", n,
              " elements) as ", shape_to_string(new_sizes));
  int64_t new_strides[kMaxDims];
  if (n == 0 || ndim_ == 0) {  // nothing to keep, or a scalar: every new dim has size 1
    strides_into(new_sizes, MemoryFormat::kContiguous, new_strides);
    return raw_as_strided(new_sizes, IntArrayRef(new_strides, new_sizes.size()), offset_);
  }
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = ndim_ > 0 ? strides_[ndim_ - 1] : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = ndim_ - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= sizes_[tensor_d];
    if (tensor_d == 0 || (sizes_[tensor_d - 1] != 1 && strides_[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return Tensor();
      if (tensor_d > 0) {
        chunk_base_stride = strides_[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return Tensor();
  return raw_as_strided(new_sizes, IntArrayRef(new_strides, new_sizes.size()), offset_);
}

Tensor Tensor::raw_permute(IntArrayRef dims) const {
  DBRQ_ENSURE(static_cast<int64_t>(dims.size()) == ndim_, ShapeError, "permute: ", dims.size(),
              " dims given for a ", static_cast<int>(ndim_), "-D tensor");
  int64_t sz[kMaxDims], st[kMaxDims];
  bool seen[kMaxDims] = {};
  for (int i = 0; i < ndim_; ++i) {
    const int64_t d = wrap_dim(dims[i]);
    DBRQ_ENSURE(!seen[d], ValueError, "permute: dim ", d, " appears twice in ", shape_to_string(dims));
    seen[d] = true;
    sz[i] = sizes_[d];
    st[i] = strides_[d];
  }
  Tensor t = raw_as_strided(IntArrayRef(sz, ndim_), IntArrayRef(st, ndim_), offset_);
  if (qparams_ && qparams_->is_per_channel()) {
    for (int i = 0; i < ndim_; ++i) {
      if (wrap_dim(dims[i]) == qparams_->axis) {
        auto p = std::make_shared<QuantParams>(*qparams_);
        p->axis = i;
        t.qparams_ = std::move(p);
      }
    }
  }
  return t;
}

Tensor Tensor::raw_narrow(int64_t dim, int64_t start, int64_t length) const {
  const int64_t d = wrap_dim(dim);
  if (start < 0) start += sizes_[d];
  DBRQ_ENSURE(start >= 0 && length >= 0 && start + length <= sizes_[d], IndexError, "narrow: range [", start, ", ",
              start + length, ") is out of bounds for dim ", d, " of size ", sizes_[d]);
  int64_t sz[kMaxDims];
  std::copy(sizes_, sizes_ + ndim_, sz);
  sz[d] = length;
  Tensor t = raw_as_strided(IntArrayRef(sz, ndim_), strides(), offset_ + start * strides_[d]);
  if (qparams_ && qparams_->is_per_channel() && qparams_->axis == d) {
    // Per-channel parameters follow their channels into the view.
    auto p = std::make_shared<QuantParams>(*qparams_);
    p->scales.assign(qparams_->scales.begin() + start, qparams_->scales.begin() + start + length);
    p->zero_points.assign(qparams_->zero_points.begin() + start, qparams_->zero_points.begin() + start + length);
    t.qparams_ = std::move(p);
  }
  return t;
}

Tensor Tensor::raw_with_dtype(DType dtype) const {
  DBRQ_CHECK(dtype_size(dtype) == dtype_size(dtype_), "reinterpret needs equal element sizes");
  Tensor t = *this;
  t.dtype_ = dtype;
  t.qparams_ = nullptr;
  return t;
}

// ---------------------------------------------------------------------------------------------
// Printing

std::string Tensor::shape_string() const { return shape_to_string(sizes()); }

namespace {

void print_values(std::ostream& os, const Tensor& t, int dim, int64_t base, const std::vector<int64_t>& cum,
                  int indent) {
  constexpr int64_t kEdge = 3;  // elements shown at each end of a long dim
  const int64_t n = t.size(dim);
  const bool elide = n > 2 * kEdge + 1;
  os << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (elide && i == kEdge) {
      os << (dim + 1 == t.dim() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdge;
    }
    const int64_t idx = base + i * cum[dim];
    if (dim + 1 == t.dim()) {
      const double v = t.value_at(idx);
      if (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16) {
        os << absl::StrFormat("%.4g", v);
      } else {
        os << static_cast<int64_t>(v);
      }
    } else {
      print_values(os, t, dim + 1, idx, cum, indent + 1);
    }
    if (i + 1 < n) os << (dim + 1 == t.dim() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << "]";
}

}  // namespace

std::string Tensor::to_string() const {
  std::ostringstream os;
  if (!defined()) return "tensor(undefined)";
  os << "tensor(";
  if (ndim_ == 0) {
    os << value_at(0);
  } else {
    std::vector<int64_t> cum(ndim_);
    int64_t c = 1;
    for (int d = ndim_ - 1; d >= 0; --d) {
      cum[d] = c;
      c *= sizes_[d];
    }
    if (numel() == 0) {
      os << "[]";
    } else {
      print_values(os, *this, 0, 0, cum, 7);
    }
  }
  os << ", sizes=" << shape_string() << ", dtype=" << dtype_name(dtype_);
  if (is_channels_last() && !is_contiguous()) os << ", channels_last";
  if (qparams_) os << ", " << qparams_->to_string();
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }

// ---------------------------------------------------------------------------------------------
// Creation helpers

Tensor full(IntArrayRef sizes, double value, DType dtype) {
  Tensor t = Tensor::empty(sizes, dtype);
  const int64_t n = t.numel();
  if (dtype == DType::kBF16) {
    float f = static_cast<float>(value);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    auto* p = static_cast<uint16_t*>(t.mutable_data_ptr());
    std::fill(p, p + n, static_cast<uint16_t>(bits >> 16));
    return t;
  }
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.raw_mutable_data<T>();
    std::fill(p, p + n, static_cast<T>(value));
  });
  return t;
}

Tensor zeros(IntArrayRef sizes, DType dtype) { return full(sizes, 0.0, dtype); }
Tensor ones(IntArrayRef sizes, DType dtype) { return full(sizes, 1.0, dtype); }

Tensor arange(double start, double end, double step, DType dtype) {
  DBRQ_ENSURE(step != 0 && std::isfinite(step), ValueError, "arange: step must be finite and non-zero, got ", step);
  const double span = (end - start) / step;
  const int64_t n = span > 0 ? static_cast<int64_t>(std::ceil(span)) : 0;
  Tensor t = Tensor::empty({n}, dtype);
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    T* p = t.raw_mutable_data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<double>(i) * step);
  });
  return t;
}

Tensor randn(IntArrayRef sizes, uint64_t seed) {
  Tensor t = Tensor::empty(sizes, DType::kF32);
  float* p = t.raw_mutable_data<float>();
  // Box-Muller over mt19937_64: fully specified, so the same seed gives the same values with any
  // standard library.
  std::mt19937_64 gen(seed);
  const int64_t n = t.numel();
  constexpr double kTwoPi = 6.283185307179586;
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(gen() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    const double u2 = static_cast<double>(gen() >> 11) * (1.0 / 9007199254740992.0);
    const double r = std::sqrt(-2.0 * std::log(u1));
    p[i] = static_cast<float>(r * std::cos(kTwoPi * u2));
    if (i + 1 < n) p[i + 1] = static_cast<float>(r * std::sin(kTwoPi * u2));
  }
  return t;
}

Tensor rand_uniform(IntArrayRef sizes, double low, double high, uint64_t seed) {
  DBRQ_ENSURE(low < high, ValueError, "rand_uniform: low (", low, ") must be < high (", high, ")");
  Tensor t = Tensor::empty(sizes, DType::kF32);
  float* p = t.raw_mutable_data<float>();
  std::mt19937_64 gen(seed);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(gen() >> 11) * (1.0 / 9007199254740992.0);
    p[i] = static_cast<float>(low + (high - low) * u);
  }
  return t;
}

}  // namespace dbrq
