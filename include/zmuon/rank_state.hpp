// One rank's shards, copied out of its partition store (tests, checkpoints, reading back).
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
};

}  // namespace zmuon
