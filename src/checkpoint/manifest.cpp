// The checkpoint manifest (checkpoint.hpp): its JSON text, and the strict parser that names every
// key that is missing, unknown, of the wrong type or inconsistent.
#include <cmath>
#include <limits>
#include <set>
#include <type_traits>

#include "base/json_text.hpp"
#include "checkpoint/checkpoint.hpp"
#include "checkpoint/detail.hpp"

namespace zmuon {

namespace {

using detail::bad;
using detail::in_quotes;
using detail::shape_text;

const char* const format_name = "zmuon-checkpoint";
constexpr int format_version = 1;

using json = nlohmann::json;

/// Reads `obj[key]` as T with a message naming the key; checks the set of keys separately.
template <class T>
error get(const json& obj, const std::string& key, T& out, const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end())
    return bad(path, "manifest lacks " + in_quotes(key));
  // Integers must be JSON integers in T's range (nlohmann would truncate 1.5 or wrap -1).
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    bool fits = false;
    if (it->is_number_unsigned())
      fits = it->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    else if (it->is_number_integer() && std::is_signed_v<T>)
      fits = it->get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min());
    if (!fits)
      return bad(path,
                 "manifest key " + in_quotes(key) + " is not an integer in range: " + it->dump());
  }
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    return bad(path, "manifest key " + in_quotes(key) + " has the wrong type: " + it->dump());
  }
  return {};
}

error exact_keys(const json& obj, const std::set<std::string>& keys, const std::string& where,
                 const std::string& path) {
  if (!obj.is_object())
    return bad(path, where + " is not a JSON object");
  for (const auto& [key, value] : obj.items())
    if (!keys.count(key))
      return bad(path, where + " has an unknown key " + in_quotes(key));
  for (const auto& key : keys)
    if (!obj.contains(key))
      return bad(path, where + " lacks " + in_quotes(key));
  return {};
}

}  // namespace

std::string manifest_text(const checkpoint_manifest& m) {
  json params = json::array();
  for (const auto& p : m.params)
    params.push_back({{"name", p.name}, {"shape", p.shape}, {"muon", p.muon}});
  json files = json::array();
  for (const auto& f : m.files)
    files.push_back({{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"crc32", f.crc32}});
  json j = {
      {"format", format_name},
      {"version", format_version},
      {"world", m.world},
      {"step", m.step},
      {"adam_steps", m.adam_steps},
      {"loss_scaler",
       {{"scale", m.scaler.scale},
        {"iter", m.scaler.iter},
        {"last_overflow_iter", m.scaler.last_overflow_iter},
        {"hysteresis_left", m.scaler.hysteresis_left}}},
      {"parameters", params},
      {"config", m.config},
      {"files", files},
  };
  if (!m.adam_param_steps.empty())
    j["adam_param_steps"] = m.adam_param_steps;
  if (m.layout == shard_layout::rows)  // absent: flat
    j["shard_layout"] = "rows";
  return j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

expected<checkpoint_manifest> parse_manifest(const std::string& text, const std::string& path) {
  auto parsed = parse_json_text(text, "", /*ignore_comments=*/false);  // no recursion, no throw
  if (!parsed)
    return bad(path, "manifest is not valid JSON: " + parsed.err().message());
  json j = std::move(*parsed);
  checkpoint_manifest m;
  if (j.is_object() && j.contains("adam_param_steps")) {  // optional: per-parameter counts
    const json& steps = j["adam_param_steps"];
    if (!steps.is_array())
      return bad(path, "manifest adam_param_steps is not an array");
    for (const auto& n : steps) {
      if (!n.is_number_integer() || n.get<int64_t>() < 0)
        return bad(path, "manifest adam_param_steps holds " + n.dump() + ", not a step count");
      m.adam_param_steps.push_back(n.get<int64_t>());
    }
    j.erase("adam_param_steps");
  }
  if (j.is_object() && j.contains("shard_layout")) {  // optional: absent is "flat"
    const json& layout = j["shard_layout"];
    if (layout != "flat" && layout != "rows")
      return bad(path, "manifest shard_layout is " + layout.dump() + ", not \"flat\" or \"rows\"");
    m.layout = layout == "rows" ? shard_layout::rows : shard_layout::flat;
    j.erase("shard_layout");
  }
  if (auto err = exact_keys(j,
                            {"format", "version", "world", "step", "adam_steps", "loss_scaler",
                             "parameters", "config", "files"},
                            "manifest", path))
    return err;
  std::string format;
  int version = 0;
  if (auto err = get(j, "format", format, path))
    return err;
  if (format != format_name)
    return bad(path, "manifest format is " + in_quotes(format) + ", not " + in_quotes(format_name));
  if (auto err = get(j, "version", version, path))
    return err;
  if (version != format_version)
    return bad(path, "manifest version " + std::to_string(version) + " is not supported (only "
                         + std::to_string(format_version) + ")");
  if (auto err = get(j, "world", m.world, path))
    return err;
  if (auto err = get(j, "step", m.step, path))
    return err;
  if (auto err = get(j, "adam_steps", m.adam_steps, path))
    return err;
  if (m.world < 1 || m.world > (1 << 20))
    return bad(path, "manifest world " + std::to_string(m.world) + " is not a world size");
  if (m.adam_steps < 0 || static_cast<uint64_t>(m.adam_steps) > m.step)
    return bad(path,
               "manifest adam_steps " + std::to_string(m.adam_steps) + " is not in [0, step]");
  const json& ls = j["loss_scaler"];
  if (auto err = exact_keys(ls, {"scale", "iter", "last_overflow_iter", "hysteresis_left"},
                            "manifest loss_scaler", path))
    return err;
  if (auto err = get(ls, "scale", m.scaler.scale, path))
    return err;
  if (auto err = get(ls, "iter", m.scaler.iter, path))
    return err;
  if (auto err = get(ls, "last_overflow_iter", m.scaler.last_overflow_iter, path))
    return err;
  if (auto err = get(ls, "hysteresis_left", m.scaler.hysteresis_left, path))
    return err;
  if (!(m.scaler.scale > 0) || !std::isfinite(m.scaler.scale) || m.scaler.iter < 0
      || m.scaler.hysteresis_left < 1 || m.scaler.last_overflow_iter < -1)
    return bad(path, "manifest loss_scaler " + ls.dump() + " is not a valid scaler state");
  m.config = j["config"];

  const json& params = j["parameters"];
  if (!params.is_array())
    return bad(path, "manifest parameters is not an array");
  std::set<std::string> names;
  for (const json& p : params) {
    if (auto err = exact_keys(p, {"name", "shape", "muon"}, "manifest parameter entry", path))
      return err;
    checkpoint_param cp;
    if (auto err = get(p, "name", cp.name, path))
      return err;
    if (auto err = get(p, "shape", cp.shape, path))
      return err;
    if (auto err = get(p, "muon", cp.muon, path))
      return err;
    if (cp.name.empty() || !names.insert(cp.name).second)
      return bad(path, "manifest parameter name " + in_quotes(cp.name) + " is empty or repeated");
    int64_t numel = 1;
    for (int64_t d : cp.shape)
      if (d < 1 || __builtin_mul_overflow(numel, d, &numel) || numel > (int64_t{1} << 40))
        return bad(path, "manifest parameter " + in_quotes(cp.name) + " has shape "
                             + shape_text(cp.shape) + ", which is not a tensor shape");
    m.params.push_back(std::move(cp));
  }

  const json& files = j["files"];
  if (!files.is_array())
    return bad(path, "manifest files is not an array");
  for (const json& f : files) {
    if (auto err = exact_keys(f, {"name", "rank", "bytes", "crc32"}, "manifest file entry", path))
      return err;
    checkpoint_file cf;
    if (auto err = get(f, "name", cf.name, path))
      return err;
    if (auto err = get(f, "rank", cf.rank, path))
      return err;
    if (auto err = get(f, "bytes", cf.bytes, path))
      return err;
    if (auto err = get(f, "crc32", cf.crc32, path))
      return err;
    int expected_rank = static_cast<int>(m.files.size());
    if (cf.rank != expected_rank || cf.name != shard_file_name(expected_rank))
      return bad(path, "manifest file entry " + std::to_string(expected_rank) + " is "
                           + in_quotes(cf.name) + " of rank " + std::to_string(cf.rank)
                           + ", expected " + in_quotes(shard_file_name(expected_rank)));
    m.files.push_back(std::move(cf));
  }
  if (static_cast<int>(m.files.size()) != m.world)
    return bad(path, "manifest says world " + std::to_string(m.world) + " but lists "
                         + std::to_string(m.files.size()) + " shard files");
  size_t adam_params = 0;
  for (const auto& p : m.params)
    adam_params += p.muon ? 0 : 1;
  if (!m.adam_param_steps.empty() && m.adam_param_steps.size() != adam_params)
    return bad(path, "manifest adam_param_steps has " + std::to_string(m.adam_param_steps.size())
                         + " counts for " + std::to_string(adam_params) + " AdamW parameters");
  for (int64_t n : m.adam_param_steps)
    if (static_cast<uint64_t>(n) > m.step)
      return bad(path, "manifest adam_param_steps holds " + std::to_string(n)
                           + ", more than the step " + std::to_string(m.step));
  return m;
}

}  // namespace zmuon
