// The scheduler section (scheduler_section.hpp).
#include "config/scheduler_section.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <variant>

#include "config/schema.hpp"
#include "zmuon/lr_schedule.hpp"

namespace zmuon::config_detail {

const std::vector<std::pair<std::string, std::vector<std::string>>>& schedule_params() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> types = {
      {"WarmupLR",
       {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
        "last_batch_iteration"}},
      {"WarmupDecayLR",
       {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
        "last_batch_iteration"}},
      {"WarmupCosineLR",
       {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
        "last_batch_iteration"}},
      {"OneCycle",
       {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
        "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
        "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate",
        "last_batch_iteration"}},
      {"LRRangeTest",
       {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
        "lr_range_test_staircase", "last_batch_iteration"}},
  };
  return types;
}

std::vector<std::string> schedule_keys(const json* type) {
  std::vector<std::string> keys;
  for (const auto& [name, params] : schedule_params()) {
    if (type && type->is_string() && lower(type->get<std::string>()) == lower(name))
      return params;
    for (const auto& p : params)
      if (std::find(keys.begin(), keys.end(), p) == keys.end())
        keys.push_back(p);
  }
  return keys;
}

namespace {

/// A number or a list of two numbers ([Muon, AdamW]), as DeepSpeed's per-group values.
error per_group(const json& v, const std::string& path, std::array<double, 2>& out) {
  if (v.is_array()) {
    if (v.size() != 2)
      return bad(path, "a number or a list of 2 numbers (Muon's, AdamW's)", v);
    for (size_t g = 0; g < 2; ++g) {
      auto x = read_as<float>(v[g], path + "[" + std::to_string(g) + "]", range::at_least(0), {});
      if (!x)
        return x.err();
      out[g] = *x;
    }
    return {};
  }
  auto x = read_as<float>(v, path, range::at_least(0), {});  // a learning rate: a float
  if (!x)
    return bad(path, "a number >= 0 or a list of 2 (Muon's, AdamW's)", v);
  out = {*x, *x};
  return {};
}

}  // namespace

namespace {

/// The section's type, or none (a problem said why).
std::optional<lr_schedule_type> read_type(const json* type, const json* params, findings& out) {
  if (!type) {
    if (params)
      out.problems.push_back(
          "scheduler.params given without scheduler.type (one of "
          "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)");
    return std::nullopt;
  }
  std::vector<std::string> names;
  for (const auto& [name, keys] : schedule_params())
    names.push_back(name);
  auto name = read_as<std::string>(*type, "scheduler.type", {}, names);
  if (!name) {
    out.problems.push_back(name.err().message()
                           + " (a torch.optim.lr_scheduler, which DeepSpeed builds from torch, "
                             "is the host's to drive: zmuon_engine_set_lr, or param_groups)");
    return std::nullopt;
  }
  static const lr_schedule_type types[] = {
      lr_schedule_type::warmup_lr, lr_schedule_type::warmup_decay_lr,
      lr_schedule_type::warmup_cosine_lr, lr_schedule_type::one_cycle,
      lr_schedule_type::lr_range_test};
  return types[std::find(names.begin(), names.end(), *name) - names.begin()];
}

/// The value "auto" becomes for `key`, as HF resolves it, with why; nullopt: a problem.
std::optional<std::pair<json, std::string>> auto_value(const std::string& key, const json& host,
                                                       const config_context& ctx) {
  using resolved = std::pair<json, std::string>;
  if (key == "warmup_min_lr")
    return resolved{0.0, "0 (as HF)"};
  if (key == "warmup_max_lr")
    return host.contains("lr") ? resolved{host["lr"], host["lr"].dump() + " (the host's lr)"}
                               : resolved{nullptr, "each group's lr"};
  if (key == "warmup_num_steps" && host.contains("warmup_num_steps"))
    return resolved{host["warmup_num_steps"],
                    host["warmup_num_steps"].dump() + " (the host's warmup_num_steps)"};
  if (key != "total_num_steps")
    return resolved{nullptr, "DeepSpeed's default (warmup_num_steps 1000)"};
  if (ctx.total_steps > 0)
    return resolved{ctx.total_steps, std::to_string(ctx.total_steps) + " (the job's steps)"};
  if (host.contains("total_num_steps"))
    return resolved{host["total_num_steps"],
                    host["total_num_steps"].dump() + " (the host's total_num_steps)"};
  return std::nullopt;
}

/// Each "auto" param of `p` resolved (auto_value), noted with what it became.
void resolve_auto_params(json& p, const json& host, const config_context& ctx, findings& out) {
  const std::string at = "scheduler.params.";
  for (auto& [key, value] : p.items()) {
    if (!is_auto(value))
      continue;
    auto resolved = auto_value(key, host, ctx);
    if (!resolved) {
      out.problems.push_back(at + key + " is \"auto\" but neither the job (zmuon-launch --steps) "
                                        "nor the host (total_num_steps) gives the step count");
      continue;
    }
    value = resolved->first;
    out.resolved.push_back(at + key + " = " + resolved->second);
  }
}

using schedule = lr_schedule_options;

/// A param read as a number, an integer or a per-group pair ([Muon, AdamW]), and where it goes.
struct typed_param {
  const char* key;
  std::variant<double schedule::*, int64_t schedule::*, std::array<double, 2> schedule::*> at;
  range allowed;
};

/// In the order their problems are listed.
const typed_param typed_params[] = {
    {"warmup_min_lr", &schedule::warmup_min_lr, {}},
    {"warmup_max_lr", &schedule::warmup_max_lr, {}},
    {"warmup_num_steps", &schedule::warmup_num_steps, range::at_least(1)},
    {"total_num_steps", &schedule::total_num_steps, range::at_least(1)},
    {"warmup_min_ratio", &schedule::warmup_min_ratio, range::closed(0, 1)},
    {"cos_min_ratio", &schedule::cos_min_ratio, range::closed(0, 1)},
    {"cycle_min_lr", &schedule::cycle_min_lr, {}},
    {"cycle_max_lr", &schedule::cycle_max_lr, {}},
    {"decay_lr_rate", &schedule::decay_lr_rate, range::at_least(0)},
    {"cycle_first_step_size", &schedule::cycle_first_step_size, range::above(0)},
    {"cycle_second_step_size", &schedule::cycle_second_step_size, range::at_least(0)},
    {"cycle_first_stair_count", &schedule::cycle_first_stair_count, range::at_least(0)},
    {"cycle_second_stair_count", &schedule::cycle_second_stair_count, range::at_least(0)},
    {"decay_step_size", &schedule::decay_step_size, range::at_least(0)},
    {"lr_range_test_min_lr", &schedule::lr_range_test_min_lr, {}},
    {"lr_range_test_step_size", &schedule::lr_range_test_step_size, range::at_least(1)},
    {"lr_range_test_step_rate", &schedule::lr_range_test_step_rate, range::at_least(0)},
};

/// `p[key]` read into `slot` (absent or null: left as it is); a bad value is a problem.
template <class T>
void read_param(const json& p, const char* key, const range& allowed,
                const std::vector<std::string>& choices, T& slot, findings& out) {
  const json* v = find(p, key);
  if (!v || v->is_null())
    return;
  const std::string path = std::string("scheduler.params.") + key;
  if constexpr (std::is_same_v<T, std::array<double, 2>>) {
    out.add(per_group(*v, path, slot));
  } else {
    auto x = read_as<T>(*v, path, allowed, choices);
    x ? void(slot = *x) : out.add(x.err());
  }
}

/// The params `p` gives onto `s`; what DeepSpeed's Muon lacks is noted, what zmuon cannot do is
/// refused.
void read_params(const json& p, schedule& s, findings& out) {
  const std::string at = "scheduler.params.";
  read_param(p, "warmup_type", {}, {"log", "linear"}, s.warmup_type, out);
  if (const json* v = find(p, "last_batch_iteration"); v && !v->is_null() && *v != -1)
    out.problems.push_back(at + "last_batch_iteration " + describe(*v)
                           + " is refused: a resumed job's schedule continues from its "
                             "checkpoint's step; give -1");
  for (const auto& q : typed_params)
    std::visit([&](auto member) { read_param(p, q.key, q.allowed, {}, s.*member, out); }, q.at);
  read_param(p, "lr_range_test_staircase", {}, {}, s.lr_range_test_staircase, out);
  for (const char* key : {"cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate"})
    if (p.contains(key))  // DeepSpeed's Muon has no betas default: its OneCycle drops them
      out.no_effect.push_back(at + key);
}

/// The params type `type` cannot do without.
std::vector<const char*> required_params(lr_schedule_type type) {
  switch (type) {
    case lr_schedule_type::warmup_decay_lr:
    case lr_schedule_type::warmup_cosine_lr:
      return {"total_num_steps"};
    case lr_schedule_type::one_cycle:
      return {"cycle_min_lr", "cycle_max_lr"};
    default:
      return {};
  }
}

}  // namespace

void read_scheduler(const json& sched, const json& host, const config_context& ctx, job_config& cfg,
                    findings& out) {
  auto& s = cfg.scheduler;
  const json* type = sched.contains("type") ? &sched["type"] : nullptr;
  const json* params = sched.contains("params") ? &sched["params"] : nullptr;
  const auto read = read_type(type, params, out);
  if (!read)
    return;
  s.type = *read;
  if (s.type == lr_schedule_type::warmup_decay_lr)
    s.warmup_max_lr = {1e-3, 1e-3};  // WarmupDecayLR's default; WarmupLR's is the group's lr
  if (params && !params->is_object())
    return;  // check_keys said so
  const std::string name = lr_schedule_name(s.type);
  const auto keys = schedule_keys(type);
  json p = params ? *params : json::object();
  for (const auto& [key, value] : p.items())
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      out.problems.push_back(unknown_key("scheduler.params", key, keys) + " (for " + name + ")");
  resolve_auto_params(p, host, ctx, out);
  read_params(p, s, out);
  for (const char* key : required_params(s.type))
    if (!p.contains(key))
      out.problems.push_back("scheduler.params." + std::string(key) + " is required by " + name);
}

json scheduler_json(const lr_schedule_options& s) {
  // Per-group rates are read as floats (per_group), so the cast is exact and in range.
  auto pair = [](const std::array<double, 2>& v) {
    return json::array(
        {float_json(static_cast<float>(v[0])), float_json(static_cast<float>(v[1]))});
  };
  const json shape = s.warmup_type == warmup_shape::log ? "log" : "linear";
  json p = json::object();
  switch (s.type) {
    case lr_schedule_type::warmup_lr:
    case lr_schedule_type::warmup_decay_lr:
      p = {{"warmup_min_lr", pair(s.warmup_min_lr)},
           {"warmup_num_steps", s.warmup_num_steps},
           {"warmup_type", shape}};
      if (!std::isnan(s.warmup_max_lr[0]) && !std::isnan(s.warmup_max_lr[1]))
        p["warmup_max_lr"] = pair(s.warmup_max_lr);
      if (s.type == lr_schedule_type::warmup_decay_lr)
        p["total_num_steps"] = s.total_num_steps;
      break;
    case lr_schedule_type::warmup_cosine_lr:
      p = {{"total_num_steps", s.total_num_steps},
           {"warmup_min_ratio", s.warmup_min_ratio},
           {"warmup_num_steps", s.warmup_num_steps},
           {"cos_min_ratio", s.cos_min_ratio},
           {"warmup_type", shape}};
      break;
    case lr_schedule_type::one_cycle:
      p = {{"cycle_min_lr", pair(s.cycle_min_lr)},
           {"cycle_max_lr", pair(s.cycle_max_lr)},
           {"decay_lr_rate", s.decay_lr_rate},
           {"cycle_first_step_size", s.cycle_first_step_size},
           {"cycle_first_stair_count", s.cycle_first_stair_count},
           {"decay_step_size", s.decay_step_size}};
      if (s.cycle_second_step_size >= 0)
        p["cycle_second_step_size"] = s.cycle_second_step_size;
      if (s.cycle_second_stair_count >= 0)
        p["cycle_second_stair_count"] = s.cycle_second_stair_count;
      break;
    case lr_schedule_type::lr_range_test:
      p = {{"lr_range_test_min_lr", pair(s.lr_range_test_min_lr)},
           {"lr_range_test_step_size", s.lr_range_test_step_size},
           {"lr_range_test_step_rate", s.lr_range_test_step_rate},
           {"lr_range_test_staircase", s.lr_range_test_staircase}};
      break;
    case lr_schedule_type::none:
      break;
  }
  return {{"type", lr_schedule_name(s.type)}, {"params", p}};
}

}  // namespace zmuon::config_detail
