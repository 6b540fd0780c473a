// The log's state: the level (atomic), and the sink and prefix under one mutex, so that the sink
// never runs twice at once.
#include "base/log.hpp"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <utility>

namespace zmuon {

namespace {

/// $ZMUON_LOG_LEVEL, else info; a bad value is said once and ignored.
log_level level_from_environment() {
  const char* env = std::getenv("ZMUON_LOG_LEVEL");
  if (env == nullptr || *env == '\0')
    return log_level::info;
  if (auto level = parse_log_level(env))
    return *level;
  std::string line = std::string("zmuon: ZMUON_LOG_LEVEL '") + env
                     + "' is not a level (error, warn, info, debug, trace); using info\n";
  std::fputs(line.c_str(), stderr);
  return log_level::info;
}

struct log_state {
  std::atomic<int> level{static_cast<int>(level_from_environment())};
  std::mutex mutex;  // guards sink and prefix, and is held while the sink runs
  log_sink sink;
  std::string prefix = "zmuon: ";
};

log_state& state() {
  static log_state s;  // built at the first use: the environment is read then, once
  return s;
}

// Set while this thread runs the sink: a message the sink logs itself goes straight to stderr
// (the mutex is held).
thread_local bool in_sink = false;

void to_stderr(const std::string& prefix, std::string_view message) {
  std::string line = prefix;
  line.append(message.data(), message.size());
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);  // one write: lines of threads stay whole
  std::fflush(stderr);
}

}  // namespace

void set_log_level(log_level level) {
  state().level.store(static_cast<int>(level), std::memory_order_relaxed);
}

log_level current_log_level() {
  return static_cast<log_level>(state().level.load(std::memory_order_relaxed));
}

void set_log_sink(log_sink sink) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.sink = std::move(sink);
}

void set_log_prefix(std::string prefix) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.prefix = std::move(prefix);
}

bool log_enabled(log_level level) {
  return static_cast<int>(level) <= state().level.load(std::memory_order_relaxed);
}

void log_write(log_level level, std::string_view message) noexcept {
  try {
    auto& s = state();
    if (in_sink) {
      to_stderr("zmuon: ", message);
      return;
    }
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.sink) {
      to_stderr(s.prefix, message);
      return;
    }
    in_sink = true;
    try {
      s.sink(level, message);
    } catch (const std::exception& e) {
      to_stderr(s.prefix, "the log sink threw (" + std::string(e.what())
                              + "); its message: " + std::string(message));
    } catch (...) {
      to_stderr(s.prefix, "the log sink threw; its message: " + std::string(message));
    }
    in_sink = false;
  } catch (...) {  // out of memory building a line: the message is lost, the caller goes on
    in_sink = false;
  }
}

const char* to_string(log_level level) {
  switch (level) {
    case log_level::error:
      return "error";
    case log_level::warn:
      return "warn";
    case log_level::info:
      return "info";
    case log_level::debug:
      return "debug";
    case log_level::trace:
      return "trace";
  }
  return "unknown";
}

std::optional<log_level> parse_log_level(std::string_view name) {
  std::string lower;
  for (char c : name)
    lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (auto level :
       {log_level::error, log_level::warn, log_level::info, log_level::debug, log_level::trace})
    if (lower == to_string(level))
      return level;
  return std::nullopt;
}

}  // namespace zmuon
