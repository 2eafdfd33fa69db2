// Eager normalization, pooling, reduction, joining, gather, copy and (de)quantization kernels.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/container/inlined_vector.h"
#include "kernels/dnnl_utils.h"
#include "kernels/eager.h"
#include "kernels/loops.h"
#include "kernels/simd.h"
#include "core/op_shapes.h"

namespace dbrq::kernels {
namespace {

constexpr int64_t kGrain = 1 << 15;

Tensor dense(const Tensor& t) {
  return t.is_non_overlapping_and_dense() ? t : copy(t, MemoryFormat::kContiguous, t.dtype());
}

std::shared_ptr<PrimitiveEntry> entry_from(const dnnl::primitive& p, const dnnl::primitive_desc_base& pd) {
  auto e = std::make_shared<PrimitiveEntry>();
  e->prim = p;
  e->scratchpad_bytes = pd.scratchpad_desc().get_size();
  return e;
}

}  // namespace

Tensor softmax(const Tensor& x_in, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  check_float(name, "input", x_in);
  const Tensor x = dense(x_in);
  if (x.dim() == 0) return softmax(x.raw_view({1}), 0, log).raw_view({});
  const int64_t axis = x.wrap_dim(dim);
  Tensor dst = Tensor::empty_like(x, DType::kF32);
  if (x.numel() == 0) return dst;
  PrimitiveKey key("softmax_f32");
  key.add(static_cast<int64_t>(log)).add(axis).add(x).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    try {
      dnnl::softmax_v2_forward::desc d(dnnl::prop_kind::forward_inference,
                                       log ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate,
                                       desc_of(x), desc_of(dst), static_cast<int>(axis));
      dnnl::softmax_v2_forward::primitive_desc pd(d, base_attr(), cpu_engine());
      return entry_from(dnnl::softmax_v2_forward(pd), pd);
    } catch (const dnnl::error& e) {
      rethrow_dnnl("creating a softmax primitive", e);
    }
  });
  execute(entry->prim, entry->scratchpad_bytes, {{DNNL_ARG_SRC, mem_of(x)}, {DNNL_ARG_DST, mem_of(dst)}});
  return dst;
}

Tensor layer_norm(const Tensor& x_in, IntArrayRef normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_float("layer_norm", "input", x_in);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  DBRQ_ENSURE(k >= 1 && k <= x_in.dim(), ShapeError, "layer_norm: normalized_shape ",
              shape_to_string(normalized_shape), " does not fit input sizes ", x_in.shape_string());
  int64_t n = 1;
  for (int64_t i = 0; i < k; ++i) {
    DBRQ_ENSURE(x_in.size(x_in.dim() - k + i) == normalized_shape[i], ShapeError, "layer_norm: input sizes ",
                x_in.shape_string(), " do not end with normalized_shape ", shape_to_string(normalized_shape));
    n *= normalized_shape[i];
  }
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    check_float("layer_norm", t == &weight ? "weight" : "bias", *t);
    DBRQ_ENSURE(t->sizes() == normalized_shape, ShapeError, "layer_norm: ", t == &weight ? "weight" : "bias",
                " must have sizes ", shape_to_string(normalized_shape), ", got ", t->shape_string());
  }
  DBRQ_ENSURE(eps >= 0, ValueError, "layer_norm: eps must be >= 0, got ", eps);
  const Tensor x = contiguous(x_in);
  const int64_t m = n == 0 ? 0 : x.numel() / n;
  Tensor dst = Tensor::empty(x.sizes(), DType::kF32);
  if (x.numel() == 0) return dst;
  Tensor x2 = x.raw_view({m, n}), d2 = dst.raw_view({m, n});
  // oneDNN wants both scale and shift or neither: fill in the defaults when only one is given.
  Tensor w = weight.defined() ? contiguous(weight) : Tensor();
  Tensor b = bias.defined() ? contiguous(bias) : Tensor();
  const bool affine = w.defined() || b.defined();
  if (affine && !w.defined()) w = ones({n});
  if (affine && !b.defined()) b = zeros({n});
  PrimitiveKey key("layer_norm_f32");
  key.add(x2).add(static_cast<float>(eps)).add(static_cast<int64_t>(affine)).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    try {
      auto flags = affine ? (dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift)
                          : dnnl::normalization_flags::none;
      dnnl::layer_normalization_forward::desc d(dnnl::prop_kind::forward_inference, desc_of(x2),
                                                static_cast<float>(eps), flags);
      dnnl::layer_normalization_forward::primitive_desc pd(d, base_attr(), cpu_engine());
      return entry_from(dnnl::layer_normalization_forward(pd), pd);
    } catch (const dnnl::error& e) {
      rethrow_dnnl("creating a layer normalization primitive", e);
    }
  });
  ExecArgs args = {{DNNL_ARG_SRC, mem_of(x2)}, {DNNL_ARG_DST, mem_of(d2)}};
  if (affine) {
    args.emplace(DNNL_ARG_SCALE, mem_of(plain_desc({n}, DType::kF32, tag::x), w));
    args.emplace(DNNL_ARG_SHIFT, mem_of(plain_desc({n}, DType::kF32, tag::x), b));
  }
  execute(entry->prim, entry->scratchpad_bytes, std::move(args));
  return dst;
}

Tensor batch_norm(const Tensor& x_in, const Tensor& mean, const Tensor& var, const Tensor& weight,
                  const Tensor& bias, double eps) {
  check_float("batch_norm", "input", x_in);
  DBRQ_ENSURE(x_in.dim() >= 2 && x_in.dim() <= 5, ShapeError, "batch_norm: input must have 2 to 5 dims (N, C, ...), got sizes ",
              x_in.shape_string());
  const int64_t c = x_in.size(1);
  const char* names[] = {"running_mean", "running_var", "weight", "bias"};
  const Tensor* ts[] = {&mean, &var, &weight, &bias};
  for (int i = 0; i < 4; ++i) {
    if (i >= 2 && !ts[i]->defined()) continue;
    check_float("batch_norm", names[i], *ts[i]);
    DBRQ_ENSURE(ts[i]->dim() == 1 && ts[i]->size(0) == c, ShapeError, "batch_norm: ", names[i],
                " must have sizes [", c, "] for an input with ", c, " channels, got ", ts[i]->shape_string());
  }
  DBRQ_ENSURE(eps >= 0, ValueError, "batch_norm: eps must be >= 0, got ", eps);
  const Tensor x = dense(x_in);
  Tensor dst = Tensor::empty_like(x, DType::kF32);
  if (x.numel() == 0) return dst;
  Tensor w = weight.defined() ? contiguous(weight) : ones({c});
  Tensor b = bias.defined() ? contiguous(bias) : zeros({c});
  PrimitiveKey key("batch_norm_f32");
  key.add(x).add(static_cast<float>(eps)).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    try {
      auto flags = dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
                   dnnl::normalization_flags::use_shift;
      dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_inference, desc_of(x),
                                                static_cast<float>(eps), flags);
      dnnl::batch_normalization_forward::primitive_desc pd(d, base_attr(), cpu_engine());
      return entry_from(dnnl::batch_normalization_forward(pd), pd);
    } catch (const dnnl::error& e) {
      rethrow_dnnl("creating a batch normalization primitive", e);
    }
  });
  auto vec = plain_desc({c}, DType::kF32, tag::x);
  execute(entry->prim, entry->scratchpad_bytes,
          {{DNNL_ARG_SRC, mem_of(x)},
           {DNNL_ARG_DST, mem_of(dst)},
           {DNNL_ARG_MEAN, mem_of(vec, contiguous(mean))},
           {DNNL_ARG_VARIANCE, mem_of(vec, contiguous(var))},
           {DNNL_ARG_SCALE, mem_of(vec, w)},
           {DNNL_ARG_SHIFT, mem_of(vec, b)}});
  return dst;
}

namespace {

Tensor pool(const char* name, dnnl::algorithm alg, const Tensor& x_in, const Pool2dParams& p) {
  const PoolGeometry g = pool2d_geometry(name, x_in, p);
  const Tensor x = dense(x_in);
  const MemoryFormat fmt = x.suggest_memory_format();
  Tensor dst = Tensor::empty({g.n, g.c, g.oh, g.ow}, x.dtype(), fmt).with_qparams(x.qparams_ptr());
  if (dst.numel() == 0) return dst;
  PrimitiveKey key("pool2d");
  key.add(static_cast<int64_t>(alg)).add(x).add(dst).add(p.kernel_size).add(p.stride).add(p.padding).add(p.dilation);
  key.add(g.pad_bottom).add(g.pad_right).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    try {
      dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, desc_of(x), desc_of(dst),
                                       {p.stride[0], p.stride[1]}, {p.kernel_size[0], p.kernel_size[1]},
                                       {p.dilation[0] - 1, p.dilation[1] - 1}, {p.padding[0], p.padding[1]},
                                       {g.pad_bottom, g.pad_right});
      dnnl::pooling_v2_forward::primitive_desc pd(d, base_attr(), cpu_engine());
      return entry_from(dnnl::pooling_v2_forward(pd), pd);
    } catch (const dnnl::error& e) {
      rethrow_dnnl("creating a pooling primitive", e);
    }
  });
  execute(entry->prim, entry->scratchpad_bytes, {{DNNL_ARG_SRC, mem_of(x)}, {DNNL_ARG_DST, mem_of(dst)}});
  return dst;
}

// A window holding a NaN pools to NaN, as PyTorch's max_pool2d: oneDNN's compares skip it (a
// window [NaN, 1, 2, 3] gave 3), hiding a broken input. One vectorized scan of the input; the
// windows are visited only when it holds a NaN.
void propagate_nan_windows(const Tensor& x, Tensor& y, const Pool2dParams& p) {
  std::atomic<bool> nan_seen{false};
  const float* data = x.raw_data<float>();
  parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
    if (!nan_seen.load(std::memory_order_relaxed) && simd::any_nan(data + begin, end - begin)) {
      nan_seen.store(true, std::memory_order_relaxed);
    }
  });
  if (!nan_seen.load()) return;
  const float* in = x.raw_data<float>();
  float* out = y.raw_mutable_data<float>();
  const int64_t n = y.size(0), c = y.size(1), oh = y.size(2), ow = y.size(3), h = x.size(2), w = x.size(3);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          bool nan = false;
          for (int64_t r = 0; r < p.kernel_size[0] && !nan; ++r) {
            const int64_t hi = i * p.stride[0] - p.padding[0] + r * p.dilation[0];
            if (hi < 0 || hi >= h) continue;
            for (int64_t s = 0; s < p.kernel_size[1] && !nan; ++s) {
              const int64_t wi = j * p.stride[1] - p.padding[1] + s * p.dilation[1];
              if (wi < 0 || wi >= w) continue;
              nan = std::isnan(in[b * x.stride(0) + ch * x.stride(1) + hi * x.stride(2) + wi * x.stride(3)]);
            }
          }
          if (nan) out[b * y.stride(0) + ch * y.stride(1) + i * y.stride(2) + j * y.stride(3)] = std::nanf("");
        }
      }
    }
  }
}

}  // namespace

Tensor max_pool2d(const Tensor& x_in, const Pool2dParams& p) {
  check_defined("max_pool2d", "input", x_in);
  DBRQ_ENSURE(x_in.dtype() == DType::kF32 || is_quantized_dtype(x_in.dtype()), DTypeError,
              "max_pool2d: input must be f32, s8 or u8, got ", dtype_name(x_in.dtype()));
  if (x_in.dtype() != DType::kF32) return pool("max_pool2d", dnnl::algorithm::pooling_max, x_in, p);
  const Tensor x = x_in.dim() == 4 ? dense(x_in) : x_in;  // pool2d_geometry reports a wrong rank
  Tensor y = pool("max_pool2d", dnnl::algorithm::pooling_max, x, p);
  if (y.numel() > 0) propagate_nan_windows(x, y, p);
  return y;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p) {
  check_float("avg_pool2d", "input", x);
  DBRQ_ENSURE(p.dilation[0] == 1 && p.dilation[1] == 1, ValueError, "avg_pool2d: dilation is not supported");
  Tensor y = pool("avg_pool2d", p.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                                    : dnnl::algorithm::pooling_avg_exclude_padding,
                  x, p);
  if (!p.count_include_pad || !p.ceil_mode || y.numel() == 0) return y;
  // oneDNN divides every window by the kernel area, PyTorch a ceil_mode window that overhangs the
  // padded input by the part inside it: rescale those edge windows.
  const PoolGeometry g = pool2d_geometry("avg_pool2d", x, p);
  auto extent = [&](int64_t o, int i, int64_t in) {
    const int64_t start = o * p.stride[i] - p.padding[i];
    return std::min(start + p.kernel_size[i], in + p.padding[i]) - start;
  };
  const int64_t area = p.kernel_size[0] * p.kernel_size[1];
  float* d = y.raw_mutable_data<float>();
  for (int64_t i = 0; i < g.oh; ++i) {
    for (int64_t j = 0; j < g.ow; ++j) {
      const int64_t inside = extent(i, 0, g.h) * extent(j, 1, g.w);
      if (inside == area) continue;
      const float f = static_cast<float>(area) / static_cast<float>(inside);
      for (int64_t b = 0; b < g.n; ++b) {
        for (int64_t c = 0; c < g.c; ++c) d[b * y.stride(0) + c * y.stride(1) + i * y.stride(2) + j * y.stride(3)] *= f;
      }
    }
  }
  return y;
}

Tensor adaptive_avg_pool2d(const Tensor& x_in, std::array<int64_t, 2> out) {
  check_float("adaptive_avg_pool2d", "input", x_in);
  DBRQ_ENSURE(x_in.dim() == 4, ShapeError, "adaptive_avg_pool2d: input must be 4-D (N, C, H, W), got sizes ",
              x_in.shape_string());
  DBRQ_ENSURE(out[0] >= 1 && out[1] >= 1, ValueError, "adaptive_avg_pool2d: output_size must be >= 1, got (", out[0],
              ", ", out[1], ")");
  const int64_t h = x_in.size(2), w = x_in.size(3);
  DBRQ_ENSURE(h >= 1 && w >= 1, ShapeError, "adaptive_avg_pool2d: input sizes ", x_in.shape_string(),
              " have an empty spatial dim");
  if (h % out[0] == 0 && w % out[1] == 0) {
    // Uniform windows: an ordinary average pooling.
    Pool2dParams p;
    p.kernel_size = {h / out[0], w / out[1]};
    p.stride = p.kernel_size;
    return pool("adaptive_avg_pool2d", dnnl::algorithm::pooling_avg_exclude_padding, x_in, p);
  }
  // Windows [floor(i*H/oh), ceil((i+1)*H/oh)) as in PyTorch.
  const Tensor x = x_in;
  const int64_t n = x.size(0), c = x.size(1);
  Tensor dst = Tensor::empty({n, c, out[0], out[1]}, DType::kF32, x.suggest_memory_format());
  const float* src = x.raw_data<float>();
  float* d = dst.raw_mutable_data<float>();
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = 0; i < out[0]; ++i) {
        const int64_t h0 = (i * h) / out[0], h1 = ((i + 1) * h + out[0] - 1) / out[0];
        for (int64_t j = 0; j < out[1]; ++j) {
          const int64_t w0 = (j * w) / out[1], w1 = ((j + 1) * w + out[1] - 1) / out[1];
          float acc = 0.f;
          for (int64_t y = h0; y < h1; ++y) {
            for (int64_t z = w0; z < w1; ++z) {
              acc += src[b * x.stride(0) + ch * x.stride(1) + y * x.stride(2) + z * x.stride(3)];
            }
          }
          d[b * dst.stride(0) + ch * dst.stride(1) + i * dst.stride(2) + j * dst.stride(3)] =
              acc / static_cast<float>((h1 - h0) * (w1 - w0));
        }
      }
    }
  }
  return dst;
}

namespace {

std::vector<bool> reduced_dims(const char* name, const Tensor& x, IntArrayRef dims) {
  std::vector<bool> red(x.dim(), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = x.wrap_dim(d);
    DBRQ_ENSURE(!red[w] || dims.empty(), ValueError, name, ": dim ", w, " appears twice in ", shape_to_string(dims));
    red[w] = true;
  }
  return red;
}

std::vector<int64_t> reduced_sizes(const Tensor& x, const std::vector<bool>& red, bool keepdim) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!red[d]) out.push_back(x.size(d));
    else if (keepdim) out.push_back(1);
  }
  return out;
}

// Terms per output up to which an f32 sum's error stays below ~2.5e-4 relative (n * 2^-24).
constexpr int64_t kExactF32Terms = 4096;

// The sum in double of x's elements reduced into each element of `dst` (x's sizes with the reduced
// dims 1; row-major output order).
std::vector<double> sums_in_double(const Tensor& x, const Tensor& dst) {
  std::vector<double> acc(static_cast<size_t>(dst.numel()), 0.0);
  const std::vector<int64_t> dst_st = broadcast_strides(dst, x.sizes());
  const float* src = x.raw_data<float>();
  for_each_offset<2>(x.sizes(), {x.strides(), IntArrayRef(dst_st)},
                     [&](const std::array<int64_t, 2>& off) { acc[static_cast<size_t>(off[1])] += src[off[0]]; });
  return acc;
}

Tensor reduce(const char* name, dnnl::algorithm alg, const Tensor& x_in, IntArrayRef dims, bool keepdim) {
  check_float(name, "input", x_in);
  if (x_in.dim() == 0) return copy(x_in, MemoryFormat::kContiguous, x_in.dtype());
  const std::vector<bool> red = reduced_dims(name, x_in, dims);
  const Tensor x = dense(x_in);
  std::vector<int64_t> kept(x.dim());
  for (int64_t d = 0; d < x.dim(); ++d) kept[d] = red[d] ? 1 : x.size(d);
  Tensor dst = Tensor::empty(kept, DType::kF32);
  const std::vector<int64_t> final_sizes = reduced_sizes(x, red, keepdim);
  if (dst.numel() == 0) return dst.raw_view(final_sizes);
  if (x.numel() == 0) {
    fill(dst, alg == dnnl::algorithm::reduction_mean ? std::nan("") : 0.0);
    return dst.raw_view(final_sizes);
  }
  // oneDNN's reference reduction (a channels-last input, or dims that are not the trailing ones)
  // sums each output in one f32 accumulator, its vectorized one in f32 lanes: sums of 2^18 to 2^21
  // terms of 0.1 came out 0.02% to 1.7% off (LargeSumsAndMeansKeepFloatPrecision). Above
  // kExactF32Terms terms per output, or on the reference path, sum in double, as std does
  // (PyTorch's cascade sum is as close).
  auto sum_in_double = [&] {
    const std::vector<double> acc = sums_in_double(x, dst);
    const double count = static_cast<double>(x.numel() / dst.numel());
    float* out = dst.raw_mutable_data<float>();
    for (size_t i = 0; i < acc.size(); ++i) {
      out[i] = static_cast<float>(alg == dnnl::algorithm::reduction_mean ? acc[i] / count : acc[i]);
    }
    return dst.raw_view(final_sizes);
  };
  if (x.numel() / dst.numel() > kExactF32Terms) return sum_in_double();
  PrimitiveKey key("reduce_f32");
  key.add(static_cast<int64_t>(alg)).add(x).add(dst).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    try {
      dnnl::reduction::desc d(alg, desc_of(x), desc_of(dst), 0.f, 0.f);
      dnnl::reduction::primitive_desc pd(d, base_attr(), cpu_engine());
      auto e = entry_from(dnnl::reduction(pd), pd);
      e->reference_impl = std::strncmp(pd.impl_info_str(), "ref", 3) == 0;
      return e;
    } catch (const dnnl::error& e) {
      rethrow_dnnl("creating a reduction primitive", e);
    }
  });
  if (entry->reference_impl) return sum_in_double();
  execute(entry->prim, entry->scratchpad_bytes, {{DNNL_ARG_SRC, mem_of(x)}, {DNNL_ARG_DST, mem_of(dst)}});
  return dst.raw_view(final_sizes);
}

}  // namespace

Tensor mean(const Tensor& x, IntArrayRef dims, bool keepdim) {
  return reduce("mean", dnnl::algorithm::reduction_mean, x, dims, keepdim);
}

Tensor sum(const Tensor& x, IntArrayRef dims, bool keepdim) {
  return reduce("sum", dnnl::algorithm::reduction_sum, x, dims, keepdim);
}

Tensor std_dev(const Tensor& x, IntArrayRef dims, bool unbiased, bool keepdim) {
  check_float("std", "input", x);
  const std::vector<bool> red = reduced_dims("std", x, dims);
  std::vector<int64_t> kept(x.dim());
  int64_t count = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    kept[d] = red[d] ? 1 : x.size(d);
    if (red[d]) count *= x.size(d);
  }
  Tensor dst = Tensor::empty(kept, DType::kF32);
  // Two passes in double over the reduced elements of each output position.
  std::vector<double> s = sums_in_double(x, dst), s2(dst.numel(), 0.0);
  const std::vector<int64_t> dst_st = broadcast_strides(dst, x.sizes());
  const float* src = x.raw_data<float>();
  for (auto& v : s) v /= static_cast<double>(count);
  for_each_offset<2>(x.sizes(), {x.strides(), IntArrayRef(dst_st)}, [&](const std::array<int64_t, 2>& off) {
    const double dv = src[off[0]] - s[off[1]];
    s2[off[1]] += dv * dv;
  });
  float* out = dst.raw_mutable_data<float>();
  const double denom = static_cast<double>(count - (unbiased ? 1 : 0));
  for (size_t i = 0; i < s2.size(); ++i) {
    out[i] = denom > 0 ? static_cast<float>(std::sqrt(s2[i] / denom)) : std::numeric_limits<float>::quiet_NaN();
  }
  return dst.raw_view(reduced_sizes(x, red, keepdim));
}

Tensor cat(absl::Span<const Tensor* const> tensors, int64_t dim) {
  const DimVector out = cat_output_sizes(tensors, dim);
  const Tensor& first = *tensors[0];
  const int64_t d = first.wrap_dim(dim);
  DBRQ_ENSURE(first.dtype() == DType::kF32 || is_quantized_dtype(first.dtype()) || first.dtype() == DType::kS32,
              DTypeError, "cat: dtype ", dtype_name(first.dtype()), " is not supported (f32, s32, s8, u8)");
  for (size_t i = 1; i < tensors.size(); ++i) {
    const QuantParams* a = first.qparams();
    const QuantParams* b = tensors[i]->qparams();
    DBRQ_ENSURE((a == nullptr) == (b == nullptr) && (a == nullptr || *a == *b), DTypeError,
                "cat: quantized inputs must share quantization parameters; tensors[", i, "] has ",
                b ? b->to_string() : "none", " but tensors[0] has ", a ? a->to_string() : "none");
  }
  const MemoryFormat fmt = first.dim() == 4 ? first.suggest_memory_format() : MemoryFormat::kContiguous;
  Tensor dst = Tensor::empty(out, first.dtype(), fmt).with_qparams(first.qparams_ptr());
  if (dst.numel() == 0) return dst;
  // Contiguous inputs into a contiguous output: each input is `outer` runs of size(d) * inner
  // elements, landing at a fixed offset in each output run; plain copies, no primitive per call
  // (appending a token to a key / value cache meets a new shape every step).
  bool plain = fmt == MemoryFormat::kContiguous;
  for (const Tensor* t : tensors) plain = plain && t->dtype() == first.dtype() && t->is_contiguous();
  if (plain) {
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i) outer *= out[i];
    for (int64_t i = d + 1; i < static_cast<int64_t>(out.size()); ++i) inner *= out[i];
    const size_t es = dst.element_size();
    const size_t dst_run = static_cast<size_t>(out[d] * inner) * es;
    char* base = static_cast<char*>(dst.mutable_data_ptr());
    size_t at = 0;
    for (const Tensor* t : tensors) {
      const size_t run = static_cast<size_t>(t->size(d) * inner) * es;
      if (run == 0) continue;
      const char* src = static_cast<const char*>(t->data_ptr());
      for (int64_t o = 0; o < outer; ++o) std::memcpy(base + o * dst_run + at, src + o * run, run);
      at += run;
    }
    return dst;
  }
  // Channels-last inputs joined along channels (a U-Net's skip connection, a DenseNet layer's
  // features): each pixel's channels of every input land at a fixed offset in the pixel's output
  // channels. Pixel by pixel, every input's run in 16-byte moves: each output line is written
  // once, and there is one parallel loop per call, not one per input. Against input by input
  // (interleaved in one process, Intel Xeon with AMX, one thread): 0.78-0.87x on DenseNet-121's
  // batch-1 cats, 0.62-0.73x at batch 8, 0.77-0.83x on the U-Net's two-input cats; tiles of
  // pixels walked input by input were slower than both. A oneDNN reorder into each input's
  // strided slice ran at ~3.5 GB/s (1.2 ms of a [8, 64, 128, 128] u8 cat).
  bool nhwc = fmt == MemoryFormat::kChannelsLast && d == 1;
  for (const Tensor* t : tensors) nhwc = nhwc && t->dtype() == first.dtype() && t->is_channels_last();
  if (nhwc) {
    struct Run {
      const char* src;
      size_t bytes;
    };
    absl::InlinedVector<Run, 32> runs;
    const size_t es = dst.element_size();
    for (const Tensor* t : tensors) {
      const size_t bytes = static_cast<size_t>(t->size(1)) * es;
      if (bytes > 0) runs.push_back({static_cast<const char*>(t->data_ptr()), bytes});
    }
    const int64_t pixels = out[0] * out[2] * out[3];
    const size_t dst_run = static_cast<size_t>(out[1]) * es;
    char* base = static_cast<char*>(dst.mutable_data_ptr());
    parallel_for(pixels, std::max<int64_t>(1, 65536 / static_cast<int64_t>(dst_run)), [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        char* o = base + static_cast<size_t>(p) * dst_run;
        for (const Run& r : runs) {
          const char* i = r.src + static_cast<size_t>(p) * r.bytes;
          size_t k = 0;
          for (; k + 16 <= r.bytes; k += 16) std::memcpy(o + k, i + k, 16);  // inlined 16-byte moves
          if (k < r.bytes) std::memcpy(o + k, i + k, r.bytes - k);
          o += r.bytes;
        }
      }
    });
    return dst;
  }
  // Copy each input into its slice of the output (a reorder per input; no concat primitive needed
  // because the slices are views with the output's strides).
  int64_t offset = 0;
  for (const Tensor* t : tensors) {
    if (t->size(d) == 0) continue;
    Tensor slice = dst.raw_narrow(d, offset, t->size(d));
    reorder_into(*t, slice);
    offset += t->size(d);
  }
  return dst;
}

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  check_defined("embedding", "indices", indices);
  check_float("embedding", "weight", weight);
  DBRQ_ENSURE(indices.dtype() == DType::kS64 || indices.dtype() == DType::kS32, DTypeError,
              "embedding: indices must be s64 or s32, got ", dtype_name(indices.dtype()));
  DBRQ_ENSURE(weight.dim() == 2, ShapeError, "embedding: weight must be 2-D (num_embeddings, embedding_dim), got sizes ",
              weight.shape_string());
  const int64_t v = weight.size(0), dim = weight.size(1);
  std::vector<int64_t> out(indices.sizes().begin(), indices.sizes().end());
  out.push_back(dim);
  Tensor dst = Tensor::empty(out, DType::kF32);
  const std::vector<int64_t> ids = indices.to_vector<int64_t>();
  const Tensor w = contiguous(weight);
  const float* src = w.raw_data<float>();
  float* d = dst.raw_mutable_data<float>();
  for (size_t i = 0; i < ids.size(); ++i) {
    DBRQ_ENSURE(ids[i] >= 0 && ids[i] < v, IndexError, "embedding: index ", ids[i], " at position ", i,
                " is out of range for ", v, " embeddings");
    std::copy(src + ids[i] * dim, src + (ids[i] + 1) * dim, d + static_cast<int64_t>(i) * dim);
  }
  return dst;
}

namespace {

bool dnnl_dtype(DType t) { return t != DType::kS64; }

}  // namespace

Tensor copy(const Tensor& x, MemoryFormat format, DType dtype) {
  check_defined("copy", "input", x);
  Tensor dst = format == MemoryFormat::kPreserve ? Tensor::empty_like(x, dtype) : Tensor::empty(x.sizes(), dtype, format);
  if (dtype == x.dtype()) dst = dst.with_qparams(x.qparams_ptr());
  copy_into(dst, x);
  return dst;
}

void copy_into(Tensor& dst, const Tensor& src) {
  check_defined("copy_", "self", dst);
  check_defined("copy_", "src", src);
  const DimVector out = broadcast_shapes("copy_", dst.sizes(), src.sizes());
  DBRQ_ENSURE(IntArrayRef(out) == dst.sizes(), ShapeError, "copy_: source sizes ", src.shape_string(),
              " do not broadcast to destination sizes ", dst.shape_string());
  if (dst.numel() == 0) return;
  dst.mutable_data_ptr();  // version bump
  // oneDNN's reorder rounds and saturates into integers; PyTorch (and the loop below) truncates.
  const bool to_integer = is_integral_dtype(dst.dtype()) && src.dtype() != dst.dtype();
  if (src.sizes() == dst.sizes() && !to_integer && dnnl_dtype(src.dtype()) && dnnl_dtype(dst.dtype()) &&
      (src.dtype() != DType::kBF16) == (dst.dtype() != DType::kBF16 || src.dtype() == DType::kF32)) {
    reorder_into(src, dst);
    return;
  }
  const std::vector<int64_t> src_st = broadcast_strides(src, dst.sizes());
  char* dbase = static_cast<char*>(dst.storage()->data());
  (void)src.data_ptr();  // raises for a tensor without values of its own (Tensor::value_withheld)
  const char* sbase = static_cast<const char*>(src.storage()->data());
  const int64_t doff = dst.storage_offset(), soff = src.storage_offset();
  if (src.dtype() == dst.dtype()) {
    // Element bytes as they are: going through double would round s64 values beyond 2^53.
    const int64_t es = static_cast<int64_t>(dst.element_size());
    for_each_offset<2>(dst.sizes(), {dst.strides(), IntArrayRef(src_st)}, [&](const std::array<int64_t, 2>& off) {
      std::memcpy(dbase + (doff + off[0]) * es, sbase + (soff + off[1]) * es, es);
    });
    return;
  }
  for_each_offset<2>(dst.sizes(), {dst.strides(), IntArrayRef(src_st)}, [&](const std::array<int64_t, 2>& off) {
    double v;
    const int64_t si = soff + off[1];
    if (src.dtype() == DType::kBF16) {
      uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(sbase)[si]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      v = f;
    } else {
      v = visit_dtype(src.dtype(), [&](auto tag) { return static_cast<double>(reinterpret_cast<const decltype(tag)*>(sbase)[si]); });
    }
    const int64_t di = doff + off[0];
    if (dst.dtype() == DType::kBF16) {
      float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      reinterpret_cast<uint16_t*>(dbase)[di] = static_cast<uint16_t>(bits >> 16);
      return;
    }
    visit_dtype(dst.dtype(), [&](auto tag) {
      using T = decltype(tag);
      // Through int64 so that narrowing wraps like PyTorch instead of being undefined.
      if constexpr (std::is_integral_v<T>) {
        reinterpret_cast<T*>(dbase)[di] = static_cast<T>(static_cast<int64_t>(v));
      } else {
        reinterpret_cast<T*>(dbase)[di] = static_cast<T>(v);
      }
    });
  });
}

void fill(Tensor& dst, double value) {
  check_defined("fill_", "self", dst);
  Tensor filled = full(dst.sizes(), value, dst.dtype());
  copy_into(dst, filled);
}

namespace {

// zp + nearbyint(v * inv), saturated. Saturates in float before the integer conversion: a value
// beyond int32's range would make the conversion undefined (x86 yields INT32_MIN, so 3e9 became qmin).
template <typename Q>
inline Q quantize_value(float v, float inv, int32_t zp) {
  constexpr int32_t qmin = std::numeric_limits<Q>::min(), qmax = std::numeric_limits<Q>::max();
  const float lo = static_cast<float>(qmin - zp), hi = static_cast<float>(qmax - zp);
  const float r = std::min(std::max(std::nearbyint(v * inv), lo), hi);
  return static_cast<Q>(static_cast<int32_t>(r) + zp);
}

template <typename Q>
void quantize_loop(const Tensor& x, Tensor& dst, const QuantParams& qp) {
  const float* src = x.raw_data<float>();
  Q* out = dst.raw_mutable_data<Q>();
  if (!qp.is_per_channel()) {
    // PyTorch's quantize_per_tensor: zp + nearbyint(x * (1 / scale)), saturated.
    const float inv = 1.0f / qp.scale();
    const int32_t zp = qp.zero_point();
    parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<Q, uint8_t>) {
        // The same codes for every finite value (clamping before or after rounding to an integer
        // bound is the same); NaN gives the lowest code instead of an undefined conversion.
        simd::quantize_u8(src + begin, out + begin, end - begin, inv, zp);
      } else {
        for (int64_t i = begin; i < end; ++i) out[i] = quantize_value<Q>(src[i], inv, zp);
      }
    });
    return;
  }
  // Per channel: src and dst share a dense layout, so one stride walk serves both.
  for_each_channel_run(x.numel(), x.stride(qp.axis), x.size(qp.axis), [&](int64_t first, int64_t end, int64_t c) {
    const float inv = 1.0f / qp.scales[c];
    const int32_t zp = qp.zero_points[c];
    for (int64_t i = first; i < end; ++i) out[i] = quantize_value<Q>(src[i], inv, zp);
  });
}

template <typename Q>
void dequantize_loop(const Tensor& x, Tensor& dst, const QuantParams& qp) {
  const Q* src = x.raw_data<Q>();
  float* out = dst.raw_mutable_data<float>();
  if (!qp.is_per_channel()) {
    const float scale = qp.scale();
    const float zp = static_cast<float>(qp.zero_point());
    parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<Q, uint8_t>) {
        simd::dequantize_u8(src + begin, out + begin, end - begin, scale, static_cast<int32_t>(zp));
      } else {
        for (int64_t i = begin; i < end; ++i) out[i] = (static_cast<float>(src[i]) - zp) * scale;
      }
    });
    return;
  }
  for_each_channel_run(x.numel(), x.stride(qp.axis), x.size(qp.axis), [&](int64_t first, int64_t end, int64_t c) {
    const float zp = static_cast<float>(qp.zero_points[c]), scale = qp.scales[c];
    for (int64_t i = first; i < end; ++i) out[i] = (static_cast<float>(src[i]) - zp) * scale;
  });
}

}  // namespace

Tensor quantize(const Tensor& x_in, const QuantParamsPtr& qparams, DType dtype) {
  check_float("quantize", "input", x_in);
  DBRQ_ENSURE(qparams != nullptr, ValueError, "quantize: quantization parameters are null");
  DBRQ_ENSURE(is_quantized_dtype(dtype), DTypeError, "quantize: target dtype must be s8 or u8, got ", dtype_name(dtype));
  const int32_t lo = dtype == DType::kU8 ? 0 : -128, hi = dtype == DType::kU8 ? 255 : 127;
  for (int32_t zp : qparams->zero_points) {
    DBRQ_ENSURE(zp >= lo && zp <= hi, ValueError, "quantize: zero point ", zp, " is outside the ", dtype_name(dtype),
                " range [", lo, ", ", hi, "]");
  }
  const Tensor x = dense(x_in);
  Tensor dst = Tensor::empty_like(x, dtype);
  dst = dst.with_qparams(qparams);  // validates per-channel sizes
  if (dtype == DType::kU8) quantize_loop<uint8_t>(x, dst, *qparams);
  else quantize_loop<int8_t>(x, dst, *qparams);
  return dst;
}

namespace {

// dequantize's and dequantize_lazy's input: a defined quantized tensor.
void check_dequantize_input(const Tensor& x) {
  check_defined("dequantize", "input", x);
  DBRQ_ENSURE(x.is_quantized(), DTypeError, "dequantize: input must be a quantized s8/u8 tensor, got dtype ",
              dtype_name(x.dtype()), x.dtype() == DType::kF32 ? "" : " without quantization parameters");
}

}  // namespace

Tensor dequantize(const Tensor& x_in) {
  check_dequantize_input(x_in);
  const Tensor x = dense(x_in);
  Tensor dst = Tensor::empty_like(x, DType::kF32);
  if (x.dtype() == DType::kU8) dequantize_loop<uint8_t>(x, dst, *x.qparams());
  else dequantize_loop<int8_t>(x, dst, *x.qparams());
  return dst;
}

namespace {

// Storage::LazyFill::fn of dequantize_lazy: the source's codes as a tensor again, dequantized as
// dequantize() does.
void fill_dequantized(const Storage::LazyFill& f, void* data) {
  DBRQ_ENSURE(f.source->version() == f.source_version, UsageError,
              "reading a converted model's returned output whose int8 codes were overwritten after the call "
              "returned (dequantize_lazy); this is a dbrq bug, please report it");
  const DType dtype = static_cast<DType>(f.dtype);
  const char* codes = static_cast<const char*>(f.source->data()) + f.offset * static_cast<int64_t>(dtype_size(dtype));
  const Tensor x = Tensor::from_blob(const_cast<char*>(codes), {f.numel}, dtype)
                       .with_qparams(QuantParams::per_tensor(static_cast<float>(f.scale), static_cast<int32_t>(f.zero_point)));
  Tensor dst = Tensor::from_blob(data, {f.numel}, DType::kF32);
  if (dtype == DType::kU8) dequantize_loop<uint8_t>(x, dst, *x.qparams());
  else dequantize_loop<int8_t>(x, dst, *x.qparams());
}

}  // namespace

Tensor dequantize_lazy(const Tensor& x) {
  check_dequantize_input(x);
  if (!x.is_contiguous() || x.qparams()->is_per_channel()) return dequantize(x);
  Storage::LazyFill fill;
  fill.fn = &fill_dequantized;
  fill.source = x.storage();
  fill.source_version = x.storage()->version();
  fill.offset = x.storage_offset();
  fill.numel = x.numel();
  fill.dtype = static_cast<int>(x.dtype());
  fill.scale = x.qparams()->scales[0];
  fill.zero_point = x.qparams()->zero_points[0];
  return Tensor::empty_lazy(x.sizes(), DType::kF32, std::move(fill));
}

}  // namespace dbrq::kernels

namespace dbrq::kernels {

Tensor contiguous(const Tensor& x, MemoryFormat format) {
  if (x.is_contiguous(format)) return x;
  return copy(x, format, x.dtype());
}

}  // namespace dbrq::kernels
