#include "samples/zoo/vit.h"

#include <cmath>

namespace zoo {

using dbrq::Tensor;
namespace nn = dbrq::nn;

PatchEmbed::PatchEmbed(const VitConfig& c) {
  proj = register_module("proj", std::make_shared<nn::Conv2dImpl>(
                                     nn::Conv2dOptions(c.in_channels, c.d_model, c.patch_size).stride(c.patch_size)));
}

Tensor PatchEmbed::forward(const Tensor& images) {
  // [N, D, H/p, W/p] -> [N, D, patches] -> [N, patches, D]
  return (*proj)(images).flatten(2).transpose(1, 2);
}

VitAttention::VitAttention(const VitConfig& c)
    : num_heads_(c.num_heads), head_dim_(c.num_heads > 0 ? c.d_model / c.num_heads : 0) {
  DBRQ_ENSURE(c.num_heads >= 1 && c.d_model % c.num_heads == 0, dbrq::ValueError, "VitAttention: num_heads (",
              c.num_heads, ") must be >= 1 and divide d_model (", c.d_model, ")");
  qkv = register_module("qkv", std::make_shared<nn::LinearImpl>(c.d_model, 3 * c.d_model));
  proj = register_module("proj", std::make_shared<nn::LinearImpl>(c.d_model, c.d_model));
}

Tensor VitAttention::forward(const Tensor& x) {
  const int64_t batch = x.size(0), tokens = x.size(1);
  // [N, T, 3D] -> [3, N, heads, T, head_dim]
  const Tensor qkv_heads = (*qkv)(x).reshape({batch, tokens, 3, num_heads_, head_dim_}).permute({2, 0, 3, 1, 4});
  const Tensor q = qkv_heads.select(0, 0), k = qkv_heads.select(0, 1), v = qkv_heads.select(0, 2);
  const Tensor scores = dbrq::matmul(q, k.transpose(-1, -2)) * (1.0 / std::sqrt(static_cast<double>(head_dim_)));
  const Tensor context = dbrq::matmul(dbrq::softmax(scores, -1), v);  // [N, heads, T, head_dim]
  return (*proj)(context.permute({0, 2, 1, 3}).reshape({batch, tokens, num_heads_ * head_dim_}));
}

VitMlp::VitMlp(const VitConfig& c) {
  fc1 = register_module("fc1", std::make_shared<nn::LinearImpl>(c.d_model, c.mlp_dim));
  act = register_module("act", std::make_shared<nn::GELUImpl>());
  fc2 = register_module("fc2", std::make_shared<nn::LinearImpl>(c.mlp_dim, c.d_model));
}

Tensor VitMlp::forward(const Tensor& x) { return (*fc2)((*act)((*fc1)(x))); }

VitBlock::VitBlock(const VitConfig& c) {
  norm1 = register_module("norm1", std::make_shared<nn::LayerNormImpl>(c.d_model, c.layer_norm_eps));
  attn = register_module("attn", std::make_shared<VitAttention>(c));
  norm2 = register_module("norm2", std::make_shared<nn::LayerNormImpl>(c.d_model, c.layer_norm_eps));
  mlp = register_module("mlp", std::make_shared<VitMlp>(c));
}

Tensor VitBlock::forward(const Tensor& x) {
  const Tensor h = x + (*attn)((*norm1)(x));
  return h + (*mlp)((*norm2)(h));
}

VisionTransformer::VisionTransformer(const VitConfig& c) : config_(c) {
  DBRQ_ENSURE(c.image_size >= 1 && c.patch_size >= 1 && c.in_channels >= 1 && c.num_classes >= 1 && c.d_model >= 1 &&
                  c.num_layers >= 0 && c.mlp_dim >= 1,
              dbrq::ValueError, "VisionTransformer: sizes must be positive (image_size ", c.image_size, ", patch_size ",
              c.patch_size, ", in_channels ", c.in_channels, ", num_classes ", c.num_classes, ", d_model ", c.d_model,
              ", num_layers ", c.num_layers, ", mlp_dim ", c.mlp_dim, ")");
  DBRQ_ENSURE(c.image_size % c.patch_size == 0, dbrq::ValueError, "VisionTransformer: patch_size (", c.patch_size,
              ") must divide image_size (", c.image_size, ")");
  DBRQ_ENSURE(c.num_heads >= 1 && c.d_model % c.num_heads == 0, dbrq::ValueError, "VisionTransformer: num_heads (",
              c.num_heads, ") must be >= 1 and divide d_model (", c.d_model, ")");
  // timm draws both from N(0, 0.02) (truncated); the draws come from dbrq's seeded generator
  // (dbrq::manual_seed) through an Embedding's N(0, 1) initialization.
  cls_token = register_parameter("cls_token", nn::EmbeddingImpl(1, c.d_model).weight.reshape({1, 1, c.d_model}) * 0.02);
  pos_embed = register_parameter(
      "pos_embed",
      nn::EmbeddingImpl(1 + c.num_patches(), c.d_model).weight.reshape({1, 1 + c.num_patches(), c.d_model}) * 0.02);
  patch_embed = register_module("patch_embed", std::make_shared<PatchEmbed>(c));
  blocks = register_module("blocks", std::make_shared<nn::ModuleListImpl>());
  for (int64_t i = 0; i < c.num_layers; ++i) blocks->push_back(std::make_shared<VitBlock>(c));
  norm = register_module("norm", std::make_shared<nn::LayerNormImpl>(c.d_model, c.layer_norm_eps));
  head = register_module("head", std::make_shared<nn::LinearImpl>(c.d_model, c.num_classes));
}

Tensor VisionTransformer::forward(const Tensor& images) {
  const VitConfig& c = config_;
  DBRQ_ENSURE(images.dim() == 4 && images.size(1) == c.in_channels && images.size(2) == c.image_size &&
                  images.size(3) == c.image_size,
              dbrq::ShapeError, "VisionTransformer: expected [batch, ", c.in_channels, ", ", c.image_size, ", ",
              c.image_size, "] images, got ", images.shape_string());
  const int64_t batch = images.size(0);
  const Tensor patches = (*patch_embed)(images);  // [N, patches, D]
  const Tensor cls = cls_token + dbrq::zeros({batch, 1, c.d_model});
  Tensor x = dbrq::cat({cls, patches}, 1) + pos_embed;
  for (size_t i = 0; i < blocks->size(); ++i) x = (*blocks->at<VitBlock>(i))(x);
  return (*head)((*norm)(x).select(1, 0));
}

}  // namespace zoo
