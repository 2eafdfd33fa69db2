// Dispatcher and module interception tests: every functional op, operator overload and dispatching
// Tensor method reaches Interceptor::on_op with the right OpKind and flags; module calls nest
// (enter/exit/unwind) and expose their tensor arguments and results, which the interceptor may
// rewrite; Module::set_interceptor and InterceptorScope(nullptr); thread-locality; and that a
// pass-through or argument-substituting interceptor gives the eager results.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using nn::Module;
using testing::expect_close;
using testing::expect_equal;

struct OpRecord {
  OpKind kind;
  size_t num_inputs;
  bool has_scalar;
  bool scalar_first;
  bool inplace;
  double scalar;
  const Tensor* first_input;
};

struct ModuleRecord {
  std::string event;  // "enter", "exit", "unwind"
  std::string type;
  size_t num_tensors;
};

// Records every op and module event (as a readable trace too) and runs ops eagerly.
class Recorder : public Interceptor {
 public:
  Tensor on_op(const OpCall& c) override {
    ops.push_back({c.kind, c.num_inputs(), c.has_scalar, c.scalar_first, c.inplace, c.scalar,
                   c.num_inputs() > 0 ? c.inputs[0] : nullptr});
    trace.push_back(std::string("op ") + op_name(c.kind));
    if (op_hook) {
      if (std::optional<Tensor> r = op_hook(c)) return *r;
    }
    return c.run(c);
  }
  void on_module_enter(Module& m, absl::Span<Tensor* const> inputs) override {
    modules.push_back({"enter", m.type_name(), inputs.size()});
    trace.push_back("enter " + m.type_name());
    if (enter_hook) enter_hook(m, inputs);
  }
  void on_module_exit(Module& m, absl::Span<Tensor* const> outputs) override {
    modules.push_back({"exit", m.type_name(), outputs.size()});
    trace.push_back("exit " + m.type_name());
    if (exit_hook) exit_hook(m, outputs);
  }
  void on_module_unwind(Module& m) noexcept override {
    modules.push_back({"unwind", m.type_name(), 0});
    trace.push_back("unwind " + m.type_name());
  }

  // Clears and returns what was recorded.
  std::vector<OpRecord> take_ops() {
    auto out = std::move(ops);
    ops.clear();
    trace.clear();
    modules.clear();
    return out;
  }
  std::vector<OpKind> kinds() const {
    std::vector<OpKind> out;
    for (auto& r : ops) out.push_back(r.kind);
    return out;
  }

  std::vector<OpRecord> ops;
  std::vector<ModuleRecord> modules;
  std::vector<std::string> trace;
  std::function<std::optional<Tensor>(const OpCall&)> op_hook;
  std::function<void(Module&, absl::Span<Tensor* const>)> enter_hook;
  std::function<void(Module&, absl::Span<Tensor* const>)> exit_hook;
};

// Runs `f` with a fresh recorder installed and returns the single op it recorded.
template <typename F>
OpRecord only_op(F&& f) {
  Recorder rec;
  {
    InterceptorScope scope(&rec);
    f();
  }
  EXPECT_EQ(rec.ops.size(), 1u);
  if (rec.ops.empty()) return {OpKind::kNumOpKinds, 0, false, false, false, 0.0, nullptr};
  return rec.ops[0];
}

void expect_op(const OpRecord& r, OpKind kind, size_t num_inputs, const std::string& what) {
  EXPECT_EQ(r.kind, kind) << what << ": got " << (r.kind == OpKind::kNumOpKinds ? "none" : op_name(r.kind)) << ", want "
                          << op_name(kind);
  EXPECT_EQ(r.num_inputs, num_inputs) << what;
  EXPECT_FALSE(r.has_scalar) << what;
  EXPECT_FALSE(r.inplace) << what;
}

void expect_scalar_op(const OpRecord& r, OpKind kind, double scalar, bool scalar_first, const std::string& what) {
  EXPECT_EQ(r.kind, kind) << what;
  EXPECT_EQ(r.num_inputs, 1u) << what;
  EXPECT_TRUE(r.has_scalar) << what;
  EXPECT_EQ(r.scalar_first, scalar_first) << what;
  EXPECT_EQ(r.scalar, scalar) << what;
  EXPECT_FALSE(r.inplace) << what;
}

// ---------------------------------------------------------------------------------------------
// ops reach on_op

TEST(DispatchOps, ComputeOps) {
  Tensor x = randn({1, 2, 5, 5}, 1), w = randn({3, 2, 3, 3}, 2), b = randn({3}, 3);
  expect_op(only_op([&] { conv2d(x, w, b); }), OpKind::kConv2d, 3, "conv2d");
  expect_op(only_op([&] { conv2d(x, w); }), OpKind::kConv2d, 3, "conv2d without bias");
  Tensor a = randn({2, 4}, 4), lw = randn({3, 4}, 5);
  expect_op(only_op([&] { linear(a, lw); }), OpKind::kLinear, 3, "linear");
  Tensor idx = from_vector<int64_t>({0, 2}), table = randn({3, 4}, 6);
  expect_op(only_op([&] { embedding(idx, table); }), OpKind::kEmbedding, 2, "embedding");
  Tensor c = randn({2, 3, 2, 2}, 7), m = zeros({3}), v = ones({3});
  expect_op(only_op([&] { batch_norm(c, m, v); }), OpKind::kBatchNorm, 5, "batch_norm");
  expect_op(only_op([&] { layer_norm(a, {4}); }), OpKind::kLayerNorm, 3, "layer_norm");
  Tensor lw_t = lw.transpose(0, 1).contiguous();
  expect_op(only_op([&] { matmul(a, lw_t); }), OpKind::kMatmul, 2, "matmul");
}

TEST(DispatchOps, OptionalArgumentsAreUndefinedTensorsAndParamsArePassed) {
  Tensor x = randn({1, 2, 5, 5}, 1), w = randn({3, 2, 3, 3}, 2);
  Recorder rec;
  bool checked = false;
  rec.op_hook = [&](const OpCall& c) -> std::optional<Tensor> {
    if (c.kind == OpKind::kConv2d) {
      EXPECT_EQ(&c.input(0), &x);  // pointers into the caller's frame
      EXPECT_EQ(&c.input(1), &w);
      EXPECT_FALSE(c.input(2).defined());
      EXPECT_EQ(c.p<Conv2dParams>().stride, (std::array<int64_t, 2>{2, 2}));
      EXPECT_EQ(c.p<Conv2dParams>().padding, (std::array<int64_t, 2>{1, 1}));
      checked = true;
    }
    if (c.kind == OpKind::kGelu) {
      EXPECT_TRUE(c.p<ActivationParams>().approximate_tanh);
    }
    if (c.kind == OpKind::kSoftmax) {
      EXPECT_EQ(c.p<DimParams>().dims, DimVector{-1});
    }
    return std::nullopt;
  };
  InterceptorScope scope(&rec);
  Conv2dParams p;
  p.stride = {2, 2};
  p.padding = {1, 1};
  Tensor y = conv2d(x, w, Tensor(), p);
  EXPECT_EQ(y.sizes(), (IntArrayRef{1, 3, 3, 3}));
  gelu(x, "tanh");
  softmax(x, -1);
  EXPECT_TRUE(checked);
}

TEST(DispatchOps, BinaryFunctionsAndOperators) {
  Tensor x = from_vector<float>({1, 2, 4}), y = from_vector<float>({2, 2, 2});
  struct Case {
    std::function<Tensor()> f;
    OpKind kind;
    std::vector<float> expected;
    const char* what;
  };
  const std::vector<Case> tensor_cases = {
      {[&] { return add(x, y); }, OpKind::kAdd, {3, 4, 6}, "add"},
      {[&] { return x + y; }, OpKind::kAdd, {3, 4, 6}, "x + y"},
      {[&] { return sub(x, y); }, OpKind::kSub, {-1, 0, 2}, "sub"},
      {[&] { return x - y; }, OpKind::kSub, {-1, 0, 2}, "x - y"},
      {[&] { return mul(x, y); }, OpKind::kMul, {2, 4, 8}, "mul"},
      {[&] { return x * y; }, OpKind::kMul, {2, 4, 8}, "x * y"},
      {[&] { return div(x, y); }, OpKind::kDiv, {0.5, 1, 2}, "div"},
      {[&] { return x / y; }, OpKind::kDiv, {0.5, 1, 2}, "x / y"},
  };
  for (const Case& c : tensor_cases) {
    Tensor out;
    expect_op(only_op([&] { out = c.f(); }), c.kind, 2, c.what);
    EXPECT_EQ(out.to_vector<float>(), c.expected) << c.what;
  }
  struct ScalarCase {
    std::function<Tensor()> f;
    OpKind kind;
    double scalar;
    bool scalar_first;
    std::vector<float> expected;
    const char* what;
  };
  const std::vector<ScalarCase> scalar_cases = {
      {[&] { return add(x, 1.0); }, OpKind::kAdd, 1.0, false, {2, 3, 5}, "add(x, 1)"},
      {[&] { return x + 1.0; }, OpKind::kAdd, 1.0, false, {2, 3, 5}, "x + 1"},
      {[&] { return add(1.0, x); }, OpKind::kAdd, 1.0, true, {2, 3, 5}, "add(1, x)"},
      {[&] { return 1.0 + x; }, OpKind::kAdd, 1.0, true, {2, 3, 5}, "1 + x"},
      {[&] { return sub(x, 1.0); }, OpKind::kSub, 1.0, false, {0, 1, 3}, "sub(x, 1)"},
      {[&] { return x - 1.0; }, OpKind::kSub, 1.0, false, {0, 1, 3}, "x - 1"},
      {[&] { return sub(1.0, x); }, OpKind::kSub, 1.0, true, {0, -1, -3}, "sub(1, x)"},
      {[&] { return 1.0 - x; }, OpKind::kSub, 1.0, true, {0, -1, -3}, "1 - x"},
      {[&] { return mul(x, 3.0); }, OpKind::kMul, 3.0, false, {3, 6, 12}, "mul(x, 3)"},
      {[&] { return x * 3.0; }, OpKind::kMul, 3.0, false, {3, 6, 12}, "x * 3"},
      {[&] { return mul(3.0, x); }, OpKind::kMul, 3.0, true, {3, 6, 12}, "mul(3, x)"},
      {[&] { return 3.0 * x; }, OpKind::kMul, 3.0, true, {3, 6, 12}, "3 * x"},
      {[&] { return -x; }, OpKind::kMul, -1.0, false, {-1, -2, -4}, "-x"},
      {[&] { return div(x, 2.0); }, OpKind::kDiv, 2.0, false, {0.5, 1, 2}, "div(x, 2)"},
      {[&] { return x / 2.0; }, OpKind::kDiv, 2.0, false, {0.5, 1, 2}, "x / 2"},
      {[&] { return div(2.0, x); }, OpKind::kDiv, 2.0, true, {2, 1, 0.5}, "div(2, x)"},
      {[&] { return 2.0 / x; }, OpKind::kDiv, 2.0, true, {2, 1, 0.5}, "2 / x"},
  };
  for (const ScalarCase& c : scalar_cases) {
    Tensor out;
    expect_scalar_op(only_op([&] { out = c.f(); }), c.kind, c.scalar, c.scalar_first, c.what);
    EXPECT_EQ(out.to_vector<float>(), c.expected) << c.what;
  }
}

TEST(DispatchOps, CompoundAssignmentIsInPlace) {
  struct Case {
    std::function<void(Tensor&)> f;
    OpKind kind;
    size_t num_inputs;
    bool has_scalar;
    std::vector<float> expected;
    const char* what;
  };
  Tensor y = from_vector<float>({2, 2, 2});
  const std::vector<Case> cases = {
      {[&](Tensor& x) { x += y; }, OpKind::kAdd, 2, false, {3, 4, 6}, "x += y"},
      {[&](Tensor& x) { x += 1.0; }, OpKind::kAdd, 1, true, {2, 3, 5}, "x += 1"},
      {[&](Tensor& x) { x -= y; }, OpKind::kSub, 2, false, {-1, 0, 2}, "x -= y"},
      {[&](Tensor& x) { x -= 1.0; }, OpKind::kSub, 1, true, {0, 1, 3}, "x -= 1"},
      {[&](Tensor& x) { x *= y; }, OpKind::kMul, 2, false, {2, 4, 8}, "x *= y"},
      {[&](Tensor& x) { x *= 3.0; }, OpKind::kMul, 1, true, {3, 6, 12}, "x *= 3"},
      {[&](Tensor& x) { x /= 2.0; }, OpKind::kDiv, 1, true, {0.5, 1, 2}, "x /= 2"},
      {[&](Tensor& x) { x.add_(y); }, OpKind::kAdd, 2, false, {3, 4, 6}, "add_(y)"},
      {[&](Tensor& x) { x.sub_(0.5); }, OpKind::kSub, 1, true, {0.5, 1.5, 3.5}, "sub_(0.5)"},
      {[&](Tensor& x) { x.mul_(y); }, OpKind::kMul, 2, false, {2, 4, 8}, "mul_(y)"},
      {[&](Tensor& x) { x.div_(4.0); }, OpKind::kDiv, 1, true, {0.25, 0.5, 1}, "div_(4)"},
      {[&](Tensor& x) { (x -= 3.0).relu_(); }, OpKind::kSub, 1, true, {0, 0, 1}, "relu_ after -="},
      {[&](Tensor& x) { x.clamp_(1.5, 3.0); }, OpKind::kClamp, 1, false, {1.5, 2, 3}, "clamp_"},
      {[&](Tensor& x) { x.copy_(y); }, OpKind::kCopy, 2, false, {2, 2, 2}, "copy_"},
      {[&](Tensor& x) { x.fill_(7.0); }, OpKind::kFill, 1, false, {7, 7, 7}, "fill_"},
      {[&](Tensor& x) { x.zero_(); }, OpKind::kFill, 1, false, {0, 0, 0}, "zero_"},
  };
  for (const Case& c : cases) {
    Tensor x = from_vector<float>({1, 2, 4});
    Tensor alias = x;  // shares storage: in-place ops must write through
    Recorder rec;
    {
      InterceptorScope scope(&rec);
      c.f(x);
    }
    ASSERT_GE(rec.ops.size(), 1u) << c.what;
    const OpRecord& r = rec.ops[0];
    EXPECT_EQ(r.kind, c.kind) << c.what;
    EXPECT_EQ(r.num_inputs, c.num_inputs) << c.what;
    EXPECT_EQ(r.has_scalar, c.has_scalar) << c.what;
    EXPECT_TRUE(r.inplace) << c.what;
    EXPECT_EQ(r.first_input, &x) << c.what;
    for (const OpRecord& o : rec.ops) EXPECT_TRUE(o.inplace) << c.what;
    EXPECT_EQ(x.to_vector<float>(), c.expected) << c.what;
    EXPECT_EQ(alias.to_vector<float>(), c.expected) << c.what;
  }
}

TEST(DispatchOps, Activations) {
  Tensor x = from_vector<float>({-2, -0.5, 0.5, 8});
  struct Case {
    std::function<Tensor()> f;
    OpKind kind;
    const char* what;
  };
  const std::vector<Case> cases = {
      {[&] { return relu(x); }, OpKind::kRelu, "relu"},
      {[&] { return relu6(x); }, OpKind::kRelu6, "relu6"},
      {[&] { return hardtanh(x, -1, 1); }, OpKind::kHardtanh, "hardtanh"},
      {[&] { return leaky_relu(x, 0.1); }, OpKind::kLeakyRelu, "leaky_relu"},
      {[&] { return sigmoid(x); }, OpKind::kSigmoid, "sigmoid"},
      {[&] { return tanh(x); }, OpKind::kTanh, "tanh"},
      {[&] { return hardsigmoid(x); }, OpKind::kHardsigmoid, "hardsigmoid"},
      {[&] { return hardswish(x); }, OpKind::kHardswish, "hardswish"},
      {[&] { return silu(x); }, OpKind::kSilu, "silu"},
      {[&] { return gelu(x); }, OpKind::kGelu, "gelu"},
      {[&] { return gelu(x, "tanh"); }, OpKind::kGelu, "gelu tanh"},
      {[&] { return clamp(x, 0, 1); }, OpKind::kClamp, "clamp"},
      {[&] { return softmax(x, 0); }, OpKind::kSoftmax, "softmax"},
      {[&] { return log_softmax(x, 0); }, OpKind::kLogSoftmax, "log_softmax"},
  };
  for (const Case& c : cases) {
    Tensor out;
    expect_op(only_op([&] { out = c.f(); }), c.kind, 1, c.what);
    EXPECT_EQ(out.sizes(), x.sizes()) << c.what;
  }
}

TEST(DispatchOps, PoolingReductionsJoiningAndShapeOps) {
  Tensor img = randn({1, 2, 4, 4}, 1);
  Tensor m = randn({2, 3, 4}, 2);
  struct Case {
    std::function<Tensor()> f;
    OpKind kind;
    size_t num_inputs;
    std::vector<int64_t> sizes;
    const char* what;
  };
  const std::vector<Case> cases = {
      {[&] {
         return max_pool2d(img, {2, 2});
       },
       OpKind::kMaxPool2d,
       1,
       {1, 2, 2, 2},
       "max_pool2d"},
      {[&] {
         return avg_pool2d(img, {2, 2}, {1, 1});
       },
       OpKind::kAvgPool2d,
       1,
       {1, 2, 3, 3},
       "avg_pool2d"},
      {[&] {
         return adaptive_avg_pool2d(img, {1, 1});
       },
       OpKind::kAdaptiveAvgPool2d,
       1,
       {1, 2, 1, 1},
       "adaptive"},
      {[&] { return mean(m, {1}); }, OpKind::kMean, 1, {2, 4}, "mean"},
      {[&] {
         return sum(m, {0, 2}, true);
       },
       OpKind::kSum,
       1,
       {1, 3, 1},
       "sum"},
      {[&] { return std(m); }, OpKind::kStd, 1, {}, "std"},
      {[&] {
         return cat({m, m, m}, 1);
       },
       OpKind::kCat,
       3,
       {2, 9, 4},
       "cat"},
      {[&] { return flatten(m, 1); }, OpKind::kFlatten, 1, {2, 12}, "flatten"},
      {[&] {
         return reshape(m, {4, -1});
       },
       OpKind::kReshape,
       1,
       {4, 6},
       "reshape"},
      {[&] {
         return permute(m, {2, 0, 1});
       },
       OpKind::kPermute,
       1,
       {4, 2, 3},
       "permute"},
      {[&] { return transpose(m, 0, 2); }, OpKind::kTranspose, 1, {4, 3, 2}, "transpose"},
      {[&] { return dropout(m, 0.5, false); }, OpKind::kDropout, 1, {2, 3, 4}, "dropout"},
      {[&] { return identity(m); }, OpKind::kIdentity, 1, {2, 3, 4}, "identity"},
      {[&] { return quantize_per_tensor(m, 0.1f, 3, DType::kU8); }, OpKind::kQuantize, 1, {2, 3, 4}, "quantize"},
      {[&] {
         return quantize_per_channel(m, {0.1f, 0.2f, 0.3f}, {0, 0, 0}, 1, DType::kS8);
       },
       OpKind::kQuantize,
       1,
       {2, 3, 4},
       "quantize_per_channel"},
  };
  for (const Case& c : cases) {
    Tensor out;
    expect_op(only_op([&] { out = c.f(); }), c.kind, c.num_inputs, c.what);
    EXPECT_EQ(out.sizes(), IntArrayRef(c.sizes)) << c.what;
  }
  Tensor q = quantize_per_tensor(m, 0.1f, 3, DType::kU8);
  expect_op(only_op([&] { dequantize(q); }), OpKind::kDequantize, 1, "dequantize");
  expect_op(only_op([&] { q.dequantize(); }), OpKind::kDequantize, 1, "Tensor::dequantize");
  expect_op(only_op([&] { cat({m}, 0); }), OpKind::kCat, 1, "cat of one");
}

TEST(DispatchOps, TensorMethods) {
  Tensor m = randn({2, 3, 4}, 2);
  struct Case {
    std::function<Tensor()> f;
    OpKind kind;
    std::vector<int64_t> sizes;
    const char* what;
  };
  const std::vector<Case> cases = {
      {[&] {
         return m.reshape({6, 4});
       },
       OpKind::kReshape,
       {6, 4},
       "reshape"},
      {[&] {
         return m.view({3, 8});
       },
       OpKind::kReshape,
       {3, 8},
       "view"},
      {[&] { return m.flatten(); }, OpKind::kFlatten, {24}, "flatten"},
      {[&] { return m.flatten(0, 1); }, OpKind::kFlatten, {6, 4}, "flatten(0, 1)"},
      {[&] {
         return m.permute({1, 2, 0});
       },
       OpKind::kPermute,
       {3, 4, 2},
       "permute"},
      {[&] { return m.transpose(-1, -2); }, OpKind::kTranspose, {2, 4, 3}, "transpose"},
      {[&] { return m.narrow(2, 1, 2); }, OpKind::kNarrow, {2, 3, 2}, "narrow"},
      {[&] { return m.slice(1, 0, 3, 2); }, OpKind::kNarrow, {2, 2, 4}, "slice"},
      {[&] { return m.slice(2, -3, 100); }, OpKind::kNarrow, {2, 3, 3}, "slice clamps"},
      {[&] { return m.select(1, -1); }, OpKind::kSelect, {2, 4}, "select"},
      {[&] { return m.unsqueeze(0); }, OpKind::kUnsqueeze, {1, 2, 3, 4}, "unsqueeze"},
      {[&] { return m.unsqueeze(-1); }, OpKind::kUnsqueeze, {2, 3, 4, 1}, "unsqueeze(-1)"},
      {[&] { return m.squeeze(0); }, OpKind::kSqueeze, {2, 3, 4}, "squeeze of a non-1 dim"},
      {[&] { return m.contiguous(); }, OpKind::kContiguous, {2, 3, 4}, "contiguous"},
      {[&] { return m.clone(); }, OpKind::kClone, {2, 3, 4}, "clone"},
      {[&] { return m.to(DType::kS32); }, OpKind::kTo, {2, 3, 4}, "to"},
  };
  for (const Case& c : cases) {
    Tensor out;
    const OpRecord r = only_op([&] { out = c.f(); });
    expect_op(r, c.kind, 1, c.what);
    EXPECT_EQ(r.first_input, &m) << c.what;
    EXPECT_EQ(out.sizes(), IntArrayRef(c.sizes)) << c.what;
  }
  Tensor one = zeros({1, 3});
  Tensor squeezed;
  expect_op(only_op([&] { squeezed = one.squeeze(0); }), OpKind::kSqueeze, 1, "squeeze");
  EXPECT_EQ(squeezed.sizes(), (IntArrayRef{3}));
  // Values of the views.
  Tensor a = arange(6).reshape({2, 3});
  EXPECT_EQ(a.select(1, 2).to_vector<float>(), (std::vector<float>{2, 5}));
  EXPECT_EQ(a.slice(1, 0, 3, 2).to_vector<float>(), (std::vector<float>{0, 2, 3, 5}));
  EXPECT_EQ(a.transpose(0, 1).contiguous().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(DispatchOps, OpOutputsStartWithTraceIdZero) {
  Tensor x = randn({2, 3}, 1);
  x.set_trace_id(42);
  Tensor copy = x;
  EXPECT_EQ(copy.trace_id(), 42);
  EXPECT_EQ(relu(x).trace_id(), 0);
  EXPECT_EQ((x + 1.0).trace_id(), 0);
  EXPECT_EQ(x.reshape({3, 2}).trace_id(), 0);
  EXPECT_EQ(x.reshape({2, 3}).trace_id(), 0);  // same sizes: still a new tensor
  EXPECT_EQ(x.transpose(0, 1).trace_id(), 0);
  EXPECT_EQ(x.clone().trace_id(), 0);
}

// ---------------------------------------------------------------------------------------------
// module calls

struct Inner : nn::CallableModule<Inner> {
  Inner() {
    seq = register_module("seq", std::make_shared<nn::SequentialImpl>(std::vector<std::shared_ptr<Module>>{
                                     std::make_shared<nn::LinearImpl>(4, 4), std::make_shared<nn::ReLUImpl>()}));
  }
  Tensor forward(const Tensor& x) { return (*seq)(x) + 1.0; }
  std::shared_ptr<nn::SequentialImpl> seq;
};

struct Outer : nn::CallableModule<Outer> {
  Outer() {
    inner = register_module("inner", std::make_shared<Inner>());
    head = register_module("head", std::make_shared<nn::LinearImpl>(4, 2));
  }
  Tensor forward(const Tensor& x) { return (*head)((*inner)(x)); }
  std::shared_ptr<Inner> inner;
  std::shared_ptr<nn::LinearImpl> head;
};

TEST(DispatchModules, CallsNestInOrder) {
  auto model = std::make_shared<Outer>();
  Recorder rec;
  Tensor y;
  {
    InterceptorScope scope(&rec);
    y = (*model)(randn({3, 4}, 1));
  }
  EXPECT_EQ(y.sizes(), (IntArrayRef{3, 2}));
  EXPECT_EQ(rec.trace,
            (std::vector<std::string>{"enter Outer", "enter Inner", "enter Sequential", "enter Linear", "op linear",
                                      "exit Linear", "enter ReLU", "op relu", "exit ReLU", "exit Sequential", "op add",
                                      "exit Inner", "enter Linear", "op linear", "exit Linear", "exit Outer"}));
  for (const ModuleRecord& r : rec.modules) EXPECT_EQ(r.num_tensors, 1u) << r.event << " " << r.type;
}

struct ReturnsTuple : nn::CallableModule<ReturnsTuple> {
  std::tuple<Tensor, Tensor> forward(const Tensor& x) { return {x + 1.0, x * 2.0}; }
};
struct ReturnsVector : nn::CallableModule<ReturnsVector> {
  std::vector<Tensor> forward(const Tensor& x, int n) {
    std::vector<Tensor> out;
    for (int i = 0; i < n; ++i) out.push_back(x + static_cast<double>(i));
    return out;
  }
};
struct ReturnsPairWithInt : nn::CallableModule<ReturnsPairWithInt> {
  std::pair<Tensor, int> forward(const Tensor& x) { return {relu(x), 7}; }
};
struct ReturnsInt : nn::CallableModule<ReturnsInt> {
  int forward(const Tensor& x) { return static_cast<int>(x.numel()); }
};
struct ReturnsVoid : nn::CallableModule<ReturnsVoid> {
  int calls = 0;
  void forward(const Tensor&) { ++calls; }
};
// Mixed argument kinds: a tensor, a list of tensors, an optional tensor and a plain value.
struct MixedArgs : nn::CallableModule<MixedArgs> {
  Tensor forward(const Tensor& x, const std::vector<Tensor>& more, const std::optional<Tensor>& bias, double k) {
    Tensor y = x * k;
    for (const Tensor& t : more) y = y + t;
    if (bias) y = y + *bias;
    return y;
  }
};

TEST(DispatchModules, ForwardReturnTypes) {
  Tensor x = from_vector<float>({-1, 2});
  Recorder rec;
  InterceptorScope scope(&rec);

  auto [a, b] = (*std::make_shared<ReturnsTuple>())(x);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 3}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{-2, 4}));
  ASSERT_EQ(rec.modules.size(), 2u);
  EXPECT_EQ(rec.modules[0].num_tensors, 1u);
  EXPECT_EQ(rec.modules[1].event, "exit");
  EXPECT_EQ(rec.modules[1].num_tensors, 2u);

  rec.take_ops();
  std::vector<Tensor> v = (*std::make_shared<ReturnsVector>())(x, 3);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[2].to_vector<float>(), (std::vector<float>{1, 4}));
  ASSERT_EQ(rec.modules.size(), 2u);
  EXPECT_EQ(rec.modules[0].num_tensors, 1u);  // the int is not a tensor
  EXPECT_EQ(rec.modules[1].num_tensors, 3u);

  rec.take_ops();
  auto [r, seven] = (*std::make_shared<ReturnsPairWithInt>())(x);
  EXPECT_EQ(seven, 7);
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{0, 2}));
  ASSERT_EQ(rec.modules.size(), 2u);
  EXPECT_EQ(rec.modules[1].num_tensors, 1u);

  rec.take_ops();
  EXPECT_EQ((*std::make_shared<ReturnsInt>())(x), 2);
  ASSERT_EQ(rec.modules.size(), 2u);
  EXPECT_EQ(rec.modules[1].event, "exit");
  EXPECT_EQ(rec.modules[1].num_tensors, 0u);

  rec.take_ops();
  auto rv = std::make_shared<ReturnsVoid>();
  (*rv)(x);
  EXPECT_EQ(rv->calls, 1);
  ASSERT_EQ(rec.modules.size(), 2u);
  EXPECT_EQ(rec.modules[1].event, "exit");
  EXPECT_EQ(rec.modules[1].num_tensors, 0u);

  rec.take_ops();
  Tensor y = (*std::make_shared<MixedArgs>())(x, std::vector<Tensor>{x, x}, std::optional<Tensor>(x), 2.0);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{-5, 10}));
  ASSERT_EQ(rec.modules.size(), 2u);
  EXPECT_EQ(rec.modules[0].num_tensors, 4u);
  EXPECT_EQ(rec.modules[1].num_tensors, 1u);
  rec.take_ops();
  (*std::make_shared<MixedArgs>())(x, std::vector<Tensor>{}, std::nullopt, 1.0);
  EXPECT_EQ(rec.modules[0].num_tensors, 1u);
}

// Containers nested in any order: every tensor inside is visible to the hooks.
struct NestedContainers : nn::CallableModule<NestedContainers> {
  std::tuple<std::vector<std::pair<Tensor, Tensor>>, std::optional<std::tuple<Tensor, int>>,
             std::vector<std::optional<Tensor>>, std::array<std::vector<Tensor>, 2>>
  forward(const std::vector<std::pair<Tensor, int>>& in) {
    std::vector<std::pair<Tensor, Tensor>> pairs;
    for (const auto& [t, k] : in) pairs.emplace_back(t, t * static_cast<double>(k));
    return {pairs,
            std::make_tuple(in[0].first, 1),
            {std::nullopt, in[0].first},
            std::array<std::vector<Tensor>, 2>{std::vector<Tensor>{in[0].first}, std::vector<Tensor>{}}};
  }
};

TEST(DispatchModules, NestedContainersExposeEveryTensor) {
  Tensor x = from_vector<float>({1, 2});
  Recorder rec;
  InterceptorScope scope(&rec);
  auto m = std::make_shared<NestedContainers>();
  auto out = (*m)(std::vector<std::pair<Tensor, int>>{{x, 2}, {x, 3}, {x, 4}});
  EXPECT_EQ(std::get<0>(out).size(), 3u);
  ASSERT_EQ(rec.modules.size(), 2u);
  EXPECT_EQ(rec.modules[0].num_tensors, 3u);              // vector<pair<Tensor, int>>
  EXPECT_EQ(rec.modules[1].num_tensors, 6u + 1 + 1 + 1);  // pairs, optional<tuple>, vector<optional>, array
}

TEST(DispatchModules, WithoutInterceptorReturnTypesWorkToo) {
  Tensor x = from_vector<float>({-1, 2});
  auto [a, b] = (*std::make_shared<ReturnsTuple>())(x);
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{-2, 4}));
  EXPECT_EQ((*std::make_shared<ReturnsInt>())(x), 2);
  EXPECT_EQ((*std::make_shared<ReturnsPairWithInt>())(x).second, 7);
}

// Doubles a module's first tensor argument on entry; negates its first result on exit.
TEST(DispatchModules, InterceptorRewritesInputsAndOutputs) {
  struct Probe : nn::CallableModule<Probe> {
    Tensor seen;
    std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& y) {
      seen = x;
      return {x + y, y};
    }
  };
  auto probe = std::make_shared<Probe>();
  Recorder rec;
  rec.enter_hook = [](Module&, absl::Span<Tensor* const> in) {
    ASSERT_EQ(in.size(), 2u);
    *in[0] = *in[0] * 2.0;
  };
  rec.exit_hook = [](Module&, absl::Span<Tensor* const> out) {
    ASSERT_EQ(out.size(), 2u);
    *out[0] = -*out[0];
  };
  Tensor x = from_vector<float>({1, 2}), y = from_vector<float>({10, 20});
  std::pair<Tensor, Tensor> out;
  {
    InterceptorScope scope(&rec);
    out = (*probe)(x, y);
  }
  EXPECT_EQ(probe->seen.to_vector<float>(), (std::vector<float>{2, 4}));  // forward saw the rewrite
  EXPECT_EQ(out.first.to_vector<float>(), (std::vector<float>{-12, -24}));
  EXPECT_EQ(out.second.to_vector<float>(), (std::vector<float>{10, 20}));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1, 2}));  // the caller's tensor is untouched
}

struct Throws : nn::CallableModule<Throws> {
  Tensor forward(const Tensor& x) {
    relu(x);
    DBRQ_THROW(ShapeError, "deliberate failure in forward");
  }
};

struct CallsThrowing : nn::CallableModule<CallsThrowing> {
  CallsThrowing() { bad = register_module("bad", std::make_shared<Throws>()); }
  Tensor forward(const Tensor& x) { return (*bad)(x + 1.0); }
  std::shared_ptr<Throws> bad;
};

TEST(DispatchModules, ForwardThrowingUnwinds) {
  auto m = std::make_shared<CallsThrowing>();
  Recorder rec;
  {
    InterceptorScope scope(&rec);
    EXPECT_THROW_MSG((*m)(ones({2})), ShapeError, "deliberate failure in forward");
  }
  EXPECT_EQ(rec.trace, (std::vector<std::string>{"enter CallsThrowing", "op add", "enter Throws", "op relu",
                                                 "unwind Throws", "unwind CallsThrowing"}));
  EXPECT_EQ(current_interceptor(), nullptr);
  // The model is still usable and the interceptor still sees balanced calls afterwards.
  rec.take_ops();
  auto ok = std::make_shared<Inner>();
  {
    InterceptorScope scope(&rec);
    (*ok)(ones({1, 4}));
  }
  EXPECT_EQ(rec.trace.front(), "enter Inner");
  EXPECT_EQ(rec.trace.back(), "exit Inner");
}

TEST(DispatchModules, HookThrowingUnwinds) {
  auto m = std::make_shared<Inner>();
  Recorder rec;
  rec.enter_hook = [](Module& mod, absl::Span<Tensor* const>) {
    if (mod.type_name() == "ReLU") throw ValueError("enter hook failed");
  };
  {
    InterceptorScope scope(&rec);
    EXPECT_THROW_MSG((*m)(ones({1, 4})), ValueError, "enter hook failed");
  }
  EXPECT_EQ(rec.trace,
            (std::vector<std::string>{"enter Inner", "enter Sequential", "enter Linear", "op linear", "exit Linear",
                                      "enter ReLU", "unwind ReLU", "unwind Sequential", "unwind Inner"}));
  Recorder rec2;
  rec2.exit_hook = [](Module& mod, absl::Span<Tensor* const>) {
    if (mod.type_name() == "Sequential") throw ValueError("exit hook failed");
  };
  {
    InterceptorScope scope(&rec2);
    EXPECT_THROW_MSG((*m)(ones({1, 4})), ValueError, "exit hook failed");
  }
  ASSERT_GE(rec2.trace.size(), 3u);
  EXPECT_EQ(rec2.trace[rec2.trace.size() - 3], "exit Sequential");
  EXPECT_EQ(rec2.trace[rec2.trace.size() - 2], "unwind Sequential");
  EXPECT_EQ(rec2.trace.back(), "unwind Inner");
}

TEST(DispatchModules, OpHookThrowingPropagates) {
  auto m = std::make_shared<Inner>();
  Recorder rec;
  rec.op_hook = [](const OpCall& c) -> std::optional<Tensor> {
    if (c.kind == OpKind::kRelu) throw ControlFlowError("op 1 is not the recorded op");
    return std::nullopt;
  };
  {
    InterceptorScope scope(&rec);
    EXPECT_THROW_MSG((*m)(ones({1, 4})), ControlFlowError, "op 1 is not the recorded op");
  }
  EXPECT_EQ(rec.trace.back(), "unwind Inner");
}

// ---------------------------------------------------------------------------------------------
// installing interceptors

TEST(DispatchInstall, ModuleInterceptorInstallsWhenNoneActive) {
  auto model = std::make_shared<Outer>();
  Recorder own;
  model->set_interceptor(&own);
  EXPECT_EQ(model->interceptor(), &own);
  EXPECT_EQ(current_interceptor(), nullptr);
  (*model)(ones({1, 4}));
  EXPECT_EQ(current_interceptor(), nullptr);  // uninstalled after the call
  EXPECT_EQ(own.trace.front(), "enter Outer");
  EXPECT_EQ(own.trace.back(), "exit Outer");
  EXPECT_EQ(own.kinds(), (std::vector<OpKind>{OpKind::kLinear, OpKind::kRelu, OpKind::kAdd, OpKind::kLinear}));
  // Ops outside the module call are not intercepted.
  own.take_ops();
  relu(ones({1}));
  EXPECT_TRUE(own.ops.empty());

  // An interceptor already active wins over the module's own.
  Recorder active;
  {
    InterceptorScope scope(&active);
    (*model)(ones({1, 4}));
  }
  EXPECT_TRUE(own.ops.empty());
  EXPECT_EQ(active.ops.size(), 4u);

  // A child with its own interceptor called inside an intercepted parent uses the parent's.
  own.take_ops();
  Recorder child_own;
  model->inner->set_interceptor(&child_own);
  (*model)(ones({1, 4}));
  EXPECT_TRUE(child_own.ops.empty());
  EXPECT_EQ(own.ops.size(), 4u);
  // Called directly, the child installs its own.
  (*model->inner)(ones({1, 4}));
  EXPECT_EQ(child_own.ops.size(), 3u);

  model->set_interceptor(nullptr);
  model->inner->set_interceptor(nullptr);
  own.take_ops();
  (*model)(ones({1, 4}));
  EXPECT_TRUE(own.ops.empty());
}

TEST(DispatchInstall, ModuleInterceptorUninstalledWhenForwardThrows) {
  auto m = std::make_shared<CallsThrowing>();
  Recorder own;
  m->set_interceptor(&own);
  EXPECT_THROW_MSG((*m)(ones({2})), ShapeError, "deliberate failure");
  EXPECT_EQ(current_interceptor(), nullptr);
  EXPECT_EQ(own.trace.back(), "unwind CallsThrowing");
}

TEST(DispatchInstall, NullScopeSuspendsInterception) {
  Recorder rec;
  InterceptorScope scope(&rec);
  EXPECT_EQ(current_interceptor(), &rec);
  relu(ones({1}));
  {
    InterceptorScope off(nullptr);
    EXPECT_EQ(current_interceptor(), nullptr);
    relu(ones({1}));
    (*std::make_shared<Inner>())(ones({1, 4}));
    {
      Recorder nested;
      InterceptorScope on(&nested);
      sigmoid(ones({1}));
      EXPECT_EQ(nested.ops.size(), 1u);
    }
    EXPECT_EQ(current_interceptor(), nullptr);
  }
  EXPECT_EQ(current_interceptor(), &rec);
  tanh(ones({1}));
  EXPECT_EQ(rec.kinds(), (std::vector<OpKind>{OpKind::kRelu, OpKind::kTanh}));
  EXPECT_TRUE(rec.modules.empty());
}

TEST(DispatchInstall, InterceptionIsThreadLocal) {
  auto model = std::make_shared<Outer>();
  Recorder main_rec;
  InterceptorScope scope(&main_rec);
  std::atomic<bool> other_saw_null{false};
  Recorder thread_rec;
  std::thread t([&] {
    other_saw_null = current_interceptor() == nullptr;
    (*model)(ones({2, 4}));  // not intercepted: main_rec is installed on the main thread only
    InterceptorScope own(&thread_rec);
    relu(ones({1}));
    (*model)(ones({1, 4}));
  });
  t.join();
  EXPECT_TRUE(other_saw_null);
  EXPECT_TRUE(main_rec.ops.empty());
  EXPECT_TRUE(main_rec.modules.empty());
  EXPECT_EQ(thread_rec.ops.size(), 5u);
  EXPECT_EQ(thread_rec.trace.front(), "op relu");
  EXPECT_EQ(current_interceptor(), &main_rec);
}

TEST(DispatchInstall, ConcurrentThreadsSeeOnlyTheirOwnOps) {
  auto model = std::make_shared<Outer>();
  model->eval();
  constexpr int kThreads = 4, kCalls = 20;
  std::vector<Recorder> recs(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kThreads) std::this_thread::yield();
      InterceptorScope scope(&recs[i]);
      for (int k = 0; k < kCalls + i; ++k) (*model)(ones({1, 4}));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(recs[i].ops.size(), 4u * (kCalls + i)) << "thread " << i;
    EXPECT_EQ(recs[i].modules.size(), 12u * (kCalls + i)) << "thread " << i;
  }
}

// ---------------------------------------------------------------------------------------------
// results under interception

// Convs, batch norm, pooling, elementwise and shape ops: the eager model of the other tests.
struct SmallCnn : nn::CallableModule<SmallCnn> {
  SmallCnn() {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2dImpl>(3, 8, 3, 1, 1));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2dImpl>(8));
    conv2 = register_module("conv2", std::make_shared<nn::Conv2dImpl>(8, 8, 3, 2, 1, 1, 2));
    pool = register_module("pool", std::make_shared<nn::AdaptiveAvgPool2dImpl>(1));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(8, 5));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = relu((*bn1)((*conv1)(x)));
    Tensor z = (*conv2)(y);
    z = hardswish(z) + max_pool2d(y, {2, 2}) * 0.5;
    z = (*pool)(z).flatten(1);
    Tensor logits = (*fc)(z);
    return softmax(cat({logits, -logits}, 1), -1).narrow(1, 0, 5);
  }
  std::shared_ptr<nn::Conv2dImpl> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2dImpl> bn1;
  std::shared_ptr<nn::AdaptiveAvgPool2dImpl> pool;
  std::shared_ptr<nn::LinearImpl> fc;
};

TEST(DispatchResults, PassThroughMatchesNoInterceptor) {
  manual_seed(3);
  auto model = std::make_shared<SmallCnn>();
  model->eval();
  Tensor x = randn({2, 3, 8, 8}, 11);
  Tensor plain = (*model)(x);
  Recorder rec;
  Tensor intercepted;
  {
    InterceptorScope scope(&rec);
    intercepted = (*model)(x);
  }
  EXPECT_GT(rec.ops.size(), 10u);
  expect_equal(intercepted, plain, "pass-through interceptor");
  // In-place ops too.
  Tensor a = x.clone(), b = x.clone();
  a.mul_(2.0).add_(x).relu_();
  {
    InterceptorScope scope(&rec);
    b.mul_(2.0).add_(x).relu_();
  }
  expect_equal(b, a, "in-place chain");
}

TEST(DispatchResults, InterceptorSubstitutesInputs) {
  // Replaces the second operand of every tensor-tensor add by its double, through a modified
  // copy of the OpCall that points at a tensor the interceptor owns.
  struct Substituting : Interceptor {
    int substituted = 0;
    Tensor on_op(const OpCall& c) override {
      if (c.kind != OpKind::kAdd || c.has_scalar || c.num_inputs() != 2) return c.run(c);
      Tensor doubled = [&] {
        InterceptorScope off(nullptr);  // our own helper op is not part of the model
        return c.input(1) * 2.0;
      }();
      const Tensor* in[] = {c.inputs[0], &doubled};
      OpCall changed = c;
      changed.inputs = absl::MakeConstSpan(in);
      ++substituted;
      return changed.run(changed);
    }
    void on_module_enter(Module&, absl::Span<Tensor* const>) override {}
    void on_module_exit(Module&, absl::Span<Tensor* const>) override {}
    void on_module_unwind(Module&) noexcept override {}
  } sub;
  Tensor x = from_vector<float>({1, 2}), y = from_vector<float>({10, 20});
  Tensor out;
  {
    InterceptorScope scope(&sub);
    out = x + y;
    Tensor s = x + 1.0;  // scalar add: not substituted
    EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{2, 3}));
  }
  EXPECT_EQ(sub.substituted, 1);
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{21, 42}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{10, 20}));

  // The same for a conv: the interceptor swaps in its own weight (e.g. a fake-quantized one).
  auto conv = std::make_shared<nn::Conv2dImpl>(1, 1, 1, 1, 0, 1, 1, /*bias=*/false);
  Recorder rec;
  Tensor my_weight = full({1, 1, 1, 1}, 3.0);
  rec.op_hook = [&](const OpCall& c) -> std::optional<Tensor> {
    if (c.kind != OpKind::kConv2d) return std::nullopt;
    const Tensor* in[] = {c.inputs[0], &my_weight, c.inputs[2]};
    OpCall changed = c;
    changed.inputs = absl::MakeConstSpan(in);
    return changed.run(changed);
  };
  Tensor img = full({1, 1, 2, 2}, 2.0);
  Tensor y2;
  {
    InterceptorScope scope(&rec);
    y2 = (*conv)(img);
  }
  expect_equal(y2, full({1, 1, 2, 2}, 6.0), "conv with substituted weight");
}

TEST(DispatchResults, InterceptorReplacesResults) {
  Recorder rec;
  rec.op_hook = [](const OpCall& c) -> std::optional<Tensor> {
    if (c.kind == OpKind::kRelu && !c.inplace) return full({3}, 9.0);
    if (c.kind == OpKind::kAdd && c.inplace) return from_vector<int32_t>({1, 2, 3});  // a different tensor
    return std::nullopt;
  };
  InterceptorScope scope(&rec);
  Tensor x = from_vector<float>({-1, 0, 1});
  EXPECT_EQ(relu(x).to_vector<float>(), (std::vector<float>{9, 9, 9}));
  // An in-place op whose interceptor hands back another tensor rebinds the caller's variable.
  Tensor alias = x;
  Tensor& r = x.add_(1.0);
  EXPECT_EQ(&r, &x);
  EXPECT_EQ(x.dtype(), DType::kS32);
  EXPECT_EQ(x.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(alias.to_vector<float>(), (std::vector<float>{-1, 0, 1}));
}

TEST(DispatchResults, ErrorsFromKernelsPropagateThroughInterceptor) {
  Recorder rec;
  InterceptorScope scope(&rec);
  EXPECT_THROW(add(ones({2}), ones({3})), ShapeError);
  EXPECT_EQ(rec.kinds(), std::vector<OpKind>{OpKind::kAdd});
  EXPECT_EQ(current_interceptor(), &rec);
}

TEST(DispatchResults, OpNames) {
  EXPECT_STREQ(op_name(OpKind::kConv2d), "conv2d");
  EXPECT_STREQ(op_name(OpKind::kAdd), "add");
  EXPECT_STREQ(op_name(OpKind::kAdaptiveAvgPool2d), "adaptive_avg_pool2d");
  // Every kind has a distinct non-empty name.
  std::set<std::string> names;
  for (int k = 0; k < static_cast<int>(OpKind::kNumOpKinds); ++k) {
    const char* n = op_name(static_cast<OpKind>(k));
    ASSERT_NE(n, nullptr);
    EXPECT_GT(std::strlen(n), 0u);
    EXPECT_TRUE(names.insert(n).second) << "duplicate op name " << n;
  }
}

}  // namespace
}  // namespace dbrq
