// The shape family: cat and the ops that only change how a tensor's elements are viewed or laid
// out (flatten, reshape / view, permute, transpose, narrow / slice, select, unsqueeze, squeeze,
// contiguous), plus dropout and identity. Their eager kernels take every dtype and keep quantization
// parameters, so int8 passes through them unchanged (kShare); cat shares one observer between its
// inputs and its output (kCat).
#include <algorithm>
#include <random>

#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

void check_not_per_channel(const char* op, const Tensor& x) {
  DBRQ_ENSURE(!(x.is_quantized() && x.qparams()->is_per_channel()), DTypeError, op,
              ": per-channel quantized tensors cannot be reshaped; dequantize first");
}

Tensor reshape_impl(const Tensor& x, IntArrayRef target_in) {
  check_defined("reshape", "input", x);
  const DimVector target = infer_reshape(target_in, x.numel(), x.sizes());
  if (IntArrayRef(target) == x.sizes()) return x.raw_as_strided(x.sizes(), x.strides(), x.storage_offset());
  check_not_per_channel("reshape", x);
  Tensor v = x.raw_view(target);
  if (v.defined()) return v;
  return kernels::copy(x, MemoryFormat::kContiguous, x.dtype()).raw_view(target);
}

Tensor run_reshape(const OpCall& c) { return reshape_impl(c.input(0), c.p<ShapeParams>().sizes); }

Tensor run_view(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("view", "input", x);
  const DimVector target = infer_reshape(c.p<ShapeParams>().sizes, x.numel(), x.sizes());
  check_not_per_channel("view", x);
  Tensor v = x.raw_view(target);
  if (!v.defined() && x.dim() == 4 && x.is_channels_last()) {
    // dbrq keeps conv and pooling activations channels-last; the tensor the user holds is NCHW and
    // view() must mean what it means on NCHW. Its memory cannot be viewed that way, so view reads
    // it through a row-major copy, like reshape (writes to the result do not reach x).
    return kernels::copy(x, MemoryFormat::kContiguous, x.dtype()).raw_view(target);
  }
  DBRQ_ENSURE(v.defined(), ShapeError, "view: sizes ", shape_to_string(target), " are not compatible with the strides of a tensor of sizes ",
              x.shape_string(), "; use reshape()");
  return v;
}

Tensor run_flatten(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("flatten", "input", x);
  const ShapeParams& p = c.p<ShapeParams>();
  if (x.dim() == 0) return reshape_impl(x, {1});
  const int64_t start = x.wrap_dim(p.start), end = x.wrap_dim(p.length);
  DBRQ_ENSURE(start <= end, ValueError, "flatten: start_dim (", p.start, ") must not come after end_dim (", p.length, ")");
  DimVector sizes;
  for (int64_t d = 0; d < start; ++d) sizes.push_back(x.size(d));
  int64_t m = 1;
  for (int64_t d = start; d <= end; ++d) m *= x.size(d);
  sizes.push_back(m);
  for (int64_t d = end + 1; d < x.dim(); ++d) sizes.push_back(x.size(d));
  return reshape_impl(x, sizes);
}

Tensor run_permute(const OpCall& c) {
  check_defined("permute", "input", c.input(0));
  return c.input(0).raw_permute(c.p<ShapeParams>().sizes);
}

Tensor run_transpose(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("transpose", "input", x);
  const ShapeParams& p = c.p<ShapeParams>();
  const int64_t a = x.wrap_dim(p.start), b = x.wrap_dim(p.length);
  DimVector dims(x.dim());
  for (int64_t d = 0; d < x.dim(); ++d) dims[d] = d;
  std::swap(dims[a], dims[b]);
  return x.raw_permute(dims);
}

Tensor run_narrow(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("narrow", "input", x);
  const ShapeParams& p = c.p<ShapeParams>();
  const int64_t d = x.wrap_dim(p.sizes.at(0));
  const int64_t step = p.sizes.at(1);
  DBRQ_ENSURE(step >= 1, ValueError, "slice: step must be >= 1, got ", step);
  Tensor n = x.raw_narrow(d, p.start, p.length);
  if (step == 1) return n;
  DimVector sizes(n.sizes().begin(), n.sizes().end()), strides(n.strides().begin(), n.strides().end());
  sizes[d] = (p.length + step - 1) / step;
  strides[d] *= step;
  Tensor s = n.raw_as_strided(sizes, strides, n.storage_offset());
  if (n.is_quantized() && n.qparams()->axis == d) {
    // Per-channel parameters: keep those of the channels the step keeps.
    auto q = std::make_shared<QuantParams>(*n.qparams());
    q->scales.clear();
    q->zero_points.clear();
    for (int64_t i = 0; i < p.length; i += step) {
      q->scales.push_back(n.qparams()->scales[i]);
      q->zero_points.push_back(n.qparams()->zero_points[i]);
    }
    s = s.with_qparams(std::move(q));
  }
  return s;
}

Tensor run_select(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("select", "input", x);
  const ShapeParams& p = c.p<ShapeParams>();
  DBRQ_ENSURE(x.dim() >= 1, ShapeError, "select: cannot select from a 0-D tensor");
  const int64_t d = x.wrap_dim(p.sizes.at(0));
  int64_t i = p.start;
  DBRQ_ENSURE(i >= -x.size(d) && i < x.size(d), IndexError, "select: index ", i, " is out of range for dim ", d,
              " of size ", x.size(d));
  if (i < 0) i += x.size(d);
  DimVector sizes, strides;
  for (int64_t k = 0; k < x.dim(); ++k) {
    if (k == d) continue;
    sizes.push_back(x.size(k));
    strides.push_back(x.stride(k));
  }
  check_not_per_channel("select", x);
  return x.raw_as_strided(sizes, strides, x.storage_offset() + i * x.stride(d));
}

Tensor run_unsqueeze(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("unsqueeze", "input", x);
  int64_t d = c.p<ShapeParams>().start;
  const int64_t n = x.dim() + 1;
  DBRQ_ENSURE(d >= -n && d < n, IndexError, "unsqueeze: dim ", d, " is out of range for a ", x.dim(), "-D tensor");
  if (d < 0) d += n;
  check_not_per_channel("unsqueeze", x);
  DimVector sizes(x.sizes().begin(), x.sizes().end()), strides(x.strides().begin(), x.strides().end());
  const int64_t st = d < x.dim() ? x.stride(d) * x.size(d) : 1;
  sizes.insert(sizes.begin() + d, 1);
  strides.insert(strides.begin() + d, st);
  return x.raw_as_strided(sizes, strides, x.storage_offset());
}

Tensor run_squeeze(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("squeeze", "input", x);
  const int64_t d = x.wrap_dim(c.p<ShapeParams>().start);
  if (x.size(d) != 1) return x.raw_as_strided(x.sizes(), x.strides(), x.storage_offset());
  check_not_per_channel("squeeze", x);
  DimVector sizes, strides;
  for (int64_t k = 0; k < x.dim(); ++k) {
    if (k == d) continue;
    sizes.push_back(x.size(k));
    strides.push_back(x.stride(k));
  }
  return x.raw_as_strided(sizes, strides, x.storage_offset());
}

Tensor run_contiguous(const OpCall& c) {
  const auto format = static_cast<MemoryFormat>(c.p<ConvertParams>().memory_format);
  const Tensor& x = c.input(0);
  check_defined("contiguous", "input", x);
  return kernels::contiguous(x, format);
}

Tensor run_identity(const OpCall& c) {
  check_defined("identity", "input", c.input(0));
  return c.input(0);
}

Tensor run_dropout(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("dropout", "input", x);
  const DropoutParams& p = c.p<DropoutParams>();
  DBRQ_ENSURE(p.p >= 0.0 && p.p <= 1.0, ValueError, "dropout: probability must be in [0, 1], got ", p.p);
  if (!p.training || p.p == 0.0) return x;
  check_float("dropout", "input", x);
  // Training mode: zero with probability p, scale the rest by 1/(1-p).
  thread_local std::mt19937_64 gen(0x5eed);
  std::bernoulli_distribution keep(1.0 - p.p);
  Tensor out = kernels::copy(x, MemoryFormat::kContiguous, DType::kF32);
  float* d = out.mutable_data<float>();
  const float scale = p.p < 1.0 ? static_cast<float>(1.0 / (1.0 - p.p)) : 0.f;
  for (int64_t i = 0; i < out.numel(); ++i) d[i] = keep(gen) ? d[i] * scale : 0.f;
  return out;
}

Tensor run_cat(const OpCall& c) { return kernels::cat(c.inputs, c.p<DimParams>().dims[0]); }

DimVector cat_sizes(const OpCall& c) { return cat_output_sizes(c.inputs, c.p<DimParams>().dims[0]); }

}  // namespace

Tensor cat(absl::Span<const Tensor> tensors, int64_t dim) {
  absl::InlinedVector<const Tensor*, 8> in;
  in.reserve(tensors.size());
  for (const Tensor& t : tensors) in.push_back(&t);
  DimParams p;
  p.dims = {dim};
  OpCall c;
  c.kind = OpKind::kCat;
  c.inputs = absl::MakeConstSpan(in);
  c.params = &p;
  c.run = run_cat;
  return dispatch(c);
}

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  ShapeParams p;
  p.start = start_dim;
  p.length = end_dim;
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kFlatten, in, &p, run_flatten);
}

namespace {

// reshape / permute from sizes or dims in any container (the parameters hold them inline).
Tensor sizes_op(OpKind kind, const Tensor& x, IntArrayRef sizes, OpFn run) {
  ShapeParams p;
  p.sizes.assign(sizes.begin(), sizes.end());
  const Tensor* in[] = {&x};
  return ops::call(kind, in, &p, run);
}

}  // namespace

Tensor reshape(const Tensor& x, std::vector<int64_t> sizes) { return sizes_op(OpKind::kReshape, x, sizes, run_reshape); }
Tensor permute(const Tensor& x, std::vector<int64_t> dims) { return sizes_op(OpKind::kPermute, x, dims, run_permute); }

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  ShapeParams p;
  p.start = dim0;
  p.length = dim1;
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kTranspose, in, &p, run_transpose);
}

Tensor dropout(const Tensor& x, double p, bool training) {
  DropoutParams dp;
  dp.p = p;
  dp.training = training;
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kDropout, in, &dp, run_dropout);
}

Tensor identity(const Tensor& x) {
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kIdentity, in, nullptr, run_identity);
}

Tensor Tensor::reshape(IntArrayRef sizes) const { return sizes_op(OpKind::kReshape, *this, sizes, run_reshape); }
Tensor Tensor::view(IntArrayRef sizes) const { return sizes_op(OpKind::kReshape, *this, sizes, run_view); }

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const { return dbrq::flatten(*this, start_dim, end_dim); }
Tensor Tensor::permute(IntArrayRef dims) const { return sizes_op(OpKind::kPermute, *this, dims, run_permute); }
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const { return dbrq::transpose(*this, dim0, dim1); }

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  ShapeParams p;
  p.sizes = {dim, 1};
  p.start = start;
  p.length = length;
  const Tensor* in[] = {this};
  return ops::call(OpKind::kNarrow, in, &p, run_narrow);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  check_defined("slice", "input", *this);
  const int64_t d = wrap_dim(dim), n = size(d);
  // Python slicing: clamp to [0, n], negative values count from the end.
  auto clamp_index = [n](int64_t i) { return std::min(std::max(i < 0 ? i + n : i, int64_t{0}), n); };
  const int64_t s = clamp_index(start), e = std::max(clamp_index(end), s);
  ShapeParams p;
  p.sizes = {d, step};
  p.start = s;
  p.length = e - s;
  const Tensor* in[] = {this};
  return ops::call(OpKind::kNarrow, in, &p, run_narrow);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  ShapeParams p;
  p.sizes = {dim};
  p.start = index;
  const Tensor* in[] = {this};
  return ops::call(OpKind::kSelect, in, &p, run_select);
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  ShapeParams p;
  p.start = dim;
  const Tensor* in[] = {this};
  return ops::call(OpKind::kUnsqueeze, in, &p, run_unsqueeze);
}

Tensor Tensor::squeeze(int64_t dim) const {
  ShapeParams p;
  p.start = dim;
  const Tensor* in[] = {this};
  return ops::call(OpKind::kSqueeze, in, &p, run_squeeze);
}

Tensor Tensor::contiguous(MemoryFormat format) const {
  ConvertParams p;
  p.memory_format = static_cast<int>(format);
  const Tensor* in[] = {this};
  return ops::call(OpKind::kContiguous, in, &p, run_contiguous);
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t dim) const {
  DBRQ_ENSURE(chunks >= 1, ValueError, "chunk: chunks must be >= 1, got ", chunks);
  const int64_t d = wrap_dim(dim);
  const int64_t size = sizes()[d];
  return split(std::max<int64_t>((size + chunks - 1) / chunks, 1), d);
}

std::vector<Tensor> Tensor::split(int64_t split_size, int64_t dim) const {
  DBRQ_ENSURE(split_size >= 1, ValueError, "split: split_size must be >= 1, got ", split_size);
  const int64_t d = wrap_dim(dim);
  const int64_t size = sizes()[d];
  std::vector<Tensor> out;
  for (int64_t start = 0; start < size || (size == 0 && out.empty()); start += split_size) {
    out.push_back(narrow(d, start, std::min(split_size, size - start)));
  }
  return out;
}

std::vector<Tensor> Tensor::split(std::vector<int64_t> split_sizes, int64_t dim) const {
  const int64_t d = wrap_dim(dim);
  const int64_t size = sizes()[d];
  int64_t total = 0;
  for (int64_t s : split_sizes) {
    DBRQ_ENSURE(s >= 0, ValueError, "split: sizes must be >= 0, got ", s);
    total += s;
  }
  DBRQ_ENSURE(total == size, ValueError, "split: sizes add up to ", total, " but dim ", d, " has size ", size);
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : split_sizes) {
    out.push_back(narrow(d, start, s));
    start += s;
  }
  return out;
}

namespace ops {

void register_shape_ops(OpRegistry& r) {
  // Shape ops and cat run int8 through their eager kernels with the call's own parameters: their
  // parameters do not identify them (a loop's narrow(0, t, 1) is one record).
  OpDef& cat = r.define(OpKind::kCat, "cat").with_params<DimParams>();
  cat.run = run_cat;
  cat.infer_sizes = cat_sizes;
  cat.role = QuantRole::kCat;
  cat.params_in_identity = false;

  const struct {
    OpKind kind;
    const char* name;
    OpFn run;
  } views[] = {
      {OpKind::kFlatten, "flatten", run_flatten},   {OpKind::kReshape, "reshape", run_reshape},
      {OpKind::kPermute, "permute", run_permute},   {OpKind::kTranspose, "transpose", run_transpose},
      {OpKind::kNarrow, "narrow", run_narrow},      {OpKind::kSelect, "select", run_select},
      {OpKind::kUnsqueeze, "unsqueeze", run_unsqueeze}, {OpKind::kSqueeze, "squeeze", run_squeeze},
  };
  for (const auto& v : views) {
    OpDef& d = r.define(v.kind, v.name).with_params<ShapeParams>();
    d.run = v.run;
    d.role = QuantRole::kShare;
    d.params_in_identity = false;
  }
  OpDef& contiguous = r.define(OpKind::kContiguous, "contiguous").with_params<ConvertParams>();
  contiguous.run = run_contiguous;
  contiguous.role = QuantRole::kShare;
  contiguous.params_in_identity = false;

  OpDef& dropout = r.define(OpKind::kDropout, "dropout").with_params<DropoutParams>();
  dropout.run = run_dropout;
  dropout.role = QuantRole::kShare;
  dropout.params_in_identity = false;

  OpDef& identity = r.define(OpKind::kIdentity, "identity");
  identity.run = run_identity;
  identity.role = QuantRole::kShare;
}

}  // namespace ops
}  // namespace dbrq
