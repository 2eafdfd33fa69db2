// Zoo models (samples/zoo) against PyTorch: each golden file holds a reduced-size model's weights,
// an input and PyTorch's output (see make_model_goldens.py). Also checks that full-size ResNet-18
// and MobileNetV2 have torchvision's exact state-dict keys, and that every model runs at two batch
// sizes with per-sample results independent of the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/zoo.h"
#include "tests/test_util.h"

namespace {

using dbrq::NamedTensors;
using dbrq::Tensor;

constexpr char kGoldenDir[] = "tests/models/golden/";
// max|a - b| / max|b|. PyTorch's own f32 result is within ~1e-6 of the f64 reference, so this
// leaves room for oneDNN's different summation orders without hiding real mistakes.
constexpr double kTolerance = 1e-3;

struct Golden {
  NamedTensors weights;  // state-dict entries, file order
  Tensor input, output;
  std::string config;  // JSON the script wrote
};

Golden load_model_golden(const std::string& model) {
  const std::string path = std::string(kGoldenDir) + model + ".safetensors";
  Golden g;
  for (auto& [name, t] : dbrq::load_safetensors(path)) {
    if (name == "input") {
      g.input = t;
    } else if (name == "output") {
      g.output = t;
    } else {
      g.weights.emplace_back(name, t);
    }
  }
  g.config = dbrq::load_safetensors_metadata(path)["config"];
  return g;
}

// Loads the golden weights (strictly: every key, every shape), runs the golden input and compares.
// Returns the relative error so the caller can report it.
double run_golden(const std::string& model_name, const std::string& expected_config,
                  const std::shared_ptr<dbrq::nn::Module>& model) {
  SCOPED_TRACE(model_name);
  const Golden g = load_model_golden(model_name);
  // The script and the zoo's kTiny configs must describe the same model.
  EXPECT_EQ(g.config, expected_config);
  EXPECT_TRUE(g.input.defined() && g.output.defined());
  if (!g.input.defined() || !g.output.defined()) return -1;

  EXPECT_NO_THROW(model->load_state_dict(g.weights, /*strict=*/true));
  // PyTorch's state_dict order too: it shows the module tree was registered in the same order.
  std::vector<std::string> model_keys, golden_keys;
  for (const auto& [k, t] : model->state_dict()) model_keys.push_back(k);
  for (const auto& [k, t] : g.weights) golden_keys.push_back(k);
  EXPECT_EQ(model_keys, golden_keys);
  model->eval();
  const Tensor out = zoo::find_model(model_name).run(*model, g.input);
  dbrq::testing::expect_close(out, g.output, kTolerance, model_name);
  const double err = dbrq::testing::relative_error(out, g.output);
  std::cout << "[ golden   ] " << model_name << ": max relative error " << err << " over output " << out.shape_string()
            << "\n";
  return err;
}

TEST(ZooGolden, ResNet18) {
  run_golden("resnet18", R"({"base_width": 8, "num_classes": 10})",
             std::make_shared<zoo::ResNet18>(zoo::resnet18_config(zoo::Variant::kTiny)));
}

TEST(ZooGolden, MobileNetV2) {
  run_golden("mobilenet_v2", R"({"num_classes": 10, "width_mult": 0.25})",
             std::make_shared<zoo::MobileNetV2>(zoo::mobilenet_v2_config(zoo::Variant::kTiny)));
}

TEST(ZooGolden, BertEncoder) {
  run_golden("bert_encoder",
             R"({"hidden_size": 64, "intermediate_size": 128, "layer_norm_eps": 1e-12, "max_position": 32, )"
             R"("num_heads": 2, "num_layers": 2, "type_vocab_size": 2, "vocab_size": 1000})",
             std::make_shared<zoo::BertEncoder>(zoo::bert_config(zoo::Variant::kTiny)));
}

TEST(ZooGolden, SmallCnn) {
  run_golden("small_cnn", R"({"in_channels": 1, "num_classes": 10})",
             std::make_shared<zoo::SmallCnn>(zoo::small_cnn_config(zoo::Variant::kTiny)));
}

TEST(ZooGolden, GruClassifier) {
  run_golden("gru_classifier",
             R"({"embedding_dim": 16, "hidden_size": 24, "num_classes": 4, "num_layers": 2, "vocab_size": 50})",
             std::make_shared<zoo::GruClassifier>(zoo::gru_classifier_config(zoo::Variant::kTiny)));
}

// ---- issue 12's models ----

TEST(ZooGolden, DcganGenerator) {
  run_golden("dcgan_generator", R"({"nc": 3, "ngf": 8, "nz": 16})",
             std::make_shared<zoo::DcganGenerator>(zoo::dcgan_generator_config(zoo::Variant::kTiny)));
}

TEST(ZooGolden, UNet) {
  run_golden("unet", R"({"base_width": 8, "in_channels": 3, "num_classes": 4})",
             std::make_shared<zoo::UNet>(zoo::unet_config(zoo::Variant::kTiny)));
}

TEST(ZooGolden, KwsConv1d) {
  run_golden("kws_conv1d", R"({"channels": 16, "n_mfcc": 40, "num_classes": 12})",
             std::make_shared<zoo::KwsConv1d>(zoo::kws_conv1d_config(zoo::Variant::kTiny)));
}

// Pre-activation dense blocks (batch norm -> relu -> conv on a growing cat), torchvision's class.
TEST(ZooGolden, DenseNet) {
  run_golden("densenet",
             R"({"block_config": [2, 2], "bn_size": 2, "growth_rate": 8, "num_classes": 10, "num_init_features": 16})",
             std::make_shared<zoo::DenseNet>(zoo::densenet_config(zoo::Variant::kTiny)));
}

TEST(ZooGolden, Vit) {
  run_golden("vit",
             R"({"d_model": 32, "image_size": 16, "in_channels": 3, "layer_norm_eps": 1e-06, "mlp_dim": 64, )"
             R"("num_classes": 10, "num_heads": 2, "num_layers": 2, "patch_size": 4})",
             std::make_shared<zoo::VisionTransformer>(zoo::vit_config(zoo::Variant::kTiny)));
}

// The golden output must depend on the loaded weights: a freshly initialized model disagrees.
// Guards against a golden that a broken load (or a constant output) would also match.
TEST(ZooGolden, DefaultWeightsDoNotMatch) {
  const Golden g = load_model_golden("small_cnn");
  auto model = std::make_shared<zoo::SmallCnn>();
  model->eval();
  EXPECT_GT(dbrq::testing::relative_error((*model)(g.input), g.output), 1e-2);
}

// ---- full-size state-dict keys ----

struct KeyEntry {
  std::string key;
  std::string dtype;
  std::vector<int64_t> sizes;
};

// torchvision_keys.txt: "model key dtype dims..." lines (see make_model_goldens.py).
std::map<std::string, std::vector<KeyEntry>> load_torchvision_keys() {
  std::ifstream in(std::string(kGoldenDir) + "torchvision_keys.txt");
  EXPECT_TRUE(in.good()) << "cannot open torchvision_keys.txt";
  std::map<std::string, std::vector<KeyEntry>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string model;
    KeyEntry e;
    fields >> model >> e.key >> e.dtype;
    for (int64_t d; fields >> d;) e.sizes.push_back(d);
    out[model].push_back(std::move(e));
  }
  return out;
}

void expect_torchvision_keys(const std::string& model_name, const dbrq::nn::Module& model) {
  SCOPED_TRACE(model_name);
  const std::vector<KeyEntry> expected = load_torchvision_keys()[model_name];
  ASSERT_FALSE(expected.empty());
  const NamedTensors actual = model.state_dict();
  // Same keys in the same order (PyTorch's state_dict order), each with torchvision's dtype and shape.
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [key, t] = actual[i];
    EXPECT_EQ(key, expected[i].key) << "at position " << i;
    EXPECT_EQ(dbrq::dtype_name(t.dtype()), expected[i].dtype) << key;
    EXPECT_EQ(std::vector<int64_t>(t.sizes().begin(), t.sizes().end()), expected[i].sizes) << key;
  }
}

TEST(ZooKeys, ResNet18MatchesTorchvision) {
  const auto model = zoo::make_model("resnet18", zoo::Variant::kFull);
  expect_torchvision_keys("resnet18", *model);
  EXPECT_EQ(zoo::parameter_count(*model), 11689512);  // torchvision's resnet18, as published
}

TEST(ZooKeys, MobileNetV2MatchesTorchvision) {
  const auto model = zoo::make_model("mobilenet_v2", zoo::Variant::kFull);
  expect_torchvision_keys("mobilenet_v2", *model);
  EXPECT_EQ(zoo::parameter_count(*model), 3504872);  // torchvision's mobilenet_v2, as published
}

TEST(ZooKeys, DenseNetMatchesTorchvisionDenseNet121) {
  const auto model = zoo::make_model("densenet", zoo::Variant::kFull);
  expect_torchvision_keys("densenet121", *model);
  EXPECT_EQ(zoo::parameter_count(*model), 7978856);  // torchvision's densenet121, as published
}

TEST(ZooKeys, BertUsesHuggingFaceNames) {
  const zoo::BertConfig defaults;
  EXPECT_EQ(defaults.vocab_size, 30522);
  EXPECT_EQ(defaults.hidden_size, 256);
  EXPECT_EQ(defaults.num_layers, 4);
  EXPECT_EQ(defaults.num_heads, 4);
  EXPECT_EQ(defaults.intermediate_size, 1024);
  EXPECT_EQ(defaults.max_position, 128);
  // Everything but the vocabulary at full size: 30522 embedding rows only cost initialization time.
  zoo::BertConfig config = zoo::bert_config(zoo::Variant::kFull);
  config.vocab_size = 100;
  const auto model = std::make_shared<zoo::BertEncoder>(config);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [k, t] : model->state_dict()) shapes[k] = std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"embeddings.word_embeddings.weight", {100, 256}},
      {"embeddings.position_embeddings.weight", {128, 256}},
      {"embeddings.token_type_embeddings.weight", {2, 256}},
      {"embeddings.LayerNorm.weight", {256}},
      {"encoder.layer.0.attention.self.query.weight", {256, 256}},
      {"encoder.layer.0.attention.self.key.bias", {256}},
      {"encoder.layer.0.attention.output.dense.weight", {256, 256}},
      {"encoder.layer.0.attention.output.LayerNorm.bias", {256}},
      {"encoder.layer.0.intermediate.dense.weight", {1024, 256}},
      {"encoder.layer.3.output.dense.weight", {256, 1024}},
      {"encoder.layer.3.output.LayerNorm.weight", {256}},
  };
  for (const auto& [k, s] : expected) {
    ASSERT_TRUE(shapes.count(k)) << k;
    EXPECT_EQ(shapes[k], s) << k;
  }
  // 5 embedding tensors + 16 per layer (q, k, v, attention dense, FFN in, FFN out: weight and
  // bias each; two LayerNorms: weight and bias each).
  EXPECT_EQ(shapes.size(), 5u + 4u * 16u);
}

TEST(ZooKeys, GruClassifierUsesPyTorchNames) {
  const auto model = zoo::make_model("gru_classifier", zoo::Variant::kFull);
  std::vector<std::string> keys;
  for (const auto& [k, t] : model->state_dict()) keys.push_back(k + " " + t.shape_string());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "embedding.weight [10000, 128]", "gru.weight_ih_l0 [384, 128]", "gru.weight_hh_l0 [384, 128]",
                      "gru.bias_ih_l0 [384]", "gru.bias_hh_l0 [384]", "gru.weight_ih_l1 [384, 128]",
                      "gru.weight_hh_l1 [384, 128]", "gru.bias_ih_l1 [384]", "gru.bias_hh_l1 [384]",
                      "classifier.weight [4, 128]", "classifier.bias [4]"}));
  // Example inputs: 0-padded rows of lengths in [16, 64], none empty.
  const Tensor ids = zoo::find_model("gru_classifier").example_input(zoo::Variant::kFull, 8, 3);
  const std::vector<int64_t> lengths = zoo::GruClassifier::lengths_of(ids);
  EXPECT_EQ(lengths.size(), 8u);
  EXPECT_GT(*std::max_element(lengths.begin(), lengths.end()), *std::min_element(lengths.begin(), lengths.end()));
  for (int64_t n : lengths) {
    EXPECT_GE(n, 16);
    EXPECT_LE(n, 64);
  }
  EXPECT_THROW_MSG(zoo::GruClassifier::lengths_of(dbrq::zeros({2, 3}, dbrq::DType::kS64)), dbrq::ValueError,
                   "GruClassifier: sequence 0 is empty (its first token is the padding id 0)");
  EXPECT_THROW_MSG(zoo::GruClassifier::lengths_of(dbrq::zeros({2, 3})), dbrq::ValueError,
                   "GruClassifier: expected [batch, steps] s64 token ids, got [2, 3] f32");
}

// ---- registry and batch sizes ----

TEST(ZooRegistry, NamesAndUnknownModel) {
  EXPECT_EQ(zoo::model_names(),
            (std::vector<std::string>{"resnet18", "mobilenet_v2", "bert_encoder", "small_cnn", "decoder_lm",
                                      "gru_classifier", "dcgan_generator", "unet", "kws_conv1d", "densenet", "vit"}));
  EXPECT_THROW_MSG(zoo::make_model("resnet50"), dbrq::ValueError, "known models: resnet18, mobilenet_v2");
  EXPECT_THROW_MSG(zoo::parse_variant("huge"), dbrq::ValueError, "unknown variant \"huge\"");
  auto cnn = zoo::make_model("small_cnn");
  EXPECT_THROW_MSG(zoo::find_model("resnet18").run(*cnn, dbrq::randn({1, 3, 64, 64}, 0)), dbrq::ValueError,
                   "cannot run a SmallCnn");
}

class ZooBatch : public ::testing::TestWithParam<std::string> {};

// Batch 1 and batch 3: output sizes follow the batch, and sample 0 gives the same result in both.
TEST_P(ZooBatch, RunsAtTwoBatchSizes) {
  const zoo::ModelSpec& spec = zoo::find_model(GetParam());
  dbrq::manual_seed(7);
  auto model = spec.make(zoo::Variant::kTiny);
  model->eval();
  const Tensor x3 = spec.example_input(zoo::Variant::kTiny, 3, /*seed=*/11);
  EXPECT_EQ(x3.dtype(), spec.input_dtype);
  EXPECT_EQ(std::vector<int64_t>(x3.sizes().begin(), x3.sizes().end()), spec.input_shape(zoo::Variant::kTiny, 3));
  const Tensor x1 = x3.narrow(0, 0, 1).contiguous();
  const Tensor y1 = spec.run(*model, x1);
  const Tensor y3 = spec.run(*model, x3);
  ASSERT_EQ(y1.size(0), 1);
  ASSERT_EQ(y3.size(0), 3);
  dbrq::testing::expect_close(y3.narrow(0, 0, 1), y1, 1e-5, "sample 0 at batch 3 vs batch 1");
}

INSTANTIATE_TEST_SUITE_P(AllModels, ZooBatch,
                         ::testing::Values("resnet18", "mobilenet_v2", "bert_encoder", "small_cnn", "decoder_lm",
                                           "gru_classifier", "dcgan_generator", "unet", "kws_conv1d", "densenet", "vit"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---- issue 12's models: full-size shapes, parameter counts, bad inputs ----

TEST(ZooIssue12, FullSizeShapes) {
  dbrq::manual_seed(3);
  for (const auto& [name, out_shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"dcgan_generator", {2, 3, 32, 32}}, {"unet", {2, 4, 128, 128}}, {"kws_conv1d", {2, 12}}}) {
    SCOPED_TRACE(name);
    const zoo::ModelSpec& spec = zoo::find_model(name);
    auto model = spec.make(zoo::Variant::kFull);
    model->eval();
    const Tensor y = spec.run(*model, spec.example_input(zoo::Variant::kFull, 2, 0));
    EXPECT_EQ(std::vector<int64_t>(y.sizes().begin(), y.sizes().end()), out_shape);
  }
  // The tanh keeps a generator's images in (-1, 1).
  auto g = zoo::make_model("dcgan_generator");
  g->eval();
  const std::vector<float> pixels =
      zoo::find_model("dcgan_generator").run(*g, dbrq::randn({2, 64, 1, 1}, 1)).to_vector<float>();
  EXPECT_LE(*std::max_element(pixels.begin(), pixels.end()), 1.0f);
  EXPECT_GE(*std::min_element(pixels.begin(), pixels.end()), -1.0f);
  // Parameter counts of PyTorch's twins (tools/torch_zoo.py) at full size.
  EXPECT_EQ(zoo::parameter_count(*g), 64 * 128 * 16 + 128 * 64 * 16 + 64 * 32 * 16 + 32 * 3 * 16 +
                                          2 * (128 + 64 + 32));
  EXPECT_EQ(zoo::parameter_count(*zoo::make_model("kws_conv1d")),
            40 * 64 * 3 + 64 * 64 * 3 + 64 * 128 * 3 + 128 * 128 * 3 + 2 * (64 + 64 + 128 + 128) + 128 * 12 + 12);
}

TEST(ZooIssue12, UNetSkipKeys) {
  const auto model = zoo::make_model("unet", zoo::Variant::kTiny);
  std::map<std::string, std::string> shapes;
  for (const auto& [k, t] : model->state_dict()) shapes[k] = t.shape_string();
  // PyTorch's ConvTranspose2d weight layout [in, out, kH, kW]; the up path's first conv reads the
  // skip features and the upsampled ones (8 + 8 and 16 + 16 channels).
  EXPECT_EQ(shapes["up1.up.weight"], "[32, 16, 2, 2]");
  EXPECT_EQ(shapes["up1.conv.conv1.weight"], "[16, 32, 3, 3]");
  EXPECT_EQ(shapes["up2.up.weight"], "[16, 8, 2, 2]");
  EXPECT_EQ(shapes["up2.conv.conv1.weight"], "[8, 16, 3, 3]");
  EXPECT_EQ(shapes["down2.conv.bn2.running_var"], "[32]");
  EXPECT_EQ(shapes["outc.weight"], "[4, 8, 1, 1]");
}

TEST(ZooIssue12, BadInputs) {
  auto g = zoo::make_model("dcgan_generator", zoo::Variant::kTiny);
  auto unet = zoo::make_model("unet", zoo::Variant::kTiny);
  auto kws = zoo::make_model("kws_conv1d", zoo::Variant::kTiny);
  const auto run = [](const char* name, dbrq::nn::Module& m, const Tensor& x) { return zoo::find_model(name).run(m, x); };
  EXPECT_THROW_MSG(run("dcgan_generator", *g, dbrq::randn({2, 16}, 0)), dbrq::ShapeError,
                   "DcganGenerator: expected latents [N, 16, 1, 1], got [2, 16]");
  EXPECT_THROW_MSG(run("dcgan_generator", *g, dbrq::randn({2, 8, 1, 1}, 0)), dbrq::ShapeError,
                   "DcganGenerator: expected latents [N, 16, 1, 1], got [2, 8, 1, 1]");
  EXPECT_THROW_MSG(run("unet", *unet, dbrq::randn({1, 3, 30, 32}, 0)), dbrq::ShapeError,
                   "UNet: expected images [N, 3, H, W] with H and W positive multiples of 4, got [1, 3, 30, 32]");
  EXPECT_THROW_MSG(run("unet", *unet, dbrq::randn({1, 1, 32, 32}, 0)), dbrq::ShapeError,
                   "UNet: expected images [N, 3, H, W]");
  EXPECT_THROW_MSG(run("kws_conv1d", *kws, dbrq::randn({1, 40, 3}, 0)), dbrq::ShapeError,
                   "KwsConv1d: expected features [N, 40, frames >= 4], got [1, 40, 3]");
  EXPECT_THROW_MSG(run("kws_conv1d", *kws, dbrq::randn({40, 98}, 0)), dbrq::ShapeError,
                   "KwsConv1d: expected features [N, 40, frames >= 4], got [40, 98]");
  EXPECT_THROW_MSG(zoo::DcganGenerator(zoo::DcganGeneratorConfig{0, 8, 3}), dbrq::ValueError,
                   "DcganGenerator: nz, ngf and nc must be >= 1, got 0, 8 and 3");
  EXPECT_THROW_MSG(zoo::UNet(zoo::UNetConfig{3, 4, 0}), dbrq::ValueError,
                   "UNet: in_channels, num_classes and base_width must be >= 1, got 3, 4 and 0");
  EXPECT_THROW_MSG(zoo::KwsConv1d(zoo::KwsConv1dConfig{40, 16, 0}), dbrq::ValueError,
                   "KwsConv1d: n_mfcc, channels and num_classes must be >= 1, got 40, 16 and 0");
  // Another model's input type: the registry's typed run refuses it.
  EXPECT_THROW_MSG(zoo::find_model("unet").run(*kws, dbrq::randn({1, 3, 64, 64}, 0)), dbrq::ValueError,
                   "zoo: model \"unet\" cannot run a KwsConv1d");
}

}  // namespace
