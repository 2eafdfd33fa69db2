#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace dbrq::detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "dbrq internal check failed at %s:%d: %s %s\n", file, line, cond, msg.c_str());
  std::abort();
}

}  // namespace dbrq::detail
