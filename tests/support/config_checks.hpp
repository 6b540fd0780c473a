// The config tests' checks (test_config, test_config_json): an error's message and what it must
// say, for schema checks of JSON text.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "config/config.hpp"

namespace {

using nlohmann::json;

struct case_t {
  std::string config;    // JSON text
  std::string expected;  // a substring of the error message
};

/// The error message, for a failed check's report ("" when there is a value).
template <class T>
std::string why(const zmuon::expected<T>& e) {
  return e ? std::string() : e.err().message();
}

std::string error_of(const std::string& text) {
  auto cfg = zmuon::parse_config(json::parse(text));
  BOOST_REQUIRE_MESSAGE(!cfg, "accepted: " << text);
  BOOST_TEST((cfg.err().code() == zmuon::errc::invalid_argument));
  return cfg.err().message();
}

void check_errors(const std::vector<case_t>& cases) {
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.config) {
      std::string message = error_of(c.config);
      BOOST_TEST(message.find(c.expected) != std::string::npos,
                 "message: " << message << "\nexpected to contain: " << c.expected);
    }
  }
}

std::string write_file(const std::string& name, const std::string& text) {
  std::ofstream(name) << text;
  return name;
}

}  // namespace
