#include "runtime/op_registry.h"

#include "runtime/ops/op_call.h"

namespace dbrq {

const char* quant_role_name(QuantRole r) {
  switch (r) {
    case QuantRole::kNone:
      return "fp32";
    case QuantRole::kWeighted:
      return "weighted";
    case QuantRole::kMatmul:
      return "matmul";
    case QuantRole::kBinary:
      return "binary";
    case QuantRole::kCat:
      return "cat";
    case QuantRole::kShare:
      return "share";
    case QuantRole::kLut:
      return "lut";
    case QuantRole::kFixedQParams:
      return "fixed_qparams";
    case QuantRole::kChannelAffine:
      return "channel_affine";
    case QuantRole::kNormalize:
      return "normalize";
  }
  return "?";
}

OpDef& OpRegistry::define(OpKind kind, const char* name) {
  DBRQ_CHECK(kind < OpKind::kNumOpKinds, "op kind out of range");
  OpDef& d = defs_[static_cast<size_t>(kind)];
  DBRQ_CHECK(d.kind == OpKind::kNumOpKinds, "op ", name, " defined twice");
  d.kind = kind;
  d.name = name;
  return d;
}

namespace {

OpRegistry build_registry() {
  OpRegistry r;
  ops::register_conv_ops(r);
  ops::register_matmul_ops(r);
  ops::register_norm_ops(r);
  ops::register_binary_ops(r);
  ops::register_activation_ops(r);
  ops::register_pooling_ops(r);
  ops::register_reduction_ops(r);
  ops::register_shape_ops(r);
  ops::register_data_ops(r);
  ops::register_math_ops(r);
  ops::register_indexing_ops(r);
  ops::register_resample_ops(r);
  for (const OpDef& d : r.all()) DBRQ_CHECK(d.kind != OpKind::kNumOpKinds, "an op kind has no OpDef");
  return r;
}

}  // namespace

const OpRegistry& op_registry() {
  static const OpRegistry registry = build_registry();
  return registry;
}

const char* op_name(OpKind kind) { return kind < OpKind::kNumOpKinds ? op_def(kind).name : "unknown_op"; }

}  // namespace dbrq
