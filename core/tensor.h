// dbrq::Tensor: an n-dimensional view over reference-counted storage.
//
//   dbrq::Tensor x = dbrq::randn({1, 3, 224, 224}, /*seed=*/0);
//   dbrq::Tensor y = x.contiguous(dbrq::MemoryFormat::kChannelsLast);  // same sizes, NHWC strides
//   float v = y.at<float>({0, 1, 2, 3});
//   dbrq::Tensor q = dbrq::quantize_per_tensor(x, 0.02f, 128, dbrq::DType::kU8);
//   std::cout << q;   // tensor([...], dtype=u8, scale=0.02, zero_point=128)
//
// A Tensor is a value: copying one copies sizes, strides and quantization parameters and shares the
// storage (like PyTorch, `b = a; b.add_(1)` changes what `a` sees). Sizes are logical (NCHW for
// images); strides say how they are laid out, so a channels-last activation is an NCHW tensor with
// NHWC strides, and every oneDNN op can read it without a reorder.
//
// The methods below that compute something (reshape, permute, contiguous, add_, ...) are ops: they
// go through the dispatcher like the functions in ops.h, so the quantization tracer sees them. They
// are declared here and defined in the runtime library (ops.cc). The `raw_*` members are the
// metadata-only primitives kernels use; they never dispatch.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/types/span.h"
#include "core/dim_vector.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/storage.h"

namespace dbrq {

using IntArrayRef = absl::Span<const int64_t>;

enum class MemoryFormat : uint8_t {
  kContiguous,    // row-major over the logical sizes
  kChannelsLast,  // 4-D only: NHWC strides for NCHW sizes
  kPreserve,      // keep the source's layout when it is dense, else contiguous
};

// Quantization parameters of an s8/u8 tensor: real = scale * (q - zero_point).
// Immutable once attached to a tensor and shared between tensors (so converted models allocate no
// parameter objects per call).
struct QuantParams {
  std::vector<float> scales;          // one per tensor, or one per channel along `axis`
  std::vector<int32_t> zero_points;   // same length as scales
  int64_t axis = -1;                  // -1: per-tensor; else the per-channel dim

  static std::shared_ptr<const QuantParams> per_tensor(float scale, int32_t zero_point);
  static std::shared_ptr<const QuantParams> per_channel(std::vector<float> scales,
                                                        std::vector<int32_t> zero_points,
                                                        int64_t axis);
  bool is_per_channel() const { return axis >= 0; }
  float scale() const { return scales[0]; }
  int32_t zero_point() const { return zero_points[0]; }
  bool operator==(const QuantParams& o) const {
    return axis == o.axis && scales == o.scales && zero_points == o.zero_points;
  }
  std::string to_string() const;
};
using QuantParamsPtr = std::shared_ptr<const QuantParams>;

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false; most ops reject it

  static Tensor empty(IntArrayRef sizes, DType dtype = DType::kF32,
                      MemoryFormat format = MemoryFormat::kContiguous);
  static Tensor empty_strided(IntArrayRef sizes, IntArrayRef strides, DType dtype = DType::kF32);
  // An uninitialized tensor with `like`'s sizes and, when `like` is dense, its layout.
  static Tensor empty_like(const Tensor& like, DType dtype);
  static Tensor empty_like(const Tensor& like) { return empty_like(like, like.dtype()); }
  // A contiguous tensor whose contents `fill` computes on first data access (Storage::allocate
  // with a LazyFill). Metadata (sizes, dtype, storage identity) needs no access.
  static Tensor empty_lazy(IntArrayRef sizes, DType dtype, Storage::LazyFill fill);
  // Wraps external memory (contiguous); `release` runs when the last view dies.
  static Tensor from_blob(void* data, IntArrayRef sizes, DType dtype,
                          std::function<void()> release = nullptr);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  int64_t dim() const { return ndim_; }
  IntArrayRef sizes() const { return IntArrayRef(sizes_, ndim_); }
  IntArrayRef strides() const { return IntArrayRef(strides_, ndim_); }
  // Negative dims count from the end. Throws IndexError when out of range.
  int64_t size(int64_t d) const { return sizes_[wrap_dim(d)]; }
  int64_t stride(int64_t d) const { return strides_[wrap_dim(d)]; }
  int64_t numel() const;
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  int64_t storage_offset() const { return offset_; }
  int64_t wrap_dim(int64_t d) const;

  bool is_contiguous(MemoryFormat format = MemoryFormat::kContiguous) const;
  bool is_channels_last() const { return is_contiguous(MemoryFormat::kChannelsLast); }
  // Dense: the elements fill [data, data + numel) with no gaps or overlap, in some dim order.
  bool is_non_overlapping_and_dense() const;
  // kChannelsLast for channels-last 4-D tensors (that are not also contiguous), else kContiguous.
  MemoryFormat suggest_memory_format() const;

  // Elements in logical row-major order: the tensor must be contiguous. dbrq keeps 4-D activations
  // channels-last internally (a conv's output has NCHW sizes and NHWC strides), where PyTorch code
  // written for NCHW would read raw memory in the wrong order without noticing: that raises
  // UsageError ("call contiguous() first") instead. Mutable access bumps the storage version.
  template <typename T>
  const T* data() const {
    check_row_major("data");
    return raw_data<T>();
  }
  template <typename T>
  T* mutable_data() {
    check_row_major("mutable_data");
    return raw_mutable_data<T>();
  }
  // Raw memory in the tensor's own layout (strides), for kernels and code that reads strides.
  const void* data_ptr() const;
  void* mutable_data_ptr();
  template <typename T>
  const T* raw_data() const {
    check_dtype_for<T>();
    return static_cast<const T*>(data_ptr());
  }
  template <typename T>
  T* raw_mutable_data() {
    check_dtype_for<T>();
    return static_cast<T*>(mutable_data_ptr());
  }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // Element access by logical index, for tests and debugging (slow).
  // A quantized tensor reads as real values (scale * (code - zero_point)) converted to T, whatever
  // T is, as PyTorch's item() and tolist() do: after convert, a tensor user code reads inside
  // forward may be int8 where the fp32 model had f32, and `d.item<int64_t>()` must mean the same
  // in both (it returned the code, 125 for 2.3). The codes: int_repr(). As with an f32 tensor,
  // T must hold the values: a negative value read as an unsigned T is undefined.
  template <typename T>
  T at(IntArrayRef index) const;
  template <typename T>
  T at(std::initializer_list<int64_t> index) const {
    return at<T>(IntArrayRef(index.begin(), index.size()));
  }
  template <typename T>
  T item() const;
  // Elements in logical row-major order, converted to T (quantized: real values, as at()).
  template <typename T>
  std::vector<T> to_vector() const;
  // Element as double, whatever the dtype (raw integer for quantized tensors).
  double value_at(int64_t linear_logical_index) const;

  // Quantization parameters (s8/u8 only).
  bool is_quantized() const { return qparams_ != nullptr; }
  const QuantParams* qparams() const { return qparams_.get(); }
  const QuantParamsPtr& qparams_ptr() const { return qparams_; }
  // Per-tensor scale / zero point; throws DTypeError for unquantized or per-channel tensors.
  float q_scale() const;
  int32_t q_zero_point() const;
  // Same data, new parameters (null drops them). Throws DTypeError unless s8/u8.
  Tensor with_qparams(QuantParamsPtr qparams) const;
  // The int8 codes of a quantized tensor as a plain s8/u8 tensor (same storage, no parameters),
  // like PyTorch's int_repr(). Throws DTypeError unless quantized.
  Tensor int_repr() const;

  // Metadata-only primitives for kernels; they never dispatch and never copy.
  Tensor raw_as_strided(IntArrayRef sizes, IntArrayRef strides, int64_t storage_offset) const;
  // A view with new sizes when the strides allow it; an undefined tensor otherwise.
  Tensor raw_view(IntArrayRef sizes) const;
  Tensor raw_permute(IntArrayRef dims) const;
  Tensor raw_narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor raw_with_dtype(DType dtype) const;  // reinterprets the same bytes; sizes of equal width

  // Dispatching methods (see ops.h for the semantics).
  Tensor reshape(IntArrayRef sizes) const;
  Tensor reshape(std::initializer_list<int64_t> sizes) const {
    return reshape(IntArrayRef(sizes.begin(), sizes.size()));
  }
  Tensor view(IntArrayRef sizes) const;
  Tensor view(std::initializer_list<int64_t> sizes) const {
    return view(IntArrayRef(sizes.begin(), sizes.size()));
  }
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor permute(IntArrayRef dims) const;
  Tensor permute(std::initializer_list<int64_t> dims) const {
    return permute(IntArrayRef(dims.begin(), dims.size()));
  }
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor squeeze() const;  // every size-1 dim
  Tensor expand(IntArrayRef sizes) const;
  Tensor expand(std::initializer_list<int64_t> sizes) const {
    return expand(IntArrayRef(sizes.begin(), sizes.size()));
  }
  Tensor repeat(IntArrayRef repeats) const;
  // condition ? *this : other (ops.h where).
  Tensor where(const Tensor& condition, const Tensor& other) const;
  Tensor pow(double exponent) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor sqrt() const;
  Tensor exp() const;
  std::tuple<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  std::tuple<Tensor, Tensor> topk(int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true) const;
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor repeat(std::initializer_list<int64_t> repeats) const {
    return repeat(IntArrayRef(repeats.begin(), repeats.size()));
  }
  Tensor contiguous(MemoryFormat format = MemoryFormat::kContiguous) const;
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor dequantize() const;

  // Methods mirroring the functional API of runtime/ops.h, as PyTorch's Tensor methods:
  // x.mean({2, 3}) is dbrq::mean(x, {2, 3}), the same dispatched op (recorded and quantized alike).
  Tensor add(const Tensor& other) const;
  Tensor add(double other) const;
  Tensor sub(const Tensor& other) const;
  Tensor sub(double other) const;
  Tensor mul(const Tensor& other) const;
  Tensor mul(double other) const;
  Tensor div(const Tensor& other) const;
  Tensor div(double other) const;
  Tensor matmul(const Tensor& other) const;
  Tensor relu() const;
  Tensor sigmoid() const;
  Tensor tanh() const;
  Tensor clamp(double min, double max) const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor mean(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor sum(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  // PyTorch's chunk and split: views (narrow) along dim. chunk: ceil(size / chunks) per piece, so
  // possibly fewer pieces; split: pieces of split_size (the last may be smaller), or of the given
  // sizes, which must add up to the dim's size.
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0) const;
  std::vector<Tensor> split(std::vector<int64_t> split_sizes, int64_t dim = 0) const;
  std::vector<Tensor> split_with_sizes(std::vector<int64_t> split_sizes, int64_t dim = 0) const {
    return split(std::move(split_sizes), dim);
  }

  // In-place ops; they may rebind *this (e.g. an int8 tensor that must become f32).
  Tensor& add_(const Tensor& other);
  Tensor& add_(double other);
  Tensor& sub_(const Tensor& other);
  Tensor& sub_(double other);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double other);
  Tensor& div_(double other);
  Tensor& relu_();
  Tensor& clamp_(double min, double max);
  Tensor& copy_(const Tensor& src);  // same sizes (or broadcastable); converts dtype
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }

  // Opaque tags for interceptors (the quantization tracer stores where the tensor came from:
  // trace_id, its producer as the enclosing module sees it; trace_origin, the producing record,
  // model-wide). Copies keep them, raw_* views reset them to 0, and an op that returns its input
  // unchanged returns it as is.
  int64_t trace_id() const { return trace_id_; }
  void set_trace_id(int64_t id) { trace_id_ = id; }
  int64_t trace_origin() const { return trace_origin_; }
  void set_trace_origin(int64_t id) { trace_origin_ = id; }
  // Set by an interceptor on a tensor whose storage does not hold its values: after convert, the
  // inner output of a fused int8 chain (a conv whose batch norm, relu or residual add run in its
  // kernel) was never computed on its own, and its storage holds the chain's result, or nothing
  // yet. Reading or writing its elements (data_ptr, at, item, to_vector, printing, an eager op,
  // saving) raises ControlFlowError instead of handing out those bytes. Copies and raw views keep
  // it: a view of such a tensor has no values either.
  bool value_withheld() const { return value_withheld_; }
  void set_value_withheld(bool withheld) { value_withheld_ = withheld; }

  std::string to_string() const;
  std::string shape_string() const;  // "[1, 3, 224, 224]"

 private:
  template <typename T>
  void check_dtype_for() const {
    if (DTypeOf<T>::value != dtype_) throw_dtype_access(DTypeOf<T>::value);
  }
  [[noreturn]] void throw_dtype_access(DType wanted) const;
  void check_has_values() const {
    if (__builtin_expect(value_withheld_, 0)) throw_value_withheld();
  }
  [[noreturn]] void throw_value_withheld() const;
  void check_row_major(const char* accessor) const {
    if (!is_contiguous()) throw_not_row_major(accessor);
  }
  [[noreturn]] void throw_not_row_major(const char* accessor) const;
  int64_t offset_of(IntArrayRef index) const;
  // index[dim], wrapped (offset_of checked it).
  int64_t wrap_index(IntArrayRef index, int64_t dim) const {
    return index[dim] < 0 ? index[dim] + sizes_[dim] : index[dim];
  }
  // scale * (code - zero_point) in float, of `channel` for per-channel parameters.
  double real_value(int32_t code, int64_t channel) const;
  void set_sizes_strides(IntArrayRef sizes, IntArrayRef strides);

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  int64_t sizes_[kMaxDims] = {};
  int64_t strides_[kMaxDims] = {};  // in elements
  int8_t ndim_ = 0;
  DType dtype_ = DType::kF32;
  bool value_withheld_ = false;
  QuantParamsPtr qparams_;
  int64_t trace_id_ = 0;
  int64_t trace_origin_ = 0;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string shape_to_string(IntArrayRef sizes);
// Row-major (kContiguous) or NHWC (kChannelsLast) strides for `sizes`.
std::vector<int64_t> strides_for(IntArrayRef sizes, MemoryFormat format);

// ---- creation helpers (not ops: they have no tensor inputs, so the tracer has nothing to see) ----
Tensor zeros(IntArrayRef sizes, DType dtype = DType::kF32);
Tensor ones(IntArrayRef sizes, DType dtype = DType::kF32);
Tensor full(IntArrayRef sizes, double value, DType dtype = DType::kF32);
// [start, end) with `step`; f32 unless dtype says otherwise.
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::kF32);
inline Tensor arange(int64_t end, DType dtype = DType::kF32) {
  return arange(0.0, static_cast<double>(end), 1.0, dtype);
}
// Standard normal samples from a seeded generator: the same seed gives the same tensor everywhere.
Tensor randn(IntArrayRef sizes, uint64_t seed);
// Uniform samples in [low, high).
Tensor rand_uniform(IntArrayRef sizes, double low, double high, uint64_t seed);
template <typename T>
Tensor from_vector(const std::vector<T>& values, IntArrayRef sizes);
template <typename T>
Tensor from_vector(const std::vector<T>& values) {
  int64_t n = static_cast<int64_t>(values.size());
  return from_vector(values, IntArrayRef(&n, 1));
}

// Convenience overloads taking brace lists: zeros({2, 3}).
inline Tensor zeros(std::initializer_list<int64_t> s, DType dt = DType::kF32) {
  return zeros(IntArrayRef(s.begin(), s.size()), dt);
}
inline Tensor ones(std::initializer_list<int64_t> s, DType dt = DType::kF32) {
  return ones(IntArrayRef(s.begin(), s.size()), dt);
}
inline Tensor full(std::initializer_list<int64_t> s, double v, DType dt = DType::kF32) {
  return full(IntArrayRef(s.begin(), s.size()), v, dt);
}
inline Tensor randn(std::initializer_list<int64_t> s, uint64_t seed) {
  return randn(IntArrayRef(s.begin(), s.size()), seed);
}
template <typename T>
Tensor from_vector(const std::vector<T>& values, std::initializer_list<int64_t> s) {
  return from_vector(values, IntArrayRef(s.begin(), s.size()));
}

// Walks a dense (non-overlapping and dense) tensor in memory order by runs of consecutive elements
// that share one index along a dimension of stride `stride` and size `size`: calls
// f(first, end, index) for each run [first, end) of a tensor of `numel` elements. Per-channel loops
// use it to look up a channel's parameters once per run instead of dividing per element.
template <typename F>
void for_each_channel_run(int64_t numel, int64_t stride, int64_t size, F&& f) {
  for (int64_t first = 0, run = 0; first < numel; first += stride, ++run) {
    f(first, first + stride < numel ? first + stride : numel, run % size);
  }
}

}  // namespace dbrq

#include "core/tensor_inl.h"
