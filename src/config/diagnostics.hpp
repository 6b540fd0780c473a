// How the config reader says what is wrong: a value as an error shows it, the nearest valid key
// ("did you mean"), and every problem and note of one parse gathered into one error or note.
// Internal to src/config/.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zmuon/status.hpp"

namespace zmuon::config_detail {

using json = nlohmann::json;

/// `v` as an error shows it: its type and at most 40 characters of it.
std::string describe(const json& v);
/// "path: expected `wanted`, got ..." as an invalid_argument error.
error bad(const std::string& path, const std::string& wanted, const json& got);
std::string lower(std::string s);
/// The candidate nearest to `key` (case-insensitive), or "" when none is close. The distance is
/// at least the lengths' difference, so a key far longer than a candidate is compared by prefix
/// only: a hostile key of megabytes costs its length, not its length times the candidates'.
std::string nearest(const std::string& key, const std::vector<std::string>& candidates);
/// The nearest of `keys` to `key`; a "stage3_" key is matched among the stage3_* keys first.
std::string nearest_in(const std::string& key, const std::vector<std::string>& keys);
std::string listed(const std::vector<std::string>& items, const char* quote);
/// "unknown key 'prefix.key'" with the nearest of `keys` or, when none is close, all of them.
std::string unknown_key(const std::string& prefix, const std::string& key,
                        const std::vector<std::string>& keys);
/// `err` with "context: " before its message (no error: none).
error with_context(const std::string& context, const error& err);

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

/// The problems as one error: alone, as they are; several, one a line under a count.
error problems_error(const std::vector<std::string>& problems, const std::string& what);
}  // namespace zmuon::config_detail
