// dbrq's logger: spdlog, quiet (warnings and errors only) unless DBRQ_LOG_LEVEL says otherwise
// (trace, debug, info, warn, error, critical, off). oneDNN's own ONEDNN_VERBOSE still works.
//
//   dbrq::log()->info("prepare: {} modules with state", n);
#pragma once

#include <spdlog/spdlog.h>

#include <memory>

namespace dbrq {

std::shared_ptr<spdlog::logger>& log();
// Overrides DBRQ_LOG_LEVEL for this process, e.g. set_log_level("info").
void set_log_level(const std::string& level);

}  // namespace dbrq
