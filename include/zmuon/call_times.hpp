// Where a rank's compute backend spends its time, by call: for benchmarks (the step's device
// time per phase) and diagnostics. Off unless switched on (engine::time_backend_calls).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zmuon {

/// One backend call (compute_backend's method: "newton_schulz", "momentum", ...) over a timing
/// period: how often it ran, its calls' summed time, and its busy time, the time during which at
/// least one of its calls ran. On CUDA a call's time is the span of its own work on the stream it
/// ran on, measured with events. Calls that run side by side (Newton-Schulz on its lanes) share
/// the device, so each one's span is longer and `ms` exceeds the device time they took together;
/// `busy_ms` does not. On the host a call's time is its duration.
struct call_time {
  int64_t calls = 0;
  double ms = 0.0;
  double busy_ms = 0.0;
};

using call_times = std::map<std::string, call_time>;

/// One call's span within a timing period, for timelines: ms since the period began on the
/// host's steady clock (CUDA: the call's device events, mapped onto that clock through an event
/// recorded on an idle stream, to within the few microseconds such an event takes to pass), and
/// the track it ran on: 0 the rank's main stream (host: the calling thread), 1.. CUDA's
/// Newton-Schulz lanes, kHostTrack an engine call on the caller's thread (its host time, beside
/// the device's).
struct call_span {
  static constexpr int kHostTrack = -1;
  std::string name;
  int track = 0;
  double start_ms = 0.0;
  double end_ms = 0.0;
};

/// Calls by rank as Chrome Trace Event JSON, which Perfetto (ui.perfetto.dev) and
/// chrome://tracing open: a process per rank, a thread per track ("main stream", "NS lane i";
/// "host calls" when not `cuda`; "engine calls" for kHostTrack, category "host", the others
/// "call"), an "X" slice per call, times in microseconds of each rank's own clock from its
/// first call.
std::string call_timeline_json(const std::map<int, std::vector<call_span>>& by_rank, bool cuda);

}  // namespace zmuon
