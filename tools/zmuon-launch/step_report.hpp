// What zmuon-launch does around each step for the config's DeepSpeed keys: the scheduler
// section's learning rates, steps_per_print, and the metrics monitor's files.
#pragma once

#include <memory>
#include <optional>

#include "embed/metrics_monitor.hpp"
#include "train.hpp"
#include "zmuon/config.hpp"
#include "zmuon/engine.hpp"

namespace zmuon::example {

class step_report {
public:
  /// Installs the job's lr schedule on `eng`; `lead`: this process writes the monitor's files.
  step_report(engine& eng, const job_config& job, bool lead);
  /// Opens the monitor's files (the lead only); an error names the path.
  error open();
  /// As a step begins (train's on_step_start).
  void started();
  /// As a step ends: writes its figures; whether the display shows it (steps_per_print, and
  /// always the last of `total` steps).
  expected<bool> finished(const step_record& rec, int total);

private:
  engine* eng_;
  job_config job_;
  bool lead_;
  std::optional<metrics_monitor> monitor_;
  std::unique_ptr<step_recorder> recorder_;
};

}  // namespace zmuon::example
