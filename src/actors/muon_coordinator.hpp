// muon_coordinator: the step state machine (docs/DESIGN.md §1) and the gather-NS-scatter pipeline
// (§3). Nothing of Muon that writes state runs before the loss scaler's report says "no
// overflow" for the step (ahead of the vote, zmuon.momentum_before_vote, only u, the spare
// momentum and Newton-Schulz do), and Newton-Schulz runs exactly once per Muon matrix per applied
// step, whatever gas is.
//
// Interface:
//   step_request -> step_result  (host) run optimizer step `step` (docs/DESIGN.md §1 numbers
//     the same sub-steps; the .cpp's sections follow them):
//     1. flush           reducer: every bucket of the step has landed in the store
//     2. the vote        loss scaler: one all-reduce over ranks of the non-finite flags and
//                        the sums of squares; overflow -> discard_grads, answer skipped.
//                        Otherwise the raw gradient norm and the clip coefficient from it
//     3. unscale_clip    store: gradient *= clip / (loss scale * micro-batches); carries the
//                        step's group table and touched mask, once, for what follows
//     4. per Muon chunk, in the fixed order G0 G1 S0 G2 S1 ... : muon_momentum (store),
//        gather u shards to owners, Newton-Schulz on the owner under each group's rule
//        (kernels/muon_rule.hpp; a rule with a transform after NS, NorMuon: normuon_step, the
//        owner's store transforms the blocks it owns), scatter result shards, apply_muon
//        (store). Gather and scatter carry fp32 or bf16 (muon_wire_type): with
//        bf16 every shard, the rank's own too, is rounded once each way, and the update scale
//        moves from the owner to the receiving store so that NS's output travels unscaled.
//        Each Muon parameter is a list of NS blocks (plan.hpp, muon_block), each with its owner.
//        At world 1, where the plan's Muon state order makes u the owner's buffer, the chunk
//        has no gather and no scatter: NS runs on u, apply_muon reads the result there
//     5. adamw_step      store: each group's non-Muon rule on every non-Muon shard, sent
//                        once the last chunk's NS is enqueued (it runs beside that NS)
//     6. MuonClip        pairs: a max all-reduce of the query heads' logits, then
//                        qk_clip_scale (store) on this rank's shard of the clipped heads
//     7. finish_step     store: the gradient marked zero (and a spare momentum, below, made the
//                        momentum); answer the result
//   Ahead of the vote (world 1, one micro-batch, no clipping, no fp16, no NorMuon; DESIGN.md
//   §1): 3 goes out with the vote, and every chunk's muon_momentum writes u and the new
//   momentum into the store's spare (writes = spare), which finish_step makes the momentum;
//   the scatter (apply) and 5 wait for the vote; a refused step ends once the momentum
//   requests have landed, the momentum as it was.
//   gpu_done  (the rank's compute backend, from its completion callback) a chunk's GPU work has
//             finished: with the caf comm on a GPU, u and the NS result are copied to host
//             mirrors first, and the chunk moves on only when this arrives; no thread waits.
#pragma once

#include <memory>

#include "caf/actor_system.hpp"

#include "actors/interfaces.hpp"
#include "actors/update_rule.hpp"
#include "comm/comm.hpp"
#include "kernels/compute.hpp"
#include "plan/plan.hpp"
#include "trace/recorder.hpp"
#include "zmuon/options.hpp"

namespace zmuon {

using muon_coordinator_actor =
    caf::typed_actor<caf::replies_to<step_request>::with<step_result>, caf::reacts_to<gpu_done>>;

/// The peers a coordinator talks to.
struct coordinator_peers {
  reducer_flush_actor reducer;
  scaler_check_actor scaler;
  store_step_actor store;
  comm_actor comm;
};

muon_coordinator_actor spawn_muon_coordinator(caf::actor_system& sys,
                                              std::shared_ptr<const plan> pl, int rank,
                                              const engine_options& opts, coordinator_peers peers,
                                              std::shared_ptr<compute_backend> backend,
                                              std::shared_ptr<trace::recorder> tracer = nullptr);

/// Whether a step's Muon momentum may go ahead of its vote under `opts` and `pl` (the
/// conditions that hold for every step: zmuon.momentum_before_vote on for this backend, world
/// 1, Muon chunks, no clipping, no fp16); each step then decides for itself (the .cpp's
/// ahead_of_vote). Where it may, the store leaves the scan of the Muon gradients to the
/// momentum calls (partition_store.hpp, scan_grads).
bool momentum_may_precede_vote(const engine_options& opts, const plan& pl);

/// What the gather and the scatter carry under `opts` (muon.transport; "auto" is NS's own
/// precision: bf16 on the cuda backend, fp32 on host).
wire_type muon_wire_type(const engine_options& opts);

}  // namespace zmuon
