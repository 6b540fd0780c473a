// The config schema as one table of fields (full key path, reader, writer); the unknown-key
// check, the --set path check and the defaults' JSON are all derived from that table, with the
// paths of DeepSpeed's other keys, the scheduler's and the host monitors'. Internal to
// src/config/.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "config/diagnostics.hpp"
#include "zmuon/config.hpp"

namespace zmuon::config_detail {

std::string number_text(double x);
/// The shortest decimal that reads back as `f`, so that 0.95f is written 0.95.
json float_json(float f);

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

/// `x` as the schema writes it back: a float as its shortest decimal, an enum by its name.
template <class T>
json write_as(T x, const std::vector<std::string>& choices) {
  if constexpr (std::is_same_v<T, float>)
    return float_json(x);
  else if constexpr (std::is_enum_v<T>)
    return choices.at(static_cast<size_t>(x));
  else
    return x;
}

/// One key of the schema: its full dotted path, how a present value is read into a job_config,
/// and how the job_config's value is written back (empty for an alias).
struct field {
  std::string path;
  std::function<error(const json&, job_config&)> read;
  std::function<json(job_config)> write;
};

/// Every field of the schema, in the order they are read (ns_schedule after ns_steps).
const std::vector<field>& schema();

// Paths: "a.b.c", the keys of nested objects.

std::string join(const std::string& prefix, const std::string& key);
std::vector<std::string> split_path(const std::string& path);
/// The value at `path` in `j`, or null.
const json* find(const json& j, const std::string& path);
bool is_auto(const json& v);
/// Every known full path: the schema's fields, DeepSpeed's other keys, the scheduler's and the
/// host monitors' keys (the sections, by the paths below them).
const std::vector<std::string>& known_paths();
/// The valid keys directly under `prefix` ("" for the top level), in table order.
std::vector<std::string> keys_under(const std::string& prefix);
bool is_section(const std::string& path);
bool is_field(const std::string& path);
/// A leaf of any table (a value, not a section); DeepSpeed's whole sections count as leaves.
bool is_leaf(const std::string& path);
/// unknown_key() among the keys under `prefix`.
std::string unknown_key(const std::string& prefix, const std::string& key);

}  // namespace zmuon::config_detail
