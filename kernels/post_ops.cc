#include "kernels/post_ops.h"

namespace dbrq::kernels {

dnnl::algorithm eltwise_algorithm(PostOp::Kind kind) {
  using A = dnnl::algorithm;
  switch (kind) {
    case PostOp::Kind::kRelu:
    case PostOp::Kind::kLeakyRelu:
      return A::eltwise_relu;
    case PostOp::Kind::kClip:
      return A::eltwise_clip_v2;
    case PostOp::Kind::kHardswish:
      return A::eltwise_hardswish;
    case PostOp::Kind::kSigmoid:
      return A::eltwise_logistic;
    case PostOp::Kind::kTanh:
      return A::eltwise_tanh;
    case PostOp::Kind::kGeluErf:
      return A::eltwise_gelu_erf;
    case PostOp::Kind::kGeluTanh:
      return A::eltwise_gelu_tanh;
    case PostOp::Kind::kSilu:
      return A::eltwise_swish;
  }
  return A::eltwise_relu;
}

const char* eltwise_name(PostOp::Kind kind) {
  switch (kind) {
    case PostOp::Kind::kRelu:
      return "relu";
    case PostOp::Kind::kLeakyRelu:
      return "leaky_relu";
    case PostOp::Kind::kClip:
      return "clip";
    case PostOp::Kind::kHardswish:
      return "hardswish";
    case PostOp::Kind::kSigmoid:
      return "sigmoid";
    case PostOp::Kind::kTanh:
      return "tanh";
    case PostOp::Kind::kGeluErf:
      return "gelu";
    case PostOp::Kind::kGeluTanh:
      return "gelu_tanh";
    case PostOp::Kind::kSilu:
      return "silu";
  }
  return "?";
}

void append_post_ops(dnnl::post_ops& ops, const PostOps& post) {
  for (const PostOp& p : post) {
    float alpha = p.alpha, beta = p.beta;
    if (p.kind == PostOp::Kind::kRelu) alpha = beta = 0.f;
    if (p.kind == PostOp::Kind::kSilu) alpha = 1.f;
    ops.append_eltwise(1.f, eltwise_algorithm(p.kind), alpha, beta);
  }
}

dnnl::post_ops make_post_ops(const PostOps& post) {
  dnnl::post_ops ops;
  append_post_ops(ops, post);
  return ops;
}

void add_post_ops_to_key(PrimitiveKey& key, const PostOps& post) {
  key.add(static_cast<int64_t>(post.size()));
  for (const PostOp& p : post) key.add(static_cast<int64_t>(p.kind)).add(p.alpha).add(p.beta);
}

}  // namespace dbrq::kernels
