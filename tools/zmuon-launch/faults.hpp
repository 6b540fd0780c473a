// zmuon-launch's fault-injection flags (tests of checkpoints and non-finite handling): they fill
// the fault_options that register_model arms (engine/faults.hpp).
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/faults.hpp"
#include "zmuon/status.hpp"

namespace zmuon::example {

struct fault_flags {
  std::vector<std::string> nonfinite;  // STEP:RANK:PARAM:MICRO[:VALUE]
  uint64_t kill_at_step = 0;
  std::string kill_in_save;  // STEP[:FILES]
};

/// Adds --inject-nonfinite, --kill-at-step and --kill-in-save to `app`, in a "Fault injection"
/// group.
void add_fault_flags(CLI::App& app, fault_flags& flags);

/// Parses the flags into `out`; errors name the flag and the text. A fault that the run of
/// `steps` steps of `gas` micro-batches would never reach is refused (a test that passes
/// because its fault never fired), and so is --kill-in-save at a step with no save: checkpoints
/// are saved at the multiples of `every` (0: none).
error apply_fault_flags(const fault_flags& flags, uint64_t steps, int gas, int every,
                        fault_options& out);

/// After a resume at `resumed_step`: a fault of `faults` at that step or before would never
/// fire either; the error names the first such flag.
error check_faults_after_resume(const fault_options& faults, uint64_t resumed_step);

}  // namespace zmuon::example
