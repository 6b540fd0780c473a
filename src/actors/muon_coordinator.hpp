// muon_coordinator: the step state machine (docs/DESIGN.md §1) and the gather-NS-scatter pipeline
// (§3). Nothing of Muon runs before the loss scaler's report says "no overflow" for the step,
// and Newton-Schulz runs exactly once per Muon matrix per applied step, whatever gas is.
//
// Interface:
//   step_request -> step_result  (host) run optimizer step `step`:
//     1. flush           reducer: every bucket of the step has landed in the store
//     2. check_overflow  loss scaler: one all-reduce over ranks of the non-finite flags and
//                        the sums of squares: the vote and the raw gradient norm together
//        overflow -> discard_grads, answer skipped
//     3. the clip coefficient from that norm
//     4. unscale_clip    store: gradient *= clip / (loss scale * micro-batches)
//     5. per Muon chunk, in the fixed order G0 G1 S0 G2 S1 ... : muon_momentum (store),
//        gather u shards to owners, Newton-Schulz on the owner, scatter result shards,
//        apply_muon (store); gather and scatter carry fp32 or bf16 (muon_wire_type): with
//        bf16 every shard, the rank's own too, is rounded once each way, and the update scale
//        moves from the owner to the receiving store so that NS's output travels unscaled.
//        Each Muon parameter is a list of NS blocks (plan.hpp, muon_block), each with its owner
//        NorMuon (muon_variant::normuon): after NS, normuon_step asks this rank's store to
//        normalize the rows of the NS blocks it owns (their row moments live there), then
//        the update is scaled (bf16: the blocks' scale ratios); only here, so a skipped step
//        never writes them
//     6. adamw_step (store); MuonClip pairs: a max all-reduce of the query heads' logits, then
//        qk_clip_scale (store) on this rank's shard of the clipped heads; finish_step (store),
//        answer the result
//   gpu_done  (the rank's compute backend, from its completion callback) a chunk's GPU work has
//             finished: with the caf comm on a GPU, u and the NS result are copied to host
//             mirrors first, and the chunk moves on only when this arrives; no thread waits.
#pragma once

#include <memory>

#include "caf/actor_system.hpp"

#include "actors/interfaces.hpp"
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

/// What the gather and the scatter carry under `opts` (muon.transport; "auto" is NS's own
/// precision: bf16 on the cuda backend, fp32 on host).
wire_type muon_wire_type(const engine_options& opts);

/// Scale of the orthogonalized update of one [rows, cols] block (docs/DESIGN.md §2).
float update_scale(adjust_lr_rule rule, int64_t rows, int64_t cols);

}  // namespace zmuon
