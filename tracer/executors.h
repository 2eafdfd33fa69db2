// Converted-op executors: what each seen op does at inference after convert(). Internal to the
// tracer; convert.cc builds them (one per seen op, indexed by its program_index), the interceptor
// runs them. They are generic over ops: each asks the op's OpDef for the op-specific part (the
// int8 kernel of a weighted op, the clamp of a relu, the function of a code table, ...).
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
#include "runtime/dispatcher.h"
#include "runtime/op_registry.h"

namespace dbrq::tracer {

// A converted seen op. Executors must not allocate bookkeeping per call.
class ConvertedOp {
 public:
  virtual ~ConvertedOp() = default;
  virtual Tensor run(const OpCall& call) = 0;
  virtual std::string describe() const = 0;  // "int8 conv2d (oneDNN), relu fused"
  virtual bool is_fp32() const { return false; }
};

struct InputSpec {
  QuantParamsPtr want;  // u8 per-tensor; null: the op takes the tensor as it comes
  MemoryFormat format = MemoryFormat::kPreserve;  // for quantizing an f32 arrival
};
Tensor prepare_input(const Tensor& t, const InputSpec& spec);

// A converted model's quantized output, dequantized for the caller (the default ConvertOptions).
// The calling thread remembers the u8 codes with the f32 result, so that prepare_input given that
// very f32 tensor again, unwritten, for the same parameters (a key / value cache returned by one
// call and passed to the next), returns the codes instead of quantizing: the same values, exactly.
// When nothing but `q` holds the codes (the caller moved them in), the f32 result is filled from
// them when first read (kernels::dequantize_lazy): a cache passed back unread is never dequantized.
Tensor dequantize_returned_output(Tensor q);
// Every quantized tensor among a converted model's outputs, dequantized for the caller. Outputs
// that are views of one storage of codes (`return {y, y.view({-1})}`, or y twice) stay views of
// one f32 storage, as they were in the fp32 model: a write through one is seen through the others
// (dequantized one by one, each got a copy of its own, and such a write was silently lost). An
// output with no values of its own (the inner tensor of a fused chain, reached through a raw view)
// raises ControlFlowError.
void dequantize_returned_outputs(absl::Span<Tensor* const> outputs);
struct ReturnedStats {
  uint64_t remembered = 0;  // outputs dequantized with their codes kept
  uint64_t reused = 0;      // prepare_input calls that returned kept codes
};
// This thread's counts (tests).
ReturnedStats returned_output_stats();
// Drops this thread's kept codes and zeroes its counts (tests).
void forget_returned_outputs();

// Runs `call` in fp32: int8 inputs are dequantized first (the arg-dequant hook).
Tensor run_fp32(const OpCall& call);
// The same with the op's bf16 kernel (OpDef::bf16_run) when it has one and the CPU runs bf16
// (kernels::bf16_available()); otherwise exactly run_fp32.
Tensor run_bf16(const OpCall& call);

// A seen op that runs in fp32 (not quantized, or dynamic parameters unavailable).
class Fp32Exec : public ConvertedOp {
 public:
  explicit Fp32Exec(std::string why) : why_(std::move(why)) {}
  Tensor run(const OpCall& call) override { return run_fp32(call); }
  std::string describe() const override { return "fp32" + (why_.empty() ? "" : " (" + why_ + ")"); }
  bool is_fp32() const override { return true; }

 private:
  std::string why_;
};

// Whether two tensors hold bit-identical values (dtype, sizes, then element by element on raw memory,
// not through the dispatcher: it runs inside converted ops).
bool same_bits(const Tensor& a, const Tensor& b);

// The tensors a cached int8 kernel was built from (weight, bias, folded batch-norm statistics),
// to tell whether a later call hands the same values. Holding them keeps their storage alive, so
// a later tensor on the same storage, with the same geometry and storage version, holds the same
// data; a freshly computed tensor (a weight scaled per call) is compared element by element.
class KernelSources {
 public:
  using Span = absl::Span<const Tensor* const>;
  // After building the kernel from `ts`.
  void reset(Span ts);
  // The same tensors, unchanged since the kernel was built (the common case: a few compares).
  bool same(Span ts) const;
  // Other tensors with bit-identical values (a weight computed the same way on every call); they
  // become the sources, so the next such call is compared against them.
  bool same_values(Span ts);

 private:
  struct Source {
    Tensor tensor;         // undefined: an absent optional input (no bias)
    uint64_t version = 0;  // of its storage when the kernel was built
  };
  std::vector<Source> sources_;
};

// A member of a fused chain after its base: the base already produced the chain's result.
// folded: for a batch norm folded into the base's weights, the tensors it was converted with (its
// inputs after the activation, as recorded). The base rebuilds when they are written to; a call
// handing other tensors with other values (a statistic replaced instead of written in place) would
// run with the old ones, so it raises ControlFlowError instead.
class FollowerExec : public ConvertedOp {
 public:
  explicit FollowerExec(std::string chain, std::vector<Tensor> folded = {})
      : chain_(std::move(chain)), folded_(std::move(folded)) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override { return "fused into " + chain_; }

 private:
  std::string chain_;
  std::vector<Tensor> folded_;
};

// A weighted op (conv2d, linear; + folded batch norm, + activation post-ops, + a residual add
// through the sum post-op): its OpDef's kernels::QWeighted, built again when the weights change.
class WeightedExec : public ConvertedOp {
 public:
  // Builds the kernel from a call's weight and bias (undefined: none).
  using Factory = std::function<std::shared_ptr<kernels::QWeighted>(const Tensor& weight, const Tensor& bias)>;
  // deferred: a residual add follows; the add runs the kernel (ResidualAddExec). folded: the
  // statistics of batch norms folded into the weights (watched for changes, like the weights).
  WeightedExec(const OpDef& def, Factory factory, OpParams params, InputSpec input, const Tensor& weight,
               const Tensor& bias, std::vector<Tensor> folded, bool deferred);
  Tensor run(const OpCall& call) override;
  std::string describe() const override;
  // The residual add of a deferred chain: runs the kernel of the call that left `pending` (this
  // thread's, of any weighted op: several records of one layer may feed one add) with its stored
  // input, summing `residual`.
  static Tensor finish(const Tensor& pending, const Tensor& residual, const std::string& chain);
  void set_residual_spec(InputSpec s) { residual_ = std::move(s); }
  // Of the kernel built at convert (or rebuilt for changed weights).
  QuantParamsPtr weight_qparams();
  // The kernel built at convert (or rebuilt for changed weights): its s8 weights (batch norm
  // folded) and their parameters, for the ONNX exporter.
  std::shared_ptr<kernels::QWeighted> current_kernel() {
    std::lock_guard<std::mutex> lock(mu_);
    return kernel_;
  }
  bool deferred() const { return deferred_; }
  // A batch norm folded into a linear: right for 2-D inputs only (a batch norm normalizes dim 1).
  void set_folded_into_linear() { folded_into_linear_ = true; }

 private:
  // The kernel for this call's weight and bias: built again when they (or a folded statistic)
  // changed since it was built.
  std::shared_ptr<kernels::QWeighted> kernel(const OpCall& call);
  const OpDef& def_;
  Factory factory_;
  std::vector<Tensor> folded_;
  OpParams params_;  // as recorded: later calls must pass the same
  InputSpec input_;
  InputSpec residual_;
  bool deferred_;
  bool folded_into_linear_ = false;
  mutable std::mutex mu_;
  std::shared_ptr<kernels::QWeighted> kernel_;
  KernelSources sources_;  // of kernel_: weight, bias, folded statistics
  bool warned_ = false;    // about re-quantizing (once: a weight computed per call rebuilds each call)
};

// The add of a weighted -> add residual chain.
class ResidualAddExec : public ConvertedOp {
 public:
  ResidualAddExec(int residual_input, std::string chain) : residual_input_(residual_input), chain_(std::move(chain)) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override { return "residual add fused into " + chain_ + " (sum post-op)"; }

 private:
  int residual_input_;
  std::string chain_;
};

// matmul of two activations (QuantRole::kMatmul), static or dynamic.
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

// A binary op of two int8 tensors (+ a fused relu): its OpDef's int8_binary.
class BinaryExec : public ConvertedOp {
 public:
  BinaryExec(const OpDef& def, InputSpec a, InputSpec b, QuantParamsPtr out, bool relu)
      : def_(def), a_(std::move(a)), b_(std::move(b)), out_(std::move(out)), relu_(relu) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override;

 private:
  const OpDef& def_;
  InputSpec a_, b_;
  QuantParamsPtr out_;
  bool relu_;
};

// x + c, x - c, x * c, x / c on int8 (the OpDef's scalar_affine says which): output parameters
// derived from the input's, as PyTorch's add_scalar / mul_scalar; usually only the parameters
// change, not the data.
class ScalarExec : public ConvertedOp {
 public:
  ScalarExec(OpKind kind, ScalarAffine affine, QuantParamsPtr expected_in);
  Tensor run(const OpCall& call) override;
  std::string describe() const override;
  // Output parameters for an input with parameters `in`, and the code table when data changes.
  static QuantParamsPtr derive(const ScalarAffine& affine, const QuantParams& in, kernels::Lut* lut, bool* identity);
  // x + c on codes of scale `scale` shifts the zero point by this many steps (PyTorch's
  // add_scalar: c rounded to the grid); the ONNX export adds the same value.
  static int64_t shift_steps(double c, double scale);
  const QuantParamsPtr& output() const { return out_; }

 private:
  OpKind kind_;
  ScalarAffine affine_;
  QuantParamsPtr in_, out_;
  kernels::Lut lut_;
  bool identity_ = true;  // codes unchanged
};

// cat of int8 tensors with one shared set of parameters (the eager kernel joins the codes).
class CatExec : public ConvertedOp {
 public:
  explicit CatExec(QuantParamsPtr shared) : shared_(std::move(shared)), spec_{shared_, MemoryFormat::kPreserve} {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override { return "int8 cat (shared parameters)"; }

 private:
  QuantParamsPtr shared_;
  InputSpec spec_;  // every input brought to shared_ (one consumer for prepare_input's memo)
};

// Ops int8 passes through with unchanged parameters: the OpDef's int8_share (relu, clamps, average
// pooling, mean), or the eager kernel on codes (shape ops, max pooling, dropout, identity).
class ShareExec : public ConvertedOp {
 public:
  ShareExec(const OpDef& def, OpParams params, InputSpec input)
      : def_(def), params_(std::move(params)), input_(std::move(input)) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override;

 private:
  const OpDef& def_;
  OpParams params_;
  InputSpec input_;
};

// An elementwise function on u8 through a 256-entry table built from the OpDef's reference.
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

// An op with fixed output parameters and its own int8 kernel (the OpDef's int8_requant: softmax).
class RequantExec : public ConvertedOp {
 public:
  RequantExec(const OpDef& def, OpParams params, InputSpec input, QuantParamsPtr out)
      : def_(def), params_(std::move(params)), input_(std::move(input)), out_(std::move(out)) {}
  Tensor run(const OpCall& call) override;
  std::string describe() const override;

 private:
  const OpDef& def_;
  OpParams params_;
  InputSpec input_;
  QuantParamsPtr out_;
};

// A normalization on u8 (layer / group / instance norm): its OpDef's int8_norm kernel, with the
// weight and bias the call passes (so a changed parameter is used as it is).
class NormExec : public ConvertedOp {
 public:
  NormExec(const OpDef& def, InputSpec input, QuantParamsPtr out)
      : def_(def), input_(std::move(input)), out_(std::move(out)) {}
  Tensor run(const OpCall& call) override { return def_.int8_norm(prepare_input(call.input(0), input_), call, out_); }
  std::string describe() const override;

 private:
  const OpDef& def_;
  InputSpec input_;
  QuantParamsPtr out_;
};

// A per-channel multiply-add on u8 from the op's statistics (batch_norm on its own, + relu): its
// OpDef's int8_affine kernel, built again when a statistic changes after convert.
class ChannelAffineExec : public ConvertedOp {
 public:
  // stats: the op's inputs after its activation, as recorded.
  ChannelAffineExec(const OpDef& def, OpParams params, InputSpec input, QuantParamsPtr out, bool relu,
                    const std::vector<Tensor>& stats);
  Tensor run(const OpCall& call) override;
  std::string describe() const override;

 private:
  std::shared_ptr<const kernels::QChannelAffine> kernel(absl::Span<const Tensor* const> stats);
  const OpDef& def_;
  OpParams params_;  // as recorded: later calls must pass the same
  InputSpec input_;
  QuantParamsPtr out_;
  bool relu_;
  std::mutex mu_;
  std::shared_ptr<const kernels::QChannelAffine> kernel_;
  KernelSources sources_;  // the statistics the kernel was built from
  bool warned_ = false;
};

// After convert, an in-place op (relu_, mul_, add_, clamp_, ...) may not write where it was asked
// to: its int8 executor hands back new storage (a table's output, codes with other parameters)
// or new parameters on the same codes, and the call rebinds only the handle it was given. When
// anything else shares that storage (another handle copied from it, a view: libtorch semantics,
// where the write is seen through every alias), an exact result is written back into it (f32
// storage: the result dequantized; u8 codes with the same parameters: the codes) and the call
// returns the tensor it was given. A result with other parameters is not: the call returns it and
// the storage is marked superseded (Storage::supersede), so reading it through another tensor
// raises ControlFlowError instead of giving the old values.
Tensor write_back_inplace(const Tensor& self, Tensor out, OpKind kind);

// Forgets what this thread kept for the duration of one model call, when its module stack has
// fully unwound: fused weighted ops that wait for their residual add (after an exception cut a
// call short between the two), and the memoized quantization of the last f32 tensor (an input
// buffer the caller rewrites through a raw pointer or Tensor::from_blob between calls keeps its
// storage and version: the next call must quantize it again).
void drop_call_state_on_this_thread() noexcept;

}  // namespace dbrq::tracer
