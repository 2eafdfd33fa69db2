// max / argmax along a dim, topk, index_select and gather on int8 codes (issue 12, item 3). A u8
// tensor with per-tensor parameters orders its codes as its real values (scale > 0), so the value
// outputs pick codes and keep the input's parameters (as PyTorch's quantized max / topk do) and
// the index outputs are int64: bit-identical to quantize(fp32 op(dequantize(x))) with the input's
// parameters, and in a converted model nothing is dequantized on the way in.
#include <gtest/gtest.h>

#include <memory>
#include <tuple>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

// Codes with many ties (values in a narrow band): the first of equal values must win on both sides.
Tensor int8_input(std::vector<int64_t> sizes, uint64_t seed) {
  const Tensor f = randn(sizes, seed) * 0.5;
  return quantize_per_tensor(f, 0.02f, 100, DType::kU8);
}

Tensor requant_like(const Tensor& f32, const Tensor& like) {
  return quantize_per_tensor(f32, like.qparams()->scale(), like.qparams()->zero_point(), DType::kU8);
}

void expect_same_codes(const Tensor& got, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(got.dtype(), DType::kU8) << what;
  ASSERT_TRUE(got.is_quantized()) << what;
  EXPECT_EQ(*got.qparams(), *expected.qparams()) << what;
  EXPECT_EQ(got.sizes(), expected.sizes()) << what;
  EXPECT_EQ(got.to_vector<int32_t>(), expected.to_vector<int32_t>()) << what;
}

TEST(Int8IndexOps, ValuesAreCodesOfTheFp32OpAndIndicesMatch) {
  const Tensor x = int8_input({3, 7, 5}, 1);
  const Tensor xf = dequantize(x);
  for (int64_t dim : {0, 1, -1}) {
    for (bool keepdim : {false, true}) {
      auto [v, i] = max(x, dim, keepdim);
      auto [vf, if32] = max(xf, dim, keepdim);
      expect_same_codes(v, requant_like(vf, x), "max dim " + std::to_string(dim));
      EXPECT_EQ(i.dtype(), DType::kS64);
      EXPECT_EQ(i.to_vector<int64_t>(), if32.to_vector<int64_t>()) << "max indices dim " << dim;
      EXPECT_EQ(argmax(x, dim, keepdim).to_vector<int64_t>(), argmax(xf, dim, keepdim).to_vector<int64_t>());
    }
  }
  for (bool largest : {true, false}) {
    auto [v, i] = topk(x, 3, 1, largest);
    auto [vf, if32] = topk(xf, 3, 1, largest);
    expect_same_codes(v, requant_like(vf, x), largest ? "topk largest" : "topk smallest");
    EXPECT_EQ(i.dtype(), DType::kS64);
    EXPECT_EQ(i.to_vector<int64_t>(), if32.to_vector<int64_t>());
  }
  const Tensor idx = from_vector<int64_t>({4, 0, 4, 2}, {4});
  expect_same_codes(index_select(x, 1, idx), requant_like(index_select(xf, 1, idx), x), "index_select");
  const Tensor gidx = from_vector<int64_t>({0, 6, 3, 3, 1, 2, 5, 4, 0, 1, 1, 1}, {2, 2, 3});
  expect_same_codes(gather(x, 1, gidx), requant_like(gather(xf, 1, gidx), x), "gather");
}

struct IndexNet : nn::CallableModule<IndexNet> {
  IndexNet() { fc = register_module("fc", std::make_shared<nn::LinearImpl>(8, 12)); }
  Tensor forward(const Tensor& x) {
    const Tensor h = (*fc)(x);  // int8 after convert
    auto [mv, mi] = max(h, 1);
    auto [tv, ti] = topk(h, 4, 1);
    const Tensor sel = index_select(h, 1, from_vector<int64_t>({11, 0, 5}, {3}));
    const Tensor gat = gather(h, 1, ti);
    last_h = h;
    last_max_indices = mi;
    last_argmax = argmax(h, 1);
    last_topk_indices = ti;
    return cat({mv.unsqueeze(1), tv, sel, gat}, 1);
  }
  std::shared_ptr<nn::LinearImpl> fc;
  Tensor last_h, last_max_indices, last_argmax, last_topk_indices;
};

TEST(Int8IndexOps, ConvertedModelRunsThemOnCodesWithoutDequantize) {
  manual_seed(7);
  IndexNet ref;
  manual_seed(7);
  IndexNet m;
  const Tensor x = randn({4, 8}, 2);
  prepare(m, {x});
  testing::calibrate(m, {4, 8}, 6, 100);
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  QuantParamsPtr fc_out;
  int shared = 0;
  for (const QuantizedOpInfo& o : ops) {
    EXPECT_NE(o.kind, OpKind::kDequantize) << "a dequantize was recorded";
    if (o.kind == OpKind::kLinear) fc_out = o.output_qparams;
  }
  ASSERT_NE(fc_out, nullptr);
  for (const QuantizedOpInfo& o : ops) {
    if (o.kind == OpKind::kMax || o.kind == OpKind::kTopk || o.kind == OpKind::kIndexSelect ||
        o.kind == OpKind::kGather) {
      ++shared;
      EXPECT_EQ(o.role, "share") << o.op;
      EXPECT_EQ(o.executor.rfind("int8 ", 0), 0u) << o.op << ": " << o.executor;
      EXPECT_EQ(o.input_dtypes.at(0), DType::kU8) << o.op;
      EXPECT_EQ(o.output_dtype, DType::kU8) << o.op;
      ASSERT_NE(o.output_qparams, nullptr) << o.op;
      EXPECT_EQ(*o.output_qparams, *fc_out) << o.op << ": values keep the input's parameters";
    }
    // The index outputs are not int8 ops of the program.
    EXPECT_NE(o.kind, OpKind::kArgmax);
    EXPECT_NE(o.kind, OpKind::kTopkIndices);
  }
  EXPECT_EQ(shared, 4);
  const Tensor y = m(x);
  EXPECT_EQ(y.dtype(), DType::kF32);
  EXPECT_GT(testing::sqnr_of(y, ref(x)), 25.0);
  // The index outputs are int64 and those of the codes the converted linear produced.
  ASSERT_EQ(m.last_h.dtype(), DType::kU8);
  const Tensor hf = dequantize(m.last_h);
  EXPECT_EQ(m.last_argmax.dtype(), DType::kS64);
  EXPECT_EQ(m.last_argmax.to_vector<int64_t>(), argmax(hf, 1).to_vector<int64_t>());
  EXPECT_EQ(m.last_max_indices.to_vector<int64_t>(), argmax(hf, 1).to_vector<int64_t>());
  EXPECT_EQ(m.last_topk_indices.to_vector<int64_t>(), std::get<1>(topk(hf, 4, 1)).to_vector<int64_t>());
}

TEST(Int8IndexOps, BadInputs) {
  const Tensor pc = quantize_per_channel(randn({2, 3}, 3), {0.1f, 0.2f}, {0, 0}, 0, DType::kU8);
  const Tensor raw = Tensor::empty({2, 3}, DType::kU8);
  auto expect_dtype_error = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected: " << needle;
    } catch (const DTypeError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_dtype_error([&] { max(pc, 1); }, "max: an int8 input needs per-tensor parameters");
  expect_dtype_error([&] { argmax(pc, 1); }, "argmax: an int8 input needs per-tensor parameters");
  expect_dtype_error([&] { topk(pc, 1, 1); }, "topk: an int8 input needs per-tensor parameters");
  expect_dtype_error([&] { max(raw, 1); }, "max: input must have dtype f32 or be quantized u8, got u8 (not quantized)");
  expect_dtype_error([&] { topk(Tensor::empty({2, 3}, DType::kS64), 1, 1); },
                     "topk: input must have dtype f32 or be quantized u8, got s64");
}

}  // namespace
}  // namespace dbrq
