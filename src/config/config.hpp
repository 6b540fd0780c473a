// The job's configuration: a DeepSpeed-style JSON file (plus `--set key.path=value` overrides)
// checked strictly and mapped onto engine_options. Keys and defaults: examples/zmuon_config.json.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/json_text.hpp"
#include "zmuon/config.hpp"  // job_config
#include "zmuon/options.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

/// Checks `j` against the schema and maps it onto a job_config; absent keys keep their defaults.
/// DeepSpeed's keys are mapped, accepted with no effect (noted) or refused with the reason;
/// "auto" resolves from `context` or zmuon's default (noted). Errors name the key's full path:
/// an unknown key (with the nearest valid key), a wrong type, a value out of range (with the
/// allowed range); every problem of the document at once, one a line.
expected<job_config> parse_config(const nlohmann::json& j, const config_context& context = {});

/// Reads the JSON file at `path` (none when empty), merged over `base` (a tool's own defaults,
/// themselves over job_config's), applies `overrides` ("key.path=value", in order) and parses the
/// result. Errors say where they come from: the file's path or the offending override.
expected<job_config> load_config(const std::string& path, const std::vector<std::string>& overrides,
                                 const nlohmann::json& base = nlohmann::json::object(),
                                 const config_context& context = {});

/// Sets one key of `j` from "key.path=value". The value is parsed as JSON, or else taken as a
/// string; `null` removes the key (back to its default); an object value is merged into an
/// object. The path must name a key of the schema or one of DeepSpeed's.
error apply_override(nlohmann::json& j, const std::string& key_eq_value);

/// The canonical JSON of a job_config: every key of the schema (aliases left out), with the
/// shortest decimal that reads back as the same float.
nlohmann::json config_json(const job_config& cfg);

/// What differs between two JSON documents (a saved job's settings and this one's), one line per
/// leaf, its dotted path first: "optimizer.lr 0.02 -> 0.01", "seed 1 -> 7", "x (none) -> 3".
std::vector<std::string> json_changes(const nlohmann::json& before, const nlohmann::json& after);

/// The candidate nearest to `key` (case-insensitive edit distance), or "" when none is close: the
/// schema's "did you mean" suggestion, for key sets of its own (parse_ns_options).
std::string nearest_key(const std::string& key, const std::vector<std::string>& candidates);

/// The defaults as JSON: config_json(job_config{}).
nlohmann::json default_config_json();

}  // namespace zmuon
