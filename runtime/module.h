// Modules: the building blocks of eager models, shaped like PyTorch's C++ frontend.
//
//   struct BlockImpl : dbrq::nn::Module {        // or dbrq::nn::CallableModule<BlockImpl>
//     BlockImpl() {
//       conv = register_module("conv", dbrq::nn::Conv2d(16, 16, 3, 1, 1));
//       relu = register_module("relu", dbrq::nn::ReLU());
//     }
//     dbrq::Tensor forward(const dbrq::Tensor& x) { return relu(conv(x)) + x; }
//     dbrq::nn::Conv2d conv{nullptr};
//     dbrq::nn::ReLU relu{nullptr};
//   };
//   DBRQ_MODULE(Block);                           // the holder Block, as libtorch's TORCH_MODULE
//
//   Block block;
//   dbrq::Tensor y = block(x);                    // block->forward(x) is the same hooked call
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
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/dispatcher.h"
#include "core/tensor.h"

namespace dbrq {

// Parameter and buffer names with their tensors, in registration order.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

namespace nn {

// Opaque per-module data owned by a subsystem above the runtime (quantization state).
class ModuleExtension {
 public:
  virtual ~ModuleExtension() = default;
};

// What load_state_dict(strict=false) found. A tensor of another shape is no entry here: it throws
// in both modes, as in PyTorch.
struct LoadReport {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
  bool ok() const { return missing_keys.empty() && unexpected_keys.empty(); }
};

namespace detail {
// Whether M's call operator runs M::forward: M is the Derived of the CallableModule<Derived> it
// derives from (or is not callable at all, like ModuleList).
template <typename M, typename = void>
struct CallableTypeOf {
  using type = M;
};
template <typename M>
struct CallableTypeOf<M, std::void_t<typename M::DbrqCallableType>> {
  using type = typename M::DbrqCallableType;
};
template <typename M>
constexpr bool runs_own_forward() {
  return std::is_same_v<typename CallableTypeOf<M>::type, M>;
}
// Throws UsageError: `module`'s dynamic class derives from the callable class `callable`.
[[noreturn]] void throw_foreign_forward(const Module& module, const char* callable_mangled);
}  // namespace detail

template <typename Impl>
class ModuleHolder;

namespace detail {
template <typename M, typename = void>
struct HasCallableType : std::false_type {};
template <typename M>
struct HasCallableType<M, std::void_t<typename M::DbrqCallableType>> : std::true_type {};
template <typename M, typename = void>
struct HasForwardMember : std::false_type {};
template <typename M>
struct HasForwardMember<M, std::void_t<decltype(&M::forward)>> : std::true_type {};
// A libtorch-style class deriving from Module itself, with a (non-overloaded) forward.
template <typename M>
constexpr bool is_plain_module_with_forward() {
  return !HasCallableType<M>::value && HasForwardMember<M>::value;
}
template <typename T, typename = void>
struct IsModuleHolder : std::false_type {};
template <typename T>
struct IsModuleHolder<T, std::void_t<typename T::ContainedType>>
    : std::is_base_of<ModuleHolder<typename T::ContainedType>, T> {};
// The module class a type names: a holder's Impl (nn::Conv2d -> nn::Conv2dImpl), else the type.
template <typename M, typename = void>
struct ImplOf {
  using type = M;
};
template <typename M>
struct ImplOf<M, std::enable_if_t<IsModuleHolder<M>::value>> {
  using type = typename M::ContainedType;
};
template <typename M>
using ImplOfT = typename ImplOf<std::remove_cv_t<M>>::type;
// The classes a holder makes its module as (defined below): `holder.ptr()` points to one.
template <typename Impl>
class HookedForward;
template <typename Impl>
class HookedModule;
template <typename M>
struct IsHolderMade : std::false_type {};
template <typename Impl>
struct IsHolderMade<HookedForward<Impl>> : std::true_type {
  using Impl_ = Impl;
};
template <typename Impl>
struct IsHolderMade<HookedModule<Impl>> : std::true_type {
  using Impl_ = Impl;
};
}  // namespace detail

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
    if constexpr (detail::IsHolderMade<M>::value) {
      // A holder's module (`holder.ptr()`): registered as the holder itself would be.
      static_assert(detail::runs_own_forward<typename detail::IsHolderMade<M>::Impl_>(),
                    "this module class derives from another module class that is callable: its call operator "
                    "would run the base's forward, never X's. Derive X from dbrq::nn::CallableModule<X> or "
                    "dbrq::nn::Module");
      add_child(name, module);
      return module;
    } else {
      static_assert(!detail::IsModuleHolder<M>::value,
                    "std::shared_ptr to a module holder: nn::Conv2d (and every built-in layer, Sequential, ...) is "
                    "a holder, as in libtorch; make the module with nn::Conv2d(args...) (a holder) or "
                    "std::make_shared<nn::Conv2dImpl>(args...) (the module class)");
      static_assert(!detail::is_plain_module_with_forward<M>(),
                    "a module class deriving from dbrq::nn::Module itself (libtorch style) is callable through its "
                    "holder only: declare DBRQ_MODULE(X) for XImpl and register X(args...), not "
                    "std::make_shared<XImpl>(...) (whose forward would bypass the quantization hooks)");
      static_assert(detail::runs_own_forward<M>(),
                    "this module class derives from another module class that is callable (e.g. struct X : "
                    "Sequential, or struct X : Y with Y a CallableModule<Y>): its call operator would run the base's "
                    "forward, never X's. Derive X from dbrq::nn::CallableModule<X> (for a Sequential with its own "
                    "forward: dbrq::nn::SequentialBase<X>)");
      add_child(name, module);
      return module;
    }
  }
  // The same for a holder (`register_module("fire", Fire(64, 16))`, see DBRQ_MODULE): registers the
  // module it holds and returns the holder, of the holder's own type.
  template <typename H, typename = std::enable_if_t<detail::IsModuleHolder<std::decay_t<H>>::value>>
  std::decay_t<H> register_module(const std::string& name, H&& holder) {
    static_assert(detail::runs_own_forward<typename std::decay_t<H>::ContainedType>(),
                  "this module class derives from another module class that is callable: its call operator would "
                  "run the base's forward, never X's. Derive X from dbrq::nn::CallableModule<X> or dbrq::nn::Module");
    add_child(name, holder.ptr());
    return std::forward<H>(holder);
  }
  // Registers (or, for an existing name, replaces) a parameter / buffer and returns it.
  Tensor register_parameter(const std::string& name, Tensor tensor);
  Tensor register_buffer(const std::string& name, Tensor tensor);
  // Replaces a registered child (same name) by another module, e.g. for module swaps.
  void replace_module(const std::string& name, std::shared_ptr<Module> module);

  // The module as class T (a module class or a holder: `m->as<nn::Conv2d>()` is a Conv2dImpl*), or
  // null when it is not one. libtorch's Module::as.
  template <typename T>
  detail::ImplOfT<T>* as() {
    return dynamic_cast<detail::ImplOfT<T>*>(this);
  }
  template <typename T>
  const detail::ImplOfT<T>* as() const {
    return dynamic_cast<const detail::ImplOfT<T>*>(this);
  }

  // Children in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  std::vector<std::shared_ptr<Module>> children() const;
  std::shared_ptr<Module> child(const std::string& name) const;  // null when absent
  // This module (name `prefix`) and every descendant, depth-first in registration order, with
  // dot-joined fully qualified names. Pointers stay valid while the tree lives.
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "",
                                                             bool include_self = true);
  // The same modules without names, as libtorch's modules(): this one (a non-owning pointer) when
  // include_self, then every descendant.
  std::vector<std::shared_ptr<Module>> modules(bool include_self = true);
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
  // dtype, e.g. f16 to f32). A tensor of another shape (or undefined) throws ShapeError listing
  // every such name, strict or not, as PyTorch's does (non-strict used to skip it and keep the old
  // values, reported only in the returned report). strict: missing or unexpected names throw
  // StateDictError listing every one. Whatever throws modifies nothing. Non-strict: matching tensors
  // are loaded and the missing and unexpected names reported.
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
  // prepared modules, so calling them activates quantization). set_interceptor does not own it;
  // attach_interceptor shares ownership (the quantization tracer's, which lives as long as the
  // prepared modules).
  Interceptor* interceptor() const { return interceptor_; }
  void set_interceptor(Interceptor* interceptor) {
    interceptor_ = interceptor;
    owned_interceptor_.reset();
  }
  void attach_interceptor(std::shared_ptr<Interceptor> interceptor) {
    interceptor_ = interceptor.get();
    owned_interceptor_ = std::move(interceptor);
  }

 protected:
  Module(std::string type_name, std::type_index type);
  // For libtorch-style classes deriving from Module itself (`struct NetImpl : dbrq::nn::Module`, made
  // by their DBRQ_MODULE holder, which makes them callable: see HookedModule). The class name is set
  // once the object is constructed: by the holder, or from the dynamic class when registered.
  Module() : type_(typeid(Module)) {}
  // Sets type_name() and type() when still unset (a class built with the default constructor).
  void set_type_if_unset(std::string type_name, std::type_index type) {
    if (!type_name_.empty()) return;
    type_name_ = std::move(type_name);
    type_ = type;
  }

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
  std::shared_ptr<Interceptor> owned_interceptor_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

// Renders extension state under a module in Module::to_string (one hook, set by quantization).
using ModulePrintHook = std::string (*)(const Module& module, int indent);
void set_module_print_hook(ModulePrintHook hook);

namespace detail {

std::string demangle_type_name(const char* mangled);
// The type_name() of modules of class M (a module class or a holder): the class name without
// namespaces, and for dbrq's built-in modules their PyTorch name (nn::Conv2dImpl and the holder
// nn::Conv2d are "Conv2d"; a user's FireImpl and its holder Fire are "FireImpl").
std::string module_type_name(const char* impl_mangled);
template <typename M>
std::string module_type_name() {
  return module_type_name(typeid(ImplOfT<M>).name());
}

// Probe argument for detecting a dbrq_for_each_tensor overload.
struct TensorVisitProbe {
  template <typename T>
  void operator()(T&) const {}
};

template <typename T, typename = void>
struct HasTensorVisitor : std::false_type {};
template <typename T>
struct HasTensorVisitor<T, std::void_t<decltype(dbrq_for_each_tensor(std::declval<T&>(),
                                                                     std::declval<TensorVisitProbe&>()))>>
    : std::true_type {};

template <typename T>
struct IsStdPointer : std::false_type {};
template <typename T>
struct IsStdPointer<std::shared_ptr<T>> : std::true_type {};
template <typename T, typename D>
struct IsStdPointer<std::unique_ptr<T, D>> : std::true_type {};
template <typename T>
struct IsStdPointer<std::weak_ptr<T>> : std::true_type {};

// Values a module boundary may carry that hold no tensor dbrq must see: scalars, enums, strings,
// pointers (dbrq does not follow them), empty types, std::function, and types declared with
// DBRQ_NO_TENSORS.
template <typename T>
constexpr bool is_tensor_free() {
  return std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_pointer_v<T> || std::is_null_pointer_v<T> ||
         std::is_member_pointer_v<T> || std::is_same_v<T, std::string> || std::is_same_v<T, std::string_view> ||
         IsStdPointer<T>::value || std::is_empty_v<T>;  // empty: nullopt_t, monostate, tag types
}
template <typename T>
struct IsStdFunction : std::false_type {};
template <typename R, typename... A>
struct IsStdFunction<std::function<R(A...)>> : std::true_type {};

template <typename T>
constexpr bool dependent_false() {
  return false;
}

// Collects pointers to the tensors inside a value: tensors, std containers, tuples, pairs,
// optionals and variants of them, and user types that declare their tensors (DBRQ_TENSOR_STRUCT or
// a dbrq_for_each_tensor overload). Any other class type at a module boundary is a compile error:
// tensors hidden in it would escape the tracer, and after convert user code could receive int8 codes
// where it expects real values. Every overload is declared before any is defined, so containers nest
// in any order.
inline void collect_tensors(Tensor& t, TensorPtrs& out) { out.push_back(&t); }
template <typename T>
void collect_tensors(T& v, TensorPtrs& out);
template <typename T, typename A>
void collect_tensors(std::vector<T, A>& v, TensorPtrs& out);
template <typename T, size_t N>
void collect_tensors(std::array<T, N>& v, TensorPtrs& out);
template <typename T>
void collect_tensors(std::optional<T>& v, TensorPtrs& out);
template <typename A, typename B>
void collect_tensors(std::pair<A, B>& v, TensorPtrs& out);
template <typename... T>
void collect_tensors(std::tuple<T...>& v, TensorPtrs& out);
template <typename... T>
void collect_tensors(std::variant<T...>& v, TensorPtrs& out);
template <typename K, typename V, typename C, typename A>
void collect_tensors(std::map<K, V, C, A>& v, TensorPtrs& out);
template <typename K, typename V, typename H, typename E, typename A>
void collect_tensors(std::unordered_map<K, V, H, E, A>& v, TensorPtrs& out);

template <typename T>
void collect_tensors(T& v, TensorPtrs& out) {
  if constexpr (HasTensorVisitor<T>::value) {
    dbrq_for_each_tensor(v, [&out](auto& field) { collect_tensors(field, out); });
  } else if constexpr (is_tensor_free<std::remove_cv_t<T>>() || IsStdFunction<std::remove_cv_t<T>>::value) {
    // nothing to see
  } else {
    static_assert(dependent_false<T>(),
                  "dbrq cannot see the tensors inside this type, which a module's forward takes or returns. "
                  "Declare them next to the type: DBRQ_TENSOR_STRUCT(Type, field1, field2, ...), or define "
                  "template <typename F> void dbrq_for_each_tensor(Type& v, F&& visit) { visit(v.a); ... } in "
                  "its namespace; a type without tensors: DBRQ_NO_TENSORS(Type)");
  }
}
template <typename T, typename A>
void collect_tensors(std::vector<T, A>& v, TensorPtrs& out) {
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
template <typename... T>
void collect_tensors(std::variant<T...>& v, TensorPtrs& out) {
  std::visit([&](auto& e) { collect_tensors(e, out); }, v);
}
template <typename K, typename V, typename C, typename A>
void collect_tensors(std::map<K, V, C, A>& v, TensorPtrs& out) {
  for (auto& [k, e] : v) collect_tensors(e, out);  // keys are const: only values may hold tensors
}
template <typename K, typename V, typename H, typename E, typename A>
void collect_tensors(std::unordered_map<K, V, H, E, A>& v, TensorPtrs& out) {
  for (auto& [k, e] : v) collect_tensors(e, out);
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

namespace detail {

template <typename Out>
std::vector<Tensor> collect_outputs(Out out) {
  TensorPtrs ptrs;
  collect_tensors(out, ptrs);
  std::vector<Tensor> result;
  for (Tensor* t : ptrs) result.push_back(*t);
  return result;
}

// The hooked call of module `self` whose body is Body::forward, called on `body` (the same object)
// by qualified name, so that a wrapper's own forward (HookedForward, HookedModule) is never taken
// for the body. Shared by CallableModule<Body> and HookedModule<Body>.
template <typename Body>
class HookedCall {
 public:
  template <typename... Args>
  static auto call(Module& self, Body& body, Args&&... args) {
    Interceptor* active = ::dbrq::detail::tls_interceptor;
    Interceptor* own = self.interceptor();
    if (__builtin_expect(active == nullptr, 1)) {
      if (own == nullptr) return body.Body::forward(std::forward<Args>(args)...);
    } else if (__builtin_expect(own == nullptr || own == active, 1) || !active->serves_only_its_modules()) {
      return call_hooked(self, body, active, std::forward<Args>(args)...);
    }
    // The module's own interceptor: none was active, or the active one is another prepared model's
    // (a converted encoder called from this model's forward).
    InterceptorScope scope(own);
    return call_hooked(self, body, own, std::forward<Args>(args)...);
  }

  // Module::forward_tensors for a module whose call operator is `self(...)`.
  template <typename Self>
  static std::vector<Tensor> forward_tensors(Self& self, const std::vector<Tensor>& in) {
    using T = const Tensor&;
    switch (in.size()) {
      case 1:
        if constexpr (ForwardTakes<Body, std::tuple<T>>::value) return collect_outputs(self(in[0]));
        break;
      case 2:
        if constexpr (ForwardTakes<Body, std::tuple<T, T>>::value) return collect_outputs(self(in[0], in[1]));
        break;
      case 3:
        if constexpr (ForwardTakes<Body, std::tuple<T, T, T>>::value) {
          return collect_outputs(self(in[0], in[1], in[2]));
        }
        break;
      case 4:
        if constexpr (ForwardTakes<Body, std::tuple<T, T, T, T>>::value) {
          return collect_outputs(self(in[0], in[1], in[2], in[3]));
        }
        break;
      default:
        break;
    }
    return self.Module::forward_tensors(in);
  }

 private:
  // forward, letting the interceptor say where an error that does not say so yet happened. The
  // handler costs nothing unless forward throws.
  template <typename Tuple>
  static auto run_forward(Module& self, Body& body, Interceptor* interceptor, Tuple& in) {
    try {
      return std::apply([&](auto&... a) { return body.Body::forward(a...); }, in);
    } catch (const Error& e) {
      if (!e.has_location()) interceptor->on_module_error(self, e);
      throw;
    }
  }

  template <typename... Args>
  static auto call_hooked(Module& self, Body& body, Interceptor* interceptor, Args&&... args) {
    std::tuple<std::decay_t<Args>...> in(std::forward<Args>(args)...);
    TensorPtrs ptrs;
    std::apply([&](auto&... a) { (collect_tensors(a, ptrs), ...); }, in);
    ModuleCallGuard guard(interceptor, self);
    interceptor->on_module_enter(self, ptrs);
    using Out = std::decay_t<decltype(std::declval<Body&>().Body::forward(std::declval<std::decay_t<Args>&>()...))>;
    if constexpr (std::is_void_v<Out>) {
      run_forward(self, body, interceptor, in);
      interceptor->on_module_exit(self, {});
      guard.release();
    } else {
      Out out = run_forward(self, body, interceptor, in);
      ptrs.clear();
      collect_tensors(out, ptrs);
      interceptor->on_module_exit(self, ptrs);
      guard.release();
      return out;
    }
  }
};

}  // namespace detail

// Base for every module class: gives `Derived` a call operator that runs Derived::forward through
// the interception point.
//
// The call operator runs Derived::forward. A class derived from Derived does not get its own forward
// called (C++17 has no way to find it), so that case is refused: at compile time when the subclass is
// registered as a child, and with a UsageError when such an object is called.
template <typename Derived>
class CallableModule : public Module {
 public:
  using DbrqCallableType = Derived;

  template <typename... Args>
  auto operator()(Args&&... args) {
    // A vtable load and a pointer compare (the type_info objects are unique when they match).
    if (__builtin_expect(typeid(*this) != typeid(Derived), 0)) check_foreign_forward();
    return detail::HookedCall<Derived>::call(*this, derived(), std::forward<Args>(args)...);
  }

  Tensor forward_unary(const Tensor& x) override {
    if constexpr (detail::HasUnaryForward<Derived>::value) {
      return (*this)(x);
    } else {
      return Module::forward_unary(x);
    }
  }

  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& in) override {
    return detail::HookedCall<Derived>::forward_tensors(*this, in);
  }

 protected:
  CallableModule() : Module(detail::demangle_type_name(typeid(Derived).name()), typeid(Derived)) {}
  explicit CallableModule(std::string type_name) : Module(std::move(type_name), typeid(Derived)) {}

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }
  // The object is of a class derived from Derived: fine for a holder's HookedForward<Derived>
  // (whose forward is this call operator), refused for anything else.
  void check_foreign_forward();
};

namespace detail {
// The object a DBRQ_MODULE holder makes for a user's Impl: the Impl, whose `forward` (found first
// by `holder->forward(x)`) is the hooked call operator, so that libtorch's two spellings,
// `fire(x)` and `fire->forward(x)`, both go through the hooks. The call operator still runs
// Impl::forward (static_cast to Impl), the user's body.
template <typename Impl>
class HookedForward final : public Impl {
 public:
  using Impl::Impl;
  template <typename... Args>
  auto forward(Args&&... args) {
    return Impl::operator()(std::forward<Args>(args)...);
  }
};
// Wrap every callable module class that can be derived from: user modules and the built-in
// layers and containers (nn::Conv2d is a holder of HookedForward<Conv2dImpl>). A final user class
// is held as is (its forward is then the direct call).
template <typename Impl>
constexpr bool wraps_forward() {
  return !std::is_final_v<Impl> && std::is_base_of_v<CallableModule<Impl>, Impl>;
}

// The object a DBRQ_MODULE holder makes for a libtorch-style Impl that derives from Module itself
// (`struct NetImpl : dbrq::nn::Module`): the Impl plus what CallableModule would give it, a hooked
// call operator running NetImpl::forward, `forward` as that call (so `net(x)` and `net->forward(x)`
// are both the hooked call), and the single-tensor / tensor-list calls Sequential and prepare use.
template <typename Impl>
class HookedModule final : public Impl {
 public:
  template <typename... A, typename = std::enable_if_t<std::is_constructible_v<Impl, A&&...>>>
  explicit HookedModule(A&&... a) : Impl(std::forward<A>(a)...) {
    this->set_type_if_unset(demangle_type_name(typeid(Impl).name()), typeid(Impl));
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return HookedCall<Impl>::call(*this, static_cast<Impl&>(*this), std::forward<Args>(args)...);
  }
  template <typename... Args>
  auto forward(Args&&... args) {
    return (*this)(std::forward<Args>(args)...);
  }
  Tensor forward_unary(const Tensor& x) override {
    if constexpr (HasUnaryForward<Impl>::value) {
      return (*this)(x);
    } else {
      return Module::forward_unary(x);
    }
  }
  std::vector<Tensor> forward_tensors(const std::vector<Tensor>& in) override {
    return HookedCall<Impl>::forward_tensors(*this, in);
  }
};
template <typename Impl>
constexpr bool wraps_plain_module() {
  return !std::is_final_v<Impl> && std::is_base_of_v<Module, Impl> && !HasCallableType<Impl>::value;
}
template <typename Impl>
using HeldType = std::conditional_t<wraps_forward<Impl>(), HookedForward<Impl>,
                                    std::conditional_t<wraps_plain_module<Impl>(), HookedModule<Impl>, Impl>>;

// Throws UsageError: an empty holder (made from nullptr) was used.
[[noreturn]] void throw_empty_holder(const char* impl_mangled);

template <typename T>
struct IsSharedPtr : std::false_type {};
template <typename T>
struct IsSharedPtr<std::shared_ptr<T>> : std::true_type {};
// Arguments that the holder's constructing constructor must not take: a single holder of the same
// Impl (that is a copy or a move: `nn::Sequential b(a)` shares a's module, it does not wrap it in
// a new Sequential) or a single std::shared_ptr (adopting a module is the shared_ptr<Held>
// constructor's job; anything else is refused below).
template <typename Impl, typename... Args>
constexpr bool is_holder_copy_or_adoption() {
  if constexpr (sizeof...(Args) != 1) {
    return false;
  } else {
    using A = std::decay_t<std::tuple_element_t<0, std::tuple<Args...>>>;
    if constexpr (IsModuleHolder<A>::value) {
      return std::is_same_v<typename A::ContainedType, Impl>;
    } else {
      return IsSharedPtr<A>::value;
    }
  }
}
}  // namespace detail

// A shared handle to a module, as libtorch's ModuleHolder: copies share the module. Made by
// DBRQ_MODULE(Name) for `struct NameImpl`, so ported libtorch code reads the same:
//
//   struct FireImpl : dbrq::nn::CallableModule<FireImpl> {
//     FireImpl(int64_t in, int64_t squeeze) { ... }
//     dbrq::Tensor forward(const dbrq::Tensor& x);
//   };
//   DBRQ_MODULE(Fire);
//
//   Fire fire{nullptr};                               // empty; assigned later
//   fire = register_module("fire", Fire(64, 16));
//   dbrq::Tensor y = fire(x);                         // the hooked call (prepare / convert see it)
//
// `fire->forward(x)` is also the hooked call: the held object is a HookedForward<FireImpl>, whose
// forward goes through the module's call operator (see below). Everything else (`fire->conv`,
// `fire->named_parameters()`) is the module's own.
template <typename Impl>
class ModuleHolder {
 public:
  using ContainedType = Impl;
  // The class of the held object: HookedForward<Impl> for a user module, else Impl.
  using Held = detail::HeldType<Impl>;

  // Constructs the module from the arguments (none: its default constructor).
  template <typename... Args, typename = std::enable_if_t<!detail::is_holder_copy_or_adoption<Impl, Args...>() &&
                                                          std::is_constructible_v<Held, Args&&...>>>
  explicit ModuleHolder(Args&&... args) : impl_(std::make_shared<Held>(std::forward<Args>(args)...)) {}
  // Empty; using it throws UsageError until a module is assigned.
  ModuleHolder(std::nullptr_t) {}  // NOLINT: `Fire fire = nullptr` as in libtorch
  // Holds an existing module (of the held class: a holder's ptr(), or std::make_shared<Held>).
  ModuleHolder(std::shared_ptr<Held> module) : impl_(std::move(module)) {}  // NOLINT
  // A module made by std::make_shared<Impl> is not one a holder can hold when the holder wraps
  // forward (Held is HookedForward<Impl>): `holder->forward(x)` would name a function the object
  // does not have. Refused at compile time.
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<Impl, M> && !std::is_convertible_v<M*, Held*>>>
  ModuleHolder(std::shared_ptr<M>) {  // NOLINT
    static_assert(detail::dependent_false<M>(),
                  "a holder cannot adopt a module made by std::make_shared<XImpl>(...): make it with the holder, "
                  "X(args...), or keep it in a std::shared_ptr<XImpl>");
  }

  // Held, not Impl: `holder->forward(x)` must find HookedForward's forward.
  Held* operator->() const { return get(); }
  Held& operator*() const { return *get(); }
  Held* get() const {
    if (impl_ == nullptr) detail::throw_empty_holder(typeid(Impl).name());
    return impl_.get();
  }
  // The held object, as libtorch's ptr(). Of the held class, so that `holder.ptr()->forward(x)` (and
  // `auto p = holder.ptr(); p->forward(x)`) is the hooked call as `holder->forward(x)` is; it
  // converts to std::shared_ptr<Impl> (whose `->forward` is then the direct call, see above).
  std::shared_ptr<Held> ptr() const {
    if (impl_ == nullptr) detail::throw_empty_holder(typeid(Impl).name());
    return impl_;
  }
  bool is_empty() const { return impl_ == nullptr; }
  explicit operator bool() const { return impl_ != nullptr; }
  // For containers taking std::shared_ptr<Module> (Sequential, ModuleList, replace_module).
  template <typename M, typename = std::enable_if_t<std::is_base_of_v<M, Impl>>>
  operator std::shared_ptr<M>() const {  // NOLINT
    return ptr();
  }

  // The module's hooked call operator.
  template <typename... Args>
  auto operator()(Args&&... args) const {
    return (*get())(std::forward<Args>(args)...);
  }
  // The module's operator[] (Sequential, ModuleList, ModuleDict): `seq[0]`, as libtorch's holders.
  template <typename Arg>
  decltype(auto) operator[](Arg&& arg) const {
    return (*get())[std::forward<Arg>(arg)];
  }

 private:
  std::shared_ptr<Held> impl_;
};

template <typename Derived>
void CallableModule<Derived>::check_foreign_forward() {
  if constexpr (detail::wraps_forward<Derived>()) {
    if (typeid(*this) == typeid(detail::HookedForward<Derived>)) return;
  }
  detail::throw_foreign_forward(*this, typeid(Derived).name());
}

}  // namespace nn
}  // namespace dbrq

// Defines `Name`, a ModuleHolder of `NameImpl` (libtorch's TORCH_MODULE): `Name(args...)` makes
// a module, `Name(nullptr)` an empty holder.
#define DBRQ_MODULE(Name)                                                   \
  class Name : public ::dbrq::nn::ModuleHolder<Name##Impl> {                \
   public:                                                                  \
    using ::dbrq::nn::ModuleHolder<Name##Impl>::ModuleHolder;               \
    using Impl = Name##Impl;                                                \
    Name() = default;                                                       \
  }

// Declares the tensors of a user type that a module's forward takes or returns, so the tracer sees
// them (dtype changes at module boundaries, int8 outputs dequantized for the caller). Place it at
// namespace scope in the type's namespace; fields may be tensors, containers of tensors or other
// declared types.
//
//   struct Outputs { dbrq::Tensor logits, aux1, aux2; int steps; };
//   DBRQ_TENSOR_STRUCT(Outputs, logits, aux1, aux2)
#define DBRQ_TENSOR_STRUCT(Type, ...)                                  \
  template <typename DbrqVisit>                                         \
  inline void dbrq_for_each_tensor(Type& dbrq_value, DbrqVisit&& dbrq_visit) { \
    DBRQ_DETAIL_FOR_EACH(DBRQ_DETAIL_VISIT_FIELD, __VA_ARGS__)          \
  }
// Declares that a user type passed to or returned from forward holds no tensors.
#define DBRQ_NO_TENSORS(Type) \
  template <typename DbrqVisit> \
  inline void dbrq_for_each_tensor(Type&, DbrqVisit&&) {}

#define DBRQ_DETAIL_VISIT_FIELD(field) dbrq_visit(dbrq_value.field);
// Applies m to each argument (up to 16).
#define DBRQ_DETAIL_FE_1(m, x) m(x)
#define DBRQ_DETAIL_FE_2(m, x, ...) m(x) DBRQ_DETAIL_FE_1(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_3(m, x, ...) m(x) DBRQ_DETAIL_FE_2(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_4(m, x, ...) m(x) DBRQ_DETAIL_FE_3(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_5(m, x, ...) m(x) DBRQ_DETAIL_FE_4(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_6(m, x, ...) m(x) DBRQ_DETAIL_FE_5(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_7(m, x, ...) m(x) DBRQ_DETAIL_FE_6(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_8(m, x, ...) m(x) DBRQ_DETAIL_FE_7(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_9(m, x, ...) m(x) DBRQ_DETAIL_FE_8(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_10(m, x, ...) m(x) DBRQ_DETAIL_FE_9(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_11(m, x, ...) m(x) DBRQ_DETAIL_FE_10(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_12(m, x, ...) m(x) DBRQ_DETAIL_FE_11(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_13(m, x, ...) m(x) DBRQ_DETAIL_FE_12(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_14(m, x, ...) m(x) DBRQ_DETAIL_FE_13(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_15(m, x, ...) m(x) DBRQ_DETAIL_FE_14(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_16(m, x, ...) m(x) DBRQ_DETAIL_FE_15(m, __VA_ARGS__)
#define DBRQ_DETAIL_FE_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, name, ...) name
#define DBRQ_DETAIL_FOR_EACH(m, ...)                                                                              \
  DBRQ_DETAIL_FE_PICK(__VA_ARGS__, DBRQ_DETAIL_FE_16, DBRQ_DETAIL_FE_15, DBRQ_DETAIL_FE_14, DBRQ_DETAIL_FE_13,    \
                      DBRQ_DETAIL_FE_12, DBRQ_DETAIL_FE_11, DBRQ_DETAIL_FE_10, DBRQ_DETAIL_FE_9, DBRQ_DETAIL_FE_8, \
                      DBRQ_DETAIL_FE_7, DBRQ_DETAIL_FE_6, DBRQ_DETAIL_FE_5, DBRQ_DETAIL_FE_4, DBRQ_DETAIL_FE_3,     \
                      DBRQ_DETAIL_FE_2, DBRQ_DETAIL_FE_1)                                                         \
  (m, __VA_ARGS__)
