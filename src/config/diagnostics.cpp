// The config's errors and suggestions (diagnostics.hpp).
#include "config/diagnostics.hpp"

#include <algorithm>
#include <cctype>

#include "config/schema.hpp"

namespace zmuon::config_detail {

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

std::string lower(std::string s) {
  for (char& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

namespace {

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

}  // namespace

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

std::string listed(const std::vector<std::string>& items, const char* quote) {
  std::string out;
  for (const auto& item : items)
    out += (out.empty() ? "" : ", ") + std::string(quote) + item + quote;
  return out;
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

error with_context(const std::string& context, const error& err) {
  return err ? error{err.code(), context + ": " + err.message()} : err;
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

}  // namespace zmuon::config_detail
