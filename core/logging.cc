#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

#include "core/error.h"

namespace dbrq {

std::shared_ptr<spdlog::logger>& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("dbrq");
    l->set_pattern("[dbrq %l] %v");
    l->set_level(spdlog::level::warn);
    if (const char* env = std::getenv("DBRQ_LOG_LEVEL"); env != nullptr && *env != '\0') {
      l->set_level(spdlog::level::from_str(env));
    }
    return l;
  }();
  return logger;
}

void set_log_level(const std::string& level) {
  const auto lvl = spdlog::level::from_str(level);
  DBRQ_ENSURE(lvl != spdlog::level::off || level == "off", ValueError, "unknown log level \"", level,
              "\"; expected trace, debug, info, warn, error, critical or off");
  log()->set_level(lvl);
}

}  // namespace dbrq
