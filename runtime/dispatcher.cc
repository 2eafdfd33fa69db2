#include "runtime/dispatcher.h"

#include <cstring>

namespace dbrq::detail {

bool names_an_op(const Error& e) {
  // "conv2d: ...", "int8 conv2d: ...", "slice: ...": a lower-case identifier (optionally after
  // "int8 ") followed by a colon. "dim 5 is out of range ..." is not.
  const char* m = e.what();
  if (std::strncmp(m, "int8 ", 5) == 0) m += 5;
  const char* p = m;
  while ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_') ++p;
  return p != m && *p == ':';
}

}  // namespace dbrq::detail
