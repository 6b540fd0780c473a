// The message trace's writer (docs/DESIGN.md §9): one JSON Lines file per rank, one record per
// line. No CAF here; trace/trace.hpp puts it on the actors' sends, receives and replies.
//
// File: DIR/trace-node<N>-rank<R>.jsonl. First line `{"ev":"meta",...}` (node, rank, world, host,
// pid, clock); then, in write order, records with a per-file sequence number `seq` and a
// monotonic time `t` (steady_clock, ns; the same clock for every rank of one host):
//   plan   the Muon parameters (index, name) and chunk count, once the engine has its plan
//   send   an actor sent a message; `req` true when it expects an answer
//   recv   an actor handled a message: `t` when its handler started, `dur` how long it ran
//   reply  the answer to a request reached the requester (`type` of the answer, or `error`);
//          `dur`: how long the requester's continuation ran (recorded when it returns)
//   span   a phase with its byte count: reduce_scatter, vote, gather, ns, scatter, apply,
//          momentum, ... `wait: true` for a requester's wait from request to answer; ns (the
//          compute itself) carries `params`, the Muon parameters it orthogonalized; `buffers`
//          is buffer work inside a handler (allocation, staging copies, release, packing)
//          actor `compute`: one call of the rank's compute backend (compute_backend::trace_calls;
//          `phase` the call's name: newton_schulz, momentum, accumulate, nccl all_to_all, ...),
//          when its work ran: on CUDA on the device (its events mapped onto this clock), with
//          `track` 0 for the main stream and 1 + i for Newton-Schulz lane i; on the host on the
//          handler's thread (track 0). Its `step` is the step whose first record in this file
//          began last at or before the call (0 before the first step)
// Messages carry `type`, `step`, and where they apply `micro`, `index` (bucket or chunk), `op`
// (collective kind), `bytes` (tensor data the message carries or lends), `peer` (rank), and `id`,
// the correlation id shared by a send, its recv and its reply.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zmuon/status.hpp"

namespace zmuon::trace {

/// Monotonic time in nanoseconds (steady_clock).
int64_t now_ns();

/// What a record says about one message or phase.
struct fields {
  const char* type = "";
  uint64_t step = 0;
  int32_t micro = -1;  // -1: does not apply
  int32_t index = -1;  // bucket or chunk; -1: does not apply
  int64_t bytes = 0;
  const char* op = nullptr;     // collective kind
  const char* phase = nullptr;  // the phase a request's wait is a span of
  const char* flag = nullptr;   // a boolean the checks read: "overflow", "skipped"
  bool flag_value = false;
};

/// The file of one rank. Thread-safe: the rank's actors and the host thread write to it.
class recorder {
public:
  /// Creates DIR if needed and opens (truncates) the rank's file; writes the meta line.
  static expected<std::shared_ptr<recorder>> open(const std::string& dir, int node, int rank,
                                                  int world);
  ~recorder();
  recorder(const recorder&) = delete;
  recorder& operator=(const recorder&) = delete;

  int node() const { return node_; }
  int rank() const { return rank_; }
  const std::string& path() const { return path_; }

  /// Appends one record; `body` is the JSON object's members after "seq" (no braces).
  void write(const std::string& body);
  void flush();

  // The records (callers check that tracing is on first).
  void send(const char* actor, int64_t t, const fields& f, const std::string& id, bool request,
            int peer = -1);
  void recv(const char* actor, int64_t t, int64_t dur, const fields& f, const std::string& id);
  /// `dur` >= 0: how long the requester's continuation ran (written as `dur`).
  void reply(const char* actor, int64_t t, const fields& answer, const std::string& id,
             const std::string& error = {}, int64_t dur = -1);
  /// A phase; `wait`: the requester's wait from request to answer (it overlaps the actor's other
  /// work), else work the actor itself did in that time.
  void span(const char* actor, const char* phase, int64_t t, int64_t dur, const fields& f,
            const std::vector<int>* params = nullptr, bool wait = false);
  /// One call of the rank's compute backend, from t for dur ns (compute_backend::traced_call).
  void compute(const char* name, int track, int64_t t, int64_t dur);
  /// The Muon parameters (plan order index, name) and the number of chunks.
  void plan(const std::vector<std::pair<int, std::string>>& muon_params, int chunks);

  /// The file name of a rank's trace inside its directory.
  static std::string file_name(int node, int rank);

private:
  recorder() = default;
  /// write(), noting first that a record of `step` began at t (for compute()'s step).
  void write(const std::string& body, uint64_t step, int64_t t);
  /// Appends one record with the next sequence number; under mu_.
  void append(const std::string& body);
  /// The step whose first record began last at or before t; under mu_.
  uint64_t step_at(int64_t t) const;
  std::mutex mu_;
  /// (step, earliest t of its records) for the last kSteps steps seen, in step order.
  std::vector<std::pair<uint64_t, int64_t>> step_starts_;
  static constexpr size_t kSteps = 64;
  FILE* file_ = nullptr;
  uint64_t seq_ = 0;
  int node_ = 0;
  int rank_ = 0;
  std::string path_;
};

/// The trace directory the environment asks for: $ZMUON_TRACE, or empty.
std::string env_dir();

}  // namespace zmuon::trace
