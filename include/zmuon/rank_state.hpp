// One rank's shards, copied out of its partition store (tests, checkpoints, reading back), and
// the loss scaler's counters.
#pragma once

#include <cstdint>
#include <vector>

namespace zmuon {

struct rank_state {
  std::vector<float> params;      // fp32 master parameters
  std::vector<float> grads;       // accumulated gradient of the open step
  std::vector<float> momentum;    // Muon momentum
  std::vector<float> exp_avg;     // Adam first moment
  std::vector<float> exp_avg_sq;  // Adam second moment
  int64_t adam_steps = 0;         // AdamW steps applied
  // Per AdamW parameter in table order, the steps that touched it (Adam's bias correction); the
  // same on every rank. Empty in a state to load: every one is adam_steps.
  std::vector<int64_t> adam_param_steps = {};
  // NorMuon's row second moments of the NS blocks this rank owns (plan/ownership.hpp's
  // row_moment_offsets). Empty in a state to load: zeros.
  std::vector<float> row_moments = {};
};

/// The dynamic loss scaler's whole state (DeepSpeed's counters), as checkpoints keep it.
struct loss_scale_snapshot {
  float scale = 1;
  int64_t iter = 0;
  int64_t last_overflow_iter = -1;
  int32_t hysteresis_left = 1;
};

}  // namespace zmuon
