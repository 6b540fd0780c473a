// reducer: reduce-scatters each micro-batch's gradient buckets into this rank's shards.
// Never runs Muon or Newton-Schulz and never touches momentum: that waits for the step.
//
// Interface:
//   micro_grads -> ack (host)   one bucket of one micro-batch, packed rank-major. The reducer
//                               issues its reduce-scatter (mean over ranks, in place: the
//                               rank's own part of the bucket becomes the reduced slice) at once
//                               and sends that slice to the store (accumulate); answered once the
//                               store has acknowledged it (the bucket's buffers released first),
//                               or with the error (wrong shape or index, another step open, a
//                               failed reduce-scatter or accumulate). Errors are also kept for
//                               the flush. The host bounds the buckets it has not had answered
//                               (engine_options::max_buckets_in_flight), so the replies are the
//                               back-pressure that bounds the buckets' memory. A `reduced`
//                               bucket (the rank's part alone of a gradient the host already
//                               averaged: DDP, FSDP2) skips the reduce-scatter; given as
//                               pieces of the caller's gradients, it goes to the store as they
//                               are.
//   discard_grads -> ack (host)  the open step's micro-batches forgotten (a hand-over ahead of
//                               the step withdrawn, every bucket of it answered first).
//   flush -> flush_done (coordinator)
//                               answered once every bucket of the step handed over so far has
//                               landed in the store, with the number of micro-batches; answered
//                               with the first error if a reduce-scatter or accumulate failed.
#pragma once

#include <memory>

#include "caf/actor_system.hpp"

#include "actors/interfaces.hpp"
#include "comm/comm.hpp"
#include "kernels/compute.hpp"
#include "plan/plan.hpp"
#include "trace/recorder.hpp"

namespace zmuon {

using reducer_actor = caf::typed_actor<caf::replies_to<micro_grads>::with<ack>,
                                       caf::replies_to<discard_grads>::with<ack>,
                                       caf::replies_to<flush>::with<flush_done>>;

/// `device`: set when the comm backend moves device memory (nccl); each bucket is then copied
/// into that backend's memory before its reduce-scatter, and the slice sent to the store is
/// device memory too. Without it, both stay in host memory (the caf comm).
reducer_actor spawn_reducer(caf::actor_system& sys, std::shared_ptr<const plan> pl, int rank,
                            store_accumulate_actor store, comm_actor comm,
                            std::shared_ptr<compute_backend> device = nullptr,
                            std::shared_ptr<trace::recorder> tracer = nullptr);

}  // namespace zmuon
