// The config's entry points (config.hpp): one parse of a document (every problem at once, then
// the notes), --set overrides, a file with its overrides, and the canonical JSON back. The
// parts: the schema (schema.hpp), DeepSpeed's keys and batch rule (deepspeed_compat.hpp), the
// scheduler section (scheduler_section.hpp), "auto" values (auto_values.hpp), errors and
// suggestions (diagnostics.hpp).
#include "config/config.hpp"

#include <algorithm>

#include "config/auto_values.hpp"
#include "config/deepspeed_compat.hpp"
#include "config/deepspeed_keys.hpp"
#include "config/diagnostics.hpp"
#include "config/scheduler_section.hpp"
#include "config/schema.hpp"

namespace zmuon {

using namespace config_detail;

expected<job_config> parse_config(const json& document, const config_context& ctx) {
  if (json_too_deep(document))  // before anything walks it recursively (describe() dumps it)
    return error{errc::invalid_argument,
                 "the config nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
  if (!document.is_object())
    return bad("the config", "a JSON object", document);
  findings out;
  const json host = host_values(ctx, out);
  out.python_host = host.value("host", json()) == "python";
  check_keys(document, "", out);
  json j = document;
  resolve_auto(j, host, out);
  job_config cfg;
  for (const auto& f : schema())
    if (const json* v = find(j, f.path))
      out.add(f.read(*v, cfg));
  if (const json* sched = find(j, "scheduler"); sched && sched->is_object())
    read_scheduler(*sched, host, ctx, cfg, out);
  const json* method = find(j, "optimizer.params.ns_method");
  const json* variant = find(j, "optimizer.params.ns_variant");
  if (method && variant && method->is_string() && variant->is_string()
      && lower(method->get<std::string>()) != lower(variant->get<std::string>()))
    out.problems.push_back("optimizer.params.ns_method (" + describe(*method)
                           + ") and optimizer.params.ns_variant (" + describe(*variant)
                           + ") differ: ns_method is DeepSpeed's name for ns_variant; give one");
  if (cfg.engine.fp16.enabled && cfg.bf16)
    out.problems.push_back("fp16.enabled and bf16.enabled are both true; pick one");
  const int world = ctx.world > 0 ? ctx.world : cfg.engine.world;
  if (out.problems.empty()) {
    const bool tbs_auto =
        find(document, "train_batch_size") && is_auto(document["train_batch_size"]);
    batch_shape(j, world, cfg, out);
    if (tbs_auto)
      out.resolved.push_back("train_batch_size = " + std::to_string(cfg.train_batch_size)
                             + " (micro-batch " + std::to_string(cfg.micro_batch) + " x gas "
                             + std::to_string(cfg.gas) + " x world " + std::to_string(world) + ")");
  }
  for (const auto& [name, keys] : host_monitors())
    if (const json* m = find(j, name); m && m->is_object() && m->value("enabled", false) == true)
      cfg.monitor.forwarded.push_back(name);
  if (!out.problems.empty())
    return problems_error(out.problems, "the config");
  if (!out.no_effect.empty())
    cfg.notes.push_back("accepted with no effect in zmuon: " + listed(out.no_effect, ""));
  if (!out.resolved.empty())
    cfg.notes.push_back("\"auto\" resolved: " + listed(out.resolved, ""));
  for (const auto& line : out.other)
    cfg.notes.push_back(line);
  if ((ctx.strict || cfg.strict) && !cfg.notes.empty()) {
    std::string message = "strict mode (--strict, zmuon.strict) makes the config's notes errors:";
    for (const auto& note : cfg.notes)
      message += "\n  " + note;
    return error{errc::invalid_argument, message};
  }
  return cfg;
}

error apply_override(json& j, const std::string& key_eq_value) {
  auto fail = [&](const std::string& message) {
    return error{errc::invalid_argument, "--set " + shortened_text(key_eq_value) + ": " + message};
  };
  size_t eq = key_eq_value.find('=');
  if (eq == std::string::npos || eq == 0)
    return fail("expected key.path=value");
  auto parts = split_path(key_eq_value.substr(0, eq));
  std::string prefix;
  for (size_t i = 0; i < parts.size(); ++i) {  // check the whole path before changing anything
    std::string path = join(prefix, parts[i]);
    if (parts[i].empty())
      return fail("empty key in the path");
    const ds_key* whole = find_deepspeed_key(path);
    if (whole && whole->kind == ds_kind::section)  // its keys are DeepSpeed's to list
      break;
    if (is_leaf(path) && i + 1 < parts.size())
      return fail("'" + path + "' is a value, not a section");
    if (!is_leaf(path) && !is_section(path))
      return fail(unknown_key(prefix, parts[i]));
    prefix = path;
  }
  // One JSON merge patch (RFC 7386): objects merge, null removes, anything else replaces.
  const std::string text = key_eq_value.substr(eq + 1);
  bool not_json = false;  // then a string, as given
  auto value = parse_json_text(text, "", /*ignore_comments=*/false, &not_json);
  if (!value && !not_json)  // JSON, but refused: a number out of range, too deep a nesting
    return fail(value.err().message());
  json patch = value ? std::move(*value) : json(text);
  patch = {{parts.back(), patch}};
  for (size_t i = parts.size() - 1; i-- > 0;)
    patch = {{parts[i], patch}};
  j.merge_patch(patch);
  return {};
}

expected<job_config> load_config(const std::string& path, const std::vector<std::string>& overrides,
                                 const json& base, const config_context& ctx) {
  json j = base.is_null() ? json::object() : base;
  config_context lenient = ctx;  // the notes are judged once, on the whole
  lenient.strict = false;
  if (!path.empty()) {
    auto file = read_json_file(path);
    if (!file)
      return file.err();
    if (auto checked = parse_config(*file, lenient); !checked)
      return with_context(path, checked.err());
    j.merge_patch(*file);
  }
  for (const auto& o : overrides) {  // check after each, so an error names its override
    if (auto err = apply_override(j, o))
      return err;
    if (auto checked = parse_config(j, lenient); !checked)
      return with_context("--set " + shortened_text(o), checked.err());
  }
  return parse_config(j, ctx);
}

json config_json(const job_config& cfg) {
  json j = json::object();
  for (const auto& f : schema()) {
    if (!f.write)
      continue;
    json* node = &j;
    for (const auto& key : split_path(f.path))
      node = &(*node)[key];
    *node = f.write(cfg);
  }
  if (cfg.scheduler.type != lr_schedule_type::none)  // so that nodes and checkpoints see it
    j["scheduler"] = scheduler_json(cfg.scheduler);
  return j;
}

namespace {

/// One line per leaf that differs between `before` and `after`, under `path`.
void collect_changes(const json& before, const json& after, const std::string& path,
                     std::vector<std::string>& out) {
  if (before.is_object() && after.is_object()) {
    for (const auto& [key, value] : before.items())
      collect_changes(value, after.contains(key) ? after[key] : json(),
                      path.empty() ? key : path + "." + key, out);
    for (const auto& [key, value] : after.items())
      if (!before.contains(key))
        collect_changes(json(), value, path.empty() ? key : path + "." + key, out);
    return;
  }
  if (before == after)
    return;
  const auto text = [](const json& v) { return v.is_null() ? std::string("(none)") : v.dump(); };
  out.push_back(path + " " + text(before) + " -> " + text(after));
}

}  // namespace

std::vector<std::string> json_changes(const json& before, const json& after) {
  std::vector<std::string> out;
  collect_changes(before, after, "", out);
  return out;
}

std::string nearest_key(const std::string& key, const std::vector<std::string>& candidates) {
  return nearest(key, candidates);
}

json default_config_json() {
  static const job_config defaults;
  return config_json(defaults);
}

}  // namespace zmuon
