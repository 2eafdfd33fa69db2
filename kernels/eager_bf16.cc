// conv2d, linear and matmul with bf16 arithmetic and f32 boundaries (kernels/bf16.h).
#include "kernels/bf16.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/op_shapes.h"
#include "kernels/cpu_features.h"
#include "kernels/dnnl_utils.h"
#include "kernels/eager.h"
#include "kernels/eager_prims.h"

namespace dbrq::kernels {
namespace {

std::atomic<bool>& bf16_disabled() {
  static std::atomic<bool> disabled{[] {
    const char* v = std::getenv("DBRQ_DISABLE_BF16");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }()};
  return disabled;
}

// A bf16 copy of an f32 tensor in the given layout (oneDNN's reorder: round to nearest even).
Tensor to_bf16(const Tensor& x, MemoryFormat format) {
  Tensor out = Tensor::empty(x.sizes(), DType::kBF16, format);
  if (out.numel() > 0) reorder_into(x, out);
  return out;
}

}  // namespace

bool cpu_has_bf16() { return cpu_features().bf16; }

bool bf16_available() { return cpu_has_bf16() && !bf16_disabled().load(std::memory_order_relaxed); }

void force_bf16_unavailable(bool on) { bf16_disabled().store(on, std::memory_order_relaxed); }

float round_to_bf16(float v) {
  if (std::isnan(v)) return v;
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;
  bits &= 0xffff0000u;
  float r;
  std::memcpy(&r, &bits, 4);
  return r;
}

Tensor conv2d_bf16(const Tensor& x, const Tensor& w_in, const Tensor& b, const Conv2dParams& p) {
  const ConvGeometry g = conv2d_geometry(x, w_in, b, p);
  check_float("conv2d", "input", x);
  check_float("conv2d", "weight", w_in);
  if (b.defined()) check_float("conv2d", "bias", b);
  Tensor dst = Tensor::empty({g.n, g.k, g.oh, g.ow}, DType::kF32, MemoryFormat::kChannelsLast);
  if (dst.numel() == 0) return dst;
  const Tensor src = to_bf16(x, MemoryFormat::kChannelsLast);
  const dnnl::memory::desc src_md = plain_desc(src.sizes(), DType::kBF16, tag::nhwc);
  const Tensor w = w_in.is_contiguous() ? w_in : copy(w_in, MemoryFormat::kContiguous, DType::kF32);

  PrimitiveKey key("conv2d_bf16");
  key.add(src).add(w.sizes()).add(static_cast<int64_t>(b.defined())).add(p.stride).add(p.padding).add(p.dilation);
  key.add(p.groups).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    return make_conv_entry(src_md, w, b, dst, p, dt::bf16, base_attr(), "creating a bf16 convolution");
  });
  // f32 weights -> the primitive's bf16 layout, once per (storage, version).
  run_weighted(*entry, src_md, src, w, conv_weights_user_desc(w, p.groups), b, dst);
  return dst;
}

Tensor linear_bf16(const Tensor& x, const Tensor& w_in, const Tensor& b) {
  const DimVector out_sizes = linear_output_sizes(x, w_in, b);
  check_float("linear", "input", x);
  check_float("linear", "weight", w_in);
  if (b.defined()) check_float("linear", "bias", b);
  const int64_t k = w_in.size(1), n = w_in.size(0);
  const int64_t m = linear_rows(x);
  Tensor dst = Tensor::empty({m, n}, DType::kF32);
  if (m == 0 || n == 0) return dst.raw_view(out_sizes);
  if (k == 0) return linear_bias_rows(m, n, b).raw_view(out_sizes);
  const Tensor x2 = to_bf16(x, MemoryFormat::kContiguous).raw_view({m, k});
  const Tensor w = w_in.is_contiguous() ? w_in : copy(w_in, MemoryFormat::kContiguous, DType::kF32);

  PrimitiveKey key("linear_bf16");
  key.add(x2).add(w.sizes()).add(static_cast<int64_t>(b.defined())).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    return make_inner_product_entry(x2, w, b, dst, dt::bf16, base_attr(), "creating a bf16 inner product");
  });
  run_weighted(*entry, desc_of(x2), x2, w, desc_of(w), b, dst);
  return dst.raw_view(out_sizes);
}

Tensor matmul_bf16(const Tensor& a_in, const Tensor& b_in) {
  check_defined("matmul", "input", a_in);
  check_defined("matmul", "other", b_in);
  const MatmulShapes s = matmul_shapes(a_in.sizes(), b_in.sizes());
  check_float("matmul", "input", a_in);
  check_float("matmul", "other", b_in);
  Tensor dst = Tensor::empty(s.out, DType::kF32);
  DimVector final_sizes = s.out;
  if (s.squeeze_n) final_sizes.pop_back();
  if (s.squeeze_m) final_sizes.erase(final_sizes.end() - (s.squeeze_n ? 1 : 2));
  if (dst.numel() == 0) return dst.raw_view(final_sizes);
  if (a_in.size(-1) == 0) {
    fill(dst, 0.0);
    return dst.raw_view(final_sizes);
  }
  // Contiguous bf16 copies of the rank-promoted operands (broadcast batch dims stay 1).
  const Tensor a = to_bf16(a_in, MemoryFormat::kContiguous).raw_view(s.a);
  const Tensor b = to_bf16(b_in, MemoryFormat::kContiguous).raw_view(s.b);
  PrimitiveKey key("matmul_bf16");
  key.add(a).add(b).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] { return make_matmul_entry(a, b, dst, "creating a bf16 matmul"); });
  execute(entry->prim, entry->scratchpad_bytes,
          {{DNNL_ARG_SRC, mem_of(a)}, {DNNL_ARG_WEIGHTS, mem_of(b)}, {DNNL_ARG_DST, mem_of(dst)}});
  return dst.raw_view(final_sizes);
}

}  // namespace dbrq::kernels
