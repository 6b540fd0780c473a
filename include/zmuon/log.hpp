// zmuon's log: every diagnostic of the library (a lost node, a route through node 0) goes to one
// sink, at a level the host chooses. By default the sink is stderr, each line prefixed "zmuon: ".
//
//   zmuon::set_log_level(zmuon::log_level::warn);
//   zmuon::set_log_sink([](zmuon::log_level level, std::string_view msg) { ... });
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace zmuon {

/// From the most to the least severe.
enum class log_level : int { error = 0, warn = 1, info = 2, debug = 3, trace = 4 };

/// Receives each message that passes the level: one line, no newline. One call at a time, from
/// whichever thread logs (often an actor's), so it should return quickly. An exception it
/// throws is caught; the message then goes to stderr.
using log_sink = std::function<void(log_level level, std::string_view message)>;

/// Messages at `level` or more severe pass. The initial level is $ZMUON_LOG_LEVEL (read once,
/// at the first use of the log), else info.
void set_log_level(log_level level);
log_level current_log_level();

/// Replaces the sink; an empty one restores the default (stderr with the prefix).
void set_log_sink(log_sink sink);

/// The default sink's prefix: "zmuon: ", unless a tool sets its own ("zmuon-launch[node 1]: ").
void set_log_prefix(std::string prefix);

/// "error", "warn", "info", "debug", "trace".
const char* to_string(log_level level);

/// The level with that name (as to_string writes it, any case), or nothing.
std::optional<log_level> parse_log_level(std::string_view name);

}  // namespace zmuon
