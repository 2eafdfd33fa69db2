// The math family (issue 12): where, pow, sqrt, exp. fp32 ops with NumPy broadcasting; in a
// converted model they run in fp32 (their int8 arguments are dequantized on the way in, QuantRole
// kNone). where's condition is a mask: dbrq has no bool dtype, so any unquantized u8, s8, s32 or
// s64 tensor (or f32) counts, nonzero meaning true.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/op_shapes.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

// An operand of a broadcasting loop: its data and its strides broadcast to the output's sizes
// (right-aligned, 0 along broadcast dims).
struct Operand {
  const char* base = nullptr;
  DType dtype = DType::kF32;
  DimVector strides;
};

Operand operand(const Tensor& t, IntArrayRef out) {
  Operand o;
  o.base = static_cast<const char*>(t.data_ptr());
  o.dtype = t.dtype();
  o.strides.assign(out.size(), 0);
  const int64_t lead = static_cast<int64_t>(out.size()) - t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) o.strides[lead + d] = t.size(d) == 1 ? 0 : t.stride(d);
  return o;
}

double read(const Operand& o, int64_t offset) {
  const char* p = o.base + offset * static_cast<int64_t>(dtype_size(o.dtype));
  switch (o.dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::kU8:
      return static_cast<uint8_t>(*p);
    case DType::kS8:
      return static_cast<int8_t>(*p);
    case DType::kS32: {
      int32_t v;
      std::memcpy(&v, p, sizeof v);
      return v;
    }
    case DType::kS64: {
      int64_t v;
      std::memcpy(&v, p, sizeof v);
      return static_cast<double>(v);
    }
    case DType::kBF16:
      break;
  }
  return 0.0;
}

// Calls f(out_index, offsets) for every element of a row-major output of `sizes`; offsets[k] is
// operand k's element offset.
template <typename F>
void broadcast_for_each(IntArrayRef sizes, const std::vector<Operand>& ops, F&& f) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  if (numel == 0) return;
  const int64_t n = static_cast<int64_t>(sizes.size());
  std::vector<int64_t> idx(static_cast<size_t>(n), 0), off(ops.size(), 0);
  for (int64_t i = 0; i < numel; ++i) {
    f(i, off.data());
    for (int64_t d = n - 1; d >= 0; --d) {
      if (++idx[d] < sizes[d]) {
        for (size_t k = 0; k < ops.size(); ++k) off[k] += ops[k].strides[d];
        break;
      }
      for (size_t k = 0; k < ops.size(); ++k) off[k] -= ops[k].strides[d] * (sizes[d] - 1);
      idx[d] = 0;
    }
  }
}

void check_mask(const Tensor& cond) {
  check_defined("where", "condition", cond);
  DBRQ_ENSURE(!cond.is_quantized() && cond.dtype() != DType::kBF16, DTypeError,
              "where: condition must be a mask (unquantized u8, s8, s32, s64 or f32; nonzero is true), got ",
              cond.is_quantized() ? "a quantized " : "", dtype_name(cond.dtype()));
}

// where(cond, a, b); a scalar side (has_scalar) is `scalar`: scalar_first for a, else b.
Tensor run_where(const OpCall& c) {
  const Tensor& cond = c.input(0);
  check_mask(cond);
  std::vector<const Tensor*> values;
  for (size_t i = 1; i < c.num_inputs(); ++i) {
    check_float("where", c.has_scalar ? (c.scalar_first ? "other" : "input") : (i == 1 ? "input" : "other"),
                c.input(i));
    values.push_back(&c.input(i));
  }
  DimVector sizes(cond.sizes().begin(), cond.sizes().end());
  for (const Tensor* t : values) sizes = broadcast_shapes("where", sizes, t->sizes());
  std::vector<Operand> ops = {operand(cond, sizes)};
  for (const Tensor* t : values) ops.push_back(operand(*t, sizes));
  Tensor out = Tensor::empty(sizes, DType::kF32);
  float* dst = out.raw_mutable_data<float>();
  const float s = static_cast<float>(c.scalar);
  const bool scalar_a = c.has_scalar && c.scalar_first, scalar_b = c.has_scalar && !c.scalar_first;
  broadcast_for_each(sizes, ops, [&](int64_t i, const int64_t* off) {
    const bool take_a = read(ops[0], off[0]) != 0.0;
    if (take_a) {
      dst[i] = scalar_a ? s : static_cast<float>(read(ops[1], off[1]));
    } else {
      dst[i] = scalar_b ? s : static_cast<float>(read(ops[scalar_a ? 1 : 2], off[scalar_a ? 1 : 2]));
    }
  });
  return out;
}

// pow: tensor ^ tensor (broadcast), tensor ^ scalar, scalar ^ tensor.
Tensor run_pow(const OpCall& c) {
  std::vector<Operand> ops;
  DimVector sizes;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    check_float("pow", i == 0 && !(c.has_scalar && c.scalar_first) ? "input" : "exponent", c.input(i));
    sizes = i == 0 ? DimVector(c.input(0).sizes().begin(), c.input(0).sizes().end())
                   : broadcast_shapes("pow", sizes, c.input(i).sizes());
  }
  for (size_t i = 0; i < c.num_inputs(); ++i) ops.push_back(operand(c.input(i), sizes));
  Tensor out = Tensor::empty(sizes, DType::kF32);
  float* dst = out.raw_mutable_data<float>();
  const float s = static_cast<float>(c.scalar);
  broadcast_for_each(sizes, ops, [&](int64_t i, const int64_t* off) {
    const float v = static_cast<float>(read(ops[0], off[0]));
    if (!c.has_scalar) {
      dst[i] = std::pow(v, static_cast<float>(read(ops[1], off[1])));
    } else {
      dst[i] = c.scalar_first ? std::pow(s, v) : std::pow(v, s);
    }
  });
  return out;
}

template <float (*F)(float)>
Tensor run_unary(const OpCall& c) {
  const char* name = op_name(c.kind);
  check_float(name, "input", c.input(0));
  const Tensor& x = c.input(0);
  std::vector<Operand> ops = {operand(x, x.sizes())};
  Tensor out = Tensor::empty(x.sizes(), DType::kF32);
  float* dst = out.raw_mutable_data<float>();
  broadcast_for_each(x.sizes(), ops,
                     [&](int64_t i, const int64_t* off) { dst[i] = F(static_cast<float>(read(ops[0], off[0]))); });
  return out;
}

float sqrt_f(float v) { return std::sqrt(v); }
float exp_f(float v) { return std::exp(v); }

}  // namespace

Tensor where(const Tensor& condition, const Tensor& input, const Tensor& other) {
  const Tensor* in[] = {&condition, &input, &other};
  return ops::call(OpKind::kWhere, in, nullptr, run_where);
}

namespace {

Tensor where_scalar(const Tensor& condition, const Tensor& t, double scalar, bool scalar_first) {
  const Tensor* in[] = {&condition, &t};
  OpCall c;
  c.kind = OpKind::kWhere;
  c.inputs = absl::MakeConstSpan(in, 2);
  c.scalar = scalar;
  c.has_scalar = true;
  c.scalar_first = scalar_first;
  c.run = run_where;
  return dispatch(c);
}

}  // namespace

Tensor where(const Tensor& condition, const Tensor& input, double other) {
  return where_scalar(condition, input, other, false);
}
Tensor where(const Tensor& condition, double input, const Tensor& other) {
  return where_scalar(condition, other, input, true);
}

Tensor pow(const Tensor& x, double exponent) {
  return ops::call_scalar(OpKind::kPow, x, exponent, false, run_pow);
}
Tensor pow(double base, const Tensor& exponent) {
  return ops::call_scalar(OpKind::kPow, exponent, base, true, run_pow);
}
Tensor pow(const Tensor& x, const Tensor& exponent) {
  const Tensor* in[] = {&x, &exponent};
  return ops::call(OpKind::kPow, in, nullptr, run_pow);
}
Tensor sqrt(const Tensor& x) {
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kSqrt, in, nullptr, run_unary<sqrt_f>);
}
Tensor exp(const Tensor& x) {
  const Tensor* in[] = {&x};
  return ops::call(OpKind::kExp, in, nullptr, run_unary<exp_f>);
}

Tensor Tensor::where(const Tensor& condition, const Tensor& other) const { return dbrq::where(condition, *this, other); }
Tensor Tensor::pow(double exponent) const { return dbrq::pow(*this, exponent); }
Tensor Tensor::pow(const Tensor& exponent) const { return dbrq::pow(*this, exponent); }
Tensor Tensor::sqrt() const { return dbrq::sqrt(*this); }
Tensor Tensor::exp() const { return dbrq::exp(*this); }

namespace ops {

void register_math_ops(OpRegistry& r) {
  // fp32 in converted models (QuantRole::kNone): int8 arguments are dequantized on the way in.
  OpDef& where = r.define(OpKind::kWhere, "where");
  where.run = run_where;
  OpDef& pow = r.define(OpKind::kPow, "pow");
  pow.run = run_pow;
  OpDef& sqrt = r.define(OpKind::kSqrt, "sqrt");
  sqrt.run = run_unary<sqrt_f>;
  OpDef& exp = r.define(OpKind::kExp, "exp");
  exp.run = run_unary<exp_f>;
}

}  // namespace ops
}  // namespace dbrq
