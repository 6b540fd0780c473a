// partition_store: this rank's shards, in a few flat buffers owned by the compute backend: fp32
// master parameters, the accumulated gradient (gradient_shard.hpp), Muon momentum, Adam moments. It
// runs the element-wise phases of the step on them, but never decides whether a step happens.
//
// Interface:
//   accumulate -> ack        (reducer) add a reduced bucket slice to the gradient shard (a
//                            bucket's first slice of a step is copied in: a zeroed gradient is
//                            only marked unwritten, never filled, until something reads it);
//                            a bucket's first pieces of a step (the caller's device gradients,
//                            kept until the step) are only scanned, and the momentum and the
//                            non-Muon rule read each parameter's gradient where it lies
//   scan_grads -> grad_scan  (loss scaler) non-finite flag and sum of squares of the gradient;
//                            where the momentum may go ahead of the vote (spawned with
//                            muon_in_momentum), a bucket read in place scans its non-Muon
//                            gradients alone, and the Muon ones are scanned by the chunks'
//                            muon_momentum (writes = spare) in their own pass: scan_grads
//                            waits until the calls of chunks [0, chunks_ahead) are enqueued
//                            and scans the other chunks' Muon gradients itself
//   discard_grads -> ack     (coordinator, overflow) zero the gradient; nothing else changes
//   unscale_clip -> ack      (coordinator) the step applies: gradient *= clip / (scale *
//                            micro-batches); keeps the step's group table and touched mask,
//                            and each group's Muon rule derived from the table
//                            (kernels/muon_rule.hpp): the step's messages below take every
//                            value from them
//   muon_momentum -> ack     (coordinator) momentum update of one chunk; u written to `out`;
//                            `writes = spare` (ahead of the vote): the new momentum into the
//                            spare, which finish_step of that step makes the momentum
//   apply_muon -> ack        (coordinator) the update of one chunk under each group's rule
//                            (compute_backend::muon_update_slices: p = p*(1 - lr*wd) -
//                            lr*scale*o, cautious: the decay only where p * o >= 0,
//                            arXiv:2510.12402); bf16 o arrives unscaled and is scaled here
//   adamw_step -> ack        (coordinator) the non-Muon rule (kernels/scalar_rules.hpp) on all
//                            non-Muon shards, per group
//   normuon_step -> ack      (coordinator, owner, applied steps only) the rule's transform after
//                            NS (NorMuon's row normalization, compute_backend::post_ns) of the
//                            NS blocks this rank owns in a chunk, and an fp32 block's scale:
//                            updates their row moments, which this store keeps
//   finish_step -> ack       (coordinator) zero the gradient after an applied step; its spare
//                            momentum, if written, becomes the momentum
//   qk_clip_scale -> ack     (coordinator, MuonClip) scale ranges of the parameter shard
//   copy_in_grads -> ack     (host, a step() that failed before it began) the buckets read
//                            where the caller keeps them copied in (enqueued)
//   begin_reads              (host, a step of gradients handed over ahead of it) the scans the
//                            step's first read would enqueue, enqueued at once
//   load_params -> ack       (host) set the parameter shard
//   load_state -> ack        (host, checkpoint load) set params, momentum, Adam moments, the
//                            AdamW step count and the row moments; zero the gradient
//   snapshot_atom -> store_snapshot  (host, tests) a copy of all state
//   saved_state_atom -> store_snapshot  (host, checkpoint save) a copy of what a checkpoint
//                                    keeps: all state but the gradient (left empty, and the
//                                    gradient buffer not written: it is only marked zero)
//   params_atom -> vector<float>     (host) a copy of the parameter shard
//   params_view_atom -> float_view   (host, between steps) the parameter shard's buffer itself,
//                                    for copies into the caller's device buffers
//   gpu_done                (its compute backend's completion callback) a scan's result has
//                           landed on the host, or the step's kernels have finished: the
//                           waiting scan_grads / finish_step is answered
#pragma once

#include <memory>

#include "caf/actor_system.hpp"

#include "actors/interfaces.hpp"
#include "kernels/compute.hpp"
#include "plan/plan.hpp"
#include "trace/recorder.hpp"

namespace zmuon {

using partition_store_actor = caf::typed_actor<
    caf::replies_to<accumulate>::with<ack>, caf::replies_to<scan_grads>::with<grad_scan>,
    caf::replies_to<discard_grads>::with<ack>, caf::replies_to<unscale_clip>::with<ack>,
    caf::replies_to<muon_momentum>::with<ack>, caf::replies_to<apply_muon>::with<ack>,
    caf::replies_to<adamw_step>::with<ack>, caf::replies_to<finish_step>::with<ack>,
    caf::replies_to<load_params>::with<ack>, caf::replies_to<load_state>::with<ack>,
    caf::replies_to<copy_in_grads>::with<ack>, caf::reacts_to<begin_reads>,
    caf::replies_to<snapshot_atom>::with<store_snapshot>,
    caf::replies_to<saved_state_atom>::with<store_snapshot>,
    caf::replies_to<params_atom>::with<std::vector<float>>,
    caf::replies_to<params_view_atom>::with<float_view>, caf::reacts_to<gpu_done>,
    caf::replies_to<qk_clip_scale>::with<ack>, caf::replies_to<normuon_step>::with<ack>>;

/// `muon_in_momentum`: the step's Muon momentum may go ahead of the vote
/// (momentum_may_precede_vote): buckets read in place leave their Muon gradients' scan to the
/// momentum calls (scan_grads above).
partition_store_actor spawn_partition_store(caf::actor_system& sys, std::shared_ptr<const plan> pl,
                                            int rank, std::shared_ptr<compute_backend> backend,
                                            std::shared_ptr<trace::recorder> tracer = nullptr,
                                            bool muon_in_momentum = false);

}  // namespace zmuon
