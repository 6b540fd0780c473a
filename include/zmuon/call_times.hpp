// Where a rank's compute backend spends its time, by call: for benchmarks (the step's device
// time per phase) and diagnostics. Off unless switched on (engine::time_backend_calls).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace zmuon {

/// One backend call's name (compute_backend's method: "newton_schulz", "momentum", ...), how often
/// it ran and its summed time. On CUDA a call's time is the span of its own work on the stream
/// it ran on, measured with events: calls that ran side by side (Newton-Schulz lanes beside
/// main-stream work) each count in full, so the sums may exceed the wall time. On the host it is
/// the call's duration.
struct call_time {
  int64_t calls = 0;
  double ms = 0.0;
};

using call_times = std::map<std::string, call_time>;

}  // namespace zmuon
