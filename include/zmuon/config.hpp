// The job's configuration as the public API sees it: a DeepSpeed-style JSON config (text or a
// file) plus "key.path=value" overrides, checked strictly (unknown or misspelled keys are errors
// that name the key) and mapped onto engine_options. Keys and defaults: examples/zmuon_config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zmuon/lr_schedule.hpp"
#include "zmuon/options.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

class engine;

/// The per-step figures a config asks for: DeepSpeed's csv_monitor, zmuon's JSON Lines stream,
/// and the monitors a Python host writes itself (tensorboard, wandb, comet).
struct monitor_options {
  bool csv = false;                               // csv_monitor.enabled
  std::string csv_output_path;                    // csv_monitor.output_path
  std::string csv_job_name = "DeepSpeedJobName";  // csv_monitor.job_name
  std::string metrics_file;                       // zmuon.metrics_file: JSON Lines, a record a step
  bool wall_clock_breakdown = false;              // adds the step time to the csv files
  std::vector<std::string> forwarded;             // enabled monitors the Python host writes
};

/// Everything a config file sets: the engine's options and the host loop's batch shape.
struct job_config {
  engine_options engine;
  int gas = 1;                   // gradient_accumulation_steps
  int micro_batch = 8;           // train_micro_batch_size_per_gpu
  int64_t train_batch_size = 0;  // micro_batch * gas * the job's world, once parsed
  bool bf16 = false;             // bf16.enabled: the host computes in bf16 (excludes fp16.enabled)
  std::string trace;             // zmuon.trace: the message trace directory (zmuon-launch --trace)
  int64_t heartbeat_timeout_ms = 10'000;  // zmuon.heartbeat_timeout_ms: a silent node is lost
  int steps_per_print = 0;  // steps_per_print: zmuon-launch shows every Nth step (0: every one)
  bool strict = false;      // zmuon.strict: every note is an error
  lr_schedule_options scheduler;  // the scheduler section
  monitor_options monitor;
  /// What the config asked for that zmuon did its own way: the keys accepted with no effect and
  /// the "auto" values with what each became, one line each ("note: ...").
  std::vector<std::string> notes;
};

/// What "auto" values resolve from, besides zmuon's defaults: the job and the host.
struct config_context {
  int world = 0;            // ranks of the whole job (0: the config's zmuon.ranks)
  int64_t total_steps = 0;  // the job's steps (zmuon-launch --steps; 0: unknown)
  /// The host's values, a JSON object (text; empty: none): "host" ("python" lets tensorboard,
  /// wandb and comet through to its callback), "lr", "muon_lr", "adam_lr", "weight_decay",
  /// "momentum", "betas", "eps", "gradient_clipping", "micro_batch", "gas", "fp16", "bf16",
  /// "reduce_bucket_size", "warmup_num_steps", "total_num_steps".
  std::string host_values;
  bool strict = false;  // every note is an error (CI); also the config's zmuon.strict
};

/// Parses a JSON config given as text (empty: the defaults), then applies `overrides`
/// ("key.path=value", in order). Errors name the key, the override or the JSON syntax error;
/// every problem of the text at once, one a line.
expected<job_config> parse_config_text(const std::string& json_text,
                                       const std::vector<std::string>& overrides = {},
                                       const config_context& context = {});

/// The same for the JSON file at `path`; errors also name the file.
expected<job_config> load_config_file(const std::string& path,
                                      const std::vector<std::string>& overrides = {},
                                      const config_context& context = {});

/// Drives `eng`'s learning rates by the config's scheduler section, as DeepSpeed steps its
/// scheduler: after every applied step (a skipped one does not count). No scheduler: the
/// optimizer section's constant rates.
void install_lr_schedule(engine& eng, const job_config& cfg);

/// Newton-Schulz options from JSON text: an object of the config's NS keys, named as under
/// `optimizer.params` (ns_steps, ns_coefficients, ns_schedule, ns_variant, ns_gram_restart), e.g.
/// {"ns_steps": 5, "ns_variant": "standard"}; empty text: the engine's defaults. Read by the
/// config's own schema, so a bad value gives the config's error (without the
/// "optimizer.params." prefix) and a misspelled key names the nearest NS key.
expected<ns_options> parse_ns_options(const std::string& json_text);

}  // namespace zmuon
