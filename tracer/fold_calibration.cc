#include "tracer/fold_calibration.h"

#include <vector>

#include "absl/container/inlined_vector.h"
#include "runtime/op_registry.h"
#include "tracer/executors.h"

namespace dbrq::tracer {
namespace {

// A folded result waiting for its batch norm.
struct PendingFold {
  const SeenOpInfo* fold_op = nullptr;  // the batch norm record it was folded for
  Tensor out;                           // the op's own (unfolded) result, as the caller got it
  uint64_t out_version = 0;             // `out`'s storage version then (an in-place write voids the fold)
  Tensor folded;                        // the chain's value at the batch norm: the folded op's result
  std::vector<Tensor> stats;            // the statistics folded in, and their versions then
  std::vector<uint64_t> versions;
};

thread_local std::vector<PendingFold> tls_folds;

uint64_t version_of(const Tensor& t) { return t.defined() ? t.storage()->version() : 0; }

bool same_tensor(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.storage() == b.storage() && a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.dtype() == b.dtype();
}

}  // namespace

bool run_folded_base(const AutoQuantizationState& s, const SeenOpInfo& op, const OpCall& call, Tensor* out) {
  if (op.role != QuantRole::kWeighted || !op.fusion.fused() || op.fusion.position != 0 ||
      op.fusion.members.size() < 2 || op.qconfig == nullptr || op.qconfig->is_dynamic()) {
    return false;
  }
  const SeenOpInfo& bn = s.seen_ops()[static_cast<size_t>(op.fusion.members[1])];
  const OpDef& bn_def = op_def(bn.kind);
  if (bn_def.fold == nullptr || bn.params.empty()) return false;
  for (const WeightInfo& w : bn.weights) {
    if (w.missing) return false;  // a record loaded from a file, before its first call
  }
  const OpDef& def = op_def(op.kind);
  const size_t n_act = def.activation_inputs(call.inputs.size());
  // The weight and the bias slot (the bias may be undefined) follow the activations.
  if (call.inputs.size() != n_act + 2) return false;
  const Tensor& w = *call.inputs[n_act];
  const Tensor& b = *call.inputs[n_act + 1];
  // A linear's features are the last dim, a batch norm's channels dim 1: the same on 2-D only.
  if (op.kind == OpKind::kLinear && (n_act == 0 || call.inputs[0]->dim() != 2)) return false;
  if (!w.defined() || w.dtype() != DType::kF32 || (b.defined() && b.dtype() != DType::kF32)) return false;
  if (def.int8_weight_layout != nullptr && def.weight_from_int8_layout == nullptr) return false;

  PendingFold p;
  p.fold_op = &bn;
  for (const WeightInfo& wi : bn.weights) {
    p.stats.push_back(wi.tensor);
    p.versions.push_back(version_of(wi.tensor));
  }
  // The fold sees the weight output-major, as convert folds it; the op takes it in its own layout.
  Tensor fw, fb;
  const Tensor wl = def.int8_weight_layout != nullptr ? def.int8_weight_layout(w, call.params) : w;
  bn_def.fold(wl, b, p.stats, bn.params.get(), &fw, &fb);
  if (def.weight_from_int8_layout != nullptr) fw = def.weight_from_int8_layout(fw, call.params);

  absl::InlinedVector<const Tensor*, 4> ptrs(call.inputs.begin(), call.inputs.end());
  ptrs[n_act] = &fw;
  ptrs[n_act + 1] = &fb;
  OpCall c = call;
  c.inputs = absl::MakeConstSpan(ptrs);
  if (def.calibrate_run != nullptr) c.run = def.calibrate_run;
  p.folded = run_fp32(c);

  // The caller gets the op's own result: whatever reads it other than the batch norm (another
  // branch's op, a view, the user's code through data()) sees the true conv / linear output.
  // (Computed as the fp32 model computes it: only the batch norm's value is FX's.)
  *out = run_fp32(call);
  p.out = *out;
  p.out_version = version_of(p.out);
  tls_folds.push_back(std::move(p));
  return true;
}

bool take_folded(const SeenOpInfo& op, const OpCall& call, Tensor* out) {
  if (tls_folds.empty() || call.inputs.empty()) return false;
  const Tensor& x = *call.inputs[0];
  size_t i = 0;
  while (i < tls_folds.size() && !(tls_folds[i].fold_op == &op && same_tensor(tls_folds[i].out, x))) ++i;
  if (i == tls_folds.size()) return false;  // not a folded result: the op runs as it is
  PendingFold p = std::move(tls_folds[i]);
  tls_folds.erase(tls_folds.begin() + static_cast<std::ptrdiff_t>(i));

  const OpDef& def = op_def(op.kind);
  bool same = version_of(p.out) == p.out_version && call.inputs.size() == p.stats.size() + 1 &&
              (def.params_equal == nullptr || (call.params != nullptr && !op.params.empty() &&
                                               def.params_equal(op.params.get(), call.params)));
  for (size_t k = 0; same && k < p.stats.size(); ++k) {
    same = same_tensor(*call.inputs[k + 1], p.stats[k]) && version_of(p.stats[k]) == p.versions[k];
  }
  if (!same) return false;  // other statistics than the ones folded in: the batch norm runs as it is
  *out = p.folded;          // the chain's value here: the folded op's result
  return true;
}

Tensor run_observed(const AutoQuantizationState& s, const SeenOpInfo& op, const OpCall& call) {
  Tensor out;
  if (run_folded_base(s, op, call, &out) || take_folded(op, call, &out)) return out;
  const OpDef& def = op_def(call.kind);
  if (def.calibrate_run == nullptr) return run_fp32(call);
  OpCall c = call;
  c.run = def.calibrate_run;
  return run_fp32(c);
}

void drop_folds_on_this_thread() noexcept { tls_folds.clear(); }

}  // namespace dbrq::tracer
