// engine_job: this process's place in the job: its options, the actor system its ranks run on,
// the ranks' actors, comms and traces, and the step count. The host thread's requests to the
// ranks go through it. Part of engine::impl (impl.hpp). Internal: not installed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "caf/all.hpp"

#include "actors/rank.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"
#include "node/node_setup.hpp"
#include "plan/plan.hpp"
#include "trace/trace.hpp"
#include "zmuon/engine.hpp"

namespace zmuon {

struct engine_config : caf::actor_system_config {
  engine_config() { configure_actor_system(*this); }
};

/// Scheduler threads of an engine's own actor system for `local` ranks: two a rank and two more,
/// never more than CAF's default (the cores, at least 4). Fewer threads than the cores make the
/// actors' hand-offs cheaper (docs/DECISIONS.md has the figure).
inline size_t scheduler_threads(int local) {
  const size_t cores = std::max(4u, std::thread::hardware_concurrency());
  return std::min(cores, static_cast<size_t>(2 * std::max(local, 1) + 2));
}

struct engine_job {
  engine_options opts;
  engine_config cfg;
  std::unique_ptr<caf::actor_system> own_sys;  // null when running on a node's actor system
  // A process made by create_node(): joins the job with the registered table when it starts and
  // returns the node's setup; the node it made lives in these functions' captures (declared
  // before the actors' handles, so it is destroyed after them). leave_job: the end-of-job barrier.
  std::function<expected<node_setup>(const std::vector<param_spec>& table)> join_job;
  std::function<void()> leave_job;
  std::function<void(uint64_t step)> step_started;  // tells the node's supervisor
  caf::actor_system* sys = nullptr;
  int first_rank = 0;  // this process runs ranks [first_rank, first_rank + local)
  int local = 0;
  std::vector<int> node_first_ranks;   // set on a node of a multi-process job
  std::shared_ptr<const job_end> end;  // a node of a multi-process job: why the job ended, if so
  int32_t host_collectives = 0;        // parameters()/sum_over_nodes() issued since the last step
  std::vector<comm_actor> comms;       // of this process's ranks (host collectives use these too)
  std::vector<comm_actor> rank_comms;  // nccl across processes: the ranks' own; else empty
  std::string nccl_id;                 // from the rendezvous (multi-process nccl)
  std::vector<rank_actors> ranks;      // this process's ranks, by local index
  std::vector<std::shared_ptr<trace::recorder>> traces;  // per local rank when tracing, else empty
  uint64_t step = 0;                                     // last step number issued
  uint64_t skipped_steps = 0;  // steps of this engine skipped for a non-finite gradient
  bool time_calls = false;     // time_backend_calls(): what the backends get when they are made

  caf::duration timeout() const {
    return caf::duration{std::chrono::milliseconds(opts.timeout_ms)};
  }

  /// A request's failure as a zmuon::error; one not answered in time names `what` and the
  /// setting.
  error reply_error(const caf::error& err, const std::string& what) const {
    if (err == caf::sec::request_timeout)
      return {errc::timeout, what + " was not answered within " + std::to_string(opts.timeout_ms)
                                 + " ms (timeout_ms, zmuon.timeout_ms)"};
    return from_caf_error(err);
  }

  // Blocking request from the host thread; errors come back as zmuon::error.
  template <class Reply, class Handle, class Msg>
  expected<Reply> ask(const Handle& h, Msg msg) {
    caf::scoped_actor self{*sys};
    expected<Reply> out = error{errc::internal, "no reply"};
    self->request(h, timeout(), std::move(msg))
        .receive([&](Reply& r) { out = std::move(r); },
                 [&](caf::error& err) { out = reply_error(err, "a request to a rank's actor"); });
    return out;
  }

  // This process runs ranks [first, first + local_ranks) of `o.world`; opens their trace files
  // when tracing (opts.trace_dir or ZMUON_TRACE).
  error configure(const engine_options& o, caf::actor_system* system, int first, int local_ranks,
                  int node) {
    opts = o;
    sys = system;
    first_rank = first;
    local = local_ranks;
    std::string trace_dir = o.trace_dir.empty() ? trace::env_dir() : o.trace_dir;
    for (int i = 0; !trace_dir.empty() && i < local_ranks; ++i) {
      auto rec = trace::recorder::open(trace_dir, node, first + i, o.world);
      if (!rec)
        return rec.err();
      traces.push_back(std::move(*rec));
    }
    return {};
  }
  expected<std::vector<std::shared_ptr<compute_backend>>> make_backends() const;
  error spawn_comms(const std::vector<std::shared_ptr<compute_backend>>& backends);

  // Host records of rank r's step request and its answer; flushes the rank's trace file.
  void trace_step(int r, const step_request& req, const std::string& id, int64_t sent,
                  const expected<step_result>& out) {
    auto& rec = *traces[r];
    auto f = trace::describe(req);
    rec.send("host", sent, f, id, true);
    auto t = trace::now_ns();
    if (out)
      rec.reply("host", t, trace::describe(*out), id);
    else
      rec.reply("host", t, {}, id, out.err().to_string());
    rec.span("host", "step", sent, t - sent, f, nullptr, true);
    if (r < static_cast<int>(ranks.size()))
      ranks[r].backend->read_traced_calls();  // the step's device work, done by now
    rec.flush();
  }
  error check_local(int rank) const;
  /// Local rank `rank`'s compute backend, or why there is none (`call` names the caller).
  expected<compute_backend*> backend_of(int rank, const char* call) const;
  bool multi_node() const { return !node_first_ranks.empty(); }
  /// Who runs global rank `rank`, for errors: "node 1 (ranks 2-3)", "node 1 (rank 2)", or "rank 2"
  /// in one process.
  std::string process_of(int rank) const {
    if (!multi_node())
      return "rank " + std::to_string(rank);
    const auto& firsts = node_first_ranks;
    size_t n = 0;
    while (n + 1 < firsts.size() && firsts[n + 1] <= rank)
      ++n;
    int last = n + 1 < firsts.size() ? firsts[n + 1] - 1 : opts.world - 1;
    return "node " + std::to_string(n)
           + (last == firsts[n]
                  ? " (rank " + std::to_string(last) + ")"
                  : " (ranks " + std::to_string(firsts[n]) + "-" + std::to_string(last) + ")");
  }

  // The host's collectives between processes (engine_collectives.cpp), over plan `pl`.

  /// Every local rank sends its parameter shard (`shards[i]`, in the plan's shard layout) to
  /// each node's first rank through `via` (an all-to-all-v); this process's first rank
  /// receives rank r's part of parameter k at `target[k] + r * shard_len` (a null `target[k]`,
  /// the same on every process, leaves parameter k out). Returns once every
  /// comm has answered (nccl: enqueued on the ranks' streams). `owner` keeps `shards` and
  /// `target` allocated while a comm still holds the request after a timeout (the caf comm
  /// writes the pieces that arrive late); null where the comm is done when it answers (nccl).
  error shards_to_node_leaders(const plan& pl, const std::vector<comm_actor>& via,
                               const std::vector<float*>& shards, const std::vector<float*>& target,
                               const keep_alive& owner);
  /// The full parameters on this process's first rank, over the caf comms (parameters()).
  expected<tensor_map> gather_between_nodes(const plan& pl);
  /// gather_params into device buffers for every parameter (`target`, by parameter index) in a
  /// multi-process job under nccl: each node's first rank receives every rank's shards in place;
  /// in the caller's stream order when `caller_stream` is set (else it waits for the copies).
  error gather_over_nccl(const plan& pl, const std::vector<float*>& target,
                         std::optional<void*> caller_stream);
};

}  // namespace zmuon
