#include "trace/recorder.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

namespace zmuon::trace {

namespace {

// Appends `"key":value` members to a record body; names and ids are plain identifiers.
struct body {
  body() { s.reserve(256); }
  std::string s;
  body& str(const char* key, const char* v) {
    sep();
    s += '"';
    s += key;
    s += "\":\"";
    s += v;
    s += '"';
    return *this;
  }
  body& str(const char* key, const std::string& v) { return str(key, v.c_str()); }
  body& num(const char* key, int64_t v) {
    sep();
    s += '"';
    s += key;
    s += "\":";
    char buf[24];
    auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    s.append(buf, end);
    return *this;
  }
  body& boolean(const char* key, bool v) {
    sep();
    s += '"';
    s += key;
    s += "\":";
    s += v ? "true" : "false";
    return *this;
  }
  body& raw(const char* key, const std::string& json) {
    sep();
    s += '"';
    s += key;
    s += "\":";
    s += json;
    return *this;
  }
  void sep() {
    if (!s.empty())
      s += ',';
  }
};

body head(const char* ev, const char* actor, int64_t t) {
  body b;
  b.str("ev", ev).num("t", t).str("actor", actor);
  return b;
}

void message_fields(body& b, const fields& f) {
  b.str("type", f.type).num("step", static_cast<int64_t>(f.step));
  if (f.op)
    b.str("op", f.op);
  if (f.micro >= 0)
    b.num("micro", f.micro);
  if (f.index >= 0)
    b.num("index", f.index);
  if (f.bytes > 0)
    b.num("bytes", f.bytes);
  if (f.flag)
    b.boolean(f.flag, f.flag_value);
}

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string env_dir() {
  const char* v = std::getenv("ZMUON_TRACE");
  return v ? std::string(v) : std::string();
}

std::string recorder::file_name(int node, int rank) {
  return "trace-node" + std::to_string(node) + "-rank" + std::to_string(rank) + ".jsonl";
}

expected<std::shared_ptr<recorder>> recorder::open(const std::string& dir, int node, int rank,
                                                   int world) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return error{errc::io_error, "trace directory '" + dir + "': " + ec.message()};
  std::shared_ptr<recorder> r(new recorder());
  r->node_ = node;
  r->rank_ = rank;
  r->path_ = (std::filesystem::path(dir) / file_name(node, rank)).string();
  r->file_ = std::fopen(r->path_.c_str(), "w");
  if (!r->file_)
    return error{errc::io_error, "cannot write the trace file '" + r->path_ + "'"};
  std::setvbuf(r->file_, nullptr, _IOFBF, 1 << 20);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  body b;
  b.str("ev", "meta")
      .num("t", now_ns())
      .num("node", node)
      .num("rank", rank)
      .num("world", world)
      .raw("host", nlohmann::json(std::string(host)).dump())
      .num("pid", static_cast<int64_t>(getpid()))
      .str("clock", "steady_ns")
      .num("version", 1);
  r->write(b.s);
  return r;
}

recorder::~recorder() {
  if (file_)
    std::fclose(file_);
}

void recorder::write(const std::string& body) {
  std::lock_guard<std::mutex> guard(mu_);
  append(body);
}

void recorder::write(const std::string& body, uint64_t step, int64_t t) {
  std::lock_guard<std::mutex> guard(mu_);
  if (step > 0 && (step_starts_.empty() || step > step_starts_.back().first)) {
    step_starts_.emplace_back(step, t);
    if (step_starts_.size() > kSteps)
      step_starts_.erase(step_starts_.begin());
  } else if (step > 0) {
    for (auto it = step_starts_.rbegin(); it != step_starts_.rend(); ++it)
      if (it->first == step) {
        it->second = std::min(it->second, t);
        break;
      }
  }
  append(body);
}

void recorder::append(const std::string& body) {
  char head[32] = "{\"seq\":";
  char* end = std::to_chars(head + 7, head + sizeof head - 1, seq_++).ptr;
  *end++ = ',';
  std::fwrite(head, 1, end - head, file_);
  std::fwrite(body.data(), 1, body.size(), file_);
  std::fwrite("}\n", 1, 2, file_);
}

uint64_t recorder::step_at(int64_t t) const {
  for (auto it = step_starts_.rbegin(); it != step_starts_.rend(); ++it)
    if (it->second <= t)
      return it->first;
  return 0;
}

void recorder::compute(const char* name, int track, int64_t t, int64_t dur) {
  auto b = head("span", "compute", t);
  b.num("dur", dur).str("phase", name);
  std::lock_guard<std::mutex> guard(mu_);
  b.num("step", static_cast<int64_t>(step_at(t))).num("track", track);
  append(b.s);
}

void recorder::flush() {
  std::lock_guard<std::mutex> guard(mu_);
  std::fflush(file_);
}

void recorder::send(const char* actor, int64_t t, const fields& f, const std::string& id,
                    bool request, int peer) {
  auto b = head("send", actor, t);
  message_fields(b, f);
  if (peer >= 0)
    b.num("peer", peer);
  b.str("id", id);
  if (request)
    b.boolean("req", true);
  write(b.s, f.step, t);
}

void recorder::recv(const char* actor, int64_t t, int64_t dur, const fields& f,
                    const std::string& id) {
  auto b = head("recv", actor, t);
  b.num("dur", dur);
  message_fields(b, f);
  b.str("id", id);
  write(b.s, f.step, t);
}

void recorder::reply(const char* actor, int64_t t, const fields& answer, const std::string& id,
                     const std::string& error, int64_t dur) {
  auto b = head("reply", actor, t);
  if (dur >= 0)
    b.num("dur", dur);
  if (error.empty())
    message_fields(b, answer);
  else
    b.str("type", "error").raw("error", nlohmann::json(error).dump());
  b.str("id", id);
  write(b.s, answer.step, t);
}

void recorder::span(const char* actor, const char* phase, int64_t t, int64_t dur, const fields& f,
                    const std::vector<int>* params, bool wait) {
  auto b = head("span", actor, t);
  b.num("dur", dur).str("phase", phase).num("step", static_cast<int64_t>(f.step));
  if (f.op)
    b.str("op", f.op);
  if (f.micro >= 0)
    b.num("micro", f.micro);
  if (f.index >= 0)
    b.num("index", f.index);
  b.num("bytes", f.bytes);
  if (params)
    b.raw("params", nlohmann::json(*params).dump());
  if (wait)
    b.boolean("wait", true);
  write(b.s, f.step, t);
}

void recorder::plan(const std::vector<std::pair<int, std::string>>& muon_params, int chunks) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [index, name] : muon_params)
    list.push_back({index, name});
  body b;
  b.str("ev", "plan").num("t", now_ns()).raw("muon_params", list.dump()).num("chunks", chunks);
  write(b.s);
}

}  // namespace zmuon::trace
