// `zmuon-trace perfetto`: the traces as Chrome Trace Event JSON, which Perfetto (ui.perfetto.dev)
// and chrome://tracing open. One process per rank (pid = rank), one track per actor (tid):
//   send   "X" slice "send <type>" of 1 ns (so that a flow has a slice to start from)
//   recv   "X" slice "<type>" for the handler's run time
//   span   a wait for an answer (reduce_scatter, vote, gather, scatter, apply, step, ...):
//          nestable async "b"/"e" pair, cat "wait" (waits overlap); work (ns): "X" slice
//          "<phase>", cat "phase"
//   compute the backend's calls: "X" slice "<call>", cat "compute", on a track of their own per
//          stream (CUDA's main stream, each Newton-Schulz lane; the host's calls on one)
//   reply  "i" instant "reply <type>"
//   flows  "s" at each send, "f" (binding to the enclosing slice) at its receive, one id each
// Times are microseconds from the earliest record, on the aligned clock (reader.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include "zmuon-trace/reader.hpp"

namespace zmuon::trace_tool {

/// The track (tid) of an actor: host 1, reducer 2, partition_store 3, loss_scaler 4,
/// muon_coordinator 5, caf_comm 6, any other 7.
int actor_tid(const std::string& actor);
/// The track of a record: its actor's, or for a compute call 8 + its stream's track.
int record_tid(const record& r);

nlohmann::json to_perfetto(const trace_set& ts);

}  // namespace zmuon::trace_tool
