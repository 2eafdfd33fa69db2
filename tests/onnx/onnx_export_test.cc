// export_onnx (tracer/onnx_export.h): the graph it writes for a converted model (read back with a
// small protobuf wire-format reader written here, independent of the exporter's writer), the path
// of a model with control flow, and its bad inputs. ONNX Runtime running the exports of the zoo
// models is tools/onnx/interop_check.sh (tools/run_tests.sh's onnx stage).
#include <gtest/gtest.h>

#include <algorithm>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

// ---- a protobuf reader: fields of one message ----
struct Field {
  int number = 0;
  int wire = 0;
  uint64_t varint = 0;
  std::string bytes;  // length-delimited
  float f32 = 0.f;
};

std::vector<Field> parse(const std::string& s) {
  std::vector<Field> out;
  size_t i = 0;
  auto varint = [&]() {
    uint64_t v = 0;
    int shift = 0;
    while (true) {
      if (i >= s.size()) throw std::runtime_error("truncated varint");
      const uint8_t b = static_cast<uint8_t>(s[i++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
      shift += 7;
    }
    return v;
  };
  while (i < s.size()) {
    const uint64_t key = varint();
    Field f;
    f.number = static_cast<int>(key >> 3);
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) {
      f.varint = varint();
    } else if (f.wire == 2) {
      const uint64_t n = varint();
      if (i + n > s.size()) throw std::runtime_error("truncated field");
      f.bytes = s.substr(i, n);
      i += n;
    } else if (f.wire == 5) {
      std::memcpy(&f.f32, &s[i], 4);
      i += 4;
    } else {
      throw std::runtime_error("unexpected wire type " + std::to_string(f.wire));
    }
    out.push_back(std::move(f));
  }
  return out;
}

struct NodeR {
  std::string op;
  std::vector<std::string> in, out;
  std::map<std::string, int64_t> int_attrs;
};
struct InitR {
  int type = 0;
  std::vector<int64_t> dims;
  std::string raw;
};
struct ModelR {
  int64_t ir = 0, opset = 0;
  std::vector<NodeR> nodes;
  std::map<std::string, InitR> inits;
  std::vector<std::string> inputs, outputs;
  std::vector<std::vector<int64_t>> input_dims, output_dims;

  int count(const std::string& op) const {
    int n = 0;
    for (const NodeR& x : nodes) n += x.op == op ? 1 : 0;
    return n;
  }
  const NodeR* producer(const std::string& v) const {
    for (const NodeR& x : nodes) {
      for (const std::string& o : x.out) {
        if (o == v) return &x;
      }
    }
    return nullptr;
  }
  std::vector<float> floats(const std::string& init) const {
    const InitR& t = inits.at(init);
    EXPECT_EQ(t.type, 1);
    std::vector<float> v(t.raw.size() / 4);
    std::memcpy(v.data(), t.raw.data(), t.raw.size());
    return v;
  }
};

std::vector<int64_t> value_dims(const std::string& value_info) {
  std::vector<int64_t> dims;
  for (const Field& f : parse(value_info)) {
    if (f.number != 2) continue;                          // type
    for (const Field& tt : parse(f.bytes)) {              // tensor_type
      for (const Field& sh : parse(tt.bytes)) {
        if (sh.number != 2) continue;                     // shape
        for (const Field& d : parse(sh.bytes)) dims.push_back(static_cast<int64_t>(parse(d.bytes).at(0).varint));
      }
    }
  }
  return dims;
}

std::string name_of(const std::string& msg, int field) {
  for (const Field& f : parse(msg)) {
    if (f.number == field) return f.bytes;
  }
  return "";
}

ModelR read_model(const std::string& bytes) {
  ModelR m;
  std::string graph;
  for (const Field& f : parse(bytes)) {
    if (f.number == 1) m.ir = static_cast<int64_t>(f.varint);
    if (f.number == 7) graph = f.bytes;
    if (f.number == 8) {
      for (const Field& o : parse(f.bytes)) {
        if (o.number == 2) m.opset = static_cast<int64_t>(o.varint);
      }
    }
  }
  for (const Field& f : parse(graph)) {
    if (f.number == 1) {
      NodeR n;
      for (const Field& g : parse(f.bytes)) {
        if (g.number == 1) n.in.push_back(g.bytes);
        if (g.number == 2) n.out.push_back(g.bytes);
        if (g.number == 4) n.op = g.bytes;
        if (g.number == 5) {
          std::string name;
          int64_t i = 0;
          for (const Field& a : parse(g.bytes)) {
            if (a.number == 1) name = a.bytes;
            if (a.number == 3) i = static_cast<int64_t>(a.varint);
          }
          n.int_attrs[name] = i;
        }
      }
      m.nodes.push_back(n);
    } else if (f.number == 5) {
      InitR t;
      std::string name;
      for (const Field& g : parse(f.bytes)) {
        if (g.number == 1) t.dims.push_back(static_cast<int64_t>(g.varint));
        if (g.number == 2) t.type = static_cast<int>(g.varint);
        if (g.number == 8) name = g.bytes;
        if (g.number == 9) t.raw = g.bytes;
      }
      m.inits[name] = t;
    } else if (f.number == 11) {
      m.inputs.push_back(name_of(f.bytes, 1));
      m.input_dims.push_back(value_dims(f.bytes));
    } else if (f.number == 12) {
      m.outputs.push_back(name_of(f.bytes, 1));
      m.output_dims.push_back(value_dims(f.bytes));
    }
  }
  return m;
}

// ---- models ----

struct ResNetLike : nn::CallableModule<ResNetLike> {
  ResNetLike() {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2dImpl>(3, 8, 3, 1, 1));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2dImpl>(8));
    conv2 = register_module("conv2", std::make_shared<nn::Conv2dImpl>(8, 8, 3, 1, 1));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(16, 4));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = relu((*bn1)((*conv1)(x)));
    Tensor z = relu(add((*conv2)(y), y));
    Tensor p = max_pool2d(z, {2, 2});
    Tensor c = cat({p, p}, 1);
    return (*fc)(flatten(adaptive_avg_pool2d(c, {1, 1}), 1));
  }
  std::shared_ptr<nn::Conv2dImpl> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2dImpl> bn1;
  std::shared_ptr<nn::LinearImpl> fc;
};

std::shared_ptr<ResNetLike> converted_resnet_like() {
  manual_seed(3);
  auto m = std::make_shared<ResNetLike>();
  testing::randomize_bn(*m->bn1, 4);
  m->eval();
  prepare(*m, {randn({2, 3, 8, 8}, 1)});
  for (int i = 0; i < 4; ++i) (*m)(randn({2, 3, 8, 8}, 20 + i));
  convert(*m);
  return m;
}

TEST(OnnxExport, QdqGraphCarriesDbrqsParameters) {
  auto m = converted_resnet_like();
  const Tensor x = randn({2, 3, 8, 8}, 7);
  OnnxExportSummary summary;
  const ModelR g = read_model(export_onnx_bytes(*m, {x}, {}, &summary));
  EXPECT_EQ(g.ir, 8);
  EXPECT_EQ(g.opset, 17);
  ASSERT_EQ(g.inputs, std::vector<std::string>{"input_0"});
  EXPECT_EQ(g.input_dims[0], (std::vector<int64_t>{2, 3, 8, 8}));  // NCHW, whatever dbrq's layout
  ASSERT_EQ(g.outputs, std::vector<std::string>{"output_0"});
  EXPECT_EQ(g.output_dims[0], (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(g.count("Conv"), 2);
  EXPECT_EQ(g.count("Gemm"), 1);
  EXPECT_EQ(g.count("BatchNormalization"), 0);  // folded into conv1's weights
  EXPECT_EQ(g.count("Add"), 1);                 // the residual add
  EXPECT_EQ(g.count("Relu"), 2);
  EXPECT_EQ(g.count("MaxPool"), 1);
  EXPECT_EQ(g.count("Concat"), 1);
  EXPECT_EQ(g.count("GlobalAveragePool"), 1);
  EXPECT_EQ(summary.nodes, static_cast<int64_t>(g.nodes.size()));
  EXPECT_EQ(summary.quantize_nodes, g.count("QuantizeLinear"));

  const std::vector<QuantizedOpInfo> ops = quantized_ops(*m);
  ASSERT_EQ(ops[0].op, "conv2d+batch_norm+relu");
  // conv1 reads the quantized input: QuantizeLinear(input_0) with dbrq's input parameters.
  const NodeR* conv1 = nullptr;
  for (const NodeR& n : g.nodes) {
    if (n.op == "Conv") {
      conv1 = &n;
      break;
    }
  }
  ASSERT_NE(conv1, nullptr);
  const NodeR* x_dq = g.producer(conv1->in[0]);
  ASSERT_NE(x_dq, nullptr);
  ASSERT_EQ(x_dq->op, "DequantizeLinear");
  const NodeR* x_q = g.producer(x_dq->in[0]);
  ASSERT_NE(x_q, nullptr);
  ASSERT_EQ(x_q->op, "QuantizeLinear");
  EXPECT_EQ(x_q->in[0], "input_0");
  EXPECT_EQ(g.floats(x_q->in[1]), std::vector<float>{ops[0].input_qparams[0]->scale()});
  ASSERT_EQ(g.inits.at(x_q->in[2]).type, 2);  // u8 zero point
  EXPECT_EQ(static_cast<uint8_t>(g.inits.at(x_q->in[2]).raw[0]), ops[0].input_qparams[0]->zero_point());
  // Its weights: s8 codes [8, 3, 3, 3] with the per-channel scales of the folded weights (axis 0).
  const NodeR* w_dq = g.producer(conv1->in[1]);
  ASSERT_NE(w_dq, nullptr);
  ASSERT_EQ(w_dq->op, "DequantizeLinear");
  EXPECT_EQ(w_dq->int_attrs.at("axis"), 0);
  const InitR& w = g.inits.at(w_dq->in[0]);
  EXPECT_EQ(w.type, 3);
  EXPECT_EQ(w.dims, (std::vector<int64_t>{8, 3, 3, 3}));
  EXPECT_EQ(g.floats(w_dq->in[1]), ops[0].weight_qparams->scales);
  // The codes dequantize to the folded weights within half a step.
  const std::vector<float> w_f = m->conv1->weight.to_vector<float>();
  const std::vector<float> gamma = m->bn1->weight.to_vector<float>(), var = m->bn1->running_var.to_vector<float>();
  for (int k = 0; k < 8; ++k) {
    const float mult = gamma[k] / std::sqrt(var[k] + 1e-5f), s = ops[0].weight_qparams->scales[k];
    for (int i = 0; i < 27; ++i) {
      const int8_t code = static_cast<int8_t>(w.raw[static_cast<size_t>(k * 27 + i)]);
      EXPECT_NEAR(code * s, w_f[static_cast<size_t>(k * 27 + i)] * mult, 0.5f * s + 1e-6f) << k << " " << i;
    }
  }
  // Its bias: s32 with scale input scale x weight scale.
  ASSERT_EQ(conv1->in.size(), 3u);
  const NodeR* b_dq = g.producer(conv1->in[2]);
  ASSERT_NE(b_dq, nullptr);
  EXPECT_EQ(g.inits.at(b_dq->in[0]).type, 6);
  const std::vector<float> bs = g.floats(b_dq->in[1]);
  ASSERT_EQ(bs.size(), 8u);
  for (int k = 0; k < 8; ++k) {
    EXPECT_FLOAT_EQ(bs[k], ops[0].input_qparams[0]->scale() * ops[0].weight_qparams->scales[k]);
  }
  // conv1's chain ends in Relu -> QuantizeLinear with the chain's output parameters.
  const NodeR* relu = nullptr;
  for (const NodeR& n : g.nodes) {
    if (n.op == "Relu" && g.producer(n.in[0]) == conv1) relu = &n;
  }
  ASSERT_NE(relu, nullptr);
  bool quantized_after = false;
  for (const NodeR& n : g.nodes) {
    if (n.op == "QuantizeLinear" && n.in[0] == relu->out[0]) {
      quantized_after = true;
      EXPECT_EQ(g.floats(n.in[1]), std::vector<float>{ops[0].output_qparams->scale()});
    }
  }
  EXPECT_TRUE(quantized_after);
  // The output is the linear's int8 result dequantized: one step is its scale.
  const QuantizedOpInfo& fc = ops.back();
  ASSERT_EQ(fc.op, "linear");
  ASSERT_EQ(summary.output_scales.size(), 1u);
  EXPECT_FLOAT_EQ(summary.output_scales[0], fc.output_qparams->scale());
  // Exporting leaves the model as it was: it still computes what it computed before.
  const Tensor before = (*m)(x);
  export_onnx_bytes(*m, {x});
  EXPECT_EQ(testing::values((*m)(x)), testing::values(before));
}

// MobileNetV2's residual block: conv + batch norm in a child Sequential, `x + conv(x)` in the
// root. dbrq runs the add as the conv's sum post-op (fusion across modules), so the graph adds
// the residual to the conv's unquantized result, as it does for a residual block in one module.
struct SplitResidualBlock : nn::CallableModule<SplitResidualBlock> {
  SplitResidualBlock() {
    auto c = std::make_shared<nn::Conv2dImpl>(8, 8, 3, 1, 1);
    bn = std::make_shared<nn::BatchNorm2dImpl>(8);
    body = register_module("body", std::make_shared<nn::SequentialImpl>(c, bn));
  }
  Tensor forward(const Tensor& x) { return relu(x + (*body)(x)); }
  std::shared_ptr<nn::BatchNorm2dImpl> bn;
  std::shared_ptr<nn::SequentialImpl> body;
};

TEST(OnnxExport, ResidualAddOfAnotherModulesConvAddsItsUnquantizedResult) {
  manual_seed(5);
  SplitResidualBlock m;
  testing::randomize_bn(*m.bn, 6);
  m.eval();
  prepare(m, {randn({2, 8, 6, 6}, 1)});
  for (int i = 0; i < 4; ++i) m(randn({2, 8, 6, 6}, 30 + i));
  convert(m);
  ASSERT_GE(testing::state_of(*m.body).seen_ops().back().absorbs, 0);
  const ModelR g = read_model(export_onnx_bytes(m, {randn({2, 8, 6, 6}, 9)}));
  EXPECT_EQ(g.count("Conv"), 1);
  EXPECT_EQ(g.count("BatchNormalization"), 0);
  ASSERT_EQ(g.count("Add"), 1);
  const NodeR* add = nullptr;
  for (const NodeR& n : g.nodes) {
    if (n.op == "Add") add = &n;
  }
  // One input is the Conv's own output (no QuantizeLinear in between), the other the residual.
  const NodeR* a = g.producer(add->in[0]);
  const NodeR* b = g.producer(add->in[1]);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->op, "Conv");
  EXPECT_EQ(b->op, "DequantizeLinear");
  // Then the relu, and the chain's one quantize with the relu's parameters.
  const NodeR* relu = nullptr;
  for (const NodeR& n : g.nodes) {
    if (n.op == "Relu" && n.in[0] == add->out[0]) relu = &n;
  }
  ASSERT_NE(relu, nullptr);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  bool quantized_after = false;
  for (const NodeR& n : g.nodes) {
    if (n.op == "QuantizeLinear" && n.in[0] == relu->out[0]) {
      quantized_after = true;
      EXPECT_EQ(g.floats(n.in[1]), std::vector<float>{ops.back().output_qparams->scale()});
    }
  }
  EXPECT_TRUE(quantized_after);
}

TEST(OnnxExport, WritesTheFileAtomically) {
  auto m = converted_resnet_like();
  const std::string dir = ::testing::TempDir() + "/onnx_export_ok";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/model.onnx";
  const OnnxExportSummary s = export_onnx(*m, {randn({1, 3, 8, 8}, 2)}, path);
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), s.bytes);
  EXPECT_EQ(read_model(bytes).input_dims[0], (std::vector<int64_t>{1, 3, 8, 8}));  // the example's batch
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1);  // no temporary left
}

// A branch chosen by the caller: each export writes the path its call took.
struct Branchy : nn::CallableModule<Branchy> {
  Branchy() { conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(3, 4, 1)); }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    return use_sigmoid ? sigmoid(y) : tanh(y);
  }
  bool use_sigmoid = true;
  std::shared_ptr<nn::Conv2dImpl> conv;
};

TEST(OnnxExport, ExportsThePathTheExampleTakes) {
  manual_seed(5);
  Branchy m;
  m.eval();
  prepare(m, {randn({1, 3, 4, 4}, 1)});
  for (int i = 0; i < 3; ++i) {
    m.use_sigmoid = i % 2 == 0;
    m(randn({1, 3, 4, 4}, 30 + i));
  }
  convert(m);
  m.use_sigmoid = true;
  const ModelR a = read_model(export_onnx_bytes(m, {randn({1, 3, 4, 4}, 3)}));
  EXPECT_EQ(a.count("Sigmoid"), 1);
  EXPECT_EQ(a.count("Tanh"), 0);
  m.use_sigmoid = false;
  OnnxExportSummary summary;
  const ModelR b = read_model(export_onnx_bytes(m, {randn({1, 3, 4, 4}, 3)}, {}, &summary));
  EXPECT_EQ(b.count("Sigmoid"), 0);
  EXPECT_EQ(b.count("Tanh"), 1);
  // The summary names the module whose other path the graph does not hold (the root: "").
  EXPECT_EQ(summary.modules_with_other_paths, std::vector<std::string>{""});
}

TEST(OnnxExport, OnePathModelsNameNoModuleWithOtherPaths) {
  auto m = converted_resnet_like();
  OnnxExportSummary summary;
  export_onnx_bytes(*m, {randn({1, 3, 8, 8}, 3)}, {}, &summary);
  EXPECT_TRUE(summary.modules_with_other_paths.empty());
}

// One relu record after two calls of a batch norm: after conv + max_pool (int8, the bn + relu
// chain fused) and on the model's input (the bn's second record runs fp32). The second relu
// computes in fp32 (QuantInterceptor::seen_op); the export dropped it (the chain's base "already
// wrote it"), so the graph's second output had the batch norm's negative values.
// (testing::SharedBn, tests/quant/quant_test_util.h)
TEST(OnnxExport, AChainMemberAfterAnFp32BaseIsWrittenAsItRuns) {
  manual_seed(11);
  testing::SharedBn m;
  testing::randomize_bn(*m.bn, 3);
  m.eval();
  const auto xs = testing::random_batches(4, 30, {1, 4, 8, 8});
  prepare(m, {xs[0]});
  for (const Tensor& x : xs) m(x);
  convert(m);
  const ModelR g = read_model(export_onnx_bytes(m, {xs[1]}));
  EXPECT_EQ(g.count("Relu"), 2) << "the relu after the fp32 batch norm is missing";
  // The second output is the relu's, computed in float from the batch norm's float output.
  ASSERT_EQ(g.outputs.size(), 2u);
  const NodeR* last = g.producer(g.outputs[1]);
  while (last != nullptr && last->op == "Identity") last = g.producer(last->in[0]);
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(last->op, "Relu");
}

// An output dbrq computes in fp32 (exp) from an int8 tensor (the conv's): with
// int8_inputs_of_fp32_outputs that tensor is an output too, with its scale and dbrq's values.
struct Fp32Tail : nn::CallableModule<Fp32Tail> {
  Fp32Tail() { conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(3, 4, 1)); }
  Tensor forward(const Tensor& x) { return exp((*conv)(x)); }
  std::shared_ptr<nn::Conv2dImpl> conv;
};

TEST(OnnxExport, Int8InputOfAnFp32Output) {
  manual_seed(6);
  Fp32Tail m;
  m.eval();
  prepare(m, {randn({1, 3, 4, 4}, 1)});
  for (int i = 0; i < 3; ++i) m(randn({1, 3, 4, 4}, 40 + i));
  convert(m);
  const Tensor x = randn({1, 3, 4, 4}, 3);
  OnnxExportSummary plain;
  const ModelR a = read_model(export_onnx_bytes(m, {x}, {}, &plain));
  EXPECT_EQ(a.outputs, std::vector<std::string>{"output_0"});
  EXPECT_EQ(plain.output_scales, std::vector<float>{0.f});  // fp32: no quantization step
  EXPECT_EQ(a.count("Exp"), 1);
  OnnxExportOptions options;
  options.int8_inputs_of_fp32_outputs = true;
  OnnxExportSummary s;
  const ModelR b = read_model(export_onnx_bytes(m, {x}, options, &s));
  EXPECT_EQ(b.outputs, (std::vector<std::string>{"output_0", "output_0_int8_input"}));
  EXPECT_EQ(s.output_names, b.outputs);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  ASSERT_EQ(ops[0].op, "conv2d");
  ASSERT_EQ(s.output_scales.size(), 2u);
  EXPECT_EQ(s.output_scales[1], ops[0].output_qparams->scale());
  ASSERT_EQ(s.output_values.size(), 2u);
  EXPECT_EQ(testing::values(s.output_values[0]), testing::values(m(x)));
  // exp of the dequantized conv output is the fp32 output.
  const std::vector<float> conv_out = testing::values(s.output_values[1]), out = testing::values(s.output_values[0]);
  ASSERT_EQ(conv_out.size(), out.size());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(std::exp(conv_out[i]), out[i], 1e-5f * out[i]) << i;
}

// conv_transpose2d: dbrq's kernel runs output-major codes [K, C, R, S]; ONNX's ConvTranspose takes
// [C, K, R, S] with the per-output-channel scales on axis 1.
struct Deconv : nn::CallableModule<Deconv> {
  Deconv() {
    up = register_module("up", std::make_shared<nn::ConvTranspose2dImpl>(
                                    nn::ConvTranspose2dOptions(3, 5, 3).stride(2).padding(1).output_padding(1)));
  }
  Tensor forward(const Tensor& x) { return relu((*up)(x)); }
  std::shared_ptr<nn::ConvTranspose2dImpl> up;
};

TEST(OnnxExport, ConvTransposeWeightsInOnnxLayout) {
  manual_seed(8);
  Deconv m;
  m.eval();
  prepare(m, {randn({1, 3, 4, 4}, 1)});
  for (int i = 0; i < 3; ++i) m(randn({1, 3, 4, 4}, 50 + i));
  convert(m);
  const ModelR g = read_model(export_onnx_bytes(m, {randn({1, 3, 4, 4}, 2)}));
  const NodeR* ct = nullptr;
  for (const NodeR& n : g.nodes) {
    if (n.op == "ConvTranspose") ct = &n;
  }
  ASSERT_NE(ct, nullptr);
  EXPECT_EQ(g.output_dims[0], (std::vector<int64_t>{1, 5, 8, 8}));
  const NodeR* w_dq = g.producer(ct->in[1]);
  ASSERT_NE(w_dq, nullptr);
  ASSERT_EQ(w_dq->op, "DequantizeLinear");
  EXPECT_EQ(w_dq->int_attrs.at("axis"), 1);
  const InitR& w = g.inits.at(w_dq->in[0]);
  EXPECT_EQ(w.dims, (std::vector<int64_t>{3, 5, 3, 3}));  // PyTorch's and ONNX's [C, K, R, S]
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  const std::vector<float> scales = g.floats(w_dq->in[1]);
  ASSERT_EQ(scales, ops[0].weight_qparams->scales);
  // Each code dequantizes to the layer's weight at the same [c, k, r, s] within half a step.
  const std::vector<float> wf = m.up->weight.to_vector<float>();
  for (size_t i = 0; i < wf.size(); ++i) {
    const size_t k = (i / 9) % 5;
    EXPECT_NEAR(static_cast<int8_t>(w.raw[i]) * scales[k], wf[i], 0.5f * scales[k] + 1e-6f) << i;
  }
}

// ---- bad inputs ----

TEST(OnnxExportErrors, UnpreparedModel) {
  ResNetLike m;
  m.eval();
  const std::string path = ::testing::TempDir() + "/unprepared.onnx";
  EXPECT_THROW_MSG(export_onnx(m, {randn({1, 3, 8, 8}, 1)}, path), UsageError, "export_onnx: ResNetLike is not a prepared model");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(OnnxExportErrors, PreparedButNotConverted) {
  manual_seed(3);
  ResNetLike m;
  m.eval();
  prepare(m, {randn({1, 3, 8, 8}, 1)});
  m(randn({1, 3, 8, 8}, 2));
  const std::string path = ::testing::TempDir() + "/unconverted.onnx";
  EXPECT_THROW_MSG(export_onnx(m, {randn({1, 3, 8, 8}, 1)}, path), UsageError, "export_onnx: ResNetLike is prepared but not converted (phase: calibrating)");
  EXPECT_FALSE(std::filesystem::exists(path));
}

// relu(conv(x)) + 1.26: dbrq's int8 add_scalar shifts the zero point by round(c / s) steps and
// rescales when that leaves [0, 255] (zero point 0 here): it adds c rounded to the input's grid.
// The export wrote Add(x, 1.26): 101 of 256 codes a step apart on a 0.1 scale. It now adds what
// dbrq adds.
struct ScalarShift : nn::CallableModule<ScalarShift> {
  ScalarShift() { conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(3, 4, 1)); }
  Tensor forward(const Tensor& x) { return relu((*conv)(x)) + 1.26; }
  std::shared_ptr<nn::Conv2dImpl> conv;
};

TEST(OnnxExport, AScalarAddAddsTheShiftDbrqApplies) {
  manual_seed(9);
  ScalarShift m;
  m.eval();
  prepare(m, {randn({1, 3, 4, 4}, 1)});
  for (int i = 0; i < 3; ++i) m(randn({1, 3, 4, 4}, 50 + static_cast<uint64_t>(i)));
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  const QuantizedOpInfo* add = nullptr;
  for (const QuantizedOpInfo& o : ops) add = o.kind == OpKind::kAdd ? &o : add;
  ASSERT_NE(add, nullptr);
  ASSERT_EQ(add->input_qparams.size(), 1u);
  ASSERT_NE(add->input_qparams[0], nullptr) << "the scalar add runs int8";
  const double s = add->input_qparams[0]->scale();
  EXPECT_EQ(add->input_qparams[0]->zero_point(), 0);
  const ModelR g = read_model(export_onnx_bytes(m, {randn({1, 3, 4, 4}, 3)}));
  int adds = 0;
  for (const NodeR& n : g.nodes) {
    if (n.op != "Add") continue;
    ++adds;
    ASSERT_EQ(n.in.size(), 2u);
    const std::vector<float> k = g.floats(n.in[1]);
    ASSERT_EQ(k.size(), 1u);
    EXPECT_FLOAT_EQ(k[0], static_cast<float>(std::nearbyint(1.26 / s) * s)) << "scale " << s;
    EXPECT_NE(k[0], 1.26f);
  }
  EXPECT_EQ(adds, 1);
}

// int8 prelu runs s8 slopes (one grid for every channel with a per-tensor weight qconfig): the
// export writes those codes with their scales (it wrote the f32 parameter).
struct PreluNet : nn::CallableModule<PreluNet> {
  PreluNet() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(3, 4, 1));
    act = register_module("act", std::make_shared<nn::PReLUImpl>(4));
  }
  Tensor forward(const Tensor& x) { return (*act)((*conv)(x)); }
  std::shared_ptr<nn::Conv2dImpl> conv;
  std::shared_ptr<nn::PReLUImpl> act;
};

TEST(OnnxExport, Int8PreluSlopesAreTheKernelsCodes) {
  manual_seed(12);
  PreluNet m;
  m.eval();
  m.act->weight.copy_(from_vector<float>({0.25f, 0.013f, 0.3f, 0.77f}));
  prepare(m, {randn({1, 3, 4, 4}, 1)});
  for (int i = 0; i < 3; ++i) m(randn({1, 3, 4, 4}, 60 + static_cast<uint64_t>(i)));
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  ASSERT_EQ(ops.size(), 2u);
  ASSERT_EQ(ops[1].executor.rfind("int8 prelu", 0), 0u) << ops[1].executor;
  const ModelR g = read_model(export_onnx_bytes(m, {randn({1, 3, 4, 4}, 3)}));
  ASSERT_EQ(g.count("PRelu"), 1);
  const NodeR* prelu = nullptr;
  for (const NodeR& n : g.nodes) prelu = n.op == "PRelu" ? &n : prelu;
  const NodeR* reshape = g.producer(prelu->in[1]);
  ASSERT_NE(reshape, nullptr);
  ASSERT_EQ(reshape->op, "Reshape");
  const NodeR* dq = g.producer(reshape->in[0]);
  ASSERT_NE(dq, nullptr) << "the slope is a float initializer";
  EXPECT_EQ(dq->op, "DequantizeLinear");
  EXPECT_EQ(g.inits.at(dq->in[0]).type, 3);  // INT8
}

// prelu with a slope forward computes: refused as the weighted ops' computed weights are.
struct ComputedSlope : nn::CallableModule<ComputedSlope> {
  ComputedSlope() {
    conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(3, 4, 1));
    log_a = register_parameter("log_a", full({4}, -1.5));
  }
  Tensor forward(const Tensor& x) { return prelu((*conv)(x), exp(log_a)); }
  std::shared_ptr<nn::Conv2dImpl> conv;
  Tensor log_a;
};

TEST(OnnxExportErrors, AComputedPreluSlopeIsRefused) {
  manual_seed(13);
  ComputedSlope m;
  m.eval();
  prepare(m, {randn({1, 3, 4, 4}, 1)});
  for (int i = 0; i < 3; ++i) m(randn({1, 3, 4, 4}, 70 + static_cast<uint64_t>(i)));
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  ASSERT_EQ(ops.size(), 2u);
  ASSERT_EQ(ops[1].executor.rfind("int8 prelu", 0), 0u) << ops[1].executor;
  EXPECT_THROW_MSG(export_onnx_bytes(m, {randn({1, 3, 4, 4}, 3)}), ValueError,
                   "export_onnx: prelu () has no ONNX form in dbrq's exporter: its weight is computed in forward");
}

// A linear whose weight forward computes (exp of a parameter): dbrq quantizes it again on every
// call; the int8 export would write one call's codes as a constant.
struct ComputedWeight : nn::CallableModule<ComputedWeight> {
  ComputedWeight() {
    log_w = register_parameter("log_w", randn({6, 8}, 4) * 0.1);
    b = register_parameter("b", randn({6}, 5));
  }
  Tensor forward(const Tensor& x) { return linear(x, exp(log_w), b); }
  Tensor log_w, b;
};

TEST(OnnxExportErrors, AComputedWeightOfAnInt8OpIsRefused) {
  manual_seed(8);
  ComputedWeight m;
  m.eval();
  prepare(m, {randn({2, 8}, 1)});
  for (int i = 0; i < 3; ++i) m(randn({2, 8}, 20 + static_cast<uint64_t>(i)));
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  ASSERT_EQ(ops.size(), 1u);
  ASSERT_EQ(ops[0].op, "linear");
  EXPECT_THROW_MSG(export_onnx_bytes(m, {randn({2, 8}, 3)}), ValueError,
                   "export_onnx: linear () has no ONNX form in dbrq's exporter: its weight is computed in forward, "
                   "not a parameter of the model");
}

struct WithStd : nn::CallableModule<WithStd> {
  WithStd() { conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(3, 4, 1)); }
  Tensor forward(const Tensor& x) { return dbrq::std((*conv)(x), {2, 3}, true, false); }
  std::shared_ptr<nn::Conv2dImpl> conv;
};

TEST(OnnxExportErrors, OpWithoutOnnxFormIsNamedAndLeavesTheOldFile) {
  manual_seed(5);
  WithStd m;
  m.eval();
  prepare(m, {randn({1, 3, 4, 4}, 1)});
  m(randn({1, 3, 4, 4}, 2));
  convert(m);
  const std::string dir = ::testing::TempDir() + "/onnx_export_std";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/model.onnx";
  {
    std::ofstream f(path);
    f << "previous export";
  }
  try {
    export_onnx(m, {randn({1, 3, 4, 4}, 1)}, path);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("export_onnx: std "), std::string::npos) << msg;
    EXPECT_NE(msg.find("has no ONNX form in dbrq's exporter"), std::string::npos) << msg;
    EXPECT_NE(msg.find("WithStd"), std::string::npos) << msg;  // where: the module whose forward ran it
  }
  std::ifstream f(path);
  std::string content;
  std::getline(f, content);
  EXPECT_EQ(content, "previous export");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1);
  // The model still runs after the failed export.
  EXPECT_EQ(m(randn({1, 3, 4, 4}, 1)).sizes()[1], 4);
}

// Filling a buffer through views of it (as a recurrent layer stores its steps): the graph cannot
// say that the buffer changed, so the export refuses instead of writing this call's values as a
// constant. A copy_ into a whole tensor is fine.
struct FillsViews : nn::CallableModule<FillsViews> {
  FillsViews() { fc = register_module("fc", std::make_shared<nn::LinearImpl>(4, 4)); }
  Tensor forward(const Tensor& x) {
    Tensor y = (*fc)(x);
    Tensor buf = zeros({2, 4});
    if (through_view) {
      Tensor row = buf.narrow(0, 0, 1);
      row.copy_(y.narrow(0, 0, 1));
    } else {
      buf.copy_(y);
    }
    return buf + y;
  }
  bool through_view = true;
  std::shared_ptr<nn::LinearImpl> fc;
};

TEST(OnnxExportErrors, InPlaceWritesThroughViews) {
  manual_seed(9);
  FillsViews m;
  m.eval();
  prepare(m, {randn({2, 4}, 1)});
  for (int i = 0; i < 3; ++i) m(randn({2, 4}, 60 + i));
  convert(m);
  EXPECT_THROW_MSG(export_onnx_bytes(m, {randn({2, 4}, 2)}), ValueError,
                   "copy_ has no ONNX form in dbrq's exporter: it writes in place into a tensor that another tensor "
                   "of the call views");
  m.through_view = false;
  const ModelR g = read_model(export_onnx_bytes(m, {randn({2, 4}, 2)}));
  EXPECT_EQ(g.count("Gemm"), 1);
}

TEST(OnnxExportErrors, UnwritablePath) {
  auto m = converted_resnet_like();
  const Tensor x = randn({1, 3, 8, 8}, 1);
  EXPECT_THROW_MSG(export_onnx(*m, {x}, "/nonexistent_dbrq_dir/model.onnx"), IOError, "export_onnx: cannot write \"/nonexistent_dbrq_dir/model.onnx\"");
  // A directory in the way: the rename fails, the temporary is removed.
  const std::string dir = ::testing::TempDir() + "/onnx_export_dir";
  std::filesystem::create_directories(dir + "/model.onnx");
  EXPECT_THROW_MSG(export_onnx(*m, {x}, dir + "/model.onnx"), IOError, "export_onnx: cannot write \"" + dir + "/model.onnx\"");
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 0);
  EXPECT_THROW_MSG(export_onnx(*m, {x}, ""), IOError, "export_onnx: the output path is empty");
}

// A channel whose weights are all zero gets the smallest weight scale, so its bias in ONNX's
// int32 units (input scale x weight scale) overflows: a clear error, never a clamped bias.
struct ZeroChannel : nn::CallableModule<ZeroChannel> {
  ZeroChannel() { conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(3, 4, 3, 1, 1)); }
  Tensor forward(const Tensor& x) { return (*conv)(x); }
  std::shared_ptr<nn::Conv2dImpl> conv;
};

TEST(OnnxExportErrors, BiasBeyondInt32IsRefused) {
  manual_seed(5);
  ZeroChannel m;
  float* w = m.conv->weight.mutable_data<float>();
  for (int64_t i = 0; i < 27; ++i) w[i] = 0.f;  // output channel 0
  m.conv->bias.mutable_data<float>()[0] = 300.f;
  m.eval();
  prepare(m, {randn({1, 3, 6, 6}, 1)});
  for (int i = 0; i < 2; ++i) m(randn({1, 3, 6, 6}, 10 + i));
  convert(m);
  EXPECT_THROW_MSG(export_onnx_bytes(m, {randn({1, 3, 6, 6}, 2)}), ValueError,
                   "the bias of output channel 0 (300) is");
}

// narrow with a negative start (the last step of a sequence) slices from the end.
struct LastStep : nn::CallableModule<LastStep> {
  LastStep() { fc = register_module("fc", std::make_shared<nn::LinearImpl>(4, 2)); }
  Tensor forward(const Tensor& x) { return (*fc)(x.narrow(1, -1, 1).flatten(1)); }
  std::shared_ptr<nn::LinearImpl> fc;
};

TEST(OnnxExport, NarrowFromTheEnd) {
  manual_seed(6);
  LastStep m;
  m.eval();
  prepare(m, {randn({2, 3, 4}, 1)});
  m(randn({2, 3, 4}, 2));
  convert(m);
  const std::string bytes = export_onnx_bytes(m, {randn({2, 3, 4}, 3)});
  const ModelR g = read_model(bytes);
  ASSERT_EQ(g.count("Slice"), 1);
  // Slice(data, starts, ends, axes, steps): starts 2 and ends 3 (-1 + 3), not -1 and 0 (empty).
  for (const NodeR& n : g.nodes) {
    if (n.op != "Slice") continue;
    ASSERT_GE(n.in.size(), 3u);
    auto i64 = [&](const std::string& name) {
      const InitR& t = g.inits.at(name);
      int64_t v = 0;
      EXPECT_EQ(t.raw.size(), 8u);
      std::memcpy(&v, t.raw.data(), 8);
      return v;
    };
    EXPECT_EQ(i64(n.in[1]), 2);
    EXPECT_EQ(i64(n.in[2]), 3);
  }
}

struct SoftmaxNet : nn::CallableModule<SoftmaxNet> {
  SoftmaxNet() {
    fc1 = register_module("fc1", std::make_shared<nn::LinearImpl>(4, 4));
    fc2 = register_module("fc2", std::make_shared<nn::LinearImpl>(4, 2));
  }
  Tensor forward(const Tensor& x) { return (*fc2)(softmax((*fc1)(x), -1)); }
  std::shared_ptr<nn::LinearImpl> fc1, fc2;
};

// An int8 softmax is Softmax -> Min(top) -> QuantizeLinear, top the largest value its u8 output
// represents ((255 - zp) * scale): the same meaning (QuantizeLinear saturates there), and ONNX
// Runtime does not fuse it into its QLinearSoftmax, which wraps a probability that rounds to 1.0
// to code 0 (the decoder LM's one-key attention rows differed by up to 62 steps).
TEST(OnnxExport, Int8SoftmaxSaturatesBeforeItsQuantizeLinear) {
  manual_seed(7);
  SoftmaxNet m;
  m.eval();
  prepare(m, {randn({2, 3, 4}, 1)});
  m(randn({2, 3, 4}, 2));
  convert(m);
  float softmax_scale = 0.f;
  for (const QuantizedOpInfo& op : quantized_ops(m)) {
    if (op.kind == OpKind::kSoftmax && op.output_qparams != nullptr) softmax_scale = op.output_qparams->scale();
  }
  ASSERT_GT(softmax_scale, 0.f) << "the softmax runs int8";
  const ModelR g = read_model(export_onnx_bytes(m, {randn({2, 3, 4}, 3)}));
  ASSERT_EQ(g.count("Softmax"), 1);
  std::string sm_out;
  for (const NodeR& n : g.nodes) {
    if (n.op == "Softmax") sm_out = n.out.at(0);
  }
  int min_nodes = 0;
  for (const NodeR& n : g.nodes) {
    if (std::find(n.in.begin(), n.in.end(), sm_out) == n.in.end()) continue;
    EXPECT_EQ(n.op, "Min") << "the softmax's probabilities go to " << n.op;
    if (n.op != "Min") continue;
    ++min_nodes;
    ASSERT_EQ(n.in.size(), 2u);
    const std::vector<float> top = g.floats(n.in[1]);
    ASSERT_EQ(top.size(), 1u);
    const NodeR* q = nullptr;
    for (const NodeR& c : g.nodes) {
      if (!c.in.empty() && c.in[0] == n.out.at(0)) q = &c;
    }
    ASSERT_NE(q, nullptr);
    ASSERT_EQ(q->op, "QuantizeLinear");
    const std::vector<float> scale = g.floats(q->in.at(1));
    const InitR& zp = g.inits.at(q->in.at(2));
    ASSERT_EQ(scale.size(), 1u);
    ASSERT_EQ(zp.raw.size(), 1u);
    const int zero_point = static_cast<uint8_t>(zp.raw[0]);
    // dbrq's softmax output parameters (observed: a functional softmax, as PyTorch FX) and the
    // cap they imply.
    EXPECT_FLOAT_EQ(scale[0], softmax_scale);
    EXPECT_EQ(zero_point, 0);
    EXPECT_EQ(top[0], static_cast<float>(255 - zero_point) * scale[0]);
  }
  EXPECT_EQ(min_nodes, 1);
}

TEST(OnnxExportErrors, BadExampleInputs) {
  auto m = converted_resnet_like();
  EXPECT_THROW_MSG(export_onnx_bytes(*m, {}), ValueError, "export_onnx: example_inputs is empty");
  EXPECT_THROW_MSG(export_onnx_bytes(*m, {Tensor()}), ValueError, "export_onnx: example input 0 is undefined");
}

}  // namespace
}  // namespace dbrq
