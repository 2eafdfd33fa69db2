// A ViT-style image classifier (Dosovitskiy et al. 2020, timm's VisionTransformer layout and key
// names: "cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.norm1.weight",
// "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.weight", "norm.weight", "head.weight", ...):
//
//   auto model = std::make_shared<zoo::VisionTransformer>();   // 32x32 images, patch 4, d_model 192,
//   model->eval();                                             // 6 layers, 3 heads, MLP 768, 10 classes
//   dbrq::Tensor images = dbrq::randn({8, 3, 32, 32}, 0);
//   dbrq::Tensor logits = (*model)(images);                    // [8, 10]
//
// The patches are a strided convolution (kernel = stride = patch size), flattened into tokens; a
// learned class token is joined in front with cat and a learned position embedding added; then
// pre-LayerNorm encoder blocks (x + attn(norm1(x)), x + mlp(norm2(x))), a final LayerNorm, and a
// linear head on the class token. Attention is written out (one qkv Linear, reshape / permute,
// matmul, scaling, softmax, matmul, proj) so every step is visible to quantization; the MLP is
// fc1, GELU (erf form), fc2. No dropout (inference only). The class token is broadcast to the
// batch by adding it to zeros of [N, 1, d_model] (PyTorch's twin uses expand; the same values), so
// the recorded program does not depend on the batch size.
#pragma once

#include <cstdint>
#include <memory>

#include "dbrq.h"

namespace zoo {

struct VitConfig {
  int64_t image_size = 32;  // square images
  int64_t patch_size = 4;   // must divide image_size
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  int64_t d_model = 192;
  int64_t num_layers = 6;
  int64_t num_heads = 3;         // must divide d_model
  int64_t mlp_dim = 768;         // 4 x d_model
  double layer_norm_eps = 1e-6;  // timm's value

  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

// [N, C, H, W] images -> [N, patches, d_model] tokens (row-major patch order).
struct PatchEmbed : dbrq::nn::CallableModule<PatchEmbed> {
  explicit PatchEmbed(const VitConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& images);

  std::shared_ptr<dbrq::nn::Conv2dImpl> proj;
};

// Multi-head self-attention over all tokens; one Linear makes q, k and v ([q | k | v] rows).
struct VitAttention : dbrq::nn::CallableModule<VitAttention> {
  explicit VitAttention(const VitConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& x);  // [N, T, d_model] -> [N, T, d_model]

  std::shared_ptr<dbrq::nn::LinearImpl> qkv, proj;

 private:
  int64_t num_heads_, head_dim_;
};

struct VitMlp : dbrq::nn::CallableModule<VitMlp> {
  explicit VitMlp(const VitConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& x);

  std::shared_ptr<dbrq::nn::LinearImpl> fc1;
  std::shared_ptr<dbrq::nn::GELUImpl> act;
  std::shared_ptr<dbrq::nn::LinearImpl> fc2;
};

// Pre-LayerNorm encoder block.
struct VitBlock : dbrq::nn::CallableModule<VitBlock> {
  explicit VitBlock(const VitConfig& config);
  dbrq::Tensor forward(const dbrq::Tensor& x);

  std::shared_ptr<dbrq::nn::LayerNormImpl> norm1;
  std::shared_ptr<VitAttention> attn;
  std::shared_ptr<dbrq::nn::LayerNormImpl> norm2;
  std::shared_ptr<VitMlp> mlp;
};

struct VisionTransformer : dbrq::nn::CallableModule<VisionTransformer> {
  explicit VisionTransformer(const VitConfig& config = {});
  // [N, in_channels, image_size, image_size] f32 images -> [N, num_classes] logits. Throws
  // ShapeError for another rank, channel count or image size.
  dbrq::Tensor forward(const dbrq::Tensor& images);

  const VitConfig& config() const { return config_; }

  dbrq::Tensor cls_token;  // [1, 1, d_model]
  dbrq::Tensor pos_embed;  // [1, 1 + patches, d_model]
  std::shared_ptr<PatchEmbed> patch_embed;
  std::shared_ptr<dbrq::nn::ModuleListImpl> blocks;
  std::shared_ptr<dbrq::nn::LayerNormImpl> norm;
  std::shared_ptr<dbrq::nn::LinearImpl> head;

 private:
  VitConfig config_;
};

}  // namespace zoo
