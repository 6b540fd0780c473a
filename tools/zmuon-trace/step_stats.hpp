// Per-step figures from a trace (bench/step's report): for every step and rank the
// exclusive time of each phase of the step protocol, the bytes the rank's comm sent to its peers
// by collective kind, and the host time its actors spent in plumbing.
//
// Definitions (all from the records of trace/recorder.hpp; times are ns):
//
// window   the coordinator's own step on that rank: from its `recv step_request` to the end of its
//          last activation (handler or reply continuation) carrying that step.
// wall     per step, over all ranks: from the first record of the step (the host's first
//          `send micro_grads`, i.e. the start of reduce()) to the end of the last host `step`
//          span (step() answered). reduce() hand-over and step() together.
// phases   the window cut into disjoint pieces: at each instant the time goes to the span (any
//          actor of the rank, that step, the host's `step` span and the compute backend's calls
//          excepted) that started last among
//          those active then, the innermost one for nested spans (vote inside overflow_check, ns
//          after its gather); time covered by no span is `other` (the coordinator between
//          messages, or on CUDA waiting for the GPU's completion). So the phases, `other`
//          included, sum to the window exactly. Wait spans (reduce_scatter, flush, vote,
//          momentum, gather, scatter, apply, adamw, ...) run from a request to its answer: on CUDA
//          the answer comes once the work is enqueued, and `ns` is the enqueue time.
// bytes    `send` records with a peer rank (the caf comm's peer pieces), summed by `op`. The
//          `bytes` field is the payload as recorded (real payload bytes, whatever the transport's
//          element size). The nccl comm records nothing, so under nccl this is empty.
// plumbing activations of the actors that only route work (muon_coordinator, loss_scaler,
//          reducer): every handler (`recv`, t..t+dur) and reply continuation (`reply`,
//          t..t+dur), minus the backend-work spans (non-wait spans: `ns`, and `buffers`: the
//          allocation, staging copies and release of the coordinator's chunk buffers and the
//          reducer's packing of a bucket) nested in them. The
//          handlers of partition_store (backend calls: momentum, apply, AdamW, accumulate, the
//          scans) and of the caf comm (copies and reductions of pieces) are work, not plumbing,
//          and so is the host thread. Message transit time (a mailbox, a scheduler hand-off)
//          costs no host time in a handler and is not counted here; it shows up in `other`.
//          `plumbing_records` counts the trace records written inside those activations (their
//          own included), so that the trace's cost can be taken out: net = raw - records x the
//          cost of one record (measured by the caller).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zmuon-trace/reader.hpp"

namespace zmuon::trace_tool {

struct rank_step {
  int rank = 0;
  int64_t window_ns = 0;
  std::map<std::string, int64_t> phase_ns;       // exclusive; "other": no span active
  std::map<std::string, int64_t> sent_bytes;     // by collective kind (op)
  std::map<std::string, int64_t> sent_messages;  // by collective kind (op)
  int64_t plumbing_ns = 0;                       // raw, as measured (trace cost included)
  int64_t plumbing_records = 0;                  // records written inside those activations
  int64_t activations = 0;                       // handlers and continuations counted
  int64_t records = 0;                           // all records of the step on this rank
  /// plumbing_ns by "actor recv|reply type" (a reply's type is the answer's).
  std::map<std::string, int64_t> plumbing_by;
  /// plumbing_ns less `record_cost_ns` per record written inside it (never below 0).
  int64_t plumbing_net_ns(int64_t record_cost_ns) const;
};

struct step_figures {
  uint64_t step = 0;
  int64_t wall_ns = 0;           // 0 when the trace has no host `step` span for it
  std::vector<rank_step> ranks;  // ranks whose coordinator ran the step, by rank
};

/// The figures of every step (> 0) that some rank's coordinator ran, by step.
std::vector<step_figures> step_stats(const trace_set& ts);

/// The actors whose handlers count as plumbing (see above).
bool is_plumbing_actor(const std::string& actor);

}  // namespace zmuon::trace_tool
