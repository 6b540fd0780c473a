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

/// The candidate nearest to `key` (case-insensitive), or "" when none is close.
std::string nearest(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& c : candidates) {
    std::string k = lower(key), l = lower(c);
    size_t dist = edit_distance(k, l);
    bool close = dist <= std::max<size_t>(2, std::min(k.size(), l.size()) / 3)
                 || (k.size() >= 3 && (l.rfind(k, 0) == 0 || k.rfind(l, 0) == 0));
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
    field lr = make<float>(p + "lr", ZMUON_SLOT(engine.muon.lr), r::at_least(0));
    lr.write = nullptr;  // an alias of muon_lr
    field weight_decay =
        make<float>(p + "weight_decay", ZMUON_SLOT(engine.muon.weight_decay), r::at_least(0));
    weight_decay.read = [read = weight_decay.read](const json& v, job_config& c) {
      error err = read(v, c);
      c.engine.adamw.weight_decay = c.engine.muon.weight_decay;  // one decay for both groups
      return err;
    };
    return std::vector<field>{
        make<int>("train_micro_batch_size_per_gpu", ZMUON_SLOT(micro_batch), r::closed(1, 1 << 20)),
        make<int>("gradient_accumulation_steps", ZMUON_SLOT(gas), r::closed(1, 1 << 20)),
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
        fixed("optimizer.type", "Muon", "\"Muon\" (any case; zmuon implements only Muon)"),
        lr,
        make<float>(p + "muon_lr", ZMUON_SLOT(engine.muon.lr), r::at_least(0)),
        make<float>(p + "adam_lr", ZMUON_SLOT(engine.adamw.lr), r::at_least(0)),
        make<float>(p + "momentum", ZMUON_SLOT(engine.muon.momentum), r::half_open(0, 1)),
        make<bool>(p + "nesterov", ZMUON_SLOT(engine.muon.nesterov)),
        weight_decay,
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
                             {"original", "match_rms_adamw"}),
        make<bool>("per_head_muon", ZMUON_SLOT(engine.per_head_muon)),
        make<std::string>("zmuon.backend", ZMUON_SLOT(engine.compute), {}, {"host", "cuda"}),
        make<std::string>("zmuon.comm", ZMUON_SLOT(engine.comm), {}, {"auto", "caf", "nccl"}),
        make<muon_transport>("zmuon.muon_transport", ZMUON_SLOT(engine.muon.transport), {},
                             {"auto", "bf16", "fp32"}),
        make<int>("zmuon.ranks", ZMUON_SLOT(engine.world), r::closed(1, kMaxRanksPerProcess)),
        make<std::string>("zmuon.trace", ZMUON_SLOT(trace)),
        make<int64_t>("zmuon.timeout_ms", ZMUON_SLOT(engine.timeout_ms),
                      r::closed(1, kMaxTimeoutMs)),
        make<int>("zmuon.max_buckets_in_flight", ZMUON_SLOT(engine.max_buckets_in_flight),
                  r::at_least(0)),
        make<int64_t>("zmuon.heartbeat_timeout_ms", ZMUON_SLOT(heartbeat_timeout_ms),
                      r::closed(1, kMaxTimeoutMs)),
    };
  }();
  return fields;
}

#undef ZMUON_SLOT

// -- paths --------------------------------------------------------------------------------------

std::string join(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

/// The valid keys directly under `prefix` ("" for the top level), in schema order.
std::vector<std::string> keys_under(const std::string& prefix) {
  std::vector<std::string> keys;
  size_t skip = prefix.empty() ? 0 : prefix.size() + 1;
  for (const auto& f : schema()) {
    if (f.path.size() <= skip || (skip > 0 && f.path.compare(0, skip, prefix + ".") != 0))
      continue;
    std::string key = f.path.substr(skip, f.path.find('.', skip) - skip);
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

std::string unknown_key(const std::string& prefix, const std::string& key) {
  auto keys = keys_under(prefix);
  std::string message = "unknown key '" + join(prefix, key) + "'";
  if (auto guess = nearest(key, keys); !guess.empty())
    return message + " (did you mean '" + guess + "'?)";
  return message + " (valid keys" + (prefix.empty() ? "" : " under '" + prefix + "'") + ": "
         + listed(keys, "") + ")";
}

/// Every key of `obj` (at `prefix`) must be a field or a section, and every section an object.
error check_keys(const json& obj, const std::string& prefix) {
  for (const auto& [key, value] : obj.items()) {
    std::string path = join(prefix, key);
    if (key.find('.') != std::string::npos)  // would otherwise pass as a path, then be ignored
      return {errc::invalid_argument, "key '" + path + "' holds a '.': nest sections as objects"};
    if (is_field(path))
      continue;
    if (!is_section(path))
      return {errc::invalid_argument, unknown_key(prefix, key)};
    if (!value.is_object())
      return bad(path, "an object", value);
    if (auto err = check_keys(value, path))
      return err;
  }
  return {};
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

}  // namespace

expected<job_config> parse_config(const json& j) {
  if (json_too_deep(j))  // before anything walks it recursively (describe() dumps it)
    return error{errc::invalid_argument,
                 "the config nests deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
  if (!j.is_object())
    return bad("the config", "a JSON object", j);
  if (auto err = check_keys(j, ""))
    return err;
  job_config cfg;
  for (const auto& f : schema())
    if (const json* v = find(j, f.path))
      if (auto err = f.read(*v, cfg))
        return err;
  const json* lr = find(j, "optimizer.params.lr");
  const json* muon_lr = find(j, "optimizer.params.muon_lr");
  if (lr && muon_lr && *lr != *muon_lr)
    return error{errc::invalid_argument,
                 "optimizer.params.lr (" + describe(*lr) + ") and optimizer.params.muon_lr ("
                     + describe(*muon_lr) + ") differ; lr is an alias of muon_lr: give one"};
  if (cfg.engine.fp16.enabled && cfg.bf16)
    return error{errc::invalid_argument, "fp16.enabled and bf16.enabled are both true; pick one"};
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
    if (is_field(path) && i + 1 < parts.size())
      return fail("'" + path + "' is a value, not a section");
    if (!is_field(path) && !is_section(path))
      return fail(unknown_key(prefix, parts[i]));
    prefix = path;
  }
  // One JSON merge patch (RFC 7386): objects merge, null removes, anything else replaces. Of
  // the aliases lr and muon_lr, the last one given wins.
  const std::string text = key_eq_value.substr(eq + 1);
  bool not_json = false;  // then a string, as given
  auto value = parse_json_text(text, "", /*ignore_comments=*/false, &not_json);
  if (!value && !not_json)  // JSON, but refused: a number out of range, too deep a nesting
    return fail(value.err().message());
  json patch = value ? std::move(*value) : json(text);
  if (prefix == "optimizer.params.lr" || prefix == "optimizer.params.muon_lr")
    patch = {{parts.back(), patch}, {parts.back() == "lr" ? "muon_lr" : "lr", nullptr}};
  else
    patch = {{parts.back(), patch}};
  for (size_t i = parts.size() - 1; i-- > 0;)
    patch = {{parts[i], patch}};
  j.merge_patch(patch);
  return {};
}

expected<job_config> load_config(const std::string& path, const std::vector<std::string>& overrides,
                                 const json& base) {
  json j = base.is_null() ? json::object() : base;
  if (!path.empty()) {
    auto file = read_json_file(path);
    if (!file)
      return file.err();
    if (auto checked = parse_config(*file); !checked)
      return with_context(path, checked.err());
    j.merge_patch(*file);
  }
  for (const auto& o : overrides) {  // check after each, so an error names its override
    if (auto err = apply_override(j, o))
      return err;
    if (auto checked = parse_config(j); !checked)
      return with_context("--set " + shortened_text(o), checked.err());
  }
  return parse_config(j);
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
  return config_json(job_config{});
}

}  // namespace zmuon
