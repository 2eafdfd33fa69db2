#include "tracer/equalize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/logging.h"
#include "tracer/flow_graph.h"
#include "tracer/quantize.h"

namespace dbrq {
namespace {

using tracer::FlowGraph;
using tracer::Registrations;
using tracer::registrations;
using tracer::tied;
using tracer::FlowNode;

// A conv2d or linear layer with its weights and, when one follows it alone, its batch norm.
struct Weighted {
  int node = -1;
  Tensor w, b;  // b may be undefined
  int64_t out = 0, cpg = 0, kk = 1, groups = 1;
  int bn = -1;
  Tensor gamma, beta, var;  // of the batch norm (gamma / beta may be undefined for a second layer)
  double eps = 0.0;

  // |gamma_o| / sqrt(var_o + eps): the batch-norm fold's scale of output channel o.
  double fold(int64_t o) const {
    if (bn < 0) return 1.0;
    const double g = gamma.defined() ? std::abs(static_cast<double>(gamma.raw_data<float>()[o])) : 1.0;
    return g / std::sqrt(static_cast<double>(var.raw_data<float>()[o]) + eps);
  }
  // Range of output channel o of the folded weights.
  double out_range(int64_t o) const {
    const float* p = w.raw_data<float>() + o * cpg * kk;
    double m = 0.0;
    for (int64_t k = 0; k < cpg * kk; ++k) m = std::max(m, std::abs(static_cast<double>(p[k])));
    return m * fold(o);
  }
  // Range of input channel i of the folded weights (over the output channels of its group).
  double in_range(int64_t i) const {
    const int64_t opg = out / groups, g = i / cpg, c = i % cpg;
    const float* p = w.raw_data<float>();
    double m = 0.0;
    for (int64_t o = g * opg; o < (g + 1) * opg; ++o) {
      double mo = 0.0;
      for (int64_t k = 0; k < kk; ++k) mo = std::max(mo, std::abs(static_cast<double>(p[(o * cpg + c) * kk + k])));
      m = std::max(m, mo * fold(o));
    }
    return m;
  }
  int64_t in_channels() const { return cpg * groups; }
};

struct Pair {
  Weighted a, b;
  std::string first, second;  // the layers' names
  std::string via;
  bool exact = true;
};

bool is_weighted(const FlowNode& n) { return n.kind == OpKind::kConv2d || n.kind == OpKind::kLinear; }

// The layer at node i, or a reason it cannot take part.
std::string describe_weighted(const FlowGraph& g, const Registrations& reg, int i, Weighted* out) {
  const FlowNode& n = g.nodes[static_cast<size_t>(i)];
  Weighted l;
  l.node = i;
  l.w = n.inputs.size() > 1 ? n.inputs[1] : Tensor();
  l.b = n.inputs.size() > 2 ? n.inputs[2] : Tensor();
  if (!g.is_param(l.w)) return "its weight is not a registered f32 parameter";
  if (l.b.defined() && !g.is_param(l.b)) return "its bias is not a registered f32 parameter";
  if (g.param_uses.at(l.w.storage().get()) != 1) return "its weight is used by several ops";
  if (l.b.defined() && g.param_uses.at(l.b.storage().get()) != 1) return "its bias is used by several ops";
  for (const std::string& why : {tied(reg, l.w, "weight"), tied(reg, l.b, "bias")})
    if (!why.empty()) return why;
  if (n.kind == OpKind::kConv2d) {
    if (l.w.dim() != 4) return "its weight is not 4-D";
    l.groups = n.conv.groups;
    l.out = l.w.size(0);
    l.cpg = l.w.size(1);
    l.kk = l.w.size(2) * l.w.size(3);
  } else {
    if (l.w.dim() != 2) return "its weight is not 2-D";
    l.out = l.w.size(0);
    l.cpg = l.w.size(1);
  }
  *out = l;
  return "";
}

// The batch norm reading only node i's output, with its statistics as registered tensors.
int following_bn(const FlowGraph& g, const Registrations& reg, int i, bool need_affine, Weighted* l,
                 std::string* why) {
  const int c = g.sole_consumer(i);
  if (c < 0) return -1;
  const FlowNode& n = g.nodes[static_cast<size_t>(c)];
  if (n.kind != OpKind::kBatchNorm || n.producers[0] != i) return -1;
  if (g.nodes[static_cast<size_t>(i)].kind == OpKind::kLinear && n.inputs[0].dim() != 2) {
    *why = "batch norm after a linear with more than 2 dims";
    return -2;
  }
  const Tensor &mean = n.inputs[1], &var = n.inputs[2], &gamma = n.inputs[3], &beta = n.inputs[4];
  if (!g.is_param(mean) || !g.is_param(var)) {
    *why = "the batch norm's statistics are not registered buffers";
    return -2;
  }
  if (need_affine) {
    if (!gamma.defined() || !beta.defined()) {
      *why = "the batch norm has no affine parameters to rescale";
      return -2;
    }
    if (!g.is_param(gamma) || !g.is_param(beta) || g.param_uses.at(gamma.storage().get()) != 1 ||
        g.param_uses.at(beta.storage().get()) != 1) {
      *why = "the batch norm's affine parameters are not registered parameters used once";
      return -2;
    }
    *why = tied(reg, gamma, "batch norm's weight");
    if (why->empty()) *why = tied(reg, beta, "batch norm's bias");
    if (!why->empty()) return -2;
  }
  if (mean.numel() != l->out || var.numel() != l->out) {
    *why = "the batch norm's channel count differs from the layer's";
    return -2;
  }
  l->bn = c;
  l->gamma = gamma;
  l->beta = beta;
  l->var = var;
  l->eps = n.eps;
  return c;
}

bool is_relu6_like(const FlowNode& n) {
  return n.kind == OpKind::kRelu6 || (n.kind == OpKind::kHardtanh && n.act.alpha == 0.0 && n.act.beta > 0.0);
}

void scale_rows(Tensor& t, int64_t row, int64_t len, double factor) {
  float* p = t.raw_mutable_data<float>() + row * len;
  for (int64_t k = 0; k < len; ++k) p[k] = static_cast<float>(static_cast<double>(p[k]) * factor);
}

// Divides output channel i of `a` by s, multiplies input channel i of `b` by s.
void apply(Pair& p, int64_t i, double s) {
  if (p.a.bn >= 0) {
    scale_rows(p.a.gamma, i, 1, 1.0 / s);
    scale_rows(p.a.beta, i, 1, 1.0 / s);
  } else {
    scale_rows(p.a.w, i, p.a.cpg * p.a.kk, 1.0 / s);
    if (p.a.b.defined()) scale_rows(p.a.b, i, 1, 1.0 / s);
  }
  const Weighted& b = p.b;
  const int64_t opg = b.out / b.groups, g = i / b.cpg, c = i % b.cpg;
  for (int64_t o = g * opg; o < (g + 1) * opg; ++o) scale_rows(p.b.w, o * b.cpg + c, b.kk, s);
}

double imbalance(const Pair& p) {
  double worst = 1.0;
  for (int64_t i = 0; i < p.a.out; ++i) {
    const double r1 = p.a.out_range(i), r2 = p.b.in_range(i);
    if (r1 <= 0.0 || r2 <= 0.0) continue;
    worst = std::max(worst, std::max(r1 / r2, r2 / r1));
  }
  return worst;
}

double max_abs(const std::vector<Tensor>& ts) {
  double m = 0.0;
  for (const Tensor& t : ts)
    for (float v : t.contiguous().to_vector<float>()) m = std::max(m, std::abs(static_cast<double>(v)));
  return m;
}

double max_abs_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double m = 0.0;
  for (size_t k = 0; k < a.size() && k < b.size(); ++k) {
    const std::vector<float> x = a[k].contiguous().to_vector<float>(), y = b[k].contiguous().to_vector<float>();
    if (x.size() != y.size()) return INFINITY;
    for (size_t j = 0; j < x.size(); ++j)
      m = std::max(m, std::abs(static_cast<double>(x[j]) - static_cast<double>(y[j])));
  }
  return m;
}

}  // namespace

std::string EqualizeReport::to_string() const {
  std::ostringstream os;
  os << "equalized " << pairs.size() << " pair(s) in " << iterations << " round(s); output change on the example "
     << output_change << " (relative)\n";
  for (const EqualizedPair& p : pairs) {
    os << "  " << p.first << " -> " << (p.via.empty() ? "" : p.via + " -> ") << p.second << ": " << p.channels
       << " channels, imbalance " << p.imbalance_before << " -> " << p.imbalance_after
       << (p.exact ? "" : " (relu6 treated as relu)") << "\n";
  }
  if (pairs.empty()) os << "  no conv -> conv or linear -> linear pair found\n";
  for (const std::string& s : skipped) os << "  skipped: " << s << "\n";
  return os.str();
}

namespace {

// The candidate pairs of one run's graph; candidates that cannot be equalized go to `skipped`.
std::vector<Pair> find_pairs(nn::Module& model, const FlowGraph& g, const Registrations& reg,
                             const EqualizeOptions& options, std::vector<std::string>* skipped) {
  std::vector<Pair> pairs;
  for (int i = 0; i < static_cast<int>(g.nodes.size()); ++i) {
    if (!is_weighted(g.nodes[static_cast<size_t>(i)])) continue;
    // Walk the chain i -> [batch_norm] -> [activation] -> next weighted op.
    Pair p;
    std::string why;
    int cur = i;
    std::vector<std::string> via;
    const bool a_ok = describe_weighted(g, reg, i, &p.a).empty();
    if (!a_ok) continue;
    const int bn = following_bn(g, reg, i, /*need_affine=*/true, &p.a, &why);
    if (bn >= 0) {
      cur = bn;
      via.push_back("batch_norm");
    }
    int c = g.sole_consumer(cur);
    if (c < 0) continue;
    const FlowNode* n = &g.nodes[static_cast<size_t>(c)];
    if (n->producers[0] != cur) continue;
    if (n->kind == OpKind::kRelu || is_relu6_like(*n)) {
      via.push_back(op_name(n->kind));
      if (is_relu6_like(*n)) {
        if (options.relu6 == Relu6Policy::kSkip) {
          why = absl::StrCat(op_name(n->kind), " is not positive-homogeneous (EqualizeOptions::relu6 = kSkip)");
        }
        p.exact = false;
      }
      cur = c;
      c = g.sole_consumer(cur);
      if (c < 0) continue;
      n = &g.nodes[static_cast<size_t>(c)];
      if (n->producers[0] != cur) continue;
    }
    if (n->kind != g.nodes[static_cast<size_t>(i)].kind) continue;
    // A second layer reading the chain: a candidate pair from here on; say why it is skipped.
    const std::string name_a = tracer::node_name(model, g, i), name_b = tracer::node_name(model, g, c);
    if (why.empty()) why = describe_weighted(g, reg, c, &p.b);
    if (why.empty() && p.b.in_channels() != p.a.out) why = "channel counts differ";
    for (size_t k = 1; why.empty() && k < n->producers.size(); ++k)
      if (n->producers[k] == cur) why = "the intermediate is also its weight";
    if (why.empty()) {
      std::string ignored;
      if (following_bn(g, reg, c, /*need_affine=*/false, &p.b, &ignored) < -1) p.b.bn = -1;
    }
    if (!why.empty()) {
      skipped->push_back(absl::StrCat(name_a, " -> ", name_b, ": ", why));
      continue;
    }
    p.via = absl::StrJoin(via, "+");
    p.first = name_a;
    p.second = name_b;
    pairs.push_back(std::move(p));
  }
  return pairs;
}

// What makes two runs' pairs the same pair: the same tensors rescaled the same way.
std::string pair_key(const Pair& p) {
  return absl::StrCat(reinterpret_cast<uintptr_t>(p.a.w.storage().get()), "/",
                      p.a.bn >= 0 ? reinterpret_cast<uintptr_t>(p.a.gamma.storage().get()) : 0, "/",
                      reinterpret_cast<uintptr_t>(p.b.w.storage().get()), "/", p.via, "/", p.exact);
}

void check_model(nn::Module& model) {
  DBRQ_ENSURE(!is_prepared(model), UsageError, "equalize: ", model.type_name(),
              " is prepared; equalize the fp32 model before dbrq::prepare");
  DBRQ_ENSURE(!model.is_training(), UsageError, "equalize: ", model.type_name(),
              " is in training mode; call eval() first (batch statistics and dropout would change every run)");
}

bool reads(const FlowGraph& g, const Tensor& t) {
  for (const FlowNode& n : g.nodes)
    for (const Tensor& in : n.inputs)
      if (in.defined() && in.storage() == t.storage()) return true;
  return false;
}

}  // namespace

EqualizeReport equalize(nn::Module& model, const std::vector<Tensor>& example_inputs,
                        const EqualizeOptions& options) {
  check_model(model);
  DBRQ_ENSURE(!example_inputs.empty(), ValueError,
              "equalize: example_inputs is empty; pass the tensors forward takes");
  return equalize(model, std::vector<std::vector<Tensor>>{example_inputs}, options);
}

EqualizeReport equalize(nn::Module& model, const std::vector<std::vector<Tensor>>& examples,
                        const EqualizeOptions& options) {
  check_model(model);
  DBRQ_ENSURE(!examples.empty(), ValueError, "equalize: no example batches; pass at least one (the tensors forward takes)");
  for (size_t k = 0; k < examples.size(); ++k)
    DBRQ_ENSURE(!examples[k].empty(), ValueError, "equalize: example batch ", k,
                " is empty; each batch lists the tensors forward takes");
  DBRQ_ENSURE(options.max_iterations >= 1, ValueError, "equalize: max_iterations must be >= 1, got ",
              options.max_iterations);
  DBRQ_ENSURE(options.tolerance > 0.0 && std::isfinite(options.tolerance), ValueError,
              "equalize: tolerance must be a positive number, got ", options.tolerance);
  DBRQ_ENSURE(options.max_output_change >= 0.0, ValueError, "equalize: max_output_change must be >= 0, got ",
              options.max_output_change);

  // One graph per example batch: with data-dependent control flow each may take another path.
  std::vector<std::vector<Tensor>> before(examples.size());
  std::vector<FlowGraph> graphs;
  for (size_t k = 0; k < examples.size(); ++k)
    graphs.push_back(tracer::trace_flow(model, [&] { before[k] = model.forward_tensors(examples[k]); }));

  const Registrations reg = registrations(model);
  EqualizeReport report;
  std::vector<std::vector<Pair>> found(graphs.size());
  std::vector<std::string> skipped;
  for (size_t k = 0; k < graphs.size(); ++k) found[k] = find_pairs(model, graphs[k], reg, options, &skipped);
  // A pair is equalized only if every run that reads either layer finds the same pair: a path on
  // which the first layer's output has another reader (or the second layer reads something else)
  // would compute something else after rescaling. A path no example takes is not seen at all
  // (docs/equalization_bias_correction.md).
  std::vector<Pair> pairs;
  std::set<std::string> taken;
  for (size_t k = 0; k < found.size(); ++k) {
    for (Pair& p : found[k]) {
      const std::string key = pair_key(p);
      if (!taken.insert(key).second) continue;
      std::string why;
      for (size_t j = 0; j < graphs.size() && why.empty(); ++j) {
        if (!reads(graphs[j], p.a.w) && !reads(graphs[j], p.b.w)) continue;
        const bool same = std::any_of(found[j].begin(), found[j].end(),
                                      [&](const Pair& q) { return pair_key(q) == key; });
        if (!same) {
          why = absl::StrCat("not a pair on example batch ", j,
                             " (another path: the intermediate has another reader there, or a layer runs "
                             "apart); equalizing would change that path's result");
        }
      }
      if (!why.empty()) {
        skipped.push_back(absl::StrCat(p.first, " -> ", p.second, ": ", why));
        continue;
      }
      pairs.push_back(p);
    }
  }
  std::set<std::string> seen_skip;
  for (const std::string& s : skipped)
    if (seen_skip.insert(s).second) report.skipped.push_back(s);
  // A layer can be the first of at most one pair and the second of at most one (sole consumers),
  // and a batch norm belongs to the first layer only.
  for (const Pair& p : pairs) {
    EqualizedPair e;
    e.first = p.first;
    e.second = p.second;
    e.via = p.via;
    e.channels = p.a.out;
    e.imbalance_before = imbalance(p);
    e.exact = p.exact;
    report.pairs.push_back(e);
  }
  if (pairs.empty()) {
    log()->warn("equalize: no pair to equalize in {}", model.type_name());
    return report;
  }

  // Everything that may change, for restoring.
  std::vector<std::pair<Tensor, Tensor>> saved;
  auto save = [&](const Tensor& t) {
    if (!t.defined()) return;
    for (const auto& s : saved)
      if (s.first.storage() == t.storage()) return;
    InterceptorScope plain(nullptr);
    saved.emplace_back(t, t.clone());
  };
  for (const Pair& p : pairs) {
    save(p.a.w);
    save(p.a.b);
    save(p.a.gamma);
    save(p.a.beta);
    save(p.b.w);
  }
  auto restore = [&] {
    for (auto& [t, copy] : saved) std::memcpy(t.raw_mutable_data<float>(), copy.raw_data<float>(), t.nbytes());
  };

  for (int round = 0; round < options.max_iterations; ++round) {
    double worst = 0.0;
    for (Pair& p : pairs) {
      for (int64_t ch = 0; ch < p.a.out; ++ch) {
        const double r1 = p.a.out_range(ch), r2 = p.b.in_range(ch);
        if (!(r1 > 0.0) || !(r2 > 0.0) || !std::isfinite(r1) || !std::isfinite(r2)) continue;
        const double s = std::sqrt(r1 / r2);
        worst = std::max(worst, std::abs(s - 1.0));
        if (s != 1.0) apply(p, ch, s);
      }
    }
    report.iterations = round + 1;
    if (worst <= options.tolerance) break;
  }
  for (size_t k = 0; k < pairs.size(); ++k) report.pairs[k].imbalance_after = imbalance(pairs[k]);

  for (size_t k = 0; k < examples.size(); ++k) {
    std::vector<Tensor> after;
    try {
      InterceptorScope plain(nullptr);
      after = model.forward_tensors(examples[k]);
    } catch (...) {
      restore();
      throw;
    }
    const double ref = max_abs(before[k]);
    report.output_change = std::max(report.output_change, max_abs_diff(before[k], after) / (ref > 0.0 ? ref : 1.0));
  }
  const bool all_exact =
      std::all_of(pairs.begin(), pairs.end(), [](const Pair& p) { return p.exact; });
  if (all_exact && !(report.output_change <= options.max_output_change)) {
    restore();
    DBRQ_THROW(ValueError, "equalize: ", model.type_name(), "'s output on the example changed by ",
               report.output_change, " (relative; allowed ", options.max_output_change,
               ") after equalizing ", pairs.size(),
               " pair(s): something reads an equalized tensor outside dbrq's ops (e.g. data() or to_vector() in "
               "forward); the weights were restored");
  }
  log()->info("{}", report.to_string());
  return report;
}

}  // namespace dbrq
