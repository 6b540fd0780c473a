// The nccl communication backend (docs/DESIGN.md §5): one NCCL communicator per rank, on the GPU of
// that rank's CUDA compute backend, enqueued on the backend's stream.
//
// Interface: comm_actor (comm/comm.hpp), on device memory:
//   reduce_scatter_req -> comm_done          ncclReduceScatter with ncclAvg
//   all_to_all_req     -> comm_done          ncclSend / ncclRecv per segment in one group
//                                            (ncclFloat, or ncclBfloat16 when elem is bf16)
//   all_reduce_req     -> all_reduce_result  the doubles go through the device and back
// comm_done is answered as soon as the collective is enqueued: the rank's actors share one CUDA
// stream, so whatever they enqueue after the reply runs after the collective. all_reduce_result
// carries host values, so it is answered when an event recorded after the copy back has fired;
// the actor polls that event with delayed messages and never blocks its scheduler thread.
//
// Failures: a failing NCCL call, or an asynchronous error found by the poll that runs every
// `poll_ms` (ncclCommGetAsyncError: a peer died, a network error), aborts the communicator,
// answers every pending request with errc::comm_failure naming the rank and the NCCL error,
// and stops the actor with that error.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "caf/actor_system.hpp"

#include "comm/comm.hpp"
#include "kernels/compute.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

/// The opaque NCCL unique id (ncclUniqueId's bytes): made by rank 0, handed to every rank by the
/// launcher's rendezvous.
using nccl_unique_id = std::string;

/// A new unique id, or an error naming why NCCL cannot make one.
expected<nccl_unique_id> make_nccl_unique_id();

/// Ranks [first_rank, first_rank + backends.size()) of a job of `world` ranks that may live in
/// several processes: joins the communicator of `id` (blocks until all `world` ranks have
/// joined). backends[i] is rank first_rank + i's CUDA backend; their devices must be distinct.
expected<std::vector<comm_actor>> spawn_nccl_comms(
    caf::actor_system& sys, int first_rank, int world, const nccl_unique_id& id,
    const std::vector<std::shared_ptr<compute_backend>>& backends, int poll_ms = 100);

/// In-process ranks, one GPU each: backends[r] is rank r's CUDA backend; their devices must be
/// distinct (NCCL rejects two ranks on one GPU: use the caf comm to share a GPU).
expected<std::vector<comm_actor>> spawn_nccl_comm_group(
    caf::actor_system& sys, const std::vector<std::shared_ptr<compute_backend>>& backends,
    int poll_ms = 100);

}  // namespace zmuon
