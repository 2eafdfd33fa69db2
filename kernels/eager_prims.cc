#include "kernels/eager_prims.h"

#include <string>

#include "kernels/eager.h"

namespace dbrq::kernels {

dnnl::memory::desc conv_weights_user_desc(const Tensor& w, int64_t groups) {
  if (groups == 1) return desc_of(w);
  // oneDNN's grouped layout: [G, K/G, C/G, R, S] over the same contiguous memory.
  const int64_t k = w.size(0);
  return plain_desc({groups, k / groups, w.size(1), w.size(2), w.size(3)}, DType::kF32, tag::goihw);
}

dnnl::memory::dims conv_weights_dims(const Tensor& w, int64_t groups) {
  if (groups == 1) return {w.size(0), w.size(1), w.size(2), w.size(3)};
  return {groups, w.size(0) / groups, w.size(1), w.size(2), w.size(3)};
}

namespace {

dnnl::memory::desc bias_desc(const Tensor& w, const Tensor& b) {
  return b.defined() ? plain_desc({w.size(0)}, DType::kF32, tag::x) : dnnl::memory::desc();
}

}  // namespace

std::shared_ptr<PrimitiveEntry> make_conv_entry(const dnnl::memory::desc& src_md, const Tensor& w, const Tensor& b,
                                                const Tensor& dst, const Conv2dParams& p, dt weights_dt,
                                                const dnnl::primitive_attr& attr, const char* what) {
  try {
    dnnl::memory::desc w_md(conv_weights_dims(w, p.groups), weights_dt, tag::any);
    dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src_md,
                                      w_md, bias_desc(w, b), desc_of(dst), {p.stride[0], p.stride[1]},
                                      {p.dilation[0] - 1, p.dilation[1] - 1}, {p.padding[0], p.padding[1]},
                                      {p.padding[0], p.padding[1]});
    dnnl::convolution_forward::primitive_desc pd(d, attr, cpu_engine());
    auto e = std::make_shared<PrimitiveEntry>();
    e->prim = dnnl::convolution_forward(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->weights_desc = pd.weights_desc();
    return e;
  } catch (const dnnl::error& e) {
    rethrow_dnnl(what, e);
  }
}

std::shared_ptr<PrimitiveEntry> make_inner_product_entry(const Tensor& x2, const Tensor& w, const Tensor& b,
                                                         const Tensor& dst, dt weights_dt,
                                                         const dnnl::primitive_attr& attr, const char* what) {
  try {
    dnnl::memory::desc w_md({w.size(0), w.size(1)}, weights_dt, tag::any);
    dnnl::inner_product_forward::desc d(dnnl::prop_kind::forward_inference, desc_of(x2), w_md, bias_desc(w, b),
                                        desc_of(dst));
    dnnl::inner_product_forward::primitive_desc pd(d, attr, cpu_engine());
    auto e = std::make_shared<PrimitiveEntry>();
    e->prim = dnnl::inner_product_forward(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    e->weights_desc = pd.weights_desc();
    return e;
  } catch (const dnnl::error& e) {
    rethrow_dnnl(what, e);
  }
}

std::shared_ptr<PrimitiveEntry> make_matmul_entry(const Tensor& a, const Tensor& b, const Tensor& dst,
                                                  const char* what, bool* is_ref) {
  try {
    dnnl::matmul::desc d(desc_of(a), desc_of(b), desc_of(dst));
    dnnl::matmul::primitive_desc pd(d, base_attr(), cpu_engine());
    if (is_ref != nullptr) *is_ref = std::string(pd.impl_info_str()).find("ref") != std::string::npos;
    auto e = std::make_shared<PrimitiveEntry>();
    e->prim = dnnl::matmul(pd);
    e->scratchpad_bytes = pd.scratchpad_desc().get_size();
    return e;
  } catch (const dnnl::error& e) {
    rethrow_dnnl(what, e);
  }
}

void run_weighted(const PrimitiveEntry& e, const dnnl::memory::desc& src_md, const Tensor& src, const Tensor& w,
                  const dnnl::memory::desc& w_user_md, const Tensor& b, const Tensor& dst) {
  dnnl::memory wmem = packed_weights(w, w_user_md, e.weights_desc);
  ExecArgs args = {{DNNL_ARG_SRC, mem_of(src_md, src)}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_DST, mem_of(dst)}};
  const Tensor bias = b.defined() ? contiguous(b) : Tensor();  // outlives execute()
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, mem_of(bias_desc(w, b), bias));
  execute(e.prim, e.scratchpad_bytes, std::move(args));
}

}  // namespace dbrq::kernels
