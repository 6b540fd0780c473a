// The schema's table of fields and the paths derived from it (schema.hpp).
#include "config/schema.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "config/deepspeed_compat.hpp"
#include "config/deepspeed_keys.hpp"
#include "config/scheduler_section.hpp"
#include "kernels/ns_variants.hpp"

namespace zmuon::config_detail {

std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}

/// The shortest decimal that reads back as `f`, so that 0.95f is written 0.95.
json float_json(float f) {
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(f));
    if (std::strtof(buf, nullptr) == f)
      break;
  }
  return std::strtod(buf, nullptr);
}

namespace {

template <class T>
using slot = T& (*)(job_config&);

template <class T>
field make(std::string path, slot<T> at, range r = {}, std::vector<std::string> choices = {}) {
  auto read = [=](const json& v, job_config& c) -> error {
    auto x = read_as<T>(v, path, r, choices);
    if (!x)
      return x.err();
    at(c) = *x;
    return {};
  };
  return {path, read, [=](job_config c) { return write_as<T>(at(c), choices); }};
}

/// The choices of an enum named by a table in enum order (zmuon/options.hpp).
template <size_t N>
std::vector<std::string> names_of(const char* const (&names)[N]) {
  return {names, names + N};
}

/// `at.size()` numbers in `r`, as one array (betas, ns_coefficients).
field numbers(std::string path, std::vector<slot<float>> at, range r = {}) {
  auto read = [=](const json& v, job_config& c) -> error {
    if (!v.is_array() || v.size() != at.size())
      return bad(path, "an array of " + std::to_string(at.size()) + " numbers" + r.text(), v);
    for (size_t i = 0; i < at.size(); ++i) {
      auto x = read_as<float>(v[i], path + "[" + std::to_string(i) + "]", r, {});
      if (!x)
        return x.err();
      at[i](c) = *x;
    }
    return {};
  };
  auto write = [=](job_config c) {
    json out = json::array();
    for (auto get : at)
      out.push_back(float_json(get(c)));
    return out;
  };
  return {path, read, write};
}

/// A key with one accepted value, there for DeepSpeed's shape (strings compare in any case).
field fixed(std::string path, json only, std::string wanted) {
  auto read = [=](const json& v, job_config&) -> error {
    bool same = v.is_string() && only.is_string()
                    ? lower(v.get<std::string>()) == lower(only.get<std::string>())
                    : v == only;
    return same ? error{} : bad(path, wanted, v);
  };
  return {path, read, [only](job_config) { return only; }};
}

/// The per-step NS coefficients: "none" (ns_coefficients every step), a named preset
/// ("polar_express", kernels/ns_variants.hpp) of ns_steps steps, or one [a, b, c] per step.
/// Read after ns_steps, whose value it needs; written back as the preset's name when it is one.
field ns_schedule(std::string path) {
  const std::string wanted = "\"none\", \"polar_express\" or an array of ns_steps [a, b, c]";
  auto read = [=](const json& v, job_config& c) -> error {
    auto& ns = c.engine.muon.ns;
    if (v.is_string()) {
      auto name = read_as<std::string>(v, path, {}, {"none", "polar_express"});
      if (!name)
        return name.err();
      ns.schedule = *name == "none" ? decltype(ns.schedule){} : polar_express_schedule(ns.steps);
      return {};
    }
    if (!v.is_array())
      return bad(path, wanted, v);
    if (v.size() != static_cast<size_t>(ns.steps))
      return bad(path, "an array of " + std::to_string(ns.steps) + " [a, b, c] (one per ns_steps)",
                 v);
    ns.schedule.clear();
    for (size_t t = 0; t < v.size(); ++t) {
      const std::string at = path + "[" + std::to_string(t) + "]";
      if (!v[t].is_array() || v[t].size() != 3)
        return bad(at, "an array of 3 numbers", v[t]);
      std::array<float, 3> abc{};
      for (size_t i = 0; i < 3; ++i) {
        auto x = read_as<float>(v[t][i], at + "[" + std::to_string(i) + "]", {}, {});
        if (!x)
          return x.err();
        abc[i] = *x;
      }
      ns.schedule.push_back(abc);
    }
    return {};
  };
  auto write = [](job_config c) -> json {
    const auto& ns = c.engine.muon.ns;
    if (ns.schedule.empty())
      return "none";
    if (ns.schedule == polar_express_schedule(ns.steps))
      return "polar_express";
    json out = json::array();
    for (const auto& abc : ns.schedule)
      out.push_back({float_json(abc[0]), float_json(abc[1]), float_json(abc[2])});
    return out;
  };
  return {path, read, write};
}

// clang-format off
#define ZMUON_SLOT(member) [](job_config& c) -> auto& { return c.member; }
// clang-format on

}  // namespace

const std::vector<field>& schema() {
  using r = range;
  static const std::vector<field> fields = [] {
    const std::string p = "optimizer.params.";
    // DeepSpeed's rule: lr is both groups' rate, muon_lr and adam_lr (read after it) each
    // group's own. Written back as muon_lr and adam_lr.
    field lr = make<float>(p + "lr", ZMUON_SLOT(engine.muon.lr), r::at_least(0));
    lr.read = [read = lr.read](const json& v, job_config& c) {
      error err = read(v, c);
      c.engine.adamw.lr = c.engine.muon.lr;
      return err;
    };
    lr.write = nullptr;
    // DeepSpeed's name for the NS evaluation: "gram" or "standard" (ns_variant, which also takes
    // "auto", is zmuon's).
    field ns_method = make<ns_variant>(p + "ns_method", ZMUON_SLOT(engine.muon.ns.variant), {},
                                       {"standard", "gram"});
    ns_method.write = nullptr;
    field batch = make<int64_t>("train_batch_size", ZMUON_SLOT(train_batch_size),
                                r::closed(1, int64_t{1} << 40));
    batch.write = nullptr;  // derived: micro-batch x gas x world
    field per_print = make<int>("steps_per_print", ZMUON_SLOT(steps_per_print), r::at_least(1));
    per_print.write = nullptr;  // zmuon-launch's default is every step
    field weight_decay =
        make<float>(p + "weight_decay", ZMUON_SLOT(engine.muon.weight_decay), r::at_least(0));
    weight_decay.read = [read = weight_decay.read](const json& v, job_config& c) {
      error err = read(v, c);
      c.engine.adamw.weight_decay = c.engine.muon.weight_decay;  // one decay for both groups
      return err;
    };
    // Cautious weight decay (arXiv:2510.12402) for both groups, as weight_decay is one decay.
    field cautious =
        make<bool>(p + "cautious_weight_decay", ZMUON_SLOT(engine.muon.cautious_weight_decay));
    cautious.read = [read = cautious.read](const json& v, job_config& c) {
      error err = read(v, c);
      c.engine.adamw.cautious_weight_decay = c.engine.muon.cautious_weight_decay;
      return err;
    };
    return std::vector<field>{
        batch,
        make<int>("train_micro_batch_size_per_gpu", ZMUON_SLOT(micro_batch), r::closed(1, 1 << 20)),
        make<int>("gradient_accumulation_steps", ZMUON_SLOT(gas), r::closed(1, 1 << 20)),
        per_print,
        make<bool>("wall_clock_breakdown", ZMUON_SLOT(monitor.wall_clock_breakdown)),
        make<float>("gradient_clipping", ZMUON_SLOT(engine.gradient_clipping), r::at_least(0)),
        make<bool>("fp16.enabled", ZMUON_SLOT(engine.fp16.enabled)),
        make<float>("fp16.loss_scale", ZMUON_SLOT(engine.fp16.loss_scale), r::at_least(0)),
        make<int>("fp16.initial_scale_power", ZMUON_SLOT(engine.fp16.initial_scale_power),
                  r::closed(0, 64)),
        make<int>("fp16.loss_scale_window", ZMUON_SLOT(engine.fp16.loss_scale_window),
                  r::at_least(1)),
        make<int>("fp16.hysteresis", ZMUON_SLOT(engine.fp16.hysteresis), r::at_least(1)),
        make<float>("fp16.min_loss_scale", ZMUON_SLOT(engine.fp16.min_loss_scale), r::above(0)),
        make<bool>("bf16.enabled", ZMUON_SLOT(bf16)),
        fixed("zero_optimization.stage", 3, "3 (zmuon implements ZeRO stage 3)"),
        make<int64_t>("zero_optimization.reduce_bucket_size", ZMUON_SLOT(engine.reduce_bucket_size),
                      r::at_least(1)),
        fixed("optimizer.type", "Muon",
              "\"Muon\" (any case; zmuon implements only Muon, with AdamW for the parameters "
              "Muon does not take)"),
        lr,
        make<float>(p + "muon_lr", ZMUON_SLOT(engine.muon.lr), r::at_least(0)),
        make<float>(p + "adam_lr", ZMUON_SLOT(engine.adamw.lr), r::at_least(0)),
        make<float>(p + "momentum", ZMUON_SLOT(engine.muon.momentum), r::half_open(0, 1)),
        ns_method,
        make<bool>(p + "nesterov", ZMUON_SLOT(engine.muon.nesterov)),
        weight_decay,
        cautious,
        make<muon_variant>(p + "variant", ZMUON_SLOT(engine.muon.variant), {},
                           names_of(muon_variant_names)),
        make<float>(p + "normuon_beta2", ZMUON_SLOT(engine.muon.normuon_beta2), r::half_open(0, 1)),
        make<float>(p + "normuon_eps", ZMUON_SLOT(engine.muon.normuon_eps), r::above(0)),
        numbers(p + "betas", {ZMUON_SLOT(engine.adamw.beta1), ZMUON_SLOT(engine.adamw.beta2)},
                r::half_open(0, 1)),
        make<float>(p + "eps", ZMUON_SLOT(engine.adamw.eps), r::above(0)),
        make<int>(p + "ns_steps", ZMUON_SLOT(engine.muon.ns.steps), r::closed(1, kMaxNsSteps)),
        numbers(p + "ns_coefficients", {ZMUON_SLOT(engine.muon.ns.coefficients[0]),
                                        ZMUON_SLOT(engine.muon.ns.coefficients[1]),
                                        ZMUON_SLOT(engine.muon.ns.coefficients[2])}),
        ns_schedule(p + "ns_schedule"),
        make<ns_variant>(p + "ns_variant", ZMUON_SLOT(engine.muon.ns.variant), {},
                         {"standard", "gram", "auto"}),
        make<int>(p + "ns_gram_restart", ZMUON_SLOT(engine.muon.ns.gram_restart),
                  r::closed(0, kMaxNsSteps)),
        make<adjust_lr_rule>(p + "adjust_lr", ZMUON_SLOT(engine.muon.adjust_lr), {},
                             names_of(adjust_lr_rule_names)),
        make<float>(p + "qk_clip_tau", ZMUON_SLOT(engine.muon.qk_clip_tau), r::at_least(0)),
        make<bool>("per_head_muon", ZMUON_SLOT(engine.per_head_muon)),
        make<bool>("csv_monitor.enabled", ZMUON_SLOT(monitor.csv)),
        make<std::string>("csv_monitor.output_path", ZMUON_SLOT(monitor.csv_output_path)),
        make<std::string>("csv_monitor.job_name", ZMUON_SLOT(monitor.csv_job_name)),
        make<std::string>("zmuon.backend", ZMUON_SLOT(engine.compute), {}, {"host", "cuda"}),
        make<std::string>("zmuon.comm", ZMUON_SLOT(engine.comm), {}, {"auto", "caf", "nccl"}),
        make<muon_transport>("zmuon.muon_transport", ZMUON_SLOT(engine.muon.transport), {},
                             {"auto", "bf16", "fp32"}),
        make<shard_layout>("zmuon.shard_layout", ZMUON_SLOT(engine.layout), {}, {"flat", "rows"}),
        make<int>("zmuon.ranks", ZMUON_SLOT(engine.world), r::closed(1, kMaxRanksPerProcess)),
        make<int>("zmuon.device", ZMUON_SLOT(engine.first_device), r::at_least(0)),
        make<std::string>("zmuon.trace", ZMUON_SLOT(trace)),
        make<int64_t>("zmuon.timeout_ms", ZMUON_SLOT(engine.timeout_ms),
                      r::closed(1, kMaxTimeoutMs)),
        make<int>("zmuon.max_buckets_in_flight", ZMUON_SLOT(engine.max_buckets_in_flight),
                  r::at_least(0)),
        make<std::string>("zmuon.momentum_before_vote", ZMUON_SLOT(engine.momentum_before_vote), {},
                          {"auto", "on", "off"}),
        make<int64_t>("zmuon.heartbeat_timeout_ms", ZMUON_SLOT(heartbeat_timeout_ms),
                      r::closed(1, kMaxTimeoutMs)),
        make<std::string>("zmuon.metrics_file", ZMUON_SLOT(monitor.metrics_file)),
        make<bool>("zmuon.strict", ZMUON_SLOT(strict)),
    };
  }();
  return fields;
}

#undef ZMUON_SLOT

std::string join(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream in(path);
  for (std::string part; std::getline(in, part, '.');)
    parts.push_back(part);
  if (!path.empty() && path.back() == '.')
    parts.emplace_back();
  return parts;
}

const json* find(const json& j, const std::string& path) {
  const json* node = &j;
  for (const auto& key : split_path(path)) {
    if (!node->is_object() || !node->contains(key))
      return nullptr;
    node = &(*node)[key];
  }
  return node;
}

bool is_auto(const json& v) {
  return v.is_string() && v.get<std::string>() == "auto";
}

const std::vector<std::string>& known_paths() {
  static const std::vector<std::string> paths = [] {
    std::vector<std::string> out;
    for (const auto& f : schema())
      out.push_back(f.path);
    for (const auto& k : deepspeed_keys())
      out.push_back(k.path);
    out.push_back("scheduler.type");
    for (const auto& p : schedule_keys(nullptr))
      out.push_back("scheduler.params." + p);
    for (const auto& [name, keys] : host_monitors())
      for (const auto& k : keys)
        out.push_back(name + "." + k);
    return out;
  }();
  return paths;
}

std::vector<std::string> keys_under(const std::string& prefix) {
  std::vector<std::string> keys;
  size_t skip = prefix.empty() ? 0 : prefix.size() + 1;
  for (const auto& path : known_paths()) {
    if (path.size() <= skip || (skip > 0 && path.compare(0, skip, prefix + ".") != 0))
      continue;
    std::string key = path.substr(skip, path.find('.', skip) - skip);
    if (std::find(keys.begin(), keys.end(), key) == keys.end())
      keys.push_back(key);
  }
  return keys;
}

bool is_section(const std::string& path) {
  return !keys_under(path).empty();
}

bool is_field(const std::string& path) {
  const auto& s = schema();
  return std::any_of(s.begin(), s.end(), [&](const field& f) { return f.path == path; });
}

bool is_leaf(const std::string& path) {
  const auto& p = known_paths();
  return std::find(p.begin(), p.end(), path) != p.end() && !is_section(path);
}

std::string unknown_key(const std::string& prefix, const std::string& key) {
  return unknown_key(prefix, key, keys_under(prefix));
}

}  // namespace zmuon::config_detail
