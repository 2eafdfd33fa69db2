#include "samples/zoo/zoo.h"

#include <algorithm>
#include <random>
#include <utility>

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

namespace {

// The tensor a spec's run returns: the output itself, or the decoder's logits.
Tensor main_output(Tensor out) { return out; }
Tensor main_output(DecoderOutput out) { return std::move(out.logits); }

template <typename M>
Tensor run_as(nn::Module& model, const Tensor& input, const std::string& expected) {
  auto* typed = dynamic_cast<M*>(&model);
  DBRQ_ENSURE(typed != nullptr, dbrq::ValueError, "zoo: model \"", expected, "\" cannot run a ", model.type_name(),
              " module");
  return main_output((*typed)(input));
}

// The parts every entry shares: construction from a per-variant config, and the typed call.
template <typename M, typename Config>
ModelSpec spec_for(std::string name, std::string description, dbrq::DType input_dtype, Config (*config)(Variant)) {
  ModelSpec s;
  s.name = std::move(name);
  s.description = std::move(description);
  s.input_dtype = input_dtype;
  s.make = [config](Variant v) -> std::shared_ptr<nn::Module> { return std::make_shared<M>(config(v)); };
  s.run = [name = s.name](nn::Module& m, const Tensor& x) { return run_as<M>(m, x, name); };
  return s;
}

// [N, channels, hw, hw] N(0, 1) images, hw depending on the variant.
void set_image_input(ModelSpec* s, int64_t channels, int64_t full_hw, int64_t tiny_hw) {
  s->input_shape = [=](Variant v, int64_t batch) {
    const int64_t hw = v == Variant::kFull ? full_hw : tiny_hw;
    return std::vector<int64_t>{batch, channels, hw, hw};
  };
  s->example_input = [shape = s->input_shape](Variant v, int64_t batch, uint64_t seed) {
    return dbrq::randn(shape(v, batch), seed);
  };
}

// [N, seq_len(variant)] s64 token ids, uniform over the vocabulary.
void set_token_input(ModelSpec* s, int64_t (*seq_len)(Variant), int64_t (*vocab_size)(Variant)) {
  s->input_shape = [seq_len](Variant v, int64_t batch) { return std::vector<int64_t>{batch, seq_len(v)}; };
  s->example_input = [seq_len, vocab_size](Variant v, int64_t batch, uint64_t seed) {
    const int64_t seq = seq_len(v);
    std::mt19937_64 gen(seed);
    std::uniform_int_distribution<int64_t> token(0, vocab_size(v) - 1);
    std::vector<int64_t> ids(static_cast<size_t>(batch * seq));
    for (auto& id : ids) id = token(gen);
    return dbrq::from_vector(ids, {batch, seq});
  };
}

std::vector<ModelSpec> build_registry() {
  std::vector<ModelSpec> specs;

  specs.push_back(spec_for<ResNet18>("resnet18", "ResNet-18 (torchvision architecture and keys), image classifier",
                                     dbrq::DType::kF32, resnet18_config));
  set_image_input(&specs.back(), 3, 224, 64);

  specs.push_back(spec_for<MobileNetV2>("mobilenet_v2",
                                        "MobileNetV2 (torchvision architecture and keys), image classifier",
                                        dbrq::DType::kF32, mobilenet_v2_config));
  set_image_input(&specs.back(), 3, 224, 64);

  specs.push_back(spec_for<BertEncoder>(
      "bert_encoder", "BERT-style transformer encoder (HuggingFace key names), token ids -> hidden states",
      dbrq::DType::kS64, bert_config));
  set_token_input(&specs.back(), bert_example_seq_len, [](Variant v) { return bert_config(v).vocab_size; });

  specs.push_back(spec_for<SmallCnn>("small_cnn", "small CNN for 8x8 digit images (10 classes), quantization friendly",
                                     dbrq::DType::kF32, small_cnn_config));
  set_image_input(&specs.back(), 1, 8, 8);

  specs.push_back(spec_for<DecoderLM>(
      "decoder_lm", "GPT-2 style decoder-only transformer LM with a KV cache, token ids -> logits (empty cache)",
      dbrq::DType::kS64, decoder_lm_config));
  set_token_input(&specs.back(), decoder_lm_example_seq_len,
                  [](Variant v) { return decoder_lm_config(v).vocab_size; });
  specs.push_back(spec_for<GruClassifier>(
      "gru_classifier", "embedding + 2-layer GRU over variable-length token sequences (0-padded) -> class logits",
      dbrq::DType::kS64, gru_classifier_config));
  specs.back().input_shape = [](Variant v, int64_t batch) {
    return std::vector<int64_t>{batch, gru_example_seq_len(v)};
  };
  specs.back().example_input = [](Variant v, int64_t batch, uint64_t seed) {
    const int64_t steps = gru_example_seq_len(v);
    std::mt19937_64 gen(seed);
    std::uniform_int_distribution<int64_t> token(1, gru_classifier_config(v).vocab_size - 1);
    std::uniform_int_distribution<int64_t> length(std::max<int64_t>(1, steps / 4), steps);
    std::vector<int64_t> ids(static_cast<size_t>(batch * steps), 0);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t n = length(gen);
      for (int64_t t = 0; t < n; ++t) ids[static_cast<size_t>(b * steps + t)] = token(gen);
    }
    return dbrq::from_vector(ids, {batch, steps});
  };

  // ---- issue 12: generative, segmentation and audio models ----
  specs.push_back(spec_for<DcganGenerator>(
      "dcgan_generator", "DCGAN generator: latents [N, nz, 1, 1] -> ConvTranspose2d + BN + ReLU blocks -> tanh images",
      dbrq::DType::kF32, dcgan_generator_config));
  specs.back().input_shape = [](Variant v, int64_t batch) {
    return std::vector<int64_t>{batch, dcgan_generator_config(v).nz, 1, 1};
  };
  specs.back().example_input = [shape = specs.back().input_shape](Variant v, int64_t batch, uint64_t seed) {
    return dbrq::randn(shape(v, batch), seed);
  };

  specs.push_back(spec_for<UNet>("unet",
                                 "U-Net segmentation net: 3 levels, max-pool down, ConvTranspose2d up with skip cat, "
                                 "1x1 conv head -> per-pixel logits",
                                 dbrq::DType::kF32, unet_config));
  set_image_input(&specs.back(), 3, unet_example_hw(Variant::kFull), unet_example_hw(Variant::kTiny));

  specs.push_back(spec_for<KwsConv1d>(
      "kws_conv1d", "keyword spotting on MFCC frames: Conv1d + BN + ReLU blocks, max / adaptive avg pool1d, linear",
      dbrq::DType::kF32, kws_conv1d_config));
  specs.back().input_shape = [](Variant v, int64_t batch) {
    return std::vector<int64_t>{batch, kws_conv1d_config(v).n_mfcc, kKwsFrames};
  };
  specs.back().example_input = [shape = specs.back().input_shape](Variant v, int64_t batch, uint64_t seed) {
    return dbrq::randn(shape(v, batch), seed);
  };
  specs.push_back(spec_for<DenseNet>("densenet",
                                     "DenseNet-121 (torchvision architecture and keys): pre-activation dense blocks",
                                     dbrq::DType::kF32, densenet_config));
  set_image_input(&specs.back(), 3, 224, 32);

  specs.push_back(spec_for<VisionTransformer>(
      "vit", "ViT-style image classifier (timm key names): patch conv, class token, attention blocks, GELU",
      dbrq::DType::kF32, vit_config));
  set_image_input(&specs.back(), 3, vit_config(Variant::kFull).image_size, vit_config(Variant::kTiny).image_size);
  return specs;
}

}  // namespace

const char* variant_name(Variant variant) { return variant == Variant::kFull ? "full" : "tiny"; }

Variant parse_variant(const std::string& name) {
  if (name == "full") return Variant::kFull;
  if (name == "tiny") return Variant::kTiny;
  DBRQ_THROW(dbrq::ValueError, "zoo: unknown variant \"", name, "\"; expected \"full\" or \"tiny\"");
}

ResNet18Config resnet18_config(Variant variant) {
  if (variant == Variant::kFull) return {};
  return {/*base_width=*/8, /*num_classes=*/10};
}

MobileNetV2Config mobilenet_v2_config(Variant variant) {
  if (variant == Variant::kFull) return {};
  return {/*width_mult=*/0.25, /*num_classes=*/10};
}

BertConfig bert_config(Variant variant) {
  BertConfig c;
  if (variant == Variant::kTiny) {
    c.vocab_size = 1000;
    c.hidden_size = 64;
    c.num_layers = 2;
    c.num_heads = 2;
    c.intermediate_size = 128;
    c.max_position = 32;
  }
  return c;
}

SmallCnnConfig small_cnn_config(Variant) { return {}; }

GruClassifierConfig gru_classifier_config(Variant variant) {
  GruClassifierConfig c;
  if (variant == Variant::kTiny) {
    c.vocab_size = 50;
    c.embedding_dim = 16;
    c.hidden_size = 24;
  }
  return c;
}

DenseNetConfig densenet_config(Variant variant) {
  DenseNetConfig c;
  if (variant == Variant::kTiny) {
    c.growth_rate = 8;
    c.block_config = {2, 2};
    c.num_init_features = 16;
    c.bn_size = 2;
    c.num_classes = 10;
  }
  return c;
}

VitConfig vit_config(Variant variant) {
  VitConfig c;
  if (variant == Variant::kTiny) {
    c.image_size = 16;
    c.patch_size = 4;
    c.d_model = 32;
    c.num_layers = 2;
    c.num_heads = 2;
    c.mlp_dim = 64;
  }
  return c;
}

int64_t gru_example_seq_len(Variant variant) { return variant == Variant::kFull ? 64 : 12; }

int64_t bert_example_seq_len(Variant variant) { return variant == Variant::kFull ? 128 : 16; }

DecoderConfig decoder_lm_config(Variant variant) {
  DecoderConfig c;
  if (variant == Variant::kTiny) {
    c.vocab_size = 128;
    c.d_model = 64;
    c.num_layers = 2;
    c.num_heads = 2;
    c.d_ff = 256;
    c.max_positions = 64;
  }
  return c;
}

int64_t decoder_lm_example_seq_len(Variant variant) { return variant == Variant::kFull ? 32 : 8; }

// ---- issue 12's models ----

DcganGeneratorConfig dcgan_generator_config(Variant variant) {
  if (variant == Variant::kFull) return {};
  return {/*nz=*/16, /*ngf=*/8, /*nc=*/3};
}

UNetConfig unet_config(Variant variant) {
  if (variant == Variant::kFull) return {};
  return {/*in_channels=*/3, /*num_classes=*/4, /*base_width=*/8};
}

int64_t unet_example_hw(Variant variant) { return variant == Variant::kFull ? 128 : 64; }

KwsConv1dConfig kws_conv1d_config(Variant variant) {
  if (variant == Variant::kFull) return {};
  return {/*n_mfcc=*/40, /*channels=*/16, /*num_classes=*/12};
}

const std::vector<ModelSpec>& model_registry() {
  static const std::vector<ModelSpec>* registry = new std::vector<ModelSpec>(build_registry());
  return *registry;
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const ModelSpec& s : model_registry()) names.push_back(s.name);
  return names;
}

const ModelSpec& find_model(const std::string& name) {
  for (const ModelSpec& s : model_registry()) {
    if (s.name == name) return s;
  }
  std::string known;
  for (const ModelSpec& s : model_registry()) known += (known.empty() ? "" : ", ") + s.name;
  DBRQ_THROW(dbrq::ValueError, "zoo: unknown model \"", name, "\"; known models: ", known);
}

std::shared_ptr<nn::Module> make_model(const std::string& name, Variant variant) {
  return find_model(name).make(variant);
}

int64_t parameter_count(const nn::Module& model) {
  int64_t n = 0;
  for (const auto& [name, p] : model.named_parameters()) n += p.numel();
  return n;
}

}  // namespace zoo
