// What an engine made from a config does around each step for the config's DeepSpeed keys, for
// the C ABI's engines: the notes, the lr schedule, the monitor's files and a host's callback.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "embed/metrics_monitor.hpp"
#include "zmuon/config.hpp"
#include "zmuon/engine.hpp"

namespace zmuon {

class job_hooks {
public:
  /// Installs `job`'s lr schedule on `eng` and opens its monitor's files.
  static expected<std::unique_ptr<job_hooks>> make(engine& eng, const job_config& job);
  /// The config's notes, one a line ("" when none).
  const std::string& notes() const { return notes_; }
  /// Each step's record (JSON text) goes to `callback` as well (empty: none).
  void set_callback(std::function<void(const std::string&)> callback);
  /// The host's mean loss of the step under way, for its record.
  void set_loss(double loss) { loss_ = loss; }
  void before_step();
  error after_step(const step_info& info);

private:
  engine* eng_ = nullptr;
  job_config job_;
  std::string notes_;
  std::optional<metrics_monitor> monitor_;
  std::unique_ptr<step_recorder> recorder_;
  std::function<void(const std::string&)> callback_;
  std::optional<double> loss_;
};

}  // namespace zmuon
