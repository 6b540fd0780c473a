// The public config entry points (zmuon/config.hpp) over the strict schema (schema.hpp): a
// config from text or a file, the Newton-Schulz options alone.
#include <algorithm>
#include <string>

#include "config/config.hpp"
#include "zmuon/config.hpp"

namespace zmuon {
namespace {

/// `text` as JSON (comments allowed; blank text is an empty object). `what` names it in the
/// error.
expected<nlohmann::json> parse_text(const std::string& text, const std::string& what) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    return nlohmann::json::object();
  return parse_json_text(text, what + " not valid JSON: ");
}

}  // namespace

expected<job_config> parse_config_text(const std::string& json_text,
                                       const std::vector<std::string>& overrides,
                                       const config_context& context) {
  auto parsed = parse_text(json_text, "the config is");
  if (!parsed)
    return parsed.err();
  nlohmann::json j = std::move(*parsed);
  config_context lenient = context;  // the notes are judged once, on the whole
  lenient.strict = false;
  if (json_text.find_first_not_of(" \t\r\n") != std::string::npos)
    if (auto checked = parse_config(j, lenient); !checked)  // the text's own, before overrides'
      return checked.err();
  for (const auto& o : overrides)
    if (auto err = apply_override(j, o))
      return err;
  return parse_config(j, context);
}

expected<job_config> load_config_file(const std::string& path,
                                      const std::vector<std::string>& overrides,
                                      const config_context& context) {
  if (path.empty())
    return error{errc::invalid_argument, "config file path is empty"};
  return load_config(path, overrides, nlohmann::json::object(), context);
}

expected<ns_options> parse_ns_options(const std::string& json_text) {
  static const std::vector<std::string> keys = {"ns_steps", "ns_coefficients", "ns_schedule",
                                                "ns_variant", "ns_gram_restart"};
  const std::string section = "optimizer.params.";
  auto parsed = parse_text(json_text, "the Newton-Schulz options are");
  if (!parsed)
    return parsed.err();
  const nlohmann::json j = std::move(*parsed);
  std::string valid;
  for (const auto& k : keys)
    valid += (valid.empty() ? "" : ", ") + k;
  if (!j.is_object()) {
    std::string got = j.dump();
    if (got.size() > 40)  // a long array in full says nothing more
      got = got.substr(0, 37) + "...";
    return error{errc::invalid_argument,
                 "the Newton-Schulz options: expected a JSON object of " + valid + ", got " + got};
  }
  for (const auto& item : j.items()) {
    if (std::find(keys.begin(), keys.end(), item.key()) != keys.end())
      continue;
    std::string message = "unknown key '" + item.key() + "'";
    const std::string guess = nearest_key(item.key(), keys);
    return error{errc::invalid_argument,
                 message
                     + (guess.empty() ? " (valid keys: " + valid + ")"
                                      : " (did you mean '" + guess + "'?)")};
  }
  // ns_schedule needs ns_steps, which the schema reads first wherever it stands.
  auto cfg = parse_config(nlohmann::json{{"optimizer", {{"params", j}}}});
  if (!cfg) {
    std::string message = cfg.err().message();
    for (size_t at; (at = message.find(section)) != std::string::npos;)
      message.erase(at, section.size());
    return error{cfg.err().code(), message};
  }
  return cfg->engine.muon.ns;
}

}  // namespace zmuon
