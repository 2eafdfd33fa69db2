// Eager elementwise kernels: binary ops with broadcasting, tensor-scalar ops, activations.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/activation_math.h"
#include "kernels/dnnl_utils.h"
#include "kernels/eager.h"
#include "kernels/loops.h"
#include "kernels/simd.h"
#include "core/op_shapes.h"

namespace dbrq::kernels {
namespace {

constexpr int64_t kGrain = 1 << 15;

const char* binary_name(BinaryAlg alg) {
  switch (alg) {
    case BinaryAlg::kAdd:
      return "add";
    case BinaryAlg::kSub:
      return "sub";
    case BinaryAlg::kMul:
      return "mul";
    case BinaryAlg::kDiv:
      return "div";
  }
  return "?";
}

dnnl::algorithm dnnl_binary(BinaryAlg alg) {
  switch (alg) {
    case BinaryAlg::kAdd:
      return dnnl::algorithm::binary_add;
    case BinaryAlg::kSub:
      return dnnl::algorithm::binary_sub;
    case BinaryAlg::kMul:
      return dnnl::algorithm::binary_mul;
    case BinaryAlg::kDiv:
      return dnnl::algorithm::binary_div;
  }
  return dnnl::algorithm::binary_add;
}

inline float apply(BinaryAlg alg, float a, float b) {
  switch (alg) {
    case BinaryAlg::kAdd:
      return a + b;
    case BinaryAlg::kSub:
      return a - b;
    case BinaryAlg::kMul:
      return a * b;
    case BinaryAlg::kDiv:
      return a / b;
  }
  return 0.f;
}

template <typename Op>
void same_layout_loop(const float* a, const float* b, float* out, int64_t n, Op op) {
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) out[i] = op(a[i], b[i]);
  });
}

// dst = src0 OP src1 for three dense tensors with one layout: a plain loop, bit-identical to
// oneDNN's (one IEEE operation per element) without its per-call setup, which dominates for the
// small tensors of attention heads, biases and residuals.
bool run_binary_same_layout(BinaryAlg alg, const Tensor& src0, const Tensor& src1, const Tensor& dst) {
  if (src0.sizes() != src1.sizes() || src0.strides() != src1.strides() || src0.strides() != dst.strides() ||
      !src0.is_non_overlapping_and_dense()) {
    return false;
  }
  const float* a = src0.raw_data<float>();
  const float* b = src1.raw_data<float>();
  Tensor d = dst;  // shares dst's storage
  float* out = d.raw_mutable_data<float>();
  const int64_t n = src0.numel();
  switch (alg) {
    case BinaryAlg::kAdd:
      same_layout_loop(a, b, out, n, [](float x, float y) { return x + y; });
      break;
    case BinaryAlg::kSub:
      same_layout_loop(a, b, out, n, [](float x, float y) { return x - y; });
      break;
    case BinaryAlg::kMul:
      same_layout_loop(a, b, out, n, [](float x, float y) { return x * y; });
      break;
    case BinaryAlg::kDiv:
      same_layout_loop(a, b, out, n, [](float x, float y) { return x / y; });
      break;
  }
  return true;
}

// Runs dst = src0 OP src1 on oneDNN; src1 must broadcast to src0's sizes (same rank).
void run_binary(BinaryAlg alg, const Tensor& src0, const Tensor& src1, const Tensor& dst) {
  if (run_binary_same_layout(alg, src0, src1, dst)) return;
  PrimitiveKey key("binary_f32");
  key.add(static_cast<int64_t>(alg)).add(src0).add(src1).add(dst).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    try {
      dnnl::binary::desc d(dnnl_binary(alg), desc_of(src0), desc_of(src1), desc_of(dst));
      dnnl::binary::primitive_desc pd(d, base_attr(), cpu_engine());
      auto e = std::make_shared<PrimitiveEntry>();
      e->prim = dnnl::binary(pd);
      e->scratchpad_bytes = pd.scratchpad_desc().get_size();
      return e;
    } catch (const dnnl::error& e) {
      rethrow_dnnl("creating a binary primitive", e);
    }
  });
  execute(entry->prim, entry->scratchpad_bytes,
          {{DNNL_ARG_SRC_0, mem_of(src0)}, {DNNL_ARG_SRC_1, mem_of(src1)}, {DNNL_ARG_DST, mem_of(dst)}});
}

// `t` viewed with rank `rank` (leading size-1 dims added).
Tensor promote_rank(const Tensor& t, size_t rank) {
  if (t.dim() == static_cast<int64_t>(rank)) return t;
  std::vector<int64_t> sizes(rank - t.dim(), 1);
  std::vector<int64_t> strides(rank - t.dim(), t.dim() > 0 ? t.stride(0) * t.size(0) : 1);
  sizes.insert(sizes.end(), t.sizes().begin(), t.sizes().end());
  strides.insert(strides.end(), t.strides().begin(), t.strides().end());
  return t.raw_as_strided(sizes, strides, t.storage_offset());
}

Tensor dense(const Tensor& t) { return t.is_non_overlapping_and_dense() ? t : copy(t, MemoryFormat::kContiguous, t.dtype()); }

}  // namespace

std::vector<int64_t> broadcast_strides(const Tensor& t, IntArrayRef sizes) {
  std::vector<int64_t> st(sizes.size(), 0);
  const size_t lead = sizes.size() - t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) st[lead + d] = t.size(d) == 1 ? 0 : t.stride(d);
  return st;
}

Tensor binary(BinaryAlg alg, const Tensor& a_in, const Tensor& b_in) {
  const char* name = binary_name(alg);
  check_float(name, "input", a_in);
  check_float(name, "other", b_in);
  const DimVector out = broadcast_shapes(name, a_in.sizes(), b_in.sizes());
  Tensor a = promote_rank(dense(a_in), out.size()), b = promote_rank(dense(b_in), out.size());
  const bool commutative = alg == BinaryAlg::kAdd || alg == BinaryAlg::kMul;
  if (IntArrayRef(out) != a.sizes() && IntArrayRef(out) == b.sizes() && commutative) std::swap(a, b);
  if (IntArrayRef(out) != a.sizes()) {
    // oneDNN broadcasts only its second source: materialize the first at the output's sizes.
    Tensor full_a = Tensor::empty(out, DType::kF32, b.dim() == 4 && b.is_channels_last() && !b.is_contiguous()
                                                        ? MemoryFormat::kChannelsLast
                                                        : MemoryFormat::kContiguous);
    copy_into(full_a, a);
    a = full_a;
  }
  Tensor dst = Tensor::empty_like(a, DType::kF32);
  if (dst.numel() == 0) return dst.raw_as_strided(out, dst.strides(), 0);
  run_binary(alg, a, b, dst);
  return dst;
}

void binary_inplace(BinaryAlg alg, Tensor& a, const Tensor& b_in) {
  const char* name = binary_name(alg);
  check_float(name, "self", a);
  check_float(name, "other", b_in);
  const DimVector out = broadcast_shapes(name, a.sizes(), b_in.sizes());
  DBRQ_ENSURE(IntArrayRef(out) == a.sizes(), ShapeError, name, "_: result sizes ", shape_to_string(out),
              " differ from the in-place tensor's sizes ", a.shape_string());
  if (a.numel() == 0) return;
  Tensor b = promote_rank(dense(b_in), a.dim());
  if (!a.is_non_overlapping_and_dense()) {
    Tensor tmp = binary(alg, a, b);
    copy_into(a, tmp);
    return;
  }
  a.mutable_data_ptr();  // version bump
  run_binary(alg, a, b, a);
}

Tensor binary_scalar(BinaryAlg alg, const Tensor& x_in, double scalar, bool scalar_first) {
  check_float(binary_name(alg), "input", x_in);
  const Tensor x = dense(x_in);
  Tensor dst = Tensor::empty_like(x, DType::kF32);
  const float* src = x.raw_data<float>();
  float* out = dst.raw_mutable_data<float>();
  const float c = static_cast<float>(scalar);
  parallel_for(x.numel(), kGrain, [&](int64_t begin, int64_t end) {
    if (scalar_first) {
      for (int64_t i = begin; i < end; ++i) out[i] = apply(alg, c, src[i]);
    } else {
      for (int64_t i = begin; i < end; ++i) out[i] = apply(alg, src[i], c);
    }
  });
  return dst;
}

void binary_scalar_inplace(BinaryAlg alg, Tensor& a, double scalar) {
  check_float(binary_name(alg), "self", a);
  if (!a.is_non_overlapping_and_dense()) {
    Tensor tmp = binary_scalar(alg, a, scalar, false);
    copy_into(a, tmp);
    return;
  }
  float* p = a.raw_mutable_data<float>();
  const float c = static_cast<float>(scalar);
  parallel_for(a.numel(), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) p[i] = apply(alg, p[i], c);
  });
}

namespace {

// Eltwise algorithm and its (alpha, beta) for the eager primitive; false when the op runs as a
// loop over PyTorch's formula instead.
bool dnnl_eltwise(const Eltwise& e, dnnl::algorithm* out) {
  using A = dnnl::algorithm;
  switch (e.alg) {
    case Eltwise::Alg::kRelu:
      // relu and clamp (relu6, hardtanh) as PyTorch's: NaN passes (oneDNN's kernels turn it into 0
      // or the lower bound, hiding a broken input) and -0 stays -0 (simd::clamp_f32).
      if (e.alpha == 0.f) return false;
      *out = A::eltwise_relu;
      return true;
    case Eltwise::Alg::kClip:
      return false;
    case Eltwise::Alg::kLogistic:
      *out = A::eltwise_logistic;
      return true;
    case Eltwise::Alg::kTanh:
      *out = A::eltwise_tanh;
      return true;
    case Eltwise::Alg::kSwish:
      *out = A::eltwise_swish;
      return true;
    case Eltwise::Alg::kGeluErf:
      *out = A::eltwise_gelu_erf;
      return true;
    case Eltwise::Alg::kGeluTanh:
      *out = A::eltwise_gelu_tanh;
      return true;
    case Eltwise::Alg::kElu:
      *out = A::eltwise_elu;
      return true;
    case Eltwise::Alg::kMish:
      *out = A::eltwise_mish;
      return true;
    case Eltwise::Alg::kHardswish:
    case Eltwise::Alg::kHardsigmoid:
    case Eltwise::Alg::kSoftplus:
      return false;  // PyTorch's exact formulas (oneDNN 2.6 has no hardsigmoid, no softplus beta / threshold)
  }
  return false;
}

void run_eltwise(const Eltwise& e, const Tensor& src, const Tensor& dst) {
  dnnl::algorithm algo;
  if (!dnnl_eltwise(e, &algo)) {
    const float* in = src.raw_data<float>();
    float* out = static_cast<float*>(const_cast<void*>(dst.data_ptr()));
    parallel_for(src.numel(), kGrain, [&](int64_t begin, int64_t end) {
      if (e.alg == Eltwise::Alg::kRelu) {
        simd::clamp_f32(in + begin, out + begin, end - begin, 0.f, std::numeric_limits<float>::infinity());
      } else if (e.alg == Eltwise::Alg::kClip) {
        simd::clamp_f32(in + begin, out + begin, end - begin, e.alpha, e.beta);
      } else if (e.alg == Eltwise::Alg::kHardsigmoid) {
        for (int64_t i = begin; i < end; ++i) out[i] = math::hardsigmoid(in[i]);
      } else if (e.alg == Eltwise::Alg::kSoftplus) {
        for (int64_t i = begin; i < end; ++i) out[i] = math::softplus(in[i], e.alpha, e.beta);
      } else {
        for (int64_t i = begin; i < end; ++i) out[i] = math::hardswish(in[i]);
      }
    });
    return;
  }
  PrimitiveKey key("eltwise_f32");
  key.add(static_cast<int64_t>(algo)).add(e.alpha).add(e.beta).add(src).add(static_cast<int64_t>(get_num_threads()));
  auto entry = primitive_cache().get_or_create(key, [&] {
    try {
      dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, algo, desc_of(src), e.alpha, e.beta);
      dnnl::eltwise_forward::primitive_desc pd(d, base_attr(), cpu_engine());
      auto entry = std::make_shared<PrimitiveEntry>();
      entry->prim = dnnl::eltwise_forward(pd);
      entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
      return entry;
    } catch (const dnnl::error& err) {
      rethrow_dnnl("creating an eltwise primitive", err);
    }
  });
  execute(entry->prim, entry->scratchpad_bytes, {{DNNL_ARG_SRC, mem_of(src)}, {DNNL_ARG_DST, mem_of(dst)}});
}

}  // namespace

const char* eltwise_name(const Eltwise& e) {
  switch (e.alg) {
    case Eltwise::Alg::kRelu:
      return e.alpha == 0.f ? "relu" : "leaky_relu";
    case Eltwise::Alg::kClip:
      return "clip";
    case Eltwise::Alg::kLogistic:
      return "sigmoid";
    case Eltwise::Alg::kTanh:
      return "tanh";
    case Eltwise::Alg::kSwish:
      return "silu";
    case Eltwise::Alg::kGeluErf:
      return "gelu";
    case Eltwise::Alg::kGeluTanh:
      return "gelu_tanh";
    case Eltwise::Alg::kHardswish:
      return "hardswish";
    case Eltwise::Alg::kHardsigmoid:
      return "hardsigmoid";
    case Eltwise::Alg::kElu:
      return "elu";
    case Eltwise::Alg::kSoftplus:
      return "softplus";
    case Eltwise::Alg::kMish:
      return "mish";
  }
  return "?";
}

float eltwise_reference(const Eltwise& e, float x) {
  switch (e.alg) {
    case Eltwise::Alg::kRelu:
      return math::relu(x, e.alpha);
    case Eltwise::Alg::kClip:
      return math::clip(x, e.alpha, e.beta);
    case Eltwise::Alg::kLogistic:
      return math::sigmoid(x);
    case Eltwise::Alg::kTanh:
      return math::tanh(x);
    case Eltwise::Alg::kSwish:
      return e.alpha == 1.f ? math::silu(x) : x * math::sigmoid(e.alpha * x);
    case Eltwise::Alg::kGeluErf:
      return math::gelu_erf(x);
    case Eltwise::Alg::kGeluTanh:
      return math::gelu_tanh(x);
    case Eltwise::Alg::kHardswish:
      return math::hardswish(x);
    case Eltwise::Alg::kHardsigmoid:
      return math::hardsigmoid(x);
    case Eltwise::Alg::kElu:
      return math::elu(x, e.alpha);
    case Eltwise::Alg::kSoftplus:
      return math::softplus(x, e.alpha, e.beta);
    case Eltwise::Alg::kMish:
      return math::mish(x);
  }
  return x;
}

Tensor eltwise(const Eltwise& e, const Tensor& x_in) {
  check_float(eltwise_name(e), "input", x_in);
  const Tensor x = dense(x_in);
  Tensor dst = Tensor::empty_like(x, DType::kF32);
  if (x.numel() > 0) run_eltwise(e, x, dst);
  return dst;
}

void eltwise_inplace(const Eltwise& e, Tensor& x) {
  check_float(eltwise_name(e), "self", x);
  if (x.numel() == 0) return;
  if (!x.is_non_overlapping_and_dense()) {
    Tensor tmp = eltwise(e, x);
    copy_into(x, tmp);
    return;
  }
  x.mutable_data_ptr();  // version bump
  run_eltwise(e, x, x);
}

Tensor prelu(const Tensor& x_in, const Tensor& weight) {
  check_float("prelu", "input", x_in);
  check_float("prelu", "weight", weight);
  DBRQ_ENSURE(weight.dim() <= 1, ShapeError, "prelu: weight must be 1-D, got sizes ", weight.shape_string());
  const int64_t channels = x_in.dim() >= 2 ? x_in.size(1) : 1;
  DBRQ_ENSURE(weight.numel() == 1 || weight.numel() == channels, ShapeError, "prelu: weight has ", weight.numel(),
              " elements but the input has ", channels, " channels (dim 1 of ", x_in.shape_string(),
              "); it needs 1 or ", channels);
  const std::vector<float> w = weight.to_vector<float>();
  // Channels are found by index arithmetic: row-major or 4-D channels-last memory only (a dense
  // permuted view, such as [N, L, C].transpose(1, 2), is copied first).
  const Tensor x = x_in.dim() == 4 && x_in.is_channels_last() ? x_in : contiguous(x_in);
  Tensor dst = Tensor::empty_like(x, DType::kF32);
  const float* in = x.raw_data<float>();
  float* out = dst.raw_mutable_data<float>();
  // The channel of memory index i: innermost in channels-last memory, else (i / inner) % C.
  const bool one = w.size() == 1;
  const bool cl = x.dim() == 4 && !x.is_contiguous() && x.is_channels_last();
  int64_t inner = 1;
  for (int64_t d = 2; d < x.dim(); ++d) inner *= x.size(d);
  const int64_t c = channels;
  parallel_for(x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float a = one ? w[0] : w[static_cast<size_t>(cl ? i % c : (i / inner) % c)];
      out[i] = in[i] > 0.f ? in[i] : a * in[i];
    }
  });
  return dst;
}

}  // namespace dbrq::kernels
