#include "zmuon-trace/perfetto.hpp"

#include <algorithm>
#include <map>

namespace zmuon::trace_tool {

using nlohmann::json;

namespace {

const char* const actors[] = {"host",        "reducer",          "partition_store",
                              "loss_scaler", "muon_coordinator", "caf_comm"};

double us(const trace_set& ts, int64_t t) {
  return static_cast<double>(t - ts.t0) / 1000.0;
}

json args_of(const record& r) {
  json a = {{"step", r.step}, {"seq", r.seq}};
  if (!r.op.empty())
    a["op"] = r.op;
  if (r.micro >= 0)
    a["micro"] = r.micro;
  if (r.index >= 0)
    a["index"] = r.index;
  if (r.bytes > 0)
    a["bytes"] = r.bytes;
  if (!r.id.empty())
    a["id"] = r.id;
  if (r.peer >= 0)
    a["peer"] = r.peer;
  if (r.overflow)
    a["overflow"] = *r.overflow;
  if (r.skipped)
    a["skipped"] = *r.skipped;
  if (!r.params.empty())
    a["params"] = r.params;
  if (r.track >= 0)
    a["track"] = r.track;
  if (!r.error.empty())
    a["error"] = r.error;
  return a;
}

}  // namespace

int actor_tid(const std::string& actor) {
  for (int i = 0; i < 6; ++i)
    if (actor == actors[i])
      return i + 1;
  return 7;
}

int record_tid(const record& r) {
  return r.is_compute() ? 8 + std::max(0, r.track) : actor_tid(r.actor);
}

namespace {

std::string track_name(const record& r) {
  if (r.is_compute())
    return r.track <= 0 ? "compute" : "compute, NS lane " + std::to_string(r.track - 1);
  return actor_tid(r.actor) == 7 ? "other" : r.actor;
}

}  // namespace

json to_perfetto(const trace_set& ts) {
  json events = json::array();
  for (const auto& rt : ts.ranks) {
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", rt.rank},
                      {"args",
                       {{"name", "rank " + std::to_string(rt.rank) + " (node "
                                     + std::to_string(rt.node) + ", " + rt.host + ")"}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", rt.rank},
                      {"args", {{"sort_index", rt.rank}}}});
    std::map<int, std::string> tracks;
    for (const auto& r : rt.records)
      tracks[record_tid(r)] = track_name(r);
    for (const auto& [tid, name] : tracks)
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", rt.rank},
                        {"tid", tid},
                        {"args", {{"name", name}}}});
  }
  // Slices, instants, and the receive of every message by its match key.
  struct end {
    int pid, tid;
    double ts;
    std::string type;
  };
  std::map<std::string, end> receives;
  int64_t async_id = 0;
  for (size_t i = 0; i < ts.ranks.size(); ++i) {
    const auto& rt = ts.ranks[i];
    for (const auto& r : rt.records) {
      int tid = record_tid(r);
      json e = {{"pid", rt.rank}, {"tid", tid}, {"ts", us(ts, r.t)}, {"args", args_of(r)}};
      if (r.ev == "send") {
        e["ph"] = "X";
        e["name"] = "send " + r.type;
        e["cat"] = "send";
        e["dur"] = 0.001;
      } else if (r.ev == "recv") {
        e["ph"] = "X";
        e["name"] = r.type;
        e["cat"] = "recv";
        e["dur"] = static_cast<double>(r.dur) / 1000.0;
        receives[ts.match_key(static_cast<int>(i), r)] = {rt.rank, tid, us(ts, r.t), r.type};
      } else if (r.ev == "span" && r.wait) {
        // Waits overlap each other and the actor's own slices: nestable async events, which
        // Perfetto draws on their own tracks under the process.
        ++async_id;
        e["ph"] = "b";
        e["name"] = r.phase;
        e["cat"] = "wait";
        e["id"] = async_id;
        events.push_back(e);
        e["ph"] = "e";
        e["ts"] = us(ts, r.t + r.dur);
        e.erase("args");
      } else if (r.ev == "span") {
        e["ph"] = "X";
        e["name"] = r.phase;
        e["cat"] = r.is_compute() ? "compute" : "phase";
        e["dur"] = static_cast<double>(r.dur) / 1000.0;
      } else if (r.ev == "reply") {
        e["ph"] = "i";
        e["s"] = "t";
        e["name"] = "reply " + r.type;
        e["cat"] = "reply";
      } else {
        continue;
      }
      events.push_back(std::move(e));
    }
  }
  // Flow arrows from each send to its receive.
  int64_t flow = 0;
  for (size_t i = 0; i < ts.ranks.size(); ++i) {
    const auto& rt = ts.ranks[i];
    for (const auto& r : rt.records) {
      if (r.ev != "send")
        continue;
      auto it = receives.find(ts.match_key(static_cast<int>(i), r));
      if (it == receives.end())
        continue;
      ++flow;
      events.push_back({{"ph", "s"},
                        {"id", flow},
                        {"name", r.type},
                        {"cat", "msg"},
                        {"pid", rt.rank},
                        {"tid", actor_tid(r.actor)},
                        {"ts", us(ts, r.t)}});
      events.push_back({{"ph", "f"},
                        {"bp", "e"},
                        {"id", flow},
                        {"name", r.type},
                        {"cat", "msg"},
                        {"pid", it->second.pid},
                        {"tid", it->second.tid},
                        {"ts", it->second.ts}});
    }
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ns"}};
}

}  // namespace zmuon::trace_tool
