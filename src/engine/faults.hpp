// Fault injection, for tests of the reliability paths: a poisoned gradient, a process that
// SIGKILLs itself. Internal: tests and zmuon-launch arm it; nothing is injected by default.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zmuon/status.hpp"

namespace zmuon {

class engine;

struct nonfinite_fault {
  uint64_t step = 0;                 // the step whose micro-batch is poisoned
  int rank = 0;                      // the rank handing the gradient over
  std::string param;                 // the parameter whose gradient (element 0) is poisoned
  int micro = 0;                     // the micro-batch (0-based) within the step
  float value = __builtin_nanf("");  // NaN by default; +-inf works too
};

struct fault_options {
  std::vector<nonfinite_fault> nonfinite;  // engine::reduce writes `value` into these gradients
  uint64_t kill_at_step = 0;          // the process SIGKILLs itself as step() of this step begins
  uint64_t kill_in_save_at_step = 0;  // the process SIGKILLs itself in the checkpoint save of
  int kill_in_save_after_files = 1;   // this step, after this many shard files are written
};

/// Arms `faults` on `eng`. Only before the engine starts (its first reduce, step or checkpoint
/// load); a parameter or rank the job does not have is refused when it starts.
error arm_faults(engine& eng, const fault_options& faults);

/// The faults armed on `eng` (none by default).
const fault_options& armed_faults(const engine& eng);

}  // namespace zmuon
