// The data family: embedding (a gather of rows), clone, to, copy_, fill_ and the explicit
// quantize / dequantize. None of them runs in int8; dequantize takes its int8 argument as it is.
#include <utility>

#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

Tensor run_embedding(const OpCall& c) { return kernels::embedding(c.input(0), c.input(1)); }

Tensor run_clone(const OpCall& c) {
  check_defined("clone", "input", c.input(0));
  return kernels::copy(c.input(0), MemoryFormat::kPreserve, c.input(0).dtype());
}

Tensor run_to(const OpCall& c) {
  const Tensor& x = c.input(0);
  check_defined("to", "input", x);
  const auto target = static_cast<DType>(c.p<ConvertParams>().dtype);
  DBRQ_ENSURE(!x.is_quantized() || target == x.dtype(), DTypeError, "to(", dtype_name(target),
              "): the tensor is quantized (", dtype_name(x.dtype()), ", ", x.qparams()->to_string(),
              "); use dequantize() to get real values");
  if (target == x.dtype()) return x;
  return kernels::copy(x, MemoryFormat::kPreserve, target);
}

// copy_ and fill_ move real values, as at() and to_vector() read them: a quantized source is
// dequantized, a quantized destination takes the values quantized with its own parameters (as
// PyTorch's q.copy_(x) does for a float x; for a quantized source with other parameters PyTorch
// takes the source's parameters, dbrq keeps the destination's), and codes are copied as they are
// only between equal parameters.
// (kernels::copy_into moves elements as they are; `f32.copy_(q)` gave the codes, 5 for 0.11, and
// `q.fill_(0)` the code 0, -zero_point * scale.)
void copy_real_values(Tensor& self, const Tensor& src) {
  const bool as_they_are = self.is_quantized() ? src.is_quantized() && src.dtype() == self.dtype() &&
                                                     *src.qparams() == *self.qparams()
                                               : !src.is_quantized();
  if (as_they_are) return kernels::copy_into(self, src);
  const Tensor real = src.is_quantized() ? kernels::dequantize(src) : src;
  if (!self.is_quantized()) return kernels::copy_into(self, real);
  Tensor f32 = Tensor::empty(self.sizes(), DType::kF32);  // broadcast first: per-channel parameters need self's sizes
  kernels::copy_into(f32, real);
  kernels::copy_into(self, kernels::quantize(f32, self.qparams_ptr(), self.dtype()));
}

Tensor run_copy(const OpCall& c) {
  Tensor& self = ops::mutable_self(c);
  copy_real_values(self, c.input(1));  // kernels::copy_into checks that both are defined
  return self;
}

Tensor run_fill(const OpCall& c) {
  Tensor& self = ops::mutable_self(c);
  if (!self.is_quantized()) {
    kernels::fill(self, c.p<ConvertParams>().value);
    return self;
  }
  copy_real_values(self, full(IntArrayRef{}, c.p<ConvertParams>().value, DType::kF32));
  return self;
}

Tensor run_quantize(const OpCall& c) {
  const ConvertParams& cp = c.p<ConvertParams>();
  return kernels::quantize(c.input(0), cp.qparams, static_cast<DType>(cp.dtype));
}

Tensor run_dequantize(const OpCall& c) { return kernels::dequantize(c.input(0)); }

Tensor quantize_op(const Tensor& x, QuantParamsPtr qparams, DType dtype) {
  ConvertParams p;
  p.dtype = static_cast<int>(dtype);
  p.qparams = std::move(qparams);
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kQuantize, in, &p, run_quantize);
}

}  // namespace

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  // libtorch's torch::embedding takes (weight, indices): a port keeping that order gets a message
  // saying so rather than a bare dtype error.
  DBRQ_ENSURE(!(indices.defined() && weight.defined() && indices.dtype() == DType::kF32 &&
                (weight.dtype() == DType::kS64 || weight.dtype() == DType::kS32)),
              DTypeError, "embedding: indices have dtype f32 and weight ", dtype_name(weight.dtype()),
              ": dbrq::embedding takes (indices, weight), libtorch's torch::embedding (weight, indices); swap them");
  const Tensor* in[] = {&indices, &weight};
  return ops::call(OpKind::kEmbedding, in, nullptr, run_embedding);
}

Tensor quantize_per_tensor(const Tensor& x, float scale, int32_t zero_point, DType dtype) {
  return quantize_op(x, QuantParams::per_tensor(scale, zero_point), dtype);
}

Tensor quantize_per_channel(const Tensor& x, std::vector<float> scales, std::vector<int32_t> zero_points, int64_t axis,
                            DType dtype) {
  check_defined("quantize_per_channel", "input", x);
  return quantize_op(x, QuantParams::per_channel(std::move(scales), std::move(zero_points), x.wrap_dim(axis)), dtype);
}

Tensor dequantize(const Tensor& x) {
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kDequantize, in, nullptr, run_dequantize);
}

Tensor Tensor::clone() const {
  const Tensor* in[] = {this};
  return ops::call(OpKind::kClone, in, nullptr, run_clone);
}

Tensor Tensor::to(DType dtype) const {
  ConvertParams p;
  p.dtype = static_cast<int>(dtype);
  const Tensor* in[] = {this};
  return ops::call(OpKind::kTo, in, &p, run_to);
}

Tensor Tensor::dequantize() const { return dbrq::dequantize(*this); }

Tensor& Tensor::copy_(const Tensor& src) {
  return ops::call_inplace(OpKind::kCopy, *this, &src, nullptr, 0.0, false, run_copy);
}

Tensor& Tensor::fill_(double value) {
  ConvertParams p;
  p.value = value;
  return ops::call_inplace(OpKind::kFill, *this, nullptr, &p, 0.0, false, run_fill);
}

namespace ops {

namespace {

// The lowest and highest element offsets a view touches (sizes > 0).
std::pair<int64_t, int64_t> element_span(const Tensor& t) {
  int64_t lo = t.storage_offset(), hi = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? lo : hi) += reach;
  }
  return {lo, hi};
}

}  // namespace

void check_inplace_overlap(OpKind kind, const Tensor& self, const Tensor* other) {
  if (!self.defined() || self.numel() <= 1) return;
  if (kind != OpKind::kFill) {
    for (int64_t d = 0; d < self.dim(); ++d) {
      DBRQ_ENSURE(self.stride(d) != 0 || self.size(d) <= 1, ValueError, op_name(kind),
                  ": unsupported operation: more than one element of the written-to tensor refers to a single memory "
                  "location (an expanded tensor, sizes ", self.shape_string(), "); clone() it first");
    }
  }
  if (other == nullptr || !other->defined() || other->numel() == 0 || other->storage() != self.storage()) return;
  if (other->storage_offset() == self.storage_offset() && other->sizes() == self.sizes() &&
      other->strides() == self.strides()) {
    return;  // the same view (x.add_(x)): every element reads what it writes
  }
  // As PyTorch, only between dense views, whose element ranges say exactly whether they share an
  // element (interleaved views such as x[:, ::2] and x[:, 1::2] span overlapping ranges apart).
  if (!self.is_non_overlapping_and_dense() || !other->is_non_overlapping_and_dense()) return;
  const auto [a_lo, a_hi] = element_span(self);
  const auto [b_lo, b_hi] = element_span(*other);
  if (a_hi < b_lo || b_hi < a_lo) return;  // disjoint parts of one storage
  DBRQ_THROW(ValueError, op_name(kind),
             ": unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
             "memory location (sizes ", self.shape_string(), " and ", other->shape_string(),
             " overlapping in one storage); clone() the input first");
}

void register_data_ops(OpRegistry& r) {
  OpDef& emb = r.define(OpKind::kEmbedding, "embedding");
  emb.run = run_embedding;
  emb.num_activation_inputs = 1;  // indices; then the weight
  r.define(OpKind::kClone, "clone").run = run_clone;
  r.define(OpKind::kTo, "to").with_params<ConvertParams>().run = run_to;
  r.define(OpKind::kCopy, "copy_").run = run_copy;
  r.define(OpKind::kFill, "fill_").with_params<ConvertParams>().run = run_fill;
  r.define(OpKind::kQuantize, "quantize").with_params<ConvertParams>().run = run_quantize;
  OpDef& deq = r.define(OpKind::kDequantize, "dequantize");
  deq.run = run_dequantize;
  deq.takes_int8 = true;
}

}  // namespace ops
}  // namespace dbrq
