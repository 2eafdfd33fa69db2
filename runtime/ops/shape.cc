// The shape family: cat and the ops that only change how a tensor's elements are viewed or laid
// out (flatten, reshape / view, permute, transpose, narrow / slice, select, unsqueeze, squeeze,
// contiguous), plus dropout and identity, and issue 12's stack, expand, repeat and pad. Their eager
// kernels take every dtype and keep quantization parameters, so int8 passes through them unchanged
// (kShare); cat and stack share one observer between their inputs and their output (kCat).
#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

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

// ShapeParams::length of squeeze() (every size-1 dim); squeeze(dim) keeps it 0.
constexpr int64_t kSqueezeAll = 1;

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
  if (!v.defined() && x.dim() >= 3 && x.stride(1) == 1 && x.size(1) > 1) {
    // dbrq keeps conv and pooling activations channels-last (conv1d's and pool1d's too, [N, C, L]
    // with C innermost); the tensor the user holds is NCHW and view() must mean what it means on
    // NCHW, also after narrowing the channels (`y.narrow(1, 0, c).view({n, -1})` works on a
    // PyTorch conv output). Such memory cannot be viewed that way, so view reads it through a
    // row-major copy, like reshape (writes to the result do not reach x). A user's own tensor with
    // its channels innermost (a permute) that PyTorch would refuse to view is copied the same way.
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
  if (c.p<ShapeParams>().length == kSqueezeAll) {
    // squeeze(): every size-1 dim. The channel axis of per-channel parameters may move.
    DimVector sizes, strides;
    for (int64_t k = 0; k < x.dim(); ++k) {
      if (x.size(k) == 1) continue;
      sizes.push_back(x.size(k));
      strides.push_back(x.stride(k));
    }
    if (static_cast<int64_t>(sizes.size()) != x.dim()) check_not_per_channel("squeeze", x);
    return x.raw_as_strided(sizes, strides, x.storage_offset());
  }
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
  float* d = out.raw_mutable_data<float>();
  const float scale = p.p < 1.0 ? static_cast<float>(1.0 / (1.0 - p.p)) : 0.f;
  for (int64_t i = 0; i < out.numel(); ++i) d[i] = keep(gen) ? d[i] * scale : 0.f;
  return out;
}

Tensor run_cat(const OpCall& c) { return kernels::cat(c.inputs, c.p<DimParams>().dims[0]); }

DimVector cat_sizes(const OpCall& c) { return cat_output_sizes(c.inputs, c.p<DimParams>().dims[0]); }


// ---- stack, expand, repeat, pad ----

// x with a size-1 dim inserted at d (a view).
Tensor unsqueeze_view(const Tensor& x, int64_t d) {
  DimVector sizes(x.sizes().begin(), x.sizes().end()), strides(x.strides().begin(), x.strides().end());
  const int64_t st = d < x.dim() ? x.stride(d) * x.size(d) : 1;
  sizes.insert(sizes.begin() + d, 1);
  strides.insert(strides.begin() + d, st);
  return x.raw_as_strided(sizes, strides, x.storage_offset());
}

Tensor run_stack(const OpCall& c) {
  DBRQ_ENSURE(!c.inputs.empty(), ValueError, "stack: expects a non-empty list of tensors");
  for (size_t i = 0; i < c.inputs.size(); ++i) check_defined("stack", "tensor", *c.inputs[i]);
  const Tensor& first = *c.inputs[0];
  const int64_t n = first.dim() + 1;
  int64_t d = c.p<DimParams>().dims[0];
  DBRQ_ENSURE(d >= -n && d < n, IndexError, "stack: dim ", d, " is out of range for ", first.dim(),
              "-D tensors (expected in [", -n, ", ", n - 1, "])");
  if (d < 0) d += n;
  absl::InlinedVector<Tensor, 8> views;
  absl::InlinedVector<const Tensor*, 8> ptrs;
  views.reserve(c.inputs.size());
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = *c.inputs[i];
    DBRQ_ENSURE(t.sizes() == first.sizes(), ShapeError, "stack: every tensor must have the same sizes, got ",
                first.shape_string(), " at index 0 and ", t.shape_string(), " at index ", i);
    check_not_per_channel("stack", t);
    views.push_back(unsqueeze_view(t, d));
  }
  for (const Tensor& v : views) ptrs.push_back(&v);
  return kernels::cat(ptrs, d);
}

DimVector stack_sizes(const OpCall& c) {
  const Tensor& first = *c.inputs.at(0);
  int64_t d = c.p<DimParams>().dims[0];
  if (d < 0) d += first.dim() + 1;
  DimVector sizes(first.sizes().begin(), first.sizes().end());
  sizes.insert(sizes.begin() + d, static_cast<int64_t>(c.inputs.size()));
  return sizes;
}

// The dtypes the copying kernels (repeat, pad) move: any element of 1, 4 or 8 bytes.
void check_copyable(const char* op, const Tensor& x) {
  DBRQ_ENSURE(x.dtype() != DType::kBF16, DTypeError, op, ": dtype ", dtype_name(x.dtype()), " is not supported");
}

// dst[o] = src[maps[0][o0], maps[1][o1], ...]: each map gives, per output index of its dim, the
// source index, or -1 for "write `fill`" (pad's constant). src and dst have as many dims as maps;
// any strides.
void gather_by_maps(const Tensor& src, Tensor& dst, const std::vector<std::vector<int64_t>>& maps, const void* fill) {
  const int64_t nd = dst.dim();
  const size_t es = dst.element_size();
  const char* sbase = static_cast<const char*>(src.data_ptr());
  char* dbase = static_cast<char*>(dst.mutable_data_ptr());
  if (dst.numel() == 0) return;
  if (nd == 0) {
    std::memcpy(dbase, sbase, es);
    return;
  }
  const int64_t last = nd - 1, n_last = dst.size(last);
  const int64_t s_last = src.stride(last), d_last = dst.stride(last);
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  while (true) {
    // Offsets of the outer dims; a -1 anywhere outside the last dim fills the whole row.
    int64_t soff = 0, doff = 0;
    bool fill_row = false;
    for (int64_t k = 0; k < last; ++k) {
      const int64_t si = maps[k][idx[k]];
      fill_row = fill_row || si < 0;
      soff += si * src.stride(k);
      doff += idx[k] * dst.stride(k);
    }
    const std::vector<int64_t>& m = maps[last];
    for (int64_t o = 0; o < n_last; ++o) {
      char* dp = dbase + static_cast<size_t>(doff + o * d_last) * es;
      if (fill_row || m[o] < 0) {
        std::memcpy(dp, fill, es);
      } else {
        std::memcpy(dp, sbase + static_cast<size_t>(soff + m[o] * s_last) * es, es);
      }
    }
    int64_t k = last - 1;
    for (; k >= 0; --k) {
      if (++idx[k] < dst.size(k)) break;
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

Tensor run_expand(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("expand", "input", x);
  const DimVector& target = c.p<ShapeParams>().sizes;
  const int64_t n = static_cast<int64_t>(target.size());
  DBRQ_ENSURE(n >= x.dim(), ShapeError, "expand: the number of sizes provided (", n,
              ") must be greater or equal to the number of dimensions in the tensor (", x.dim(), ")");
  const int64_t lead = n - x.dim();
  DimVector sizes(static_cast<size_t>(n)), strides(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t want = target[i];
    if (i < lead) {
      DBRQ_ENSURE(want >= 0, ShapeError, "expand: size -1 is not allowed in a leading, non-existing dimension ", i);
      sizes[i] = want;
      strides[i] = 0;
      continue;
    }
    const int64_t j = i - lead, have = x.size(j);
    DBRQ_ENSURE(want >= -1, ShapeError, "expand: sizes must be >= -1, got ", want, " at dim ", i);
    if (want == -1 || want == have) {
      sizes[i] = have;
      strides[i] = x.stride(j);
      continue;
    }
    DBRQ_ENSURE(have == 1, ShapeError, "expand: the expanded size of the tensor (", want,
                ") must match the existing size (", have, ") at non-singleton dimension ", i, ". Target sizes: ",
                shape_to_string(target), ". Tensor sizes: ", x.shape_string());
    sizes[i] = want;
    strides[i] = 0;
  }
  check_not_per_channel("expand", x);
  return x.raw_as_strided(sizes, strides, x.storage_offset());
}

Tensor run_repeat(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("repeat", "input", x);
  check_copyable("repeat", x);
  const DimVector& reps = c.p<ShapeParams>().sizes;
  const int64_t n = static_cast<int64_t>(reps.size());
  DBRQ_ENSURE(n >= x.dim(), ShapeError, "repeat: number of repeats (", n,
              ") must be at least the number of dims of the tensor (", x.dim(), ")");
  for (int64_t i = 0; i < n; ++i) {
    DBRQ_ENSURE(reps[i] >= 0, ValueError, "repeat: repeats must be >= 0, got ", reps[i], " at dim ", i);
  }
  check_not_per_channel("repeat", x);
  // x with leading size-1 dims up to n dims; each output index reads index % size.
  Tensor src = x;
  while (src.dim() < n) src = unsqueeze_view(src, 0);
  DimVector out(static_cast<size_t>(n));
  std::vector<std::vector<int64_t>> maps(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out[i] = src.size(i) * reps[i];
    maps[i].resize(static_cast<size_t>(out[i]));
    for (int64_t o = 0; o < out[i]; ++o) maps[i][o] = o % src.size(i);
  }
  Tensor dst = Tensor::empty(out, x.dtype()).with_qparams(x.qparams_ptr());
  gather_by_maps(src, dst, maps, nullptr);
  return dst;
}

const char* pad_mode_name(int64_t mode) {
  switch (mode) {
    case 0:
      return "constant";
    case 1:
      return "reflect";
    case 2:
      return "replicate";
  }
  return "unknown";
}

Tensor run_pad(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("pad", "input", x);
  check_copyable("pad", x);
  const PadParams& p = c.p<PadParams>();
  const int64_t np = static_cast<int64_t>(p.pads.size());
  DBRQ_ENSURE(p.mode >= 0 && p.mode <= 2, ValueError, "pad: unknown mode ", p.mode);
  DBRQ_ENSURE(np % 2 == 0, ValueError, "pad: the pads must come in (left, right) pairs, got ", np, " values");
  DBRQ_ENSURE(np / 2 <= x.dim(), ShapeError, "pad: ", np / 2, " pairs of pads for a ", x.dim(), "-D tensor of sizes ",
              x.shape_string());
  const char* mode = pad_mode_name(p.mode);
  if (p.mode != 0) {
    // PyTorch pads the last k = 1, 2 or 3 dims of a (C, ...) or (N, C, ...) tensor in these modes.
    const int64_t k = np / 2;
    DBRQ_ENSURE(k >= 1 && k <= 3 && (x.dim() == k + 1 || x.dim() == k + 2), ShapeError, "pad: ", mode,
                " mode pads the last 1, 2 or 3 dims of a (C, ...) or (N, C, ...) tensor; got ", k,
                " pairs of pads for sizes ", x.shape_string());
  }
  check_not_per_channel("pad", x);
  const int64_t nd = x.dim();
  DimVector out(x.sizes().begin(), x.sizes().end());
  std::vector<std::vector<int64_t>> maps(static_cast<size_t>(nd));
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t pair = nd - 1 - d;  // pads[0..1] are the last dim's
    const int64_t n = x.size(d);
    const int64_t left = pair < np / 2 ? p.pads[2 * pair] : 0, right = pair < np / 2 ? p.pads[2 * pair + 1] : 0;
    if (p.mode == 0) {
      DBRQ_ENSURE(n + left + right >= 0, ShapeError, "pad: dim ", d, " of size ", n, " with pads (", left, ", ", right,
                  ") would have a negative size");
    } else {
      DBRQ_ENSURE(left >= 0 && right >= 0, ValueError, "pad: ", mode, " mode needs pads >= 0, got (", left, ", ",
                  right, ") for dim ", d);
      if (p.mode == 1) {
        DBRQ_ENSURE(left < n && right < n, ValueError, "pad: reflect mode needs pads smaller than the dim they pad, got (",
                    left, ", ", right, ") for dim ", d, " of size ", n);
      } else {
        DBRQ_ENSURE(n > 0 || left + right == 0, ShapeError, "pad: replicate mode cannot pad dim ", d, " of size 0");
      }
    }
    out[d] = n + left + right;
    maps[d].resize(static_cast<size_t>(out[d]));
    for (int64_t o = 0; o < out[d]; ++o) {
      int64_t i = o - left;
      if (i < 0 || i >= n) {
        if (p.mode == 0) {
          i = -1;
        } else if (p.mode == 1) {
          i = i < 0 ? -i : 2 * (n - 1) - i;
        } else {
          i = i < 0 ? 0 : n - 1;
        }
      }
      maps[d][o] = i;
    }
  }
  // The fill as one element of x's dtype: a quantized tensor's code of `value` (PyTorch fills a
  // quantized tensor through quantize).
  alignas(8) unsigned char fill[8] = {};
  if (p.mode == 0) {
    if (x.is_quantized()) {
      const Tensor v = kernels::quantize(full({1}, p.value), x.qparams_ptr(), x.dtype());
      std::memcpy(fill, v.data_ptr(), x.element_size());
    } else {
      const Tensor v = full({1}, p.value, x.dtype());
      std::memcpy(fill, v.data_ptr(), x.element_size());
    }
  }
  const MemoryFormat fmt = nd == 4 && x.is_channels_last() ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
  Tensor dst = Tensor::empty(out, x.dtype(), fmt).with_qparams(x.qparams_ptr());
  gather_by_maps(x, dst, maps, fill);
  return dst;
}

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

Tensor Tensor::squeeze() const {
  ShapeParams p;
  p.length = kSqueezeAll;
  const Tensor* in[] = {this};
  return ops::call(OpKind::kSqueeze, in, &p, run_squeeze);
}

Tensor squeeze(const Tensor& x) { return x.squeeze(); }
Tensor squeeze(const Tensor& x, int64_t dim) { return x.squeeze(dim); }
Tensor unsqueeze(const Tensor& x, int64_t dim) { return x.unsqueeze(dim); }

Tensor stack(absl::Span<const Tensor> tensors, int64_t dim) {
  absl::InlinedVector<const Tensor*, 8> in;
  in.reserve(tensors.size());
  for (const Tensor& t : tensors) in.push_back(&t);
  DimParams p;
  p.dims = {dim};
  OpCall c;
  c.kind = OpKind::kStack;
  c.inputs = absl::MakeConstSpan(in);
  c.params = &p;
  c.run = run_stack;
  return dispatch(c);
}

Tensor Tensor::expand(IntArrayRef sizes) const { return sizes_op(OpKind::kExpand, *this, sizes, run_expand); }
Tensor Tensor::repeat(IntArrayRef repeats) const { return sizes_op(OpKind::kRepeat, *this, repeats, run_repeat); }
Tensor expand(const Tensor& x, std::vector<int64_t> sizes) { return x.expand(sizes); }
Tensor repeat(const Tensor& x, std::vector<int64_t> repeats) { return x.repeat(repeats); }

Tensor pad(const Tensor& x, std::vector<int64_t> pads, PadMode mode, double value) {
  PadParams p;
  p.pads.assign(pads.begin(), pads.end());
  p.mode = static_cast<int64_t>(mode);
  p.value = value;
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kPad, in, &p, run_pad);
}

Tensor pad(const Tensor& x, std::vector<int64_t> pads, const std::string& mode, double value) {
  PadMode m = PadMode::kConstant;
  if (mode == "reflect") {
    m = PadMode::kReflect;
  } else if (mode == "replicate") {
    m = PadMode::kReplicate;
  } else {
    DBRQ_ENSURE(mode == "constant", ValueError, "pad: mode must be \"constant\", \"reflect\" or \"replicate\", got \"",
                mode, "\"");
  }
  return pad(x, std::move(pads), m, value);
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
  // An empty dim gives `chunks` empty pieces, as PyTorch's (code indexing chunks[k] works).
  if (size == 0) return split(std::vector<int64_t>(static_cast<size_t>(chunks), 0), d);
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
  // Issue 12's shape family. stack joins like cat (kCat: the converted op brings every input to
  // the output's parameters); expand is a view and repeat / pad copy codes, so int8 passes through
  // them with its parameters (a quantized constant pad fills with the code of its value).
  OpDef& stack = r.define(OpKind::kStack, "stack").with_params<DimParams>();
  stack.run = run_stack;
  stack.infer_sizes = stack_sizes;
  stack.role = QuantRole::kCat;
  stack.params_in_identity = false;

  for (const auto& v : {std::pair<OpKind, OpFn>{OpKind::kExpand, run_expand}, {OpKind::kRepeat, run_repeat}}) {
    OpDef& d = r.define(v.first, v.first == OpKind::kExpand ? "expand" : "repeat").with_params<ShapeParams>();
    d.run = v.second;
    d.role = QuantRole::kShare;
  }
  OpDef& pad = r.define(OpKind::kPad, "pad").with_params<PadParams>();
  pad.run = run_pad;
  pad.role = QuantRole::kShare;
}

}  // namespace ops
}  // namespace dbrq
