#include "tracer/smooth_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/error.h"
#include "runtime/dispatcher.h"
#include "tracer/flow_graph.h"
#include "tracer/quantize.h"

namespace dbrq {
namespace {

// A Linear or LayerNorm layer of the model, found by its weight's data pointer (an op call only
// sees tensors).
struct Layer {
  std::string fqn;
  bool linear = false;  // else LayerNorm
  Tensor weight, bias;  // the parameters themselves (shared storage): folding writes into them
  // Why folding must not write into its parameters (tied to another parameter), empty if it may.
  std::string frozen;
};

// Statistics of one producer's output (over every call of the producer).
struct Group {
  std::string producer;
  bool linear = false;
  Tensor weight, bias;              // the producer's
  std::vector<float> absmax;        // per channel (last dim)
  std::vector<std::string> consumers;
  std::vector<const Layer*> consumer_layers;
  std::string bad;                  // why it cannot be folded; empty: foldable
  std::vector<float> rows;          // kept rows for the alpha search, row-major [n, C]
  int64_t n_rows = 0;
};

bool f32_contiguous(const Tensor& t) { return t.defined() && t.dtype() == DType::kF32 && t.is_contiguous(); }

class SmoothInterceptor : public Interceptor {
 public:
  SmoothInterceptor(const std::unordered_map<const void*, Layer>& layers, int64_t keep_rows)
      : layers_(layers), keep_rows_(keep_rows) {
    for (const auto& [ptr, l] : layers_) {
      params_[l.weight.storage().get()].push_back({&l, "weight", l.weight});
      if (l.bias.defined()) params_[l.bias.storage().get()].push_back({&l, "bias", l.bias});
    }
  }

  Tensor on_op(const OpCall& call) override {
    note_parameter_reads(call);
    Tensor out = call.run(call);
    std::string source;  // the producer of a linear's input
    for (size_t i = 0; i < call.num_inputs(); ++i) {
      const Tensor& t = call.input(i);
      if (!t.defined()) continue;
      auto it = live_.find(t.data_ptr());
      if (it == live_.end()) continue;
      Group& g = groups_[it->second.first];
      const Layer* consumer = nullptr;
      if (call.kind == OpKind::kLinear && i == 0 && t.sizes() == it->second.second.sizes()) {
        auto l = layers_.find(call.input(1).data_ptr());
        if (l != layers_.end() && l->second.linear) consumer = &l->second;
      }
      if (consumer == nullptr) {
        if (g.bad.empty()) {
          g.bad = call.kind == OpKind::kLinear && i == 0 ? "its output is read by a linear that is not a Linear layer"
                                                         : absl::StrCat("its output is also read by ", op_name(call.kind));
        }
        continue;
      }
      if (std::find(g.consumer_layers.begin(), g.consumer_layers.end(), consumer) == g.consumer_layers.end()) {
        g.consumer_layers.push_back(consumer);
        g.consumers.push_back(consumer->fqn);
      }
      source = g.producer;
    }
    if (call.kind == OpKind::kLinear) {
      auto l = layers_.find(call.input(1).data_ptr());
      if (l != layers_.end() && l->second.linear) {
        // Where this call's input came from ("" for no tracked producer): a linear fed from two
        // places cannot take one group's factors.
        sources_[l->second.fqn].insert(source);
        track(out, l->second);
      }
    } else if (call.kind == OpKind::kLayerNorm && call.num_inputs() >= 3) {
      auto l = layers_.find(call.input(1).defined() ? call.input(1).data_ptr() : nullptr);
      const Tensor& x = call.input(0);
      if (l != layers_.end() && !l->second.linear && call.input(2).defined() && call.input(1).dim() == 1 &&
          x.dim() >= 1 && call.input(1).numel() == x.size(-1)) {
        track(out, l->second);
      }
    }
    return out;
  }

  void on_module_enter(nn::Module&, absl::Span<Tensor* const>) override {}
  void on_module_exit(nn::Module&, absl::Span<Tensor* const>) override {}
  void on_module_unwind(nn::Module&) noexcept override {}

  // After one calibration call: outputs of the model that are tracked cannot be rescaled.
  void end_call(const std::vector<Tensor>& outputs) {
    for (const Tensor& t : outputs) {
      if (!t.defined()) continue;
      auto it = live_.find(t.data_ptr());
      if (it != live_.end() && groups_[it->second.first].bad.empty()) {
        groups_[it->second.first].bad = "its output is returned by the model";
      }
    }
    live_.clear();
  }

  std::vector<Group>& groups() { return groups_; }
  const std::map<std::string, std::set<std::string>>& sources() const { return sources_; }
  // Layers whose parameters some other op also read (fqn -> why they must not change).
  const std::map<std::string, std::string>& foreign_reads() const { return foreign_; }

 private:
  // A layer's weight or bias read by anything but the layer's own op (an embedding sharing a
  // linear's weight, a matmul on a transposed weight, ...): rescaling it would change that reader.
  // Parameters may be views into one storage: a read concerns the parameters its elements overlap.
  void note_parameter_reads(const OpCall& call) {
    for (size_t i = 0; i < call.num_inputs(); ++i) {
      const Tensor& t = call.input(i);
      if (!t.defined()) continue;
      auto it = params_.find(t.storage().get());
      if (it == params_.end()) continue;
      for (const Param& p : it->second) {
        const bool own = i == (std::string(p.which) == "weight" ? 1u : 2u) && own_call(call, *p.layer);
        if (own || !overlap(t, p.tensor) || foreign_.count(p.layer->fqn) != 0) continue;
        foreign_[p.layer->fqn] = absl::StrCat("its ", p.which, " is also read by ", op_name(call.kind));
      }
    }
  }

  // The layer's own op: its kind, reading exactly the layer's weight and bias (none where the
  // layer has none), and for a LayerNorm normalizing the last dim, as track() needs. A layer_norm
  // on the weight with no bias or another one would not see the fold's compensation.
  static bool own_call(const OpCall& call, const Layer& l) {
    auto same = [&](size_t i, const Tensor& p) {
      if (i >= call.num_inputs() || !call.input(i).defined()) return !p.defined();
      const Tensor& t = call.input(i);
      return p.defined() && t.data_ptr() == p.data_ptr() && t.sizes() == p.sizes() && t.strides() == p.strides();
    };
    if (call.kind != (l.linear ? OpKind::kLinear : OpKind::kLayerNorm) || !same(1, l.weight) || !same(2, l.bias)) {
      return false;
    }
    if (l.linear) return true;
    const Tensor& x = call.input(0);
    return l.bias.defined() && l.weight.dim() == 1 && x.defined() && x.dim() >= 1 && l.weight.numel() == x.size(-1);
  }

  // Element offsets [first, last] of a view in its storage.
  static std::pair<int64_t, int64_t> extent(const Tensor& t) {
    int64_t last = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.size(d) == 0) return {0, -1};
      last += (t.size(d) - 1) * std::abs(t.strides()[static_cast<size_t>(d)]);
    }
    return {t.storage_offset(), last};
  }
  static bool overlap(const Tensor& a, const Tensor& b) {
    const auto [a0, a1] = extent(a);
    const auto [b0, b1] = extent(b);
    const int64_t ea = static_cast<int64_t>(a.element_size()), eb = static_cast<int64_t>(b.element_size());
    return a1 >= a0 && b1 >= b0 && a0 * ea <= b1 * eb + eb - 1 && b0 * eb <= a1 * ea + ea - 1;
  }


  void track(const Tensor& out, const Layer& layer) {
    if (!out.defined() || out.dtype() != DType::kF32 || out.dim() < 1 || out.numel() == 0) return;
    auto gi = group_index_.find(layer.fqn);
    if (gi == group_index_.end()) {
      gi = group_index_.emplace(layer.fqn, groups_.size()).first;
      Group g;
      g.producer = layer.fqn;
      g.linear = layer.linear;
      g.weight = layer.weight;
      g.bias = layer.bias;
      groups_.push_back(std::move(g));
    }
    Group& g = groups_[gi->second];
    const Tensor c = out.contiguous();
    const int64_t ch = c.size(-1), n = c.numel() / ch;
    if (g.absmax.empty()) g.absmax.assign(static_cast<size_t>(ch), 0.f);
    if (static_cast<int64_t>(g.absmax.size()) != ch) {
      g.bad = "its output's channel count changes between calls";
    } else {
      const float* p = c.raw_data<float>();
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < ch; ++j) {
          const float v = std::fabs(p[r * ch + j]);
          if (std::isfinite(v)) g.absmax[static_cast<size_t>(j)] = std::max(g.absmax[static_cast<size_t>(j)], v);
        }
      }
      const int64_t keep = std::min(n, keep_rows_ - g.n_rows);
      if (keep > 0) {
        g.rows.insert(g.rows.end(), p, p + keep * ch);
        g.n_rows += keep;
      }
    }
    live_[out.data_ptr()] = {gi->second, out};  // holding `out` keeps its storage (and address) alive
  }

  const std::unordered_map<const void*, Layer>& layers_;
  int64_t keep_rows_;
  std::vector<Group> groups_;
  std::map<std::string, size_t> group_index_;
  std::unordered_map<const void*, std::pair<size_t, Tensor>> live_;  // this call's tracked outputs
  std::map<std::string, std::set<std::string>> sources_;  // linear fqn -> producers of its input ("": none)
  struct Param {
    const Layer* layer;
    const char* which;  // "weight" or "bias"
    Tensor tensor;
  };
  std::unordered_map<const Storage*, std::vector<Param>> params_;
  std::map<std::string, std::string> foreign_;
};

// max over the consumers of max_i |W[i, j]|, per input channel j.
std::vector<float> weight_absmax(const Group& g) {
  std::vector<float> m(g.absmax.size(), 0.f);
  for (const Layer* l : g.consumer_layers) {
    const Tensor w = l->weight;
    const int64_t rows = w.size(0), cols = w.size(1);
    const float* p = w.raw_data<float>();
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) m[static_cast<size_t>(j)] = std::max(m[static_cast<size_t>(j)], std::fabs(p[i * cols + j]));
    }
  }
  return m;
}

// s_j = max|X_j|^alpha / max|W_j|^(1 - alpha); 1 for a channel whose activations or weights are all
// zero (no range to migrate, and a factor from 0 could blow the other side up).
std::vector<float> factors_for(const std::vector<float>& ax, const std::vector<float>& aw, double alpha) {
  std::vector<float> s(ax.size(), 1.f);
  for (size_t j = 0; j < ax.size(); ++j) {
    if (ax[j] > 0.f && aw[j] > 0.f) {
      s[j] = static_cast<float>(std::pow(static_cast<double>(ax[j]), alpha) /
                                std::pow(static_cast<double>(aw[j]), 1.0 - alpha));
    }
  }
  return s;
}

// Squared error of the simulated int8 product (u8 per-tensor min-max X / s, s8 per-row symmetric
// W * s) against the fp32 product, over the kept rows and every consumer.
double simulated_error(const Group& g, const std::vector<float>& s) {
  const int64_t n = g.n_rows, c = static_cast<int64_t>(s.size());
  std::vector<float> xs(static_cast<size_t>(n * c)), xq(static_cast<size_t>(n * c));
  float lo = 0.f, hi = 0.f;
  for (int64_t i = 0; i < n * c; ++i) {
    xs[i] = g.rows[i] / s[static_cast<size_t>(i % c)];
    lo = std::min(lo, xs[i]);
    hi = std::max(hi, xs[i]);
  }
  const double scale = std::max((static_cast<double>(hi) - lo) / 255.0, 1e-12);
  const double zp = std::min(255.0, std::max(0.0, std::nearbyint(-lo / scale)));
  for (int64_t i = 0; i < n * c; ++i) {
    const double q = std::min(255.0, std::max(0.0, std::nearbyint(xs[i] / scale) + zp));
    xq[i] = static_cast<float>((q - zp) * scale);
  }
  double err = 0.0;
  std::vector<float> wq(static_cast<size_t>(c));
  for (const Layer* l : g.consumer_layers) {
    const float* w = l->weight.raw_data<float>();
    const int64_t rows = l->weight.size(0);
    for (int64_t o = 0; o < rows; ++o) {
      float m = 0.f;
      for (int64_t j = 0; j < c; ++j) m = std::max(m, std::fabs(w[o * c + j] * s[static_cast<size_t>(j)]));
      const double ws = m > 0.f ? m / 127.0 : 1.0;
      for (int64_t j = 0; j < c; ++j) {
        wq[j] = static_cast<float>(std::min(127.0, std::max(-128.0, std::nearbyint(w[o * c + j] * s[j] / ws))) * ws);
      }
      for (int64_t r = 0; r < n; ++r) {
        double ref = 0.0, q = 0.0;
        for (int64_t j = 0; j < c; ++j) {
          ref += static_cast<double>(g.rows[r * c + j]) * w[o * c + j];
          q += static_cast<double>(xq[r * c + j]) * wq[j];
        }
        err += (q - ref) * (q - ref);
      }
    }
  }
  return err;
}

void fold(const Group& g, const std::vector<float>& s) {
  const int64_t c = static_cast<int64_t>(s.size());
  Tensor w = g.weight, b = g.bias;
  float* pw = w.raw_mutable_data<float>();
  if (g.linear) {  // rows j of the producer: its output channel j is divided by s_j
    const int64_t k = w.size(1);
    for (int64_t j = 0; j < c; ++j)
      for (int64_t i = 0; i < k; ++i) pw[j * k + i] /= s[static_cast<size_t>(j)];
  } else {
    for (int64_t j = 0; j < c; ++j) pw[j] /= s[static_cast<size_t>(j)];
  }
  if (b.defined()) {
    float* pb = b.raw_mutable_data<float>();
    for (int64_t j = 0; j < c; ++j) pb[j] /= s[static_cast<size_t>(j)];
  }
  for (const Layer* l : g.consumer_layers) {
    Tensor cw = l->weight;
    float* p = cw.raw_mutable_data<float>();
    const int64_t rows = cw.size(0);
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t j = 0; j < c; ++j) p[o * c + j] *= s[static_cast<size_t>(j)];
  }
}

}  // namespace

std::string SmoothQuantReport::to_string() const {
  std::string s = absl::StrFormat("SmoothQuant: %d group(s) smoothed, %d linear(s) skipped\n", groups.size(),
                                  skipped.size());
  for (const SmoothedGroup& g : groups) {
    absl::StrAppend(&s, "  ", g.producer, " (", g.producer_kind, ") -> ", absl::StrJoin(g.consumers, ", "),
                    absl::StrFormat(": alpha %.2f", g.alpha));
    if (g.error_before > 0.0) {
      absl::StrAppend(&s, absl::StrFormat(", simulated int8 error %.4g -> %.4g", g.error_before, g.error_after));
    }
    absl::StrAppend(&s, "\n");
  }
  for (const SkippedLinear& k : skipped) absl::StrAppend(&s, "  skipped ", k.linear, ": ", k.reason, "\n");
  return s;
}

SmoothQuantReport smooth_quant(nn::Module& model, const std::vector<std::vector<Tensor>>& calibration,
                               const SmoothQuantOptions& options) {
  DBRQ_ENSURE(options.alpha >= 0.0 && options.alpha <= 1.0, ValueError, "smooth_quant: alpha must be in [0, 1], got ",
              options.alpha);
  if (options.search_alpha) {
    DBRQ_ENSURE(!options.alpha_grid.empty(), ValueError, "smooth_quant: search_alpha needs a non-empty alpha_grid");
    for (double a : options.alpha_grid) {
      DBRQ_ENSURE(a >= 0.0 && a <= 1.0, ValueError, "smooth_quant: alpha_grid values must be in [0, 1], got ", a);
    }
    DBRQ_ENSURE(options.search_rows >= 1, ValueError, "smooth_quant: search_rows must be >= 1, got ",
                options.search_rows);
  }
  DBRQ_ENSURE(!calibration.empty(), ValueError,
              "smooth_quant: no calibration data (the factors come from activation ranges; pass at least one input)");
  DBRQ_ENSURE(!is_prepared(model), UsageError,
              "smooth_quant: the model is already prepared; smooth the fp32 model before prepare()");

  // A weight or bias another module also registers (tied weights, e.g. an LM head and its
  // embedding) keeps its values.
  const tracer::Registrations registered = tracer::registrations(model);

  // Linear and LayerNorm layers by weight address; only f32 contiguous parameters can be folded.
  std::unordered_map<const void*, Layer> layers;
  std::vector<std::string> linear_order;
  std::map<std::string, std::string> unfoldable;  // linear fqn -> reason its weight cannot change
  std::set<const nn::Module*> seen;
  for (const auto& [fqn, m] : model.named_modules()) {
    const bool linear = m->type_name() == "Linear", ln = m->type_name() == "LayerNorm";
    if (!linear && !ln) continue;
    if (!seen.insert(m).second) continue;  // a shared layer registered under a second name
    Layer l{fqn, linear, Tensor(), Tensor(), ""};
    for (const auto& [name, t] : m->named_parameters(false)) {
      if (name == "weight") l.weight = t;
      if (name == "bias") l.bias = t;
    }
    for (const std::string& why : {tracer::tied(registered, l.weight, "weight"), tracer::tied(registered, l.bias, "bias")}) {
      if (!why.empty() && l.frozen.empty()) l.frozen = why;
    }
    if (linear) linear_order.push_back(fqn);
    if (linear && !l.frozen.empty()) unfoldable[fqn] = l.frozen;
    if (!l.weight.defined()) continue;  // a LayerNorm without affine parameters
    if (!f32_contiguous(l.weight) || (l.bias.defined() && !f32_contiguous(l.bias)) ||
        (linear && l.weight.dim() != 2)) {
      if (linear) unfoldable[fqn] = "its parameters are not contiguous f32";
      continue;
    }
    layers.emplace(l.weight.data_ptr(), std::move(l));
  }

  SmoothInterceptor probe(layers, options.search_alpha ? options.search_rows : 0);
  for (const std::vector<Tensor>& in : calibration) {
    std::vector<Tensor> out;
    {
      InterceptorScope scope(&probe);
      out = model.forward_tensors(in);
    }
    probe.end_call(out);
  }

  // Why a layer's parameters must keep their values ("" if they may change).
  std::map<std::string, std::string> frozen;
  for (const auto& [ptr, l] : layers) {
    if (!l.frozen.empty()) frozen[l.fqn] = l.frozen;
  }
  for (const auto& [fqn, why] : probe.foreign_reads()) frozen.emplace(fqn, why);

  SmoothQuantReport report;
  std::map<std::string, bool> smoothed;
  for (Group& g : probe.groups()) {
    if (g.consumer_layers.empty()) continue;  // read by no linear: nothing to smooth
    if (g.linear && !options.fold_into_linears && g.bad.empty()) {
      g.bad = "its producer is a Linear (SmoothQuantOptions::fold_into_linears is off)";
    }
    if (g.bad.empty() && frozen.count(g.producer) != 0) g.bad = frozen.at(g.producer);
    for (const Layer* l : g.consumer_layers) {
      if (!g.bad.empty()) break;
      if (frozen.count(l->fqn) != 0) {
        g.bad = absl::StrCat(l->fqn, " cannot change: ", frozen.at(l->fqn));
      } else if (l->weight.size(1) != static_cast<int64_t>(g.absmax.size())) {
        g.bad = absl::StrCat("its channel count differs from ", l->fqn, "'s input features");
      } else if (probe.sources().at(l->fqn).size() > 1) {
        g.bad = absl::StrCat(l->fqn, " also reads other inputs");
      }
    }
    if (!g.bad.empty()) continue;
    const std::vector<float> aw = weight_absmax(g);
    SmoothedGroup r;
    r.producer = g.producer;
    r.producer_kind = g.linear ? "linear" : "layer_norm";
    r.consumers = g.consumers;
    r.alpha = options.alpha;
    r.act_absmax = g.absmax;
    r.weight_absmax = aw;
    if (options.search_alpha && g.n_rows > 0) {
      r.error_before = simulated_error(g, std::vector<float>(g.absmax.size(), 1.f));
      double best = std::numeric_limits<double>::infinity();
      for (double a : options.alpha_grid) {
        const double e = simulated_error(g, factors_for(g.absmax, aw, a));
        if (e < best) {
          best = e;
          r.alpha = a;
        }
      }
      r.error_after = best;
    }
    r.factors = factors_for(g.absmax, aw, r.alpha);
    report.groups.push_back(std::move(r));
    for (const std::string& c : g.consumers) smoothed[c] = true;
  }
  // Factors come from the original parameters; folding afterwards keeps each group's transform
  // exact even when a linear both produces one group and consumes another.
  for (const SmoothedGroup& r : report.groups) {
    for (const Group& g : probe.groups()) {
      if (g.producer == r.producer) fold(g, r.factors);
    }
  }

  std::map<std::string, const Group*> by_producer;
  for (const Group& g : probe.groups()) by_producer[g.producer] = &g;
  for (const std::string& fqn : linear_order) {
    if (smoothed.count(fqn)) continue;
    std::string reason;
    auto u = unfoldable.find(fqn);
    auto in = probe.sources().find(fqn);
    if (u != unfoldable.end()) {
      reason = u->second;
    } else if (frozen.count(fqn) != 0) {
      reason = frozen.at(fqn);
    } else if (in == probe.sources().end()) {
      reason = "not called during calibration";
    } else if (in->second.count("") != 0) {
      reason = "its input is not the output of a LayerNorm or Linear layer (no producer to fold the factors into)";
    } else {
      const std::string& p = *in->second.begin();
      const Group* g = by_producer[p];
      reason = absl::StrCat("its input comes from ", p, ", which cannot be rescaled: ",
                            g != nullptr && !g->bad.empty() ? g->bad : "unknown");
    }
    report.skipped.push_back({fqn, reason});
  }
  return report;
}

}  // namespace dbrq
