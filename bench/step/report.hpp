// zmuon-bench-step's printed reports beside its timings: the bytes each rank sends (trace
// against plan, and DeepSpeed's scheme) and the compute backends' call times (--call-times,
// zmuon/call_times.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/plan.hpp"
#include "zmuon/call_times.hpp"

namespace zmuon::bench {

/// Writes `text` and a newline to `path`; false, after saying so on stderr, when it cannot.
bool write_file(const std::string& path, const std::string& text);

/// "12.34 MB", "5.60 kB", "7 B".
std::string human(double bytes);

/// The cost of one trace record (format, lock, buffered write) on this machine: the median of
/// 5 runs of 20000 records into a scratch file in `dir`, ns per record (0 if it cannot write).
int64_t trace_record_cost_ns(const std::string& dir);

struct bytes_report {
  nlohmann::json ranks = nlohmann::json::array();  // per rank: trace, plan and DeepSpeed bytes
  bool mismatch = false;                           // the trace and the plan disagree somewhere
};

/// Prints, per rank, the bytes it sends per step by collective kind, from the trace (`sent`, by
/// rank; `traced`: the caf comm records its sends) or else from the plan (plan_bytes, at
/// `muon_elem` bytes per Muon element), beside DeepSpeed's ZeRO-3 scheme and the ratio. Under
/// `traced` every kind must equal the plan's count: each difference is printed to stderr and
/// sets `mismatch`.
bytes_report report_bytes(const plan& pl, const std::vector<std::map<std::string, int64_t>>& sent,
                          int gas, int muon_elem, bool traced);

/// Adds one step's call times to `sum`, call by call.
void add_call_times(call_times& sum, const call_times& step);

/// Prints `sum` per step (mean over `steps`), the busiest call first: busy ms (summed spans ms,
/// calls), then a newline; returns the same figures per call as {"calls", "ms", "busy_ms"}.
nlohmann::json report_call_times(const call_times& sum, int steps);

/// One rank's step seen from its calls (engine::backend_call_spans), in ms from its first call:
/// where the device worked, where nothing ran, and where Newton-Schulz began and ended.
struct timeline_figures {
  double span_ms = 0;          // first call's start to last call's end
  double idle_ms = 0;          // inside the span, no call of any track running
  double longest_gap_ms = 0;   // the longest such stretch
  double longest_gap_at = 0;   // where it begins
  double first_ns_ms = -1;     // the first newton_schulz call's start (-1: none)
  double last_ns_end_ms = -1;  // the last one's end
};
timeline_figures summarize_timeline(const std::vector<call_span>& spans);

/// Prints `t` as one line; returns it as JSON.
nlohmann::json report_timeline(const timeline_figures& t);

}  // namespace zmuon::bench
