// Issue 12's spatial ops in prepared and converted models: a DCGAN-style generator
// (ConvTranspose2d + BatchNorm2d + ReLU as one int8 deconvolution each, tanh last) and a small
// U-Net (conv, downsample, transposed-conv upsample, skip cat). Each calibrates, converts, runs
// mostly int8 with its SQNR vs fp32 reported and bounded, and keeps working after a batch-size
// (and image-size) change. fp32 / int8 op parity with PyTorch: tests/ops, tests/int8, tests/kernels.
#include <gtest/gtest.h>

#include <iostream>
#include <memory>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;
using ConvTranspose2d = nn::ConvTranspose2dImpl;
using nn::ConvTranspose2dOptions;

int count_int8(const std::vector<QuantizedOpInfo>& ops, int* total) {
  int n = 0;
  *total = 0;
  for (const QuantizedOpInfo& op : ops) {
    ++*total;
    n += op.executor.rfind("int8", 0) == 0 || op.executor.rfind("fused into", 0) == 0 ||
         op.executor.find("passes int8") != std::string::npos;
  }
  return n;
}

// ---- DCGAN-style generator -----------------------------------------------------------------------

struct Generator : nn::CallableModule<Generator> {
  explicit Generator(int64_t groups = 1) {
    up1 = register_module("up1", std::make_shared<ConvTranspose2d>(ConvTranspose2dOptions(16, 8, 4).bias(false)));
    bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(8));
    up2 = register_module("up2", std::make_shared<ConvTranspose2d>(
                                      ConvTranspose2dOptions(8, 8, 4).stride(2).padding(1).groups(groups).bias(false)));
    bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(8));
    up3 = register_module("up3", std::make_shared<ConvTranspose2d>(ConvTranspose2dOptions(8, 3, 4).stride(2).padding(1)));
    testing::randomize_bn(*bn1, 1);
    testing::randomize_bn(*bn2, 2);
  }
  Tensor forward(const Tensor& z) {
    Tensor y = relu((*bn1)((*up1)(z)));
    y = relu((*bn2)((*up2)(y)));
    return tanh((*up3)(y));
  }
  std::shared_ptr<ConvTranspose2d> up1, up2, up3;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
};

void check_generator(int64_t groups) {
  manual_seed(21);
  Generator ref(groups);
  manual_seed(21);
  Generator g(groups);
  ref.eval();
  g.eval();
  const Tensor z = randn({4, 16, 1, 1}, 5);
  prepare(g, {z});
  EXPECT_EQ(testing::display_kinds(testing::state_of(g)),
            (std::vector<std::string>{"conv_transpose2d+batch_norm+relu", "conv_transpose2d+batch_norm+relu",
                                      "conv_transpose2d", "tanh"}));
  for (int i = 0; i < 8; ++i) g(randn({4, 16, 1, 1}, 100 + i));
  convert(g);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(g);
  ASSERT_EQ(ops.size(), 8u);
  // ConvTranspose2d + BatchNorm2d + ReLU: one int8 deconvolution, batch norm folded, relu fused.
  EXPECT_EQ(ops[0].executor.rfind("int8 conv_transpose2d [16, 8, 4, 4]", 0), 0u) << ops[0].executor;
  EXPECT_NE(ops[0].executor.find("+relu"), std::string::npos) << ops[0].executor;
  EXPECT_EQ(ops[1].executor, "fused into conv_transpose2d+batch_norm+relu");
  EXPECT_EQ(ops[2].executor, "fused into conv_transpose2d+batch_norm+relu");
  EXPECT_EQ(ops[3].executor.rfind("int8 conv_transpose2d", 0), 0u) << ops[3].executor;
  EXPECT_EQ(ops[6].executor.rfind("int8 conv_transpose2d", 0), 0u) << ops[6].executor;
  // Weights per output channel (the default qconfig), after folding: 8 scales for 8 outputs.
  ASSERT_NE(ops[0].weight_qparams, nullptr);
  EXPECT_EQ(ops[0].weight_qparams->scales.size(), 8u);
  int total = 0;
  const int int8 = count_int8(ops, &total);
  const Tensor expected = ref(z), got = g(z);
  EXPECT_EQ(got.dtype(), DType::kF32);
  EXPECT_EQ(got.sizes(), (DimVector{4, 3, 16, 16}));
  const double sqnr = testing::sqnr_of(got, expected);
  std::cout << "[ spatial  ] DCGAN generator (groups " << groups << "): " << int8 << "/" << total
            << " ops int8, SQNR " << sqnr << " dB vs fp32" << std::endl;
  EXPECT_GT(sqnr, 25.0);
  EXPECT_GE(int8, total - 1);  // everything but (at most) the fixed-parameter tanh table
  // A batch-size change after convert: one more primitive per op, same accuracy.
  const Tensor z1 = randn({1, 16, 1, 1}, 77);
  EXPECT_GT(testing::sqnr_of(g(z1), ref(z1)), 25.0);
  const Tensor z7 = randn({7, 16, 1, 1}, 78);
  EXPECT_GT(testing::sqnr_of(g(z7), ref(z7)), 25.0);
}

TEST(SpatialQuant, DcganGeneratorRunsInt8WithFoldedBatchNorm) { check_generator(1); }

// Folding a batch norm into a grouped transposed conv scales output channels, which are not dim 0
// of PyTorch's weight: the fold must see the output-major weight.
TEST(SpatialQuant, DcganGeneratorGroupedFold) { check_generator(2); }

// ---- a small U-Net ---------------------------------------------------------------------------------

struct TinyUNet : nn::CallableModule<TinyUNet> {
  TinyUNet() {
    enc1 = register_module("enc1", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    enc2 = register_module("enc2", std::make_shared<Conv2d>(8, 16, 3, 1, 1));
    bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(16));
    up = register_module("up", std::make_shared<ConvTranspose2d>(ConvTranspose2dOptions(16, 8, 2).stride(2)));
    dec = register_module("dec", std::make_shared<Conv2d>(16, 8, 3, 1, 1));
    head = register_module("head", std::make_shared<Conv2d>(8, 2, 1));
    testing::randomize_bn(*bn2, 4);
  }
  Tensor forward(const Tensor& x) {
    const Tensor skip = relu((*enc1)(x));
    Tensor y = max_pool2d(skip, {2, 2});
    y = relu((*bn2)((*enc2)(y)));
    y = relu((*up)(y));
    y = cat({y, skip}, 1);
    y = relu((*dec)(y));
    return (*head)(y);
  }
  std::shared_ptr<Conv2d> enc1, enc2, dec, head;
  std::shared_ptr<BatchNorm2d> bn2;
  std::shared_ptr<ConvTranspose2d> up;
};

TEST(SpatialQuant, TinyUNetCalibratesConvertsAndRunsInt8) {
  manual_seed(5);
  TinyUNet ref;
  ref.eval();
  manual_seed(5);
  TinyUNet m;
  m.eval();
  const Tensor x = randn({2, 3, 16, 16}, 1);
  prepare(m, {x});
  for (int i = 0; i < 8; ++i) m(randn({2, 3, 16, 16}, 200 + i));
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  bool saw_up = false;
  for (const QuantizedOpInfo& op : ops) {
    if (op.kind == OpKind::kConvTranspose2d) {
      saw_up = true;
      EXPECT_EQ(op.op, "conv_transpose2d+relu");
      EXPECT_EQ(op.executor.rfind("int8 conv_transpose2d", 0), 0u) << op.executor;
      EXPECT_EQ(op.input_dtypes, (std::vector<DType>{DType::kU8}));
    }
  }
  EXPECT_TRUE(saw_up);
  int total = 0;
  const int int8 = count_int8(ops, &total);
  const double sqnr = testing::sqnr_of(m(x), ref(x));
  std::cout << "[ spatial  ] tiny U-Net: " << int8 << "/" << total << " ops int8, SQNR " << sqnr << " dB vs fp32"
            << std::endl;
  EXPECT_GT(sqnr, 20.0);
  EXPECT_EQ(int8, total);
  // Batch size and image size change after convert.
  for (const auto& sizes : {std::vector<int64_t>{1, 3, 16, 16}, std::vector<int64_t>{3, 3, 24, 20}}) {
    const Tensor x2 = randn(sizes, 300);
    const Tensor y = m(x2);
    EXPECT_EQ(y.sizes(), (DimVector{sizes[0], 2, sizes[2], sizes[3]}));
    EXPECT_GT(testing::sqnr_of(y, ref(x2)), 20.0);
  }
}

// The recorded parameters are part of a converted conv_transpose2d's identity (its int8 primitive
// is built for them): a call with another stride is a path calibration never saw, which runs in
// fp32 (correct values, counted), and the recorded call still runs its int8 kernel.
TEST(SpatialQuant, ConvertedConvTransposeWithOtherParametersRunsFp32) {
  struct Net : nn::CallableModule<Net> {
    Net() { up = register_module("up", std::make_shared<ConvTranspose2d>(ConvTranspose2dOptions(4, 4, 3))); }
    Tensor forward(const Tensor& x) {
      Tensor y = relu((*up)(x));
      return conv_transpose2d(y, up->weight, up->bias, p);
    }
    std::shared_ptr<ConvTranspose2d> up;
    ConvTranspose2dParams p;
  };
  manual_seed(3);
  Net m;
  m.eval();
  manual_seed(3);
  Net ref;
  ref.eval();
  const Tensor x = randn({1, 4, 5, 5}, 2);
  prepare(m, {x});
  m(x);
  convert(m);
  const Tensor good = m(x);
  EXPECT_EQ(uncalibrated_ops(m), 0);
  m.p.stride = {2, 2};
  ref.p.stride = {2, 2};
  const Tensor other = m(x);
  EXPECT_EQ(other.sizes(), (DimVector{1, 4, 15, 15}));
  EXPECT_EQ(uncalibrated_ops(m), 1);
  EXPECT_GT(testing::sqnr_of(other, ref(x)), 25.0);
  m.p.stride = {1, 1};
  EXPECT_EQ(m(x).to_vector<float>(), good.to_vector<float>());
}

// ---- a keyword-spotting style Conv1d net ----------------------------------------------------------

struct KwsNet : nn::CallableModule<KwsNet> {
  KwsNet() {
    conv1 = register_module("conv1", std::make_shared<nn::Conv1dImpl>(nn::Conv1dOptions(10, 16, 5).padding(2)));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm1dImpl>(16));
    pool1 = register_module("pool1", std::make_shared<nn::MaxPool1dImpl>(2));
    conv2 = register_module("conv2", std::make_shared<nn::Conv1dImpl>(nn::Conv1dOptions(16, 16, 3).padding(1).groups(4)));
    pool2 = register_module("pool2", std::make_shared<nn::AvgPool1dImpl>(3, 2, 1));
    gap = register_module("gap", std::make_shared<nn::AdaptiveAvgPool1dImpl>(1));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(16, 6));
    bn1->running_mean.copy_(rand_uniform({16}, -0.3, 0.3, 11));
    bn1->running_var.copy_(rand_uniform({16}, 0.5, 2.0, 12));
    bn1->weight.copy_(rand_uniform({16}, 0.5, 1.5, 13));
    bn1->bias.copy_(rand_uniform({16}, -0.2, 0.2, 14));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*pool1)(relu((*bn1)((*conv1)(x))));
    y = (*pool2)(relu((*conv2)(y)));
    return (*fc)((*gap)(y).flatten(1));
  }
  std::shared_ptr<nn::Conv1dImpl> conv1, conv2;
  std::shared_ptr<nn::BatchNorm1dImpl> bn1;
  std::shared_ptr<nn::MaxPool1dImpl> pool1;
  std::shared_ptr<nn::AvgPool1dImpl> pool2;
  std::shared_ptr<nn::AdaptiveAvgPool1dImpl> gap;
  std::shared_ptr<nn::LinearImpl> fc;
};

TEST(SpatialQuant, KeywordSpottingConv1dNetRunsInt8) {
  manual_seed(8);
  KwsNet ref;
  ref.eval();
  manual_seed(8);
  KwsNet m;
  m.eval();
  const Tensor x = randn({4, 10, 40}, 1);
  prepare(m, {x});
  EXPECT_EQ(testing::display_kinds(testing::state_of(m)),
            (std::vector<std::string>{"conv1d+batch_norm+relu", "max_pool1d", "conv1d+relu", "avg_pool1d",
                                      "adaptive_avg_pool1d", "flatten", "linear"}));
  for (int i = 0; i < 8; ++i) m(randn({4, 10, 40}, 400 + i));
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  EXPECT_EQ(ops[0].executor.rfind("int8 conv1d [16, 10, 5]+relu", 0), 0u) << ops[0].executor;
  EXPECT_EQ(ops[1].executor, "fused into conv1d+batch_norm+relu");
  int total = 0;
  const int int8 = count_int8(ops, &total);
  for (const QuantizedOpInfo& op : ops) {
    if (op.kind == OpKind::kMaxPool1d || op.kind == OpKind::kAvgPool1d || op.kind == OpKind::kAdaptiveAvgPool1d) {
      EXPECT_EQ(op.input_dtypes, (std::vector<DType>{DType::kU8})) << op.op;
      EXPECT_EQ(op.output_dtype, DType::kU8) << op.op;
    }
  }
  const double sqnr = testing::sqnr_of(m(x), ref(x));
  std::cout << "[ spatial  ] keyword-spotting Conv1d net: " << int8 << "/" << total << " ops int8, SQNR " << sqnr
            << " dB vs fp32" << std::endl;
  EXPECT_GT(sqnr, 20.0);
  EXPECT_EQ(int8, total);
  // Batch size and sequence length change after convert.
  for (const auto& sizes : {std::vector<int64_t>{1, 10, 40}, std::vector<int64_t>{3, 10, 64}}) {
    const Tensor x2 = randn(sizes, 500);
    const Tensor y = m(x2);
    EXPECT_EQ(y.sizes(), (DimVector{sizes[0], 6}));
    EXPECT_GT(testing::sqnr_of(y, ref(x2)), 20.0);
  }
}

// ---- a U-Net with interpolation: Upsample (bilinear) and interpolate to the skip's size ---------

struct UpsampleUNet : nn::CallableModule<UpsampleUNet> {
  UpsampleUNet() {
    enc1 = register_module("enc1", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
    enc2 = register_module("enc2", std::make_shared<Conv2d>(8, 16, 3, 2, 1));
    enc3 = register_module("enc3", std::make_shared<Conv2d>(16, 16, 3, 2, 1));
    up = register_module("up", std::make_shared<nn::UpsampleImpl>(
                                   nn::UpsampleOptions().scale_factor(2.0).mode("bilinear").align_corners(false)));
    dec2 = register_module("dec2", std::make_shared<Conv2d>(32, 8, 3, 1, 1));
    dec1 = register_module("dec1", std::make_shared<Conv2d>(16, 2, 1));
  }
  Tensor forward(const Tensor& x) {
    const Tensor s1 = relu((*enc1)(x));
    const Tensor s2 = relu((*enc2)(s1));
    Tensor y = relu((*enc3)(s2));
    y = relu((*dec2)(cat({(*up)(y), s2}, 1)));
    // To the skip's size, whatever the image size (odd sizes included): nearest.
    y = interpolate(y, std::array<int64_t, 2>{s1.size(2), s1.size(3)});
    return (*dec1)(cat({y, s1}, 1));
  }
  std::shared_ptr<Conv2d> enc1, enc2, enc3, dec2, dec1;
  std::shared_ptr<nn::UpsampleImpl> up;
};

TEST(SpatialQuant, UpsampleUNetRunsInt8AcrossImageSizes) {
  manual_seed(12);
  UpsampleUNet ref;
  ref.eval();
  manual_seed(12);
  UpsampleUNet m;
  m.eval();
  const Tensor x = randn({2, 3, 16, 16}, 1);
  prepare(m, {x});
  for (int i = 0; i < 8; ++i) m(randn({2, 3, 16, 16}, 600 + i));
  convert(m);
  const std::vector<QuantizedOpInfo> ops = quantized_ops(m);
  int interps = 0;
  for (const QuantizedOpInfo& op : ops) {
    if (op.kind != OpKind::kInterpolate) continue;
    ++interps;
    EXPECT_EQ(op.executor, "int8 interpolate (shares parameters)");
    EXPECT_EQ(op.input_dtypes, (std::vector<DType>{DType::kU8}));
  }
  EXPECT_EQ(interps, 2);
  int total = 0;
  const int int8 = count_int8(ops, &total);
  const double sqnr = testing::sqnr_of(m(x), ref(x));
  std::cout << "[ spatial  ] U-Net with Upsample/interpolate: " << int8 << "/" << total << " ops int8, SQNR " << sqnr
            << " dB vs fp32" << std::endl;
  EXPECT_GT(sqnr, 20.0);
  EXPECT_EQ(int8, total);
  // Other batch and image sizes (the interpolate size follows the image): still int8, no new path.
  for (const auto& sizes : {std::vector<int64_t>{1, 3, 16, 16}, std::vector<int64_t>{3, 3, 20, 12}}) {
    const Tensor x2 = randn(sizes, 700);
    const Tensor y = m(x2);
    EXPECT_EQ(y.sizes(), (DimVector{sizes[0], 2, sizes[2], sizes[3]}));
    EXPECT_GT(testing::sqnr_of(y, ref(x2)), 20.0);
  }
  EXPECT_EQ(uncalibrated_ops(m), 0);
}

// GroupNorm / InstanceNorm2d between int8 convs run int8 on codes (QuantRole::kNormalize,
// tests/quant/int8_norms_test.cc), with correct values.
TEST(SpatialQuant, GroupAndInstanceNormRunInt8InConvertedModels) {
  struct Net : nn::CallableModule<Net> {
    Net() {
      conv1 = register_module("conv1", std::make_shared<Conv2d>(3, 8, 3, 1, 1));
      gn = register_module("gn", std::make_shared<nn::GroupNormImpl>(2, 8));
      conv2 = register_module("conv2", std::make_shared<Conv2d>(8, 8, 3, 1, 1));
      in = register_module("in", std::make_shared<nn::InstanceNorm2dImpl>(8, 1e-5, 0.1, true));
      conv3 = register_module("conv3", std::make_shared<Conv2d>(8, 4, 1));
    }
    Tensor forward(const Tensor& x) {
      Tensor y = relu((*gn)((*conv1)(x)));
      y = relu((*in)((*conv2)(y)));
      return (*conv3)(y);
    }
    std::shared_ptr<Conv2d> conv1, conv2, conv3;
    std::shared_ptr<nn::GroupNormImpl> gn;
    std::shared_ptr<nn::InstanceNorm2dImpl> in;
  };
  manual_seed(4);
  Net ref;
  ref.eval();
  manual_seed(4);
  Net m;
  m.eval();
  const Tensor x = randn({2, 3, 12, 12}, 1);
  prepare(m, {x});
  for (int i = 0; i < 6; ++i) m(randn({2, 3, 12, 12}, 800 + i));
  convert(m);
  // The norms are int8 between the three int8 convs.
  int convs = 0, norms = 0;
  for (const QuantizedOpInfo& op : quantized_ops(m)) {
    if (op.kind == OpKind::kGroupNorm || op.kind == OpKind::kInstanceNorm) {
      ++norms;
      EXPECT_EQ(op.role, "normalize") << op.executor;
      EXPECT_EQ(op.executor.rfind("int8 ", 0), 0u) << op.executor;
    }
    if (op.kind == OpKind::kConv2d) {
      ++convs;
      EXPECT_EQ(op.executor.rfind("int8 conv2d", 0), 0u) << op.executor;
    }
  }
  EXPECT_EQ(convs, 3);
  EXPECT_EQ(norms, 2);
  const double sqnr = testing::sqnr_of(m(x), ref(x));
  std::cout << "[ spatial  ] conv + GroupNorm / InstanceNorm2d (norms int8): SQNR " << sqnr << " dB vs fp32"
            << std::endl;
  EXPECT_GT(sqnr, 20.0);
}

}  // namespace
}  // namespace dbrq
