#include "node/node_supervisor.hpp"

#include <algorithm>
#include <optional>

#include "caf/all.hpp"

#include "base/log.hpp"
#include "messages/errors.hpp"

namespace zmuon {

namespace {

using clock = std::chrono::steady_clock;

struct waiter {
  caf::typed_response_promise<std::string> promise;
  clock::time_point until;
};

struct supervisor_state {
  supervisor_options opts;
  watch_nodes nodes;
  bool watching = false;
  std::vector<clock::time_point> last_seen;  // by node
  std::vector<uint64_t> step_of;             // by node: the step of its last heartbeat
  std::vector<bool> done;                    // by node: finished the job
  uint64_t step = 0;                         // this node's
  std::string failure;                       // the first loss noticed or reported
  std::vector<waiter> waiters;
  std::optional<caf::typed_response_promise<bool>> finish;
  static const char* name;
};
const char* supervisor_state::name = "node_supervisor";

using supervisor_pointer = node_supervisor_actor::stateful_pointer<supervisor_state>;

node_supervisor_actor peer(const caf::actor& a) {
  return caf::actor_cast<node_supervisor_actor>(a);
}

int nodes_of(const supervisor_state& st) {
  return static_cast<int>(st.nodes.supervisors.size());
}

bool all_done(const supervisor_state& st) {
  return std::all_of(st.done.begin(), st.done.end(), [](bool d) { return d; });
}

// Sends `msg` to every other node's supervisor except `skip`.
template <class Msg>
void broadcast(supervisor_pointer self, const Msg& msg, int skip = -1) {
  auto& st = self->state;
  for (int q = 0; q < nodes_of(st); ++q)
    if (q != st.opts.node && q != skip)
      caf::anon_send(peer(st.nodes.supervisors[q]), msg);  // queued messages hold no ref to us
}

// The job is over on this node: say why, release whoever waits, and unblock the ranks. `log`:
// whether the loss is news here (this node's own failure was said by its host).
void end_job(supervisor_pointer self, const std::string& what, bool log) {
  auto& st = self->state;
  if (!st.failure.empty())
    return;
  st.failure = what;
  if (log)
    ZMUON_LOG_ERROR(what);
  if (st.opts.end)
    st.opts.end->set(what);
  for (auto& c : st.opts.comms)
    self->send(c, comm_abort{what});
  for (auto& w : st.waiters)
    w.promise.deliver(what);
  st.waiters.clear();
  if (st.finish) {
    st.finish->deliver(make_caf_error(errc::comm_failure, what));
    st.finish.reset();
  }
}

void lose(supervisor_pointer self, int q, const std::string& why) {
  auto& st = self->state;
  if (!st.failure.empty() || st.done[q])
    return;
  std::string where =
      st.step_of[q] == 0 ? "before its first step" : "in step " + std::to_string(st.step_of[q]);
  std::string what =
      describe_node(q, st.nodes.node_first_ranks, st.nodes.world) + " lost " + where + ": " + why;
  broadcast(self, node_lost{static_cast<int32_t>(q), what}, q);
  end_job(self, what, true);
}

void tick(supervisor_pointer self) {
  auto& st = self->state;
  auto now = clock::now();
  for (auto it = st.waiters.begin(); it != st.waiters.end();)
    if (now >= it->until) {
      it->promise.deliver(std::string());
      it = st.waiters.erase(it);
    } else {
      ++it;
    }
  if (st.watching && st.failure.empty()) {
    broadcast(self, heartbeat{st.opts.node, st.step});
    for (int q = 0; q < nodes_of(st); ++q) {
      auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - st.last_seen[q]);
      if (q != st.opts.node && !st.done[q] && silent > st.opts.heartbeat_timeout)
        lose(self, q,
             "no heartbeat for " + std::to_string(silent.count()) + " ms (timeout "
                 + std::to_string(st.opts.heartbeat_timeout.count())
                 + " ms, zmuon.heartbeat_timeout_ms)");
    }
  }
  auto interval = std::clamp(st.opts.heartbeat_timeout / 5, std::chrono::milliseconds(20),
                             std::chrono::milliseconds(250));
  self->delayed_send(self, interval, tick_atom::value);
}

node_supervisor_actor::behavior_type supervisor_impl(supervisor_pointer self,
                                                     supervisor_options opts) {
  self->state.opts = std::move(opts);
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& st = self->state;
    for (int q = 0; q < nodes_of(st); ++q)
      if (q != st.opts.node && st.nodes.supervisors[q].address() == dm.source)
        lose(self, q, "its process or connection is gone (" + to_string(dm.reason) + ")");
  });
  self->send(self, tick_atom::value);
  return {
      [=](watch_nodes& msg) {
        auto& st = self->state;
        st.nodes = std::move(msg);
        int n = nodes_of(st);
        st.last_seen.assign(n, clock::now());
        st.step_of.assign(n, 0);
        st.done.assign(n, false);
        for (int q = 0; q < n; ++q)
          if (q != st.opts.node)
            self->monitor(st.nodes.supervisors[q]);
        st.watching = true;
      },
      [=](step_atom, uint64_t step) {
        auto& st = self->state;
        st.step = step;
        if (st.watching && st.failure.empty()) {  // so that a loss names the step it was in
          st.step_of[st.opts.node] = step;
          broadcast(self, heartbeat{st.opts.node, step});
        }
      },
      [=](heartbeat& hb) {
        auto& st = self->state;
        if (!st.watching || hb.node < 0 || hb.node >= nodes_of(st))
          return;
        st.last_seen[hb.node] = clock::now();
        st.step_of[hb.node] = hb.step;
      },
      [=](node_lost& msg) { end_job(self, msg.what, true); },
      [=](node_done& msg) {
        auto& st = self->state;
        if (!st.watching || msg.node < 0 || msg.node >= nodes_of(st))
          return;
        st.done[msg.node] = true;
        if (st.finish && all_done(st)) {
          st.finish->deliver(true);
          st.finish.reset();
        }
      },
      [=](finish_atom) -> caf::result<bool> {
        auto& st = self->state;
        if (!st.failure.empty())
          return make_caf_error(errc::comm_failure, st.failure);
        if (!st.watching)
          return true;
        st.done[st.opts.node] = true;
        broadcast(self, node_done{st.opts.node});
        if (all_done(st))
          return true;
        st.finish = self->make_response_promise<bool>();
        return *st.finish;
      },
      [=](failure_atom) -> caf::result<std::string> {
        auto& st = self->state;
        if (!st.failure.empty() || !st.watching)
          return st.failure;
        auto promise = self->make_response_promise<std::string>();
        st.waiters.push_back({promise, clock::now() + st.opts.failure_wait});
        return promise;
      },
      [=](fail_atom, const std::string& what) {
        auto& st = self->state;
        if (!st.failure.empty())
          return;
        std::string text = describe_node(st.opts.node, st.nodes.node_first_ranks, st.nodes.world)
                           + " failed in step " + std::to_string(st.step) + ": " + what;
        broadcast(self, node_lost{st.opts.node, text});
        end_job(self, text, false);
      },
      [=](tick_atom) { tick(self); },
  };
}

}  // namespace

node_supervisor_actor spawn_node_supervisor(caf::actor_system& sys, supervisor_options opts) {
  // Scheduled, not detached: a detached supervisor hung ~actor_system in about 1 of 17 runs
  // (docs/DECISIONS.md). The node's scheduler keeps threads free for it (node_scheduler_threads).
  return sys.spawn(supervisor_impl, std::move(opts));
}

std::string describe_node(int node, const std::vector<int32_t>& node_first_ranks, int world) {
  std::string out = "node " + std::to_string(node);
  if (node < 0 || node >= static_cast<int>(node_first_ranks.size()))
    return out;
  int first = node_first_ranks[node];
  int last =
      (node + 1 < static_cast<int>(node_first_ranks.size()) ? node_first_ranks[node + 1] : world)
      - 1;
  return out
         + (first == last ? " (rank " + std::to_string(first) + ")"
                          : " (ranks " + std::to_string(first) + "-" + std::to_string(last) + ")");
}

}  // namespace zmuon
