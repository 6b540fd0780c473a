#include "bench/step/report.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bench/step/step_tables.hpp"
#include "trace/recorder.hpp"

namespace zmuon::bench {

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text << "\n";
  if (f.flush())
    return true;
  std::fprintf(stderr, "zmuon-bench-step: cannot write '%s'\n", path.c_str());
  return false;
}

std::string human(double bytes) {
  char buf[32];
  if (bytes >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  else if (bytes >= 1e3)
    std::snprintf(buf, sizeof buf, "%.2f kB", bytes / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

bytes_report report_bytes(const plan& pl, const std::vector<std::map<std::string, int64_t>>& sent,
                          int gas, int muon_elem, bool traced) {
  bytes_report out;
  const double ds_muon = deepspeed_muon_bytes(pl);
  for (int r = 0; r < static_cast<int>(sent.size()); ++r) {
    auto want = plan_bytes(pl, r, gas, muon_elem);
    auto got = sent[static_cast<size_t>(r)];
    std::set<std::string> kinds;
    for (const auto& [k, b] : want)
      kinds.insert(k);
    for (const auto& [k, b] : got)
      kinds.insert(k);
    int64_t plan_total = 0, trace_total = 0, plan_muon = 0, trace_muon = 0;
    for (const auto& k : kinds) {
      int64_t p = want.count(k) ? want[k] : 0, t = got.count(k) ? got[k] : 0;
      plan_total += p;
      trace_total += t;
      if (k == "gather" || k == "scatter") {
        plan_muon += p;
        trace_muon += t;
      }
      // The trace's payload bytes must be the plan's (at the transport's element size).
      if (traced && p != t) {
        out.mismatch = true;
        std::fprintf(stderr,
                     "zmuon-bench-step: rank %d %s: the trace says %lld bytes sent, the plan "
                     "%lld (%d bytes per Muon element)\n",
                     r, k.c_str(), static_cast<long long>(t), static_cast<long long>(p), muon_elem);
      }
    }
    const double muon = traced ? static_cast<double>(trace_muon) : plan_muon;
    const int64_t rs_bytes = traced ? (got.count("reduce_scatter") ? got["reduce_scatter"] : 0)
                                    : (want.count("reduce_scatter") ? want["reduce_scatter"] : 0);
    const double zmuon_total = static_cast<double>(rs_bytes) + muon;
    const double ds_total = static_cast<double>(rs_bytes) + ds_muon;
    std::string by_kind;
    for (const auto& k : kinds)
      by_kind += (by_kind.empty() ? "" : ", ") + k + " "
                 + human(traced ? (got.count(k) ? got[k] : 0) : want[k]);
    std::printf(
        "rank %d sends per step (%s): %s; total %s. Muon phase %s vs DeepSpeed ZeRO-3 scheme %s "
        "(%.2fx); with the reduce-scatters %s vs %s (%.2fx)\n",
        r, traced ? "trace, = plan" : "plan; nccl records nothing",
        by_kind.empty() ? "nothing" : by_kind.c_str(),
        human(traced ? trace_total : plan_total).c_str(), human(muon).c_str(),
        human(ds_muon).c_str(), muon > 0 ? ds_muon / muon : 0.0, human(zmuon_total).c_str(),
        human(ds_total).c_str(), zmuon_total > 0 ? ds_total / zmuon_total : 0.0);
    out.ranks.push_back(nlohmann::json{{"rank", r},
                                       {"trace_bytes", got},
                                       {"plan_bytes", want},
                                       {"reduce_scatter_bytes", rs_bytes},
                                       {"zmuon_muon_bytes", muon},
                                       {"deepspeed_muon_bytes", ds_muon}});
  }
  return out;
}

void add_call_times(call_times& sum, const call_times& step) {
  for (const auto& [name, t] : step) {
    auto& s = sum[name];
    s.calls += t.calls;
    s.ms += t.ms;
    s.busy_ms += t.busy_ms;
  }
}

nlohmann::json report_call_times(const call_times& sum, int steps) {
  const double n = std::max(steps, 1);
  nlohmann::json out = nlohmann::json::object();
  std::vector<std::pair<double, std::string>> by_busy;
  for (const auto& [name, t] : sum) {
    by_busy.emplace_back(t.busy_ms / n, name);
    out[name] = {
        {"calls", static_cast<double>(t.calls) / n}, {"ms", t.ms / n}, {"busy_ms", t.busy_ms / n}};
  }
  std::sort(by_busy.rbegin(), by_busy.rend());
  std::printf("per step (mean of %d): busy ms (sum of the calls' spans, calls)", steps);
  for (size_t i = 0; i < by_busy.size(); ++i) {
    const call_time& t = sum.at(by_busy[i].second);
    std::printf("%s %s %.3f (%.3f, %.0f)", i ? ";" : ":", by_busy[i].second.c_str(),
                by_busy[i].first, t.ms / n, static_cast<double>(t.calls) / n);
  }
  std::printf("\n");
  return out;
}

timeline_figures summarize_timeline(const std::vector<call_span>& spans) {
  timeline_figures t;
  if (spans.empty())
    return t;
  std::vector<std::pair<double, double>> by_start;
  for (const call_span& s : spans)
    by_start.emplace_back(s.start_ms, s.end_ms);
  std::sort(by_start.begin(), by_start.end());
  const double origin = by_start.front().first;
  double covered_to = origin;
  for (const auto& [start, end] : by_start) {
    if (start > covered_to) {
      const double gap = start - covered_to;
      t.idle_ms += gap;
      if (gap > t.longest_gap_ms) {
        t.longest_gap_ms = gap;
        t.longest_gap_at = covered_to - origin;
      }
    }
    covered_to = std::max(covered_to, end);
  }
  t.span_ms = covered_to - origin;
  for (const call_span& s : spans) {
    if (s.name != "newton_schulz")
      continue;
    if (t.first_ns_ms < 0 || s.start_ms - origin < t.first_ns_ms)
      t.first_ns_ms = s.start_ms - origin;
    t.last_ns_end_ms = std::max(t.last_ns_end_ms, s.end_ms - origin);
  }
  return t;
}

nlohmann::json report_timeline(const timeline_figures& t) {
  std::printf(
      "  %.3f ms from the first call to the last; nothing running %.3f ms (longest %.3f "
      "at %.3f)",
      t.span_ms, t.idle_ms, t.longest_gap_ms, t.longest_gap_at);
  if (t.first_ns_ms >= 0)
    std::printf("; Newton-Schulz from %.3f to %.3f, %.3f after it", t.first_ns_ms, t.last_ns_end_ms,
                t.span_ms - t.last_ns_end_ms);
  std::printf("\n");
  return {{"span_ms", t.span_ms},
          {"idle_ms", t.idle_ms},
          {"longest_gap_ms", t.longest_gap_ms},
          {"longest_gap_at_ms", t.longest_gap_at},
          {"first_ns_ms", t.first_ns_ms},
          {"last_ns_end_ms", t.last_ns_end_ms}};
}

int64_t trace_record_cost_ns(const std::string& dir) {
  auto rec = trace::recorder::open(dir, 99, 0, 1);
  if (!rec)
    return 0;
  trace::fields f;
  f.type = "ack";
  f.step = 7;
  f.index = 3;
  f.bytes = 123456;
  std::vector<double> per;
  for (int rep = 0; rep < 5; ++rep) {
    const int n = 20000;
    auto t0 = trace::now_ns();
    for (int i = 0; i < n; ++i)
      (*rec)->recv("muon_coordinator", t0, 1234, f, "r12.345");
    per.push_back(static_cast<double>(trace::now_ns() - t0) / n);
  }
  const std::string path = (*rec)->path();
  rec->reset();
  std::filesystem::remove(path);
  std::sort(per.begin(), per.end());
  return static_cast<int64_t>(per[per.size() / 2]);
}

}  // namespace zmuon::bench
