// Modules: the building blocks of eager models, shaped like PyTorch's C++ frontend.
//
//   struct Block : dbrq::nn::CallableModule<Block> {
//     Block() {
//       conv = register_module("conv", std::make_shared<dbrq::nn::Conv2d>(16, 16, 3, 1, 1));
//       relu = register_module("relu", std::make_shared<dbrq::nn::ReLU>());
//     }
//     dbrq::Tensor forward(const dbrq::Tensor& x) { return (*relu)((*conv)(x)) + x; }
//     std::shared_ptr<dbrq::nn::Conv2d> conv;
//     std::shared_ptr<dbrq::nn::ReLU> relu;
//   };
//
//   auto block = std::make_shared<Block>();
//   dbrq::Tensor y = (*block)(x);                 // call through operator(), never forward()
//   for (auto& [name, p] : block->named_parameters()) ...   // "conv.weight", "conv.bias"
//
// A module's call operator is the one place the quantization tracer hooks module calls: it sees
// the module, its tensor arguments and its tensor results. forward() may take and return anything:
// tensors, vectors and tuples of tensors, or non-tensor values (which the hooks ignore).
//
// Built-in layers (Conv2d, Linear, ReLU, ...) are leaves; user modules, Sequential, ModuleList and
// ModuleDict are not. Quantization attaches its per-module state to non-leaf modules.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include "runtime/dispatcher.h"
#include "runtime/tensor.h"

namespace dbrq {

// Parameter and buffer names with their tensors, in registration order.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

namespace nn {

// Opaque per-module data owned by a subsystem above the runtime (quantization state).
class ModuleExtension {
 public:
  virtual ~ModuleExtension() = default;
};

// What load_state_dict(strict=false) found.
struct LoadReport {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
  std::vector<std::string> mismatched_keys;  // "name: expected [..], got [..]"
  bool ok() const { return missing_keys.empty() && unexpected_keys.empty() && mismatched_keys.empty(); }
};

class Module {
 public:
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // "Conv2d", or the user's class name without namespaces.
  const std::string& type_name() const { return type_name_; }
  std::type_index type() const { return type_; }
  virtual bool is_leaf() const { return false; }

  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // Registers (or, for an existing name, replaces) a parameter / buffer and returns it.
  Tensor register_parameter(const std::string& name, Tensor tensor);
  Tensor register_buffer(const std::string& name, Tensor tensor);
  // Replaces a registered child (same name) by another module, e.g. for module swaps.
  void replace_module(const std::string& name, std::shared_ptr<Module> module);

  // Children in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  std::vector<std::shared_ptr<Module>> children() const;
  std::shared_ptr<Module> child(const std::string& name) const;  // null when absent
  // This module (name `prefix`) and every descendant, depth-first in registration order, with
  // dot-joined fully qualified names. Pointers stay valid while the tree lives.
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "",
                                                             bool include_self = true);
  // The module at a dot-joined path ("layer1.0.conv1"); null when absent. "" is this module.
  Module* find_module(const std::string& fqn);

  NamedTensors named_parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  // Own parameters / buffers only, as registered.
  const NamedTensors& parameters_map() const { return params_; }
  const NamedTensors& buffers_map() const { return buffers_; }
  // Parameters then buffers of each module, depth-first: the keys PyTorch's state_dict() uses.
  NamedTensors state_dict() const;
  // Copies each tensor into the registered parameter / buffer of the same name (converting its
  // dtype, e.g. f16 to f32). strict: missing, unexpected or mis-shaped names throw StateDictError /
  // ShapeError listing every offending name, and nothing is modified. Non-strict: matching
  // tensors are loaded and the rest reported.
  LoadReport load_state_dict(const NamedTensors& tensors, bool strict = true);
  LoadReport load_state_dict(const std::map<std::string, Tensor>& tensors, bool strict = true);

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // A single-tensor call through the hooked call operator; throws ValueError for modules whose
  // forward takes something else. Sequential and ModuleList iteration use it.
  virtual Tensor forward_unary(const Tensor& x);
  // A call with 1 to 4 tensor arguments through the hooked call operator, returning the tensors in
  // the result (in order; non-tensor parts are dropped). Throws ValueError when forward does not
  // take that many tensors. Generic drivers (prepare, the CLI) use it.
  virtual std::vector<Tensor> forward_tensors(const std::vector<Tensor>& inputs);

  // Layer configuration shown by pretty printing, e.g. "3, 64, kernel_size=(7, 7), stride=(2, 2)".
  virtual std::string extra_repr() const { return ""; }
  // The tree as PyTorch prints it; extensions may append their state (see set_print_hook).
  std::string to_string() const;

  // ---- interception slots (used by the quantization tracer) ----
  ModuleExtension* extension() const { return extension_.get(); }
  const std::shared_ptr<ModuleExtension>& extension_ptr() const { return extension_; }
  void set_extension(std::shared_ptr<ModuleExtension> ext) { extension_ = std::move(ext); }
  // An interceptor this module installs on its thread when called with none installed (set on
  // prepared modules, so calling them activates quantization).
  Interceptor* interceptor() const { return interceptor_; }
  void set_interceptor(Interceptor* interceptor) { interceptor_ = interceptor; }

 protected:
  Module(std::string type_name, std::type_index type);

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void collect_named(const std::string& prefix, bool params, NamedTensors* out) const;
  void print(std::ostream& os, int indent) const;

  std::string type_name_;
  std::type_index type_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  NamedTensors params_;
  NamedTensors buffers_;
  bool training_ = true;
  std::shared_ptr<ModuleExtension> extension_;
  Interceptor* interceptor_ = nullptr;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

// Renders extension state under a module in Module::to_string (one hook, set by quantization).
using ModulePrintHook = std::string (*)(const Module& module, int indent);
void set_module_print_hook(ModulePrintHook hook);

namespace detail {

std::string demangle_type_name(const char* mangled);

// Collects pointers to the tensors inside a value (tensors, containers and tuples of them).
// Every overload is declared before any is defined, so containers nest in any order (ADL would
// not find overloads declared later: the arguments' namespaces are std and dbrq).
inline void collect_tensors(Tensor& t, TensorPtrs& out) { out.push_back(&t); }
template <typename T>
void collect_tensors(T&, TensorPtrs&) {}  // non-tensor values: nothing to see
template <typename T>
void collect_tensors(std::vector<T>& v, TensorPtrs& out);
template <typename T, size_t N>
void collect_tensors(std::array<T, N>& v, TensorPtrs& out);
template <typename T>
void collect_tensors(std::optional<T>& v, TensorPtrs& out);
template <typename A, typename B>
void collect_tensors(std::pair<A, B>& v, TensorPtrs& out);
template <typename... T>
void collect_tensors(std::tuple<T...>& v, TensorPtrs& out);

template <typename T>
void collect_tensors(std::vector<T>& v, TensorPtrs& out) {
  for (auto& e : v) collect_tensors(e, out);
}
template <typename T, size_t N>
void collect_tensors(std::array<T, N>& v, TensorPtrs& out) {
  for (auto& e : v) collect_tensors(e, out);
}
template <typename T>
void collect_tensors(std::optional<T>& v, TensorPtrs& out) {
  if (v) collect_tensors(*v, out);
}
template <typename A, typename B>
void collect_tensors(std::pair<A, B>& v, TensorPtrs& out) {
  collect_tensors(v.first, out);
  collect_tensors(v.second, out);
}
template <typename... T>
void collect_tensors(std::tuple<T...>& v, TensorPtrs& out) {
  std::apply([&](auto&... e) { (collect_tensors(e, out), ...); }, v);
}

// Calls on_module_unwind unless released (forward threw).
class ModuleCallGuard {
 public:
  ModuleCallGuard(Interceptor* i, Module& m) : interceptor_(i), module_(m) {}
  ~ModuleCallGuard() {
    if (interceptor_ != nullptr) interceptor_->on_module_unwind(module_);
  }
  void release() { interceptor_ = nullptr; }

 private:
  Interceptor* interceptor_;
  Module& module_;
};

template <typename D, typename Args, typename = void>
struct ForwardTakes : std::false_type {};
// forward accepts these arguments and returns something (void results have no tensors to give).
template <typename D, typename... A>
struct ForwardTakes<D, std::tuple<A...>, std::void_t<decltype(std::declval<D&>().forward(std::declval<A>()...))>>
    : std::bool_constant<!std::is_void_v<decltype(std::declval<D&>().forward(std::declval<A>()...))>> {};

template <typename D, typename = void>
struct HasUnaryForward : std::false_type {};
template <typename D>
struct HasUnaryForward<D, std::void_t<decltype(std::declval<D&>().forward(std::declval<const Tensor&>()))>>
    : std::is_same<std::decay_t<decltype(std::declval<D&>().forward(std::declval<const Tensor&>()))>, Tensor> {};

}  // namespace detail

// Base for every module class: gives `Derived` a call operator that runs Derived::forward through
// the interception point.
template <typename Derived>
class CallableModule : public Module {
 public:
  template <typename... Args>
  auto operator()(Args&&... args) {
    Interceptor* active = ::dbrq::detail::tls_interceptor;
    if (__builtin_expect(active == nullptr, 1)) {
      if (interceptor() == nullptr) return derived().forward(std::forward<Args>(args)...);
      InterceptorScope scope(interceptor());
      return call_hooked(interceptor(), std::forward<Args>(args)...);
    }
    return call_hooked(active, std::forward<Args>(args)...);
  }

  Tensor forward_unary(const Tensor& x) override {
    if constexpr (detail::HasUnaryForward<Derived>::value) {
      return (*this)(x);
    } else {
      return Module::forward_unary(x);
    }
  }

  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& in) override {
    using T = const Tensor&;
    switch (in.size()) {
      case 1:
        if constexpr (detail::ForwardTakes<Derived, std::tuple<T>>::value) return collect((*this)(in[0]));
        break;
      case 2:
        if constexpr (detail::ForwardTakes<Derived, std::tuple<T, T>>::value) return collect((*this)(in[0], in[1]));
        break;
      case 3:
        if constexpr (detail::ForwardTakes<Derived, std::tuple<T, T, T>>::value) {
          return collect((*this)(in[0], in[1], in[2]));
        }
        break;
      case 4:
        if constexpr (detail::ForwardTakes<Derived, std::tuple<T, T, T, T>>::value) {
          return collect((*this)(in[0], in[1], in[2], in[3]));
        }
        break;
      default:
        break;
    }
    return Module::forward_tensors(in);
  }

 protected:
  CallableModule() : Module(detail::demangle_type_name(typeid(Derived).name()), typeid(Derived)) {}
  explicit CallableModule(std::string type_name) : Module(std::move(type_name), typeid(Derived)) {}

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }

  template <typename Out>
  static std::vector<Tensor> collect(Out out) {
    TensorPtrs ptrs;
    detail::collect_tensors(out, ptrs);
    std::vector<Tensor> result;
    for (Tensor* t : ptrs) result.push_back(*t);
    return result;
  }

  // forward, letting the interceptor say where an error that does not say so yet happened. The
  // handler costs nothing unless forward throws.
  template <typename Tuple>
  auto run_forward(Interceptor* interceptor, Tuple& in) {
    try {
      return std::apply([&](auto&... a) { return derived().forward(a...); }, in);
    } catch (const Error& e) {
      if (!e.has_location()) interceptor->on_module_error(*this, e);
      throw;
    }
  }

  template <typename... Args>
  auto call_hooked(Interceptor* interceptor, Args&&... args) {
    std::tuple<std::decay_t<Args>...> in(std::forward<Args>(args)...);
    TensorPtrs ptrs;
    std::apply([&](auto&... a) { (detail::collect_tensors(a, ptrs), ...); }, in);
    detail::ModuleCallGuard guard(interceptor, *this);
    interceptor->on_module_enter(*this, ptrs);
    using Out = std::decay_t<decltype(std::declval<Derived&>().forward(std::declval<std::decay_t<Args>&>()...))>;
    if constexpr (std::is_void_v<Out>) {
      run_forward(interceptor, in);
      interceptor->on_module_exit(*this, {});
      guard.release();
    } else {
      Out out = run_forward(interceptor, in);
      ptrs.clear();
      detail::collect_tensors(out, ptrs);
      interceptor->on_module_exit(*this, ptrs);
      guard.release();
      return out;
    }
  }
};

}  // namespace nn
}  // namespace dbrq
