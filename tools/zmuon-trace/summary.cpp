#include "zmuon-trace/summary.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

namespace zmuon::trace_tool {

namespace {

std::string ms(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1e6);
  return buf;
}

std::string cell(const std::string& s, int width) {
  return s.size() >= static_cast<size_t>(width) ? s + " " : s + std::string(width - s.size(), ' ');
}

const char* const phase_order[] = {"step",           "coordinator", "reduce_scatter", "flush",
                                   "overflow_check", "vote",        "unscale_clip",   "momentum",
                                   "gather",         "ns",          "scatter",        "apply",
                                   "adamw",          "qk_clip",     "finish",         "buffers"};

struct tally {
  int64_t count = 0;
  int64_t bytes = 0;
};

// The time during which at least one of the intervals [begin, end) ran.
int64_t busy(std::vector<std::pair<int64_t, int64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  int64_t total = 0, covered_to = INT64_MIN;
  for (const auto& [b, e] : spans)
    if (e > covered_to) {
      total += e - std::max(b, covered_to);
      covered_to = e;
    }
  return total;
}

}  // namespace

std::string summary(const trace_set& ts) {
  std::ostringstream os;
  // step -> phase -> rank -> ns
  std::map<uint64_t, std::map<std::string, std::map<int, int64_t>>> phases;
  std::map<uint64_t, bool> skipped;
  std::map<uint64_t, std::map<int, int64_t>> step_start, step_end;
  std::map<std::string, tally> by_type;
  std::map<std::string, std::pair<tally, tally>> by_actor;  // sent, received
  // step -> call -> rank -> the compute backend's calls ("all": every call)
  using intervals = std::vector<std::pair<int64_t, int64_t>>;
  std::map<uint64_t, std::map<std::string, std::map<int, intervals>>> calls;
  uint64_t bytes = 0;
  for (const auto& rt : ts.ranks) {
    bytes += rt.file_bytes;
    for (const auto& r : rt.records) {
      if (r.is_compute()) {
        calls[r.step][r.phase][rt.rank].emplace_back(r.t, r.t + r.dur);
        calls[r.step]["all"][rt.rank].emplace_back(r.t, r.t + r.dur);
        continue;
      }
      if (r.ev == "span")
        phases[r.step][r.phase][rt.rank] += r.dur;
      // The coordinator's own step: from taking the request to its last answer of the step.
      if (r.actor == "muon_coordinator" && r.ev == "recv" && r.type == "step_request")
        step_start[r.step][rt.rank] = r.t;
      if (r.actor == "muon_coordinator" && r.ev == "reply")
        step_end[r.step][rt.rank] = std::max(step_end[r.step][rt.rank], r.t + r.dur);
      if (r.ev == "reply" && r.overflow)
        skipped[r.step] = skipped[r.step] || *r.overflow;
      if (r.ev == "send") {
        auto& t = by_type[r.type];
        ++t.count;
        t.bytes += r.bytes;
        ++by_actor[r.actor].first.count;
        by_actor[r.actor].first.bytes += r.bytes;
      } else if (r.ev == "recv") {
        ++by_actor[r.actor].second.count;
        by_actor[r.actor].second.bytes += r.bytes;
      }
    }
  }
  for (const auto& [step, starts] : step_start)
    for (const auto& [rank, t] : starts)
      if (step_end[step].count(rank))
        phases[step]["coordinator"][rank] = step_end[step][rank] - t;
  os << "zmuon-trace summary: " << ts.ranks.size() << " rank file(s), " << phases.size()
     << " step(s); times in ms\n";
  for (const auto& n : ts.notes)
    os << "  " << n << "\n";
  std::vector<int> ranks;
  for (const auto& rt : ts.ranks)
    ranks.push_back(rt.rank);
  for (auto& step_phases : phases) {
    // Not a structured binding: the lambda below uses by_phase, which C++17 (clang) forbids.
    const auto& step = step_phases.first;
    auto& by_phase = step_phases.second;
    os << "\nstep " << step;
    if (skipped.count(step))
      os << (skipped[step] ? " (skipped: overflow)" : " (applied)");
    if (ts.cut && step >= *ts.cut)
      os << " (the run was cut short: records may be missing)";
    const char* total = by_phase.count("coordinator") ? "coordinator" : "step";
    if (by_phase.count(total)) {
      int slow = -1;
      int64_t worst = -1;
      for (const auto& [rank, ns] : by_phase[total])
        if (ns > worst) {
          worst = ns;
          slow = rank;
        }
      os << "  slowest rank " << slow << " (" << ms(worst) << " ms)";
    }
    os << "\n  " << cell("phase", 16);
    for (int r : ranks)
      os << cell("rank " + std::to_string(r), 11);
    os << "\n";
    std::set<std::string> shown;
    auto row = [&](const std::string& phase) {
      if (!by_phase.count(phase) || shown.count(phase))
        return;
      shown.insert(phase);
      os << "  " << cell(phase, 16);
      for (int r : ranks) {
        auto it = by_phase[phase].find(r);
        os << cell(it == by_phase[phase].end() ? "-" : ms(it->second), 11);
      }
      os << "\n";
    };
    for (const char* p : phase_order)
      row(p);
    for (const auto& [p, v] : by_phase)
      row(p);
    if (!calls.count(step))
      continue;
    // The backend's own record of its work: on CUDA the device's time, so this is where the
    // enqueue-only spans above (ns on CUDA) find what the work took.
    os << "  compute calls, busy (time during which one of them ran)\n";
    for (auto& [call, by_rank] : calls[step]) {
      os << "  " << cell(call, 16);
      for (int r : ranks) {
        auto it = by_rank.find(r);
        os << cell(it == by_rank.end() ? "-" : ms(busy(it->second)), 11);
      }
      os << "\n";
    }
  }
  os << "\nmessages sent, by type (all ranks)\n  " << cell("type", 22) << cell("count", 10)
     << "bytes\n";
  for (const auto& [type, t] : by_type)
    os << "  " << cell(type, 22) << cell(std::to_string(t.count), 10) << t.bytes << "\n";
  os << "\nmessages by actor (all ranks)\n  " << cell("actor", 18) << cell("sent", 10)
     << cell("sent bytes", 14) << cell("handled", 10) << "handled bytes\n";
  for (const auto& [actor, st] : by_actor)
    os << "  " << cell(actor, 18) << cell(std::to_string(st.first.count), 10)
       << cell(std::to_string(st.first.bytes), 14) << cell(std::to_string(st.second.count), 10)
       << st.second.bytes << "\n";
  os << "\ntrace size: " << bytes << " bytes";
  if (!phases.empty())
    os << ", " << bytes / phases.size() << " bytes per step (all ranks)";
  os << "\n";
  return os.str();
}

}  // namespace zmuon::trace_tool
