// The scheduler section (scheduler_section.hpp).
#include "config/scheduler_section.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

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

void read_scheduler(const json& sched, const json& host, const config_context& ctx, job_config& cfg,
                    findings& out) {
  auto& s = cfg.scheduler;
  const json* type = sched.contains("type") ? &sched["type"] : nullptr;
  const json* params = sched.contains("params") ? &sched["params"] : nullptr;
  if (!type) {
    if (params)
      out.problems.push_back(
          "scheduler.params given without scheduler.type (one of "
          "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)");
    return;
  }
  std::vector<std::string> names;
  for (const auto& [name, keys] : schedule_params())
    names.push_back(name);
  auto name = read_as<std::string>(*type, "scheduler.type", {}, names);
  if (!name) {
    out.problems.push_back(name.err().message()
                           + " (a torch.optim.lr_scheduler, which DeepSpeed builds from torch, "
                             "is the host's to drive: zmuon_engine_set_lr, or param_groups)");
    return;
  }
  const std::vector<lr_schedule_type> types = {
      lr_schedule_type::warmup_lr, lr_schedule_type::warmup_decay_lr,
      lr_schedule_type::warmup_cosine_lr, lr_schedule_type::one_cycle,
      lr_schedule_type::lr_range_test};
  s.type = types[std::find(names.begin(), names.end(), *name) - names.begin()];
  if (s.type == lr_schedule_type::warmup_decay_lr)
    s.warmup_max_lr = {1e-3, 1e-3};  // WarmupDecayLR's default; WarmupLR's is the group's lr
  const auto keys = schedule_keys(type);
  if (params && !params->is_object())
    return;  // check_keys said so
  json p = params ? *params : json::object();
  for (const auto& [key, value] : p.items())
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      out.problems.push_back(unknown_key("scheduler.params", key, keys) + " (for " + *name + ")");
  const std::string at = "scheduler.params.";
  // "auto": HF's resolution, from the job and the host.
  for (auto& [key, value] : p.items()) {
    if (!is_auto(value))
      continue;
    std::string why;
    if (key == "warmup_min_lr") {
      value = 0.0, why = "0 (as HF)";
    } else if (key == "warmup_max_lr" && host.contains("lr")) {
      value = host["lr"], why = host["lr"].dump() + " (the host's lr)";
    } else if (key == "warmup_max_lr") {
      value = nullptr, why = "each group's lr";
    } else if (key == "warmup_num_steps" && host.contains("warmup_num_steps")) {
      value = host["warmup_num_steps"], why = value.dump() + " (the host's warmup_num_steps)";
    } else if (key == "total_num_steps" && ctx.total_steps > 0) {
      value = ctx.total_steps, why = value.dump() + " (the job's steps)";
    } else if (key == "total_num_steps" && host.contains("total_num_steps")) {
      value = host["total_num_steps"], why = value.dump() + " (the host's total_num_steps)";
    } else if (key == "total_num_steps") {
      out.problems.push_back(at + key + " is \"auto\" but neither the job (zmuon-launch --steps) "
                                        "nor the host (total_num_steps) gives the step count");
      continue;
    } else {
      value = nullptr, why = "DeepSpeed's default (warmup_num_steps 1000)";
    }
    out.resolved.push_back(at + key + " = " + why);
  }
  auto number = [&](const char* key, double& slot, range r) {
    const json* v = find(p, key);
    if (!v || v->is_null())
      return;
    auto x = read_as<double>(*v, at + key, r, {});
    x ? void(slot = *x) : out.add(x.err());
  };
  auto integer = [&](const char* key, int64_t& slot, range r) {
    const json* v = find(p, key);
    if (!v || v->is_null())
      return;
    auto x = read_as<int64_t>(*v, at + key, r, {});
    x ? void(slot = *x) : out.add(x.err());
  };
  auto groups = [&](const char* key, std::array<double, 2>& slot) {
    if (const json* v = find(p, key); v && !v->is_null())
      out.add(per_group(*v, at + key, slot));
  };
  auto required = [&](const char* key) {
    if (!p.contains(key))
      out.problems.push_back(at + key + " is required by " + *name);
  };
  if (const json* v = find(p, "warmup_type"); v && !v->is_null()) {
    auto shape = read_as<warmup_shape>(*v, at + "warmup_type", {}, {"log", "linear"});
    if (!shape)
      out.add(shape.err());
    else
      s.warmup_type = *shape;
  }
  if (const json* v = find(p, "last_batch_iteration"); v && !v->is_null() && *v != -1)
    out.problems.push_back(at + "last_batch_iteration " + describe(*v)
                           + " is refused: a resumed job's schedule continues from its "
                             "checkpoint's step; give -1");
  groups("warmup_min_lr", s.warmup_min_lr);
  groups("warmup_max_lr", s.warmup_max_lr);
  integer("warmup_num_steps", s.warmup_num_steps, range::at_least(1));
  integer("total_num_steps", s.total_num_steps, range::at_least(1));
  number("warmup_min_ratio", s.warmup_min_ratio, range::closed(0, 1));
  number("cos_min_ratio", s.cos_min_ratio, range::closed(0, 1));
  groups("cycle_min_lr", s.cycle_min_lr);
  groups("cycle_max_lr", s.cycle_max_lr);
  number("decay_lr_rate", s.decay_lr_rate, range::at_least(0));
  number("cycle_first_step_size", s.cycle_first_step_size, range::above(0));
  number("cycle_second_step_size", s.cycle_second_step_size, range::at_least(0));
  integer("cycle_first_stair_count", s.cycle_first_stair_count, range::at_least(0));
  integer("cycle_second_stair_count", s.cycle_second_stair_count, range::at_least(0));
  number("decay_step_size", s.decay_step_size, range::at_least(0));
  groups("lr_range_test_min_lr", s.lr_range_test_min_lr);
  integer("lr_range_test_step_size", s.lr_range_test_step_size, range::at_least(1));
  number("lr_range_test_step_rate", s.lr_range_test_step_rate, range::at_least(0));
  if (const json* v = find(p, "lr_range_test_staircase"); v && !v->is_null()) {
    if (auto x = read_as<bool>(*v, at + "lr_range_test_staircase", {}, {}); !x)
      out.add(x.err());
    else
      s.lr_range_test_staircase = *x;
  }
  for (const char* key : {"cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate"})
    if (p.contains(key))  // DeepSpeed's Muon has no betas default: its OneCycle drops them
      out.no_effect.push_back(at + key);
  if (s.type == lr_schedule_type::warmup_decay_lr || s.type == lr_schedule_type::warmup_cosine_lr)
    required("total_num_steps");
  if (s.type == lr_schedule_type::one_cycle) {
    required("cycle_min_lr");
    required("cycle_max_lr");
  }
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
