#include "kernels/post_ops.h"

namespace dbrq::kernels {

dnnl::algorithm eltwise_algorithm(const Eltwise& e) {
  using A = dnnl::algorithm;
  switch (e.alg) {
    case Eltwise::Alg::kRelu:
      return A::eltwise_relu;
    case Eltwise::Alg::kClip:
      return A::eltwise_clip_v2;
    case Eltwise::Alg::kHardswish:
      return A::eltwise_hardswish;
    case Eltwise::Alg::kLogistic:
      return A::eltwise_logistic;
    case Eltwise::Alg::kTanh:
      return A::eltwise_tanh;
    case Eltwise::Alg::kGeluErf:
      return A::eltwise_gelu_erf;
    case Eltwise::Alg::kGeluTanh:
      return A::eltwise_gelu_tanh;
    case Eltwise::Alg::kSwish:
      return A::eltwise_swish;
    case Eltwise::Alg::kElu:
      return A::eltwise_elu;
    case Eltwise::Alg::kMish:
      return A::eltwise_mish;
    case Eltwise::Alg::kHardsigmoid:
    case Eltwise::Alg::kSoftplus:
      break;
  }
  DBRQ_CHECK(false, eltwise_name(e), " has no oneDNN post-op");
  return A::eltwise_relu;
}

void append_post_ops(dnnl::post_ops& ops, const PostOps& post) {
  for (const Eltwise& p : post) ops.append_eltwise(1.f, eltwise_algorithm(p), p.alpha, p.beta);
}

dnnl::post_ops make_post_ops(const PostOps& post) {
  dnnl::post_ops ops;
  append_post_ops(ops, post);
  return ops;
}

void add_post_ops_to_key(PrimitiveKey& key, const PostOps& post) {
  key.add(static_cast<int64_t>(post.size()));
  for (const Eltwise& p : post) key.add(static_cast<int64_t>(p.alg)).add(p.alpha).add(p.beta);
}

}  // namespace dbrq::kernels
