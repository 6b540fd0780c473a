// "auto" values: each resolved from the job (config_context), the host's values, or zmuon's
// default, and noted with what it became. The scheduler's "auto" params are the scheduler
// section's (scheduler_section.hpp). Internal to src/config/.
#pragma once

#include "config/diagnostics.hpp"
#include "zmuon/config.hpp"

namespace zmuon::config_detail {

/// The host's values for "auto" (a JSON object); a bad one is a problem naming it.
json host_values(const config_context& ctx, findings& out);
/// Replaces each "auto" of a schema field in `j` by the host's value, or removes it (zmuon's
/// default), noting what it became. Fields that take "auto" as a value of their own
/// (zmuon.comm, ns_variant, muon_transport) keep it.
void resolve_auto(json& j, const json& host, findings& out);

}  // namespace zmuon::config_detail
