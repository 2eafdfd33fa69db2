#include "tracer/numerics.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <array>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "kernels/eager.h"
#include "quant_state/auto_quant_state.h"
#include "tracer/interceptor.h"
#include "tracer/quantize.h"

namespace dbrq {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> real_values(const Tensor& t) {
  if (t.is_quantized()) return kernels::dequantize(t).to_vector<double>();
  return t.to_vector<double>();
}

// Running sums for one compared tensor stream.
struct Accum {
  double signal = 0.0, noise = 0.0, max_abs = 0.0;
  int64_t n = 0;
  void add(const Tensor& ref, const Tensor& q) {
    if (!ref.defined() || !q.defined() || ref.sizes() != q.sizes()) return;
    const std::vector<double> a = real_values(ref), b = real_values(q);
    for (size_t i = 0; i < a.size(); ++i) {
      if (!std::isfinite(a[i]) || !std::isfinite(b[i])) continue;
      signal += a[i] * a[i];
      const double d = a[i] - b[i];
      noise += d * d;
      max_abs = std::max(max_abs, std::abs(d));
    }
    n += static_cast<int64_t>(a.size());
  }
  double sqnr() const {
    if (noise == 0.0) return kInf;
    if (signal == 0.0) return -kInf;
    return 10.0 * std::log10(signal / noise);
  }
};

using Key = std::pair<std::string, int>;  // module fqn, record index

// One call of a module with state, as one model ran it: its quantizeable ops (kind, layer or
// module fqn, output) in order, and its outputs.
struct ProbedCall {
  struct Op {
    OpKind kind;
    std::string fqn;
    Tensor out;
    const SeenOpInfo* record = nullptr;  // int8 side: null for an op of a path never calibrated
  };
  std::vector<Op> ops;
  std::vector<Tensor> outputs;
  std::array<uint64_t, 4> path{};  // int8 side
};
// Per module fqn, its calls in the order they returned.
using ProbedCalls = std::map<std::string, std::vector<ProbedCall>>;

// The fp32 model's calls (the ops the converted model runs as seen ops: a module with state calls
// them with a qconfig).
class FloatProbe : public Interceptor {
 public:
  FloatProbe(nn::Module& float_model, nn::Module& quantized_model) : q_(quantized_model) {
    for (auto& [fqn, m] : float_model.named_modules()) fqn_of_[m] = fqn;
  }

  Tensor on_op(const OpCall& call) override {
    Tensor out = call.run(call);
    // The owner is the nearest non-leaf frame; the op's layer, if any, is the top frame.
    Frame* owner = nullptr;
    Frame* top = stack_.empty() ? nullptr : &stack_.back();
    for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
      if (!it->leaf) {
        owner = &*it;
        break;
      }
    }
    if (owner == nullptr || owner->state == nullptr) return out;
    const LeafQuantInfo* leaf = (top != nullptr && top->leaf) ? top->leaf_info : nullptr;
    if (top != nullptr && top->leaf && leaf == nullptr) return out;
    // A functional op with call-site entries: its index among this call's calls of its kind, as
    // the quantized model's interceptor counts it.
    int order = -1;
    if (leaf == nullptr && owner->state->has_call_sites(call.kind)) {
      order = 0;
      bool found = false;
      for (auto& [k, n] : owner->op_counts) {
        if (k == call.kind) {
          order = n++;
          found = true;
        }
      }
      if (!found) owner->op_counts.emplace_back(call.kind, 1);
    }
    if (!owner->state->is_seen(call.kind, leaf, order)) return out;
    owner->call.ops.push_back({call.kind, leaf != nullptr ? top->fqn : owner->state->fqn(), out});
    return out;
  }

  void on_module_enter(nn::Module& m, absl::Span<Tensor* const>) override {
    Frame f;
    f.leaf = m.is_leaf();
    auto it = fqn_of_.find(&m);
    if (it != fqn_of_.end()) {
      f.fqn = it->second;
      nn::Module* qm = q_.find_module(it->second);
      if (qm != nullptr) {
        f.state = quant_state_of(*qm);
        f.leaf_info = dynamic_cast<const LeafQuantInfo*>(qm->extension());
      }
    }
    stack_.push_back(std::move(f));
  }
  void on_module_exit(nn::Module&, absl::Span<Tensor* const> outs) override {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    if (f.leaf || f.state == nullptr) return;
    for (Tensor* t : outs) f.call.outputs.push_back(*t);
    calls[f.state->fqn()].push_back(std::move(f.call));
  }
  void on_module_unwind(nn::Module&) noexcept override {
    if (!stack_.empty()) stack_.pop_back();
  }

  ProbedCalls calls;

 private:
  struct Frame {
    bool leaf = false;
    std::string fqn;
    const AutoQuantizationState* state = nullptr;
    const LeafQuantInfo* leaf_info = nullptr;
    ProbedCall call;
    std::vector<std::pair<OpKind, int>> op_counts;  // functional calls per kind (call-site entries)
  };
  nn::Module& q_;
  std::unordered_map<const nn::Module*, std::string> fqn_of_;
  std::vector<Frame> stack_;
};

// The op whose output a seen op's comparison uses: the end of its fused chain, if any. A chain
// continued by an op of another module (SeenOpInfo::absorbs) ends there.
bool reports_output(const SeenOpInfo& op) {
  if (op.role == QuantRole::kNone || op.absorbs >= 0) return false;
  if (!op.fusion.fused()) return true;
  return op.fusion.position == static_cast<int>(op.fusion.pattern.size()) - 1;
}

std::string fmt_db(double v) {
  if (std::isnan(v)) return "n/a";
  if (v == kInf) return "inf";
  if (v == -kInf) return "-inf";
  return absl::StrFormat("%.2f", v);
}

std::string quote_csv(const std::string& s) { return "\"" + absl::StrReplaceAll(s, {{"\"", "\"\""}}) + "\""; }

std::string html_escape(const std::string& s) {
  return absl::StrReplaceAll(s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&quot;"}});
}

}  // namespace

double sqnr_db(const Tensor& reference, const Tensor& actual) {
  DBRQ_ENSURE(reference.sizes() == actual.sizes(), ShapeError, "sqnr_db: sizes ", reference.shape_string(), " and ",
              actual.shape_string(), " differ");
  Accum a;
  a.add(reference, actual);
  return a.sqnr();
}

NumericReport compare_numerics(nn::Module& float_model, nn::Module& quantized_model,
                               const std::vector<std::vector<Tensor>>& inputs) {
  DBRQ_ENSURE(is_converted(quantized_model), UsageError,
              "compare_numerics: the quantized model must be converted (call dbrq::convert first)");
  DBRQ_ENSURE(!is_prepared(float_model), UsageError,
              "compare_numerics: the float model must be a plain fp32 model (not prepared)");
  DBRQ_ENSURE(&float_model != &quantized_model, UsageError, "compare_numerics: pass two different model objects");
  DBRQ_ENSURE(!inputs.empty(), ValueError, "compare_numerics: no inputs");
  tracer::QuantInterceptor* interceptor = &tracer::QuantInterceptor::of(quantized_model, "compare_numerics");
  ModelQuantState& state = interceptor->model();
  // The paths each module had before the comparison (its calls add to them).
  std::map<std::string, std::vector<PathInfo>> paths_before;
  std::map<std::string, const AutoQuantizationState*> state_of;
  for (const AutoQuantizationState* s : state.states()) {
    paths_before[s->fqn()] = s->paths();
    state_of[s->fqn()] = s;
  }
  using PathKey = std::pair<std::string, std::array<uint64_t, 4>>;
  std::map<Key, Accum> acc;
  std::map<Key, int64_t> runs;
  std::map<Key, const SeenOpInfo*> info;
  std::map<PathKey, Accum> path_acc;
  std::map<PathKey, int64_t> path_calls;
  Accum output;
  NumericReport r;
  for (const auto& in : inputs) {
    FloatProbe probe(float_model, quantized_model);
    std::vector<Tensor> ref;
    {
      InterceptorScope scope(&probe);
      ref = float_model.forward_tensors(in);
    }
    // The int8 model's calls of this thread, collected like the fp32 ones.
    ProbedCalls qcalls;
    std::vector<std::pair<const AutoQuantizationState*, ProbedCall>> open;
    tracer::QuantInterceptor::Probes probes;
    probes.op = [&](const AutoQuantizationState& s, const SeenOpInfo* op, OpKind kind, const std::string& fqn,
                    const Tensor& out) {
      if (op == nullptr) ++r.uncalibrated_ops;
      for (auto it = open.rbegin(); it != open.rend(); ++it) {
        if (it->first == &s) {
          it->second.ops.push_back({kind, fqn, out, op});
          return;
        }
      }
    };
    probes.module = [&](const AutoQuantizationState& s, bool exit, const std::array<uint64_t, 4>& path,
                        absl::Span<Tensor* const> outs) {
      if (!exit) {
        open.emplace_back(&s, ProbedCall{});
        return;
      }
      if (open.empty() || open.back().first != &s) return;  // cannot happen: calls nest
      ProbedCall c = std::move(open.back().second);
      open.pop_back();
      c.path = path;
      for (Tensor* t : outs) c.outputs.push_back(*t);
      qcalls[s.fqn()].push_back(std::move(c));
    };
    DBRQ_ENSURE(interceptor->set_probes(&probes), UsageError,
                "compare_numerics: another compare_numerics is running on this model");
    std::vector<Tensor> q;
    try {
      q = quantized_model.forward_tensors(in);
    } catch (...) {
      interceptor->clear_probes();
      throw;
    }
    interceptor->clear_probes();
    for (size_t i = 0; i < ref.size() && i < q.size(); ++i) output.add(ref[i], q[i]);

    // Pair the calls: the j-th call of a module in one model with its j-th in the other; within a
    // call, op k with op k when both calls ran the same ops (kind and layer), else the int8 model
    // took another branch there.
    for (auto& [fqn, qs] : qcalls) {
      std::vector<ProbedCall>& fs = probe.calls[fqn];
      if (fs.size() != qs.size()) {
        r.diverged_calls += static_cast<int64_t>(qs.size());  // another number of calls: none pairs up
        continue;
      }
      for (size_t j = 0; j < qs.size(); ++j) {
        const ProbedCall& qc = qs[j];
        const ProbedCall& fc = fs[j];
        const PathKey pk{fqn, qc.path};
        ++path_calls[pk];
        Accum& pa = path_acc[pk];
        // An output that exists only inside its caller's fused kernel (fusion across modules)
        // holds the chain's result, not the module's: it has nothing to compare.
        for (size_t i = 0; i < qc.outputs.size() && i < fc.outputs.size(); ++i) {
          if (!tracer::QuantInterceptor::is_inner_fused(qc.outputs[i])) pa.add(fc.outputs[i], qc.outputs[i]);
        }
        bool same = qc.ops.size() == fc.ops.size();
        for (size_t k = 0; same && k < qc.ops.size(); ++k) {
          same = qc.ops[k].kind == fc.ops[k].kind && qc.ops[k].fqn == fc.ops[k].fqn;
        }
        if (!same) {
          ++r.diverged_calls;
          continue;
        }
        for (size_t k = 0; k < qc.ops.size(); ++k) {
          const SeenOpInfo* op = qc.ops[k].record;
          if (op == nullptr || !reports_output(*op)) continue;
          const Key key{fqn, op->index};
          acc[key].add(fc.ops[k].out, qc.ops[k].out);
          ++runs[key];
          info[key] = op;
        }
      }
    }
  }

  r.batches = static_cast<int>(inputs.size());
  r.output_sqnr_db = output.sqnr();
  r.output_max_abs_error = output.max_abs;
  for (auto& [key, a] : acc) {
    const SeenOpInfo& op = *info[key];
    const AutoQuantizationState* s = state_of.at(key.first);
    const SeenOpInfo& base = op.fusion.fused() ? s->seen_ops()[op.fusion.base] : op;
    OpNumerics o;
    o.module_fqn = key.first;
    o.index = base.index;
    o.op = base.display_kind();
    o.fqn = base.fqn;
    const ModelQuantState::TensorRecord* rec = state.tensor(op.outputs[0].id);
    if (rec != nullptr && rec->slot >= 0 && state.slot(rec->slot).qparams) {
      o.qparams = state.slot(rec->slot).qparams->to_string();
    } else if (op.qconfig && op.qconfig->is_dynamic()) {
      o.qparams = "dynamic (per call), f32 output";
    } else if (op.outputs[0].inf_dtype == DType::kF32) {
      o.qparams = "f32 output";  // PrepareOptions::float_outputs_for_float_readers
    } else {
      o.qparams = "derived from input";
    }
    o.sqnr_db = a.sqnr();
    o.max_abs_error = a.max_abs;
    o.elements = a.n;
    o.runs = runs[key];
    r.ops.push_back(o);
  }
  std::stable_sort(r.ops.begin(), r.ops.end(), [](const OpNumerics& a, const OpNumerics& b) { return a.sqnr_db < b.sqnr_db; });

  for (auto& [key, a] : path_acc) {
    const std::vector<PathInfo>& before = paths_before[key.first];
    const AutoQuantizationState* s = state_of.at(key.first);
    PathNumerics p;
    p.module_fqn = key.first;
    for (size_t i = 0; i < before.size(); ++i) {
      if (before[i].mask == key.second) {
        p.path = static_cast<int>(i);
        p.calls_before = before[i].calls;
      }
    }
    // Its records: in the order of the path's first call, or (a new path) by index.
    std::vector<int> records;
    if (p.path >= 0) {
      records = before[static_cast<size_t>(p.path)].records;
    } else {
      for (size_t rec = 0; rec < s->seen_ops().size() && rec < 256; ++rec) {
        if (key.second[rec / 64] >> (rec % 64) & 1) records.push_back(static_cast<int>(rec));
      }
    }
    for (int rec : records) {
      const SeenOpInfo& op = s->seen_ops()[static_cast<size_t>(rec)];
      if (op.fusion.fused() && op.fusion.position > 0) continue;  // shown with its chain
      if (!p.ops.empty()) p.ops += " ";
      p.ops += op.display_kind();
    }
    p.calls = path_calls[key];
    p.sqnr_db = a.n > 0 ? a.sqnr() : std::numeric_limits<double>::quiet_NaN();
    p.max_abs_error = a.max_abs;
    r.paths.push_back(std::move(p));
  }
  // Modules with one path: their calls are the model's (or their parent's) numbers.
  std::map<std::string, int> per_module;
  for (const PathNumerics& p : r.paths) ++per_module[p.module_fqn];
  r.paths.erase(std::remove_if(r.paths.begin(), r.paths.end(),
                               [&](const PathNumerics& p) {
                                 return per_module[p.module_fqn] < 2 && paths_before[p.module_fqn].size() < 2;
                               }),
                r.paths.end());
  std::stable_sort(r.paths.begin(), r.paths.end(), [](const PathNumerics& a, const PathNumerics& b) {
    if (a.module_fqn != b.module_fqn) return a.module_fqn < b.module_fqn;
    return static_cast<unsigned>(a.path) < static_cast<unsigned>(b.path);  // -1 (new) last
  });
  return r;
}

std::string NumericReport::to_table() const {
  std::ostringstream os;
  os << absl::StrFormat("%-28s %4s  %-28s %10s %12s  %s\n", "module / op fqn", "idx", "op", "SQNR dB", "max |err|",
                        "output qparams");
  for (const OpNumerics& o : ops) {
    os << absl::StrFormat("%-28s %4d  %-28s %10s %12.5g  %s\n", o.fqn.empty() ? "<model>" : o.fqn, o.index, o.op,
                          fmt_db(o.sqnr_db),
                          o.max_abs_error, o.qparams);
  }
  os << absl::StrFormat("model output: SQNR %s dB, max |err| %.5g over %d batch(es)\n", fmt_db(output_sqnr_db),
                        output_max_abs_error, batches);
  if (!paths.empty()) {
    os << absl::StrFormat("\n%-28s %4s %6s %8s %10s %12s  %s\n", "paths of module", "path", "calls", "before",
                          "SQNR dB", "max |err|", "ops");
    for (const PathNumerics& p : paths) {
      os << absl::StrFormat("%-28s %4s %6d %8d %10s %12.5g  %s\n", p.module_fqn.empty() ? "<model>" : p.module_fqn,
                            p.path >= 0 ? std::to_string(p.path) : "new", p.calls, p.calls_before, fmt_db(p.sqnr_db),
                            p.max_abs_error, p.ops);
    }
  }
  if (diverged_calls > 0) {
    os << diverged_calls << " module call(s) took another branch than the fp32 model (their ops not compared)\n";
  }
  if (uncalibrated_ops > 0) os << uncalibrated_ops << " op run(s) on paths never calibrated (fp32)\n";
  return os.str();
}

std::string NumericReport::paths_to_csv() const {
  std::ostringstream os;
  os << "module_fqn,path,calls,calls_before,sqnr_db,max_abs_error,ops\n";
  for (const PathNumerics& p : paths) {
    os << quote_csv(p.module_fqn) << "," << p.path << "," << p.calls << "," << p.calls_before << ","
       << fmt_db(p.sqnr_db) << "," << absl::StrFormat("%.9g", p.max_abs_error) << "," << quote_csv(p.ops) << "\n";
  }
  return os.str();
}

std::string NumericReport::to_csv() const {
  std::ostringstream os;
  os << "module_fqn,index,op,fqn,sqnr_db,max_abs_error,elements,qparams\n";
  for (const OpNumerics& o : ops) {
    os << quote_csv(o.module_fqn) << "," << o.index << "," << quote_csv(o.op) << "," << quote_csv(o.fqn) << ","
       << fmt_db(o.sqnr_db) << "," << absl::StrFormat("%.9g", o.max_abs_error) << "," << o.elements << ","
       << quote_csv(o.qparams) << "\n";
  }
  return os.str();
}

std::string NumericReport::to_html(const std::string& title) const {
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" << html_escape(title)
     << " - dbrq numeric report</title>\n<style>body{font-family:sans-serif;margin:24px;color:#222}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
        "th{background:#eee}.bad{color:#b00}.warn{color:#b60}.ok{color:#070}</style></head><body>\n";
  os << "<h1>" << html_escape(title) << ": int8 vs fp32</h1>\n";
  os << "<p>Model output SQNR: <b>" << fmt_db(output_sqnr_db) << " dB</b>, max |err| "
     << absl::StrFormat("%.5g", output_max_abs_error) << ", over " << batches
     << " batch(es). Ops sorted worst first; SQNR = 10 log10(&Sigma; ref&sup2; / &Sigma; (ref &minus; int8)&sup2;).</p>\n";
  // Inline SVG bar chart: one bar per op, length proportional to SQNR (capped at 60 dB).
  const int row = 16, label_w = 260, chart_w = 420;
  const int h = static_cast<int>(ops.size()) * row + 30;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << label_w + chart_w + 60 << "\" height=\"" << h
     << "\" role=\"img\" aria-label=\"SQNR per op\">\n";
  for (int db = 0; db <= 60; db += 10) {
    const int x = label_w + db * chart_w / 60;
    os << "<line x1=\"" << x << "\" y1=\"0\" x2=\"" << x << "\" y2=\"" << h - 20 << "\" stroke=\"#ddd\"/>"
       << "<text x=\"" << x << "\" y=\"" << h - 6 << "\" font-size=\"10\" text-anchor=\"middle\">" << db
       << " dB</text>\n";
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpNumerics& o = ops[i];
    const double v = std::isfinite(o.sqnr_db) ? std::min(std::max(o.sqnr_db, 0.0), 60.0) : (o.sqnr_db > 0 ? 60.0 : 0.0);
    const int y = static_cast<int>(i) * row;
    const char* color = o.sqnr_db < 20 ? "#d33" : (o.sqnr_db < 30 ? "#e90" : "#3a3");
    os << "<text x=\"" << label_w - 6 << "\" y=\"" << y + 12 << "\" font-size=\"11\" text-anchor=\"end\">"
       << html_escape((o.fqn.empty() ? "<model>" : o.fqn) + " " + o.op) << "</text><rect x=\"" << label_w << "\" y=\"" << y + 2 << "\" width=\""
       << static_cast<int>(v * chart_w / 60) << "\" height=\"" << row - 4 << "\" fill=\"" << color << "\"><title>"
       << html_escape(o.fqn) << ": " << fmt_db(o.sqnr_db) << " dB</title></rect>\n";
  }
  os << "</svg>\n<table><tr><th>#</th><th>op fqn</th><th>module</th><th>index</th><th>op</th><th>SQNR dB</th>"
        "<th>max |err|</th><th>output qparams</th></tr>\n";
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpNumerics& o = ops[i];
    const char* cls = o.sqnr_db < 20 ? "bad" : (o.sqnr_db < 30 ? "warn" : "ok");
    os << "<tr><td>" << i + 1 << "</td><td>" << html_escape(o.fqn) << "</td><td>" << html_escape(o.module_fqn)
       << "</td><td>" << o.index << "</td><td>" << html_escape(o.op) << "</td><td class=\"" << cls << "\">"
       << fmt_db(o.sqnr_db) << "</td><td>" << absl::StrFormat("%.5g", o.max_abs_error) << "</td><td>"
       << html_escape(o.qparams) << "</td></tr>\n";
  }
  os << "</table>\n";
  if (!paths.empty()) {
    os << "<h2>Control-flow paths</h2>\n<p>Modules with several paths: each path the compared calls took, "
          "the SQNR of the module's outputs on those calls, and how often it was taken before.</p>\n"
          "<table><tr><th>module</th><th>path</th><th>calls</th><th>calls before</th><th>SQNR dB</th>"
          "<th>max |err|</th><th>ops</th></tr>\n";
    for (const PathNumerics& p : paths) {
      const char* cls = p.sqnr_db < 20 ? "bad" : (p.sqnr_db < 30 ? "warn" : "ok");
      os << "<tr><td>" << html_escape(p.module_fqn.empty() ? "<model>" : p.module_fqn) << "</td><td>"
         << (p.path >= 0 ? std::to_string(p.path) : "new") << "</td><td>" << p.calls << "</td><td>" << p.calls_before
         << "</td><td class=\"" << cls << "\">" << fmt_db(p.sqnr_db) << "</td><td>"
         << absl::StrFormat("%.5g", p.max_abs_error) << "</td><td>" << html_escape(p.ops) << "</td></tr>\n";
    }
    os << "</table>\n";
  }
  if (diverged_calls > 0 || uncalibrated_ops > 0) {
    os << "<p>" << diverged_calls << " module call(s) took another branch than the fp32 model; " << uncalibrated_ops
       << " op run(s) on paths never calibrated (fp32).</p>\n";
  }
  os << "</body></html>\n";
  return os.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  DBRQ_ENSURE(f.good(), IOError, "cannot open \"", path, "\" for writing");
  f << text;
  f.close();
  DBRQ_ENSURE(!f.fail(), IOError, "failed writing \"", path, "\"");
}

}  // namespace dbrq
