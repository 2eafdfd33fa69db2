#include "tracer/executors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_format.h"
#include "core/logging.h"
#include "kernels/bf16.h"
#include "tracer/precision.h"
#include "runtime/ops.h"

namespace dbrq::tracer {

namespace {

// The last f32 tensor this thread quantized: an fp32 result feeding several int8 ops (the q, k
// and v projections after a layer norm) is quantized once, not once per consumer. Within one model
// call only (drop_call_state_on_this_thread), and only for tensors an op made: the storage version
// does not see writes through a raw pointer taken earlier or into from_blob memory, which a caller
// refilling one input buffer per call makes between calls (the second call returned the first
// call's result), or forward makes within a call.
struct QuantizeMemo {
  Tensor source;  // keeps the storage alive, so its identity cannot be reused
  uint64_t version = 0;
  const QuantParams* want = nullptr;
  MemoryFormat format = MemoryFormat::kPreserve;
  const InputSpec* by = nullptr;  // the consumer that quantized it
  size_t snapshot = 0;            // bytes of the source's values in tls_memo_bytes (0: none)
  Tensor result;
};
thread_local QuantizeMemo tls_memo;
// The memo's source values when it is small and contiguous (kMemoSnapshotBytes at most): a
// consumer reading the same tensor again (another consumer, or a loop's next iteration) gets the
// memo only while its values are these. A fixed buffer: taking a snapshot allocates nothing.
constexpr size_t kMemoSnapshotBytes = 4096;
thread_local char tls_memo_bytes[kMemoSnapshotBytes];

bool small_dense(const Tensor& t) {
  return t.is_contiguous() && static_cast<size_t>(t.numel()) * t.element_size() <= kMemoSnapshotBytes;
}

Tensor quantize_memoized(const Tensor& t, const InputSpec& spec) {
  // Only the results of ops (and the model's inputs) are remembered: a tensor no op made (a buffer
  // forward fills through a raw pointer taken once, per loop iteration) may change without its
  // version moving, and each iteration got the first one's quantization. The same consumer again
  // is a loop's next iteration, whose buffer (a clone, or handed to a child module) may have been
  // refilled the same way. A small dense tensor's values are compared with a snapshot instead,
  // for any consumer: an unchanged operand of a loop's op (y in `for (..) z = z + y`) is
  // quantized once, a refilled one again.
  if (t.trace_id() == 0) return kernels::quantize_to(t, spec.want, DType::kU8, spec.format);
  QuantizeMemo& m = tls_memo;
  if (m.want == spec.want.get() && m.format == spec.format && m.source.storage() == t.storage() &&
      m.source.storage_offset() == t.storage_offset() && m.source.sizes() == t.sizes() &&
      m.source.strides() == t.strides() && m.version == t.storage()->version()) {
    if (m.snapshot != 0 ? std::memcmp(tls_memo_bytes, t.data_ptr(), m.snapshot) == 0 : m.by != &spec) {
      return m.result;
    }
  }
  Tensor q = kernels::quantize_to(t, spec.want, DType::kU8, spec.format);
  const size_t snapshot = small_dense(t) ? static_cast<size_t>(t.numel()) * t.element_size() : 0;
  if (snapshot != 0) std::memcpy(tls_memo_bytes, t.data_ptr(), snapshot);
  m = QuantizeMemo{t, t.storage()->version(), spec.want.get(), spec.format, &spec, snapshot, q};
  return q;
}

// The model outputs this thread dequantized at a converted model's return
// (dequantize_returned_output), with the u8 codes each was dequantized from. A returned key / value
// cache passed back into the next call (greedy decoding) is then not quantized again: quantizing
// (q - zp) * scale with the same parameters gives q back exactly (|q - zp| <= 255, so the product's
// rounding error, relative 2^-24 twice, stays below 1e-4 of a code step), so the codes are reused
// as they are. An entry serves only while its f32 storage is alive and unwritten (its version) and
// only the very tensor returned (offset, sizes, strides); each entry keeps its codes alive, a
// quarter of the f32 output's bytes, until the output dies (pruned at the next return). The f32
// output itself is filled from the codes when first read (kernels::dequantize_lazy).
struct ReturnedOutput {
  std::weak_ptr<Storage> storage;  // of the f32 output
  uint64_t storage_id = 0;
  uint64_t version = 0;
  int64_t offset = 0;
  DimVector sizes, strides;
  Tensor codes;  // contiguous u8, per-tensor parameters
  uint64_t codes_version = 0;  // an in-place op on the codes (they are shared) retires the entry
};
thread_local std::vector<ReturnedOutput> tls_returned;
thread_local ReturnedStats tls_returned_stats;
constexpr size_t kMaxReturned = 256;  // live returned outputs remembered per thread (a bound, not a cache size)

Tensor reuse_returned_codes(const Tensor& t, const InputSpec& spec) {
  if (tls_returned.empty() || spec.format == MemoryFormat::kChannelsLast) return Tensor();
  const Storage* s = t.storage().get();
  if (s == nullptr) return Tensor();
  for (const ReturnedOutput& r : tls_returned) {
    if (r.storage_id != s->id()) continue;
    if (r.version != s->version() || r.offset != t.storage_offset() || IntArrayRef(r.sizes) != t.sizes() ||
        IntArrayRef(r.strides) != t.strides() || r.codes_version != r.codes.storage()->version() ||
        !(*r.codes.qparams() == *spec.want)) {
      return Tensor();
    }
    ++tls_returned_stats.reused;
    return r.codes.with_qparams(spec.want);
  }
  return Tensor();
}

}  // namespace

Tensor dequantize_returned_output(Tensor q) {
  // Forget the outputs that died since the last return.
  tls_returned.erase(std::remove_if(tls_returned.begin(), tls_returned.end(),
                                    [](const ReturnedOutput& r) { return r.storage.expired(); }),
                     tls_returned.end());
  if (q.dtype() != DType::kU8 || q.qparams()->is_per_channel() || !q.is_contiguous()) return dbrq::dequantize(q);
  // Dequantized when first read: a cache that is only handed back to the model is never
  // dequantized (its codes are reused below), so a decoding step no longer costs O(cache length).
  // Only codes nobody else holds (`q`, moved out of the output slot it replaces, is the one
  // owner): no one can write them before the f32 output is read. Shared ones (a module member, the
  // same codes returned twice, a caller keeping its copy) are dequantized now.
  Tensor f = q.storage().use_count() == 1 ? kernels::dequantize_lazy(q) : dbrq::dequantize(q);
  if (tls_returned.size() >= kMaxReturned) tls_returned.erase(tls_returned.begin());
  tls_returned.push_back(ReturnedOutput{f.storage(), f.storage()->id(), f.storage()->version(), f.storage_offset(),
                                        DimVector(f.sizes().begin(), f.sizes().end()),
                                        DimVector(f.strides().begin(), f.strides().end()), q,
                                        q.storage()->version()});
  ++tls_returned_stats.remembered;
  return f;
}

namespace {

bool views_codes_of(const Tensor& t, const Tensor& q) {
  return t.defined() && t.is_quantized() && t.storage() == q.storage();
}

// Whether the outputs [first, ...) that view the codes of `q` (outputs[first]) can share one f32
// storage: the same parameters (per tensor) and no negative strides. Sets [lo, hi], the element
// range of the codes they cover (lo > hi when every one is empty).
bool can_share_f32(absl::Span<Tensor* const> outputs, size_t first, int64_t* lo, int64_t* hi) {
  const Tensor& q = *outputs[first];
  if (q.qparams()->is_per_channel()) return false;
  *lo = std::numeric_limits<int64_t>::max();
  *hi = std::numeric_limits<int64_t>::min();
  for (size_t j = first; j < outputs.size(); ++j) {
    const Tensor& t = *outputs[j];
    if (!views_codes_of(t, q)) continue;
    if (t.dtype() != q.dtype() || !(*t.qparams() == *q.qparams())) return false;
    int64_t end = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.stride(d) < 0) return false;
      end += (t.size(d) - 1) * t.stride(d);
    }
    if (t.numel() == 0) continue;
    *lo = std::min(*lo, t.storage_offset());
    *hi = std::max(*hi, end);
  }
  return true;
}

}  // namespace

void dequantize_returned_outputs(absl::Span<Tensor* const> outputs) {
  // Allocates nothing but the f32 results (tests/reliability/allocation_test).
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor* t = outputs[i];
    if (!t->defined() || !t->is_quantized()) continue;
    // A tensor with no values of its own (a fused chain's inner output) raises here, before its
    // storage is read directly (the lazy fill does not go through Tensor::data_ptr's check).
    if (t->value_withheld()) (void)t->data_ptr();
    bool aliased = false;
    for (size_t j = i + 1; j < outputs.size() && !aliased; ++j) aliased = views_codes_of(*outputs[j], *t);
    int64_t lo = 0, hi = -1;
    if (!aliased || !can_share_f32(outputs, i, &lo, &hi)) {
      *t = dequantize_returned_output(std::move(*t));
      continue;
    }
    // One f32 storage for the codes the outputs cover, and each output its view.
    const Tensor codes = *t;
    const Tensor f = hi >= lo ? dbrq::dequantize(codes.raw_as_strided({hi - lo + 1}, {1}, lo)) : Tensor();
    for (size_t j = i; j < outputs.size(); ++j) {
      Tensor& o = *outputs[j];
      if (!views_codes_of(o, codes)) continue;
      if (o.value_withheld()) (void)o.data_ptr();
      o = f.defined() ? f.raw_as_strided(o.sizes(), o.strides(), o.storage_offset() - lo)
                      : dbrq::dequantize(o);  // every view is empty
    }
  }
}

ReturnedStats returned_output_stats() { return tls_returned_stats; }

void forget_returned_outputs() {
  tls_returned.clear();
  tls_returned_stats = ReturnedStats{};
}

Tensor prepare_input(const Tensor& t, const InputSpec& spec) {
  if (spec.want == nullptr) return t;
  if (t.dtype() == DType::kU8 && t.qparams_ptr() == spec.want) return t;  // the common case
  if (t.is_quantized()) {
    if (t.dtype() == DType::kU8 && !t.qparams()->is_per_channel()) {
      return *t.qparams() == *spec.want ? t.with_qparams(spec.want) : kernels::requantize(t, spec.want);
    }
    return kernels::quantize_to(kernels::dequantize(t), spec.want, DType::kU8, spec.format);
  }
  DBRQ_ENSURE(t.dtype() == DType::kF32, DTypeError, "int8 op: input has dtype ", dtype_name(t.dtype()),
              "; expected f32 or a quantized u8 tensor");
  if (Tensor codes = reuse_returned_codes(t, spec); codes.defined()) return codes;
  return quantize_memoized(t, spec);
}

namespace {

// Weighted ops whose result waits for their residual (conv -> add fusion), per calling thread,
// by the storage of the (unfilled) result they handed out.
struct Pending {
  Tensor input;
  Tensor output;
  std::shared_ptr<kernels::QWeighted> kernel;  // built for the weights of the call that deferred
  InputSpec residual;                          // what the kernel's sum takes
};
thread_local absl::flat_hash_map<const Storage*, Pending> tls_pending;

bool any_quantized(const OpCall& call) {
  for (const Tensor* t : call.inputs) {
    if (t->defined() && t->is_quantized()) return true;
  }
  return false;
}

// `call` with its first input replaced (the eager kernel then runs on the prepared tensor); the
// other inputs (index_select's and gather's s64 index) stay.
Tensor run_on(const OpCall& call, const Tensor& x) {
  absl::InlinedVector<const Tensor*, 4> in(call.inputs.begin(), call.inputs.end());
  if (in.empty()) in.push_back(&x);
  in[0] = &x;
  OpCall c = call;
  c.inputs = absl::MakeConstSpan(in.data(), in.size());
  return c.run(c);
}

}  // namespace

namespace {

// This thread's own references to storage `s` that must keep the values it holds now, before an
// in-place op writes into it or supersedes it: a deferred weighted op's input (its kernel runs at
// the residual add, after the write: it gets a copy), the memo (forgotten), returned outputs whose
// codes live there (their f32 outputs are filled now and the entries dropped).
void release_internal_holds(const Storage* s) {
  for (auto& [key, p] : tls_pending) {
    if (p.input.storage().get() != s) continue;
    Tensor copy = Tensor::empty_like(p.input, p.input.dtype());
    kernels::copy_into(copy, p.input);
    p.input = p.input.is_quantized() ? copy.with_qparams(p.input.qparams_ptr()) : copy;
  }
  if (tls_memo.source.storage().get() == s || tls_memo.result.storage().get() == s) tls_memo = QuantizeMemo{};
  for (auto it = tls_returned.begin(); it != tls_returned.end();) {
    if (it->codes.storage().get() != s) {
      ++it;
      continue;
    }
    if (const std::shared_ptr<Storage> f = it->storage.lock()) (void)f->data();
    it = tls_returned.erase(it);
  }
}

}  // namespace

Tensor write_back_inplace(const Tensor& self, Tensor out, OpKind kind) {
  if (!out.defined() || !self.defined()) return out;
  const bool same_params = self.dtype() == out.dtype() && self.is_quantized() == out.is_quantized() &&
                           (!self.is_quantized() || out.qparams_ptr() == self.qparams_ptr() ||
                            *out.qparams() == *self.qparams());
  const bool shares = out.storage() == self.storage();
  if (shares && same_params && out.storage_offset() == self.storage_offset()) return out;  // written where asked
  // Holders of the storage besides the handle the call rebinds (and `out` itself, when it shares
  // it); wrapped memory (from_blob) is also seen by whoever owns it.
  auto others = [&] {
    return self.storage().use_count() - 1 - (shares ? 1 : 0) + (self.storage()->wraps_memory() ? 1 : 0);
  };
  if (others() <= 0) return out;  // nobody else can see the old values
  release_internal_holds(self.storage().get());
  if (others() <= 0) return out;
  DBRQ_ENSURE(out.sizes() == self.sizes(), ControlFlowError, "in-place ", op_name(kind),
              " after convert: its result has sizes ", out.shape_string(), ", the tensor it writes into ",
              self.shape_string());
  InterceptorScope none(nullptr);
  Tensor dst = self;  // shares the storage
  if (self.dtype() == DType::kF32) {
    kernels::copy_into(dst, out.is_quantized() ? kernels::dequantize(out) : out);
    return dst;
  }
  if (same_params) {
    kernels::copy_into(dst, out);  // the codes, as they are
    return dst;
  }
  // An f32 result into int8 codes (an op that ran fp32 on a view of an int8 tensor: relu_, fill_,
  // copy_ in a module without a qconfig): written as codes of the storage's parameters when every
  // value lies on their range (relu_ of codes gives codes back exactly), so every tensor sharing
  // the storage sees it and the handle stays a view of it. Values outside the range would clip:
  // those supersede the storage below instead.
  if (!out.is_quantized() && out.dtype() == DType::kF32 && self.is_quantized() && self.dtype() == DType::kU8 &&
      !self.qparams()->is_per_channel()) {
    const Tensor values = out.contiguous();
    const float* v = values.data<float>();
    const double scale = self.qparams()->scale(), zp = static_cast<double>(self.qparams()->zero_point());
    const double lo = (0.0 - zp - 0.5) * scale, hi = (255.0 - zp + 0.5) * scale;
    bool fits = true;
    for (int64_t i = 0; i < values.numel() && fits; ++i) fits = v[i] >= lo && v[i] <= hi;
    if (fits) {
      kernels::copy_into(dst, kernels::quantize_to(values, self.qparams_ptr(), DType::kU8, MemoryFormat::kContiguous));
      return dst;
    }
  }
  // Codes with other parameters (mul_ by a scalar rescales them; an add's sum has a range of its
  // own): requantizing them into the storage's parameters would lose precision on the handle the
  // model goes on with (a residual `x += f(x)` whose caller's copy of x is never read again) or
  // clip. The handle takes the result as computed; the storage is marked stale, so a copy or view
  // that is still read raises instead of giving the old values.
  if (shares) {
    Tensor own = Tensor::empty_like(out, out.dtype());
    kernels::copy_into(own, out);
    out = own.with_qparams(out.qparams_ptr());
  }
  self.storage()->supersede();
  return out;
}

void drop_call_state_on_this_thread() noexcept {
  tls_pending.clear();
  tls_memo = QuantizeMemo{};
}

Tensor run_fp32(const OpCall& call) {
  // An explicit dequantize in user code takes its int8 argument as it is.
  if (!any_quantized(call) || op_def(call.kind).takes_int8) return call.run(call);
  // Dequantize every int8 argument; keep the rest. At most a handful of inputs except for cat.
  absl::InlinedVector<Tensor, 4> deq(call.inputs.size());
  absl::InlinedVector<const Tensor*, 8> ptrs(call.inputs.size());
  {
    InterceptorScope none(nullptr);
    for (size_t i = 0; i < call.inputs.size(); ++i) {
      const Tensor* t = call.inputs[i];
      if (t->defined() && t->is_quantized()) {
        deq[i] = dequantize(*t);
        ptrs[i] = &deq[i];
      } else {
        ptrs[i] = t;
      }
    }
  }
  OpCall c = call;
  c.inputs = absl::MakeConstSpan(ptrs);
  Tensor r = c.run(c);
  // A view op (narrow, select, view, transpose, dropout, ...) gave a view of the dequantized copy:
  // a write through it (y.narrow(1, 0, 4).relu_() in a module without a qconfig, or on a path never
  // calibrated) would never reach the int8 tensor it views, which kept its old values. These ops'
  // eager kernels take int8 as it is (QuantRole::kShare without int8_share): the op runs again on
  // the codes and its result is a view of them, as an int8 pass-through's is. Whoever reads it
  // dequantizes it.
  const OpDef& def = op_def(call.kind);
  if (!call.inplace && def.role == QuantRole::kShare && def.int8_share == nullptr && r.defined()) {
    for (size_t i = 0; i < call.inputs.size(); ++i) {
      if (deq[i].defined() && r.storage() == deq[i].storage() && !call.inputs[i]->qparams()->is_per_channel()) {
        return call.run(call);
      }
    }
  }
  return r;
}

Tensor run_bf16(const OpCall& call) {
  const OpFn bf16 = op_def(call.kind).bf16_run;
  if (bf16 == nullptr || !kernels::bf16_available()) return run_fp32(call);
  OpCall c = call;
  c.run = bf16;
  return run_fp32(c);  // int8 arguments dequantized, then the bf16 kernel
}

// ---------------------------------------------------------------------------------------------

namespace {

bool same_geometry(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides();
}

}  // namespace

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  const size_t es = a.element_size();
  const auto* pa = static_cast<const char*>(a.data_ptr());
  const auto* pb = static_cast<const char*>(b.data_ptr());
  if (a.is_contiguous() && b.is_contiguous()) return std::memcmp(pa, pb, a.nbytes()) == 0;
  const int64_t n = a.numel(), nd = a.dim();
  absl::InlinedVector<int64_t, 6> idx(static_cast<size_t>(nd), 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t oa = 0, ob = 0;
    for (int64_t d = 0; d < nd; ++d) {
      oa += idx[d] * a.strides()[d];
      ob += idx[d] * b.strides()[d];
    }
    if (std::memcmp(pa + oa * static_cast<int64_t>(es), pb + ob * static_cast<int64_t>(es), es) != 0) return false;
    for (int64_t d = nd - 1; d >= 0 && ++idx[d] == a.sizes()[d]; --d) idx[d] = 0;
  }
  return true;
}

Tensor FollowerExec::run(const OpCall& call) {
  for (size_t k = 0; k < folded_.size() && k + 1 < call.inputs.size(); ++k) {
    const Tensor& t = *call.inputs[k + 1];
    const Tensor& f = folded_[k];
    if (t.defined() != f.defined()) continue;  // (an input left out is not a value)
    if (!t.defined() || (t.storage() == f.storage() && same_geometry(t, f)) || same_bits(t, f)) continue;
    DBRQ_THROW(ControlFlowError, "fused into ", chain_, ": input ", k + 1, " (sizes ", t.shape_string(),
               ") is another tensor than the one folded into the weights at convert, with other values; a "
               "folded batch norm must read the tensors it was converted with: write new values into them "
               "(copy_, load_state_dict), or keep it unfused (a qconfig of nullptr for the batch norm)");
  }
  return call.input(0);
}

void KernelSources::reset(Span ts) {
  sources_.clear();
  for (const Tensor* t : ts) sources_.push_back({*t, t->defined() ? t->storage()->version() : 0});
}

bool KernelSources::same(Span ts) const {
  if (ts.size() != sources_.size()) return false;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = *ts[i];
    const Source& s = sources_[i];
    if (t.defined() != s.tensor.defined()) return false;
    if (!t.defined()) continue;
    if (t.storage() != s.tensor.storage() || t.storage()->version() != s.version || !same_geometry(t, s.tensor)) {
      return false;
    }
  }
  return true;
}

bool KernelSources::same_values(Span ts) {
  if (ts.size() != sources_.size()) return false;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = *ts[i];
    const Source& s = sources_[i];
    if (t.defined() != s.tensor.defined()) return false;
    if (!t.defined()) continue;
    // A source written to since (its version moved) no longer holds what the kernel was built from.
    if (s.tensor.storage()->version() != s.version || !same_bits(t, s.tensor)) return false;
  }
  reset(ts);
  return true;
}

// ---------------------------------------------------------------------------------------------

WeightedExec::WeightedExec(const OpDef& def, Factory factory, OpParams params, InputSpec input, const Tensor& weight,
                           const Tensor& bias, std::vector<Tensor> folded, bool deferred)
    : def_(def),
      factory_(std::move(factory)),
      folded_(std::move(folded)),
      params_(std::move(params)),
      input_(std::move(input)),
      deferred_(deferred),
      kernel_(factory_(weight, bias)) {
  absl::InlinedVector<const Tensor*, 8> ts = {&weight, &bias};
  for (const Tensor& f : folded_) ts.push_back(&f);
  sources_.reset(ts);
}

std::shared_ptr<kernels::QWeighted> WeightedExec::kernel(const OpCall& call) {
  static const Tensor kNone;
  const Tensor& weight = call.input(1);
  const Tensor& bias = call.inputs.size() > 2 ? call.input(2) : kNone;
  absl::InlinedVector<const Tensor*, 8> ts = {&weight, &bias};
  for (const Tensor& f : folded_) ts.push_back(&f);
  std::lock_guard<std::mutex> lock(mu_);
  if (sources_.same(ts) || sources_.same_values(ts)) return kernel_;
  // Other weights than the kernel holds: changed after convert (load_state_dict, a write, a
  // folded batch norm's new statistics), or computed per call with other values. Quantize and
  // pack the ones this call hands.
  if (!warned_) {
    log()->warn("int8 {}: weights changed after convert; re-quantizing them (warned once per op)", def_.name);
    warned_ = true;
  }
  kernel_ = factory_(weight, bias);
  sources_.reset(ts);
  return kernel_;
}

Tensor WeightedExec::run(const OpCall& call) {
  if (def_.params_equal != nullptr && call.params != nullptr && !params_.empty() &&
      !def_.params_equal(call.params, params_.get())) {
    DBRQ_THROW(ControlFlowError, "int8 ", def_.name, ": its parameters (stride, padding, ...) differ from the ones "
               "recorded by the first run; an op's parameters must not change between calls");
  }
  DBRQ_ENSURE(!folded_into_linear_ || call.input(0).dim() == 2, ControlFlowError, "int8 ", def_.name,
              ": a batch norm was folded into it from 2-D calls, so it takes 2-D inputs only, got sizes ",
              call.input(0).shape_string(), " (a batch norm normalizes dim 1, a linear's features are the last "
              "dim); calibrate with such inputs so that the two stay separate");
  std::shared_ptr<kernels::QWeighted> k = kernel(call);
  Tensor x = prepare_input(call.input(0), input_);
  if (!deferred_) return k->run(x);
  // Residual fusion: the residual is not known yet. Hand out the (unfilled) output; the add fills
  // it with the sum post-op, with the kernel of this call's weights.
  Tensor out = k->empty_output(x);
  tls_pending[out.storage().get()] = Pending{std::move(x), out, std::move(k), residual_};
  return out;
}

Tensor WeightedExec::finish(const Tensor& pending, const Tensor& residual, const std::string& chain) {
  auto it = pending.defined() ? tls_pending.find(pending.storage().get()) : tls_pending.end();
  DBRQ_ENSURE(it != tls_pending.end(), ControlFlowError,
              "fused ", chain, ": the add received a tensor that is not its weighted op's result (data flow changed "
              "since the first run)");
  Pending p = std::move(it->second);
  tls_pending.erase(it);
  const Tensor r = prepare_input(residual, p.residual);
  return p.kernel->run(p.input, &r, &p.output);
}

QuantParamsPtr WeightedExec::weight_qparams() {
  std::lock_guard<std::mutex> lock(mu_);
  return kernel_->weight_qparams();
}

std::string WeightedExec::describe() const {
  std::lock_guard<std::mutex> lock(mu_);  // a weight computed per call rebuilds kernel_ while serving
  return kernel_->describe() + (deferred_ ? " (waits for its residual)" : "");
}

Tensor ResidualAddExec::run(const OpCall& call) {
  return WeightedExec::finish(call.input(1 - residual_input_), call.input(residual_input_), chain_);
}

Tensor MatmulExec::run(const OpCall& call) {
  if (dynamic_) return kernel_.run(call.input(0), call.input(1));
  return kernel_.run(prepare_input(call.input(0), a_), prepare_input(call.input(1), b_));
}

// ---------------------------------------------------------------------------------------------

Tensor BinaryExec::run(const OpCall& call) {
  return def_.int8_binary(prepare_input(call.input(0), a_), prepare_input(call.input(1), b_), out_, relu_);
}

std::string BinaryExec::describe() const { return absl::StrCat("int8 ", def_.name, relu_ ? "+relu" : ""); }

// ---------------------------------------------------------------------------------------------

ScalarExec::ScalarExec(OpKind kind, ScalarAffine affine, QuantParamsPtr expected_in)
    : kind_(kind), affine_(affine), in_(std::move(expected_in)) {
  out_ = derive(affine_, *in_, &lut_, &identity_);
}

int64_t ScalarExec::shift_steps(double c, double scale) { return static_cast<int64_t>(std::nearbyint(c / scale)); }

QuantParamsPtr ScalarExec::derive(const ScalarAffine& affine, const QuantParams& in, kernels::Lut* lut, bool* identity) {
  constexpr int64_t q_min = 0, q_max = 255;
  const double s = in.scale();
  const int64_t z = in.zero_point();
  *identity = true;
  for (int q = 0; q < 256; ++q) (*lut)[q] = static_cast<uint8_t>(q);
  const double c = affine.c;
  if (affine.shift) {
    // PyTorch's add_scalar: shift the zero point; saturate by rescaling when it leaves the range.
    const int64_t c_q = shift_steps(c, s);
    double s_prime = s;
    int64_t z_prime = z - c_q;
    if (q_min > z - c_q) {
      s_prime = (static_cast<double>(q_max) - static_cast<double>(z - c_q)) / static_cast<double>(q_max - q_min) * s;
      z_prime = q_min;
    } else if (q_max < z - c_q) {
      s_prime = (static_cast<double>(z - c_q) - static_cast<double>(q_min)) / static_cast<double>(q_max - q_min) * s;
      z_prime = q_max;
    }
    if (s_prime != s) {
      *identity = false;
      const float multiplier = static_cast<float>(s / s_prime);
      for (int q = 0; q < 256; ++q) {
        const int32_t v = static_cast<int32_t>(q - z + c_q);
        const int32_t r = static_cast<int32_t>(std::nearbyint(static_cast<float>(v) * multiplier)) + static_cast<int32_t>(z_prime);
        (*lut)[q] = static_cast<uint8_t>(std::min(std::max(r, 0), 255));
      }
    }
    return QuantParams::per_tensor(static_cast<float>(s_prime), static_cast<int32_t>(z_prime));
  }
  // mul (and div by its reciprocal): PyTorch's mul_scalar.
  if (c > 0.0) return QuantParams::per_tensor(static_cast<float>(c * s), static_cast<int32_t>(z));
  *identity = false;
  if (c == 0.0) {
    lut->fill(0);
    return QuantParams::per_tensor(1.0f, 0);
  }
  for (int q = 0; q < 256; ++q) (*lut)[q] = static_cast<uint8_t>(q_max + q_min - q);
  return QuantParams::per_tensor(static_cast<float>(std::abs(c) * s), static_cast<int32_t>(q_max - (z - q_min)));
}

Tensor ScalarExec::run(const OpCall& call) {
  const Tensor& x = call.input(0);
  // Codes unchanged (x * c for c > 0, x + c within range): the same codes in new storage, as the
  // fp32 op's result is a new tensor. Sharing x's storage under other parameters, an in-place op
  // on either one (`y = x * 2; y.relu_()`) wrote its codes into the other.
  auto same_codes = [&](const QuantParamsPtr& out) { return kernels::copy(x, MemoryFormat::kPreserve, DType::kU8).with_qparams(out); };
  if (x.dtype() == DType::kU8 && x.qparams_ptr() == in_) {
    return identity_ ? same_codes(out_) : kernels::apply_lut(x, lut_, out_);
  }
  if (x.dtype() == DType::kU8 && x.is_quantized() && !x.qparams()->is_per_channel()) {
    // Parameters other than expected: derive for these (rare; allocates).
    kernels::Lut lut;
    bool identity;
    QuantParamsPtr out = derive(affine_, *x.qparams(), &lut, &identity);
    return identity ? same_codes(out) : kernels::apply_lut(x, lut, out);
  }
  return run_fp32(call);
}

std::string ScalarExec::describe() const {
  return absl::StrCat("int8 ", op_name(kind_), " scalar (", identity_ ? "parameters only" : "code table", ")");
}

// ---------------------------------------------------------------------------------------------

Tensor CatExec::run(const OpCall& call) {
  absl::InlinedVector<Tensor, 8> prepared;
  absl::InlinedVector<const Tensor*, 8> ptrs;
  prepared.reserve(call.inputs.size());
  for (const Tensor* t : call.inputs) prepared.push_back(prepare_input(*t, spec_));
  for (const Tensor& t : prepared) ptrs.push_back(&t);
  OpCall c = call;
  c.inputs = absl::MakeConstSpan(ptrs);
  return c.run(c);
}

Tensor ShareExec::run(const OpCall& call) {
  // An fp32 input (a record that also sees fp32 tensors, e.g. the same view chain on an fp32 buffer
  // of the user's): the op runs as written. A view stays a view of the user's tensor (a quantized
  // copy would swallow writes through it), and whoever reads it quantizes it as it would have.
  if (!call.input(0).is_quantized()) return call.run(call);
  const Tensor x = prepare_input(call.input(0), input_);
  if (def_.int8_share != nullptr) return def_.int8_share(x, params_.get());
  Tensor r = run_on(call, x);  // shape ops, max pooling, dropout, identity: their eager kernels keep int8
  // A view of a requantized copy (the input came with other parameters: a record reading tensors
  // of several origins, a shared layer's outputs) would swallow a write through it
  // (a.narrow(1, 0, 4).relu_() never reached a). The view is taken of the input's own codes
  // instead; its readers requantize it as they would have this copy.
  const Tensor& in = call.input(0);
  if (!call.inplace && r.storage() == x.storage() && x.storage() != in.storage() && in.dtype() == DType::kU8 &&
      !in.qparams()->is_per_channel()) {
    return run_on(call, in);
  }
  return r;
}

std::string ShareExec::describe() const { return absl::StrCat("int8 ", def_.name, " (shares parameters)"); }

Tensor LutExec::run(const OpCall& call) {
  return kernels::apply_lut(prepare_input(call.input(0), input_), lut_, out_);
}

std::string LutExec::describe() const { return absl::StrCat("int8 ", op_name(kind_), " (256-entry table)"); }

Tensor RequantExec::run(const OpCall& call) {
  return def_.int8_requant(prepare_input(call.input(0), input_), params_.get(), out_);
}

std::string RequantExec::describe() const { return absl::StrCat("int8 ", def_.name, " (fixed output parameters)"); }

std::string NormExec::describe() const { return absl::StrCat("int8 ", def_.name, " (statistics of the codes)"); }

ChannelAffineExec::ChannelAffineExec(const OpDef& def, OpParams params, InputSpec input, QuantParamsPtr out,
                                     bool relu, const std::vector<Tensor>& stats)
    : def_(def), params_(std::move(params)), input_(std::move(input)), out_(std::move(out)), relu_(relu) {
  kernel_ = def_.int8_affine(stats, params_.get(), input_.want, out_, relu_);
  absl::InlinedVector<const Tensor*, 8> ts;
  for (const Tensor& t : stats) ts.push_back(&t);
  sources_.reset(ts);
}

std::shared_ptr<const kernels::QChannelAffine> ChannelAffineExec::kernel(absl::Span<const Tensor* const> stats) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sources_.same(stats) || sources_.same_values(stats)) return kernel_;
  // Statistics changed after convert (load_state_dict, a write, statistics computed per call with
  // other values): compute the per-channel constants again from this call's.
  if (!warned_) {
    log()->warn("int8 {}: statistics changed after convert; recomputing its int8 constants (warned once per op)",
                def_.name);
    warned_ = true;
  }
  std::vector<Tensor> now;
  for (const Tensor* t : stats) now.push_back(*t);
  kernel_ = def_.int8_affine(now, params_.get(), input_.want, out_, relu_);
  sources_.reset(stats);
  return kernel_;
}

Tensor ChannelAffineExec::run(const OpCall& call) {
  if (def_.params_equal != nullptr && call.params != nullptr && !params_.empty() &&
      !def_.params_equal(call.params, params_.get())) {
    DBRQ_THROW(ControlFlowError, "int8 ", def_.name, ": its parameters (eps, ...) differ from the ones recorded by "
               "the first run; an op's parameters must not change between calls");
  }
  const auto k = kernel(call.inputs.subspan(1));
  return k->run(prepare_input(call.input(0), input_));
}

std::string ChannelAffineExec::describe() const {
  return absl::StrCat("int8 ", def_.name, " (per-channel multiply-add on codes", relu_ ? ", relu fused" : "", ")");
}

}  // namespace dbrq::tracer

namespace dbrq {
bool bf16_supported() { return kernels::bf16_available(); }
void force_bf16_fallback(bool on) { kernels::force_bf16_unavailable(on); }
}  // namespace dbrq
