// loss_scaler: owns the loss scale, its growth/backoff/hysteresis counters (DeepSpeed's dynamic
// loss scaler), and the overflow vote across ranks. Never touches parameters.
//
// Interface:
//   check_overflow -> overflow_report  (coordinator) scan the local gradient shard, then one
//                                      all-reduce (sum) of its non-finite flag and its sum of
//                                      squares over ranks: overflow when any flag is set; update
//                                      the scale. The report carries the scale used, the next
//                                      one and the global sum of squares (for the clip norm)
//   scale_atom -> float                (host) the scale to multiply the next loss by
//   scaler_state_atom -> loss_scale_snapshot  (host, checkpoint save) the scale and its counters
//   restore_scaler -> ack              (host, checkpoint load) continue from a saved state
// Without fp16 the scale stays 1 and a non-finite gradient is still reported as an overflow,
// so the step is skipped (docs/DESIGN.md §2).
#pragma once

#include "caf/actor_system.hpp"

#include "actors/interfaces.hpp"
#include "comm/comm.hpp"
#include "trace/recorder.hpp"
#include "zmuon/options.hpp"

namespace zmuon {

using loss_scaler_actor =
    caf::typed_actor<caf::replies_to<check_overflow>::with<overflow_report>,
                     caf::replies_to<scale_atom>::with<float>,
                     caf::replies_to<scaler_state_atom>::with<loss_scale_snapshot>,
                     caf::replies_to<restore_scaler>::with<ack>>;

/// The scale arithmetic alone, a plain value type (the actor wraps one).
class loss_scale_state {
public:
  explicit loss_scale_state(const fp16_options& opts);
  float scale() const { return scale_; }
  /// Applies one step's vote; returns the scale for the next step.
  float update(bool overflow);
  /// The counters, for checkpoints; restore() continues from them.
  loss_scale_snapshot save() const;
  void restore(const loss_scale_snapshot& s);

private:
  fp16_options opts_;
  float scale_ = 1;
  int64_t iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int hysteresis_left_ = 1;
};

loss_scaler_actor spawn_loss_scaler(caf::actor_system& sys, const fp16_options& opts,
                                    store_scan_actor store, comm_actor comm,
                                    std::shared_ptr<trace::recorder> tracer = nullptr);

}  // namespace zmuon
