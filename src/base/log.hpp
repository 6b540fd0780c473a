// The library's own logging, for every layer: ZMUON_LOG_WARN("no direct connection to " + x).
// The message is built only when its level passes. The sink and level are zmuon/log.hpp's.
#pragma once

#include <string_view>

#include "zmuon/log.hpp"

namespace zmuon {

/// Whether a message at `level` passes (a relaxed atomic read).
bool log_enabled(log_level level);

/// Hands `message` to the sink, under the log's mutex. Never throws.
void log_write(log_level level, std::string_view message) noexcept;

}  // namespace zmuon

#define ZMUON_LOG(level, message)             \
  do {                                        \
    if (::zmuon::log_enabled(level))          \
      ::zmuon::log_write((level), (message)); \
  } while (false)

#define ZMUON_LOG_ERROR(message) ZMUON_LOG(::zmuon::log_level::error, message)
#define ZMUON_LOG_WARN(message) ZMUON_LOG(::zmuon::log_level::warn, message)
#define ZMUON_LOG_INFO(message) ZMUON_LOG(::zmuon::log_level::info, message)
#define ZMUON_LOG_DEBUG(message) ZMUON_LOG(::zmuon::log_level::debug, message)
#define ZMUON_LOG_TRACE(message) ZMUON_LOG(::zmuon::log_level::trace, message)
