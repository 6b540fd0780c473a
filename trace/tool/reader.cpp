#include "trace/tool/reader.hpp"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <regex>

namespace zmuon::trace_tool {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

template <class T>
void get(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it != j.end() && !it->is_null())
    out = it->get<T>();
}

expected<rank_trace> read_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in)
    return error{errc::io_error, "cannot read '" + path.string() + "'"};
  rank_trace rt;
  rt.file = path.string();
  rt.file_bytes = fs::file_size(path);
  std::string line;
  size_t n = 0;
  bool meta = false;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty())
      continue;
    auto here = rt.file + ":" + std::to_string(n);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      return error{errc::invalid_argument, here + ": not JSON (" + e.what() + ")"};
    }
    if (!j.is_object() || !j.contains("ev") || !j["ev"].is_string())
      return error{errc::invalid_argument, here + ": a record needs a string \"ev\""};
    try {
      auto ev = j["ev"].get<std::string>();
      if (ev == "meta") {
        get(j, "node", rt.node);
        get(j, "rank", rt.rank);
        get(j, "world", rt.world);
        get(j, "host", rt.host);
        get(j, "pid", rt.pid);
        meta = true;
        continue;
      }
      if (ev == "plan") {
        for (const auto& p : j.at("muon_params"))
          rt.muon[p.at(0).get<int>()] = p.at(1).get<std::string>();
        get(j, "chunks", rt.chunks);
        continue;
      }
      record r;
      r.line = n;
      r.ev = ev;
      r.text = line;
      get(j, "seq", r.seq);
      get(j, "t", r.t);
      get(j, "dur", r.dur);
      get(j, "actor", r.actor);
      get(j, "type", r.type);
      get(j, "op", r.op);
      get(j, "phase", r.phase);
      get(j, "id", r.id);
      get(j, "error", r.error);
      get(j, "step", r.step);
      get(j, "micro", r.micro);
      get(j, "index", r.index);
      get(j, "bytes", r.bytes);
      get(j, "peer", r.peer);
      get(j, "req", r.req);
      get(j, "wait", r.wait);
      get(j, "track", r.track);
      if (j.contains("overflow"))
        r.overflow = j["overflow"].get<bool>();
      if (j.contains("skipped"))
        r.skipped = j["skipped"].get<bool>();
      get(j, "params", r.params);
      rt.records.push_back(std::move(r));
    } catch (const json::exception& e) {
      return error{errc::invalid_argument, here + ": bad field (" + e.what() + ")"};
    }
  }
  if (!meta)
    return error{errc::invalid_argument, rt.file + ": no meta record (not a zmuon trace)"};
  for (auto& r : rt.records)
    r.rank = rt.rank;
  return rt;
}

bool is_peer(const record& r) {
  return !r.id.empty() && r.id[0] == 'p';
}

// Aligns every host's clock to the reference host (that of the lowest rank).
void align(trace_set& ts) {
  if (ts.ranks.empty())
    return;
  const std::string ref = ts.ranks[0].host;
  std::map<std::string, int64_t> offsets;
  for (const auto& rt : ts.ranks) {
    if (rt.host == ref || offsets.count(rt.host))
      continue;
    // Sends and receives of peer messages by id, on the reference host and on this one.
    std::map<std::string, int64_t> send_ref, recv_ref, send_b, recv_b;
    for (const auto& q : ts.ranks) {
      if (q.host != ref && q.host != rt.host)
        continue;
      for (const auto& r : q.records) {
        if (!is_peer(r))
          continue;
        auto& m = r.ev == "send" ? (q.host == ref ? send_ref : send_b)
                                 : (q.host == ref ? recv_ref : recv_b);
        if (r.ev == "send" || r.ev == "recv")
          m[r.id] = r.t;
      }
    }
    int64_t d_ab = LLONG_MAX, d_ba = LLONG_MAX;
    for (const auto& [id, t] : send_ref)
      if (auto it = recv_b.find(id); it != recv_b.end())
        d_ab = std::min(d_ab, it->second - t);
    for (const auto& [id, t] : send_b)
      if (auto it = recv_ref.find(id); it != recv_ref.end())
        d_ba = std::min(d_ba, it->second - t);
    int64_t off = 0;
    if (d_ab != LLONG_MAX && d_ba != LLONG_MAX)
      off = (d_ab - d_ba) / 2;
    offsets[rt.host] = off;
    ts.notes.push_back(
        "host " + rt.host + ": clock offset " + std::to_string(off) + " ns from peer message pairs"
        + (d_ab == LLONG_MAX || d_ba == LLONG_MAX ? " (no pairs both ways: 0)" : ""));
  }
  for (auto& rt : ts.ranks) {
    rt.offset = rt.host == ref ? 0 : offsets[rt.host];
    for (auto& r : rt.records)
      r.t -= rt.offset;
  }
}

}  // namespace

std::string trace_set::process_key(int i) const {
  return ranks[i].host + "/" + std::to_string(ranks[i].pid);
}

std::string trace_set::match_key(int i, const record& r) const {
  if (r.id.empty())
    return {};
  switch (r.id[0]) {
    case 'r':  // CAF request ids: unique within one process
      return process_key(i) + "/" + r.id;
    case 'g':  // host -> reducer of one rank
      return "rank" + std::to_string(ranks[i].rank) + "/" + r.id;
    default:  // peer messages name both ranks
      return r.id;
  }
}

expected<trace_set> read_traces(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return error{errc::io_error, "'" + dir + "' is not a directory"};
  static const std::regex name(R"(trace-node\d+-rank\d+\.jsonl)");
  trace_set ts;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || !std::regex_match(e.path().filename().string(), name))
      continue;
    auto rt = read_file(e.path());
    if (!rt)
      return rt.err();
    ts.ranks.push_back(std::move(*rt));
  }
  if (ts.ranks.empty())
    return error{errc::invalid_argument,
                 "no trace files (trace-node*-rank*.jsonl) in '" + dir + "'"};
  std::sort(ts.ranks.begin(), ts.ranks.end(),
            [](const rank_trace& a, const rank_trace& b) { return a.rank < b.rank; });
  for (size_t i = 1; i < ts.ranks.size(); ++i)
    if (ts.ranks[i].rank == ts.ranks[i - 1].rank)
      return error{errc::invalid_argument, "two files for rank " + std::to_string(ts.ranks[i].rank)
                                               + ": " + ts.ranks[i - 1].file + " and "
                                               + ts.ranks[i].file};
  align(ts);
  ts.t0 = LLONG_MAX;
  for (auto& rt : ts.ranks) {
    std::stable_sort(rt.records.begin(), rt.records.end(), [](const record& a, const record& b) {
      return a.t != b.t ? a.t < b.t : a.seq < b.seq;
    });
    if (!rt.records.empty())
      ts.t0 = std::min(ts.t0, rt.records.front().t);
  }
  if (ts.t0 == LLONG_MAX)
    ts.t0 = 0;
  return ts;
}

std::string where(const trace_set& ts, const record& r) {
  for (const auto& rt : ts.ranks)
    if (rt.rank == r.rank)
      return fs::path(rt.file).filename().string() + ":" + std::to_string(r.line);
  return "?";
}

}  // namespace zmuon::trace_tool
