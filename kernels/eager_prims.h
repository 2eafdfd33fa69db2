// oneDNN primitive builders shared by the eager f32 kernels (eager_compute.cc) and their bf16 twins
// (eager_bf16.cc): the same convolution, inner product and matmul, differing only in the data type
// the primitive computes in and its attributes. Internal to kernels/.
//
//   auto entry = primitive_cache().get_or_create(key, [&] {
//     return make_conv_entry(src_md, w, b, dst, p, dt::bf16, base_attr(), "creating a bf16 convolution");
//   });
//   run_weighted(*entry, src_md, src, w, conv_weights_user_desc(w, p.groups), b, dst);
#pragma once

#include <memory>

#include "core/op_params.h"
#include "core/tensor.h"
#include "kernels/dnnl_utils.h"

namespace dbrq::kernels {

// A contiguous [K, C/G, R, S] f32 weight as oneDNN sees it: [G, K/G, C/G, R, S] when grouped.
dnnl::memory::desc conv_weights_user_desc(const Tensor& w, int64_t groups);
dnnl::memory::dims conv_weights_dims(const Tensor& w, int64_t groups);

// Forward-inference primitives with weights of type `weights_dt` in the layout the primitive
// prefers (kept in weights_desc for packed_weights); bias f32. `what` names the primitive in the
// DnnlError ("creating an f32 convolution").
std::shared_ptr<PrimitiveEntry> make_conv_entry(const dnnl::memory::desc& src_md, const Tensor& w, const Tensor& b,
                                                const Tensor& dst, const Conv2dParams& p, dt weights_dt,
                                                const dnnl::primitive_attr& attr, const char* what);
// x2 is [M, K], dst [M, N], w [N, K].
std::shared_ptr<PrimitiveEntry> make_inner_product_entry(const Tensor& x2, const Tensor& w, const Tensor& b,
                                                         const Tensor& dst, dt weights_dt,
                                                         const dnnl::primitive_attr& attr, const char* what);
// Operands as given; *is_ref (if not null) says whether oneDNN chose its reference kernel.
std::shared_ptr<PrimitiveEntry> make_matmul_entry(const Tensor& a, const Tensor& b, const Tensor& dst,
                                                  const char* what, bool* is_ref = nullptr);

// Runs a conv or inner-product entry: the f32 weights packed into its layout (once per storage
// version), the bias (w.size(0) values) if defined.
void run_weighted(const PrimitiveEntry& e, const dnnl::memory::desc& src_md, const Tensor& src, const Tensor& w,
                  const dnnl::memory::desc& w_user_md, const Tensor& b, const Tensor& dst);

}  // namespace dbrq::kernels
