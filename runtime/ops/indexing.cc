// The indexing family (issue 12): max / argmax along a dim, topk, index_select, gather. fp32
// values (index_select and gather take any dtype of 1, 4 or 8 bytes), s64 indices as PyTorch's
// int64. max and topk return values and indices as two dispatched ops each ("max" / "argmax",
// "topk" / "topk_indices"): an op yields one tensor.
//
// On int8 they run on codes (issue 12, item 3): a u8 tensor with per-tensor parameters orders its
// codes as its real values (scale > 0), so max / topk values pick codes and keep the input's
// parameters (QuantRole::kShare, as PyTorch's quantized max / topk), argmax / topk indices take
// the codes as they are (takes_int8: no dequantize), and index_select / gather copy codes
// (kShare).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>
#include <vector>

#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

// x (contiguous) as [outer, n, inner] around dim d.
struct Slices {
  int64_t outer = 1, n = 1, inner = 1, d = 0;
};

Slices slices(const Tensor& x, int64_t d) {
  Slices s;
  s.d = d;
  for (int64_t i = 0; i < d; ++i) s.outer *= x.size(i);
  s.n = x.size(d);
  for (int64_t i = d + 1; i < x.dim(); ++i) s.inner *= x.size(i);
  return s;
}

DimVector reduced_sizes(const Tensor& x, int64_t d, bool keepdim, int64_t keep = 1) {
  DimVector out;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i != d) {
      out.push_back(x.size(i));
    } else if (keepdim) {
      out.push_back(keep);
    }
  }
  return out;
}

// NaN is larger than everything (PyTorch's max propagates it); the first of equal values wins.
inline bool greater(float a, float b) { return (std::isnan(a) && !std::isnan(b)) || a > b; }

// f32, or u8 codes with per-tensor parameters (ordered as their real values: scale > 0).
bool check_ordered(const char* op, const Tensor& x) {
  check_defined(op, "input", x);
  if (x.dtype() == DType::kU8 && x.is_quantized()) {
    DBRQ_ENSURE(!x.qparams()->is_per_channel(), DTypeError, op,
                ": an int8 input needs per-tensor parameters (codes of per-channel parameters are not ordered as "
                "their values), got ",
                x.qparams()->to_string());
    return true;
  }
  DBRQ_ENSURE(x.dtype() == DType::kF32, DTypeError, op, ": input must have dtype f32 or be quantized u8, got ",
              dtype_name(x.dtype()), x.dtype() == DType::kU8 ? " (not quantized)" : "");
  return false;
}

// x's elements as f32: the values, or the codes of a quantized u8 tensor.
std::vector<float> ordered_values(const Tensor& x, bool codes) {
  if (!codes) return x.to_vector<float>();
  const std::vector<int32_t> q = x.int_repr().to_vector<int32_t>();
  return std::vector<float>(q.begin(), q.end());
}

// Writes the value at `src` of x (f32 or u8 codes) to position `at` of out.
inline void put_value(Tensor& out, int64_t at, const Tensor& x, int64_t src, bool codes) {
  if (codes) {
    static_cast<uint8_t*>(out.mutable_data_ptr())[at] = x.raw_data<uint8_t>()[src];
  } else {
    out.raw_mutable_data<float>()[at] = x.raw_data<float>()[src];
  }
}

// kMax / kArgmax: DimParams dims = {dim}, keepdim.
Tensor run_max_or_argmax(const OpCall& c) {
  const bool values = c.kind == OpKind::kMax;
  const char* name = values ? "max" : "argmax";
  const bool codes = check_ordered(name, c.input(0));
  const Tensor x = codes ? kernels::contiguous(c.input(0)).with_qparams(c.input(0).qparams_ptr())
                         : kernels::contiguous(c.input(0));
  const DimParams& p = c.p<DimParams>();
  DBRQ_ENSURE(x.dim() >= 1, ShapeError, name, ": needs a tensor of at least 1 dim, got a 0-D tensor");
  const int64_t d = x.wrap_dim(p.dims.at(0));
  DBRQ_ENSURE(x.size(d) > 0, ShapeError, name, ": cannot reduce dim ", d, " of size 0 (sizes ", x.shape_string(), ")");
  const Slices s = slices(x, d);
  Tensor out = Tensor::empty(reduced_sizes(x, d, p.keepdim),
                             values ? (codes ? DType::kU8 : DType::kF32) : DType::kS64);
  if (values && codes) out = out.with_qparams(x.qparams_ptr());
  const std::vector<float> all = ordered_values(x, codes);
  const float* in = all.data();
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      const float* base = in + o * s.n * s.inner + i;
      int64_t best = 0;
      for (int64_t k = 1; k < s.n; ++k) {
        if (greater(base[k * s.inner], base[best * s.inner])) best = k;
      }
      if (values) {
        put_value(out, o * s.inner + i, x, o * s.n * s.inner + i + best * s.inner, codes);
      } else {
        out.raw_mutable_data<int64_t>()[o * s.inner + i] = best;
      }
    }
  }
  return out;
}

// kTopk / kTopkIndices: ShapeParams sizes = {dim, k}, start = largest, length = sorted.
Tensor run_topk(const OpCall& c) {
  const bool codes = check_ordered("topk", c.input(0));
  const Tensor x = codes ? kernels::contiguous(c.input(0)).with_qparams(c.input(0).qparams_ptr())
                         : kernels::contiguous(c.input(0));
  const ShapeParams& p = c.p<ShapeParams>();
  const int64_t d = x.dim() == 0 ? 0 : x.wrap_dim(p.sizes.at(0));
  const int64_t n = x.dim() == 0 ? 1 : x.size(d), k = p.sizes.at(1);
  const bool largest = p.start != 0;
  DBRQ_ENSURE(k >= 0 && k <= n, ValueError, "topk: k (", k, ") is out of range for dim ", d, " of size ", n);
  const Slices s = x.dim() == 0 ? Slices{} : slices(x, d);
  DimVector sizes(x.sizes().begin(), x.sizes().end());
  if (x.dim() > 0) sizes[d] = k;
  const bool values = c.kind == OpKind::kTopk;
  Tensor out = Tensor::empty(sizes, values ? (codes ? DType::kU8 : DType::kF32) : DType::kS64);
  if (values && codes) out = out.with_qparams(x.qparams_ptr());
  const std::vector<float> all = ordered_values(x, codes);
  const float* in = all.data();
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      const float* base = in + o * s.n * s.inner + i;
      std::iota(order.begin(), order.end(), 0);
      // NaN counts as the largest value; ties keep the lower index first.
      auto before = [&](int64_t a, int64_t b) {
        const float va = base[a * s.inner], vb = base[b * s.inner];
        return largest ? greater(va, vb) : greater(vb, va);
      };
      std::stable_sort(order.begin(), order.end(), before);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = (o * k + j) * s.inner + i;
        if (values) {
          put_value(out, at, x, o * s.n * s.inner + i + order[j] * s.inner, codes);
        } else {
          out.raw_mutable_data<int64_t>()[at] = order[j];
        }
      }
    }
  }
  return out;
}

// An index tensor's values as int64 (s64 or s32, as embedding takes).
std::vector<int64_t> index_values(const char* op, const Tensor& index) {
  check_defined(op, "index", index);
  DBRQ_ENSURE(!index.is_quantized() && (index.dtype() == DType::kS64 || index.dtype() == DType::kS32), DTypeError, op,
              ": index must be s64 (or s32), got ", dtype_name(index.dtype()));
  if (index.dtype() == DType::kS64) return index.to_vector<int64_t>();
  const std::vector<int32_t> v = index.to_vector<int32_t>();
  return std::vector<int64_t>(v.begin(), v.end());
}

void check_elements(const char* op, const Tensor& x) {
  check_defined(op, "input", x);
  DBRQ_ENSURE(x.dtype() != DType::kBF16, DTypeError, op, ": dtype ", dtype_name(x.dtype()), " is not supported");
}

// kIndexSelect: DimParams dims = {dim}; inputs x, index (1-D).
Tensor run_index_select(const OpCall& c) {
  check_elements("index_select", c.input(0));
  const Tensor x = kernels::contiguous(c.input(0));
  const Tensor& index = c.input(1);
  const std::vector<int64_t> idx = index_values("index_select", index);
  DBRQ_ENSURE(index.dim() <= 1, ShapeError, "index_select: index must be 1-D, got sizes ", index.shape_string());
  const int64_t d = x.dim() == 0 ? 0 : x.wrap_dim(c.p<DimParams>().dims.at(0));
  // A 0-D input has one element: PyTorch takes one index value (more wrote past the 1-element output).
  DBRQ_ENSURE(x.dim() > 0 || idx.size() == 1, IndexError, "index_select: a 0-D input takes exactly one index value, got ",
              idx.size());
  const Slices s = x.dim() == 0 ? Slices{} : slices(x, d);
  for (int64_t v : idx) {
    DBRQ_ENSURE(v >= 0 && v < s.n, IndexError, "index_select: index ", v, " is out of range for dim ", d, " of size ",
                s.n);
  }
  DimVector sizes(x.sizes().begin(), x.sizes().end());
  if (x.dim() > 0) sizes[d] = static_cast<int64_t>(idx.size());
  Tensor out = Tensor::empty(sizes, x.dtype()).with_qparams(x.qparams_ptr());
  const size_t es = x.element_size(), row = static_cast<size_t>(s.inner) * es;
  const char* in = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.mutable_data_ptr());
  const int64_t m = static_cast<int64_t>(idx.size());
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t j = 0; j < m; ++j) {
      std::memcpy(dst + (o * m + j) * row, in + (o * s.n + idx[j]) * row, row);
    }
  }
  return out;
}

// kGather: DimParams dims = {dim}; out[i...] = x[... index[i...] at dim ...], index has x's rank
// and sizes <= x's outside dim.
Tensor run_gather(const OpCall& c) {
  check_elements("gather", c.input(0));
  const Tensor& x = c.input(0);
  const Tensor& index = c.input(1);
  const std::vector<int64_t> idx = index_values("gather", index);
  DBRQ_ENSURE(index.dim() == x.dim(), ShapeError, "gather: index must have as many dims as the input (", x.dim(),
              "), got sizes ", index.shape_string());
  const int64_t d = x.dim() == 0 ? 0 : x.wrap_dim(c.p<DimParams>().dims.at(0));
  for (int64_t i = 0; i < x.dim(); ++i) {
    DBRQ_ENSURE(i == d || index.size(i) <= x.size(i), ShapeError, "gather: index sizes ", index.shape_string(),
                " exceed the input's ", x.shape_string(), " at dim ", i);
  }
  Tensor out = Tensor::empty(index.sizes(), x.dtype()).with_qparams(x.qparams_ptr());
  const size_t es = x.element_size();
  const char* in = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.mutable_data_ptr());
  const int64_t n = x.dim();
  std::vector<int64_t> pos(static_cast<size_t>(n), 0);
  for (size_t e = 0; e < idx.size(); ++e) {
    const int64_t v = idx[e];
    const int64_t size_d = n == 0 ? 1 : x.size(d);
    DBRQ_ENSURE(v >= 0 && v < size_d, IndexError, "gather: index ", v, " is out of range for dim ", d, " of size ",
                size_d);
    int64_t off = 0;
    for (int64_t k = 0; k < n; ++k) off += (k == d ? v : pos[k]) * x.stride(k);
    std::memcpy(dst + e * es, in + off * static_cast<int64_t>(es), es);
    for (int64_t k = n - 1; k >= 0; --k) {
      if (++pos[k] < index.size(k)) break;
      pos[k] = 0;
    }
  }
  return out;
}

Tensor dim_op(OpKind kind, const Tensor& x, int64_t dim, bool keepdim, OpFn run) {
  DimParams p;
  p.dims = {dim};
  p.keepdim = keepdim;
  const Tensor* in[] = {&x};
  return ops::call(kind, in, &p, run);
}

Tensor topk_op(OpKind kind, const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  ShapeParams p;
  p.sizes = {dim, k};
  p.start = largest ? 1 : 0;
  p.length = sorted ? 1 : 0;
  const Tensor* in[] = {&x};
  return ops::call(kind, in, &p, run_topk);
}

Tensor index_op(OpKind kind, const Tensor& x, int64_t dim, const Tensor& index, OpFn run) {
  DimParams p;
  p.dims = {dim};
  const Tensor* in[] = {&x, &index};
  return ops::call(kind, in, &p, run);
}

}  // namespace

std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return {dim_op(OpKind::kMax, x, dim, keepdim, run_max_or_argmax),
          dim_op(OpKind::kArgmax, x, dim, keepdim, run_max_or_argmax)};
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return dim_op(OpKind::kArgmax, x, dim, keepdim, run_max_or_argmax);
}
std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted) {
  return {topk_op(OpKind::kTopk, x, k, dim, largest, sorted), topk_op(OpKind::kTopkIndices, x, k, dim, largest, sorted)};
}
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return index_op(OpKind::kIndexSelect, x, dim, index, run_index_select);
}
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  return index_op(OpKind::kGather, x, dim, index, run_gather);
}

std::tuple<Tensor, Tensor> Tensor::max(int64_t dim, bool keepdim) const { return dbrq::max(*this, dim, keepdim); }
Tensor Tensor::argmax(int64_t dim, bool keepdim) const { return dbrq::argmax(*this, dim, keepdim); }
std::tuple<Tensor, Tensor> Tensor::topk(int64_t k, int64_t dim, bool largest, bool sorted) const {
  return dbrq::topk(*this, k, dim, largest, sorted);
}
Tensor Tensor::index_select(int64_t dim, const Tensor& index) const { return dbrq::index_select(*this, dim, index); }
Tensor Tensor::gather(int64_t dim, const Tensor& index) const { return dbrq::gather(*this, dim, index); }

namespace ops {

void register_indexing_ops(OpRegistry& r) {
  // Values on codes keep the input's parameters (kShare); indices take the codes unchanged
  // (kNone with takes_int8: the converted model passes its int8 argument without a dequantize).
  for (auto [kind, name] : {std::pair{OpKind::kMax, "max"}, std::pair{OpKind::kArgmax, "argmax"}}) {
    OpDef& d = r.define(kind, name).with_params<DimParams>();
    d.run = run_max_or_argmax;
    if (kind == OpKind::kMax) d.role = QuantRole::kShare;
    d.takes_int8 = kind == OpKind::kArgmax;
  }
  for (auto [kind, name] : {std::pair{OpKind::kTopk, "topk"}, std::pair{OpKind::kTopkIndices, "topk_indices"}}) {
    OpDef& d = r.define(kind, name).with_params<ShapeParams>();
    d.run = run_topk;
    if (kind == OpKind::kTopk) d.role = QuantRole::kShare;
    d.takes_int8 = kind == OpKind::kTopkIndices;
  }
  OpDef& index_select = r.define(OpKind::kIndexSelect, "index_select").with_params<DimParams>();
  index_select.run = run_index_select;
  index_select.num_activation_inputs = 1;  // then the s64 index
  index_select.role = QuantRole::kShare;
  OpDef& gather = r.define(OpKind::kGather, "gather").with_params<DimParams>();
  gather.run = run_gather;
  gather.num_activation_inputs = 1;
  gather.role = QuantRole::kShare;
}

}  // namespace ops
}  // namespace dbrq
