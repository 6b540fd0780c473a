// DeepSpeed compatibility: the keys of DeepSpeed's that zmuon types, notes or refuses while it
// walks a config (deepspeed_keys.hpp has the table), the monitors a Python host writes itself,
// and DeepSpeed's batch rule. Internal to src/config/.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config/diagnostics.hpp"
#include "zmuon/config.hpp"

namespace zmuon::config_detail {

/// The monitors a Python host writes itself, with their keys (DeepSpeed's monitor/config.py).
const std::vector<std::pair<std::string, std::vector<std::string>>>& host_monitors();
/// Walks `obj` (at `prefix`): every key must be known; DeepSpeed's keys are typed, refused or
/// noted here; the schema's fields are read later.
void check_keys(const json& obj, const std::string& prefix, findings& out);
/// DeepSpeed's batch rule: train_batch_size = micro-batch x gas x world; given two of the
/// three, the third follows.
void batch_shape(const json& j, int world, job_config& cfg, findings& out);

}  // namespace zmuon::config_detail
