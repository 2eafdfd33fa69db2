// Translation of dbrq post-ops (fused elementwise steps) into oneDNN post-op chains. Internal.
#pragma once

#include "kernels/dnnl_utils.h"
#include "kernels/eager.h"

namespace dbrq::kernels {

dnnl::algorithm eltwise_algorithm(const Eltwise& e);
// Appends each post-op as an eltwise step (scale 1).
void append_post_ops(dnnl::post_ops& ops, const PostOps& post);
dnnl::post_ops make_post_ops(const PostOps& post);
void add_post_ops_to_key(PrimitiveKey& key, const PostOps& post);

}  // namespace dbrq::kernels
