// `zmuon-trace summary`: per step, the time of each phase on each rank (sum of its spans; `step`
// is the host's wait for the rank's answer, `coordinator` the coordinator's own step from taking
// the request to its last answer) and the slowest rank (by `coordinator`); then message counts
// and bytes by type and by actor, and the trace's size per step.
#pragma once

#include <string>

#include "zmuon-trace/reader.hpp"

namespace zmuon::trace_tool {

std::string summary(const trace_set& ts);

}  // namespace zmuon::trace_tool
