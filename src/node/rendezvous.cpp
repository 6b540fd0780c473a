#include "node/rendezvous.hpp"

#include <cstdio>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "caf/all.hpp"

#include "base/json_text.hpp"
#include "messages/errors.hpp"

namespace zmuon {

namespace {

using json = nlohmann::json;

/// Every leaf of `j` by its dotted path (JSON objects iterate in key order).
void flatten(const json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [key, value] : j.items())
      flatten(value, prefix.empty() ? key : prefix + "." + key, out);
    return;
  }
  out[prefix] = j.dump();
}

// A peer's config: parsed with the depth limit of user JSON (kMaxJsonDepth) before the
// recursive walk, so no nesting can exhaust the stack.
std::map<std::string, std::string> leaves(const std::string& text) {
  std::map<std::string, std::string> out;
  auto j = parse_json_text(text, "");
  if (!j)
    out["(config)"] = "unreadable JSON";
  else
    flatten(*j, "", out);
  return out;
}

// A value from a peer as a message quotes it: printable ASCII, the rest escaped, cut short.
std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return text.size() > 200 ? out + "..." : out;
}

// What a join request may carry: far beyond any job, small enough to check quickly.
constexpr size_t kMaxJobBytes = size_t(4) << 20;
constexpr size_t kMaxTableEntries = size_t(1) << 20;
constexpr size_t kMaxTableLine = 4096;

std::string request_problem(const join_request& req) {
  if (req.job.size() > kMaxJobBytes)
    return "node " + std::to_string(req.node) + "'s config holds " + std::to_string(req.job.size())
           + " bytes, more than the " + std::to_string(kMaxJobBytes) + " a job may";
  if (req.table.size() > kMaxTableEntries)
    return "node " + std::to_string(req.node) + " brings " + std::to_string(req.table.size())
           + " parameters, more than " + std::to_string(kMaxTableEntries);
  for (const auto& line : req.table)
    if (line.size() > kMaxTableLine)
      return "node " + std::to_string(req.node) + " brings a parameter line of "
             + std::to_string(line.size()) + " bytes";
  return {};
}

std::string node_name(const join_request& r) {
  return "node " + std::to_string(r.node);
}

struct rendezvous_state {
  int nodes = 0;
  std::function<std::string()> unique_id;
  bool only_on_own_gpus = false;
  std::map<int32_t, hello> hellos;  // by node rank
  std::map<int32_t, caf::typed_response_promise<hello_reply>> greeted;
  std::map<int32_t, join_request> joined;  // by node rank
  std::map<int32_t, caf::typed_response_promise<join_reply>> waiting;
  std::map<int32_t, caf::actor_addr> supervisors;    // monitored, by node rank
  std::function<void(const std::string&)> progress;  // a line per node that arrives
  std::string failed;  // why the job cannot start (a node lost while the others join)
  bool answered = false;
  static const char* name;
};
const char* rendezvous_state::name = "rendezvous";

using rendezvous_pointer = rendezvous_actor::stateful_pointer<rendezvous_state>;

// All nodes are in: check them against node 0, then answer everyone.
void complete(rendezvous_pointer self) {
  auto& st = self->state;
  st.answered = true;
  const auto& base = st.joined.at(0);
  std::string diff;
  int32_t first_differing = 0;
  for (const auto& [node, req] : st.joined)
    if (diff.empty() && node != 0) {
      diff = first_difference(base, req);
      first_differing = node;
    }
  if (!diff.empty()) {
    // Node 0 hears what differs; the others only their own side (node 0's settings stay its own).
    for (auto& [node, promise] : st.waiting)
      promise.deliver(make_caf_error(
          errc::invalid_argument,
          node == 0 ? diff : first_difference(base, st.joined.at(first_differing), false)));
    st.waiting.clear();
    return;
  }
  join_reply reply;
  for (const auto& [node, req] : st.joined) {
    reply.node_first_ranks.push_back(reply.world);
    reply.world += req.ranks;
    reply.comms.insert(reply.comms.end(), req.comms.begin(), req.comms.end());
    reply.supervisors.push_back(req.supervisor);
  }
  std::vector<join_request> nodes;
  for (const auto& [node, req] : st.joined)
    nodes.push_back(req);
  if (st.unique_id && (!st.only_on_own_gpus || own_gpus(nodes)))
    reply.nccl_unique_id = st.unique_id();
  for (auto& [node, promise] : st.waiting) {
    reply.first_rank = reply.node_first_ranks[node];
    promise.deliver(reply);
  }
  st.waiting.clear();
}

// A node rank this request may take, or why not ("joined" or "said hello").
std::string rank_problem(const rendezvous_state& st, int32_t node, bool seen, const char* twice) {
  if (node < 0 || node >= st.nodes)
    return "node rank " + std::to_string(node) + " is outside [0, " + std::to_string(st.nodes)
           + ") (--nodes " + std::to_string(st.nodes) + " on node 0)";
  if (seen)
    return "node rank " + std::to_string(node) + " " + twice
           + " (two processes with the same --node-rank)";
  return {};
}

// Monitors node `node`'s supervisor from its first message on, and says that it is in.
void watch(rendezvous_pointer self, int32_t node, const caf::actor& supervisor) {
  auto& st = self->state;
  const bool arrived = st.supervisors.count(node) == 0;
  auto& known = st.supervisors[node];
  if (known != supervisor.address()) {
    known = supervisor.address();
    self->monitor(supervisor);
  }
  if (!arrived || !st.progress)
    return;
  std::string line = "node " + std::to_string(node) + " is in ("
                     + std::to_string(st.supervisors.size()) + " of " + std::to_string(st.nodes)
                     + " nodes";
  const auto missing = st.nodes - static_cast<int>(st.supervisors.size());
  if (missing > 0)
    line += missing == 1 ? "; waiting for node" : "; waiting for nodes";
  for (int32_t n = 0, listed = 0; n < st.nodes; ++n)
    if (st.supervisors.count(n) == 0)
      line += (listed++ == 0 ? " " : ", ") + std::to_string(n);
  st.progress(line + ")");
}

rendezvous_actor::behavior_type rendezvous_impl(rendezvous_pointer self, int nodes,
                                                std::function<std::string()> unique_id,
                                                bool only_on_own_gpus,
                                                std::function<void(const std::string&)> progress) {
  self->state.nodes = nodes;
  self->state.progress = std::move(progress);
  self->state.unique_id = std::move(unique_id);
  self->state.only_on_own_gpus = only_on_own_gpus;
  // A node that dies while the others still join fails the join at once (not at the timeout).
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    if (st.answered)
      return;
    for (const auto& [node, addr] : st.supervisors)
      if (addr == dm.source) {
        st.failed = "node " + std::to_string(node) + " was lost while the nodes were joining ("
                    + to_string(dm.reason) + ")";
        for (auto& [other, promise] : st.greeted)
          if (other != node)
            promise.deliver(make_caf_error(errc::comm_failure, st.failed));
        for (auto& [other, promise] : st.waiting)
          if (other != node)
            promise.deliver(make_caf_error(errc::comm_failure, st.failed));
        st.greeted.clear();
        st.waiting.clear();
        st.answered = true;
        return;
      }
  });
  return {
      [=](hello& h) -> caf::result<hello_reply> {
        auto& st = self->state;
        if (!st.failed.empty())
          return make_caf_error(errc::comm_failure, st.failed);
        auto problem = rank_problem(st, h.node, st.hellos.count(h.node) > 0, "said hello twice");
        if (!problem.empty())
          return make_caf_error(errc::invalid_argument, problem);
        const int32_t node = h.node;
        watch(self, node, h.supervisor);
        st.hellos.emplace(node, std::move(h));
        auto promise = self->make_response_promise<hello_reply>();
        st.greeted.emplace(node, promise);
        if (static_cast<int>(st.hellos.size()) == st.nodes) {
          hello_reply reply;
          for (const auto& [n, each] : st.hellos) {
            reply.hosts.push_back(each.host);
            reply.ports.push_back(each.port);
          }
          for (auto& [n, p] : st.greeted)
            p.deliver(reply);
          st.greeted.clear();
        }
        return promise;
      },
      [=](join_request& req) -> caf::result<join_reply> {
        auto& st = self->state;
        if (!st.failed.empty())
          return make_caf_error(errc::comm_failure, st.failed);
        auto problem = rank_problem(st, req.node, st.joined.count(req.node) > 0, "joined twice");
        if (problem.empty())
          problem = request_problem(req);
        if (!problem.empty())
          return make_caf_error(errc::invalid_argument, problem);
        if (req.ranks < 1 || static_cast<int32_t>(req.comms.size()) != req.ranks)
          return make_caf_error(errc::invalid_argument,
                                node_name(req) + " brings " + std::to_string(req.comms.size())
                                    + " comm actors for " + std::to_string(req.ranks) + " ranks");
        int32_t node = req.node;
        watch(self, node, req.supervisor);
        st.joined.emplace(node, std::move(req));
        auto promise = self->make_response_promise<join_reply>();
        st.waiting.emplace(node, promise);
        if (static_cast<int>(st.joined.size()) == st.nodes)
          complete(self);
        return promise;
      },
  };
}

}  // namespace

rendezvous_actor spawn_rendezvous(caf::actor_system& sys, int nodes,
                                  std::function<std::string()> unique_id, bool only_on_own_gpus,
                                  std::function<void(const std::string&)> progress) {
  return sys.spawn(rendezvous_impl, nodes, std::move(unique_id), only_on_own_gpus,
                   std::move(progress));
}

bool own_gpus(const std::vector<join_request>& nodes) {
  std::set<std::string> seen;
  for (const auto& n : nodes) {
    if (static_cast<int32_t>(n.gpus.size()) != n.ranks)
      return false;
    for (const auto& gpu : n.gpus)
      if (!seen.insert(gpu).second)
        return false;
  }
  return true;
}

std::string first_difference(const join_request& base, const join_request& other,
                             bool reveal_base) {
  auto who = [&](const std::string& what) {
    return what + " of " + node_name(other) + " differs from " + node_name(base) + "'s";
  };
  size_t n = std::min(base.table.size(), other.table.size());
  for (size_t i = 0; i < n; ++i)
    if (base.table[i] != other.table[i])
      return who("the parameter table") + " at entry " + std::to_string(i) + ": "
             + (reveal_base ? node_name(base) + " has '" + printable(base.table[i]) + "', " : "")
             + node_name(other) + " has '" + printable(other.table[i]) + "'";
  if (base.table.size() != other.table.size())
    return who("the parameter table") + ": "
           + (reveal_base
                  ? node_name(base) + " has " + std::to_string(base.table.size()) + " parameters, "
                  : "")
           + node_name(other) + " has " + std::to_string(other.table.size())
           + (reveal_base ? "" : " parameters");
  auto a = leaves(base.job);
  auto b = leaves(other.job);
  auto ia = a.begin();
  auto ib = b.begin();
  auto value = [](const std::map<std::string, std::string>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? std::string("nothing") : it->second;
  };
  while (ia != a.end() || ib != b.end()) {
    std::string key;
    if (ib == b.end() || (ia != a.end() && ia->first < ib->first))
      key = ia->first;
    else
      key = ib->first;
    std::string va = value(a, key), vb = value(b, key);
    if (va != vb)
      return who("the config") + " at '" + printable(key)
             + "': " + (reveal_base ? node_name(base) + " has " + printable(va) + ", " : "")
             + node_name(other) + " has " + printable(vb);
    if (ia != a.end() && ia->first == key)
      ++ia;
    if (ib != b.end() && ib->first == key)
      ++ib;
  }
  return {};
}

}  // namespace zmuon
