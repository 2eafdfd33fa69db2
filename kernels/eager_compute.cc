// Eager conv2d, linear and matmul on oneDNN (f32).
#include "kernels/dnnl_utils.h"
#include "kernels/eager.h"
#include "kernels/eager_prims.h"
#include "kernels/post_ops.h"
#include "core/op_shapes.h"

namespace dbrq::kernels {

Tensor conv2d(const Tensor& x, const Tensor& w_in, const Tensor& b, const Conv2dParams& p, const PostOps& post) {
  const ConvGeometry g = conv2d_geometry(x, w_in, b, p);
  check_float("conv2d", "input", x);
  check_float("conv2d", "weight", w_in);
  if (b.defined()) check_float("conv2d", "bias", b);
  const Tensor src = x.is_channels_last() ? x : copy(x, MemoryFormat::kChannelsLast, DType::kF32);
  // Described as nhwc even when its strides are ambiguous (one channel, or 1x1 images): oneDNN
  // matches layouts by exact strides, and an NCHW-looking source sends it to its reference conv.
  const dnnl::memory::desc src_md = plain_desc(src.sizes(), DType::kF32, tag::nhwc);
  const Tensor w = w_in.is_contiguous() ? w_in : copy(w_in, MemoryFormat::kContiguous, DType::kF32);
  Tensor dst = Tensor::empty({g.n, g.k, g.oh, g.ow}, DType::kF32, MemoryFormat::kChannelsLast);
  if (dst.numel() == 0) return dst;

  PrimitiveKey key("conv2d_f32");
  key.add(src).add(w.sizes()).add(static_cast<int64_t>(b.defined())).add(p.stride).add(p.padding).add(p.dilation);
  key.add(p.groups).add(static_cast<int64_t>(get_num_threads()));
  add_post_ops_to_key(key, post);
  auto entry = primitive_cache().get_or_create(key, [&] {
    dnnl::primitive_attr attr = base_attr();
    attr.set_post_ops(make_post_ops(post));
    return make_conv_entry(src_md, w, b, dst, p, dt::f32, attr, "creating an f32 convolution");
  });
  run_weighted(*entry, src_md, src, w, conv_weights_user_desc(w, p.groups), b, dst);
  return dst;
}

Tensor linear_bias_rows(int64_t m, int64_t n, const Tensor& b, const PostOps& post) {
  Tensor dst = Tensor::empty({m, n}, DType::kF32);
  float* p = dst.raw_mutable_data<float>();
  const Tensor bc = b.defined() ? contiguous(b) : Tensor();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j) p[r * n + j] = bc.defined() ? bc.raw_data<float>()[j] : 0.f;
  for (const Eltwise& e : post) dst = eltwise(e, dst);
  return dst;
}

Tensor linear(const Tensor& x, const Tensor& w_in, const Tensor& b, const PostOps& post) {
  const DimVector out_sizes = linear_output_sizes(x, w_in, b);
  check_float("linear", "input", x);
  check_float("linear", "weight", w_in);
  if (b.defined()) check_float("linear", "bias", b);
  const int64_t k = w_in.size(1), n = w_in.size(0);
  const int64_t m = linear_rows(x);
  Tensor dst = Tensor::empty({m, n}, DType::kF32);
  if (m == 0 || n == 0) return dst.raw_view(out_sizes);
  if (k == 0) return linear_bias_rows(m, n, b, post).raw_view(out_sizes);
  Tensor x2 = x.raw_view({m, k});
  if (!x2.defined() || x2.stride(1) != 1) x2 = copy(x, MemoryFormat::kContiguous, DType::kF32).raw_view({m, k});
  const Tensor w = w_in.stride(1) == 1 ? w_in : copy(w_in, MemoryFormat::kContiguous, DType::kF32);

  PrimitiveKey key("linear_f32");
  key.add(x2).add(w.sizes()).add(w.strides()).add(static_cast<int64_t>(b.defined()));
  key.add(static_cast<int64_t>(get_num_threads()));
  add_post_ops_to_key(key, post);
  auto entry = primitive_cache().get_or_create(key, [&] {
    dnnl::primitive_attr attr = base_attr();
    attr.set_post_ops(make_post_ops(post));
    return make_inner_product_entry(x2, w, b, dst, dt::f32, attr, "creating an f32 inner product");
  });
  run_weighted(*entry, desc_of(x2), x2, w, desc_of(w), b, dst);
  return dst.raw_view(out_sizes);
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  check_defined("matmul", "input", a_in);
  check_defined("matmul", "other", b_in);
  const MatmulShapes s = matmul_shapes(a_in.sizes(), b_in.sizes());
  check_float("matmul", "input", a_in);
  check_float("matmul", "other", b_in);
  Tensor a = a_in.raw_view(s.a), b = b_in.raw_view(s.b);
  if (!a.defined()) a = copy(a_in, MemoryFormat::kContiguous, DType::kF32).raw_view(s.a);
  if (!b.defined()) b = copy(b_in, MemoryFormat::kContiguous, DType::kF32).raw_view(s.b);
  Tensor dst = Tensor::empty(s.out, DType::kF32);
  DimVector final_sizes = s.out;
  if (s.squeeze_n) final_sizes.pop_back();
  if (s.squeeze_m) final_sizes.erase(final_sizes.end() - (s.squeeze_n ? 1 : 2));
  if (dst.numel() == 0) return dst.raw_view(final_sizes);
  if (a.size(-1) == 0) {
    fill(dst, 0.0);
    return dst.raw_view(final_sizes);
  }

  PrimitiveKey key("matmul_f32");
  key.add(a).add(b).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    bool is_ref = false;
    auto e = make_matmul_entry(a, b, dst, "creating an f32 matmul", &is_ref);
    if (is_ref && !(a.is_contiguous() && b.is_contiguous())) e->src_desc = dnnl::memory::desc();  // mark: copy first
    else e->src_desc = desc_of(a);
    return e;
  });
  if (entry->src_desc.is_zero()) {
    // The strided operands would run on oneDNN's reference kernel; contiguous copies are faster.
    a = copy(a, MemoryFormat::kContiguous, DType::kF32);
    b = copy(b, MemoryFormat::kContiguous, DType::kF32);
    PrimitiveKey key2("matmul_f32");
    key2.add(a).add(b).add(static_cast<int64_t>(get_num_threads()));
    entry = primitive_cache().get_or_create(key2, [&] {
        auto e = make_matmul_entry(a, b, dst, "creating an f32 matmul");
      e->src_desc = desc_of(a);
      return e;
    });
  }
  execute(entry->prim, entry->scratchpad_bytes,
          {{DNNL_ARG_SRC, mem_of(a)}, {DNNL_ARG_WEIGHTS, mem_of(b)}, {DNNL_ARG_DST, mem_of(dst)}});
  return dst.raw_view(final_sizes);
}

}  // namespace dbrq::kernels
