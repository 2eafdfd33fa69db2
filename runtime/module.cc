#include "runtime/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <set>
#include <string_view>
#include <sstream>

#include "absl/strings/str_join.h"
#include "runtime/ops.h"

namespace dbrq::nn {
namespace {

// Set by every prepare(), possibly on several threads at once (replicas prepared in parallel).
std::atomic<ModulePrintHook> g_print_hook{nullptr};

void check_name(const std::string& what, const std::string& name) {
  DBRQ_ENSURE(!name.empty() && name.find('.') == std::string::npos, ValueError, what, " name \"", name,
              "\" must be non-empty and must not contain '.'");
}

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

namespace detail {

std::string demangle_type_name(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = (status == 0 && demangled != nullptr) ? demangled : mangled;
  std::free(demangled);
  // Drop template arguments and namespaces: "ns::Block<int>" -> "Block".
  if (auto lt = name.find('<'); lt != std::string::npos) name.resize(lt);
  if (auto colon = name.rfind("::"); colon != std::string::npos) name = name.substr(colon + 2);
  return name;
}

std::string module_type_name(const char* impl_mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(impl_mangled, nullptr, nullptr, &status);
  const std::string full = (status == 0 && demangled != nullptr) ? demangled : impl_mangled;
  std::free(demangled);
  std::string name = demangle_type_name(impl_mangled);
  // Built-in modules are dbrq::nn::XImpl and name themselves X (PyTorch's name).
  constexpr std::string_view kBuiltin = "dbrq::nn::", kImpl = "Impl";
  if (full.compare(0, kBuiltin.size(), kBuiltin) == 0 && full.find("::", kBuiltin.size()) == std::string::npos &&
      name.size() > kImpl.size() && name.compare(name.size() - kImpl.size(), kImpl.size(), kImpl) == 0) {
    name.resize(name.size() - kImpl.size());
  }
  return name;
}

void throw_foreign_forward(const Module& module, const char* callable_mangled) {
  const std::string actual = demangle_type_name(typeid(module).name());
  const std::string callable = demangle_type_name(callable_mangled);
  DBRQ_THROW(UsageError, "module class ", actual, " derives from ", callable,
             ", a module class with its own call operator: calling it runs ", callable, "::forward, never ", actual,
             "'s. Derive ", actual, " from dbrq::nn::CallableModule<", actual,
             "> (for a Sequential with its own forward: dbrq::nn::SequentialBase<", actual, ">)");
}

void throw_empty_holder(const char* impl_mangled) {
  DBRQ_THROW(UsageError, "an empty module holder of ", demangle_type_name(impl_mangled),
             " (made from nullptr) was used: assign it a module first, e.g. x = register_module(\"x\", X(...))");
}

}  // namespace detail

Module::Module(std::string type_name, std::type_index type) : type_name_(std::move(type_name)), type_(type) {}

Module::~Module() = default;

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name("module", name);
  DBRQ_ENSURE(module != nullptr, ValueError, "register_module(\"", name, "\"): module is null");
  DBRQ_ENSURE(module.get() != this, ValueError, "register_module(\"", name, "\"): a module cannot contain itself");
  for (auto& [n, m] : children_) {
    DBRQ_ENSURE(n != name, ValueError, "register_module: a child named \"", name, "\" already exists in ",
                type_name_);
  }
  // A libtorch-style class deriving from Module itself, not made by its holder: named after its class.
  module->set_type_if_unset(detail::demangle_type_name(typeid(*module).name()), typeid(*module));
  children_.emplace_back(name, std::move(module));
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  DBRQ_ENSURE(module != nullptr, ValueError, "replace_module(\"", name, "\"): module is null");
  for (auto& [n, m] : children_) {
    if (n == name) {
      m = std::move(module);
      return;
    }
  }
  DBRQ_THROW(IndexError, "replace_module: ", type_name_, " has no child named \"", name, "\"");
}

namespace {

Tensor register_named(NamedTensors& list, const NamedTensors& other, const std::string& what,
                      const std::string& name, Tensor tensor) {
  check_name(what, name);
  for (auto& [n, t] : other) {
    DBRQ_ENSURE(n != name, ValueError, "register_", what, "(\"", name, "\"): the name is already used by a ",
                what == "parameter" ? "buffer" : "parameter");
  }
  for (auto& [n, t] : list) {
    if (n == name) {
      t = std::move(tensor);
      return t;
    }
  }
  list.emplace_back(name, std::move(tensor));
  return list.back().second;
}

}  // namespace

Tensor Module::register_parameter(const std::string& name, Tensor tensor) {
  return register_named(params_, buffers_, "parameter", name, std::move(tensor));
}

Tensor Module::register_buffer(const std::string& name, Tensor tensor) {
  return register_named(buffers_, params_, "buffer", name, std::move(tensor));
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  out.reserve(children_.size());
  for (auto& [n, m] : children_) out.push_back(m);
  return out;
}

std::shared_ptr<Module> Module::child(const std::string& name) const {
  for (auto& [n, m] : children_) {
    if (n == name) return m;
  }
  return nullptr;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix, bool include_self) {
  std::vector<std::pair<std::string, Module*>> out;
  if (include_self) out.emplace_back(prefix, this);
  for (auto& [name, m] : children_) {
    auto sub = m->named_modules(join_name(prefix, name), true);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<std::shared_ptr<Module>> Module::modules(bool include_self) {
  std::vector<std::shared_ptr<Module>> out;
  // Aliasing constructor with an empty owner: a non-owning pointer to this module.
  if (include_self) out.emplace_back(std::shared_ptr<Module>(), this);
  // Depth-first in registration order, as named_modules.
  for (auto& [name, child] : children_) {
    out.push_back(child);
    auto sub = child->modules(false);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

Module* Module::find_module(const std::string& fqn) {
  if (fqn.empty()) return this;
  Module* cur = this;
  size_t start = 0;
  while (cur != nullptr && start <= fqn.size()) {
    size_t dot = fqn.find('.', start);
    std::string part = fqn.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    cur = cur->child(part).get();
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

void Module::collect_named(const std::string& prefix, bool params, NamedTensors* out) const {
  for (auto& [n, t] : params ? params_ : buffers_) out->emplace_back(join_name(prefix, n), t);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors out;
  collect_named("", true, &out);
  if (recurse) {
    for (auto& [name, m] : children_) {
      for (auto& [n, t] : m->named_parameters(true)) out.emplace_back(join_name(name, n), t);
    }
  }
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect_named("", false, &out);
  if (recurse) {
    for (auto& [name, m] : children_) {
      for (auto& [n, t] : m->named_buffers(true)) out.emplace_back(join_name(name, n), t);
    }
  }
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  collect_named("", true, &out);
  collect_named("", false, &out);
  for (auto& [name, m] : children_) {
    for (auto& [n, t] : m->state_dict()) out.emplace_back(join_name(name, n), t);
  }
  return out;
}

LoadReport Module::load_state_dict(const std::map<std::string, Tensor>& tensors, bool strict) {
  NamedTensors list(tensors.begin(), tensors.end());
  return load_state_dict(list, strict);
}

LoadReport Module::load_state_dict(const NamedTensors& tensors, bool strict) {
  LoadReport report;
  std::vector<std::string> mismatched;  // "name: expected [..], got [..]"
  NamedTensors own = state_dict();
  std::map<std::string, const Tensor*> given;
  for (auto& [n, t] : tensors) given[n] = &t;
  std::set<std::string> known;
  std::vector<std::pair<Tensor*, const Tensor*>> to_copy;
  for (auto& [name, dst] : own) {
    known.insert(name);
    auto it = given.find(name);
    if (it == given.end()) {
      report.missing_keys.push_back(name);
      continue;
    }
    const Tensor& src = *it->second;
    if (!src.defined() || src.sizes() != dst.sizes()) {
      mismatched.push_back(absl::StrCat(name, ": expected ", dst.shape_string(), ", got ",
                                        src.defined() ? src.shape_string() : "undefined"));
      continue;
    }
    to_copy.emplace_back(&dst, &src);
  }
  for (auto& [n, t] : tensors) {
    if (!known.count(n)) report.unexpected_keys.push_back(n);
  }
  if (strict) {
    DBRQ_ENSURE(report.missing_keys.empty() && report.unexpected_keys.empty(), StateDictError,
                "load_state_dict(strict) into ", type_name_, ": ",
                report.missing_keys.empty() ? "" : absl::StrCat("missing keys [", absl::StrJoin(report.missing_keys, ", "), "]"),
                !report.missing_keys.empty() && !report.unexpected_keys.empty() ? "; " : "",
                report.unexpected_keys.empty()
                    ? ""
                    : absl::StrCat("unexpected keys [", absl::StrJoin(report.unexpected_keys, ", "), "]"));
  }
  DBRQ_ENSURE(mismatched.empty(), ShapeError, "load_state_dict", strict ? "(strict)" : "(strict=false)", " into ",
              type_name_, ": shape mismatch for [", absl::StrJoin(mismatched, "; "), "]");
  // Copies write into the registered tensors' storage, so every holder of a parameter (a layer's
  // `weight` member, say) sees the new values.
  InterceptorScope no_interception(nullptr);
  for (auto& [dst, src] : to_copy) dst->copy_(*src);
  return report;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

Tensor Module::forward_unary(const Tensor&) {
  DBRQ_THROW(ValueError, type_name_, " cannot be called with a single tensor (its forward takes other arguments)");
}

std::vector<Tensor> Module::forward_tensors(const std::vector<Tensor>& inputs) {
  DBRQ_THROW(ValueError, type_name_, " cannot be called with ", inputs.size(),
             " tensor argument(s): its forward takes other arguments (pass a callable that runs the model instead)");
}

void Module::print(std::ostream& os, int indent) const {
  os << type_name_ << "(";
  const std::string extra = extra_repr();
  const ModulePrintHook hook = g_print_hook.load(std::memory_order_relaxed);
  if (children_.empty() && hook == nullptr) {
    os << extra << ")";
    return;
  }
  std::string hooked = hook ? hook(*this, indent + 2) : "";
  if (children_.empty() && hooked.empty()) {
    os << extra << ")";
    return;
  }
  os << "\n";
  if (!extra.empty()) os << std::string(indent + 2, ' ') << extra << "\n";
  for (auto& [name, m] : children_) {
    os << std::string(indent + 2, ' ') << "(" << name << "): ";
    m->print(os, indent + 2);
    os << "\n";
  }
  os << hooked;
  os << std::string(indent, ' ') << ")";
}

std::string Module::to_string() const {
  std::ostringstream os;
  print(os, 0);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.to_string(); }

void set_module_print_hook(ModulePrintHook hook) { g_print_hook.store(hook, std::memory_order_relaxed); }

}  // namespace dbrq::nn
