#include "zmuon-trace/reader.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <type_traits>

#include "base/json_text.hpp"

namespace zmuon::trace_tool {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A field of the wrong type or out of range: what read_file turns into "FILE:LINE: <what>".
struct bad_field {
  std::string what;
};

// A value as it is written, shortened for a message.
std::string shown(const json& v) {
  auto s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Integer fields: a JSON number with a whole value in T's range (1e9 is 1000000000).
template <class T>
T whole(const json& v, const std::string& key) {
  using lim = std::numeric_limits<T>;
  if (!v.is_number())
    throw bad_field{"field '" + key + "' must be a number, got " + shown(v)};
  if (v.is_number_unsigned()) {
    auto u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(lim::max()))
      return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    auto i = v.get<int64_t>();
    if ((lim::is_signed || i >= 0) && i >= static_cast<int64_t>(lim::min())
        && (i < 0 || static_cast<uint64_t>(i) <= static_cast<uint64_t>(lim::max())))
      return static_cast<T>(i);
  } else {
    double d = v.get<double>();
    // Bounds as doubles: max() + 1 is a power of two, exact; < excludes it.
    const double lo = static_cast<double>(lim::min());
    const double hi = 2.0 * static_cast<double>(lim::max() / 2 + 1);
    if (std::isfinite(d) && d == std::floor(d) && d >= lo && d < hi)
      return static_cast<T>(d);
  }
  throw bad_field{"field '" + key + "' must be a whole number from " + std::to_string(lim::min())
                  + " to " + std::to_string(lim::max()) + ", got " + shown(v)};
}

void get(const json& j, const char* key, std::string& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return;
  if (!it->is_string())
    throw bad_field{std::string("field '") + key + "' must be a string, got " + shown(*it)};
  out = it->get<std::string>();
}

void get(const json& j, const char* key, bool& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return;
  if (!it->is_boolean())
    throw bad_field{std::string("field '") + key + "' must be true or false, got " + shown(*it)};
  out = it->get<bool>();
}

void get(const json& j, const char* key, std::optional<bool>& out) {
  bool b = false;
  if (j.contains(key) && !j[key].is_null()) {
    get(j, key, b);
    out = b;
  }
}

void get(const json& j, const char* key, std::vector<int>& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    return;
  if (!it->is_array())
    throw bad_field{std::string("field '") + key + "' must be a list of numbers, got "
                    + shown(*it)};
  out.clear();
  for (const auto& v : *it)
    out.push_back(whole<int>(v, key));
}

template <class T>
std::enable_if_t<std::is_integral_v<T>> get(const json& j, const char* key, T& out) {
  auto it = j.find(key);
  if (it != j.end() && !it->is_null())
    out = whole<T>(*it, key);
}

// The meta record's numbers: present, and in range (world at most kMaxWorld ranks).
constexpr int kMaxWorld = 1 << 20;

void check_meta(const json& j, rank_trace& rt) {
  for (const char* key : {"rank", "world"})
    if (!j.contains(key) || j[key].is_null())
      throw bad_field{std::string("the meta record has no field '") + key + "'"};
  try {
    get(j, "node", rt.node);
    get(j, "rank", rt.rank);
    get(j, "world", rt.world);
    get(j, "host", rt.host);
    get(j, "pid", rt.pid);
  } catch (const bad_field& e) {
    throw bad_field{"meta " + e.what};
  }
  if (rt.world < 1 || rt.world > kMaxWorld)
    throw bad_field{"meta field 'world' must be from 1 to " + std::to_string(kMaxWorld) + ", got "
                    + shown(j["world"])};
  if (rt.rank < 0 || rt.rank >= rt.world)
    throw bad_field{"meta field 'rank' must be from 0 to " + std::to_string(rt.world - 1)
                    + " (world " + std::to_string(rt.world) + "), got " + shown(j["rank"])};
  if (rt.node < 0 || rt.node >= rt.world)
    throw bad_field{"meta field 'node' must be from 0 to " + std::to_string(rt.world - 1)
                    + " (no more nodes than ranks), got " + shown(j["node"])};
}

void read_plan(const json& j, rank_trace& rt) {
  auto it = j.find("muon_params");
  if (it == j.end())
    throw bad_field{"the plan record has no field 'muon_params'"};
  const std::string want = "field 'muon_params' must be a list of [index, name] pairs, got ";
  if (!it->is_array())
    throw bad_field{want + shown(*it)};
  for (const auto& p : *it) {
    if (!p.is_array() || p.size() != 2 || !p[1].is_string())
      throw bad_field{want + "the element " + shown(p)};
    rt.muon[whole<int>(p[0], "muon_params")] = p[1].get<std::string>();
  }
  get(j, "chunks", rt.chunks);
}

// trace/recorder.hpp's file name (recorder::file_name; this library does not link the recorder).
std::string file_name(int node, int rank) {
  return "trace-node" + std::to_string(node) + "-rank" + std::to_string(rank) + ".jsonl";
}

// The numbers of a trace file's name, trace-node<N>-rank<R>.jsonl (false: out of int's range).
bool name_numbers(const std::string& name, int& node, int& rank) {
  static const std::regex re(R"(trace-node(\d+)-rank(\d+)\.jsonl)");
  std::smatch m;
  if (!std::regex_match(name, m, re))
    return false;
  auto num = [](const std::string& s, int& out) {
    auto r = std::from_chars(s.data(), s.data() + s.size(), out);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
  };
  return num(m[1].str(), node) && num(m[2].str(), rank);
}

expected<rank_trace> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return error{errc::io_error, "cannot read '" + path.string() + "'"};
  rank_trace rt;
  rt.file = path.string();
  std::error_code ec;
  auto size = fs::file_size(path, ec);
  rt.file_bytes = ec ? 0 : size;
  std::string line;
  size_t n = 0;
  size_t meta_line = 0;
  while (std::getline(in, line)) {
    ++n;
    // getline stops at the end of the file without a newline: the process ended mid-write
    const bool unterminated = in.eof();
    if (line.empty())
      continue;
    auto here = rt.file + ":" + std::to_string(n);
    if (json_too_deep_at(line) != std::string::npos)
      return error{errc::invalid_argument,
                   here + ": nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      if (unterminated) {
        rt.torn_line = n;
        break;
      }
      return error{errc::invalid_argument, here + ": not JSON (" + e.what() + ")"};
    }
    if (!j.is_object() || !j.contains("ev") || !j["ev"].is_string())
      return error{errc::invalid_argument, here + ": a record needs a string \"ev\""};
    try {
      auto ev = j["ev"].get<std::string>();
      if (ev == "meta") {
        if (meta_line)
          return error{errc::invalid_argument, here + ": a second meta record (the first is line "
                                                   + std::to_string(meta_line) + ")"};
        check_meta(j, rt);
        meta_line = n;
        continue;
      }
      if (ev == "plan") {
        read_plan(j, rt);
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
      get(j, "overflow", r.overflow);
      get(j, "skipped", r.skipped);
      get(j, "params", r.params);
      rt.last_step = std::max(rt.last_step, r.step);
      rt.records.push_back(std::move(r));
    } catch (const bad_field& e) {
      return error{errc::invalid_argument, here + ": " + e.what};
    } catch (const json::exception& e) {
      return error{errc::invalid_argument, here + ": bad field (" + e.what() + ")"};
    }
  }
  if (in.bad())
    return error{errc::io_error, "cannot read '" + rt.file + "' (an I/O error after line "
                                     + std::to_string(n) + ")"};
  if (!meta_line)
    return error{
        errc::invalid_argument,
        rt.file
            + (n == 0              ? ": empty (no meta record; not a zmuon trace, or its process "
                                     "ended before writing anything)"
               : rt.torn_line == 1 ? ": no meta record (the process ended while writing it)"
                                   : ": no meta record (not a zmuon trace)")};
  int name_node = -1, name_rank = -1;
  const bool named = name_numbers(path.filename().string(), name_node, name_rank);
  if (!named || name_node != rt.node || name_rank != rt.rank)
    return error{
        errc::invalid_argument,
        rt.file + ":" + std::to_string(meta_line) + ": the meta record says node "
            + std::to_string(rt.node) + ", rank " + std::to_string(rt.rank) + ", the file name "
            + (named ? "node " + std::to_string(name_node) + ", rank " + std::to_string(name_rank)
                     : std::string("numbers out of range"))
            + " (a renamed file? expected " + file_name(rt.node, rt.rank) + ")"};
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

namespace {

// The file a missing rank's process would have written: its node is that of the ranks around it
// when they agree (nodes hold consecutive ranks), else unknown.
std::string expected_file(const std::vector<rank_trace>& ranks, int rank) {
  const rank_trace* below = nullptr;
  const rank_trace* above = nullptr;
  std::set<int> nodes;
  for (const auto& rt : ranks) {
    nodes.insert(rt.node);
    if (rt.rank < rank)
      below = &rt;
    else if (!above)
      above = &rt;
  }
  if (nodes.size() == 1)
    return file_name(*nodes.begin(), rank);
  if (below && above && below->node == above->node)
    return file_name(below->node, rank);
  return "trace-node*-rank" + std::to_string(rank) + ".jsonl";
}

// Every rank of the world has one file, all of one world (ts.ranks sorted by rank).
error check_world(const trace_set& ts, const std::string& dir, bool every_rank) {
  const auto& first = ts.ranks.front();
  for (const auto& rt : ts.ranks)
    if (rt.world != first.world)
      return error{errc::invalid_argument, rt.file + ": world " + std::to_string(rt.world)
                                               + ", but " + first.file + " says world "
                                               + std::to_string(first.world)
                                               + " (files of different runs in one directory?)"};
  for (size_t i = 1; i < ts.ranks.size(); ++i)
    if (ts.ranks[i].rank == ts.ranks[i - 1].rank)
      return error{errc::invalid_argument, "two files for rank " + std::to_string(ts.ranks[i].rank)
                                               + ": " + ts.ranks[i - 1].file + " and "
                                               + ts.ranks[i].file};
  const int world = first.world;
  if (!every_rank || static_cast<int>(ts.ranks.size()) == world)
    return {};
  std::vector<int> missing;
  size_t k = 0;
  for (int r = 0; r < world; ++r) {
    if (k < ts.ranks.size() && ts.ranks[k].rank == r)
      ++k;
    else
      missing.push_back(r);
  }
  const size_t shown = std::min<size_t>(missing.size(), 4);
  std::string ranks, files;
  for (size_t i = 0; i < shown; ++i) {
    ranks += (i ? ", " : "") + std::to_string(missing[i]);
    files += (i ? ", " : "") + expected_file(ts.ranks, missing[i]);
  }
  if (missing.size() > shown) {
    ranks += " and " + std::to_string(missing.size() - shown) + " more";
    files += ", ...";
  }
  return error{errc::invalid_argument,
               (missing.size() == 1 ? "rank " + ranks + " of world " + std::to_string(world)
                                          + " has no trace file (expected "
                                    : "ranks " + ranks + " of world " + std::to_string(world)
                                          + " have no trace file (expected ")
                   + files + " in '" + dir
                   + "'; a multi-host run writes each node's files on its own host: copy them "
                     "all into one directory)"};
}

// A run cut short: a rank's file ended in the middle of a line, or the ranks' files end in
// different steps. Sets ts.cut and says so.
void find_cut(trace_set& ts) {
  bool torn = false;
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto& rt : ts.ranks) {
    torn = torn || rt.torn_line > 0;
    lo = std::min(lo, rt.last_step);
    hi = std::max(hi, rt.last_step);
  }
  if (!torn && lo == hi)
    return;
  ts.cut = lo;
  std::string ends;
  for (const auto& rt : ts.ranks)
    if (rt.last_step == lo || rt.torn_line > 0)
      ends += std::string(ends.empty() ? "" : ", ") + "rank " + std::to_string(rt.rank)
              + "'s file ends in step " + std::to_string(rt.last_step)
              + (rt.torn_line > 0 ? " with an incomplete line" : "");
  if (lo != hi)
    ends += ", another's in step " + std::to_string(hi);
  ts.warnings.push_back("the run was cut short (" + ends + "): the records of step "
                        + std::to_string(lo)
                        + " and later may be incomplete, and check leaves them out");
}

}  // namespace

expected<trace_set> read_traces(const std::string& dir, const read_options& options) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return error{errc::io_error, "'" + dir + "' is not a directory"};
  static const std::regex name(R"(trace-node\d+-rank\d+\.jsonl)");
  trace_set ts;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const auto& path = it->path();
    if (!std::regex_match(path.filename().string(), name))
      continue;
    std::error_code sec;
    auto st = fs::status(path, sec);  // follows links
    if (!fs::is_regular_file(st))
      return error{errc::invalid_argument,
                   "'" + path.string() + "' is "
                       + (fs::is_directory(st) ? std::string("a directory")
                          : fs::exists(st)     ? std::string("not a regular file")
                                               : "a link to nothing")
                       + ", not a rank's trace file"};
    auto rt = read_file(path);
    if (!rt)
      return rt.err();
    ts.ranks.push_back(std::move(*rt));
  }
  if (ec)
    return error{errc::io_error, "cannot list '" + dir + "': " + ec.message()};
  if (ts.ranks.empty())
    return error{errc::invalid_argument,
                 "no trace files (trace-node*-rank*.jsonl) in '" + dir + "'"};
  std::sort(ts.ranks.begin(), ts.ranks.end(),
            [](const rank_trace& a, const rank_trace& b) { return a.rank < b.rank; });
  if (auto err = check_world(ts, dir, options.every_rank))
    return err;
  for (const auto& rt : ts.ranks)
    if (rt.torn_line > 0)
      ts.warnings.push_back(rt.file + ":" + std::to_string(rt.torn_line)
                            + ": ignoring an incomplete last line (the process ended while "
                              "writing it)");
  find_cut(ts);
  if (options.warn)
    for (const auto& w : ts.warnings)
      *options.warn << "zmuon-trace: warning: " << w << "\n";
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
