// The scheduler section: DeepSpeed's schedule types and their params, read onto
// job_config::scheduler ("auto" resolved as HF resolves it) and written back. Internal to
// src/config/.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "config/diagnostics.hpp"
#include "zmuon/config.hpp"

namespace zmuon::config_detail {

/// The scheduler types and the params each takes (DeepSpeed's lr_schedules.py).
const std::vector<std::pair<std::string, std::vector<std::string>>>& schedule_params();
/// The params of the schedule type `type` names (any case), or every schedule's when it names
/// none.
std::vector<std::string> schedule_keys(const json* type);
/// The scheduler section onto cfg.scheduler; "auto" resolved as HF resolves it.
void read_scheduler(const json& sched, const json& host, const config_context& ctx, job_config& cfg,
                    findings& out);
/// The scheduler section of `s`: its type and the params that type reads, per-group pairs as
/// [Muon, AdamW] lists (a group's own lr is left out).
json scheduler_json(const lr_schedule_options& s);

}  // namespace zmuon::config_detail
