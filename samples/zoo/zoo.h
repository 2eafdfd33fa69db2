// The model zoo: eager models written against dbrq's public API, plus a registry so a demo, a
// test or a CLI can pick one by name.
//
//   #include "samples/zoo/zoo.h"
//
//   const zoo::ModelSpec& spec = zoo::find_model("resnet18");        // throws dbrq::ValueError if unknown
//   std::shared_ptr<dbrq::nn::Module> model = spec.make(zoo::Variant::kFull);
//   model->eval();
//   dbrq::Tensor x = spec.example_input(zoo::Variant::kFull, /*batch=*/2, /*seed=*/0);  // [2, 3, 224, 224]
//   dbrq::Tensor logits = spec.run(*model, x);                          // the typed call operator
//
//   auto cnn = zoo::make_model("small_cnn");                           // same as find_model(..).make(..)
//
// Models: "resnet18", "mobilenet_v2", "bert_encoder", "small_cnn", "decoder_lm", "gru_classifier", "vit",
// and issue 12's "dcgan_generator", "unet", "kws_conv1d", "densenet".
// Each has two variants:
//   kFull  the architecture as published (torchvision's ResNet-18 and MobileNetV2 with 1000
//          classes on 224x224 images; the BERT encoder with its defaults on 128 tokens; SmallCnn
//          on 8x8 digits; the decoder LM with its defaults (4 layers, d_model 256, 4 heads, vocab
//          1024, 256 positions) on a 32-token prompt; the GRU classifier with vocab 10000, 128-d
//          embeddings, a 2-layer GRU of 128, 4 classes, on sequences of up to 64 tokens; the ViT
//          classifier with its defaults: 32x32 images, patch 4, d_model 192, 6 layers, 3 heads,
//          MLP 768, 10 classes).
//   kTiny  the reduced configuration tests/models/ goldens use, small enough for fast tests:
//          ResNet-18 base width 8, MobileNetV2 width 0.25 (both 10 classes, 64x64 images), BERT
//          with vocab 1000, d_model 64, 2 layers, 2 heads, FFN 128 on 16 tokens, SmallCnn as is, the
//          decoder LM with vocab 128, d_model 64, 2 layers, 2 heads, MLP 256, 64 positions on 8 tokens,
//          the GRU classifier with vocab 50, 16-d embeddings, GRU 2 x 24, 4 classes, up to 12 tokens,
//          the ViT with 16x16 images, patch 4, d_model 32, 2 layers, 2 heads, MLP 64, 10 classes.
//   Issue 12's models (kFull / kTiny):
//     dcgan_generator  nz 64, ngf 32 / nz 16, ngf 8; [N, nz, 1, 1] N(0, 1) latents -> [N, 3, 32, 32]
//     unet             base width 32 on 128x128 / base width 8 on 64x64; 3 channels -> 4 classes
//     kws_conv1d       64 / 16 channels; [N, 40, 98] N(0, 1) MFCC-like features -> 12 keywords
//   "densenet" is torchvision's DenseNet-121 on 224x224 images (kFull) and, kTiny, growth 8, blocks
//          2-2, 16 initial features, bn_size 2, 10 classes on 32x32 images.
// The decoder LM's `run` is one call on the token ids with an empty cache and returns its logits
// [N, S, vocab]; generation (DecoderLM::generate) needs the typed model.
// Weights are PyTorch's default initialization (seed them with dbrq::manual_seed); load real ones
// with load_state_dict.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/bert_encoder.h"
#include "samples/zoo/dcgan_generator.h"
#include "samples/zoo/decoder_lm.h"
#include "samples/zoo/densenet.h"
#include "samples/zoo/gru_classifier.h"
#include "samples/zoo/kws_conv1d.h"
#include "samples/zoo/mobilenet_v2.h"
#include "samples/zoo/resnet.h"
#include "samples/zoo/small_cnn.h"
#include "samples/zoo/unet.h"
#include "samples/zoo/vit.h"

namespace zoo {

enum class Variant { kFull, kTiny };

const char* variant_name(Variant variant);  // "full", "tiny"
// Parses "full" or "tiny"; throws dbrq::ValueError otherwise.
Variant parse_variant(const std::string& name);

// The configurations behind each variant (kTiny ones are what the golden tests build).
ResNet18Config resnet18_config(Variant variant);
MobileNetV2Config mobilenet_v2_config(Variant variant);
BertConfig bert_config(Variant variant);
SmallCnnConfig small_cnn_config(Variant variant);
DecoderConfig decoder_lm_config(Variant variant);
GruClassifierConfig gru_classifier_config(Variant variant);
// Issue 12's models.
DcganGeneratorConfig dcgan_generator_config(Variant variant);
UNetConfig unet_config(Variant variant);
int64_t unet_example_hw(Variant variant);  // height = width of unet's example input
KwsConv1dConfig kws_conv1d_config(Variant variant);
constexpr int64_t kKwsFrames = 98;  // frames of kws_conv1d's example input (1 s of 10 ms hops)
DenseNetConfig densenet_config(Variant variant);
VitConfig vit_config(Variant variant);
// Sequence length of bert_encoder's example input.
int64_t bert_example_seq_len(Variant variant);
// Prompt length of decoder_lm's example input.
int64_t decoder_lm_example_seq_len(Variant variant);
// Padded length of gru_classifier's example input (its sequences are 1/4 to all of it long).
int64_t gru_example_seq_len(Variant variant);

struct ModelSpec {
  std::string name;
  std::string description;
  dbrq::DType input_dtype = dbrq::DType::kF32;  // f32 images, or s64 token ids
  // Builds the model with default-initialized weights (training mode, as PyTorch constructs it).
  std::function<std::shared_ptr<dbrq::nn::Module>(Variant)> make;
  // Sizes of an example input holding `batch` samples.
  std::function<std::vector<int64_t>(Variant, int64_t batch)> input_shape;
  // A deterministic example input: N(0, 1) images, or token ids uniform over the vocabulary
  // (gru_classifier: non-zero ids, each sequence 0-padded after a length drawn from [T/4, T]).
  std::function<dbrq::Tensor(Variant, int64_t batch, uint64_t seed)> example_input;
  // Calls a model made by `make` through its call operator (so quantization hooks see the call);
  // throws dbrq::ValueError when `model` is another type.
  std::function<dbrq::Tensor(dbrq::nn::Module& model, const dbrq::Tensor& input)> run;
};

// Every model, in a fixed order.
const std::vector<ModelSpec>& model_registry();
std::vector<std::string> model_names();
// Throws dbrq::ValueError naming the known models when `name` is not one of them.
const ModelSpec& find_model(const std::string& name);
std::shared_ptr<dbrq::nn::Module> make_model(const std::string& name, Variant variant = Variant::kFull);

// Number of parameter elements (buffers such as BN running statistics are not counted).
int64_t parameter_count(const dbrq::nn::Module& model);

}  // namespace zoo
