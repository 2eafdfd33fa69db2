// fp32 conv2d and linear computed in the order of operations PyTorch 1.13 (Debian's build) uses,
// so that calibration observes exactly the values PyTorch FX's observers see (see eager.h).
#include <algorithm>
#include <vector>

#include "core/op_shapes.h"
#include "kernels/dnnl_utils.h"
#include "kernels/eager.h"
#include "kernels/loops.h"
#include "kernels/simd.h"

namespace dbrq::kernels {
namespace {

// `m` as the memory `want` describes: `m` itself when it already is, else a reordered copy.
dnnl::memory as_desc(const dnnl::memory& m, const dnnl::memory::desc& want) {
  if (m.get_desc() == want) return m;
  dnnl::memory out(want, cpu_engine());
  dnnl::reorder(m, out).execute(thread_stream(), const_cast<dnnl::memory&>(m), out);
  thread_stream().wait();
  return out;
}

}  // namespace

Tensor conv2d_torch_order(const Tensor& x, const Tensor& w_in, const Tensor& b, const Conv2dParams& p) {
  const ConvGeometry g = conv2d_geometry(x, w_in, b, p);
  check_float("conv2d", "input", x);
  check_float("conv2d", "weight", w_in);
  if (b.defined()) check_float("conv2d", "bias", b);
  const Tensor src = contiguous(x);
  const Tensor w = contiguous(w_in);
  const Tensor bias = b.defined() ? contiguous(b) : Tensor();
  Tensor dst = Tensor::empty({g.n, g.k, g.oh, g.ow}, DType::kF32);
  if (dst.numel() == 0) return dst;
  const dnnl::memory::dims wdims = p.groups == 1
                                       ? dnnl::memory::dims{w.size(0), w.size(1), w.size(2), w.size(3)}
                                       : dnnl::memory::dims{p.groups, w.size(0) / p.groups, w.size(1), w.size(2), w.size(3)};

  PrimitiveKey key("conv2d_f32_torch_order");
  key.add(src.sizes()).add(w.sizes()).add(static_cast<int64_t>(b.defined())).add(p.stride).add(p.padding);
  key.add(p.dilation).add(p.groups).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    try {
      // As ideep describes PyTorch's mkldnn_convolution: every layout left to oneDNN, training
      // propagation (what PyTorch asks for even under no_grad), no post-ops.
      const dnnl::memory::desc src_md({g.n, x.size(1), x.size(2), x.size(3)}, dt::f32, tag::any);
      const dnnl::memory::desc w_md(wdims, dt::f32, tag::any);
      const dnnl::memory::desc b_md = b.defined() ? plain_desc({g.k}, DType::kF32, tag::x) : dnnl::memory::desc();
      const dnnl::memory::desc dst_md({g.n, g.k, g.oh, g.ow}, dt::f32, tag::any);
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_md,
                                        w_md, b_md, dst_md, {p.stride[0], p.stride[1]},
                                        {p.dilation[0] - 1, p.dilation[1] - 1}, {p.padding[0], p.padding[1]},
                                        {p.padding[0], p.padding[1]});
      dnnl::convolution_forward::primitive_desc pd(d, base_attr(), cpu_engine());
      auto e = std::make_shared<PrimitiveEntry>();
      e->prim = dnnl::convolution_forward(pd);
      e->scratchpad_bytes = pd.scratchpad_desc().get_size();
      e->src_desc = pd.src_desc();
      e->weights_desc = pd.weights_desc();
      e->dst_desc = pd.dst_desc();
      return e;
    } catch (const dnnl::error& e) {
      rethrow_dnnl("creating an f32 convolution (PyTorch's order)", e);
    }
  });
  try {
    const dnnl::memory user_src = mem_of(plain_desc(src.sizes(), DType::kF32, tag::nchw), src);
    const dnnl::memory user_w =
        mem_of(p.groups == 1 ? plain_desc(w.sizes(), DType::kF32, tag::oihw)
                             : dnnl::memory::desc(wdims, dt::f32, tag::goihw),
               w);
    const dnnl::memory user_dst = mem_of(plain_desc(dst.sizes(), DType::kF32, tag::nchw), dst);
    const dnnl::memory s = as_desc(user_src, entry->src_desc);
    const dnnl::memory wm = as_desc(user_w, entry->weights_desc);
    const dnnl::memory dm = entry->dst_desc == user_dst.get_desc() ? user_dst : dnnl::memory(entry->dst_desc, cpu_engine());
    ExecArgs args = {{DNNL_ARG_SRC, s}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dm}};
    if (bias.defined()) args.emplace(DNNL_ARG_BIAS, mem_of(plain_desc({g.k}, DType::kF32, tag::x), bias));
    execute(entry->prim, entry->scratchpad_bytes, std::move(args));
    if (dm != user_dst) {
      dnnl::reorder(dm, user_dst).execute(thread_stream(), const_cast<dnnl::memory&>(dm), const_cast<dnnl::memory&>(user_dst));
      thread_stream().wait();
    }
  } catch (const dnnl::error& e) {
    rethrow_dnnl("running an f32 convolution (PyTorch's order)", e);
  }
  return dst;
}

// Each output is (x[0] w[0] + x[1] w[1] + ... in order, one rounding per step, no fused
// multiply-add) + bias: the reference BLAS sgemm's dot-product form (transposed A), which Debian's
// PyTorch reaches for F.linear through addmm (and through matmul then add_ for other ranks).
__attribute__((optimize("-ffp-contract=off"))) Tensor linear_torch_order(const Tensor& x, const Tensor& w_in,
                                                                           const Tensor& b) {
  const DimVector out_sizes = linear_output_sizes(x, w_in, b);
  check_float("linear", "input", x);
  check_float("linear", "weight", w_in);
  if (b.defined()) check_float("linear", "bias", b);
  const int64_t k = w_in.size(1), n = w_in.size(0);
  const int64_t m = linear_rows(x);
  if (k == 0) return linear_bias_rows(m, n, b).raw_view(out_sizes);
  const Tensor xc = contiguous(x);
  const Tensor w = contiguous(w_in);
  Tensor dst = Tensor::empty({m, n}, DType::kF32);
  const float* xs = xc.raw_data<float>();
  const float* ws = w.raw_data<float>();
  const std::vector<float> bias = b.defined() ? contiguous(b).to_vector<float>() : std::vector<float>();
  float* out = dst.raw_mutable_data<float>();
  // Blocks of sixteen output features; each output's sum still runs over k in order
  // (simd::dot16_unfused is bit-identical on every path), so neither the blocking nor the thread
  // count ever changes a value.
  const int64_t blocks = (n + 15) / 16;
  // Serial below about 256K multiply-adds (16K per row and block).
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, m * k));
  parallel_for(blocks, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> panel(static_cast<size_t>(k * 16));
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t j0 = blk * 16, nj = std::min<int64_t>(16, n - j0);
      simd::dot16_unfused(xs, m, k, ws + j0 * k, nj, panel.data(), out + j0, n);
      if (!bias.empty()) {
        for (int64_t i = 0; i < m; ++i) {
          float* o = out + i * n + j0;
          for (int64_t jj = 0; jj < nj; ++jj) o[jj] = o[jj] + bias[static_cast<size_t>(j0 + jj)];
        }
      }
    }
  });
  return dst.raw_view(out_sizes);
}

}  // namespace dbrq::kernels
