// The per-step figures a config asks for: DeepSpeed's csv_monitor files and zmuon's JSON Lines
// stream (zmuon.metrics_file), written by the process that runs the job's first rank.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "zmuon/config.hpp"
#include "zmuon/engine.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

/// One step's figures.
struct step_metrics {
  step_info info;
  std::optional<double> loss;  // the host's mean loss of the step, when it says
  float muon_lr = 0;           // the rates the step used
  float adam_lr = 0;
  double step_ms = 0;        // since the previous step (or the monitor's start)
  double ns_ms = -1;         // Newton-Schulz busy time of the first local rank; -1: not timed
  int64_t memory_bytes = 0;  // held by the first local rank's compute backend
  int64_t samples = 0;       // samples of the job so far (DeepSpeed's x axis)
};

/// The step's record as one JSON object (a line of the stream; what a host callback gets).
nlohmann::json metrics_record(const step_metrics& m);

class metrics_monitor {
public:
  /// Opens the monitor's outputs (directories made; files appended to, as DeepSpeed does).
  /// `fp16`: the loss scale has a file of its own. An error names the path it could not open.
  static expected<metrics_monitor> open(const monitor_options& opts, bool fp16);
  /// Whether the options ask for any file.
  static bool wanted(const monitor_options& opts);
  error write(const step_metrics& m);

private:
  struct csv_file {
    std::string name;
    std::ofstream out;
  };
  error write_csv(const std::string& name, int64_t samples, double value);
  monitor_options opts_;
  bool fp16_ = false;
  std::string csv_dir_;
  std::map<std::string, std::ofstream> csv_;
  std::ofstream jsonl_;
};

/// Times the steps and gathers an engine's figures for a monitor or a host callback: what
/// zmuon-launch and the C ABI call around each step().
class step_recorder {
public:
  /// Switches the backends' call timing on when `time_ns` (NS time per step).
  step_recorder(engine& eng, int micro_batch, int gas, bool time_ns);
  /// Before step(): the rates that step will use.
  void before_step();
  /// After step(): the step's figures.
  step_metrics after_step(const step_info& info, std::optional<double> loss);

private:
  engine* eng_;
  int64_t samples_per_step_;
  bool time_ns_;
  std::array<float, 2> lrs_{};
  int64_t last_ns_ = 0;  // steady clock at the previous step's end
};

}  // namespace zmuon
