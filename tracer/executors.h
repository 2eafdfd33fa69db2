// Converted-op executors: what each seen op does at inference after convert(). Internal to the
// tracer; convert.cc builds them, the interceptor runs them.
//
// Every executor first brings its int8 inputs to the parameters it was built for (an InputSpec):
// a u8 tensor with exactly those parameters passes untouched (a pointer compare), an f32 tensor is
// quantized, a u8 tensor with other parameters is requantized through a 256-entry table.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/int8.h"
#include "quant_state/auto_quant_state.h"
#include "tracer/interceptor.h"

namespace dbrq::tracer {

struct InputSpec {
  QuantParamsPtr want;  // u8 per-tensor; null: the op takes the tensor as it comes
  MemoryFormat format = MemoryFormat::kPreserve;  // for quantizing an f32 arrival
};
Tensor prepare_input(const Tensor& t, const InputSpec& spec);

// A seen op that runs in fp32 (not quantized, or dynamic parameters unavailable).
class Fp32Exec : public ConvertedOp {
 public:
  explicit Fp32Exec(std::string why) : why_(std::move(why)) {}
  Tensor run(const OpCall& call) override { return run_fp32(call); }
  std::string describe() const override { return "fp32" + (why_.empty() ? "" : " (" + why_ + ")"); }

 private:
  std::string why_;
};

// A member of a fused chain after its base: the base already produced the chain's result.
class FollowerExec : public ConvertedOp {
 public:
  explicit FollowerExec(std::string chain) : chain_(std::move(chain)) {}
  Tensor run(const OpCall& call) override { return call.input(0); }
  std::string describe() const override { return "fused into " + chain_; }

 private:
  std::string chain_;
};

// conv2d (+ folded batch_norm, + activation, + residual add through the sum post-op).
class ConvExec : public ConvertedOp {
 public:
  using Factory = std::function<std::unique_ptr<kernels::QConv2d>()>;
  ConvExec(Factory factory, Conv2dParams params, InputSpec input, const Tensor& weight, bool deferred);
  Tensor run(const OpCall& call) override;
  std::string describe() const override;
  // The residual add of a deferred chain: runs the conv with its stored input, summing `residual`.
  Tensor finish(const Tensor& pending, const Tensor& residual);
  const InputSpec& residual_spec() const { return residual_; }
  void set_residual_spec(InputSpec s) { residual_ = std::move(s); }

 private:
  const kernels::QConv2d& kernel(const Tensor& weight);
  Factory factory_;
  Conv2dParams params_;
  InputSpec input_;
  InputSpec residual_;
  bool deferred_;
  std::mutex mu_;
  std::shared_ptr<kernels::QConv2d> kernel_;
  const Storage* weight_storage_;
  uint64_t weight_version_;
};

// The add of a conv -> add residual chain.
class ResidualAddExec : public ConvertedOp {
 public:
  ResidualAddExec(ConvExec* base, int residual_input, std::string chain)
      : base_(base), residual_input_(residual_input), chain_(std::move(chain)) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override { return "residual add fused into " + chain_ + " (sum post-op)"; }

 private:
  ConvExec* base_;
  int residual_input_;
  std::string chain_;
};

// linear (+ folded batch_norm1d, + relu / gelu), static or dynamic.
class LinearExec : public ConvertedOp {
 public:
  using Factory = std::function<std::unique_ptr<kernels::QLinear>()>;
  LinearExec(Factory factory, InputSpec input, const Tensor& weight, bool dynamic);
  Tensor run(const OpCall& call) override;
  std::string describe() const override;

 private:
  Factory factory_;
  InputSpec input_;
  bool dynamic_;
  std::mutex mu_;
  std::shared_ptr<kernels::QLinear> kernel_;
  const Storage* weight_storage_;
  uint64_t weight_version_;
};

class MatmulExec : public ConvertedOp {
 public:
  MatmulExec(InputSpec a, InputSpec b, QuantParamsPtr out, bool dynamic)
      : a_(std::move(a)), b_(std::move(b)), kernel_(a_.want, b_.want, std::move(out), dynamic), dynamic_(dynamic) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override { return kernel_.describe(); }

 private:
  InputSpec a_, b_;
  kernels::QMatmul kernel_;
  bool dynamic_;
};

// add / mul of two int8 tensors (+ fused relu).
class BinaryExec : public ConvertedOp {
 public:
  BinaryExec(OpKind kind, InputSpec a, InputSpec b, QuantParamsPtr out, bool relu)
      : kind_(kind), a_(std::move(a)), b_(std::move(b)), out_(std::move(out)), relu_(relu) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override;

 private:
  OpKind kind_;
  InputSpec a_, b_;
  QuantParamsPtr out_;
  bool relu_;
};

// x + c, x - c, x * c, x / c on int8: output parameters derived from the input's, as PyTorch's
// add_scalar / mul_scalar; usually only the parameters change, not the data.
class ScalarExec : public ConvertedOp {
 public:
  ScalarExec(OpKind kind, double scalar, QuantParamsPtr expected_in);
  Tensor run(const OpCall& call) override;
  std::string describe() const override;
  // Output parameters for an input with parameters `in`, and the code table when data changes.
  static QuantParamsPtr derive(OpKind kind, double scalar, const QuantParams& in, kernels::Lut* lut, bool* identity);
  const QuantParamsPtr& output() const { return out_; }

 private:
  OpKind kind_;
  double scalar_;
  QuantParamsPtr in_, out_;
  kernels::Lut lut_;
  bool identity_ = true;  // codes unchanged
};

class CatExec : public ConvertedOp {
 public:
  explicit CatExec(QuantParamsPtr shared) : shared_(std::move(shared)) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override { return "int8 cat (shared parameters)"; }

 private:
  QuantParamsPtr shared_;
};

// Ops int8 passes through with unchanged parameters (shape ops, pooling, relu, clamp, ...).
class ShareExec : public ConvertedOp {
 public:
  ShareExec(OpKind kind, OpParamsCopy params, InputSpec input)
      : kind_(kind), params_(std::move(params)), input_(std::move(input)) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override;

 private:
  OpKind kind_;
  OpParamsCopy params_;
  InputSpec input_;
};

// Elementwise function on u8 through a 256-entry table (sigmoid, tanh, hardswish, gelu, ...).
class LutExec : public ConvertedOp {
 public:
  LutExec(OpKind kind, InputSpec input, QuantParamsPtr out, kernels::Lut lut)
      : kind_(kind), input_(std::move(input)), out_(std::move(out)), lut_(lut) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override;

 private:
  OpKind kind_;
  InputSpec input_;
  QuantParamsPtr out_;
  kernels::Lut lut_;
};

class SoftmaxExec : public ConvertedOp {
 public:
  SoftmaxExec(int64_t dim, InputSpec input, QuantParamsPtr out)
      : dim_(dim), input_(std::move(input)), out_(std::move(out)) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override { return "int8 softmax (fixed output parameters)"; }

 private:
  int64_t dim_;
  InputSpec input_;
  QuantParamsPtr out_;
};

// Forgets this thread's fused convs that wait for their residual add (after an exception cut a
// call short between the two; called when the thread's module stack has fully unwound).
void drop_pending_on_this_thread() noexcept;

// The real-valued function of a LUT-able op kind.
std::function<float(float)> elementwise_fn(OpKind kind, const OpParamsCopy& params);

}  // namespace dbrq::tracer
