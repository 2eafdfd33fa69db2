// The op registry: one OpDef per op kind, holding everything dbrq knows about the op in one place.
// Each op family has one file (runtime/ops/*.cc) that defines its ops' public functions and their
// OpDefs; the table is filled explicitly the first time it is used (op_registry.cc calls each
// family's registration function, in a fixed order: no static initialization order tricks).
//
//   const dbrq::OpDef& d = dbrq::op_def(dbrq::OpKind::kHardswish);
//   d.name;                                  // "hardswish"
//   d.role;                                  // QuantRole::kLut: int8 through a 256-entry table
//   kernels::Eltwise e = d.eltwise(nullptr); // what runs eagerly, fused after a conv, and feeds the table
//
// Above the runtime, the tracer and the quantization state read OpDefs instead of naming ops:
// which inputs are activations, how to copy the parameters into the recorded program, which chains
// the backend fuses, how each op runs in int8.
//
// Adding an op: its OpKind (runtime/ops.h), its public function (ops.h) and layer (nn.h), and one
// OpDef in its family file. docs/architecture.md works through an example.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "absl/types/span.h"
#include "core/op_params.h"
#include "core/tensor.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "runtime/dispatcher.h"
#include "runtime/quant_role.h"

namespace dbrq {

// A copy of an op's parameters (its *Params struct), taken when the trace records the op. The
// OpDef knows the type; as<P>() checks it.
class OpParams {
 public:
  OpParams() = default;
  template <typename P>
  static OpParams of(const P& p) {
    OpParams o;
    o.ptr_ = std::make_shared<const P>(p);
    o.type_ = &typeid(P);
    return o;
  }
  bool empty() const { return ptr_ == nullptr; }
  const void* get() const { return ptr_.get(); }
  template <typename P>
  bool holds() const {
    return type_ != nullptr && *type_ == typeid(P);
  }
  template <typename P>
  const P& as() const {
    DBRQ_CHECK(holds<P>(), "op parameters are a ", type_ != nullptr ? type_->name() : "(none)", ", not a ",
               typeid(P).name());
    return *static_cast<const P*>(ptr_.get());
  }

 private:
  std::shared_ptr<const void> ptr_;
  const std::type_info* type_ = nullptr;
};

// Where an activation can be fused as a post-op (bits of OpDef::fuses_after / fusion_site).
enum FusionSite : uint8_t {
  kAfterConv = 1,          // conv2d (+ batch_norm) -> activation: an eltwise post-op
  kAfterLinear = 2,        // linear (+ batch_norm) -> activation
  kAfterResidualAdd = 4,   // conv2d (+ batch_norm) -> add(residual) -> activation: after the sum post-op
  kAfterAdd = 8,           // add of two int8 tensors -> activation
  kAfterNorm = 16,         // batch_norm on its own (int8) -> activation
};

// x OP c as a change of x's quantization parameters: a shift (x + c) or a scale (x * c).
struct ScalarAffine {
  bool shift = false;
  double c = 0.0;
};

// The range of inputs on which an activation is interesting and how close its fp32 kernel is to
// its reference function there (max absolute error); the registry-wide tests sweep it.
struct ActivationDomain {
  float lo = -8.f, hi = 8.f;
  float tolerance = 1e-6f;
};

using Int8ShareFn = Tensor (*)(const Tensor& x, const void* params);
using Int8RequantFn = Tensor (*)(const Tensor& x, const void* params, const QuantParamsPtr& out);
using Int8BinaryFn = Tensor (*)(const Tensor& a, const Tensor& b, const QuantParamsPtr& out, bool relu);
using WeightedFactory = std::unique_ptr<kernels::QWeighted> (*)(kernels::QWeightedOptions options,
                                                                const void* params);
// The int8 kernel of a kChannelAffine op from its statistics (the inputs after its activation, as
// the op received them), its parameters, its input and output parameters and a fused relu.
using Int8AffineFactory = std::shared_ptr<const kernels::QChannelAffine> (*)(absl::Span<const Tensor> stats,
                                                                           const void* params,
                                                                           const QuantParamsPtr& in,
                                                                           const QuantParamsPtr& out, bool relu);
// The int8 kernel of a kNormalize op: its u8 input (at the converted parameters), the call (weight and
// bias as the op received them, its parameters) and the output parameters.
using Int8NormFn = Tensor (*)(const Tensor& x, const OpCall& call, const QuantParamsPtr& out);
using FoldFn = void (*)(const Tensor& w, const Tensor& b, absl::Span<const Tensor> stats, const void* params,
                        Tensor* w_out, Tensor* b_out);
using SizesFn = DimVector (*)(const OpCall& call);

struct OpDef {
  OpKind kind = OpKind::kNumOpKinds;
  const char* name = "unknown_op";  // PyTorch's functional name

  // ---- parameters ----
  // Copies the op's *Params struct (OpCall::params) for the recorded program; null: no parameters.
  OpParams (*copy_params)(const void* params) = nullptr;
  bool (*params_equal)(const void* a, const void* b) = nullptr;
  uint64_t (*params_fingerprint)(const void* params) = nullptr;  // stable across processes
  // The portable form (quant-state files); null for parameters that have none (ConvertParams).
  ParamFields (*params_to_fields)(const void* params) = nullptr;
  OpParams (*params_from_fields)(const ParamFields& fields) = nullptr;  // throws ValueError
  // Whether the parameters are part of what the op is for the tracer (its record): yes when its int8
  // form is built from them (a conv's stride, a clamp's bounds); no for ops that only view their
  // input (narrow's start: a loop over t must fold into one record).
  bool params_in_identity = true;

  // ---- fp32 ----
  OpFn run = nullptr;                  // the eager kernel of the functional form
  int num_activation_inputs = -1;      // leading activation inputs; weights / statistics follow (-1: all)
  SizesFn infer_sizes = nullptr;       // shape rule: output sizes from the inputs, where they follow
  // bf16 arithmetic with f32 boundaries (kernels/bf16.h), for an op a QConfig::bf16() marker keeps
  // out of int8 on a CPU with AVX512_BF16; null: such an op runs fp32.
  OpFn bf16_run = nullptr;
  // The kernel calibration runs while observers watch, when PyTorch 1.13 sums in another order than
  // `run`: observers must see exactly what PyTorch FX's see (conv2d, linear). Null: `run`.
  OpFn calibrate_run = nullptr;

  // ---- elementwise activations ----
  // The op as a oneDNN eltwise step: its eager kernel, its post-op when fused, and (through
  // kernels::eltwise_reference) the real-valued function of its int8 code table and of the tests.
  kernels::Eltwise (*eltwise)(const void* params) = nullptr;
  ActivationDomain domain;
  const char* layer = nullptr;  // the nn layer class that calls it ("Sigmoid"), for defaults by module type

  // ---- quantization on the oneDNN backend ----
  QuantRole role = QuantRole::kNone;
  bool dynamic = false;                 // also dynamic quantization (activation parameters per call)
  float fixed_scale = 0.f;              // kFixedQParams
  int32_t fixed_zero_point = 0;
  // kFixedQParams for the layer only: default_qconfig_mapping fixes the output range of the layer
  // class (`layer`) and leaves the functional op's output to the global (observing) QConfig, as
  // PyTorch 1.13 FX does for softmax (its fixed [0, 1) range is keyed on nn.Softmax; F.softmax /
  // torch.softmax / x.softmax() outputs are observed where an int8 op reads them).
  bool fixed_qparams_layer_only = false;
  uint8_t fusion_site = 0;              // kWeighted / kBinary: the FusionSite of a post-op after it
  uint8_t fuses_after = 0;              // activations: FusionSites where it can be a post-op
  FoldFn fold = nullptr;                // batch_norm: folded into the weighted op before it
  bool residual_add = false;            // add: joins a conv's output and a residual (sum post-op)

  // ---- int8 execution (the tracer's executors call these) ----
  Int8ShareFn int8_share = nullptr;      // kShare: same parameters out (null: the eager kernel takes u8)
  Int8RequantFn int8_requant = nullptr;  // kLut / kFixedQParams without a code table (softmax)
  Int8BinaryFn int8_binary = nullptr;    // kBinary of two tensors (null: only with a scalar)
  bool (*scalar_affine)(double c, bool scalar_first, ScalarAffine* out) = nullptr;  // kBinary with a scalar
  WeightedFactory int8_weighted = nullptr;  // kWeighted: the kernel, from folded weights
  // kWeighted: the recorded weight as the int8 kernel, batch-norm folding and per-channel weight
  // quantization see it, output channels on dim 0 (conv_transpose2d's is [in, out/groups, ...]).
  // Null: the weight as recorded.
  Tensor (*int8_weight_layout)(const Tensor& weight, const void* params) = nullptr;
  // Its inverse: a weight in that layout back in the op's own (calibration runs the op with a
  // batch norm folded into its weight). Needed whenever int8_weight_layout is set.
  Tensor (*weight_from_int8_layout)(const Tensor& weight, const void* params) = nullptr;
  MemoryFormat int8_input_format = MemoryFormat::kPreserve;  // layout an f32 input is quantized to
  bool supports_residual = false;        // kWeighted: can fuse a following residual add
  bool takes_int8 = false;               // dequantize: its int8 argument reaches it unchanged
  Int8AffineFactory int8_affine = nullptr;  // kChannelAffine: the kernel (batch_norm on its own)
  Int8NormFn int8_norm = nullptr;           // kNormalize: the kernel (layer / group / instance norm)

  // Sets copy_params, params_equal, params_fingerprint and the portable form for the parameter
  // struct P.
  template <typename P>
  OpDef& with_params() {
    copy_params = [](const void* p) { return OpParams::of(*static_cast<const P*>(p)); };
    params_equal = [](const void* a, const void* b) {
      return *static_cast<const P*>(a) == *static_cast<const P*>(b);
    };
    params_fingerprint = [](const void* p) { return fingerprint(*static_cast<const P*>(p)); };
    if constexpr (has_param_fields<P>::value) {
      params_to_fields = [](const void* p) { return to_fields(*static_cast<const P*>(p)); };
      params_from_fields = [](const ParamFields& f) { return OpParams::of(from_fields<P>(f)); };
    }
    return *this;
  }
  size_t activation_inputs(size_t num_inputs) const {
    return num_activation_inputs < 0 ? num_inputs : std::min(num_inputs, static_cast<size_t>(num_activation_inputs));
  }
};

// The table, filled by each op family's registration function.
class OpRegistry {
 public:
  // The entry of `kind`, named; each kind is defined exactly once (CHECKed).
  OpDef& define(OpKind kind, const char* name);
  const OpDef& operator[](OpKind kind) const { return defs_[static_cast<size_t>(kind)]; }
  const std::array<OpDef, static_cast<size_t>(OpKind::kNumOpKinds)>& all() const { return defs_; }

 private:
  std::array<OpDef, static_cast<size_t>(OpKind::kNumOpKinds)> defs_;
};

// The registry (built on first use; thread-safe).
const OpRegistry& op_registry();
inline const OpDef& op_def(OpKind kind) { return op_registry()[kind]; }

}  // namespace dbrq
