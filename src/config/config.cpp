// The config schema as one table of fields (full key path, reader, writer); the unknown-key
// check, the --set path check and the defaults' JSON are all derived from that table.
#include "config/config.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <sstream>
#include <type_traits>

#include "config/deepspeed_keys.hpp"
#include "kernels/ns_variants.hpp"

namespace zmuon {
namespace {

using json = nlohmann::json;

// -- values and their errors --------------------------------------------------------------------

std::string describe(const json& v) {
  if (v.is_null())
    return "null";
  // A --set value that is not JSON becomes a string as given, possibly invalid UTF-8 (found by
  // tests/fuzz/fuzz_config): print such bytes as U+FFFD instead of throwing.
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40)
    text = text.substr(0, 37) + "...";
  return v.is_number() ? text : std::string(v.type_name()) + " " + text;
}

error bad(const std::string& path, const std::string& wanted, const json& got) {
  return {errc::invalid_argument, path + ": expected " + wanted + ", got " + describe(got)};
}

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

/// An interval of allowed values; `text()` is how an error states it.
struct range {
  double lo = -HUGE_VAL, hi = HUGE_VAL;
  bool lo_open = false, hi_open = false;

  static range at_least(double lo) { return {lo, HUGE_VAL, false, false}; }
  static range above(double lo) { return {lo, HUGE_VAL, true, false}; }
  static range closed(double lo, double hi) { return {lo, hi, false, false}; }
  static range half_open(double lo, double hi) { return {lo, hi, false, true}; }

  bool contains(double x) const {
    return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
  }
  std::string text() const {
    if (lo != -HUGE_VAL && hi != HUGE_VAL)
      return " in " + std::string(lo_open ? "(" : "[") + number_text(lo) + ", " + number_text(hi)
             + (hi_open ? ")" : "]");
    return lo != -HUGE_VAL ? (lo_open ? " > " : " >= ") + number_text(lo) : "";
  }
};

// -- nearest-key suggestions --------------------------------------------------------------------

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// Levenshtein distance.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      row[j] = std::min({prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, row);
  }
  return prev[b.size()];
}

/// The candidate nearest to `key` (case-insensitive), or "" when none is close. The distance is
/// at least the lengths' difference, so a key far longer than a candidate is compared by prefix
/// only: a hostile key of megabytes costs its length, not its length times the candidates'.
std::string nearest(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  const std::string k = lower(key);
  for (const auto& c : candidates) {
    const std::string l = lower(c);
    const size_t limit = std::max<size_t>(2, std::min(k.size(), l.size()) / 3);
    const size_t gap = k.size() > l.size() ? k.size() - l.size() : l.size() - k.size();
    const bool prefix = k.size() >= 3 && (l.rfind(k, 0) == 0 || k.compare(0, l.size(), l) == 0);
    const size_t dist = gap > limit ? gap : edit_distance(k, l);
    bool close = dist <= limit || prefix;
    if (close && dist < best_distance) {
      best = c;
      best_distance = dist;
    }
  }
  return best;
}

std::string listed(const std::vector<std::string>& items, const char* quote) {
  std::string out;
  for (const auto& item : items)
    out += (out.empty() ? "" : ", ") + std::string(quote) + item + quote;
  return out;
}

// -- reading one value ----------------------------------------------------------------------

/// Reads `v` as a T: bool; an integer (a float with an integral value too: DeepSpeed configs
/// write 5e8) or a float, in `r`; a string, one of `choices` when given (any case); an enum,
/// by its index in `choices`.
template <class T>
expected<T> read_as(const json& v, const std::string& path, const range& r,
                    const std::vector<std::string>& choices) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean())
      return bad(path, "true or false", v);
    return v.get<bool>();
  } else if constexpr (std::is_arithmetic_v<T>) {
    constexpr bool integral = std::is_integral_v<T>;
    std::string wanted = (integral ? "an integer" : "a number") + r.text();
    if (!v.is_number())
      return bad(path, wanted, v);
    double d = v.get<double>();
    if (integral && d != std::floor(d))
      return bad(path, wanted, v);
    using limits = std::numeric_limits<T>;
    // An integer literal is compared as one: 9223372036854775807 is a double of 2^63.
    bool fits = !integral                ? std::fabs(d) <= double(limits::max())
                : v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(limits::max())
                : v.is_number_integer()
                    ? v.get<int64_t>() >= static_cast<int64_t>(limits::lowest())
                          && v.get<int64_t>() <= static_cast<int64_t>(limits::max())
                    : d >= double(limits::lowest()) && d < std::ldexp(1.0, limits::digits);
    if (!r.contains(d))
      return bad(path, wanted, v);
    if (!fits)  // only where the range is wider than T
      return bad(path,
                 wanted + " that fits in a " + std::to_string(sizeof(T) * 8) + "-bit "
                     + (integral ? "integer" : "float"),
                 v);
    if (!integral && !r.contains(static_cast<T>(d)))  // 0.9999999999 rounds to 1.0f
      return bad(path, wanted, v);
    return integral && v.is_number_integer() ? v.get<T>() : static_cast<T>(d);
  } else {
    std::string wanted = choices.empty() ? "a string" : "one of " + listed(choices, "\"");
    if (!v.is_string())
      return bad(path, wanted, v);
    auto s = v.get<std::string>();
    if constexpr (!std::is_enum_v<T>) {
      if (choices.empty())
        return s;
    }
    for (size_t i = 0; i < choices.size(); ++i) {
      if (lower(s) != lower(choices[i]))
        continue;
      if constexpr (std::is_enum_v<T>)
        return static_cast<T>(i);
      else
        return choices[i];
    }
    error err = bad(path, wanted, v);
    if (auto guess = nearest(s, choices); !guess.empty())
      return error{err.code(), err.message() + " (did you mean \"" + guess + "\"?)"};
    return err;
  }
}

template <class T>
json write_as(T x, const std::vector<std::string>& choices) {
  if constexpr (std::is_same_v<T, float>)
    return float_json(x);
  else if constexpr (std::is_enum_v<T>)
    return choices.at(static_cast<size_t>(x));
  else
    return x;
}

// -- the schema -----------------------------------------------------------------------------

/// One key of the schema: its full dotted path, how a present value is read into a job_config,
/// and how the job_config's value is written back (empty for an alias).
struct field {
  std::string path;
  std::function<error(const json&, job_config&)> read;
  std::function<json(job_config)> write;
};

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
        make<muon_variant>(p + "variant", ZMUON_SLOT(engine.muon.variant), {}, {"muon", "normuon"}),
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
                             {"original", "match_rms_adamw", "spectral", "rms"}),
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
        make<std::string>("zmuon.trace", ZMUON_SLOT(trace)),
        make<int64_t>("zmuon.timeout_ms", ZMUON_SLOT(engine.timeout_ms),
                      r::closed(1, kMaxTimeoutMs)),
        make<int>("zmuon.max_buckets_in_flight", ZMUON_SLOT(engine.max_buckets_in_flight),
                  r::at_least(0)),
        make<int64_t>("zmuon.heartbeat_timeout_ms", ZMUON_SLOT(heartbeat_timeout_ms),
                      r::closed(1, kMaxTimeoutMs)),
        make<std::string>("zmuon.metrics_file", ZMUON_SLOT(monitor.metrics_file)),
        make<bool>("zmuon.strict", ZMUON_SLOT(strict)),
    };
  }();
  return fields;
}

#undef ZMUON_SLOT

// -- paths --------------------------------------------------------------------------------------

std::string join(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

/// The scheduler types and the params each takes (DeepSpeed's lr_schedules.py).
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

/// The params of the schedule type `type` names (any case), or every schedule's when it names
/// none.
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

/// The monitors a Python host writes itself, with their keys (DeepSpeed's monitor/config.py).
const std::vector<std::pair<std::string, std::vector<std::string>>>& host_monitors() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> monitors = {
      {"tensorboard", {"enabled", "output_path", "job_name"}},
      {"wandb", {"enabled", "group", "team", "project"}},
      {"comet",
       {"enabled", "samples_log_interval", "project", "workspace", "api_key", "experiment_name",
        "experiment_key", "online", "mode"}},
  };
  return monitors;
}

/// Every known full path: the schema's fields, DeepSpeed's other keys, the scheduler's and the
/// host monitors' keys (the sections, by the paths below them).
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

/// The valid keys directly under `prefix` ("" for the top level), in table order.
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

/// A leaf of any table (a value, not a section); DeepSpeed's whole sections count as leaves.
bool is_leaf(const std::string& path) {
  const auto& p = known_paths();
  return std::find(p.begin(), p.end(), path) != p.end() && !is_section(path);
}

/// The nearest of `keys` to `key`; a "stage3_" key is matched among the stage3_* keys first.
std::string nearest_in(const std::string& key, const std::vector<std::string>& keys) {
  const std::string stage3 = "stage3_";
  if (lower(key).rfind(stage3, 0) == 0) {
    std::vector<std::string> own;
    for (const auto& k : keys)
      if (k.rfind(stage3, 0) == 0)
        own.push_back(k.substr(stage3.size()));
    if (auto guess = nearest(key.substr(stage3.size()), own); !guess.empty())
      return stage3 + guess;
  }
  return nearest(key, keys);
}

std::string unknown_key(const std::string& prefix, const std::string& key,
                        const std::vector<std::string>& keys) {
  constexpr size_t shown = 80;  // a key longer than any valid one is shown cut
  std::string name = join(prefix, key);
  if (name.size() > shown)
    name = name.substr(0, shown) + "... (" + std::to_string(name.size()) + " bytes)";
  std::string message = "unknown key '" + name + "'";
  if (auto guess = nearest_in(key, keys); !guess.empty())
    return message + " (did you mean '" + guess + "'?)";
  return message + " (valid keys" + (prefix.empty() ? "" : " under '" + prefix + "'") + ": "
         + listed(keys, "") + ")";
}

std::string unknown_key(const std::string& prefix, const std::string& key) {
  return unknown_key(prefix, key, keys_under(prefix));
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

error with_context(const std::string& context, const error& err) {
  return err ? error{err.code(), context + ": " + err.message()} : err;
}

bool is_auto(const json& v) {
  return v.is_string() && v.get<std::string>() == "auto";
}

// -- one parse: every problem of the document, and the notes ------------------------------------

/// What one parse finds: the problems (errors, in document order) and what it notes.
struct findings {
  std::vector<std::string> problems;
  std::vector<std::string> no_effect;  // paths accepted with no effect
  std::vector<std::string> resolved;   // "path = value (source)" of each "auto"
  std::vector<std::string> other;      // further notes, whole lines
  bool python_host = false;

  void add(const error& err) {
    if (err)
      problems.push_back(err.message());
  }
};

/// Walks `obj` (at `prefix`): every key must be known; DeepSpeed's keys are typed, refused or
/// noted here; the schema's fields are read later.
void check_keys(const json& obj, const std::string& prefix, findings& out) {
  const bool scheduler_params = prefix == "scheduler.params";
  for (const auto& [key, value] : obj.items()) {
    const std::string path = join(prefix, key);
    if (key.find('.') != std::string::npos) {  // would otherwise pass as a path, be ignored
      out.problems.push_back("key '" + path + "' holds a '.': nest sections as objects");
      continue;
    }
    if (scheduler_params)
      continue;  // read_scheduler knows which params its type takes
    if (is_field(path) || path == "scheduler.type")
      continue;
    if (is_leaf(path) && !find_deepspeed_key(path))
      continue;  // a host monitor's key
    if (const ds_key* k = find_deepspeed_key(path)) {
      if (!has_ds_type(value, k->type)) {
        out.add(bad(path, ds_type_text(k->type), value));
        continue;
      }
      const bool off =
          is_auto(value) || k->kind == ds_kind::no_effect
          || (k->kind == ds_kind::refused
              && std::find(k->off.begin(), k->off.end(), value) != k->off.end())
          || (k->kind == ds_kind::section
              && !(value.is_object() && value.contains("enabled") && value["enabled"] == true));
      if (off)
        out.no_effect.push_back(path);
      else if (k->kind == ds_kind::section)
        out.problems.push_back(path + ".enabled is true: " + k->why);
      else
        out.problems.push_back(path + " " + describe(value) + " is refused: " + k->why);
      continue;
    }
    const std::string& name = key;  // a structured binding: C++17 lambdas cannot capture it
    const bool monitor = prefix.empty()
                         && std::any_of(host_monitors().begin(), host_monitors().end(),
                                        [&](const auto& m) { return m.first == name; });
    if (!is_section(path)) {
      out.problems.push_back(unknown_key(prefix, key));
      continue;
    }
    if (!value.is_object()) {
      out.add(bad(path, "an object", value));
      continue;
    }
    check_keys(value, path, out);
    if (monitor && value.contains("enabled") && value["enabled"] == true) {
      if (out.python_host)
        out.other.push_back(key + ": its figures go to the Python host's metrics callback");
      else
        out.problems.push_back(
            key + ".enabled is true: zmuon writes no " + key
            + " files itself; use csv_monitor or zmuon.metrics_file, or a Python host, whose "
              "metrics callback gets each step's figures");
    } else if (monitor) {
      out.no_effect.push_back(key);
    }
  }
}

/// The host's values for "auto" (a JSON object); a bad one is a problem naming it.
json host_values(const config_context& ctx, findings& out) {
  if (ctx.host_values.find_first_not_of(" \t\r\n") == std::string::npos)
    return json::object();
  auto parsed = parse_json_text(ctx.host_values, "the host values are not valid JSON: ");
  if (!parsed) {
    out.problems.push_back(parsed.err().message());
    return json::object();
  }
  static const std::vector<std::string> keys = {"host",
                                                "lr",
                                                "muon_lr",
                                                "adam_lr",
                                                "weight_decay",
                                                "momentum",
                                                "betas",
                                                "eps",
                                                "gradient_clipping",
                                                "micro_batch",
                                                "gas",
                                                "fp16",
                                                "bf16",
                                                "reduce_bucket_size",
                                                "warmup_num_steps",
                                                "total_num_steps"};
  if (!parsed->is_object()) {
    out.problems.push_back("the host values: expected a JSON object, got " + describe(*parsed));
    return json::object();
  }
  for (const auto& item : parsed->items())
    if (std::find(keys.begin(), keys.end(), item.key()) == keys.end())
      out.problems.push_back("the host values: " + unknown_key("", item.key(), keys));
  return *parsed;
}

/// Replaces each "auto" of a schema field in `j` by the job's or the host's value, or removes
/// it (zmuon's default), noting what it became. Fields that take "auto" as a value of their own
/// (zmuon.comm, ns_variant, muon_transport) keep it.
void resolve_auto(json& j, const json& host, const config_context& ctx, findings& out) {
  // Host value names by field path.
  static const std::vector<std::pair<std::string, std::string>> from_host = {
      {"train_micro_batch_size_per_gpu", "micro_batch"},
      {"gradient_accumulation_steps", "gas"},
      {"gradient_clipping", "gradient_clipping"},
      {"fp16.enabled", "fp16"},
      {"bf16.enabled", "bf16"},
      {"zero_optimization.reduce_bucket_size", "reduce_bucket_size"},
      {"optimizer.params.lr", "lr"},
      {"optimizer.params.muon_lr", "muon_lr"},
      {"optimizer.params.adam_lr", "adam_lr"},
      {"optimizer.params.weight_decay", "weight_decay"},
      {"optimizer.params.momentum", "momentum"},
      {"optimizer.params.betas", "betas"},
      {"optimizer.params.eps", "eps"},
  };
  (void)ctx;
  static const job_config defaults;
  for (const auto& f : schema()) {
    const json* v = find(j, f.path);
    if (!v || !is_auto(*v) || f.path.rfind("zmuon.", 0) == 0
        || f.path == "optimizer.params.ns_variant")
      continue;
    auto parts = split_path(f.path);
    json* parent = &j;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      parent = &(*parent)[parts[i]];
    auto it = std::find_if(from_host.begin(), from_host.end(),
                           [&](const auto& e) { return e.first == f.path; });
    if (it != from_host.end() && host.contains(it->second)) {
      (*parent)[parts.back()] = host[it->second];
      out.resolved.push_back(f.path + " = " + host[it->second].dump() + " (the host's " + it->second
                             + ")");
      continue;
    }
    parent->erase(parts.back());
    if (f.path == "train_batch_size")
      continue;  // said once the batch shape is known
    std::string becomes = "zmuon's default";
    if (f.path == "optimizer.params.lr")
      becomes = "each group's default: Muon 0.02, AdamW 3e-4";
    else if (f.path == "optimizer.params.muon_lr" || f.path == "optimizer.params.adam_lr")
      becomes = "lr's rule";
    else if (f.write)
      becomes = f.write(defaults).dump() + " (zmuon's default)";
    out.resolved.push_back(f.path + " = " + becomes);
  }
}

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

/// The scheduler section onto cfg.scheduler; "auto" resolved as HF resolves it.
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

/// The scheduler section of `s`: its type and the params that type reads, per-group pairs as
/// [Muon, AdamW] lists (a group's own lr is left out).
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

/// DeepSpeed's batch rule: train_batch_size = micro-batch x gas x world; given two of the
/// three, the third follows.
void batch_shape(const json& j, int world, job_config& cfg, findings& out) {
  const bool tbs = find(j, "train_batch_size") != nullptr;
  const bool micro = find(j, "train_micro_batch_size_per_gpu") != nullptr;
  const bool gas = find(j, "gradient_accumulation_steps") != nullptr;
  const int64_t w = world;
  if (tbs && !(micro && gas)) {
    const int64_t known = micro ? int64_t{cfg.micro_batch} * w : gas ? int64_t{cfg.gas} * w : w;
    if (cfg.train_batch_size % known != 0) {
      out.problems.push_back("train_batch_size " + std::to_string(cfg.train_batch_size)
                             + " is not a multiple of " + std::to_string(known) + " ("
                             + (micro ? "micro-batch x world"
                                : gas ? "gas x world"
                                      : "world")
                             + ")");
      return;
    }
    const int64_t rest = cfg.train_batch_size / known;
    if (rest > (int64_t{1} << 20)) {
      out.problems.push_back("train_batch_size " + std::to_string(cfg.train_batch_size) + " makes "
                             + (micro ? "gradient_accumulation_steps " : "the micro-batch ")
                             + std::to_string(rest) + ", more than 1048576");
      return;
    }
    if (micro)
      cfg.gas = static_cast<int>(rest);
    else
      cfg.micro_batch = static_cast<int>(rest);  // gas given, or 1
  }
  const int64_t product = int64_t{cfg.micro_batch} * cfg.gas * w;
  if (tbs && micro && gas && cfg.train_batch_size != product)
    out.problems.push_back("train_batch_size " + std::to_string(cfg.train_batch_size)
                           + " is not train_micro_batch_size_per_gpu x "
                             "gradient_accumulation_steps x world = "
                           + std::to_string(cfg.micro_batch) + " x " + std::to_string(cfg.gas)
                           + " x " + std::to_string(world) + " = " + std::to_string(product));
  cfg.train_batch_size = product;
}

/// The problems as one error: alone, as they are; several, one a line under a count.
error problems_error(const std::vector<std::string>& problems, const std::string& what) {
  if (problems.size() == 1)
    return {errc::invalid_argument, problems.front()};
  std::string message = what + " has " + std::to_string(problems.size()) + " problems:";
  for (const auto& p : problems)
    message += "\n  " + p;
  return {errc::invalid_argument, message};
}

}  // namespace

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
  resolve_auto(j, host, ctx, out);
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
