// What prepare records and where it puts observers for single quantizeable ops, checked through the
// AutoQuantizationState API, then converted and compared with fp32: a Conv2d module, a functional
// conv2d on registered parameters, Linear with and without bias, cat of several tensors (one shared
// observer: the producers' output slots are united; a scalar-mul input is observed into it), x + x,
// tensor-scalar add / mul (no observer of their own: they reuse their input's parameters, 1.0 + x
// included), tensor-tensor mul, and sub / div, which the oneDNN backend does not quantize (recorded
// as fp32 ops, int8 inputs dequantized).
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;
using testing::fed_roots;
using testing::observer_roots;
using testing::seen_kinds;
using testing::sqnr_of;
using testing::state_of;

constexpr double kMinSqnrDb = 28.0;

// Calibrates on `calib` inputs, converts, and checks the int8 output against the fp32 reference
// computed before prepare.
template <typename M>
void calibrate_convert_compare(M& model, const std::vector<Tensor>& inputs, const std::vector<Tensor>& refs) {
  for (const Tensor& x : inputs) model(x);
  convert(model);
  ASSERT_TRUE(is_converted(model));
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor y = model(inputs[i]);
    EXPECT_FALSE(y.is_quantized());
    EXPECT_EQ(y.dtype(), DType::kF32);
    EXPECT_GT(sqnr_of(y, refs[i]), kMinSqnrDb) << "input " << i;
  }
}

template <typename M>
std::vector<Tensor> fp32_refs(M& model, const std::vector<Tensor>& inputs) {
  std::vector<Tensor> out;
  for (const Tensor& x : inputs) out.push_back(model(x));
  return out;
}

std::vector<Tensor> image_batches(int n, uint64_t seed, int64_t c = 3) {
  std::vector<Tensor> out;
  for (int i = 0; i < n; ++i) out.push_back(randn({2, c, 8, 8}, seed + i));
  return out;
}

// ---------------------------------------------------------------------------------------------

struct ConvNet : nn::CallableModule<ConvNet> {
  ConvNet() { conv = register_module("conv", std::make_shared<Conv2d>(3, 6, 3, 1, 1)); }
  Tensor forward(const Tensor& x) { return (*conv)(x); }
  std::shared_ptr<Conv2d> conv;
};

TEST(PrepareOps, ConvModule) {
  manual_seed(1);
  auto model = std::make_shared<ConvNet>();
  const auto inputs = image_batches(3, 10);
  const auto refs = fp32_refs(*model, inputs);
  prepare(*model, {inputs[0]});
  ASSERT_TRUE(is_prepared(*model));
  EXPECT_FALSE(is_converted(*model));
  AutoQuantizationState& s = state_of(*model);
  EXPECT_EQ(s.fqn(), "");
  ASSERT_EQ(seen_kinds(s), std::vector<OpKind>{OpKind::kConv2d});
  const SeenOpInfo& op = s.seen_ops()[0];
  EXPECT_EQ(op.index, 0);
  EXPECT_EQ(op.fqn, "conv");
  EXPECT_EQ(op.leaf, model->conv.get());
  EXPECT_EQ(op.role, QuantRole::kWeighted);
  EXPECT_FALSE(op.fusion.fused());
  ASSERT_EQ(op.inputs.size(), 1u);
  EXPECT_EQ(op.inputs[0].inf_dtype, DType::kU8);
  EXPECT_EQ(op.outputs[0].inf_dtype, DType::kU8);
  ASSERT_EQ(op.weights.size(), 2u);
  EXPECT_EQ(op.weights[0].fqn, "conv.weight");
  EXPECT_EQ(op.weights[1].fqn, "conv.bias");
  ASSERT_EQ(op.input_observers.size(), 1u);
  EXPECT_GE(op.input_observers[0], 0);
  EXPECT_GE(op.output_observer, 0);
  ModelQuantState& m = model_quant_state(*model);
  EXPECT_NE(m.find(op.input_observers[0]), m.find(op.output_observer));
  EXPECT_EQ(observer_roots(m).size(), 2u);
  // The default mapping: Histogram activations.
  EXPECT_EQ(m.slot(op.output_observer).observer->spec().kind, ObserverKind::kHistogram);
  EXPECT_EQ(m.slot(op.input_observers[0]).tensor_id, op.inputs[0].id);
  EXPECT_EQ(m.slot(op.output_observer).tensor_id, op.outputs[0].id);
  calibrate_convert_compare(*model, inputs, refs);
  EXPECT_NE(s.seen_ops()[0].executor, nullptr);
}

// conv2d called as a function on the module's own registered parameters.
struct FunctionalConvNet : nn::CallableModule<FunctionalConvNet> {
  FunctionalConvNet() {
    weight = register_parameter("weight", randn({4, 3, 3, 3}, 5) * 0.3);
    bias = register_parameter("bias", randn({4}, 6) * 0.1);
    params.padding = {1, 1};
    params.stride = {2, 2};
  }
  Tensor forward(const Tensor& x) { return conv2d(x, weight, bias, params); }
  Tensor weight, bias;
  Conv2dParams params;
};

TEST(PrepareOps, FunctionalConv2d) {
  auto model = std::make_shared<FunctionalConvNet>();
  const auto inputs = image_batches(3, 20);
  const auto refs = fp32_refs(*model, inputs);
  prepare(*model, {inputs[0]});
  AutoQuantizationState& s = state_of(*model);
  ASSERT_EQ(seen_kinds(s), std::vector<OpKind>{OpKind::kConv2d});
  const SeenOpInfo& op = s.seen_ops()[0];
  EXPECT_EQ(op.fqn, "");  // the enclosing module
  EXPECT_EQ(op.leaf, nullptr);
  EXPECT_EQ(op.role, QuantRole::kWeighted);
  ASSERT_EQ(op.weights.size(), 2u);
  EXPECT_EQ(op.weights[0].fqn, "weight");
  EXPECT_EQ(op.weights[1].fqn, "bias");
  ASSERT_TRUE(op.params.holds<Conv2dParams>());
  EXPECT_EQ(op.params.as<Conv2dParams>().stride, (std::array<int64_t, 2>{2, 2}));
  EXPECT_GE(op.input_observers[0], 0);
  EXPECT_GE(op.output_observer, 0);
  EXPECT_EQ(observer_roots(model_quant_state(*model)).size(), 2u);
  calibrate_convert_compare(*model, inputs, refs);
}

struct LinearNet : nn::CallableModule<LinearNet> {
  explicit LinearNet(bool bias) { fc = register_module("fc", std::make_shared<Linear>(16, 8, bias)); }
  Tensor forward(const Tensor& x) { return (*fc)(x); }
  std::shared_ptr<Linear> fc;
};

TEST(PrepareOps, LinearWithAndWithoutBias) {
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with bias" : "without bias");
    manual_seed(bias ? 2 : 3);
    auto model = std::make_shared<LinearNet>(bias);
    std::vector<Tensor> inputs;
    for (int i = 0; i < 3; ++i) inputs.push_back(randn({5, 16}, 30 + i));
    const auto refs = fp32_refs(*model, inputs);
    prepare(*model, {inputs[0]});
    AutoQuantizationState& s = state_of(*model);
    ASSERT_EQ(seen_kinds(s), std::vector<OpKind>{OpKind::kLinear});
    const SeenOpInfo& op = s.seen_ops()[0];
    EXPECT_EQ(op.fqn, "fc");
    EXPECT_EQ(op.role, QuantRole::kWeighted);
    ASSERT_GE(op.weights.size(), 1u);
    EXPECT_EQ(op.weights[0].fqn, "fc.weight");
    if (bias) {
      ASSERT_EQ(op.weights.size(), 2u);
      EXPECT_EQ(op.weights[1].fqn, "fc.bias");
      EXPECT_TRUE(op.weights[1].tensor.defined());
    } else {
      // An absent bias is recorded as an undefined tensor (or not at all).
      EXPECT_TRUE(op.weights.size() == 1 || !op.weights[1].tensor.defined());
    }
    EXPECT_GE(op.input_observers[0], 0);
    EXPECT_GE(op.output_observer, 0);
    calibrate_convert_compare(*model, inputs, refs);
  }
}

// ---------------------------------------------------------------------------------------------

// cat of three conv outputs; with `scale_middle` the middle one goes through x * 3.0 first.
struct CatNet : nn::CallableModule<CatNet> {
  explicit CatNet(bool scale_middle_in) : scale_middle(scale_middle_in) {
    c1 = register_module("c1", std::make_shared<Conv2d>(3, 4, 3, 1, 1));
    c2 = register_module("c2", std::make_shared<Conv2d>(3, 5, 1));
    c3 = register_module("c3", std::make_shared<Conv2d>(3, 2, 3, 1, 1));
  }
  Tensor forward(const Tensor& x) {
    if (!scale_middle) return cat({(*c1)(x), (*c2)(x), (*c3)(x)}, 1);
    return cat({(*c1)(x), (*c2)(x)*3.0, (*c3)(x)}, 1);
  }
  bool scale_middle;
  std::shared_ptr<Conv2d> c1, c2, c3;
};

QConfigMapping min_max_mapping() {
  return QConfigMapping().set_global(QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max()));
}

TEST(PrepareOps, CatSharesOneObserverAcrossInputsAndOutput) {
  manual_seed(4);
  auto model = std::make_shared<CatNet>(false);
  const auto inputs = image_batches(3, 40);
  const auto refs = fp32_refs(*model, inputs);
  prepare(*model, {inputs[0]}, min_max_mapping());
  AutoQuantizationState& s = state_of(*model);
  ASSERT_EQ(seen_kinds(s), (std::vector<OpKind>{OpKind::kConv2d, OpKind::kConv2d, OpKind::kConv2d, OpKind::kCat}));
  ModelQuantState& m = model_quant_state(*model);
  const auto& ops = s.seen_ops();
  const SeenOpInfo& cat_op = ops[3];
  EXPECT_EQ(cat_op.role, QuantRole::kCat);
  // The producers' output slots are united into one observer, which is also the cat output's.
  const int shared = m.find(ops[0].output_observer);
  EXPECT_EQ(m.find(ops[1].output_observer), shared);
  EXPECT_EQ(m.find(ops[2].output_observer), shared);
  EXPECT_EQ(m.find(m.tensor(cat_op.outputs[0].id)->slot), shared);
  EXPECT_EQ(cat_op.output_observer, -1);
  EXPECT_EQ(cat_op.input_observers, (std::vector<int>{-1, -1, -1}));
  EXPECT_EQ(observer_roots(m).size(), 2u);  // x, and the shared one
  for (const Tensor& x : inputs) (*model)(x);
  float lo = INFINITY, hi = -INFINITY;
  for (const Tensor& x : inputs) {
    for (const Tensor& part : {(*model->c1)(x), (*model->c2)(x), (*model->c3)(x)}) {
      for (float v : testing::values(part)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    }
  }
  EXPECT_EQ(m.observer(shared).min_val(), lo);
  EXPECT_EQ(m.observer(shared).max_val(), hi);
  EXPECT_EQ(m.observer(shared).num_batches(), 3 * static_cast<int64_t>(inputs.size()));
  convert(*model);
  // One set of parameters for the three parts and the result.
  const QuantParamsPtr qp = m.slot(shared).qparams;
  ASSERT_NE(qp, nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) EXPECT_GT(sqnr_of((*model)(inputs[i]), refs[i]), kMinSqnrDb);
}

TEST(PrepareOps, CatOfAProducerWithDerivedParameters) {
  manual_seed(4);
  auto model = std::make_shared<CatNet>(true);
  const auto inputs = image_batches(3, 40);
  const auto refs = fp32_refs(*model, inputs);
  // MinMax activations, so the shared observer's range can be checked exactly.
  prepare(*model, {inputs[0]}, min_max_mapping());
  AutoQuantizationState& s = state_of(*model);
  ASSERT_EQ(seen_kinds(s),
            (std::vector<OpKind>{OpKind::kConv2d, OpKind::kConv2d, OpKind::kMul, OpKind::kConv2d, OpKind::kCat}));
  ModelQuantState& m = model_quant_state(*model);
  const auto& ops = s.seen_ops();
  const SeenOpInfo& cat_op = ops[4];
  EXPECT_EQ(cat_op.role, QuantRole::kCat);
  ASSERT_EQ(cat_op.inputs.size(), 3u);
  // The input x has one observer, fed by each of its quantizing consumers (a consumer may run on
  // a path the others do not; the observer takes the tensor once per call).
  EXPECT_GE(ops[0].input_observers[0], 0);
  EXPECT_EQ(ops[1].input_observers[0], ops[0].input_observers[0]);
  EXPECT_EQ(ops[3].input_observers[0], ops[0].input_observers[0]);
  // x * 3.0 reuses c2's parameters: no observer of its own.
  EXPECT_EQ(ops[2].output_observer, -1);
  EXPECT_EQ(ops[2].input_observers, std::vector<int>{-1});
  // The direct producers' output slots are united into one observer, which is also the cat
  // output's. c2 is no direct producer: its output keeps its own observer (the mul derives its
  // parameters from it, and cat requantizes the mul's result).
  const int shared = m.find(ops[0].output_observer);
  EXPECT_NE(m.find(ops[1].output_observer), shared);
  EXPECT_EQ(m.find(ops[3].output_observer), shared);
  const auto* out_rec = m.tensor(cat_op.outputs[0].id);
  ASSERT_NE(out_rec, nullptr);
  EXPECT_EQ(m.find(out_rec->slot), shared);
  EXPECT_EQ(cat_op.output_observer, -1);
  // Inputs with an observer of their own are observed by their producer; the scalar mul's output
  // (derived parameters, no slot) is observed by cat, into the same shared observer.
  ASSERT_EQ(cat_op.input_observers.size(), 3u);
  EXPECT_EQ(cat_op.input_observers[0], -1);
  ASSERT_GE(cat_op.input_observers[1], 0);
  EXPECT_EQ(m.find(cat_op.input_observers[1]), shared);
  EXPECT_EQ(cat_op.input_observers[2], -1);
  for (const QTensorInfo& in : cat_op.inputs) EXPECT_EQ(in.inf_dtype, DType::kU8);
  EXPECT_EQ(cat_op.outputs[0].inf_dtype, DType::kU8);
  // Observers: x, c2's output, and the shared one.
  EXPECT_EQ(observer_roots(m).size(), 3u);

  // After calibration the shared observer covers every tensor it was fed.
  for (const Tensor& x : inputs) (*model)(x);
  float lo = INFINITY, hi = -INFINITY;
  for (const Tensor& x : inputs) {
    // Leaves have no interceptor of their own: calling them directly runs plain fp32.
    const Tensor y2 = (*model->c2)(x);
    for (const Tensor& part : {(*model->c1)(x), y2 * 3.0, (*model->c3)(x)}) {
      for (float v : testing::values(part)) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    }
  }
  const Observer& obs = m.observer(shared);
  EXPECT_EQ(obs.min_val(), lo);
  EXPECT_EQ(obs.max_val(), hi);
  convert(*model);
  for (size_t i = 0; i < inputs.size(); ++i) EXPECT_GT(sqnr_of((*model)(inputs[i]), refs[i]), kMinSqnrDb);
}

// ---------------------------------------------------------------------------------------------

// A conv, then one binary op on its output chosen by `kind`.
struct BinaryNet : nn::CallableModule<BinaryNet> {
  enum Kind {
    kSelfAdd,
    kAddScalar,
    kScalarAdd,
    kMulScalar,
    kScalarMul,
    kMulTensor,
    kSubScalar,
    kSubTensor,
    kDivScalar,
    kDivTensor
  };
  explicit BinaryNet(Kind k) : kind(k) {
    conv = register_module("conv", std::make_shared<Conv2d>(3, 4, 3, 1, 1));
    conv2 = register_module("conv2", std::make_shared<Conv2d>(3, 4, 1));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    switch (kind) {
      case kSelfAdd:
        return y + y;
      case kAddScalar:
        return y + 1.0;
      case kScalarAdd:
        return 1.0 + y;
      case kMulScalar:
        return y * 0.5;
      case kScalarMul:
        return 2.0 * y;
      case kMulTensor:
        return y * (*conv2)(x);
      case kSubScalar:
        return y - 0.5;
      case kSubTensor:
        return y - (*conv2)(x);
      case kDivScalar:
        return y / 2.0;
      case kDivTensor:
        return y / ((*conv2)(x) * (*conv2)(x) + 1.0);
    }
    return y;
  }
  Kind kind;
  std::shared_ptr<Conv2d> conv, conv2;
};

struct Prepared {
  std::shared_ptr<BinaryNet> model;
  std::vector<Tensor> inputs, refs;
};

Prepared prepare_binary(BinaryNet::Kind kind) {
  manual_seed(7);
  Prepared p;
  p.model = std::make_shared<BinaryNet>(kind);
  p.inputs = image_batches(3, 50);
  p.refs = fp32_refs(*p.model, p.inputs);
  prepare(*p.model, {p.inputs[0]});
  return p;
}

TEST(PrepareOps, AddSameTensorTwice) {
  Prepared p = prepare_binary(BinaryNet::kSelfAdd);
  AutoQuantizationState& s = state_of(*p.model);
  ASSERT_EQ(seen_kinds(s), (std::vector<OpKind>{OpKind::kConv2d, OpKind::kAdd}));
  const SeenOpInfo& conv = s.seen_ops()[0];
  const SeenOpInfo& add = s.seen_ops()[1];
  // y + y reads y twice: no conv+add fusion.
  EXPECT_FALSE(conv.fusion.fused());
  EXPECT_FALSE(add.fusion.fused());
  EXPECT_EQ(add.role, QuantRole::kBinary);
  ASSERT_EQ(add.inputs.size(), 2u);
  EXPECT_EQ(add.inputs[0].id, add.inputs[1].id);
  EXPECT_EQ(add.inputs[0].id, conv.outputs[0].id);
  EXPECT_EQ(add.input_observers, (std::vector<int>{-1, -1}));  // already u8 from the conv
  EXPECT_GE(add.output_observer, 0);
  ModelQuantState& m = model_quant_state(*p.model);
  EXPECT_NE(m.find(add.output_observer), m.find(conv.output_observer));
  EXPECT_EQ(observer_roots(m).size(), 3u);  // x, conv output, add output
  calibrate_convert_compare(*p.model, p.inputs, p.refs);
}

TEST(PrepareOps, ScalarAddAndMulReuseInputParameters) {
  for (BinaryNet::Kind kind :
       {BinaryNet::kAddScalar, BinaryNet::kScalarAdd, BinaryNet::kMulScalar, BinaryNet::kScalarMul}) {
    SCOPED_TRACE(static_cast<int>(kind));
    Prepared p = prepare_binary(kind);
    AutoQuantizationState& s = state_of(*p.model);
    const OpKind expected =
        kind == BinaryNet::kAddScalar || kind == BinaryNet::kScalarAdd ? OpKind::kAdd : OpKind::kMul;
    ASSERT_EQ(seen_kinds(s), (std::vector<OpKind>{OpKind::kConv2d, expected}));
    const SeenOpInfo& op = s.seen_ops()[1];
    EXPECT_TRUE(op.has_scalar);
    EXPECT_EQ(op.scalar_first, kind == BinaryNet::kScalarAdd || kind == BinaryNet::kScalarMul);
    EXPECT_EQ(op.role, QuantRole::kBinary);
    EXPECT_FALSE(op.fusion.fused());
    EXPECT_EQ(op.output_observer, -1);
    EXPECT_EQ(op.input_observers, std::vector<int>{-1});
    EXPECT_EQ(op.inputs[0].inf_dtype, DType::kU8);
    EXPECT_EQ(op.outputs[0].inf_dtype, DType::kU8);
    ModelQuantState& m = model_quant_state(*p.model);
    EXPECT_EQ(m.tensor(op.outputs[0].id)->slot, -1);  // parameters derived at convert
    EXPECT_EQ(observer_roots(m).size(), 2u);          // x and the conv output only
    calibrate_convert_compare(*p.model, p.inputs, p.refs);
  }
}

TEST(PrepareOps, TensorTensorMulHasItsOwnObserver) {
  Prepared p = prepare_binary(BinaryNet::kMulTensor);
  AutoQuantizationState& s = state_of(*p.model);
  ASSERT_EQ(seen_kinds(s), (std::vector<OpKind>{OpKind::kConv2d, OpKind::kConv2d, OpKind::kMul}));
  const SeenOpInfo& mul = s.seen_ops()[2];
  EXPECT_FALSE(mul.has_scalar);
  EXPECT_EQ(mul.role, QuantRole::kBinary);
  EXPECT_GE(mul.output_observer, 0);
  EXPECT_EQ(mul.input_observers, (std::vector<int>{-1, -1}));
  EXPECT_EQ(observer_roots(model_quant_state(*p.model)).size(), 4u);  // x, conv, conv2, mul
  calibrate_convert_compare(*p.model, p.inputs, p.refs);
}

TEST(PrepareOps, SubAndDivWithAScalarStayInt8AndTensorSubDivRunFp32) {
  for (BinaryNet::Kind kind :
       {BinaryNet::kSubScalar, BinaryNet::kSubTensor, BinaryNet::kDivScalar, BinaryNet::kDivTensor}) {
    SCOPED_TRACE(static_cast<int>(kind));
    Prepared p = prepare_binary(kind);
    AutoQuantizationState& s = state_of(*p.model);
    const bool is_sub = kind == BinaryNet::kSubScalar || kind == BinaryNet::kSubTensor;
    const bool scalar = kind == BinaryNet::kSubScalar || kind == BinaryNet::kDivScalar;
    const SeenOpInfo* op = nullptr;
    for (const SeenOpInfo& o : s.seen_ops()) {
      if (o.kind == (is_sub ? OpKind::kSub : OpKind::kDiv)) op = &o;
    }
    ASSERT_NE(op, nullptr);
    // x - c and x / c derive their parameters from x's (no observer of their own); a tensor sub
    // or div has no int8 kernel and runs in fp32 on dequantized inputs.
    EXPECT_EQ(op->role, scalar ? QuantRole::kBinary : QuantRole::kNone);
    EXPECT_EQ(op->output_observer, -1);
    EXPECT_GE(s.seen_ops()[0].output_observer, 0);
    calibrate_convert_compare(*p.model, p.inputs, p.refs);
  }
}

}  // namespace
}  // namespace dbrq
