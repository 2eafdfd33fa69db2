// Verbatim ports of libtorch C++ frontend models (tests/porting/libtorch_models.h: libtorch's DCGAN
// example and a torchvision-style ResNet, the libtorch source with only the include and the
// namespace changed, checked by port_diff_test) run against their PyTorch twins
// (make_port_goldens.py), then prepared, calibrated and converted to int8.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "tests/porting/libtorch_models.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

constexpr char kGolden[] = "tests/porting/golden/libtorch_ports.safetensors";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Keep in sync with fill() in make_port_goldens.py: tensor j of the state_dict's names in sorted
// order, element i, v = sin(0.37 i + 0.71 j + 0.05), shaped per kind of tensor.
void fill_deterministic(nn::Module& model) {
  std::map<std::string, Tensor> tensors;
  for (auto& [name, t] : model.state_dict()) {
    if (!ends_with(name, "num_batches_tracked")) tensors.emplace(name, t);
  }
  int64_t j = 0;
  for (auto& [name, t] : tensors) {
    ASSERT_EQ(t.dtype(), DType::kF32) << name;
    ASSERT_TRUE(t.is_contiguous()) << name;
    const int64_t n = t.numel();
    float* data = t.mutable_data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const double v = std::sin(0.37 * static_cast<double>(i) + 0.71 * static_cast<double>(j) + 0.05);
      double value;
      if (ends_with(name, "running_var")) {
        value = 0.6 + 0.4 * v * v;
      } else if (t.dim() >= 2) {
        value = v * (1.5 / std::sqrt(static_cast<double>(n) / static_cast<double>(t.size(0))));
      } else if (ends_with(name, "weight")) {
        value = 1.0 + 0.1 * v;
      } else {
        value = 0.1 * v;
      }
      data[i] = static_cast<float>(value);
    }
    ++j;
  }
}

class VerbatimPort : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { golden_ = new std::map<std::string, Tensor>(testing::load_golden(kGolden)); }
  static void TearDownTestSuite() {
    delete golden_;
    golden_ = nullptr;
  }
  static Tensor g(const std::string& name) { return testing::golden(*golden_, name); }
  static std::map<std::string, Tensor>* golden_;
};
std::map<std::string, Tensor>* VerbatimPort::golden_ = nullptr;

TEST_F(VerbatimPort, DCGANGeneratorMatchesPyTorch) {
  ported::DCGANGenerator generator(100);
  EXPECT_EQ(generator->type_name(), "DCGANGeneratorImpl");
  EXPECT_EQ(generator->named_parameters().size(), 10u);  // 4 weights, 3 BN weights and biases
  fill_deterministic(*generator);
  generator->eval();
  const Tensor noise = g("generator.input");
  const Tensor fake = generator(noise);
  testing::expect_close(fake, g("generator.output"), 1e-4, "generator(x)");
  testing::expect_close(generator->forward(noise), g("generator.output"), 1e-4, "generator->forward(x)");
}

TEST_F(VerbatimPort, DCGANDiscriminatorMatchesPyTorch) {
  nn::Sequential discriminator = ported::make_discriminator();
  EXPECT_EQ(discriminator->size(), 10u);
  fill_deterministic(*discriminator);
  discriminator->eval();
  testing::expect_close(discriminator(g("discriminator.input")), g("discriminator.output"), 1e-4);
}

TEST_F(VerbatimPort, ResNetMatchesPyTorch) {
  manual_seed(3);
  ported::TinyResNet net(10);
  // The constructor's nn::init loop ran over modules(): kaiming_normal_ conv weights (fan_out,
  // relu: std sqrt(2 / (out * k * k))), BatchNorm weights 1.
  const Tensor w = net->conv1->weight;  // [16, 3, 3, 3]
  double sum_sq = 0;
  for (float v : w.to_vector<float>()) sum_sq += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(w.numel())), std::sqrt(2.0 / (16 * 9)), 0.04);
  for (float v : net->bn1->weight.to_vector<float>()) EXPECT_EQ(v, 1.0f);
  fill_deterministic(*net);
  net->eval();
  testing::expect_close(net(g("resnet.input")), g("resnet.output"), 1e-4);
}

// The ported ResNet quantizes as a model written for dbrq: every conv (called as conv->forward(x)
// and downsample->forward(x), libtorch's spelling) is attributed to its own layer and runs int8
// with its batch norm folded, and a new batch size works after convert.
TEST_F(VerbatimPort, ResNetPreparesCalibratesAndConverts) {
  ported::TinyResNet net(10);
  fill_deterministic(*net);
  net->eval();
  const Tensor x = g("resnet.input");
  const Tensor reference = net(x);
  prepare(*net, {x});
  testing::calibrate(*net, {2, 3, 16, 16}, 8, 41);
  (*net)(x);
  convert(*net);
  std::vector<std::string> convs;
  for (const QuantizedOpInfo& op : quantized_ops(*net)) {
    if (op.kind != OpKind::kConv2d) continue;
    EXPECT_NE(op.role, "fp32") << op.fqn;
    convs.push_back(op.fqn);
  }
  EXPECT_EQ(convs.size(), 10u);
  for (const char* layer : {"conv1", "layer1.0.conv1", "layer1.1.conv2", "layer2.0.downsample.0", "layer2.1.conv2"}) {
    EXPECT_NE(std::find(convs.begin(), convs.end(), layer), convs.end()) << layer;
  }
  const Tensor int8 = net(x);
  EXPECT_GT(testing::sqnr_of(int8, reference), 20.0);
  EXPECT_EQ(net(randn({5, 3, 16, 16}, 9)).sizes(), (std::vector<int64_t>{5, 10}));
}

TEST_F(VerbatimPort, GeneratorPreparesAndConverts) {
  ported::DCGANGenerator generator(100);
  fill_deterministic(*generator);
  generator->eval();
  const Tensor noise = g("generator.input");
  const Tensor reference = generator(noise);
  prepare(*generator, {noise});
  testing::calibrate(*generator, {2, 100, 1, 1}, 8, 43);
  convert(*generator);
  // Each transposed conv is attributed to its own layer (the hooked conv1(x) calls).
  std::vector<std::string> convs;
  for (const QuantizedOpInfo& op : quantized_ops(*generator)) {
    if (op.kind == OpKind::kConvTranspose2d) convs.push_back(op.fqn);
  }
  EXPECT_EQ(convs, (std::vector<std::string>{"conv1", "conv2", "conv3", "conv4"}));
  // Real values, not int8 codes or garbage (0 dB); the precision of int8 transposed convs is
  // their own tests' business.
  EXPECT_GT(testing::sqnr_of(generator(noise), reference), 10.0);
  EXPECT_EQ(generator->forward(randn({3, 100, 1, 1}, 5)).sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
}

}  // namespace
}  // namespace dbrq
