#include "tracer/flow_graph.h"

#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dbrq::tracer {
namespace {

class FlowRecorder final : public Interceptor {
 public:
  FlowRecorder(FlowGraph& g, const std::function<void(const FlowGraph&, int)>& on_op) : g_(g), on_op_(on_op) {}

  Tensor on_op(const OpCall& call) override {
    FlowNode n;
    n.kind = call.kind;
    n.module = stack_.empty() ? nullptr : stack_.back();
    for (auto it = stack_.rbegin(); it != stack_.rend() && n.owner == nullptr; ++it) {
      if (!(*it)->is_leaf()) n.owner = *it;
    }
    for (size_t i = 0; i < call.num_inputs(); ++i) {
      const Tensor& t = call.input(i);
      n.inputs.push_back(t);
      n.producers.push_back(producer_of(t));
    }
    if (call.kind == OpKind::kConv2d && call.params != nullptr) n.conv = call.p<Conv2dParams>();
    if (call.kind == OpKind::kBatchNorm && call.params != nullptr) n.eps = call.p<NormParams>().eps;
    if (call.kind == OpKind::kHardtanh && call.params != nullptr) n.act = call.p<ActivationParams>();
    Tensor out;
    {
      // Nested dispatches (an op implemented through others) are not separate nodes.
      InterceptorScope plain(nullptr);
      out = call.run(call);
    }
    const int id = static_cast<int>(g_.nodes.size());
    for (int p : n.producers)
      if (p >= 0) g_.nodes[static_cast<size_t>(p)].consumers.push_back(id);
    for (const Tensor& t : n.inputs) {
      if (!t.defined()) continue;
      auto it = g_.param_uses.find(t.storage().get());
      if (it != g_.param_uses.end()) ++it->second;
    }
    n.output = out;
    g_.nodes.push_back(std::move(n));
    if (out.defined()) producer_[out.storage().get()] = id;
    if (on_op_) on_op_(g_, id);
    return out;
  }

  void on_module_enter(nn::Module& module, absl::Span<Tensor* const> inputs) override {
    // A tensor passed into the outermost call is the model's input: forget any stale producer.
    stack_.push_back(&module);
  }
  void on_module_exit(nn::Module& module, absl::Span<Tensor* const> outputs) override {
    stack_.pop_back();
    if (!stack_.empty()) return;
    for (Tensor* t : outputs) {
      if (t == nullptr || !t->defined()) continue;
      const int p = producer_of(*t);
      if (p >= 0) g_.nodes[static_cast<size_t>(p)].model_output = true;
    }
  }
  void on_module_unwind(nn::Module& module) noexcept override {
    if (!stack_.empty()) stack_.pop_back();
  }

 private:
  int producer_of(const Tensor& t) const {
    if (!t.defined()) return -1;
    auto it = producer_.find(t.storage().get());
    return it == producer_.end() ? -1 : it->second;
  }

  FlowGraph& g_;
  const std::function<void(const FlowGraph&, int)>& on_op_;
  std::vector<nn::Module*> stack_;
  // Last writer of each storage (an in-place op becomes the producer). Every node keeps its output
  // alive, so a storage address is never reused during the run.
  std::unordered_map<const Storage*, int> producer_;
};

}  // namespace

bool FlowGraph::is_param(const Tensor& t) const {
  if (!t.defined()) return false;
  auto it = params.find(t.storage().get());
  if (it == params.end()) return false;
  const Tensor& p = it->second.second;
  return t.storage_offset() == p.storage_offset() && t.sizes() == p.sizes() && t.dtype() == DType::kF32 &&
         t.is_contiguous();
}

std::string FlowGraph::param_name(const Tensor& t) const {
  if (!t.defined()) return "";
  auto it = params.find(t.storage().get());
  return it == params.end() ? "" : it->second.first;
}

int FlowGraph::sole_consumer(int i) const {
  const FlowNode& n = nodes.at(static_cast<size_t>(i));
  if (n.model_output || n.consumers.size() != 1) return -1;
  return n.consumers[0];
}

FlowGraph trace_flow(nn::Module& model, const std::function<void()>& run,
                     const std::function<void(const FlowGraph&, int)>& on_op) {
  FlowGraph g;
  for (const auto& [name, t] : model.named_parameters()) {
    if (!t.defined()) continue;
    g.params[t.storage().get()] = {name, t};
    g.param_uses[t.storage().get()] = 0;
  }
  for (const auto& [name, t] : model.named_buffers()) {
    if (!t.defined()) continue;
    g.params[t.storage().get()] = {name, t};
    g.param_uses[t.storage().get()] = 0;
  }
  FlowRecorder recorder(g, on_op);
  InterceptorScope scope(&recorder);
  run();
  return g;
}

std::string node_name(nn::Module& model, const FlowGraph& g, int i) {
  const FlowNode& n = g.nodes.at(static_cast<size_t>(i));
  std::string where = "<model>";
  for (const auto& [fqn, m] : model.named_modules()) {
    if (m == n.module) {
      where = fqn.empty() ? "<model>" : fqn;
      break;
    }
  }
  if (n.module != nullptr && n.module->is_leaf()) return where;
  return where + ":" + op_name(n.kind) + "#" + std::to_string(i);
}

Registrations registrations(nn::Module& model) {
  Registrations r;
  std::set<std::pair<const nn::Module*, std::string>> seen;  // a shared module under two names
  for (const auto& [fqn, m] : model.named_modules()) {
    for (const bool params : {true, false}) {
      for (const auto& [name, t] : params ? m->named_parameters(false) : m->named_buffers(false)) {
        if (t.defined() && seen.insert({m, name}).second)
          r[t.storage().get()].push_back(fqn.empty() ? name : fqn + "." + name);
      }
    }
  }
  return r;
}

std::string tied(const Registrations& reg, const Tensor& t, const char* what) {
  if (!t.defined()) return "";
  auto it = reg.find(t.storage().get());
  if (it == reg.end() || it->second.size() < 2) return "";
  return absl::StrCat("its ", what, " is tied to another registered tensor (", absl::StrJoin(it->second, ", "), ")");
}

}  // namespace dbrq::tracer
