// ONNX QDQ export (tracer/onnx_export.h): runs the converted model once under a recording
// interceptor that wraps the model's own, and turns each op it executes into ONNX nodes while the
// call's arguments, parameters and converted executor are at hand.
#include "tracer/onnx_export.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/error.h"
#include "core/logging.h"
#include "kernels/int8.h"
#include "quant_state/auto_quant_state.h"
#include "runtime/dispatcher.h"
#include "runtime/op_registry.h"
#include "tracer/executors.h"
#include "tracer/interceptor.h"
#include "tracer/onnx_proto.h"

namespace dbrq {
namespace {

using onnx::Attribute;
using tracer::QuantInterceptor;

constexpr int64_t kOpset = 17;

// A tensor's identity during the recorded call: views and in-place results that share storage
// differ in sizes, strides, offset, dtype or parameters; every tensor seen stays alive (the
// recorder keeps a copy), so a storage address is never reused within one export.
using Key = std::tuple<const void*, int64_t, std::vector<int64_t>, std::vector<int64_t>, int, const void*>;
Key key_of(const Tensor& t) {
  return Key{t.storage().get(), t.storage_offset(), std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
             std::vector<int64_t>(t.strides().begin(), t.strides().end()), static_cast<int>(t.dtype()),
             t.qparams_ptr().get()};
}

onnx::ElemType elem_type(DType d, const char* what) {
  switch (d) {
    case DType::kF32:
      return onnx::kFloat;
    case DType::kU8:
      return onnx::kUint8;
    case DType::kS8:
      return onnx::kInt8;
    case DType::kS32:
      return onnx::kInt32;
    case DType::kS64:
      return onnx::kInt64;
    default:
      DBRQ_THROW(ValueError, "export_onnx: ", what, " has dtype ", dtype_name(d), ", which the exporter does not write");
  }
}

// The logical (row-major) bytes of a tensor, whatever its strides (channels-last included).
std::string logical_bytes(const Tensor& t) {
  const size_t es = dtype_size(t.dtype());
  const int64_t n = t.numel();
  std::string out(static_cast<size_t>(n) * es, '\0');
  const char* base = static_cast<const char*>(t.data_ptr());
  const int nd = static_cast<int>(t.dim());
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (int d = 0; d < nd; ++d) off += idx[static_cast<size_t>(d)] * t.strides()[static_cast<size_t>(d)];
    std::memcpy(&out[static_cast<size_t>(i) * es], base + off * static_cast<int64_t>(es), es);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < t.sizes()[static_cast<size_t>(d)]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
  return out;
}

std::vector<int64_t> dims_of(const Tensor& t) { return std::vector<int64_t>(t.sizes().begin(), t.sizes().end()); }

template <typename T>
std::string raw_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

int64_t wrap(int64_t d, int64_t rank) { return d < 0 ? d + rank : d; }

// What a tensor of the recorded call is in the graph.
struct Value {
  std::string f;         // its float value (a DequantizeLinear output when quantized)
  QuantParamsPtr q;      // dbrq's parameters when it is int8
  DType dtype = DType::kF32;
  bool pending = false;  // a weighted op's output waiting for its fused residual add
  float step = 0.f;      // the scale of the int8 tensor it was dequantized from (model outputs)
  // An fp32 op's output: the int8 input it was computed from (dbrq's tensor, and its value here).
  Tensor feeder;
  std::string feeder_f;
  std::vector<int64_t> dims;
};

class GraphBuilder {
 public:
  onnx::Graph graph;

  std::string fresh(const std::string& hint) {
    std::string base = hint.empty() ? "v" : hint;
    for (char& c : base) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.')) c = '_';
    }
    const int n = counts_[base]++;
    return n == 0 ? base : absl::StrCat(base, "_", n);
  }

  std::string node(const std::string& op, std::vector<std::string> in, const std::string& out_hint,
                   std::vector<Attribute> attrs = {}) {
    onnx::Node n;
    n.op_type = op;
    n.inputs = std::move(in);
    const std::string out = fresh(out_hint);
    n.outputs = {out};
    n.name = fresh("n_" + op);
    n.attributes = std::move(attrs);
    graph.nodes.push_back(std::move(n));
    return out;
  }

  std::string init(const std::string& hint, onnx::ElemType type, std::vector<int64_t> dims, std::string raw) {
    onnx::Initializer t;
    t.name = fresh(hint);
    t.type = type;
    t.dims = std::move(dims);
    t.raw = std::move(raw);
    graph.initializers.push_back(std::move(t));
    return graph.initializers.back().name;
  }
  std::string f32_scalar(float v) {
    auto it = f32_consts_.find(v);
    if (it != f32_consts_.end()) return it->second;
    return f32_consts_[v] = init("c", onnx::kFloat, {}, raw_of(std::vector<float>{v}));
  }
  std::string i64_vec(const std::vector<int64_t>& v) { return init("shape", onnx::kInt64, {static_cast<int64_t>(v.size())}, raw_of(v)); }

  // Scale and zero-point initializers of `q` (per-tensor: scalars; per-channel: vectors).
  std::pair<std::string, std::string> qparam_inits(const QuantParams& q, onnx::ElemType zp_type) {
    const bool pc = q.is_per_channel();
    std::vector<int64_t> dims = pc ? std::vector<int64_t>{static_cast<int64_t>(q.scales.size())} : std::vector<int64_t>{};
    const std::string s = init("scale", onnx::kFloat, dims, raw_of(q.scales));
    std::string zp;
    if (zp_type == onnx::kUint8) {
      std::vector<uint8_t> z(q.zero_points.begin(), q.zero_points.end());
      zp = init("zero_point", onnx::kUint8, dims, raw_of(z));
    } else if (zp_type == onnx::kInt8) {
      std::vector<int8_t> z(q.zero_points.begin(), q.zero_points.end());
      zp = init("zero_point", onnx::kInt8, dims, raw_of(z));
    } else {
      zp = init("zero_point", onnx::kInt32, dims, raw_of(q.zero_points));
    }
    return {s, zp};
  }

  // QuantizeLinear -> DequantizeLinear of a float value with u8 (or s8) parameters `q`.
  std::string qdq(const std::string& f, const QuantParams& q, onnx::ElemType type, const std::string& hint) {
    auto [s, zp] = qparam_inits(q, type);
    std::vector<Attribute> axis;
    if (q.is_per_channel()) axis.push_back(Attribute::Int("axis", q.axis));
    const std::string qv = node("QuantizeLinear", {f, s, zp}, hint + "_q", axis);
    return node("DequantizeLinear", {qv, s, zp}, hint + "_dq", axis);
  }

  // DequantizeLinear of a constant of codes (weights): the initializer and its parameters.
  std::string dq_const(const std::string& hint, onnx::ElemType type, std::vector<int64_t> dims, std::string raw,
                       const QuantParams& q) {
    const std::string c = init(hint, type, std::move(dims), std::move(raw));
    auto [s, zp] = qparam_inits(q, type);
    std::vector<Attribute> axis;
    if (q.is_per_channel()) axis.push_back(Attribute::Int("axis", q.axis));
    return node("DequantizeLinear", {c, s, zp}, hint + "_dq", axis);
  }

 private:
  std::map<std::string, int> counts_;
  std::map<float, std::string> f32_consts_;
};

// Records the converted model's call: forwards every hook to the model's interceptor and writes
// the ops it ran as ONNX nodes.
class Recorder : public Interceptor {
 public:
  explicit Recorder(QuantInterceptor& inner) : inner_(inner) {}

  void add_input(const Tensor& t, size_t k) {
    onnx::ValueInfo v;
    v.name = absl::StrCat("input_", k);
    v.type = elem_type(t.dtype(), "an example input");
    v.dims = dims_of(t);
    b_.graph.inputs.push_back(v);
    Value val;
    val.f = v.name;
    val.dtype = t.dtype();
    val.dims = v.dims;
    DBRQ_ENSURE(!t.is_quantized(), ValueError, "export_onnx: example input ", k, " is quantized; pass f32 inputs");
    bind(t, val);
  }

  void add_output(const Tensor& t, size_t k, OnnxExportSummary* summary, bool int8_inputs) {
    Value v = value_of(t);
    DBRQ_ENSURE(!v.pending, ValueError, "export_onnx: output ", k, " is an unfinished fused result");
    const std::string name = absl::StrCat("output_", k);
    graph_output(name, v.f, t, v.q != nullptr && !v.q->is_per_channel() ? v.q->scale() : v.step, summary);
    if (int8_inputs && v.q == nullptr && v.step == 0.f && v.feeder.defined()) {
      graph_output(name + "_int8_input", v.feeder_f, v.feeder, v.feeder.qparams()->scale(), summary);
    }
  }

  void graph_output(const std::string& name, const std::string& f, const Tensor& t, float step,
                    OnnxExportSummary* summary) {
    onnx::ValueInfo out;
    out.name = name;
    out.type = elem_type(t.is_quantized() ? DType::kF32 : t.dtype(), "an output");
    out.dims = dims_of(t);
    onnx::Node n;
    n.op_type = "Identity";
    n.name = b_.fresh("n_output");
    n.inputs = {f};
    n.outputs = {out.name};
    b_.graph.nodes.push_back(n);
    b_.graph.outputs.push_back(out);
    summary->output_names.push_back(name);
    summary->output_scales.push_back(step);
    InterceptorScope none(nullptr);
    summary->output_values.push_back(t.is_quantized() ? dequantize(t) : t);
  }

  onnx::Graph& graph() { return b_.graph; }

  // Probe of the model's interceptor: the record a converted op ran.
  void on_probe(const SeenOpInfo* op) {
    if (depth_ == 1) {
      probed_ = true;
      probe_op_ = op;
    }
  }
  void set_state(const AutoQuantizationState* s) {
    if (depth_ == 1) probe_state_ = s;
  }

  Tensor on_op(const OpCall& call) override {
    if (depth_ > 0) return inner_.on_op(call);
    ++depth_;
    probed_ = false;
    probe_op_ = nullptr;
    probe_state_ = nullptr;
    Tensor out;
    try {
      out = inner_.on_op(call);
    } catch (...) {
      --depth_;
      throw;
    }
    --depth_;
    keep(call, out);
    emit(call, probe_op_, probe_state_, out);
    return out;
  }

  void on_module_enter(nn::Module& module, absl::Span<Tensor* const> inputs) override {
    std::vector<Tensor> before;
    for (Tensor* t : inputs) before.push_back(*t);
    inner_.on_module_enter(module, inputs);
    rebind(before, inputs);
    if (detail::tls_interceptor == nullptr) {
      // A non-traceable module: the model's interceptor suspended interception inside it.
      DBRQ_THROW(ValueError, "export_onnx: module ", module.type_name(),
                 " is non-traceable (runs fp32 outside the recorded program), so its ops are not recorded; "
                 "it has no ONNX form here");
    }
  }
  void on_module_exit(nn::Module& module, absl::Span<Tensor* const> outputs) override {
    std::vector<Tensor> before;
    for (Tensor* t : outputs) before.push_back(*t);
    inner_.on_module_exit(module, outputs);
    rebind(before, outputs);
  }
  void on_module_unwind(nn::Module& module) noexcept override { inner_.on_module_unwind(module); }
  void on_module_error(nn::Module& module, const Error& error) override { inner_.on_module_error(module, error); }

 private:
  void keep(const OpCall& call, const Tensor& out) {
    for (const Tensor* t : call.inputs) {
      if (t->defined()) kept_.push_back(*t);
    }
    kept_.push_back(out);
  }

  void bind(const Tensor& t, Value v) {
    v.dtype = t.dtype();
    v.dims = dims_of(t);
    values_[key_of(t)] = std::move(v);
  }

  // A hook replaced tensors (dequantized the model's outputs, ...): the new ones get the values of
  // the old, quantized or dequantized as they now are.
  void rebind(const std::vector<Tensor>& before, absl::Span<Tensor* const> after) {
    for (size_t i = 0; i < before.size() && i < after.size(); ++i) {
      const Tensor& a = *after[i];
      if (!a.defined() || !before[i].defined() || key_of(a) == key_of(before[i])) continue;
      kept_.push_back(before[i]);
      kept_.push_back(a);
      Value v = value_of(before[i]);
      if (!a.is_quantized() && v.q != nullptr && !v.q->is_per_channel()) {
        Value d;  // dequantized: the same float value
        d.f = v.f;
        d.step = v.q->scale();
        bind(a, d);
        continue;
      }
      set_output(a, v.f, "io");
    }
  }

  // The graph value of a tensor; a tensor the call did not produce (a parameter used functionally,
  // a constant made in forward) becomes an initializer with its current values.
  Value value_of(const Tensor& t) {
    auto it = values_.find(key_of(t));
    if (it != values_.end()) return it->second;
    DBRQ_ENSURE(t.defined(), ValueError, "export_onnx: an op received an undefined tensor");
    DBRQ_ENSURE(written_inplace_.count(t.storage().get()) == 0, ValueError,
                "export_onnx: a tensor filled by in-place writes through views is read as a whole; the exporter "
                "cannot write that data flow (it would export the values of this call as a constant)");
    kept_.push_back(t);
    Value v;
    if (t.is_quantized()) {
      const onnx::ElemType type = elem_type(t.dtype(), "a quantized constant");
      v.f = b_.dq_const("const", type, dims_of(t), logical_bytes(t), *t.qparams());
      v.q = t.qparams_ptr();
    } else {
      v.f = b_.init("const", elem_type(t.dtype(), "a constant"), dims_of(t), logical_bytes(t));
    }
    bind(t, v);
    return values_[key_of(t)];
  }

  std::string float_of(const Tensor& t) {
    const Value v = value_of(t);
    DBRQ_ENSURE(!v.pending, ValueError,
                "export_onnx: a fused weighted op's result is read before its residual add (data flow the exporter "
                "cannot write)");
    return v.f;
  }

  // The float value of `t` as an int8 op takes it: quantized with `want` (requantized when it
  // has other parameters), or as it is when `want` is null.
  std::string input_as(const Tensor& t, const QuantParamsPtr& want) {
    const Value v = value_of(t);
    DBRQ_ENSURE(!v.pending, ValueError, "export_onnx: a fused weighted op's result is read before its residual add");
    if (want == nullptr) return v.f;
    if (v.q != nullptr && *v.q == *want) return v.f;
    const auto key = std::make_tuple(v.f, want->scales, want->zero_points, want->axis);
    auto it = requant_.find(key);
    if (it != requant_.end()) return it->second;
    return requant_[key] = b_.qdq(v.f, *want, onnx::kUint8, v.f);
  }

  // Binds the op's runtime output to float value `y`: through QuantizeLinear -> DequantizeLinear
  // when dbrq's output is int8.
  void set_output(const Tensor& out, const std::string& y, const std::string& hint) {
    Value v;
    if (out.is_quantized()) {
      v.f = b_.qdq(y, *out.qparams(), elem_type(out.dtype(), "an int8 output"), hint);
      v.q = out.qparams_ptr();
    } else {
      v.f = y;
    }
    bind(out, v);
  }

  [[noreturn]] void unsupported(const OpCall& c, const SeenOpInfo* op, const std::string& why) {
    DBRQ_THROW(ValueError, "export_onnx: ", op_name(c.kind), op != nullptr ? absl::StrCat(" (", op->fqn, ")") : "",
               " has no ONNX form in dbrq's exporter", why.empty() ? "" : ": ", why,
               " (docs/onnx_export.md lists the ops it writes)");
  }

  // An activation of kind `k` with parameters `p` on float value `x`.
  std::string activation(OpKind k, const void* p, const std::string& x, const OpCall* c, const SeenOpInfo* op) {
    const ActivationParams* a = static_cast<const ActivationParams*>(p);
    auto clip = [&](double lo, double hi) {
      return b_.node("Clip", {x, b_.f32_scalar(static_cast<float>(lo)), b_.f32_scalar(static_cast<float>(hi))}, "clip");
    };
    switch (k) {
      case OpKind::kRelu:
        return b_.node("Relu", {x}, "relu");
      case OpKind::kRelu6:
        return clip(0.0, 6.0);
      case OpKind::kHardtanh:
      case OpKind::kClamp:
        return clip(a->alpha, a->beta);
      case OpKind::kLeakyRelu:
        return b_.node("LeakyRelu", {x}, "leaky_relu", {Attribute::Float("alpha", static_cast<float>(a->alpha))});
      case OpKind::kSigmoid:
        return b_.node("Sigmoid", {x}, "sigmoid");
      case OpKind::kTanh:
        return b_.node("Tanh", {x}, "tanh");
      case OpKind::kHardsigmoid:
        return b_.node("HardSigmoid", {x}, "hardsigmoid",
                       {Attribute::Float("alpha", 1.f / 6.f), Attribute::Float("beta", 0.5f)});
      case OpKind::kHardswish:
        return b_.node("HardSwish", {x}, "hardswish");
      case OpKind::kSilu:
        return b_.node("Mul", {x, b_.node("Sigmoid", {x}, "sigmoid")}, "silu");
      case OpKind::kElu:
        return b_.node("Elu", {x}, "elu", {Attribute::Float("alpha", static_cast<float>(a->alpha))});
      case OpKind::kGelu: {
        if (a != nullptr && a->approximate_tanh) {
          // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
          const std::string x3 = b_.node("Mul", {x, b_.node("Mul", {x, x}, "x2")}, "x3");
          const std::string inner = b_.node("Add", {x, b_.node("Mul", {x3, b_.f32_scalar(0.044715f)}, "t")}, "t");
          const std::string th =
              b_.node("Tanh", {b_.node("Mul", {inner, b_.f32_scalar(0.7978845608028654f)}, "t")}, "t");
          const std::string one = b_.node("Add", {th, b_.f32_scalar(1.f)}, "t");
          return b_.node("Mul", {b_.node("Mul", {x, b_.f32_scalar(0.5f)}, "t"), one}, "gelu");
        }
        // 0.5 x (1 + erf(x / sqrt 2)): the form ONNX Runtime fuses into its Gelu kernel.
        const std::string e = b_.node("Erf", {b_.node("Div", {x, b_.f32_scalar(1.4142135623730951f)}, "t")}, "t");
        const std::string one = b_.node("Add", {e, b_.f32_scalar(1.f)}, "t");
        return b_.node("Mul", {b_.node("Mul", {x, one}, "t"), b_.f32_scalar(0.5f)}, "gelu");
      }
      case OpKind::kSoftplus: {
        // (1 / beta) log(1 + exp(beta x)), x where beta x > threshold.
        const float beta = static_cast<float>(a->alpha), threshold = static_cast<float>(a->beta);
        const std::string bx = b_.node("Mul", {x, b_.f32_scalar(beta)}, "t");
        const std::string sp = b_.node("Div", {b_.node("Softplus", {bx}, "t"), b_.f32_scalar(beta)}, "t");
        const std::string over = b_.node("Greater", {bx, b_.f32_scalar(threshold)}, "t");
        return b_.node("Where", {over, x, sp}, "softplus");
      }
      case OpKind::kMish:
        return b_.node("Mul", {x, b_.node("Tanh", {b_.node("Softplus", {x}, "t")}, "t")}, "mish");
      default:
        if (c != nullptr) unsupported(*c, op, "");
        DBRQ_THROW(ValueError, "export_onnx: ", op_name(k), " has no ONNX form in dbrq's exporter");
    }
  }

  // The float values of a weighted op's weight and bias (conv, linear, conv_transpose, prelu's
  // slopes): the s8 codes and folded bias of the int8 kernel, or the f32 parameters when it runs
  // fp32.
  struct WeightVals {
    std::string w, bias;
  };
  WeightVals weighted_inputs(const OpCall& c, const SeenOpInfo* op, const AutoQuantizationState* s, bool int8,
                             const QuantParamsPtr& in_q, bool transpose_linear, bool deconv = false) {
    WeightVals r;
    if (!int8) {
      const Tensor& w = c.input(1);
      if (transpose_linear) {
        r.w = b_.node("Transpose", {float_of(w)}, "weight_t", {Attribute::Ints("perm", {1, 0})});
      } else {
        r.w = float_of(w);
      }
      if (c.num_inputs() > 2 && c.input(2).defined()) r.bias = float_of(c.input(2));
      return r;
    }
    // The int8 form writes the kernel's codes and this call's bias as constants. A weight or bias
    // computed in forward (a hypernetwork's output, `w * g`) is quantized again by dbrq on every
    // call (WeightedExec::kernel); as a constant it would freeze this call's values.
    for (size_t k = 1; k < c.num_inputs() && k <= 2; ++k) {
      const Tensor& t = c.input(k);
      if (t.defined() && !t.storage()->model_state()) {
        unsupported(c, op, absl::StrCat("its ", k == 1 ? "weight" : "bias",
                                        " is computed in forward, not a parameter of the model; the int8 form "
                                        "writes weights as constants (keep this op fp32, qconfig None, to export it)"));
      }
    }
    auto* exec = dynamic_cast<tracer::WeightedExec*>(inner_.executor(op->program_index));
    DBRQ_CHECK(exec != nullptr, "an int8 weighted op without a weighted executor");
    std::shared_ptr<kernels::QWeighted> k = exec->current_kernel();
    const Tensor& qw = k->quantized_weight();
    const QuantParamsPtr& wq = k->weight_qparams();
    DBRQ_ENSURE(qw.dtype() == DType::kS8 && wq != nullptr && (!wq->is_per_channel() || wq->axis == 0), ValueError,
                "export_onnx: ", op_name(c.kind), " (", op->fqn, ") has weights the exporter does not write");
    // The folded bias: the op's bias with every folded batch norm of its chain, as convert folds.
    Tensor w = c.input(1), bias = c.num_inputs() > 2 ? c.input(2) : Tensor();
    if (deconv) {
      // The kernel's codes are output-major [K, C, R, S]; ONNX's ConvTranspose takes [C, K, R, S]:
      // swap the first two dims, the per-channel scales moving to axis 1 (groups 1 only).
      DBRQ_ENSURE(c.p<ConvTranspose2dParams>().groups == 1, ValueError, "export_onnx: conv_transpose2d (", op->fqn,
                  ") with groups > 1 has no ONNX form in dbrq's exporter");
      w = Tensor();  // folded below through the output-major layout
    }
    for (size_t p = 1; op->fusion.fused() && p < op->fusion.members.size(); ++p) {
      const SeenOpInfo& m = s->seen_ops()[static_cast<size_t>(op->fusion.members[p])];
      const OpDef& md = op_def(m.kind);
      if (md.fold == nullptr) continue;
      std::vector<Tensor> stats;
      for (const WeightInfo& wi : m.weights) stats.push_back(wi.tensor);
      InterceptorScope none(nullptr);
      if (!w.defined()) w = op_def(c.kind).int8_weight_layout(c.input(1), c.params);
      md.fold(w, bias, stats, m.params.get(), &w, &bias);
    }
    const std::string name = op->fqn.empty() ? "weight" : op->fqn + ".weight";
    if (deconv) {
      const int64_t k_out = qw.size(0), c_in = qw.size(1), rs = qw.numel() / (k_out * c_in);
      const std::string bytes = logical_bytes(qw);
      std::string t(bytes.size(), '\0');
      for (int64_t k = 0; k < k_out; ++k) {
        for (int64_t ci = 0; ci < c_in; ++ci) {
          std::memcpy(&t[static_cast<size_t>((ci * k_out + k) * rs)], &bytes[static_cast<size_t>((k * c_in + ci) * rs)],
                      static_cast<size_t>(rs));
        }
      }
      QuantParams q = *wq;
      if (q.is_per_channel()) q.axis = 1;
      std::vector<int64_t> dims = dims_of(qw);
      std::swap(dims[0], dims[1]);
      r.w = b_.dq_const(name, onnx::kInt8, dims, t, q);
    } else if (transpose_linear) {
      // [out, in] codes -> [in, out] for MatMul, the per-channel axis with them.
      const int64_t n_out = qw.size(0), n_in = qw.size(1);
      const std::string bytes = logical_bytes(qw);
      std::string t(bytes.size(), '\0');
      for (int64_t o = 0; o < n_out; ++o) {
        for (int64_t i = 0; i < n_in; ++i) t[static_cast<size_t>(i * n_out + o)] = bytes[static_cast<size_t>(o * n_in + i)];
      }
      QuantParams q = *wq;
      if (q.is_per_channel()) q.axis = 1;
      r.w = b_.dq_const(name, onnx::kInt8, {n_in, n_out}, t, q);
    } else {
      r.w = b_.dq_const(name, onnx::kInt8, dims_of(qw), logical_bytes(qw), *wq);
    }
    if (bias.defined()) {
      // s32 with scale input_scale x weight_scale per channel (zero point 0): ONNX Runtime's
      // QLinearConv / QGemm take the bias this way.
      Tensor bc = bias;
      const std::string braw = logical_bytes(bc);
      const int64_t n = bc.numel();
      std::vector<float> scales(static_cast<size_t>(n));
      std::vector<int32_t> codes(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        float bv;
        std::memcpy(&bv, &braw[static_cast<size_t>(i) * 4], 4);
        const float ws = wq->is_per_channel() ? wq->scales[static_cast<size_t>(i)] : wq->scales[0];
        scales[static_cast<size_t>(i)] = in_q->scale() * ws;
        const double code = std::nearbyint(static_cast<double>(bv) / scales[static_cast<size_t>(i)]);
        // dbrq keeps the bias in f32 accumulator units; ONNX's s32 bias cannot hold this one
        // (a channel whose weights are all near zero has a tiny scale): refuse, never clamp.
        DBRQ_ENSURE(code >= -2147483648.0 && code <= 2147483647.0, ValueError, "export_onnx: ", name,
                    ": the bias of output channel ", i, " (", bv, ") is ", code,
                    " steps of input scale x weight scale, beyond ONNX's int32 bias");
        codes[static_cast<size_t>(i)] = static_cast<int32_t>(code);
      }
      auto bq = QuantParams::per_channel(scales, std::vector<int32_t>(static_cast<size_t>(n), 0), 0);
      r.bias = b_.dq_const(name + "_bias", onnx::kInt32, {n}, raw_of(codes), *bq);
    }
    return r;
  }

  // The base op of a fused chain: the chain's activations after it (folded batch norms skipped),
  // up to a residual add, which comes as its own call.
  std::string chain_tail(const SeenOpInfo* op, const AutoQuantizationState* s, std::string y, size_t from,
                         bool weighted) {
    if (op == nullptr || !op->fusion.fused()) return y;
    for (size_t p = from; p < op->fusion.members.size(); ++p) {
      const SeenOpInfo& m = s->seen_ops()[static_cast<size_t>(op->fusion.members[p])];
      if (m.fusion.residual_input >= 0) break;
      if (weighted && op_def(m.kind).fold != nullptr) continue;
      y = activation(m.kind, m.params.get(), y, nullptr, &m);
    }
    return y;
  }

  // A fused residual add: the weighted op's pending (unquantized) result plus input `r`, the
  // residual, brought to the parameters the kernel's sum takes.
  std::string residual_sum(const OpCall& c, const SeenOpInfo* op, int r) {
    Value pending = value_of(c.input(static_cast<size_t>(1 - r)));
    DBRQ_CHECK(pending.pending, "a fused residual add without its weighted op's pending result");
    QuantParamsPtr want = static_cast<size_t>(r) < op->executor->input_qparams.size()
                              ? op->executor->input_qparams[static_cast<size_t>(r)]
                              : nullptr;
    const std::string res = input_as(c.input(static_cast<size_t>(r)), want);
    return b_.node("Add", {pending.f, res}, "residual_add");
  }

  // Whether the int8 weighted op `op` (a chain's base, or alone) leaves its result pending for a
  // residual add: one in its chain, or one of another module that its chain's last op absorbs.
  bool waits_for_residual(const SeenOpInfo* op) {
    for (const SeenOpInfo* m : inner_.model().chain_after(*op)) {
      if (m->fusion.residual_input >= 0 || (m->absorbed_by >= 0 && op_def(m->kind).residual_add)) return true;
    }
    return false;
  }

  void emit(const OpCall& c, const SeenOpInfo* op, const AutoQuantizationState* s, const Tensor& out) {
    // A fused chain's later member whose input is not the chain's inner tensor (its base ran fp32:
    // it saw infinities or a mask; or the member's record also follows an fp32 record) computes
    // itself in fp32, as the interceptor runs it (QuantInterceptor::seen_op, fp32_member).
    const bool fp32_member = op != nullptr && op->fusion.fused() && op->fusion.position > 0 &&
                             std::none_of(c.inputs.begin(), c.inputs.end(), [](const Tensor* t) {
                               return t->defined() && QuantInterceptor::is_inner_fused(*t);
                             });
    const bool int8 = op != nullptr && op->executor != nullptr && !op->executor->fp32 && !fp32_member;
    if (int8 && op->qconfig != nullptr && op->qconfig->is_dynamic()) {
      unsupported(c, op, "dynamic quantization (parameters computed per call) is not exported");
    }
    // A residual add absorbed from another module's chain (SeenOpInfo::absorbs): the weighted
    // op's pending result plus the residual, then the add's own chain (its relu).
    if (int8 && op->absorbed_by >= 0 && op_def(op->kind).residual_add) {
      const int r = 1 - op->absorbed_input;
      set_output(out, chain_tail(op, s, residual_sum(c, op, r), 1, false), "residual_add");
      return;
    }
    // A member of a fused chain after its base.
    if (int8 && op->fusion.fused() && op->fusion.position > 0) {
      if (op->fusion.residual_input < 0) {
        bind(out, value_of(c.input(0)));  // the base already wrote the chain
        return;
      }
      std::string y = residual_sum(c, op, op->fusion.residual_input);
      const SeenOpInfo& base = s->seen_ops()[static_cast<size_t>(op->fusion.base)];
      y = chain_tail(&base, s, y, static_cast<size_t>(op->fusion.position) + 1, true);
      set_output(out, y, "residual_add");
      return;
    }
    if (c.inplace && c.input(0).defined()) {
      // An in-place write is a new value of its tensor; through a view it would also change the
      // tensors sharing its storage, which the graph cannot say: refuse rather than export stale data.
      const void* storage = c.input(0).storage().get();
      const Key self = key_of(c.input(0));
      for (const auto& [k, v] : values_) {
        if (std::get<0>(k) == storage && k != self && std::get<0>(k) != nullptr) {
          unsupported(c, op, "it writes in place into a tensor that another tensor of the call views");
        }
      }
      written_inplace_.insert(storage);
    }
    const OpDef& def = op_def(c.kind);
    const size_t n_act = def.activation_inputs(c.num_inputs());
    auto in = [&](size_t k) -> std::string {
      QuantParamsPtr want;
      if (int8 && k < n_act && k < op->executor->input_qparams.size()) want = op->executor->input_qparams[k];
      return input_as(c.input(k), want);
    };
    const int64_t in_rank = c.num_inputs() > 0 && c.input(0).defined() ? c.input(0).dim() : 0;
    std::string y;
    bool weighted = false;
    switch (c.kind) {
      case OpKind::kConv2d:
      case OpKind::kConv1d: {
        weighted = true;
        const std::string x = in(0);
        const WeightVals w =
            weighted_inputs(c, op, s, int8, int8 ? op->executor->input_qparams.at(0) : nullptr, false);
        std::vector<int64_t> stride, pad, dil, kernel;
        int64_t groups;
        if (c.kind == OpKind::kConv2d) {
          const auto& p = c.p<Conv2dParams>();
          stride = {p.stride[0], p.stride[1]};
          pad = {p.padding[0], p.padding[1], p.padding[0], p.padding[1]};
          dil = {p.dilation[0], p.dilation[1]};
          kernel = {c.input(1).size(2), c.input(1).size(3)};
          groups = p.groups;
        } else {
          const auto& p = c.p<Conv1dParams>();
          stride = {p.stride};
          pad = {p.padding, p.padding};
          dil = {p.dilation};
          kernel = {c.input(1).size(2)};
          groups = p.groups;
        }
        std::vector<std::string> ins = {x, w.w};
        if (!w.bias.empty()) ins.push_back(w.bias);
        y = b_.node("Conv", ins, "conv",
                    {Attribute::Ints("strides", stride), Attribute::Ints("pads", pad), Attribute::Ints("dilations", dil),
                     Attribute::Ints("kernel_shape", kernel), Attribute::Int("group", groups)});
        break;
      }
      case OpKind::kConvTranspose2d: {
        weighted = true;
        const auto& p = c.p<ConvTranspose2dParams>();
        const std::string x = in(0);
        const WeightVals w =
            weighted_inputs(c, op, s, int8, int8 ? op->executor->input_qparams.at(0) : nullptr, false, int8);
        std::vector<std::string> ins = {x, w.w};
        if (!w.bias.empty()) ins.push_back(w.bias);
        // PyTorch's weight [C, K/groups, R, S] is ONNX's layout already (fp32).
        y = b_.node("ConvTranspose", ins, "conv_transpose2d",
                    {Attribute::Ints("strides", {p.stride[0], p.stride[1]}),
                     Attribute::Ints("pads", {p.padding[0], p.padding[1], p.padding[0], p.padding[1]}),
                     Attribute::Ints("dilations", {p.dilation[0], p.dilation[1]}),
                     Attribute::Ints("output_padding", {p.output_padding[0], p.output_padding[1]}),
                     Attribute::Ints("kernel_shape", {c.input(1).size(2), c.input(1).size(3)}),
                     Attribute::Int("group", p.groups)});
        break;
      }
      case OpKind::kLinear: {
        weighted = true;
        const std::string x = in(0);
        const bool two_d = in_rank == 2;
        const WeightVals w =
            weighted_inputs(c, op, s, int8, int8 ? op->executor->input_qparams.at(0) : nullptr, !two_d);
        if (two_d) {
          std::vector<std::string> ins = {x, w.w};
          if (!w.bias.empty()) ins.push_back(w.bias);
          y = b_.node("Gemm", ins, "linear", {Attribute::Int("transB", 1)});
        } else {
          y = b_.node("MatMul", {x, w.w}, "linear");
          if (!w.bias.empty()) y = b_.node("Add", {y, w.bias}, "linear");
        }
        break;
      }
      case OpKind::kMatmul:
        y = b_.node("MatMul", {in(0), in(1)}, "matmul");
        break;
      case OpKind::kEmbedding:
        if (int8) unsupported(c, op, "int8 embedding");
        y = b_.node("Gather", {float_of(c.input(1)), float_of(c.input(0))}, "embedding");
        break;
      case OpKind::kBatchNorm: {
        const std::string x = in(0);
        const Tensor& mean = c.input(1);
        const int64_t n = mean.numel();
        auto or_const = [&](size_t k, float v) {
          if (c.num_inputs() > k && c.input(k).defined()) return float_of(c.input(k));
          return b_.init("bn", onnx::kFloat, {n}, raw_of(std::vector<float>(static_cast<size_t>(n), v)));
        };
        const std::string gamma = or_const(3, 1.f), beta = or_const(4, 0.f);
        y = b_.node("BatchNormalization", {x, gamma, beta, float_of(mean), float_of(c.input(2))}, "batch_norm",
                    {Attribute::Float("epsilon", static_cast<float>(c.p<NormParams>().eps))});
        break;
      }
      case OpKind::kLayerNorm: {
        const auto& p = c.p<NormParams>();
        const std::string x = in(0);
        int64_t n = 1;
        for (int64_t d : p.normalized_shape) n *= d;
        std::vector<int64_t> shape(p.normalized_shape.begin(), p.normalized_shape.end());
        auto or_const = [&](size_t k, float v) {
          if (c.num_inputs() > k && c.input(k).defined()) return float_of(c.input(k));
          return b_.init("ln", onnx::kFloat, shape, raw_of(std::vector<float>(static_cast<size_t>(n), v)));
        };
        const std::string gamma = or_const(1, 1.f), beta = or_const(2, 0.f);
        y = b_.node("LayerNormalization", {x, gamma, beta}, "layer_norm",
                    {Attribute::Int("axis", -static_cast<int64_t>(p.normalized_shape.size())),
                     Attribute::Float("epsilon", static_cast<float>(p.eps))});
        break;
      }
      case OpKind::kAdd:
      case OpKind::kSub:
      case OpKind::kMul:
      case OpKind::kDiv: {
        const char* name = c.kind == OpKind::kAdd ? "Add" : c.kind == OpKind::kSub ? "Sub" : c.kind == OpKind::kMul ? "Mul" : "Div";
        ScalarAffine affine;
        const OpDef& sd = op_def(c.kind);
        if (c.has_scalar && int8 && sd.scalar_affine != nullptr && sd.scalar_affine(c.scalar, c.scalar_first, &affine) &&
            affine.shift && !op->executor->input_qparams.empty() && op->executor->input_qparams[0] != nullptr) {
          // dbrq's int8 x + c (x - c: c negated) adds c rounded to the input's grid, as PyTorch's
          // add_scalar shifts the zero point by round(c / s) (ScalarExec::derive): the graph adds
          // that value, not c (with c = 1.26 on a scale of 0.1, 101 of 256 codes differed by a step
          // where the shift leaves [0, 255] and the output is rescaled).
          const double s_in = op->executor->input_qparams[0]->scale();
          const double shift = static_cast<double>(tracer::ScalarExec::shift_steps(affine.c, s_in)) * s_in;
          y = b_.node("Add", {in(0), b_.f32_scalar(static_cast<float>(shift))}, op_name(c.kind));
        } else if (c.has_scalar) {
          const std::string x = in(0), k = b_.f32_scalar(static_cast<float>(c.scalar));
          y = c.scalar_first ? b_.node(name, {k, x}, op_name(c.kind)) : b_.node(name, {x, k}, op_name(c.kind));
        } else {
          y = b_.node(name, {in(0), in(1)}, op_name(c.kind));
        }
        break;
      }
      case OpKind::kRelu:
      case OpKind::kRelu6:
      case OpKind::kHardtanh:
      case OpKind::kClamp:
      case OpKind::kLeakyRelu:
      case OpKind::kSigmoid:
      case OpKind::kTanh:
      case OpKind::kHardsigmoid:
      case OpKind::kHardswish:
      case OpKind::kSilu:
      case OpKind::kGelu:
      case OpKind::kElu:
      case OpKind::kSoftplus:
      case OpKind::kMish:
        y = activation(c.kind, c.params, in(0), &c, op);
        break;
      case OpKind::kPrelu: {
        const Tensor& w = c.input(1);
        std::vector<int64_t> shape = {w.numel()};
        for (int64_t d = 2; d < in_rank; ++d) shape.push_back(1);
        if (in_rank < 2) shape = {w.numel()};
        // int8: the s8 slopes the kernel runs, with their scales (a per-tensor weight qconfig rounds
        // every channel's slope to one grid); fp32: the parameter.
        const std::string wv = weighted_inputs(c, op, s, int8, nullptr, false).w;
        const std::string slope = b_.node("Reshape", {wv, b_.i64_vec(shape)}, "prelu_slope");
        y = b_.node("PRelu", {in(0), slope}, "prelu");
        break;
      }
      case OpKind::kSoftmax:
      case OpKind::kLogSoftmax:
        y = b_.node(c.kind == OpKind::kSoftmax ? "Softmax" : "LogSoftmax", {in(0)}, op_name(c.kind),
                    {Attribute::Int("axis", wrap(c.p<DimParams>().dims.at(0), in_rank))});
        if (c.kind == OpKind::kSoftmax && out.is_quantized() && out.dtype() == DType::kU8 &&
            !out.qparams()->is_per_channel()) {
          // Min(p, top) with top the largest value the u8 output represents: the QuantizeLinear
          // after it saturates there anyway, so the graph means what dbrq computes. It keeps ONNX
          // Runtime (1.30) from fusing DQ -> Softmax -> Q into its QLinearSoftmax, which turns a
          // probability that rounds to 1.0 with the fixed parameters (1/256, 0) into code 0
          // instead of 255 (256 wraps around): every one-key row of causal attention, and any
          // row with one dominant score (docs/onnx_export.md).
          const float top = static_cast<float>(255 - out.q_zero_point()) * out.q_scale();
          y = b_.node("Min", {y, b_.f32_scalar(top)}, "softmax_saturate");
        }
        break;
      case OpKind::kMaxPool2d:
      case OpKind::kAvgPool2d: {
        const auto& p = c.p<Pool2dParams>();
        std::vector<Attribute> attrs = {Attribute::Ints("kernel_shape", {p.kernel_size[0], p.kernel_size[1]}),
                                        Attribute::Ints("strides", {p.stride[0], p.stride[1]}),
                                        Attribute::Ints("pads", {p.padding[0], p.padding[1], p.padding[0], p.padding[1]}),
                                        Attribute::Int("ceil_mode", p.ceil_mode ? 1 : 0)};
        if (c.kind == OpKind::kMaxPool2d) {
          attrs.push_back(Attribute::Ints("dilations", {p.dilation[0], p.dilation[1]}));
          y = b_.node("MaxPool", {in(0)}, "max_pool2d", attrs);
        } else {
          attrs.push_back(Attribute::Int("count_include_pad", p.count_include_pad ? 1 : 0));
          y = b_.node("AveragePool", {in(0)}, "avg_pool2d", attrs);
        }
        break;
      }
      case OpKind::kMaxPool1d:
      case OpKind::kAvgPool1d: {
        // Pool2dParams with the length on index 1.
        const auto& p = c.p<Pool2dParams>();
        std::vector<Attribute> attrs = {Attribute::Ints("kernel_shape", {p.kernel_size[1]}),
                                        Attribute::Ints("strides", {p.stride[1]}),
                                        Attribute::Ints("pads", {p.padding[1], p.padding[1]}),
                                        Attribute::Int("ceil_mode", p.ceil_mode ? 1 : 0)};
        if (c.kind == OpKind::kMaxPool1d) {
          attrs.push_back(Attribute::Ints("dilations", {p.dilation[1]}));
          y = b_.node("MaxPool", {in(0)}, "max_pool1d", attrs);
        } else {
          attrs.push_back(Attribute::Int("count_include_pad", p.count_include_pad ? 1 : 0));
          y = b_.node("AveragePool", {in(0)}, "avg_pool1d", attrs);
        }
        break;
      }
      case OpKind::kAdaptiveAvgPool1d: {
        const int64_t l = c.input(0).size(2), ol = c.p<AdaptivePool2dParams>().output_size[1];
        if (ol == 1) {
          y = b_.node("GlobalAveragePool", {in(0)}, "adaptive_avg_pool1d");
        } else if (l % ol == 0) {
          y = b_.node("AveragePool", {in(0)}, "adaptive_avg_pool1d",
                      {Attribute::Ints("kernel_shape", {l / ol}), Attribute::Ints("strides", {l / ol})});
        } else {
          unsupported(c, op, absl::StrCat("output length ", ol, " does not divide the input's ", l));
        }
        break;
      }
      case OpKind::kAdaptiveAvgPool2d: {
        const auto& p = c.p<AdaptivePool2dParams>();
        const int64_t h = c.input(0).size(2), w = c.input(0).size(3);
        const int64_t oh = p.output_size[0], ow = p.output_size[1];
        if (oh == 1 && ow == 1) {
          y = b_.node("GlobalAveragePool", {in(0)}, "adaptive_avg_pool2d");
        } else if (h % oh == 0 && w % ow == 0) {
          y = b_.node("AveragePool", {in(0)}, "adaptive_avg_pool2d",
                      {Attribute::Ints("kernel_shape", {h / oh, w / ow}), Attribute::Ints("strides", {h / oh, w / ow})});
        } else {
          unsupported(c, op, absl::StrCat("output size ", oh, "x", ow, " does not divide the input's ", h, "x", w));
        }
        break;
      }
      case OpKind::kMean:
      case OpKind::kSum: {
        const auto& p = c.p<DimParams>();
        std::vector<int64_t> axes;
        for (int64_t d : p.dims) axes.push_back(wrap(d, in_rank));
        if (axes.empty()) {
          for (int64_t d = 0; d < in_rank; ++d) axes.push_back(d);
        }
        if (c.kind == OpKind::kMean) {
          y = b_.node("ReduceMean", {in(0)}, "mean", {Attribute::Ints("axes", axes), Attribute::Int("keepdims", p.keepdim)});
        } else {
          y = b_.node("ReduceSum", {in(0), b_.i64_vec(axes)}, "sum", {Attribute::Int("keepdims", p.keepdim)});
        }
        break;
      }
      case OpKind::kCat:
      case OpKind::kStack: {
        std::vector<std::string> ins;
        const int64_t rank = c.kind == OpKind::kStack ? in_rank + 1 : in_rank;
        const int64_t axis = wrap(c.p<DimParams>().dims.at(0), rank);
        for (size_t k = 0; k < c.num_inputs(); ++k) {
          std::string x = in(k);
          if (c.kind == OpKind::kStack) x = b_.node("Unsqueeze", {x, b_.i64_vec({axis})}, "stack_in");
          ins.push_back(x);
        }
        y = b_.node("Concat", ins, op_name(c.kind), {Attribute::Int("axis", axis)});
        break;
      }
      case OpKind::kFlatten:
      case OpKind::kReshape:
      case OpKind::kUnsqueeze:
      case OpKind::kSqueeze:
        // Shapes are the example's: the output's sizes as a constant.
        y = b_.node("Reshape", {in(0), b_.i64_vec(dims_of(out))}, op_name(c.kind));
        break;
      case OpKind::kExpand:
        y = b_.node("Expand", {in(0), b_.i64_vec(dims_of(out))}, "expand");
        break;
      case OpKind::kPermute: {
        std::vector<int64_t> perm;
        for (int64_t d : c.p<ShapeParams>().sizes) perm.push_back(wrap(d, in_rank));
        y = b_.node("Transpose", {in(0)}, "permute", {Attribute::Ints("perm", perm)});
        break;
      }
      case OpKind::kTranspose: {
        const auto& p = c.p<ShapeParams>();
        std::vector<int64_t> perm;
        for (int64_t d = 0; d < in_rank; ++d) perm.push_back(d);
        if (in_rank > 0) std::swap(perm[static_cast<size_t>(wrap(p.start, in_rank))], perm[static_cast<size_t>(wrap(p.length, in_rank))]);
        y = b_.node("Transpose", {in(0)}, "transpose", {Attribute::Ints("perm", perm)});
        break;
      }
      case OpKind::kNarrow: {
        const auto& p = c.p<ShapeParams>();
        const int64_t d = wrap(p.sizes.at(0), in_rank), step = p.sizes.size() > 1 ? p.sizes[1] : 1;
        const int64_t start = p.start < 0 ? p.start + c.input(0).size(d) : p.start;  // narrow(d, -1, 1): the last
        y = b_.node("Slice", {in(0), b_.i64_vec({start}), b_.i64_vec({start + p.length}), b_.i64_vec({d}), b_.i64_vec({step})},
                    "narrow");
        break;
      }
      case OpKind::kSelect: {
        const auto& p = c.p<ShapeParams>();
        const int64_t d = wrap(p.sizes.at(0), in_rank);
        const int64_t i = p.start < 0 ? p.start + c.input(0).size(d) : p.start;
        const std::string sl = b_.node("Slice", {in(0), b_.i64_vec({i}), b_.i64_vec({i + 1}), b_.i64_vec({d})}, "select");
        y = b_.node("Reshape", {sl, b_.i64_vec(dims_of(out))}, "select");
        break;
      }
      case OpKind::kRepeat: {
        std::vector<int64_t> od = dims_of(out), id = dims_of(c.input(0));
        std::vector<int64_t> padded(od.size() - id.size(), 1);
        padded.insert(padded.end(), id.begin(), id.end());
        std::string x = in(0);
        if (id.size() != od.size()) x = b_.node("Reshape", {x, b_.i64_vec(padded)}, "repeat_in");
        std::vector<int64_t> reps;
        for (size_t i = 0; i < od.size(); ++i) reps.push_back(od[i] / padded[i]);
        y = b_.node("Tile", {x, b_.i64_vec(reps)}, "repeat");
        break;
      }
      case OpKind::kPad: {
        const auto& p = c.p<PadParams>();
        std::vector<int64_t> pads(static_cast<size_t>(2 * in_rank), 0);
        // PyTorch's pads: (left, right) pairs from the last dim backwards.
        for (size_t j = 0; j + 1 < p.pads.size() + 1 && j / 2 < static_cast<size_t>(in_rank); j += 2) {
          const size_t d = static_cast<size_t>(in_rank) - 1 - j / 2;
          pads[d] = p.pads[j];
          pads[d + static_cast<size_t>(in_rank)] = p.pads[j + 1];
        }
        const char* mode = p.mode == 0 ? "constant" : p.mode == 1 ? "reflect" : "edge";
        std::vector<std::string> ins = {in(0), b_.i64_vec(pads)};
        if (p.mode == 0) ins.push_back(b_.f32_scalar(static_cast<float>(p.value)));
        for (int64_t v : pads) {
          if (v < 0) unsupported(c, op, "negative padding");
        }
        y = b_.node("Pad", ins, "pad", {Attribute::String("mode", mode)});
        break;
      }
      case OpKind::kSqrt:
        y = b_.node("Sqrt", {in(0)}, "sqrt");
        break;
      case OpKind::kExp:
        y = b_.node("Exp", {in(0)}, "exp");
        break;
      case OpKind::kContiguous:
      case OpKind::kDropout:
      case OpKind::kIdentity:
      case OpKind::kClone:
      case OpKind::kDequantize:
        y = b_.node("Identity", {float_of(c.input(0))}, op_name(c.kind));
        break;
      case OpKind::kTo: {
        const DType from = c.input(0).is_quantized() ? DType::kF32 : c.input(0).dtype();
        const DType to = out.is_quantized() ? DType::kF32 : out.dtype();
        y = from == to ? b_.node("Identity", {float_of(c.input(0))}, "to")
                       : b_.node("Cast", {float_of(c.input(0))}, "to", {Attribute::Int("to", elem_type(to, "to's output"))});
        break;
      }
      case OpKind::kCopy: {
        // self.copy_(src): self's sizes and dtype with src's values (broadcast).
        std::string v = float_of(c.input(1));
        const DType from = c.input(1).is_quantized() ? DType::kF32 : c.input(1).dtype();
        const DType to = out.is_quantized() ? DType::kF32 : out.dtype();
        if (from != to) v = b_.node("Cast", {v}, "copy", {Attribute::Int("to", elem_type(to, "copy_'s output"))});
        y = dims_of(c.input(1)) == dims_of(out) ? b_.node("Identity", {v}, "copy")
                                                : b_.node("Expand", {v, b_.i64_vec(dims_of(out))}, "copy");
        break;
      }
      case OpKind::kQuantize:
        y = b_.node("Identity", {float_of(c.input(0))}, "quantize");
        break;
      default:
        unsupported(c, op, "");
    }
    if (int8 && op->fusion.fused() && op->fusion.position == 0) y = chain_tail(op, s, y, 1, weighted);
    if (int8 && weighted && waits_for_residual(op)) {
      Value v;
      v.f = y;
      v.pending = true;
      bind(out, v);
      return;
    }
    set_output(out, y, op_name(c.kind));
    if (!out.is_quantized() && !int8) {
      // An fp32 op: remember the int8 tensor it read (for int8_inputs_of_fp32_outputs).
      for (size_t k = 0; k < n_act && k < c.num_inputs(); ++k) {
        const Tensor& t = c.input(k);
        if (t.defined() && t.is_quantized() && !t.qparams()->is_per_channel()) {
          Value& v = values_[key_of(out)];
          v.feeder = t;
          v.feeder_f = value_of(t).f;
          break;
        }
      }
    }
  }

  QuantInterceptor& inner_;
  GraphBuilder b_;
  int depth_ = 0;
  bool probed_ = false;
  const SeenOpInfo* probe_op_ = nullptr;
  const AutoQuantizationState* probe_state_ = nullptr;
  std::map<Key, Value> values_;
  std::map<std::tuple<std::string, std::vector<float>, std::vector<int32_t>, int64_t>, std::string> requant_;
  std::vector<Tensor> kept_;
  std::set<const void*> written_inplace_;  // storages an in-place op wrote during the call
};

// Clears the probes however the export ends.
class ProbeGuard {
 public:
  ProbeGuard(QuantInterceptor& qi, const QuantInterceptor::Probes* p) : qi_(qi) {
    DBRQ_ENSURE(qi_.set_probes(p), UsageError,
                "export_onnx: another thread is comparing or exporting this model; export it when that is done");
  }
  ~ProbeGuard() { qi_.clear_probes(); }

 private:
  QuantInterceptor& qi_;
};

}  // namespace

std::string export_onnx_bytes(nn::Module& model, const std::vector<Tensor>& example_inputs,
                              const OnnxExportOptions& options, OnnxExportSummary* summary) {
  OnnxExportSummary local;
  if (summary == nullptr) summary = &local;
  *summary = OnnxExportSummary();
  QuantInterceptor& qi = QuantInterceptor::of(model, "export_onnx");
  DBRQ_ENSURE(qi.model().phase() == Phase::kConverted, UsageError, "export_onnx: ", model.type_name(),
              " is prepared but not converted (phase: ", phase_name(qi.model().phase()),
              "); calibrate it and call dbrq::convert first: the export writes the converted int8 program");
  DBRQ_ENSURE(!example_inputs.empty(), ValueError, "export_onnx: example_inputs is empty; pass the tensors forward takes");
  DBRQ_ENSURE(detail::tls_interceptor == nullptr, UsageError,
              "export_onnx: called while an interceptor is installed on this thread (inside a model's call?)");
  Recorder rec(qi);
  for (size_t k = 0; k < example_inputs.size(); ++k) {
    DBRQ_ENSURE(example_inputs[k].defined(), ValueError, "export_onnx: example input ", k, " is undefined");
    rec.add_input(example_inputs[k], k);
  }
  QuantInterceptor::Probes probes;
  probes.op = [&rec](const AutoQuantizationState& s, const SeenOpInfo* op, OpKind, const std::string&, const Tensor&) {
    rec.set_state(&s);
    rec.on_probe(op);
  };
  probes.module = [](const AutoQuantizationState&, bool, const std::array<uint64_t, 4>&, absl::Span<Tensor* const>) {};
  std::vector<Tensor> outputs;
  {
    ProbeGuard guard(qi, &probes);
    InterceptorScope scope(&rec);
    outputs = model.forward_tensors(example_inputs);
  }
  for (size_t k = 0; k < outputs.size(); ++k) rec.add_output(outputs[k], k, summary, options.int8_inputs_of_fp32_outputs);
  // A static graph holds one path: say so when the model has run others (calibrated, or run fp32
  // after convert; the ONNX model would compute another function on inputs taking them).
  for (const AutoQuantizationState* st : qi.model().states()) {
    const size_t n = st->paths().size();
    if (n < 2) continue;
    summary->modules_with_other_paths.push_back(st->fqn());
    log()->warn(
        "export_onnx: module \"{}\" ({}) has run {} control-flow paths (calibrated, or run fp32 after convert); the "
        "ONNX graph holds only the one this example takes (export once per path you deploy, docs/onnx_export.md)",
        st->fqn(), st->type_name(), n);
  }
  onnx::Graph& g = rec.graph();
  g.name = options.graph_name;
  std::string bytes = onnx::encode_model(g, kOpset, "1.0", options.doc_string);
  summary->nodes = static_cast<int64_t>(g.nodes.size());
  for (const onnx::Node& n : g.nodes) summary->quantize_nodes += n.op_type == "QuantizeLinear" ? 1 : 0;
  summary->initializers = static_cast<int64_t>(g.initializers.size());
  summary->bytes = static_cast<int64_t>(bytes.size());
  return bytes;
}

OnnxExportSummary export_onnx(nn::Module& model, const std::vector<Tensor>& example_inputs, const std::string& path,
                              const OnnxExportOptions& options) {
  DBRQ_ENSURE(!path.empty(), IOError, "export_onnx: the output path is empty");
  OnnxExportSummary summary;
  const std::string bytes = export_onnx_bytes(model, example_inputs, options, &summary);
  // A temporary file next to the target, renamed over it when complete.
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    DBRQ_ENSURE(f.good(), IOError, "export_onnx: cannot write \"", path, "\" (opening \"", tmp,
                "\" failed: ", std::strerror(errno), ")");
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f.good()) {
      f.close();
      std::remove(tmp.c_str());
      DBRQ_THROW(IOError, "export_onnx: writing \"", tmp, "\" failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    DBRQ_THROW(IOError, "export_onnx: cannot write \"", path, "\" (", why, ")");
  }
  return summary;
}

}  // namespace dbrq
