// The protocol checks of `zmuon-trace check` (docs/DESIGN.md §9), over the traces of all ranks:
//   ns_once        NS exactly once per Muon matrix per applied step, never on a skipped step
//   after_report   nothing of Muon (momentum, gather, NS, scatter, apply) of a step before that
//                  rank's overflow report of the step
//   momentum       no momentum write (the store handling muon_momentum) on a skipped step; a
//                  write into the spare (op spare, a step ahead of its vote) leaves it as it was
//   compute        no compute backend call that changes the optimizer's state (momentum,
//                  newton_schulz, apply_update, adamw) in a skipped step, nor one of a step
//                  before that rank's overflow report (50 us of slack: on CUDA the device's
//                  clock is mapped onto the host's): the backend's own record, below the
//                  messages (compute spans, trace/recorder.hpp)
//   qk_clip        no MuonClip scaling (the store's qk_clip span) on a skipped step
//   collectives    the same sequence of collectives on every rank: at the first divergence,
//                  each rank that differs from the majority (ties: the lowest rank)
//   answered       every request answered
// A step is skipped when an overflow report of that step says overflow on any rank.
// In a run cut short (trace_set::cut, reader.hpp) the step some rank's file ends in
// and later ones are left out: their records may be incomplete, and checking them would report
// what the truncation did (a never-answered request, an NS that never ran, a shorter sequence of
// collectives), not the protocol. `answered` leaves out the step before as well: the reply that
// ends a step is written after the host was answered, so it may follow the next step's records.
#pragma once

#include <string>
#include <vector>

#include "zmuon-trace/reader.hpp"

namespace zmuon::trace_tool {

struct violation {
  std::string rule;
  int rank = -1;  // -1: no single rank (e.g. an NS that ran nowhere)
  uint64_t step = 0;
  std::string message;
  std::vector<const record*> records;  // the offending records
};

std::vector<violation> check(const trace_set& ts);

/// "rank 1, step 3: ..." with the records below, one per line (file:line and the record).
std::string format(const trace_set& ts, const violation& v);

}  // namespace zmuon::trace_tool
