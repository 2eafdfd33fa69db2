// The data flow of one fp32 run of an (unprepared) model: which op produced each tensor an op
// reads, and who else reads it. Equalization and bias correction find their conv -> conv pairs and
// conv -> batch_norm chains here, from the data flow rather than from module order.
//
//   dbrq::tracer::FlowGraph g = dbrq::tracer::trace_flow(model, [&] { model.forward_tensors({x}); });
//   for (const FlowNode& n : g.nodes) if (n.kind == OpKind::kConv2d) ...
//
// Internal to the tracer (not part of dbrq.h).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/op_params.h"
#include "core/tensor.h"
#include "runtime/dispatcher.h"
#include "runtime/module.h"
#include "runtime/ops.h"

namespace dbrq::tracer {

struct FlowNode {
  OpKind kind = OpKind::kNumOpKinds;
  nn::Module* module = nullptr;  // innermost module being called (the layer, for a layer call)
  // Innermost non-leaf module being called: the one whose quantization state records this op (ops
  // of two owners are never fused, e.g. a conv in a child Sequential and a batch norm after it).
  nn::Module* owner = nullptr;
  std::vector<Tensor> inputs;    // every tensor argument in the op's order (absent ones undefined)
  std::vector<int> producers;    // per input: the node that produced it, -1 for anything else
  Tensor output;
  std::vector<int> consumers;    // nodes reading `output` (a node reading it twice appears twice)
  bool model_output = false;     // returned by the outermost module call
  Conv2dParams conv;             // kConv2d
  ActivationParams act;          // activations with parameters (hardtanh's bounds)
  double eps = 0.0;              // kBatchNorm
};

struct FlowGraph {
  std::vector<FlowNode> nodes;
  // Registered parameters and buffers of the model by storage, with their fqns.
  std::map<const Storage*, std::pair<std::string, Tensor>> params;
  // How many nodes read each parameter storage (a weight shared by two convs reads 2).
  std::map<const Storage*, int> param_uses;

  // Whether `t` is (the whole of) a registered parameter or buffer.
  bool is_param(const Tensor& t) const;
  std::string param_name(const Tensor& t) const;
  // The single consumer of node `i`'s output, or -1 (none, several, or a model output).
  int sole_consumer(int i) const;
};

// Runs `run` (which calls `model`) with a recording interceptor on this thread: every op runs its
// eager fp32 kernel as usual. `on_op` (optional) sees each node right after it ran.
FlowGraph trace_flow(nn::Module& model, const std::function<void()>& run,
                     const std::function<void(const FlowGraph&, int node)>& on_op = nullptr);

// Human-readable name of the layer or module that ran node `i` ("features.1.conv.0.0").
std::string node_name(nn::Module& model, const FlowGraph& g, int i);

// The names each parameter / buffer storage is registered under, one per (module, name): a storage
// registered twice is tied (an LM head and its embedding, two convs sharing a kernel), and the
// other module may read it on a path an example run does not take. One module registered under
// two names (a shared layer) counts once.
using Registrations = std::map<const Storage*, std::vector<std::string>>;
Registrations registrations(nn::Module& model);

// Why `t` (which a transform would rewrite in place) must keep its values: "its <what> is tied to
// another registered tensor (a.weight, b.weight)"; "" when it is registered once (or not at all).
std::string tied(const Registrations& reg, const Tensor& t, const char* what);

}  // namespace dbrq::tracer
