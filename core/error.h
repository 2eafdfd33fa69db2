// dbrq's exception hierarchy.
//
// The eager API throws: a user's `forward` is plain C++ and `relu(conv(x)) + y` must stay readable.
// Every error derives from dbrq::Error, and every message says what failed, with which value, under
// which rule, and where (module fqn and op index when there is one). Catch a specific type to
// react to one kind of failure:
//
//   try {
//     auto y = (*model)(x);
//   } catch (const dbrq::ShapeError& e) {
//     std::cerr << e.what() << "\n";   // "conv2d: input must have 4 dims (N, C, H, W), got [3, 224]..."
//   }
//
// Internal invariants (bugs in dbrq itself) use DBRQ_CHECK, which aborts with a message.
#pragma once

#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"

namespace dbrq {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  // Throws a copy of this error, of the same dynamic type, whose message is `context` + what().
  // Used to add what was being done (e.g. "prepare: the example run failed: ") as it propagates.
  [[noreturn]] void rethrow_with_context(const std::string& context) const {
    rethrow_as(context, has_location_);
    __builtin_unreachable();  // rethrow_as always throws; GCC does not trust [[noreturn]] on virtuals
  }
  // The same, for the place the error happened ("in module \"layer1.0\" (BasicBlock), op 3 conv2d
  // (layer1.0.conv2): "). The innermost place that knows it adds it; callers check has_location()
  // so that an error crossing nested modules or ops is located once.
  [[noreturn]] void rethrow_with_location(const std::string& location) const {
    rethrow_as(location, true);
    __builtin_unreachable();
  }
  bool has_location() const { return has_location_; }

 protected:
  [[noreturn]] virtual void rethrow_as(const std::string& prefix, bool located) const {
    Error e(prefix + what());
    e.has_location_ = located;
    throw e;
  }
  bool has_location_ = false;
};

#define DBRQ_DEFINE_ERROR(Name)                                                    \
  class Name : public Error {                                                      \
   public:                                                                         \
    using Error::Error;                                                            \
                                                                                   \
   protected:                                                                      \
    [[noreturn]] void rethrow_as(const std::string& prefix, bool located) const override { \
      Name e(prefix + what());                                                     \
      e.has_location_ = located;                                                   \
      throw e;                                                                     \
    }                                                                              \
  }

// A tensor's sizes do not fit the op (rank, broadcast, channel count, state-dict shape, ...).
DBRQ_DEFINE_ERROR(ShapeError);
// A tensor's dtype is not one the op accepts.
DBRQ_DEFINE_ERROR(DTypeError);
// An argument value is out of its domain (negative stride, unknown option name, bad dim, ...).
DBRQ_DEFINE_ERROR(ValueError);
// An index or key is out of range.
DBRQ_DEFINE_ERROR(IndexError);
// A prepared or converted model ran a different sequence of quantizeable ops than it recorded.
DBRQ_DEFINE_ERROR(ControlFlowError);
// convert() needs calibration statistics that are missing.
DBRQ_DEFINE_ERROR(NotCalibratedError);
// The API was used in an order it does not support (convert before prepare, calibrate after
// convert, ...).
DBRQ_DEFINE_ERROR(UsageError);
// A file's contents do not follow its format (safetensors, quant-state JSON).
DBRQ_DEFINE_ERROR(FileFormatError);
// A file could not be opened, read or written.
DBRQ_DEFINE_ERROR(IOError);
// load_state_dict: missing or unexpected keys.
DBRQ_DEFINE_ERROR(StateDictError);
// A quant-state file does not match the model it is loaded into.
DBRQ_DEFINE_ERROR(StateMismatchError);
// A backend (oneDNN) failed for a reason that is not the caller's input.
DBRQ_DEFINE_ERROR(BackendError);

#undef DBRQ_DEFINE_ERROR

namespace detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace dbrq

// Throws `Type` with a message built by absl::StrCat from the remaining arguments.
#define DBRQ_THROW(Type, ...) throw Type(::absl::StrCat(__VA_ARGS__))

// Throws `Type` unless `cond` holds.
#define DBRQ_ENSURE(cond, Type, ...)        \
  do {                                      \
    if (!(cond)) DBRQ_THROW(Type, __VA_ARGS__); \
  } while (0)

// Internal invariant: aborts the process with a message. Never used for user input.
#define DBRQ_CHECK(cond, ...)                                                             \
  do {                                                                                    \
    if (!(cond)) ::dbrq::detail::check_failed(__FILE__, __LINE__, #cond, ::absl::StrCat(__VA_ARGS__)); \
  } while (0)
