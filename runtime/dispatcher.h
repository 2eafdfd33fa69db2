// The dispatcher: the one choke point every op call and every module call passes through.
//
// An op builds an OpCall on the stack (kind, pointers to its tensor arguments, a pointer to its
// parameters, and `run`, the eager implementation) and hands it to dispatch(). With no interceptor
// installed on the calling thread, dispatch() is one thread-local load and a direct call of `run`.
// With one installed (the quantization tracer), the interceptor decides what happens: it may
// observe, substitute arguments and call `run`, or run something else entirely (an int8 kernel).
//
//   class Counting : public dbrq::Interceptor {
//     Tensor on_op(const OpCall& c) override { ++n; return c.run(c); }
//     ...
//   };
//   Counting counter;
//   {
//     dbrq::InterceptorScope scope(&counter);   // this thread only
//     y = (*model)(x);
//   }
//
// Interception is thread-local: two threads can run two models in different modes at once.
#pragma once

#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "core/error.h"
#include "core/op_params.h"
#include "core/tensor.h"
#include "runtime/ops.h"

namespace dbrq {

namespace nn {
class Module;
}

struct OpCall;
using OpFn = Tensor (*)(const OpCall&);

struct OpCall {
  OpKind kind = OpKind::kNumOpKinds;
  // Tensor arguments in the op's documented order (activation first; for conv2d/linear then weight
  // and bias; an absent optional argument is an undefined tensor). Pointers into the caller's frame.
  absl::Span<const Tensor* const> inputs;
  const void* params = nullptr;  // the op's *Params struct, or null
  double scalar = 0.0;           // tensor-scalar binary ops
  bool has_scalar = false;
  bool scalar_first = false;     // `2.0 - x` rather than `x - 2.0`
  bool inplace = false;          // writes into *inputs[0] and returns it
  OpFn run = nullptr;            // eager implementation (f32; shape ops any dtype)

  const Tensor& input(size_t i) const { return *inputs[i]; }
  size_t num_inputs() const { return inputs.size(); }
  template <typename P>
  const P& p() const {
    return *static_cast<const P*>(params);
  }
};

using TensorPtrs = absl::InlinedVector<Tensor*, 8>;

class Interceptor {
 public:
  virtual ~Interceptor() = default;
  // Every op on this thread while installed. Must return what the op returns.
  virtual Tensor on_op(const OpCall& call) = 0;
  // Before a module's forward runs; may rewrite the tensors among its arguments in place.
  virtual void on_module_enter(nn::Module& module, absl::Span<Tensor* const> inputs) = 0;
  // After forward returned; may rewrite the tensors among its results in place.
  virtual void on_module_exit(nn::Module& module, absl::Span<Tensor* const> outputs) = 0;
  // Instead of on_module_exit when forward (or a hook) threw. Must restore per-call state.
  virtual void on_module_unwind(nn::Module& module) noexcept = 0;
  // When `module`'s forward threw a dbrq::Error that does not say where it happened yet
  // (!error.has_location()): may rethrow it with the module's name (rethrow_with_location). When it
  // returns, the original error propagates. Called before on_module_unwind, with the frame intact.
  virtual void on_module_error(nn::Module& module, const Error& error) {}
  // Whether it serves only the modules attached to it (a prepared model's interceptor). A module
  // attached to another interceptor (a module of another prepared model called from this one's
  // forward) then runs under its own, not this one. Observing interceptors (recorders, probes)
  // keep false and see every module called in their scope.
  virtual bool serves_only_its_modules() const { return false; }
};

namespace detail {
// Constant-initialized, so access compiles to one TLS load (no init guard).
inline thread_local Interceptor* tls_interceptor = nullptr;
}  // namespace detail

inline Interceptor* current_interceptor() { return detail::tls_interceptor; }

namespace detail {
inline thread_local uint64_t tls_op_identity_salt = 0;
}  // namespace detail

// The identity salt of the ops this thread runs now (0: none); see OpIdentityScope.
inline uint64_t op_identity_salt() { return detail::tls_op_identity_salt; }

// Marks the ops run in its scope as distinct, for the quantization tracer, from the same ops run
// outside it (docs/control_flow.md: an op's identity). A composed layer that applies the same
// functional code to several sets of weights (nn::GRU's layers) uses it so that each set gets its
// own records and ranges. Salt 0 is no salt. Scopes nest; the innermost one counts.
class OpIdentityScope {
 public:
  explicit OpIdentityScope(uint64_t salt) : saved_(detail::tls_op_identity_salt) {
    detail::tls_op_identity_salt = salt;
  }
  ~OpIdentityScope() { detail::tls_op_identity_salt = saved_; }
  OpIdentityScope(const OpIdentityScope&) = delete;
  OpIdentityScope& operator=(const OpIdentityScope&) = delete;

 private:
  uint64_t saved_;
};

// Installs an interceptor on this thread for the scope's lifetime (null suspends interception).
class InterceptorScope {
 public:
  explicit InterceptorScope(Interceptor* interceptor) : saved_(detail::tls_interceptor) {
    detail::tls_interceptor = interceptor;
  }
  ~InterceptorScope() { detail::tls_interceptor = saved_; }
  InterceptorScope(const InterceptorScope&) = delete;
  InterceptorScope& operator=(const InterceptorScope&) = delete;

 private:
  Interceptor* saved_;
};

namespace detail {
// Whether an error message already starts with an op's name ("conv2d: ...", "slice: ...").
bool names_an_op(const Error& e);
}  // namespace detail

inline Tensor dispatch(const OpCall& call) {
  Interceptor* interceptor = detail::tls_interceptor;
  if (__builtin_expect(interceptor != nullptr, 0)) return interceptor->on_op(call);
  // The handler costs nothing until something throws (table-driven unwinding). It makes every
  // error of an eager op name the op, including those from shared helpers such as dim wrapping
  // ("dim 5 is out of range for a 2-D tensor").
  try {
    return call.run(call);
  } catch (const Error& e) {
    if (e.has_location() || detail::names_an_op(e)) throw;
    e.rethrow_with_context(absl::StrCat(op_name(call.kind), ": "));
  }
}

}  // namespace dbrq
