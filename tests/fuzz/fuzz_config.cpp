// libFuzzer target: the job config parser (config/config.cpp and its parts). The input is JSON
// text, or, after a first line starting with "--set ", one override applied to it. Whatever the
// bytes, parsing returns a job_config or an error; it never crashes, hangs or throws.
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::string override_text;
  if (text.rfind("--set ", 0) == 0) {
    size_t eol = text.find('\n');
    override_text = text.substr(6, eol == std::string::npos ? std::string::npos : eol - 6);
    text = eol == std::string::npos ? "{}" : text.substr(eol + 1);
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return 0;
  if (!override_text.empty() && zmuon::apply_override(j, override_text))
    return 0;
  auto cfg = zmuon::parse_config(j);
  if (cfg)
    (void)zmuon::config_json(*cfg);  // what parsed must also print
  return 0;
}
