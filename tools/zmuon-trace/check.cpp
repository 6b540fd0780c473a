#include "zmuon-trace/check.hpp"

#include <cstdio>
#include <map>
#include <set>
#include <sstream>

namespace zmuon::trace_tool {

namespace {

bool is_report(const record& r) {
  return r.ev == "reply" && r.type == "overflow_report" && r.overflow.has_value();
}

bool is_ns(const record& r) {
  return r.ev == "span" && r.phase == "ns";
}

// A momentum request whose new momentum goes to the store's spare (u and the spare, the momentum
// left as it was), which a step whose Muon chunks go ahead of the vote
// (zmuon.momentum_before_vote) sends before the overflow report.
bool is_spare_write(const record& r) {
  return r.type == "muon_momentum" && r.op == "spare";
}

// Muon work the coordinator starts that writes the step's state or needs its report: momentum,
// gather, scatter, apply (its requests).
const char* muon_request(const record& r) {
  if (r.ev != "send" || r.actor != "muon_coordinator")
    return nullptr;
  if (r.type == "muon_momentum")
    return is_spare_write(r) ? nullptr : "momentum";
  if (r.type == "all_to_all_req")
    return r.op == "gather" ? "gather" : "scatter";
  if (r.type == "apply_muon")
    return "apply";
  return nullptr;
}

bool is_collective(const record& r) {
  return r.ev == "recv" && r.actor == "caf_comm"
         && (r.type == "reduce_scatter_req" || r.type == "all_reduce_req"
             || r.type == "all_to_all_req");
}

std::string collective_name(const record& r) {
  std::string s = r.op + "(step " + std::to_string(r.step);
  if (r.micro >= 0)
    s += ", micro " + std::to_string(r.micro);
  if (r.index >= 0)
    s += std::string(r.op == "reduce_scatter" ? ", bucket " : ", chunk ") + std::to_string(r.index);
  return s + ")";
}

std::string param_name(const trace_set& ts, int p) {
  for (const auto& rt : ts.ranks)
    if (auto it = rt.muon.find(p); it != rt.muon.end())
      return std::to_string(p) + " '" + it->second + "'";
  return std::to_string(p);
}

// Whether the checks look at a step: all of them, except in a run cut short (trace_set::cut) the
// step some rank's file ends in and later ones, whose records may be incomplete.
bool checked(const trace_set& ts, uint64_t step) {
  return !ts.cut || step < *ts.cut;
}

// Whether `answered` looks at a step: as checked(), and in a run cut short not the step before
// the cut either. A `reply` record is written when its continuation returns, and the one that
// ends a step (finish_step's, discard_grads') answers the host inside it: the host's next step
// may then write its first records before that reply's, which a cut can lose with them.
bool answers_checked(const trace_set& ts, uint64_t step) {
  return !ts.cut || step + 1 < *ts.cut;
}

// Per rank, the steps whose Muon chunks went ahead of the vote: their u and Newton-Schulz may
// run before the report, and in a refused step, writing nothing the step keeps.
using ahead_steps = std::set<std::pair<int, uint64_t>>;  // (rank, step)

ahead_steps steps_ahead(const trace_set& ts) {
  ahead_steps out;
  for (const auto& rt : ts.ranks)
    for (const auto& r : rt.records)
      if (r.ev == "send" && r.actor == "muon_coordinator" && is_spare_write(r))
        out.insert({rt.rank, r.step});
  return out;
}

// Steps whose overflow report says overflow on some rank, and every step reported at all.
void steps_of(const trace_set& ts, std::set<uint64_t>& all, std::set<uint64_t>& skipped) {
  for (const auto& rt : ts.ranks)
    for (const auto& r : rt.records)
      if (is_report(r) && checked(ts, r.step)) {
        all.insert(r.step);
        if (*r.overflow)
          skipped.insert(r.step);
      }
}

void ns_once(const trace_set& ts, const std::set<uint64_t>& all, const std::set<uint64_t>& skipped,
             const ahead_steps& ahead, std::vector<violation>& out) {
  std::set<int> muon;
  for (const auto& rt : ts.ranks)
    for (const auto& [p, name] : rt.muon)
      muon.insert(p);
  // step -> parameter -> the NS records that name it
  std::map<uint64_t, std::map<int, std::vector<const record*>>> ns;
  for (const auto& rt : ts.ranks)
    for (const auto& r : rt.records)
      if (is_ns(r) && checked(ts, r.step))
        for (int p : r.params)
          ns[r.step][p].push_back(&r);
  for (const auto& [step, by_param] : ns) {
    for (const auto& [p, recs] : by_param) {
      if (skipped.count(step) && !ahead.count({recs.front()->rank, step})) {
        out.push_back({"ns_once", recs.front()->rank, step,
                       "NS of Muon parameter " + param_name(ts, p) + " ran on skipped step "
                           + std::to_string(step),
                       recs});
      } else if (recs.size() > 1) {
        out.push_back({"ns_once", recs.back()->rank, step,
                       "NS of Muon parameter " + param_name(ts, p) + " ran "
                           + std::to_string(recs.size())
                           + " times in one step (expected exactly once)",
                       recs});
      } else if (!muon.empty() && !muon.count(p)) {
        out.push_back({"ns_once", recs.front()->rank, step,
                       "NS of parameter " + std::to_string(p) + ", which is not a Muon parameter",
                       recs});
      }
    }
  }
  for (uint64_t step : all) {
    if (skipped.count(step))
      continue;
    for (int p : muon)
      if (!ns.count(step) || !ns[step].count(p))
        out.push_back({"ns_once",
                       -1,
                       step,
                       "NS of Muon parameter " + param_name(ts, p) + " never ran in applied step "
                           + std::to_string(step),
                       {}});
  }
}

void after_report(const trace_set& ts, const ahead_steps& ahead, std::vector<violation>& out) {
  for (const auto& rt : ts.ranks) {
    std::set<uint64_t> reported;  // steps whose report this rank has seen, in time order
    std::set<uint64_t> flagged;
    for (const auto& r : rt.records) {
      if (is_report(r)) {
        reported.insert(r.step);
        continue;
      }
      if (!(is_ns(r) || muon_request(r)) || reported.count(r.step) || flagged.count(r.step)
          || !checked(ts, r.step) || (is_ns(r) && ahead.count({rt.rank, r.step})))
        continue;
      flagged.insert(r.step);  // the first one of the step is enough
      const record* report = nullptr;
      for (const auto& q : rt.records)
        if (is_report(q) && q.step == r.step)
          report = &q;
      std::string what = is_ns(r) ? "NS" : muon_request(r);
      std::vector<const record*> recs{&r};
      if (report)
        recs.push_back(report);
      out.push_back({"after_report", rt.rank, r.step,
                     what + " of step " + std::to_string(r.step)
                         + (report ? " before the overflow report of that step"
                                   : " without an overflow report of that step"),
                     recs});
    }
  }
}

void momentum(const trace_set& ts, const std::set<uint64_t>& skipped, std::vector<violation>& out) {
  for (const auto& rt : ts.ranks)
    for (const auto& r : rt.records)
      if (r.ev == "recv" && r.type == "muon_momentum" && !is_spare_write(r) && skipped.count(r.step)
          && checked(ts, r.step))
        out.push_back({"momentum",
                       rt.rank,
                       r.step,
                       "momentum write (muon_momentum, chunk " + std::to_string(r.index)
                           + ") on skipped step " + std::to_string(r.step),
                       {&r}});
}

// NorMuon's row moments change only in normuon_step, which the coordinator sends after the
// overflow vote of an applied step: none may reach a store in a skipped step.
void normuon(const trace_set& ts, const std::set<uint64_t>& skipped, std::vector<violation>& out) {
  for (const auto& rt : ts.ranks)
    for (const auto& r : rt.records)
      if (r.ev == "recv" && r.type == "normuon_step" && skipped.count(r.step)
          && checked(ts, r.step))
        out.push_back({"normuon",
                       rt.rank,
                       r.step,
                       "NorMuon row-moment write (normuon_step, chunk " + std::to_string(r.index)
                           + ") on skipped step " + std::to_string(r.step),
                       {&r}});
}

// The compute backend's own record of the calls that change the optimizer's state: none in a
// skipped step, and none of a step before that rank's overflow report (a check below the
// messages: it sees the work itself, on CUDA when the device ran it). Device times are mapped
// onto the host's clock to within a few microseconds (compute_backend::trace_calls), hence the
// slack.
void compute_after_report(const trace_set& ts, const std::set<uint64_t>& skipped,
                          const ahead_steps& ahead, std::vector<violation>& out) {
  static const std::set<std::string> updates{"momentum", "newton_schulz", "apply_update", "adamw",
                                             "normuon"};
  // What a step whose chunks went ahead of the vote runs before its report, and in a refused
  // step: the momentum into the spare (on CUDA `momentum_spare`, no update; on the host
  // backend the momentum call on the spare's copy of m, `momentum`) and NS on its u.
  static const std::set<std::string> ahead_calls{"momentum", "newton_schulz"};
  const int64_t slack_ns = 50'000;
  for (const auto& rt : ts.ranks) {
    std::map<uint64_t, const record*> report;  // this rank's, by step
    for (const auto& r : rt.records)
      if (is_report(r) && !report.count(r.step))
        report[r.step] = &r;
    std::set<uint64_t> flagged;  // the first early call of a step is enough
    for (const auto& r : rt.records) {
      if (!r.is_compute() || !updates.count(r.phase) || !checked(ts, r.step)
          || (ahead.count({rt.rank, r.step}) && ahead_calls.count(r.phase)))
        continue;
      const std::string step = std::to_string(r.step);
      if (skipped.count(r.step)) {
        out.push_back({"compute",
                       rt.rank,
                       r.step,
                       "compute call " + r.phase + " ran in skipped step " + step,
                       {&r}});
        continue;
      }
      auto it = report.find(r.step);
      if (it == report.end() || r.t >= it->second->t - slack_ns || !flagged.insert(r.step).second)
        continue;
      char early[32];
      std::snprintf(early, sizeof early, "%.3f", static_cast<double>(it->second->t - r.t) / 1e6);
      out.push_back({"compute",
                     rt.rank,
                     r.step,
                     "compute call " + r.phase + " of step " + step + " began " + early
                         + " ms before the overflow report of that step",
                     {&r, it->second}});
    }
  }
}

// The first position where the ranks' sequences disagree; the expected collective there is the
// one most ranks issued (ties: the lowest rank's), and every rank that issued another is reported.
void collectives(const trace_set& ts, std::vector<violation>& out) {
  if (ts.ranks.size() < 2)
    return;
  std::vector<std::vector<const record*>> seq(ts.ranks.size());
  size_t longest = 0;
  for (size_t i = 0; i < ts.ranks.size(); ++i) {
    for (const auto& r : ts.ranks[i].records)
      if (is_collective(r) && checked(ts, r.step))
        seq[i].push_back(&r);
    longest = std::max(longest, seq[i].size());
  }
  auto at = [&](size_t i, size_t k) {
    return k < seq[i].size() ? collective_name(*seq[i][k]) : std::string("nothing");
  };
  for (size_t k = 0; k < longest; ++k) {
    std::map<std::string, size_t> votes;  // op -> ranks that issued it here
    for (size_t i = 0; i < seq.size(); ++i)
      ++votes[at(i, k)];
    if (votes.size() == 1)
      continue;
    std::string want = at(0, k);
    for (size_t i = 0; i < seq.size(); ++i)
      if (votes[at(i, k)] > votes[want])
        want = at(i, k);
    const record* want_rec = nullptr;
    for (size_t i = 0; i < seq.size() && !want_rec; ++i)
      if (at(i, k) == want && k < seq[i].size())
        want_rec = seq[i][k];
    for (size_t i = 0; i < seq.size(); ++i) {
      if (at(i, k) == want)
        continue;
      const record* got = k < seq[i].size() ? seq[i][k] : nullptr;
      std::vector<const record*> recs;
      if (want_rec)
        recs.push_back(want_rec);
      if (got)
        recs.push_back(got);
      out.push_back({"collectives", ts.ranks[i].rank, want_rec ? want_rec->step : got->step,
                     "collective #" + std::to_string(k + 1) + " differs from "
                         + std::to_string(votes[want]) + " of " + std::to_string(seq.size())
                         + " ranks: expected " + want + ", found " + at(i, k),
                     recs});
    }
    return;  // the first divergence only: later positions are shifted by it
  }
}

void answered(const trace_set& ts, std::vector<violation>& out) {
  std::set<std::string> replies;
  for (size_t i = 0; i < ts.ranks.size(); ++i)
    for (const auto& r : ts.ranks[i].records)
      if (r.ev == "reply")
        replies.insert(ts.match_key(static_cast<int>(i), r));
  for (size_t i = 0; i < ts.ranks.size(); ++i)
    for (const auto& r : ts.ranks[i].records)
      if (r.ev == "send" && r.req && answers_checked(ts, r.step)
          && !replies.count(ts.match_key(static_cast<int>(i), r)))
        out.push_back(
            {"answered",
             ts.ranks[i].rank,
             r.step,
             "request " + r.type + " (id " + r.id + ") from " + r.actor + " was never answered",
             {&r}});
}

// MuonClip scales weights after the update of an applied step only.
void qk_clip(const trace_set& ts, const std::set<uint64_t>& skipped, std::vector<violation>& out) {
  for (const auto& rt : ts.ranks)
    for (const auto& r : rt.records)
      if (r.ev == "span" && r.phase == "qk_clip" && skipped.count(r.step) && checked(ts, r.step))
        out.push_back({"qk_clip",
                       r.rank,
                       r.step,
                       "MuonClip scaled query/key heads on skipped step " + std::to_string(r.step),
                       {&r}});
}

}  // namespace

std::vector<violation> check(const trace_set& ts) {
  std::vector<violation> out;
  std::set<uint64_t> all, skipped;
  steps_of(ts, all, skipped);
  const ahead_steps ahead = steps_ahead(ts);
  ns_once(ts, all, skipped, ahead, out);
  after_report(ts, ahead, out);
  momentum(ts, skipped, out);
  normuon(ts, skipped, out);
  compute_after_report(ts, skipped, ahead, out);
  qk_clip(ts, skipped, out);
  collectives(ts, out);
  answered(ts, out);
  return out;
}

std::string format(const trace_set& ts, const violation& v) {
  std::ostringstream os;
  os << "[" << v.rule << "] ";
  if (v.rank >= 0)
    os << "rank " << v.rank;
  else
    os << "all ranks";
  os << ", step " << v.step << ": " << v.message << "\n";
  for (const auto* r : v.records)
    os << "    rank " << r->rank << " " << where(ts, *r) << "  " << r->text << "\n";
  return os.str();
}

}  // namespace zmuon::trace_tool
