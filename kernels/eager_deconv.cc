// Eager conv_transpose2d on oneDNN's deconvolution (f32).
#include <algorithm>

#include "core/op_shapes.h"
#include "kernels/dnnl_utils.h"
#include "kernels/eager.h"
#include "kernels/post_ops.h"

namespace dbrq::kernels {

// PyTorch's [C, K/G, R, S] weight is oneDNN's iohw (giohw with groups): the same memory, read
// as deconvolution weights [K, C] (or [G, K/G, C/G]).
dnnl::memory::desc deconv_weights_user_desc(const Tensor& w, int64_t groups, DType dtype) {
  const int64_t c = w.size(0), kg = w.size(1);
  if (groups == 1) return plain_desc({kg, c, w.size(2), w.size(3)}, dtype, tag::iohw);
  return plain_desc({groups, kg, c / groups, w.size(2), w.size(3)}, dtype, tag::giohw);
}

dnnl::memory::dims deconv_weights_dims(const Tensor& w, int64_t groups) {
  const int64_t c = w.size(0), kg = w.size(1);
  if (groups == 1) return {kg, c, w.size(2), w.size(3)};
  return {groups, kg, c / groups, w.size(2), w.size(3)};
}

Tensor conv_transpose2d(const Tensor& x, const Tensor& w_in, const Tensor& b, const ConvTranspose2dParams& p,
                        const PostOps& post) {
  const ConvGeometry g = conv_transpose2d_geometry(x, w_in, b, p);
  check_float("conv_transpose2d", "input", x);
  check_float("conv_transpose2d", "weight", w_in);
  if (b.defined()) check_float("conv_transpose2d", "bias", b);
  const Tensor src = x.is_channels_last() ? x : copy(x, MemoryFormat::kChannelsLast, DType::kF32);
  const dnnl::memory::desc src_md = plain_desc(src.sizes(), DType::kF32, tag::nhwc);
  const Tensor w = w_in.is_contiguous() ? w_in : copy(w_in, MemoryFormat::kContiguous, DType::kF32);
  Tensor dst = Tensor::empty({g.n, g.k, g.oh, g.ow}, DType::kF32, MemoryFormat::kChannelsLast);
  if (dst.numel() == 0) return dst;
  if (src.numel() == 0) {  // no input channels or pixels: the bias alone (oneDNN refuses empty sources)
    fill(dst, 0.0);
    if (b.defined()) binary_inplace(BinaryAlg::kAdd, dst, b.raw_view({1, g.k, 1, 1}));
    return dst;
  }

  PrimitiveKey key("deconv_f32");
  key.add(src).add(w.sizes()).add(static_cast<int64_t>(b.defined())).add(p.stride).add(p.padding);
  key.add(p.output_padding).add(p.dilation).add(p.groups).add(static_cast<int64_t>(get_num_threads()));
  add_post_ops_to_key(key, post);
  auto entry = primitive_cache().get_or_create(key, [&] {
    try {
      auto dst_md = desc_of(dst);
      dnnl::memory::desc w_md(deconv_weights_dims(w, p.groups), dt::f32, tag::any);
      dnnl::memory::desc b_md = b.defined() ? plain_desc({g.k}, DType::kF32, tag::x) : dnnl::memory::desc();
      // PyTorch's output_padding extends the bottom / right edge: a smaller right padding.
      dnnl::deconvolution_forward::desc d(
          dnnl::prop_kind::forward_inference, dnnl::algorithm::deconvolution_direct, src_md, w_md, b_md, dst_md,
          {p.stride[0], p.stride[1]}, {p.dilation[0] - 1, p.dilation[1] - 1}, {p.padding[0], p.padding[1]},
          {p.padding[0] - p.output_padding[0], p.padding[1] - p.output_padding[1]});
      dnnl::primitive_attr attr = base_attr();
      attr.set_post_ops(make_post_ops(post));
      dnnl::deconvolution_forward::primitive_desc pd(d, attr, cpu_engine());
      auto e = std::make_shared<PrimitiveEntry>();
      e->prim = dnnl::deconvolution_forward(pd);
      e->scratchpad_bytes = pd.scratchpad_desc().get_size();
      e->weights_desc = pd.weights_desc();
      return e;
    } catch (const dnnl::error& e) {
      rethrow_dnnl("creating an f32 deconvolution", e);
    }
  });
  dnnl::memory wmem = packed_weights(w, deconv_weights_user_desc(w, p.groups, DType::kF32), entry->weights_desc);
  ExecArgs args = {{DNNL_ARG_SRC, mem_of(src_md, src)}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_DST, mem_of(dst)}};
  const Tensor bias = b.defined() ? contiguous(b) : Tensor();  // outlives execute()
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, mem_of(plain_desc({g.k}, DType::kF32, tag::x), bias));
  execute(entry->prim, entry->scratchpad_bytes, std::move(args));
  return dst;
}

}  // namespace dbrq::kernels

namespace dbrq::kernels {

Tensor deconv_weight_output_major(const Tensor& w_in, int64_t groups) {
  check_float("conv_transpose2d", "weight", w_in);
  DBRQ_ENSURE(w_in.dim() == 4 && groups >= 1 && w_in.size(0) % groups == 0, ShapeError,
              "conv_transpose2d: weight sizes ", w_in.shape_string(), " do not fit groups = ", groups);
  const Tensor w = contiguous(w_in);
  const int64_t c = w.size(0), kg = w.size(1), rs = w.size(2) * w.size(3), cg = c / groups;
  Tensor out = Tensor::empty({kg * groups, cg, w.size(2), w.size(3)}, DType::kF32);
  const float* src = w.raw_data<float>();
  float* dst = out.raw_mutable_data<float>();
  // src [g][i][j][rs] -> dst [g][j][i][rs]
  for (int64_t gi = 0; gi < groups; ++gi) {
    for (int64_t i = 0; i < cg; ++i) {
      for (int64_t j = 0; j < kg; ++j) {
        const float* s = src + ((gi * cg + i) * kg + j) * rs;
        float* d = dst + ((gi * kg + j) * cg + i) * rs;
        std::copy(s, s + rs, d);
      }
    }
  }
  return out;
}

}  // namespace dbrq::kernels
