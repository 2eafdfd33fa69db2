// Helpers the op family files (runtime/ops/*.cc) share: building an OpCall and dispatching it.
// Internal to the runtime.
#pragma once

#include "absl/types/span.h"
#include "core/tensor.h"
#include "runtime/dispatcher.h"
#include "runtime/op_registry.h"

namespace dbrq::ops {

template <size_t N>
Tensor call(OpKind kind, const Tensor* const (&in)[N], const void* params, OpFn run) {
  OpCall c;
  c.kind = kind;
  c.inputs = absl::MakeConstSpan(in, N);
  c.params = params;
  c.run = run;
  return dispatch(c);
}

inline Tensor call_scalar(OpKind kind, const Tensor& x, double scalar, bool scalar_first, OpFn run) {
  const Tensor* in[] = {&x};
  OpCall c;
  c.kind = kind;
  c.inputs = absl::MakeConstSpan(in, 1);
  c.scalar = scalar;
  c.has_scalar = true;
  c.scalar_first = scalar_first;
  c.run = run;
  return dispatch(c);
}

// Throws ValueError, as PyTorch does, for an in-place write whose result would depend on the
// order elements are visited: `self` with several elements at one address (an expanded tensor;
// fill_ excepted), or `other` overlapping `self` in memory without being the very same view
// (x.narrow(0, 1, 3).add_(x.narrow(0, 0, 3)), y.copy_(y.transpose(0, 1))).
void check_inplace_overlap(OpKind kind, const Tensor& self, const Tensor* other);

// Runs an in-place op and rebinds `self` to its result (an interceptor may hand back a different
// tensor, e.g. f32 for an int8 input it had to dequantize).
inline Tensor& call_inplace(OpKind kind, Tensor& self, const Tensor* other, const void* params, double scalar,
                            bool has_scalar, OpFn run) {
  check_inplace_overlap(kind, self, other);
  const Tensor* in[] = {&self, other};
  OpCall c;
  c.kind = kind;
  c.inputs = absl::MakeConstSpan(in, other != nullptr ? 2 : 1);
  c.params = params;
  c.scalar = scalar;
  c.has_scalar = has_scalar;
  c.inplace = true;
  c.run = run;
  // Always rebind: besides new storage, the result may carry a new trace id or parameters.
  self = dispatch(c);
  return self;
}

inline Tensor& mutable_self(const OpCall& c) { return const_cast<Tensor&>(*c.inputs[0]); }

// Pooling with every parameter given (the layers' forward: no stride vector built per call).
Tensor max_pool2d(const Tensor& x, const Pool2dParams& params);
Tensor avg_pool2d(const Tensor& x, const Pool2dParams& params);
// layer_norm with its parameters built (LayerNorm::forward).
Tensor layer_norm(const Tensor& input, const NormParams& params, const Tensor& weight, const Tensor& bias);

// Each family's registration, called once by op_registry() in this order.
void register_conv_ops(OpRegistry& r);
void register_matmul_ops(OpRegistry& r);
void register_norm_ops(OpRegistry& r);
void register_binary_ops(OpRegistry& r);
void register_activation_ops(OpRegistry& r);
void register_pooling_ops(OpRegistry& r);
void register_reduction_ops(OpRegistry& r);
void register_shape_ops(OpRegistry& r);
void register_data_ops(OpRegistry& r);
void register_math_ops(OpRegistry& r);
void register_indexing_ops(OpRegistry& r);
void register_resample_ops(OpRegistry& r);

}  // namespace dbrq::ops
