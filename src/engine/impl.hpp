// engine::impl: the engine's state, shared by engine.cpp (create, reduce, step, parameters),
// engine_collectives.cpp (the host's collectives between processes) and engine_checkpoint.cpp.
// Internal: not installed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "caf/all.hpp"

#include "actors/rank.hpp"
#include "engine/faults.hpp"
#include "engine/host_buckets.hpp"
#include "engine/reduce_window.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"
#include "node/node_setup.hpp"
#include "plan/ownership.hpp"
#include "trace/trace.hpp"
#include "zmuon/engine.hpp"

namespace zmuon {

struct engine_config : caf::actor_system_config {
  engine_config() {
    register_messages(*this);
    set("logger.verbosity", caf::atom("quiet"));
  }
};

/// Scheduler threads of an engine's own actor system for `local` ranks: two a rank and two more,
/// never more than CAF's default (the cores, at least 4). Fewer threads than the cores make the
/// actors' hand-offs cheaper (docs/DECISIONS.md has the figure).
inline size_t scheduler_threads(int local) {
  const size_t cores = std::max(4u, std::thread::hardware_concurrency());
  return std::min(cores, static_cast<size_t>(2 * std::max(local, 1) + 2));
}

/// Runs `body`, backend calls made on the caller's thread (copies, waits: reduce(),
/// gather_params), and returns the failure a backend throws there (a CUDA error) as the error
/// it is, named after the engine's `call`: the C++ API returns errors, it never throws.
template <class Body>
error on_backend(const char* call, int rank, Body&& body) {
  try {
    body();
    return {};
  } catch (const std::exception& e) {
    return {errc::device_failure,
            std::string(call) + "(): rank " + std::to_string(rank) + ": " + e.what()};
  }
}

/// Device buffers (memory_space::cuda) need the cuda compute backend; the engine then copies
/// from and to them on the rank's stream (reduce(): engine_reduce.cpp; gather_params: the
/// parameters are written when it returns).
template <class View>
error check_buffer(const View& v, const engine_options& opts) {
  if (v.space != memory_space::host && opts.compute != "cuda")
    return {errc::unsupported, "'" + v.name + "' is a CUDA device buffer (device "
                                   + std::to_string(v.device) + "), which compute backend '"
                                   + opts.compute
                                   + "' cannot read: hand over host memory or use 'cuda'"};
  return {};
}

/// The caller's views by parameter index (`at`: nullptr where none is given; `on_device`), once
/// all of them pass: a registered name, its size, memory the backend can use, no null pointer,
/// none given twice. The messages call a view `of` ("gradient of") and, when its name is
/// unknown, `for_` ("gradient for").
///
/// `shard_of` >= 0: a view may also be rank shard_of's shard alone (valid_len elements);
/// `whole` then says, per parameter, whether its view is the whole tensor.
template <class View, class Ptr>
error index_views(const plan& pl, const engine_options& opts, const std::vector<View>& views,
                  const std::string& of, const std::string& for_, std::vector<Ptr>& at,
                  std::vector<bool>& on_device, int shard_of = -1,
                  std::vector<bool>* whole = nullptr) {
  at.assign(pl.params.size(), nullptr);
  on_device.assign(pl.params.size(), false);
  if (whole)
    whole->assign(pl.params.size(), true);
  for (const auto& v : views) {
    const int i = pl.find(v.name);
    if (i < 0)
      return {errc::unknown_parameter,
              for_ + " '" + v.name + "', which is not a registered parameter"};
    const int64_t shard = shard_of >= 0 ? valid_len(pl.params[i], shard_of) : -1;
    if (v.size != pl.params[i].numel && v.size != shard)
      return {errc::shape_mismatch,
              of + " '" + v.name + "' has " + std::to_string(v.size) + " elements, expected "
                  + std::to_string(pl.params[i].numel)
                  + (shard_of >= 0 ? " (the whole tensor) or " + std::to_string(shard) + " (rank "
                                         + std::to_string(shard_of) + "'s shard)"
                                   : std::string())};
    if (whole)
      (*whole)[i] = v.size == pl.params[i].numel;
    if (v.size == 0)  // rank shard_of holds none of it (a short last dim-0 slice)
      continue;
    if (auto err = check_buffer(v, opts))
      return err;
    if (!v.data)
      return {errc::invalid_argument, of + " '" + v.name + "' is a null pointer"};
    if (at[i])
      return {errc::invalid_argument, of + " '" + v.name + "' is given twice"};
    at[i] = v.data;
    on_device[i] = v.space != memory_space::host;
  }
  return {};
}

struct engine::impl {
  engine_options opts;
  fault_options faults;  // tests only (arm_faults)
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
  std::shared_ptr<const job_end> job;  // a node of a multi-process job: why the job ended, if so
  int32_t host_collectives = 0;        // parameters()/sum_over_nodes() issued since the last step
  std::vector<param_spec> table;
  std::unordered_set<std::string> table_names;  // add_parameter's duplicate check, O(1) a call
  std::vector<std::vector<float>> init;
  std::shared_ptr<const plan> pl;
  std::vector<comm_actor> comms;       // of this process's ranks (host collectives use these too)
  std::vector<comm_actor> rank_comms;  // nccl across processes: the ranks' own; else empty
  std::string nccl_id;                 // from the rendezvous (multi-process nccl)
  std::vector<rank_actors> ranks;      // this process's ranks, by local index
  std::vector<reduce_window> windows;  // their reduce buckets in flight, by local index
  std::vector<host_buckets> packed;    // their host buffers for packed buckets, by local index
  std::vector<std::shared_ptr<trace::recorder>> traces;  // per local rank when tracing, else empty
  std::vector<int> micros;     // micro-batches handed over per local rank in the open step
  uint64_t step = 0;           // last step number issued
  uint64_t skipped_steps = 0;  // steps of this engine skipped for a non-finite gradient
  bool time_calls = false;     // time_backend_calls(): what the backends get when they are made
  lr_schedule muon_lr;
  lr_schedule adam_lr;
  std::map<int, group_hparams> group_set;  // set_group_hparams: the groups given values
  // Per local rank, per parameter: 1 where the open step handed it a gradient (reduce()).
  std::vector<std::vector<uint8_t>> touched;
  // MuonClip: per local rank, the largest logit per query head reported in the open step
  // (plan::qk_values entries once one is reported; report_qk_logits, engine_registry.cpp).
  std::vector<std::vector<float>> qk_logits;

  // reduce()'s bound on a rank's unanswered buckets (0: none). One local rank only: with
  // several, the host hands over rank after rank and a bucket lands only once all did
  // (reduce_all hands over on a thread per rank and keeps the bound).
  size_t buckets_in_flight() const {
    return local == 1 ? static_cast<size_t>(opts.max_buckets_in_flight) : 0;
  }

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
                  int node = 0) {
    opts = o;
    sys = system;
    first_rank = first;
    local = local_ranks;
    micros.assign(local_ranks, 0);
    qk_logits.assign(local_ranks, {});
    touched.assign(local_ranks, {});
    float muon = o.muon.lr;
    float adam = o.adamw.lr;
    muon_lr = [muon](uint64_t) { return muon; };
    adam_lr = [adam](uint64_t) { return adam; };
    std::string trace_dir = o.trace_dir.empty() ? trace::env_dir() : o.trace_dir;
    for (int i = 0; !trace_dir.empty() && i < local_ranks; ++i) {
      auto rec = trace::recorder::open(trace_dir, node, first + i, o.world);
      if (!rec)
        return rec.err();
      traces.push_back(std::move(*rec));
    }
    return {};
  }
  /// Starts the ranks at the first call that needs them (once, whichever thread gets there
  /// first: reduce() for different ranks may run on different threads), or says why not.
  error start() {
    {
      std::lock_guard<std::mutex> lock(stop_mutex);
      if (!stopped.empty())
        return {stopped_code, stopped};
    }
    if (job)
      if (auto what = job->what(); !what.empty())
        return {errc::comm_failure, job_over(what)};
    std::lock_guard<std::mutex> lock(start_mutex);
    return start_locked();
  }
  error start_locked();
  std::mutex start_mutex;
  /// The first failure that may have left the ranks in an unknown state: work of a step in
  /// flight or half applied (a bucket or a step not answered in time, a rank's step failing, a
  /// backend failure while handing over), or a start that got only part of the way. start()
  /// refuses every later call with it.
  std::string stopped;
  errc stopped_code = errc::bad_state;  // comm_failure when the job lost a node
  std::mutex stop_mutex;                // guards `stopped` (two ranks' reduce() may fail at once)
  /// Latches `err` (when set) as the failure that stops the engine `when` ("in step 3",
  /// "while starting"); returns it. On a node whose job lost another node (noticed within a
  /// moment of `err`), the loss is the error, and the engine's from then on.
  error stop(error err, const std::string& when) {
    if (err && job) {
      auto what = job->wait(kLossNoticed);
      if (!what.empty()) {
        std::lock_guard<std::mutex> lock(stop_mutex);
        if (stopped.empty()) {
          stopped = job_over(what);
          stopped_code = errc::comm_failure;
        }
        return {errc::comm_failure, what};
      }
    }
    std::lock_guard<std::mutex> lock(stop_mutex);
    if (err && stopped.empty())
      stopped = "the engine stopped " + when + " (" + err.to_string()
                + "); its ranks may be part of the way through it, so it takes no further call: "
                  "load a checkpoint into a new engine, and raise timeout_ms (zmuon.timeout_ms) if "
                  "the work only needs longer";
    return err;
  }
  /// How long a failed call waits for the node supervisor to name a lost node: a collective
  /// can fail on the dead peer's connection a moment before the supervisor hears of it.
  static constexpr std::chrono::milliseconds kLossNoticed{3000};
  /// The error of every call once the job has ended.
  static std::string job_over(const std::string& what) {
    return "the job is over (" + what + "): this engine takes no further call";
  }
  static std::string in_step(uint64_t step) { return "in step " + std::to_string(step); }
  /// Runs on `node`'s actor system as its ranks (engine::create(opts, node), and a joining
  /// process once it has joined).
  error adopt(const engine_options& options, const node_setup& node);
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
  /// Every hyperparameter group's values for `step` (engine_hparams.cpp), by group up to the
  /// highest a parameter uses; a schedule's bad learning rate is an error naming it.
  expected<std::vector<group_hparams>> step_groups(uint64_t step) const;
  /// The open step's touched mask, the same on every rank: 1 where some rank of the job handed
  /// the parameter a gradient (an OR over local ranks, then a sum over processes); empty when
  /// all were. Clears the local marks.
  expected<std::vector<uint8_t>> step_touched();
  error check_local(int rank) const;
  /// start() for a call on global rank `rank`: the rank is checked first (a bad one starts
  /// nothing), except where a joining process learns its ranks only when it starts.
  error start_for(int rank);
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
  /// Every local rank sends its parameter shard (`shards[i]`, in the plan's shard layout) to
  /// each node's first rank through `via` (an all-to-all-v); this process's first rank
  /// receives rank r's part of parameter k at `target[k] + r * shard_len` (a null `target[k]`,
  /// the same on every process, leaves parameter k out). Returns once every
  /// comm has answered (nccl: enqueued on the ranks' streams). `owner` keeps `shards` and
  /// `target` allocated while a comm still holds the request after a timeout (the caf comm
  /// writes the pieces that arrive late); null where the comm is done when it answers (nccl).
  error shards_to_node_leaders(const std::vector<comm_actor>& via,
                               const std::vector<float*>& shards, const std::vector<float*>& target,
                               const keep_alive& owner);
  /// The full parameters on this process's first rank, over the caf comms (parameters()).
  expected<tensor_map> gather_between_nodes();
  /// gather_params into device buffers for every parameter (`target`, by parameter index) in a
  /// multi-process job under nccl: each node's first rank receives every rank's shards in place;
  /// in the caller's stream order when `caller_stream` is set (else it waits for the copies).
  error gather_over_nccl(const std::vector<float*>& target, std::optional<void*> caller_stream);
};

}  // namespace zmuon
