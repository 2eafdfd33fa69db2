// The reduction family: mean, sum, std over dims (empty: all). mean keeps int8 (the rounded mean of
// codes, same parameters); sum and std run in fp32.
#include "core/op_shapes.h"
#include "kernels/eager.h"
#include "kernels/int8.h"
#include "runtime/ops.h"
#include "runtime/ops/op_call.h"

namespace dbrq {
namespace {

Tensor run_mean(const OpCall& c) { return kernels::mean(c.input(0), c.p<DimParams>().dims, c.p<DimParams>().keepdim); }
Tensor run_sum(const OpCall& c) { return kernels::sum(c.input(0), c.p<DimParams>().dims, c.p<DimParams>().keepdim); }
Tensor run_std(const OpCall& c) {
  const DimParams& dp = c.p<DimParams>();
  return kernels::std_dev(c.input(0), dp.dims, dp.unbiased, dp.keepdim);
}

Tensor int8_mean(const Tensor& x, const void* p) {
  const DimParams& dp = *static_cast<const DimParams*>(p);
  return kernels::qmean(x, dp.dims, dp.keepdim);
}

Tensor reduce(OpKind kind, const Tensor& x, std::vector<int64_t> dims, bool keepdim, bool unbiased, OpFn run) {
  DimParams p;
  p.dims.assign(dims.begin(), dims.end());
  p.keepdim = keepdim;
  p.unbiased = unbiased;
  const Tensor* in[] = {&x};
  return ops::call(kind, in, &p, run);
}

}  // namespace

Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpKind::kMean, x, std::move(dims), keepdim, true, run_mean);
}
Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce(OpKind::kSum, x, std::move(dims), keepdim, true, run_sum);
}
Tensor std(const Tensor& x, std::vector<int64_t> dims, bool unbiased, bool keepdim) {
  return reduce(OpKind::kStd, x, std::move(dims), keepdim, unbiased, run_std);
}

Tensor Tensor::mean(std::vector<int64_t> dims, bool keepdim) const {
  return ::dbrq::mean(*this, std::move(dims), keepdim);
}
Tensor Tensor::sum(std::vector<int64_t> dims, bool keepdim) const {
  return ::dbrq::sum(*this, std::move(dims), keepdim);
}

namespace ops {

void register_reduction_ops(OpRegistry& r) {
  OpDef& mean = r.define(OpKind::kMean, "mean").with_params<DimParams>();
  mean.run = run_mean;
  mean.role = QuantRole::kShare;
  mean.int8_share = int8_mean;

  OpDef& sum = r.define(OpKind::kSum, "sum").with_params<DimParams>();
  sum.run = run_sum;

  OpDef& sd = r.define(OpKind::kStd, "std").with_params<DimParams>();
  sd.run = run_std;
}

}  // namespace ops
}  // namespace dbrq
