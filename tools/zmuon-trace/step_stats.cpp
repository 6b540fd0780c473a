#include "zmuon-trace/step_stats.hpp"

#include <algorithm>
#include <climits>
#include <set>

namespace zmuon::trace_tool {

namespace {

const char* const coordinator = "muon_coordinator";

struct wait_less {
  bool operator()(const std::pair<const std::string*, int64_t>& a,
                  const std::pair<const std::string*, int64_t>& b) const {
    return a.second != b.second ? a.second < b.second : *a.first < *b.first;
  }
};

struct piece {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t start = 0;  // the span's own start (priority: the latest start wins)
  size_t order = 0;   // position in the rank's records (ties of start)
  const std::string* phase = nullptr;
};

// Cuts [w0, w1) among the spans: each elementary interval goes to the active span that started
// last, or to "other".
std::map<std::string, int64_t> exclusive_phases(const std::vector<piece>& spans, int64_t w0,
                                                int64_t w1) {
  std::map<std::string, int64_t> out;
  std::vector<int64_t> cuts{w0, w1};
  for (const auto& s : spans) {
    cuts.push_back(s.begin);
    cuts.push_back(s.end);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  out["other"] = 0;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    int64_t a = cuts[i], b = cuts[i + 1];
    if (a < w0 || b > w1 || b <= a)
      continue;
    const piece* best = nullptr;
    for (const auto& s : spans)
      if (s.begin <= a && s.end >= b
          && (!best || s.start > best->start || (s.start == best->start && s.order > best->order)))
        best = &s;
    out[best ? *best->phase : std::string("other")] += b - a;
  }
  return out;
}

}  // namespace

bool is_plumbing_actor(const std::string& actor) {
  return actor == coordinator || actor == "loss_scaler" || actor == "reducer";
}

int64_t rank_step::plumbing_net_ns(int64_t record_cost_ns) const {
  return std::max<int64_t>(0, plumbing_ns - plumbing_records * record_cost_ns);
}

std::vector<step_figures> step_stats(const trace_set& ts) {
  std::map<uint64_t, step_figures> steps;
  std::map<uint64_t, int64_t> first, last_host;
  for (const auto& rt : ts.ranks) {
    const auto& rs = rt.records;
    // Window of each step on this rank: the coordinator's step.
    std::map<uint64_t, std::pair<int64_t, int64_t>> window;
    for (const auto& r : rs) {
      if (r.step == 0)
        continue;
      auto f = first.find(r.step);
      if (f == first.end() || r.t < f->second)
        first[r.step] = r.t;
      if (r.actor == "host" && r.ev == "span" && r.phase == "step")
        last_host[r.step] = std::max(last_host[r.step], r.t + r.dur);
      if (r.actor != coordinator)
        continue;
      if (r.ev == "recv" && r.type == "step_request")
        window[r.step].first = r.t;
      window[r.step].second = std::max(window[r.step].second, r.t + r.dur);
    }
    // Wait spans end where their answer's continuation begins (trace::detail::on_reply).
    std::set<std::pair<const std::string*, int64_t>, wait_less> wait_ends;
    for (const auto& r : rs)
      if (r.ev == "span" && r.wait)
        wait_ends.insert({&r.actor, r.t + r.dur});
    for (const auto& [step, w] : window) {
      if (w.first == 0)
        continue;  // the step's request is not in the trace
      rank_step out;
      out.rank = rt.rank;
      out.window_ns = w.second - w.first;
      std::vector<piece> spans;
      for (size_t i = 0; i < rs.size(); ++i) {
        const auto& r = rs[i];
        if (r.step != step)
          continue;
        ++out.records;
        if (r.ev == "span" && r.actor != "host" && !r.is_compute()) {
          int64_t b = std::max(r.t, w.first), e = std::min(r.t + r.dur, w.second);
          if (e > b)
            spans.push_back(piece{b, e, r.t, i, &r.phase});
        }
        if (r.ev == "send" && r.peer >= 0 && !r.op.empty()) {
          out.sent_bytes[r.op] += r.bytes;
          ++out.sent_messages[r.op];
        }
        if ((r.ev == "recv" || r.ev == "reply") && is_plumbing_actor(r.actor)) {
          const int64_t a0 = r.t, a1 = r.t + r.dur;
          // Records written inside: a reply's own (written as the continuation returns) and the
          // wait span it began with; a handler's own `recv` is written after its `dur` ends.
          int64_t compute = 0;
          int64_t written =
              r.ev == "reply"
                  ? 1 + static_cast<int64_t>(wait_ends.count(std::make_pair(&r.actor, r.t)))
                  : 0;
          auto k = std::lower_bound(rs.begin(), rs.end(), a0,
                                    [](const record& x, int64_t t) { return x.t < t; });
          for (; k != rs.end() && k->t < a1; ++k) {
            // A wait span's `t` is its request's time, but it is written by the continuation
            // that takes the answer (counted there, above).
            if (&*k == &r || k->actor != r.actor || (k->ev == "span" && k->wait))
              continue;
            ++written;
            if (k->ev == "span" && !k->wait && k->t + k->dur <= a1)
              compute += k->dur;
          }
          out.plumbing_ns += std::max<int64_t>(0, r.dur - compute);
          out.plumbing_by[r.actor + " " + r.ev + " " + r.type] +=
              std::max<int64_t>(0, r.dur - compute);
          out.plumbing_records += written;
          ++out.activations;
        }
      }
      out.phase_ns = exclusive_phases(spans, w.first, w.second);
      auto& sf = steps[step];
      sf.step = step;
      sf.ranks.push_back(std::move(out));
    }
  }
  std::vector<step_figures> out;
  for (auto& [step, sf] : steps) {
    if (last_host.count(step))
      sf.wall_ns = last_host[step] - first[step];
    std::sort(sf.ranks.begin(), sf.ranks.end(),
              [](const rank_step& a, const rank_step& b) { return a.rank < b.rank; });
    out.push_back(std::move(sf));
  }
  return out;
}

}  // namespace zmuon::trace_tool
