#include "tracer/bias_correction.h"

#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "kernels/bn_fold.h"
#include "kernels/int8.h"
#include "quant_state/observers.h"
#include "tracer/flow_graph.h"
#include "tracer/quantize.h"

namespace dbrq {
namespace {

using tracer::FlowGraph;
using tracer::FlowNode;

struct Target {
  int node = -1;             // in the graph it was found in
  OpKind kind = OpKind::kNumOpKinds;
  Conv2dParams conv;
  Tensor delta_w;            // W - Q(W), folded
  Tensor param;              // receives the shift
  std::vector<float> post_scale;  // per channel, applied to the shift (empty: 1): gamma / sigma of
                                  // an unfused batch norm between the layer and its beta
  std::string layer, target;
  std::string how;           // where the shift goes and from which weights (compared between batches)
  Tensor w;                  // the layer's weight (identifies it in every batch's graph)
  std::vector<double> sum;   // per output channel
  int64_t count = 0;         // output positions summed per channel
};

std::string module_fqn(nn::Module& model, nn::Module* m) {
  if (m == nullptr) return "";
  for (const auto& [fqn, mm] : model.named_modules())
    if (mm == m) return fqn;
  return "";
}

QConfigPtr qconfig_of(nn::Module& model, const QConfigMapping& mapping, const FlowNode& n) {
  if (n.module == nullptr) return mapping.for_op(n.kind, model.type_name(), "");
  const std::string fqn = module_fqn(model, n.module);
  if (n.module->is_leaf()) return mapping.for_module(n.module->type_name(), fqn);
  return mapping.for_op(n.kind, n.module->type_name(), fqn);
}

// W - dequantize(quantize(W)) with the qconfig's weight observer, as convert quantizes W (and as
// the int8 kernel then does: with doubled scales on a CPU without VNNI).
Tensor weight_error(const QConfig& q, const Tensor& w) {
  std::unique_ptr<Observer> obs = make_observer(q.weight);
  obs->observe(w);
  const QuantParamsPtr qp = kernels::weight_qparams_for_isa(obs->calculate_qparams());
  const Tensor quantized = qp->is_per_channel()
                               ? quantize_per_channel(w, qp->scales, qp->zero_points, qp->axis, q.weight.dtype)
                               : quantize_per_tensor(w, qp->scale(), qp->zero_point(), q.weight.dtype);
  return sub(w, dequantize(quantized));
}

// Finds the layers to correct in one batch's graph, or says why not.
std::vector<Target> find_targets(nn::Module& model, const QConfigMapping& mapping, const FlowGraph& g,
                                 std::vector<std::string>* skipped) {
  std::vector<Target> out;
  // A bias (or beta) another module also registers may be read on a path the run did not take.
  const tracer::Registrations reg = tracer::registrations(model);
  // prepare's default backend (correct_bias takes the mapping prepare will get).
  const BackendConfig backend = BackendConfig::onednn();
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    const FlowNode& n = g.nodes[static_cast<size_t>(i)];
    if (n.kind != OpKind::kConv2d && n.kind != OpKind::kLinear) continue;
    const std::string name = tracer::node_name(model, g, i);
    auto skip = [&](const std::string& why) { skipped->push_back(absl::StrCat(name, ": ", why)); };
    const QConfigPtr q = qconfig_of(model, mapping, n);
    if (n.module == nullptr || !n.module->is_leaf()) {
      // A functional conv / linear: its qconfig may be a call site's, which this graph does not
      // resolve; correcting a bias for int8 weights the op may not have would shift an fp32 op.
      const std::string fqn = module_fqn(model, n.module);
      bool sites = false;
      for (const auto& [site, sq] : mapping.module_name_object_type_orders()) {
        sites = sites || (site.module_fqn == fqn && site.op == n.kind);
      }
      if (sites) {
        skip("its module has call-site qconfig entries (set_module_name_object_type_order) for this op");
        continue;
      }
    }
    if (q == nullptr || q->is_bf16()) {
      skip(q == nullptr ? "kept fp32 by the mapping" : "marked bf16 by the mapping (no int8 weights to correct for)");
      continue;
    }
    // A qconfig the backend has no int8 kernel for (per-channel weights along another axis than
    // the output channels): convert runs the op fp32, with no weight error to correct.
    if (const std::string why = backend.unsupported_reason(n.kind, *q); !why.empty()) {
      skip(absl::StrCat("convert runs it fp32: ", why));
      continue;
    }
    const Tensor& w = n.inputs[1];
    const Tensor b = n.inputs.size() > 2 ? n.inputs[2] : Tensor();
    if (!g.is_param(w) || g.param_uses.at(w.storage().get()) != 1) {
      skip("its weight is not a registered f32 parameter used by this op only");
      continue;
    }
    Target t;
    t.node = i;
    t.kind = n.kind;
    t.conv = n.conv;
    t.layer = name;
    t.w = w;
    Tensor folded_w = w, folded_b = b;
    // A batch norm reading only this output: convert folds it into the layer when prepare fuses
    // them (then its beta is corrected, from the folded weights' error).
    const int c = g.sole_consumer(i);
    const FlowNode* bn = nullptr;
    if (c >= 0 && g.nodes[static_cast<size_t>(c)].kind == OpKind::kBatchNorm &&
        g.nodes[static_cast<size_t>(c)].producers[0] == i &&
        (n.kind == OpKind::kConv2d || n.inputs[0].dim() == 2)) {
      bn = &g.nodes[static_cast<size_t>(c)];
    }
    // Convert folds the batch norm only when prepare fuses it with the layer: the mapping quantizes
    // it (int8, not bf16) and one module records both (tracer's discover_fusions).
    bool fused = false;
    if (bn != nullptr) {
      const QConfigPtr bq = qconfig_of(model, mapping, *bn);
      fused = bq != nullptr && !bq->is_bf16() && !bq->is_dynamic() && !q->is_dynamic() && bn->owner == n.owner;
    }
    std::string tie;
    if (bn != nullptr && (fused || !b.defined())) {
      tie = tracer::tied(reg, bn->inputs[4], "batch norm's bias");
    } else {
      tie = tracer::tied(reg, b, "bias");
    }
    if (!tie.empty()) {
      skip(tie);
      continue;
    }
    if (bn != nullptr && !fused && !b.defined()) {
      // The layer runs int8 with its own weights and the batch norm runs after it: the layer's
      // output shift reaches the batch norm's output times gamma / sigma, so beta takes that.
      const Tensor& beta = bn->inputs[4];
      const Tensor& gamma = bn->inputs[3];
      if (!beta.defined() || !g.is_param(beta) || g.param_uses.at(beta.storage().get()) != 1) {
        skip("no bias, and the unfused batch norm after it has no beta parameter of its own to correct");
        continue;
      }
      const Tensor var = bn->inputs[2].contiguous();
      const float* pv = var.raw_data<float>();
      const Tensor gc = gamma.defined() ? gamma.contiguous() : Tensor();
      t.post_scale.resize(static_cast<size_t>(var.numel()));
      for (int64_t o = 0; o < var.numel(); ++o) {
        const double gm = gc.defined() ? gc.raw_data<float>()[o] : 1.0;
        t.post_scale[static_cast<size_t>(o)] = static_cast<float>(gm / std::sqrt(static_cast<double>(pv[o]) + bn->eps));
      }
      t.param = beta;
      t.target = g.param_name(beta);
      t.how = "the beta of the unfused batch norm after it";
    } else if (fused) {
      const Tensor& beta = bn->inputs[4];
      if (!beta.defined() || !g.is_param(beta) || g.param_uses.at(beta.storage().get()) != 1) {
        skip("the batch norm after it has no beta parameter of its own to correct");
        continue;
      }
      kernels::BatchNormStats stats{bn->inputs[1], bn->inputs[2], bn->inputs[3], beta, bn->eps};
      kernels::fold_batch_norm(w, b, stats, &folded_w, &folded_b);
      t.param = beta;
      t.target = g.param_name(beta);
      t.how = "the beta of the batch norm folded into it";
    } else {
      if (!b.defined()) {
        skip("no bias to correct (bias=false and no batch norm after it)");
        continue;
      }
      if (!g.is_param(b) || g.param_uses.at(b.storage().get()) != 1) {
        skip("its bias is not a registered f32 parameter used by this op only");
        continue;
      }
      t.param = b;
      t.target = g.param_name(b);
      t.how = "its bias";
    }
    t.delta_w = weight_error(*q, folded_w);
    t.sum.assign(static_cast<size_t>(folded_w.size(0)), 0.0);
    out.push_back(std::move(t));
  }
  return out;
}

// Adds conv(x, delta_w) (or linear) summed per output channel to t.
void accumulate(Target& t, const Tensor& x) {
  const Tensor d = t.kind == OpKind::kConv2d ? conv2d(x, t.delta_w, Tensor(), t.conv) : linear(x, t.delta_w);
  const Tensor dc = d.contiguous();
  const float* p = dc.raw_data<float>();
  const int64_t channels = static_cast<int64_t>(t.sum.size());
  if (t.kind == OpKind::kConv2d) {
    const int64_t n = dc.size(0), hw = dc.size(2) * dc.size(3);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t o = 0; o < channels; ++o) {
        double s = 0.0;
        const float* q = p + (b * channels + o) * hw;
        for (int64_t k = 0; k < hw; ++k) s += q[k];
        t.sum[static_cast<size_t>(o)] += s;
      }
    t.count += n * hw;
  } else {
    const int64_t rows = dc.numel() / channels;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < channels; ++o) t.sum[static_cast<size_t>(o)] += p[r * channels + o];
    t.count += rows;
  }
}

}  // namespace

std::string BiasCorrectionReport::to_string() const {
  std::ostringstream os;
  os << "bias correction over " << batches << " batch(es): " << layers.size() << " layer(s)\n";
  for (const CorrectedLayer& l : layers)
    os << "  " << l.layer << " -> " << l.target << ": " << l.channels << " channels, shift max |" << l.max_abs_shift
       << "|, mean |" << l.mean_abs_shift << "|\n";
  if (layers.empty()) os << "  no conv2d or linear layer to correct\n";
  for (const std::string& s : skipped) os << "  skipped: " << s << "\n";
  return os.str();
}

BiasCorrectionReport correct_bias(nn::Module& model, const std::vector<std::vector<Tensor>>& calibration,
                                  const QConfigMapping& mapping) {
  DBRQ_ENSURE(!is_prepared(model), UsageError, "correct_bias: ", model.type_name(),
              " is prepared; correct the fp32 model's biases before dbrq::prepare");
  DBRQ_ENSURE(!model.is_training(), UsageError, "correct_bias: ", model.type_name(),
              " is in training mode; call eval() first");
  DBRQ_ENSURE(!calibration.empty(), ValueError,
              "correct_bias: no calibration data; pass at least one batch (the tensors forward takes)");
  for (size_t k = 0; k < calibration.size(); ++k)
    DBRQ_ENSURE(!calibration[k].empty(), ValueError, "correct_bias: calibration batch ", k,
                " is empty; each batch lists the tensors forward takes");
  mapping.validate(model);

  BiasCorrectionReport report;
  std::vector<Target> targets;
  std::map<const Storage*, size_t> by_weight;  // weight storage -> target
  {
    // Every batch's run decides which layers to correct and how (bias, or a batch norm's beta with
    // folded or unfolded weights): with data-dependent control flow batches take different paths,
    // and a layer whose batch norm is fused on one path and not on another (prepare then does not
    // fuse it) must not get the correction one path calls for. A layer is corrected only if every
    // batch that runs it agrees; a path no batch takes is not seen.
    struct Seen {
      std::string name;
      std::vector<std::pair<size_t, std::string>> outcomes;  // (batch, how or "" when skipped there)
      bool has_target = false;
      Target target;
    };
    std::map<const Storage*, Seen> seen;
    std::vector<const Storage*> order;
    std::vector<std::string> skipped;
    for (size_t k = 0; k < calibration.size(); ++k) {
      const FlowGraph g = tracer::trace_flow(model, [&] { model.forward_tensors(calibration[k]); });
      InterceptorScope plain(nullptr);
      std::vector<Target> found = find_targets(model, mapping, g, &skipped);
      std::map<const Storage*, Target*> here;
      for (Target& t : found) here[t.w.storage().get()] = &t;
      for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
        const FlowNode& n = g.nodes[static_cast<size_t>(i)];
        if ((n.kind != OpKind::kConv2d && n.kind != OpKind::kLinear) || n.inputs.size() < 2 || !n.inputs[1].defined()) {
          continue;
        }
        const Storage* key = n.inputs[1].storage().get();
        auto [it, fresh] = seen.try_emplace(key);
        if (fresh) {
          it->second.name = tracer::node_name(model, g, i);
          order.push_back(key);
        }
        auto h = here.find(key);
        it->second.outcomes.emplace_back(k, h == here.end() ? std::string() : h->second->how);
        if (h != here.end() && !it->second.has_target) {
          it->second.target = std::move(*h->second);
          it->second.has_target = true;
          here.erase(h);
        }
      }
    }
    for (const Storage* key : order) {
      Seen& e = seen[key];
      if (!e.has_target) continue;  // skipped on every batch (reasons already listed)
      std::string why;
      for (const auto& [k, how] : e.outcomes) {
        if (how == e.target.how) continue;
        why = absl::StrCat("calibration batches take paths that need different corrections (", e.target.how,
                           " on one, ", how.empty() ? std::string("none") : how, " on batch ", k,
                           "); one correction would be wrong on the other path");
        break;
      }
      if (!why.empty()) {
        skipped.push_back(absl::StrCat(e.name, ": ", why));
        continue;
      }
      by_weight[key] = targets.size();
      targets.push_back(std::move(e.target));
    }
    std::set<std::string> listed;
    for (const std::string& s : skipped)
      if (listed.insert(s).second) report.skipped.push_back(s);
  }
  // Then every batch adds each target's conv(x, W - Q(W)) as the op runs (before anything later in
  // forward could modify x in place).
  for (const std::vector<Tensor>& batch : calibration) {
    if (targets.empty()) break;
    tracer::trace_flow(
        model, [&] { model.forward_tensors(batch); },
        [&](const FlowGraph& graph, int i) {
          const FlowNode& n = graph.nodes[static_cast<size_t>(i)];
          if (n.kind != OpKind::kConv2d && n.kind != OpKind::kLinear) return;
          auto it = by_weight.find(n.inputs[1].storage().get());
          if (it == by_weight.end()) return;
          InterceptorScope plain(nullptr);
          accumulate(targets[it->second], n.inputs[0]);
        });
    ++report.batches;
  }
  for (Target& t : targets) {
    CorrectedLayer l;
    l.layer = t.layer;
    l.target = t.target;
    l.channels = static_cast<int64_t>(t.sum.size());
    float* p = t.param.raw_mutable_data<float>();
    for (size_t o = 0; o < t.sum.size(); ++o) {
      double shift = t.count > 0 ? t.sum[o] / static_cast<double>(t.count) : 0.0;
      if (!t.post_scale.empty()) shift *= t.post_scale[o];
      p[o] = static_cast<float>(static_cast<double>(p[o]) + shift);
      l.max_abs_shift = std::max(l.max_abs_shift, std::abs(shift));
      l.mean_abs_shift += std::abs(shift) / static_cast<double>(t.sum.size());
    }
    report.layers.push_back(l);
  }
  if (report.layers.empty()) log()->warn("correct_bias: no layer to correct in {}", model.type_name());
  log()->info("{}", report.to_string());
  return report;
}

}  // namespace dbrq
