// Int8 convolution, linear and matmul on oneDNN u8 x s8 primitives.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <list>

#include "absl/strings/str_format.h"
#include "kernels/dnnl_utils.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "kernels/loops.h"
#include "kernels/post_ops.h"
#include "kernels/simd.h"
#include "core/op_shapes.h"

namespace dbrq::kernels {

namespace {

// One channel of requant_scales (no allocation: QMatmul computes it per call).
void requant_scale(float src_scale, float weight_scale, float dst_scale, float* bias_scale, float* op_scale) {
  // PyTorch keeps scales as doubles and hands oneDNN float reciprocals (1.0 / s in double).
  const float src_r = static_cast<float>(1.0 / static_cast<double>(src_scale));
  const float dst_r = dst_scale > 0 ? static_cast<float>(1.0 / static_cast<double>(dst_scale)) : 1.f;
  const float w_r = static_cast<float>(1.0 / static_cast<double>(weight_scale));
  *bias_scale = src_r * w_r;
  *op_scale = dst_r / *bias_scale;
}

// dst[i] = src[i] - 128 as s8, in parallel above 64 KiB.
void shift_u8_to_s8(const uint8_t* src, int8_t* dst, int64_t n) {
  parallel_for(n, 1 << 16, [src, dst](int64_t lo, int64_t hi) { simd::shift_u8_to_s8(src + lo, dst + lo, hi - lo); });
}

// Static u8 x u8 -> u8 products this small run as plain loops: oneDNN's per-call cost (argument
// memories, zero-point compensation, kernel setup, several microseconds) dwarfs the arithmetic of
// e.g. one query row against a 100-entry key cache. Same integers: acc = sum (a - a_zp)(b - b_zp)
// in s32, then u8 = round_half_even(clamp(acc * op_scale)) + dst_zp as every u8 output of
// kernels/simd.h.
constexpr int64_t kDirectMatmulMaxMacs = int64_t{1} << 17;
constexpr int64_t kDirectMatmulMaxK = 4096;  // |acc| <= K * 255 * 255 stays well inside s32

// a: [.., M, K] contiguous; b: [.., K, N] with unit stride along N or along K; batch dims of size
// 1 broadcast. All three views have equal rank. dst: u8 codes (requantized by op_scale and
// dst_zp), or f32 (the accumulators times op_scale: dynamic quantization).
void direct_qmatmul(const Tensor& a, const Tensor& b, Tensor& dst, int32_t a_zp, int32_t b_zp, float op_scale,
                    int32_t dst_zp) {
  const int64_t rank = dst.dim(), m = dst.size(-2), n = dst.size(-1), k = a.size(-1);
  const int64_t b_sk = b.stride(-2), b_sn = b.stride(-1);
  const uint8_t* pa = a.raw_data<uint8_t>();
  const uint8_t* pb = b.raw_data<uint8_t>();
  const bool real = dst.dtype() == DType::kF32;
  uint8_t* pd = real ? nullptr : dst.raw_mutable_data<uint8_t>();
  float* pf = real ? dst.raw_mutable_data<float>() : nullptr;
  int64_t batches = 1;
  for (int64_t d = 0; d < rank - 2; ++d) batches *= dst.size(d);
  // One output row per item. Small products (every attention product of a decoder step) run on
  // the calling thread; the large ones that reach here where oneDNN's pairs saturate are split.
  const int64_t rows = batches * m, macs = rows * n * k;
  const int64_t grain = macs <= kDirectMatmulMaxMacs ? rows : std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, n * k));
  parallel_for(rows, grain, [&](int64_t lo, int64_t hi) {
    // Per-thread scratch.
    thread_local std::vector<int32_t> acc;
    thread_local std::vector<float> accf;
    thread_local std::vector<int16_t> arow;
    acc.resize(static_cast<size_t>(n));
    accf.resize(static_cast<size_t>(n));
    arow.resize(static_cast<size_t>(k));
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t bi = r / m, i = r % m;
      int64_t a_off = 0, b_off = 0;
      for (int64_t d = rank - 3, rest = bi; d >= 0; --d) {
        const int64_t idx = rest % dst.size(d);
        rest /= dst.size(d);
        if (a.size(d) != 1) a_off += idx * a.stride(d);
        if (b.size(d) != 1) b_off += idx * b.stride(d);
      }
      const uint8_t* bb = pb + b_off;
      const uint8_t* ar = pa + a_off + i * k;
      for (int64_t l = 0; l < k; ++l) arow[l] = static_cast<int16_t>(ar[l] - a_zp);
      int32_t* c = acc.data();
      if (b_sn == 1) {  // rows of b along N: c[j] += a[l] * b[l][j]
        simd::rowvec_s16_u8(arow.data(), bb, k, b_sk, n, b_zp, c);
      } else {  // columns of b contiguous along K (b = keys.transpose(-1, -2)): one dot per output
        for (int64_t j = 0; j < n; ++j) c[j] = simd::dot_s16_u8(arow.data(), bb + j * b_sn, k, b_zp);
      }
      if (real) {
        float* row = pf + r * n;
        for (int64_t j = 0; j < n; ++j) row[j] = static_cast<float>(c[j]) * op_scale;
        continue;
      }
      for (int64_t j = 0; j < n; ++j) accf[j] = static_cast<float>(c[j]);
      simd::quantize_u8(accf.data(), pd + r * n, n, op_scale, dst_zp);
    }
  });
}

}  // namespace

RequantScales requant_scales(float src_scale, const std::vector<float>& weight_scales, float dst_scale) {
  RequantScales r;
  r.bias_scales.resize(weight_scales.size());
  r.op_scales.resize(weight_scales.size());
  for (size_t i = 0; i < weight_scales.size(); ++i) {
    requant_scale(src_scale, weight_scales[i], dst_scale, &r.bias_scales[i], &r.op_scales[i]);
  }
  return r;
}

// A created int8 primitive and the constant memories it runs with.
struct Int8Entry {
  PrimitiveKey key{"int8"};
  dnnl::primitive prim;
  size_t scratchpad_bytes = 0;
  dnnl::memory::desc src_md, wei_md, dst_md;
  dnnl::memory::desc bias_md;  // a linear's per-call f32 bias (zero: none)
  dnnl::memory weights;  // prepacked
  dnnl::memory bias;     // accumulator-unit f32 bias (or empty)
};

// Primitives of one kernel object, by input shape: the most recent one is found without a lock;
// the others in a small LRU list. Prepacked weights are shared between entries with equal layouts.
class PrimitiveCacheImpl {
 public:
  // A packed recurrence runs its hidden-state product at every running count of its batch (one
  // shape each, every call): the cache holds them all for batches of up to 256 sequences.
  static constexpr size_t kCapacity = 256;

  // `create` runs on a miss only (a template: a std::function would allocate per call).
  template <typename Create>
  std::shared_ptr<const Int8Entry> get(const PrimitiveKey& key, Create&& create) {
    std::shared_ptr<const Int8Entry> last = std::atomic_load(&last_);
    if (last != nullptr && last->key == key) return last;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if ((*it)->key == key) {
        entries_.splice(entries_.begin(), entries_, it);
        std::atomic_store(&last_, std::shared_ptr<const Int8Entry>(entries_.front()));
        return entries_.front();
      }
    }
    apply_thread_setting();  // oneDNN sizes its work split by the creating thread's team size
    std::shared_ptr<Int8Entry> e = create();
    e->key = key;
    entries_.push_front(e);
    if (entries_.size() > kCapacity) entries_.pop_back();
    std::atomic_store(&last_, std::shared_ptr<const Int8Entry>(e));
    return e;
  }

  // Weights reordered into `want`, reorder done once per distinct layout.
  dnnl::memory packed(const Tensor& qweight, const dnnl::memory::desc& user, const dnnl::memory::desc& want) {
    for (auto& [d, m] : packed_) {
      if (d == want) return m;
    }
    dnnl::memory m(want, cpu_engine());
    dnnl::memory src = mem_of(user, qweight);
    apply_thread_setting();
    dnnl::reorder(src, m).execute(thread_stream(), src, m);
    thread_stream().wait();
    packed_.emplace_back(want, m);
    return m;
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.size();
  }

 private:
  std::mutex mu_;  // guards entries_ and packed_ (packed_ is only touched under it, from create())
  std::list<std::shared_ptr<Int8Entry>> entries_;
  std::vector<std::pair<dnnl::memory::desc, dnnl::memory>> packed_;
  std::shared_ptr<const Int8Entry> last_;
};

namespace {

std::vector<float> scales_of(const QuantParams& q, int64_t n) {
  if (q.is_per_channel()) return q.scales;
  return std::vector<float>(static_cast<size_t>(n), q.scale());
}

Tensor quantize_weight(const Tensor& w, const QuantParamsPtr& qp) {
  DBRQ_ENSURE(qp != nullptr, ValueError, "int8 kernel: weight quantization parameters are missing");
  for (int32_t zp : qp->zero_points) {
    DBRQ_ENSURE(zp == 0, ValueError, "int8 kernel: oneDNN needs symmetric weights (zero point 0), got ", zp);
  }
  return quantize(contiguous(w), qp, DType::kS8);
}

Tensor accumulator_bias(const Tensor& bias, const std::vector<float>& bias_scales) {
  if (!bias.defined()) return Tensor();
  const Tensor b = contiguous(bias);
  Tensor out = Tensor::empty({b.numel()}, DType::kF32);
  const float* src = b.raw_data<float>();
  float* dst = out.raw_mutable_data<float>();
  for (int64_t i = 0; i < b.numel(); ++i) dst[i] = src[i] * bias_scales[static_cast<size_t>(i)];
  return out;
}

void check_u8(const char* op, const Tensor& x) {
  DBRQ_ENSURE(x.defined() && x.dtype() == DType::kU8 && x.is_quantized() && !x.qparams()->is_per_channel(),
              DTypeError, op, ": int8 input must be a per-tensor quantized u8 tensor, got ",
              x.defined() ? dtype_name(x.dtype()) : "undefined");
}

bool needs_real_units(const PostOps& post) {
  for (const Eltwise& p : post) {
    if (!(p.alg == Eltwise::Alg::kRelu && p.alpha == 0.f)) return true;
  }
  return false;
}

// Post-ops after oneDNN's output scaling. In "real units" mode the scale produced real values and
// the last eltwise carries the requantizing 1/out scale.
dnnl::post_ops make_int8_post_ops(const PostOps& post, bool real_units, float dst_r) {
  dnnl::post_ops ops;
  for (size_t i = 0; i < post.size(); ++i) {
    const float scale = (real_units && i + 1 == post.size()) ? dst_r : 1.f;
    ops.append_eltwise(scale, eltwise_algorithm(post[i]), post[i].alpha, post[i].beta);
  }
  return ops;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Saturating pairs (no VNNI)

bool int8_pairs_saturate() {
  static const bool saturate = [] {
    const auto bits = [](dnnl::cpu_isa i) { return static_cast<unsigned>(i); };
    const unsigned isa = bits(dnnl::get_effective_cpu_isa());
    const unsigned vnni = (bits(dnnl::cpu_isa::avx512_core_vnni) & ~bits(dnnl::cpu_isa::avx512_core)) |
                          (bits(dnnl::cpu_isa::avx2_vnni) & ~bits(dnnl::cpu_isa::avx2));
    return (isa & vnni) == 0;
  }();
  return saturate;
}

QuantParamsPtr weight_qparams_for_isa(const QuantParamsPtr& q) {
  if (q == nullptr || !int8_pairs_saturate()) return q;
  std::vector<float> scales = q->scales;
  for (float& s : scales) s *= 2.f;
  return q->is_per_channel() ? QuantParams::per_channel(std::move(scales), q->zero_points, q->axis)
                             : QuantParams::per_tensor(scales[0], q->zero_points[0]);
}

// ---------------------------------------------------------------------------------------------
// QConv2d

QConv2d::QConv2d(QConvOptions o) : o_(std::move(o)), cache_(std::make_unique<PrimitiveCacheImpl>()) {
  DBRQ_ENSURE(o_.src_qparams && o_.dst_qparams, ValueError, "QConv2d: source and destination parameters are required");
  check_float("quantized conv2d", "weight", o_.weight);
  o_.weight_qparams = weight_qparams_for_isa(o_.weight_qparams);
  qweight_ = quantize_weight(o_.weight, o_.weight_qparams);
  const int64_t k = o_.weight.size(0);
  const bool real = needs_real_units(o_.post);
  DBRQ_ENSURE(!(real && o_.sum_qparams), ValueError, "QConv2d: a residual add with a non-relu activation is not fused");
  RequantScales r = requant_scales(o_.src_qparams->scale(), scales_of(*o_.weight_qparams, k),
                                   real ? 0.f : o_.dst_qparams->scale());
  op_scales_ = std::move(r.op_scales);
  bias_acc_ = accumulator_bias(o_.bias, r.bias_scales);
}

QConv2d::~QConv2d() = default;

std::string QConv2d::describe() const {
  std::string s = absl::StrFormat("int8 conv2d %s", o_.weight.shape_string());
  for (const Eltwise& p : o_.post) absl::StrAppend(&s, "+", eltwise_name(p));
  if (o_.sum_qparams) absl::StrAppend(&s, " +residual(sum)");
  return s;
}

Tensor QConv2d::empty_output(const Tensor& x) const {
  const ConvGeometry g = conv2d_geometry(x, o_.weight, o_.bias, o_.params);
  return Tensor::empty({g.n, g.k, g.oh, g.ow}, DType::kU8, MemoryFormat::kChannelsLast).with_qparams(o_.dst_qparams);
}

Tensor QConv2d::run(const Tensor& x_in, const Tensor* residual, const Tensor* out) const {
  check_u8("quantized conv2d", x_in);
  const ConvGeometry g = conv2d_geometry(x_in, o_.weight, o_.bias, o_.params);
  const Tensor x = x_in.is_channels_last() ? x_in : copy(x_in, MemoryFormat::kChannelsLast, DType::kU8);
  Tensor dst = out != nullptr ? *out : empty_output(x);
  DBRQ_CHECK(dst.is_channels_last() && dst.dtype() == DType::kU8, "conv output buffer must be u8 channels-last");
  if (dst.numel() == 0) return dst;
  if (o_.sum_qparams != nullptr) {
    DBRQ_ENSURE(residual != nullptr && residual->sizes() == dst.sizes(), ShapeError,
                "quantized conv2d + add: residual sizes ", residual ? residual->shape_string() : "none",
                " differ from the conv output sizes ", dst.shape_string());
    copy_into(dst, *residual);  // the sum post-op accumulates onto what dst holds
  }
  const int32_t src_zp = x.q_zero_point();
  DBRQ_ENSURE(x.q_scale() == o_.src_qparams->scale() && src_zp == o_.src_qparams->zero_point(), ValueError,
              "quantized conv2d: input parameters (", x.qparams()->to_string(), ") differ from the converted ones (",
              o_.src_qparams->to_string(), ")");

  PrimitiveKey key("qconv2d");
  key.add(x.sizes()).add(static_cast<int64_t>(get_num_threads()));
  auto entry = cache_->get(key, [&] {
    try {
      const bool grouped = g.groups > 1;
      dnnl::memory::dims wdims = grouped ? dnnl::memory::dims{g.groups, g.k / g.groups, o_.weight.size(1), g.r, g.s}
                                         : dnnl::memory::dims{g.k, o_.weight.size(1), g.r, g.s};
      auto src_md = plain_desc(x.sizes(), DType::kU8, tag::nhwc);
      auto dst_md = plain_desc(dst.sizes(), DType::kU8, tag::nhwc);
      dnnl::memory::desc w_md(wdims, dt::s8, tag::any);
      dnnl::memory::desc b_md = bias_acc_.defined() ? plain_desc({g.k}, DType::kF32, tag::x) : dnnl::memory::desc();
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
                                        src_md, w_md, b_md, dst_md, {o_.params.stride[0], o_.params.stride[1]},
                                        {o_.params.dilation[0] - 1, o_.params.dilation[1] - 1},
                                        {o_.params.padding[0], o_.params.padding[1]},
                                        {o_.params.padding[0], o_.params.padding[1]});
      dnnl::primitive_attr attr = base_attr();
      attr.set_output_scales(op_scales_.size() > 1 || o_.weight_qparams->is_per_channel() ? 1 << 1 : 0, op_scales_);
      if (src_zp != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {src_zp});
      if (o_.dst_qparams->zero_point() != 0) attr.set_zero_points(DNNL_ARG_DST, 0, {o_.dst_qparams->zero_point()});
      const bool real = needs_real_units(o_.post);
      const float dst_r = static_cast<float>(1.0 / static_cast<double>(o_.dst_qparams->scale()));
      dnnl::post_ops ops;
      if (o_.sum_qparams != nullptr) {
        // ideep: sum_scale = (1/out) / (1/residual).
        const float res_r = static_cast<float>(1.0 / static_cast<double>(o_.sum_qparams->scale()));
        ops.append_sum(dst_r / res_r, o_.sum_qparams->zero_point(), dt::u8);
      }
      dnnl::post_ops eltwise = make_int8_post_ops(o_.post, real, dst_r);
      for (int i = 0; i < eltwise.len(); ++i) {
        dnnl::algorithm alg;
        float scale, alpha, beta;
        eltwise.get_params_eltwise(i, scale, alg, alpha, beta);
        ops.append_eltwise(scale, alg, alpha, beta);
      }
      attr.set_post_ops(ops);
      dnnl::convolution_forward::primitive_desc pd(d, attr, cpu_engine());
      auto e = std::make_shared<Int8Entry>();
      e->prim = dnnl::convolution_forward(pd);
      e->scratchpad_bytes = pd.scratchpad_desc().get_size();
      e->src_md = src_md;
      e->dst_md = dst_md;
      e->wei_md = pd.weights_desc();
      dnnl::memory::desc user_w = grouped ? dnnl::memory::desc(wdims, dt::s8, tag::goihw)
                                          : dnnl::memory::desc(wdims, dt::s8, tag::oihw);
      e->weights = cache_->packed(qweight_, user_w, e->wei_md);
      if (bias_acc_.defined()) e->bias = mem_of(plain_desc({g.k}, DType::kF32, tag::x), bias_acc_);
      return e;
    } catch (const dnnl::error& err) {
      rethrow_dnnl("creating an int8 convolution", err);
    }
  });
  ExecArgs args = {{DNNL_ARG_SRC, reused_mem(entry->src_md, DNNL_ARG_SRC, x)},
                   {DNNL_ARG_WEIGHTS, entry->weights},
                   {DNNL_ARG_DST, reused_mem(entry->dst_md, DNNL_ARG_DST, dst)}};
  if (bias_acc_.defined()) args.emplace(DNNL_ARG_BIAS, entry->bias);
  execute(entry->prim, entry->scratchpad_bytes, std::move(args));
  return dst;
}

// ---------------------------------------------------------------------------------------------
// QLinear

QLinear::QLinear(QLinearOptions o) : o_(std::move(o)), cache_(std::make_unique<PrimitiveCacheImpl>()) {
  check_float("quantized linear", "weight", o_.weight);
  DBRQ_ENSURE(o_.weight.dim() == 2, ShapeError, "quantized linear: weight must be 2-D, got ", o_.weight.shape_string());
  o_.weight_qparams = weight_qparams_for_isa(o_.weight_qparams);
  qweight_ = quantize_weight(o_.weight, o_.weight_qparams);
  if (!o_.dynamic) {
    // No destination parameters: f32 output (real units), for a linear only fp32 ops read.
    DBRQ_ENSURE(o_.src_qparams != nullptr, ValueError, "QLinear: static quantization needs source parameters");
    const bool real = needs_real_units(o_.post) || o_.dst_qparams == nullptr;
    RequantScales r = requant_scales(o_.src_qparams->scale(), scales_of(*o_.weight_qparams, o_.weight.size(0)),
                                     real ? 0.f : o_.dst_qparams->scale());
    op_scales_ = std::move(r.op_scales);
    bias_acc_ = accumulator_bias(o_.bias, r.bias_scales);
  } else {
    for (float w : scales_of(*o_.weight_qparams, o_.weight.size(0))) {
      weight_reciprocals_.push_back(static_cast<float>(1.0 / static_cast<double>(w)));
    }
  }
}

QLinear::~QLinear() = default;

size_t QLinear::num_primitives() const { return cache_->size(); }

std::string QLinear::describe() const {
  std::string s = absl::StrFormat("%s linear %s", o_.dynamic ? "dynamic int8" : "int8", o_.weight.shape_string());
  for (const Eltwise& p : o_.post) absl::StrAppend(&s, "+", eltwise_name(p));
  return s;
}

namespace {

// PyTorch's dynamic quantization parameters (u8, full range, zero in range).
QuantParamsPtr dynamic_qparams(const Tensor& x) {
  const float* p = x.raw_data<float>();
  const int64_t n = x.numel();
  float mn = 0.f, mx = 0.f;  // the range always includes 0; non-finite values are skipped
  simd::minmax_finite(p, n, &mn, &mx);  // AVX-512 chosen at run time (the baseline build's SSE loop was slower)
  const double scale = std::max((static_cast<double>(mx) - mn) / 255.0, 1e-8);
  const double zp_from_min = 0.0 - mn / scale;
  const int32_t zp = static_cast<int32_t>(std::min(std::max(std::nearbyint(zp_from_min), 0.0), 255.0));
  return QuantParams::per_tensor(static_cast<float>(scale), zp);
}

}  // namespace

Tensor QLinear::empty_output(const Tensor& x) const {
  DBRQ_CHECK(false, "quantized linear fuses no residual add");
  return Tensor();
}

Tensor QLinear::run(const Tensor& x, const Tensor* residual, const Tensor* out) const {
  DBRQ_CHECK(residual == nullptr && out == nullptr, "quantized linear fuses no residual add");
  check_defined("quantized linear", "input", x);
  if (!o_.dynamic) {
    check_u8("quantized linear", x);
    if (o_.dst_qparams == nullptr) {
      // f32 output: the runtime-scale primitive of the dynamic path, with the converted
      // parameters (which the input must carry).
      DBRQ_ENSURE(x.q_scale() == o_.src_qparams->scale() && x.q_zero_point() == o_.src_qparams->zero_point(),
                  ValueError, "quantized linear: input parameters (", x.qparams()->to_string(),
                  ") differ from the converted ones (", o_.src_qparams->to_string(), ")");
    }
    return run_static(x, *x.qparams(), op_scales_, bias_acc_, o_.dst_qparams.get());
  }
  // Dynamic: an int8 input is used as it comes; an f32 one is quantized from its own range.
  Tensor q = x;
  if (!x.is_quantized()) {
    check_float("dynamic quantized linear", "input", x);
    const Tensor xc = contiguous(x);
    q = quantize(xc, dynamic_qparams(xc), DType::kU8);
  }
  check_u8("dynamic quantized linear", q);
  // This call's output scales and accumulator-unit bias, in per-thread buffers (a dynamic call
  // allocates only its activations). They go to oneDNN as runtime arguments, with the runtime
  // source zero point: one primitive per shape serves every call.
  // The values requant_scale gives (dst_scale 0: real-valued output), with the weight scales'
  // reciprocals computed once (three double divisions per channel and call cost more than the
  // product itself for a recurrence's [1, H] step).
  const int64_t n = o_.weight.size(0);
  thread_local std::vector<float> op_scales, bias_scales;
  thread_local Tensor bias;
  op_scales.resize(static_cast<size_t>(n));
  bias_scales.resize(static_cast<size_t>(n));
  const float src_r = static_cast<float>(1.0 / static_cast<double>(q.q_scale()));
  {
    const float* w_r = weight_reciprocals_.data();
    float* bias_s = bias_scales.data();
    float* op_s = op_scales.data();
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) {
      bias_s[c] = src_r * w_r[c];
      op_s[c] = 1.f / bias_s[c];
    }
  }
  if (o_.bias.defined()) {
    if (!bias.defined() || bias.numel() < n) bias = Tensor::empty({n}, DType::kF32);
    const Tensor b = contiguous(o_.bias);
    const float* src = b.raw_data<float>();
    const float* bias_s = bias_scales.data();
    float* dst = bias.raw_mutable_data<float>();
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * bias_s[i];
  }
  return run_static(q, *q.qparams(), op_scales, o_.bias.defined() ? bias : Tensor(), nullptr);
}

Tensor QLinear::run_static(const Tensor& x_in, const QuantParams& src, const std::vector<float>& op_scales,
                           const Tensor& bias, const QuantParams* dstq) const {
  const DimVector out_sizes = linear_output_sizes(x_in, o_.weight, o_.bias);
  const int64_t k = o_.weight.size(1), n = o_.weight.size(0);
  const int64_t m = k == 0 ? 0 : x_in.numel() / k;
  Tensor x = x_in.raw_view({m, k});
  if (!x.defined() || x.stride(1) != 1 || x.stride(0) != k) x = copy(x_in, MemoryFormat::kContiguous, DType::kU8).raw_view({m, k});
  const DType out_dt = dstq != nullptr ? DType::kU8 : DType::kF32;
  Tensor dst = Tensor::empty({m, n}, out_dt);
  if (dstq != nullptr) dst = dst.with_qparams(o_.dst_qparams);
  if (m == 0 || n == 0) return dst.raw_view(out_sizes);
  if (dstq != nullptr) {
    DBRQ_ENSURE(src.scale() == o_.src_qparams->scale() && src.zero_point() == o_.src_qparams->zero_point(), ValueError,
                "quantized linear: input parameters (", src.to_string(), ") differ from the converted ones (",
                o_.src_qparams->to_string(), ")");
  }
  // Dynamic calls take their scales and source zero point as runtime arguments. A static linear
  // with f32 output (no destination parameters) keeps them fixed, as the u8 one does: oneDNN 2.6
  // has no AMX / brgemm int8 matmul for runtime scales or zero points and fell back to gemm:jit
  // (the BERT transformer recipe, whose 24 linears have f32 outputs, took 12.7 ms on AMX where the
  // default int8 took 7.3; 6.3-6.9 ms since).
  const bool dynamic = o_.dynamic;
  PrimitiveKey key("qlinear");
  key.add(m).add(static_cast<int64_t>(get_num_threads()));
  auto entry = cache_->get(key, [&] {
    try {
      auto src_md = plain_desc({m, k}, DType::kU8, tag::ab);
      auto dst_md = plain_desc({m, n}, out_dt, tag::ab);
      dnnl::memory::desc w_md({k, n}, dt::s8, tag::any);
      dnnl::memory::desc b_md = o_.bias.defined() ? plain_desc({1, n}, DType::kF32, tag::ab) : dnnl::memory::desc();
      dnnl::primitive_attr attr = base_attr();
      // Dynamic calls change the scales and the source zero point every time: runtime values
      // serve them all (a zero point baked in made one primitive per zero point, and the
      // per-step inputs of a recurrence have dozens).
      if (dynamic) {
        attr.set_output_scales(1 << 1, {DNNL_RUNTIME_F32_VAL});
        attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
      } else {
        // Per-tensor weights: one scale for mask 0, as oneDNN documents (op_scales holds one per
        // output channel, all equal).
        if (o_.weight_qparams->is_per_channel()) {
          attr.set_output_scales(1 << 1, op_scales);
        } else {
          attr.set_output_scales(0, {op_scales.at(0)});
        }
        if (src.zero_point() != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {src.zero_point()});
      }
      if (dstq != nullptr && dstq->zero_point() != 0) attr.set_zero_points(DNNL_ARG_DST, 0, {dstq->zero_point()});
      const bool real = needs_real_units(o_.post);
      const float dst_r = dstq != nullptr ? static_cast<float>(1.0 / static_cast<double>(dstq->scale())) : 1.f;
      attr.set_post_ops(make_int8_post_ops(o_.post, real && dstq != nullptr, dst_r));
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, w_md, b_md, dst_md), attr, cpu_engine());
      auto e = std::make_shared<Int8Entry>();
      e->prim = dnnl::matmul(pd);
      e->scratchpad_bytes = pd.scratchpad_desc().get_size();
      e->src_md = src_md;
      e->dst_md = dst_md;
      e->bias_md = b_md;
      e->wei_md = pd.weights_desc();
      // User weights [N, K] read as the [K, N] operand: strides {1, K}.
      dnnl::memory::desc user_w({k, n}, dt::s8, dnnl::memory::dims{1, k});
      e->weights = cache_->packed(qweight_, user_w, e->wei_md);
      return e;
    } catch (const dnnl::error& err) {
      rethrow_dnnl("creating an int8 matmul for linear", err);
    }
  });
  ExecArgs args = {{DNNL_ARG_SRC, reused_mem(entry->src_md, DNNL_ARG_SRC, x)},
                   {DNNL_ARG_WEIGHTS, entry->weights},
                   {DNNL_ARG_DST, reused_mem(entry->dst_md, DNNL_ARG_DST, dst)}};
  if (bias.defined()) {
    args.emplace(DNNL_ARG_BIAS, entry->bias_md.is_zero() ? mem_of(plain_desc({1, n}, DType::kF32, tag::ab), bias)
                                                          : reused_mem(entry->bias_md, DNNL_ARG_BIAS, bias));
  }
  int32_t src_zp = src.zero_point();
  if (dynamic) {
    DBRQ_CHECK(static_cast<int64_t>(op_scales.size()) == n, "dynamic linear: one output scale per channel");
    // oneDNN only reads them (the C++ API takes a non-const pointer).
    args.emplace(DNNL_ARG_ATTR_OUTPUT_SCALES, dnnl::memory(plain_desc({n}, DType::kF32, tag::x), cpu_engine(),
                                                           const_cast<float*>(op_scales.data())));
    args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC,
                 dnnl::memory(plain_desc({1}, DType::kS32, tag::x), cpu_engine(), &src_zp));
  }
  execute(entry->prim, entry->scratchpad_bytes, std::move(args));
  return dst.raw_view(out_sizes);
}

// ---------------------------------------------------------------------------------------------
// QMatmul

QMatmul::QMatmul(QuantParamsPtr a, QuantParamsPtr b, QuantParamsPtr dst, bool dynamic)
    : a_(std::move(a)), b_(std::move(b)), dst_(std::move(dst)), dynamic_(dynamic) {
  DBRQ_ENSURE(dynamic_ || (a_ && b_ && dst_), ValueError, "QMatmul: static quantization needs all parameters");
}

QMatmul::~QMatmul() = default;


uint64_t primitives_created() { return primitive_cache().misses(); }

std::string QMatmul::describe() const { return dynamic_ ? "dynamic int8 matmul" : "int8 matmul (u8 x s8)"; }

Tensor QMatmul::run(const Tensor& a_in, const Tensor& b_in) const {
  check_defined("quantized matmul", "input", a_in);
  check_defined("quantized matmul", "other", b_in);
  Tensor a = a_in, b = b_in;
  if (dynamic_) {
    if (!a.is_quantized()) a = quantize(contiguous(a), dynamic_qparams(contiguous(a)), DType::kU8);
    if (!b.is_quantized()) b = quantize(contiguous(b), dynamic_qparams(contiguous(b)), DType::kU8);
  }
  check_u8("quantized matmul", a);
  check_u8("quantized matmul", b);
  const MatmulShapes s = matmul_shapes(a.sizes(), b.sizes());
  Tensor av = a.raw_view(s.a);
  if (!av.defined()) av = copy(a, MemoryFormat::kContiguous, DType::kU8).raw_view(s.a);
  if (!av.is_contiguous()) av = copy(av, MemoryFormat::kContiguous, DType::kU8);
  // Where oneDNN's pairs saturate (int8_pairs_saturate: the shifted s8 operand spans the full
  // range), every size takes the direct loop, dynamic calls too, which sums in 32 bits: exact up
  // to K = 32768 (32768 * 255 * 255 < 2^31).
  const bool saturate = int8_pairs_saturate();
  if (!dynamic_ || saturate) {
    Tensor bv = b.raw_view(s.b);
    if (!bv.defined()) bv = copy(b, MemoryFormat::kContiguous, DType::kU8).raw_view(s.b);
    int64_t macs = 1;
    for (int64_t d : s.out) macs *= d;
    macs *= av.size(-1);
    if ((macs <= kDirectMatmulMaxMacs || saturate) && av.size(-1) <= (saturate ? 32768 : kDirectMatmulMaxK)) {
      if (bv.stride(-1) != 1 && bv.stride(-2) != 1) bv = copy(bv, MemoryFormat::kContiguous, DType::kU8);
      Tensor dst = dynamic_ ? Tensor::empty(s.out, DType::kF32) : Tensor::empty(s.out, DType::kU8).with_qparams(dst_);
      DimVector final_sizes = s.out;
      if (s.squeeze_n) final_sizes.pop_back();
      if (s.squeeze_m) final_sizes.erase(final_sizes.end() - (s.squeeze_n ? 1 : 2));
      if (dst.numel() == 0) return dst.raw_view(final_sizes);
      float bias_scale, op_scale;
      requant_scale(a.q_scale(), b.q_scale(), dynamic_ ? 0.f : dst_->scale(), &bias_scale, &op_scale);
      direct_qmatmul(av, bv, dst, a.q_zero_point(), b.q_zero_point(), op_scale, dynamic_ ? 0 : dst_->zero_point());
      return dst.raw_view(final_sizes);
    }
  }
  // Beyond the direct loop's exact range where pairs saturate: f32 on the dequantized codes
  // (exact products, f32 sums) rather than oneDNN's saturating ones.
  if (saturate) {
    const Tensor out = matmul(dequantize(a), dequantize(b));
    return dynamic_ ? out : quantize_to(out, dst_, DType::kU8, MemoryFormat::kContiguous);
  }
  // The second operand as s8: q - 128 with zero point - 128 (exact). A dense operand keeps its
  // layout (k.transpose(-1, -2) in attention is shifted in place order, no transposing copy) and
  // is shifted as one flat run of bytes; anything else is made contiguous first.
  Tensor bv = b.raw_view(s.b);
  if (!bv.defined()) bv = copy(b, MemoryFormat::kContiguous, DType::kU8).raw_view(s.b);
  if (!bv.is_non_overlapping_and_dense()) bv = copy(bv, MemoryFormat::kContiguous, DType::kU8);
  Tensor b8 = Tensor::empty_like(bv, DType::kS8);
  if (b8.strides() != bv.strides()) {  // empty_like chose another layout: shift into a contiguous copy
    bv = copy(bv, MemoryFormat::kContiguous, DType::kU8);
    b8 = Tensor::empty(s.b, DType::kS8);
  }
  shift_u8_to_s8(bv.raw_data<uint8_t>(), b8.raw_mutable_data<int8_t>(), b8.numel());
  const int32_t a_zp = a.q_zero_point(), b_zp = b.q_zero_point() - 128;
  const DType out_dt = dynamic_ ? DType::kF32 : DType::kU8;
  Tensor dst = Tensor::empty(s.out, out_dt);
  if (!dynamic_) dst = dst.with_qparams(dst_);
  DimVector final_sizes = s.out;
  if (s.squeeze_n) final_sizes.pop_back();
  if (s.squeeze_m) final_sizes.erase(final_sizes.end() - (s.squeeze_n ? 1 : 2));
  if (dst.numel() == 0) return dst.raw_view(final_sizes);
  // PyTorch convention, one scale for the whole product.
  float bias_scale, op_scale;
  requant_scale(a.q_scale(), b.q_scale(), dynamic_ ? 0.f : dst_->scale(), &bias_scale, &op_scale);
  const int32_t dst_zp = dynamic_ ? 0 : dst_->zero_point();
  // The process-wide cache (as the f32 matmul): both operands are activations, so there are no
  // prepacked weights to keep per kernel, and attention over a growing key / value cache meets a
  // new shape on every generated token, which a small per-kernel cache would recreate each call.
  // Dynamic calls have new scales and zero points every time: runtime values, one primitive.
  auto lookup = [&](const Tensor& bw) {
    PrimitiveKey key("qmatmul");
    key.add(av).add(bw).add(static_cast<int64_t>(get_num_threads())).add(static_cast<int64_t>(out_dt));
    if (!dynamic_) {
      key.add(op_scale).add(static_cast<int64_t>(a_zp)).add(static_cast<int64_t>(b_zp));
      key.add(static_cast<int64_t>(dst_zp));
    }
    return primitive_cache().get_or_create(key, [&] {
      try {
        dnnl::primitive_attr attr = base_attr();
        if (dynamic_) {
          attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
          attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
          attr.set_zero_points(DNNL_ARG_WEIGHTS, 0, {DNNL_RUNTIME_S32_VAL});
        } else {
          attr.set_output_scales(0, {op_scale});
          if (a_zp != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {a_zp});
          if (b_zp != 0) attr.set_zero_points(DNNL_ARG_WEIGHTS, 0, {b_zp});
          if (dst_zp != 0) attr.set_zero_points(DNNL_ARG_DST, 0, {dst_zp});
        }
        dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(desc_of(av), desc_of(bw), desc_of(dst)), attr,
                                        cpu_engine());
        auto e = std::make_shared<PrimitiveEntry>();
        e->prim = dnnl::matmul(pd);
        e->scratchpad_bytes = pd.scratchpad_desc().get_size();
        e->src_desc = desc_of(av);
        e->weights_desc = desc_of(bw);
        e->dst_desc = desc_of(dst);
        // A strided second operand that only oneDNN's reference kernel takes: contiguous is faster.
        if (!bw.is_contiguous() && std::string(pd.impl_info_str()).find("ref") != std::string::npos) {
          e->weights_desc = dnnl::memory::desc();
        }
        return e;
      } catch (const dnnl::error& err) {
        rethrow_dnnl("creating an int8 matmul", err);
      }
    });
  };
  auto entry = lookup(b8);
  if (entry->weights_desc.is_zero()) {
    b8 = copy(b8, MemoryFormat::kContiguous, DType::kS8);
    entry = lookup(b8);
  }
  ExecArgs args = {{DNNL_ARG_SRC, reused_mem(entry->src_desc, DNNL_ARG_SRC, av)},
                   {DNNL_ARG_WEIGHTS, reused_mem(entry->weights_desc, DNNL_ARG_WEIGHTS, b8)},
                   {DNNL_ARG_DST, reused_mem(entry->dst_desc, DNNL_ARG_DST, dst)}};
  int32_t zps[2] = {a_zp, b_zp};
  if (dynamic_) {
    const dnnl::memory::desc one_f32 = plain_desc({1}, DType::kF32, tag::x);
    const dnnl::memory::desc one_s32 = plain_desc({1}, DType::kS32, tag::x);
    args.emplace(DNNL_ARG_ATTR_OUTPUT_SCALES, dnnl::memory(one_f32, cpu_engine(), &op_scale));
    args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, dnnl::memory(one_s32, cpu_engine(), &zps[0]));
    args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_WEIGHTS, dnnl::memory(one_s32, cpu_engine(), &zps[1]));
  }
  execute(entry->prim, entry->scratchpad_bytes, std::move(args));
  return dst.raw_view(final_sizes);
}

}  // namespace dbrq::kernels
