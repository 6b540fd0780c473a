// engine_hand_over: the open step as the host hands it over, per local rank: its micro-batches,
// its reduce buckets in flight and their host buffers, the parameters given a gradient and
// MuonClip's logits. step() takes them to the ranks. Part of engine::impl (impl.hpp). Internal.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/host_buckets.hpp"
#include "engine/reduce_window.hpp"

namespace zmuon {

struct engine_hand_over {
  std::vector<reduce_window> windows;  // the reduce buckets in flight, by local index
  std::vector<host_buckets> packed;    // the host buffers for packed buckets, by local index
  std::vector<int> micros;             // micro-batches handed over per local rank in the open step
  // Per local rank: 1 where the open step's gradients are read where the caller keeps them
  // (hand_over's kept_until_step): the caller may write them once step() returns.
  std::vector<uint8_t> kept;
  // Per local rank: 1 while every hand-over of the open step was kept until the step (no bucket
  // buffer of it to free before the step's own).
  std::vector<uint8_t> only_kept;
  // Per local rank: 1 while the open step's one hand-over was ahead of the step (read only when
  // the step begins; withdrawn by anything else that comes first: engine::impl::withdraw_ahead).
  std::vector<uint8_t> ahead;
  // Per local rank: 1 once the reads of such a hand-over have begun (engine::begin_step, or the
  // step itself): the store was told (begin_reads).
  std::vector<uint8_t> begun;
  // Per local rank, per parameter: 1 where the open step handed it a gradient (reduce()).
  std::vector<std::vector<uint8_t>> touched;
  // MuonClip: per local rank, the largest logit per query head reported in the open step
  // (plan::qk_values entries once one is reported; report_qk_logits, engine_reduce.cpp).
  std::vector<std::vector<float>> qk_logits;

  /// Nothing handed over yet by `local_ranks` ranks (their windows come when the engine starts).
  void open(int local_ranks) {
    micros.assign(local_ranks, 0);
    kept.assign(local_ranks, 0);
    only_kept.assign(local_ranks, 1);
    ahead.assign(local_ranks, 0);
    begun.assign(local_ranks, 0);
    qk_logits.assign(local_ranks, {});
    touched.assign(local_ranks, {});
  }
};

}  // namespace zmuon
