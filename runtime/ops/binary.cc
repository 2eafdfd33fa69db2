// The binary elementwise family: add, sub, mul, div (tensor-tensor with NumPy broadcasting, and
// tensor-scalar) and their in-place forms. In int8: add and mul of two tensors run PyTorch's
// quantized add / mul; x + c, x - c, x * c, x / c only change the quantization parameters.
#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

kernels::BinaryAlg binary_alg(OpKind k) {
  switch (k) {
    case OpKind::kSub:
      return kernels::BinaryAlg::kSub;
    case OpKind::kMul:
      return kernels::BinaryAlg::kMul;
    case OpKind::kDiv:
      return kernels::BinaryAlg::kDiv;
    default:
      return kernels::BinaryAlg::kAdd;
  }
}

Tensor run_binary(const OpCall& c) {
  if (c.has_scalar) return kernels::binary_scalar(binary_alg(c.kind), c.input(0), c.scalar, c.scalar_first);
  return kernels::binary(binary_alg(c.kind), c.input(0), c.input(1));
}

Tensor run_binary_inplace(const OpCall& c) {
  Tensor& self = ops::mutable_self(c);
  if (c.has_scalar) {
    kernels::binary_scalar_inplace(binary_alg(c.kind), self, c.scalar);
  } else {
    kernels::binary_inplace(binary_alg(c.kind), self, c.input(1));
  }
  return self;
}

DimVector binary_sizes(const OpCall& c) {
  if (c.has_scalar) return DimVector(c.input(0).sizes().begin(), c.input(0).sizes().end());
  return broadcast_shapes(op_name(c.kind), c.input(0).sizes(), c.input(1).sizes());
}

Tensor binary_op(OpKind kind, const Tensor& a, const Tensor& b) {
  const Tensor* in[] = {&a, &b};
  return ops::call(kind, in, nullptr, run_binary);
}

// int8 add / mul of two tensors (+ a fused relu). Same sizes: PyTorch's quantized kernels;
// broadcasting (which PyTorch's int8 add / mul do not do either): through fp32.
template <kernels::BinaryAlg kAlg>
Tensor int8_binary(const Tensor& a, const Tensor& b, const QuantParamsPtr& out, bool relu) {
  if (a.sizes() == b.sizes()) {
    return kAlg == kernels::BinaryAlg::kAdd ? kernels::qadd(a, b, out, relu) : kernels::qmul(a, b, out, relu);
  }
  Tensor r = kernels::binary(kAlg, kernels::dequantize(a), kernels::dequantize(b));
  if (relu) r = kernels::eltwise(kernels::Eltwise::relu(), r);
  return kernels::quantize_to(r, out, DType::kU8, MemoryFormat::kPreserve);
}

// x + c, x - c: a shift of x; x * c, x / c: a scale. c - x and c / x are neither.
template <bool kShift, bool kNegate, bool kInvert>
bool scalar_affine(double c, bool scalar_first, ScalarAffine* out) {
  if (scalar_first && (kNegate || kInvert)) return false;
  out->shift = kShift;
  out->c = kNegate ? -c : kInvert ? 1.0 / c : c;
  return true;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(OpKind::kAdd, a, b); }
Tensor add(const Tensor& a, double b) { return ops::call_scalar(OpKind::kAdd, a, b, false, run_binary); }
Tensor add(double a, const Tensor& b) { return ops::call_scalar(OpKind::kAdd, b, a, true, run_binary); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(OpKind::kSub, a, b); }
Tensor sub(const Tensor& a, double b) { return ops::call_scalar(OpKind::kSub, a, b, false, run_binary); }
Tensor sub(double a, const Tensor& b) { return ops::call_scalar(OpKind::kSub, b, a, true, run_binary); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(OpKind::kMul, a, b); }
Tensor mul(const Tensor& a, double b) { return ops::call_scalar(OpKind::kMul, a, b, false, run_binary); }
Tensor mul(double a, const Tensor& b) { return ops::call_scalar(OpKind::kMul, b, a, true, run_binary); }
Tensor div(const Tensor& a, const Tensor& b) { return binary_op(OpKind::kDiv, a, b); }
Tensor div(const Tensor& a, double b) { return ops::call_scalar(OpKind::kDiv, a, b, false, run_binary); }
Tensor div(double a, const Tensor& b) { return ops::call_scalar(OpKind::kDiv, b, a, true, run_binary); }

Tensor& Tensor::add_(const Tensor& other) {
  return ops::call_inplace(OpKind::kAdd, *this, &other, nullptr, 0.0, false, run_binary_inplace);
}
Tensor& Tensor::add_(double other) {
  return ops::call_inplace(OpKind::kAdd, *this, nullptr, nullptr, other, true, run_binary_inplace);
}
Tensor& Tensor::sub_(const Tensor& other) {
  return ops::call_inplace(OpKind::kSub, *this, &other, nullptr, 0.0, false, run_binary_inplace);
}
Tensor& Tensor::sub_(double other) {
  return ops::call_inplace(OpKind::kSub, *this, nullptr, nullptr, other, true, run_binary_inplace);
}
Tensor& Tensor::mul_(const Tensor& other) {
  return ops::call_inplace(OpKind::kMul, *this, &other, nullptr, 0.0, false, run_binary_inplace);
}
Tensor& Tensor::mul_(double other) {
  return ops::call_inplace(OpKind::kMul, *this, nullptr, nullptr, other, true, run_binary_inplace);
}
Tensor& Tensor::div_(double other) {
  return ops::call_inplace(OpKind::kDiv, *this, nullptr, nullptr, other, true, run_binary_inplace);
}

Tensor Tensor::add(const Tensor& other) const { return ::dbrq::add(*this, other); }
Tensor Tensor::add(double other) const { return ::dbrq::add(*this, other); }
Tensor Tensor::sub(const Tensor& other) const { return ::dbrq::sub(*this, other); }
Tensor Tensor::sub(double other) const { return ::dbrq::sub(*this, other); }
Tensor Tensor::mul(const Tensor& other) const { return ::dbrq::mul(*this, other); }
Tensor Tensor::mul(double other) const { return ::dbrq::mul(*this, other); }
Tensor Tensor::div(const Tensor& other) const { return ::dbrq::div(*this, other); }
Tensor Tensor::div(double other) const { return ::dbrq::div(*this, other); }

namespace ops {

void register_binary_ops(OpRegistry& r) {
  using A = kernels::BinaryAlg;
  OpDef& add = r.define(OpKind::kAdd, "add");
  add.int8_binary = int8_binary<A::kAdd>;
  add.scalar_affine = scalar_affine<true, false, false>;
  add.fusion_site = kAfterAdd;
  add.residual_add = true;

  OpDef& sub = r.define(OpKind::kSub, "sub");
  sub.scalar_affine = scalar_affine<true, true, false>;  // tensor - tensor stays fp32

  OpDef& mul = r.define(OpKind::kMul, "mul");
  mul.int8_binary = int8_binary<A::kMul>;
  mul.scalar_affine = scalar_affine<false, false, false>;

  OpDef& div = r.define(OpKind::kDiv, "div");
  div.scalar_affine = scalar_affine<false, false, true>;  // tensor / tensor stays fp32

  for (OpDef* d : {&add, &sub, &mul, &div}) {
    d->run = run_binary;
    d->infer_sizes = binary_sizes;
    d->role = QuantRole::kBinary;
  }
}

}  // namespace ops
}  // namespace dbrq
