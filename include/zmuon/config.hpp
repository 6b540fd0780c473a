// The job's configuration as the public API sees it: a DeepSpeed-style JSON config (text or a
// file) plus "key.path=value" overrides, checked strictly (unknown or misspelled keys are errors
// that name the key) and mapped onto engine_options. Keys and defaults: examples/zmuon_config.json.
#pragma once

#include <string>
#include <vector>

#include "zmuon/options.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

/// Everything a config file sets: the engine's options and the host loop's batch shape.
struct job_config {
  engine_options engine;
  int gas = 1;          // gradient_accumulation_steps
  int micro_batch = 8;  // train_micro_batch_size_per_gpu
  bool bf16 = false;    // bf16.enabled: the host computes in bf16 (excludes fp16.enabled)
  std::string trace;    // zmuon.trace: the message trace directory (zmuon-launch --trace)
  int64_t heartbeat_timeout_ms = 10'000;  // zmuon.heartbeat_timeout_ms: a silent node is lost
};

/// Parses a JSON config given as text (empty: the defaults), then applies `overrides`
/// ("key.path=value", in order). Errors name the key, the override or the JSON syntax error.
expected<job_config> parse_config_text(const std::string& json_text,
                                       const std::vector<std::string>& overrides = {});

/// The same for the JSON file at `path`; errors also name the file.
expected<job_config> load_config_file(const std::string& path,
                                      const std::vector<std::string>& overrides = {});

/// Newton-Schulz options from JSON text: an object of the config's NS keys, named as under
/// `optimizer.params` (ns_steps, ns_coefficients, ns_schedule, ns_variant, ns_gram_restart), e.g.
/// {"ns_steps": 5, "ns_variant": "standard"}; empty text: the engine's defaults. Read by the
/// config's own schema, so a bad value gives the config's error (without the
/// "optimizer.params." prefix) and a misspelled key names the nearest NS key.
expected<ns_options> parse_ns_options(const std::string& json_text);

}  // namespace zmuon
