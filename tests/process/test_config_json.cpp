// User JSON that once crashed or hung the config path, each now an invalid_argument naming what
// is wrong: nesting past 100 levels (a recursive dump overflowed the stack), a number past a
// double's range (an uncaught exception), a config path that is a directory or a device (an
// uncaught exception, a read for ever), and values past the schema's upper bounds.
#define BOOST_TEST_MODULE config_json
#include <boost/test/unit_test.hpp>

#include "support/config_checks.hpp"
#include "support/run_launch.hpp"

#include <fstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "kernels/ns_variants.hpp"

// Bad input found by exploratory testing: each is an invalid_argument that names what is wrong,
// never a crash (deep nesting overflowed the stack of a recursive dump), an uncaught exception
// (1e309, a directory) or a hang (/dev/zero).

/// `text`'s error as an invalid_argument; the message, "" when it parsed.
template <class T>
std::string refused(const zmuon::expected<T>& got) {
  if (got)
    return "";
  BOOST_TEST((got.err().code() == zmuon::errc::invalid_argument), got.err().to_string());
  return got.err().message();
}

BOOST_AUTO_TEST_CASE(deep_nesting_is_refused_before_anything_is_built) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  auto path = write_file("test_config_deep.json", deep);
  BOOST_TEST(refused(zmuon::load_config(path, {}))
             == path + ": invalid JSON: nesting deeper than 100 levels at line 1, column 101");
  path = write_file("test_config_deep_key.json",
                    "{\n  \"optimizer\": {\"params\": {\"ns_coefficients\": " + deep + "}}}");
  BOOST_TEST(refused(zmuon::load_config(path, {}))
             == path + ": invalid JSON: nesting deeper than 100 levels at line 2, column 144");
  BOOST_TEST(refused(zmuon::load_config("", {"optimizer.params.ns_coefficients=" + deep}))
             == "--set optimizer.params.ns_coefficients=" + std::string(64, '[')
                    + "...: nesting deeper than 100 levels at line 1, column 101");
  // A document already built (nlohmann's parser and destructor do not recurse) is checked too.
  // (A copy would recurse: the test moves it.)
  json built = json::parse(deep);
  BOOST_TEST(refused(zmuon::parse_config(built)) == "the config nests deeper than 100 levels");
  json config = json::object();
  config["gradient_clipping"] = std::move(built);
  BOOST_TEST(refused(zmuon::parse_config(config)) == "the config nests deeper than 100 levels");

  // 100 levels are JSON; brackets in strings and comments do not count.
  const std::string hundred = std::string(100, '[') + std::string(100, ']');
  BOOST_TEST(static_cast<bool>(zmuon::parse_json_text(hundred, "")));
  BOOST_TEST(refused(zmuon::parse_json_text("[" + hundred + "]", "x: "))
             == "x: nesting deeper than 100 levels at line 1, column 101");
  auto cfg = zmuon::parse_json_text(
      "// [[[[\n{\"zmuon\": {\"trace\": \"" + std::string(200, '[') + "\\\"[\"}} /* [[[ */", "");
  BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
  BOOST_TEST((*cfg)["zmuon"]["trace"].get<std::string>() == std::string(200, '[') + "\"[");
  // A --set value that is not JSON stays a string, however many brackets it opens.
  BOOST_TEST(refused(zmuon::load_config("", {"zmuon.ranks=" + std::string(200, '[')}))
                 .find("zmuon.ranks: expected an integer in [1, 1024], got string \"[[[")
             != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_number_out_of_range_names_its_place) {
  auto path = write_file("test_config_1e309.json", "{\n  \"gradient_clipping\": 1e309\n}\n");
  BOOST_TEST(refused(zmuon::load_config(path, {}))
             == path + ": invalid JSON: number 1e309 is out of range at line 2, column 24");
  BOOST_TEST(
      refused(zmuon::load_config("", {"gradient_clipping=-1e309"}))
      == "--set gradient_clipping=-1e309: number -1e309 is out of range at line 1, column 1");
  BOOST_TEST(refused(zmuon::load_config("", {"gradient_clipping=1" + std::string(400, '0')}))
             == "--set gradient_clipping=1" + std::string(78, '0') + "...: number 1"
                    + std::string(96, '0') + "... is out of range at line 1, column 1");
  BOOST_TEST(refused(zmuon::load_config("", {"fp16.loss_scale=[1, 2e400]"}))
             == "--set fp16.loss_scale=[1, 2e400]: number 2e400 is out of range at line 1, "
                "column 5");
  // Syntax errors keep nlohmann::json's own words and position.
  BOOST_TEST(refused(zmuon::parse_json_text("[1,\n 2,]", "t: "))
             == "t: parse error at line 2, column 4: syntax error while parsing value - unexpected "
                "']'; expected '[', '{', or a literal");
}

BOOST_AUTO_TEST_CASE(a_key_given_twice_is_refused_with_its_place) {
  // nlohmann keeps the last of two equal keys: the first "lr" of a config would be ignored.
  auto path = write_file("test_config_dup.json",
                         "{\"optimizer\": {\"params\": {\"lr\": 0.02, \"momentum\": 0.9,\n"
                         "  \"lr\": 0.5}}}");
  BOOST_TEST(
      refused(zmuon::load_config(path, {}))
      == path + ": invalid JSON: key \"lr\" appears twice in the object at /optimizer/params");
  BOOST_TEST(refused(zmuon::parse_json_text(R"({"a": 1, "b": [0, {"c": 1}], "a": 2})", "t: "))
             == "t: key \"a\" appears twice in the top-level object");
  BOOST_TEST(refused(zmuon::parse_json_text(R"({"a": [1, [], {"x": {}}, {"c": 1, "c": 1}]})", ""))
             == "key \"c\" appears twice in the object at /a/3");
  BOOST_TEST(
      refused(zmuon::load_config("", {R"(optimizer.params.ns_coefficients={"k": 1, "k": 1})"}))
          .find("key \"k\" appears twice in the top-level object")
      != std::string::npos);
  // Equal keys in different objects, and equal values, are JSON as before.
  auto ok =
      zmuon::parse_json_text(R"({"a": {"k": 1}, "b": {"k": 1}, "c": [{"k": 2}, {"k": 3}]})", "");
  BOOST_REQUIRE_MESSAGE(ok, why(ok));
  BOOST_TEST((*ok)["c"][1]["k"].get<int>() == 3);
}

BOOST_AUTO_TEST_CASE(a_config_path_that_is_no_file_is_refused_without_reading) {
  auto cfg = zmuon::load_config(".", {});
  BOOST_TEST(refused(cfg) == "config file '.' is a directory");
  cfg = zmuon::load_config("/dev/zero", {});  // it would never end
  BOOST_TEST(refused(cfg) == "config file '/dev/zero' is not a regular file");
  auto big = write_file("test_config_big.json", "{}");
  std::filesystem::resize_file(big, zmuon::kMaxConfigBytes + 1);  // sparse: no time, no space
  BOOST_TEST(refused(zmuon::load_config(big, {}))
             == "config file '" + big + "' is larger than 64 MiB");
  std::filesystem::remove(big);
}

BOOST_AUTO_TEST_CASE(timeouts_and_ns_steps_have_an_upper_bound) {
  check_errors({
      {R"({"zmuon": {"timeout_ms": 9300000000000}})",
       "zmuon.timeout_ms: expected an integer in [1, 2592000000], got 9300000000000"},
      {R"({"zmuon": {"timeout_ms": 9223372036854775807}})",
       "zmuon.timeout_ms: expected an integer in [1, 2592000000], got 9223372036854775807"},
      {R"({"zmuon": {"heartbeat_timeout_ms": 2592000001}})",
       "zmuon.heartbeat_timeout_ms: expected an integer in [1, 2592000000], got 2592000001"},
      {R"({"zmuon": {"heartbeat_timeout_ms": 1e30}})",
       "zmuon.heartbeat_timeout_ms: expected an integer in [1, 2592000000], got 1e+30"},
      {R"({"optimizer": {"params": {"ns_steps": 1e9}}})",
       "optimizer.params.ns_steps: expected an integer in [1, 100], got 1000000000.0"},
      {R"({"optimizer": {"params": {"ns_steps": 101}}})",
       "optimizer.params.ns_steps: expected an integer in [1, 100], got 101"},
      {R"({"optimizer": {"params": {"ns_gram_restart": 101}}})",
       "optimizer.params.ns_gram_restart: expected an integer in [0, 100], got 101"},
      {R"({"zero_optimization": {"reduce_bucket_size": 9223372036854775808}})",
       "zero_optimization.reduce_bucket_size: expected an integer >= 1 that fits in a 64-bit "
       "integer, got 9223372036854775808"},
      {R"({"fp16": {"loss_scale_window": 2147483648}})",
       "fp16.loss_scale_window: expected an integer >= 1 that fits in a 32-bit integer, got "
       "2147483648"},
  });
  auto cfg = zmuon::parse_config(json::parse(R"({
    "zmuon": {"timeout_ms": 2592000000, "heartbeat_timeout_ms": 2592000000},
    "zero_optimization": {"reduce_bucket_size": 9223372036854775807},
    "fp16": {"loss_scale_window": 2147483647},
    "optimizer": {"params": {"ns_steps": 100, "ns_schedule": "polar_express",
                             "ns_gram_restart": 100}}})"));
  BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
  BOOST_TEST(cfg->engine.timeout_ms == 2592000000);
  BOOST_TEST(cfg->heartbeat_timeout_ms == 2592000000);
  BOOST_TEST(cfg->engine.reduce_bucket_size == std::numeric_limits<int64_t>::max());
  BOOST_TEST(cfg->engine.fp16.loss_scale_window == std::numeric_limits<int>::max());
  BOOST_TEST(cfg->engine.muon.ns.schedule.size() == 100u);
  BOOST_TEST(cfg->engine.muon.ns.gram_restart == 100);
}
