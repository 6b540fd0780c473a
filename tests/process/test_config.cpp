// The job config: the example file is the engine's defaults; every unknown key, wrong type and
// out-of-range value is an error naming its key path (and the nearest key or the allowed range);
// --set overrides go through the same checks; zmuon-launch --config fails cleanly.
#define BOOST_TEST_MODULE config
#include <boost/test/unit_test.hpp>

#include "support/config_checks.hpp"
#include "support/run_launch.hpp"

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "kernels/ns_variants.hpp"

namespace {

json example() {
  std::ifstream in(ZMUON_EXAMPLE_CONFIG);
  BOOST_REQUIRE(in);
  return json::parse(in);
}

void require_same(const zmuon::engine_options& a, const zmuon::engine_options& b) {
  BOOST_TEST(a.world == b.world);
  BOOST_TEST(a.gradient_clipping == b.gradient_clipping);
  BOOST_TEST(a.reduce_bucket_size == b.reduce_bucket_size);
  BOOST_TEST(a.per_head_muon == b.per_head_muon);
  BOOST_TEST(a.fp16.enabled == b.fp16.enabled);
  BOOST_TEST(a.fp16.loss_scale == b.fp16.loss_scale);
  BOOST_TEST(a.fp16.initial_scale_power == b.fp16.initial_scale_power);
  BOOST_TEST(a.fp16.loss_scale_window == b.fp16.loss_scale_window);
  BOOST_TEST(a.fp16.hysteresis == b.fp16.hysteresis);
  BOOST_TEST(a.fp16.min_loss_scale == b.fp16.min_loss_scale);
  BOOST_TEST(a.fp16.scale_factor == b.fp16.scale_factor);
  BOOST_TEST(a.muon.lr == b.muon.lr);
  BOOST_TEST(a.muon.momentum == b.muon.momentum);
  BOOST_TEST(a.muon.nesterov == b.muon.nesterov);
  BOOST_TEST(a.muon.weight_decay == b.muon.weight_decay);
  BOOST_TEST((a.muon.adjust_lr == b.muon.adjust_lr));
  BOOST_TEST((a.muon.transport == b.muon.transport));
  BOOST_TEST(a.muon.ns.steps == b.muon.ns.steps);
  for (int i = 0; i < 3; ++i)
    BOOST_TEST(a.muon.ns.coefficients[i] == b.muon.ns.coefficients[i]);
  BOOST_TEST((a.muon.ns.schedule == b.muon.ns.schedule));
  BOOST_TEST(a.muon.ns.eps == b.muon.ns.eps);
  BOOST_TEST((a.muon.ns.variant == b.muon.ns.variant));
  BOOST_TEST(a.muon.ns.gram_restart == b.muon.ns.gram_restart);
  BOOST_TEST(a.adamw.lr == b.adamw.lr);
  BOOST_TEST(a.adamw.beta1 == b.adamw.beta1);
  BOOST_TEST(a.adamw.beta2 == b.adamw.beta2);
  BOOST_TEST(a.adamw.eps == b.adamw.eps);
  BOOST_TEST(a.adamw.weight_decay == b.adamw.weight_decay);
  BOOST_TEST(a.compute == b.compute);
  BOOST_TEST(a.comm == b.comm);
  BOOST_TEST(a.timeout_ms == b.timeout_ms);
  BOOST_TEST(a.max_buckets_in_flight == b.max_buckets_in_flight);
  BOOST_TEST(a.momentum_before_vote == b.momentum_before_vote);
  BOOST_TEST(a.first_device == b.first_device);
}

}  // namespace

BOOST_AUTO_TEST_CASE(example_file_is_the_engine_defaults) {
  const zmuon::engine_options defaults;
  auto cfg = zmuon::load_config(ZMUON_EXAMPLE_CONFIG, {});
  BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
  require_same(cfg->engine, defaults);
  BOOST_TEST(cfg->gas == 1);
  BOOST_TEST(cfg->micro_batch == 8);
  BOOST_TEST(!cfg->bf16);
  BOOST_TEST(cfg->trace.empty());
  // Complete: every key of the schema, each with its default (and nothing else).
  BOOST_TEST(example() == zmuon::default_config_json(), zmuon::default_config_json().dump(2));
  auto empty = zmuon::parse_config(json::object());
  BOOST_REQUIRE(empty);
  require_same(empty->engine, defaults);
  // The engine leaves the NS variant to the backend; the kernels' bare ns_options is standard.
  BOOST_TEST((defaults.muon.ns.variant == zmuon::ns_variant::automatic));
  BOOST_TEST((zmuon::ns_options{}.variant == zmuon::ns_variant::standard));
}

BOOST_AUTO_TEST_CASE(config_json_round_trips) {
  json j = example();
  for (const char* o : {"optimizer.params.momentum=0.9", "optimizer.params.betas=[0.8,0.99]",
                        "optimizer.params.adjust_lr=match_rms_adamw", "zmuon.trace=/tmp/t",
                        "fp16.enabled=true", "zero_optimization.reduce_bucket_size=12345",
                        "optimizer.params.ns_coefficients=[3,-3.2,1.2]", "zmuon.ranks=7",
                        "zmuon.muon_transport=bf16", "zmuon.max_buckets_in_flight=5",
                        "zmuon.momentum_before_vote=off"})
    BOOST_REQUIRE(!zmuon::apply_override(j, o));
  auto cfg = zmuon::parse_config(j);
  BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
  BOOST_TEST(zmuon::config_json(*cfg) == j, zmuon::config_json(*cfg).dump());
  auto again = zmuon::parse_config(zmuon::config_json(*cfg));
  BOOST_REQUIRE(again);
  require_same(again->engine, cfg->engine);
}

BOOST_AUTO_TEST_CASE(ns_schedule_presets_and_lists) {
  // "polar_express" is the paper's schedule for ns_steps steps (kernels/ns_variants.hpp) and
  // writes back by name; an explicit list is taken entry by entry and writes back as a list.
  auto cfg = zmuon::parse_config(json::parse(
      R"({"optimizer": {"params": {"ns_steps": 7, "ns_schedule": "Polar_Express",
                                   "ns_variant": "gram", "ns_gram_restart": 0}}})"));
  BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
  const auto& ns = cfg->engine.muon.ns;
  BOOST_TEST((ns.schedule == zmuon::polar_express_schedule(7)));
  BOOST_REQUIRE(ns.schedule.size() == 7u);
  // Step 1 is the published second polynomial over the safety factor 1.01: a / 1.01.
  BOOST_TEST(ns.schedule[1][0] == static_cast<float>(4.107059111542203 / 1.01));
  BOOST_TEST((ns.variant == zmuon::ns_variant::gram));
  BOOST_TEST(ns.gram_restart == 0);
  BOOST_TEST((zmuon::config_json(*cfg)["optimizer"]["params"]["ns_schedule"] == "polar_express"));
  auto again = zmuon::parse_config(zmuon::config_json(*cfg));
  BOOST_REQUIRE(again);
  require_same(again->engine, cfg->engine);

  auto listed = zmuon::parse_config(json::parse(
      R"({"optimizer": {"params": {"ns_steps": 2, "ns_schedule": [[3, -3.2, 1.2], [2, -1.5, 0.5]]}}})"));
  BOOST_REQUIRE_MESSAGE(listed, why(listed));
  const std::vector<std::array<float, 3>> want = {{3.0f, -3.2f, 1.2f}, {2.0f, -1.5f, 0.5f}};
  BOOST_TEST((listed->engine.muon.ns.schedule == want));
  const json written = zmuon::config_json(*listed)["optimizer"]["params"]["ns_schedule"];
  BOOST_TEST((written == json::parse("[[3, -3.2, 1.2], [2, -1.5, 0.5]]")), written.dump());

  // "none" (the default) empties a schedule set before it.
  json j = json::parse(R"({"optimizer": {"params": {"ns_schedule": "polar_express"}}})");
  BOOST_REQUIRE(!zmuon::apply_override(j, "optimizer.params.ns_schedule=none"));
  auto none = zmuon::parse_config(j);
  BOOST_REQUIRE_MESSAGE(none, why(none));
  BOOST_TEST(none->engine.muon.ns.schedule.empty());

  check_errors({
      {R"({"optimizer": {"params": {"ns_schedule": "polar"}}})",
       "optimizer.params.ns_schedule: expected one of \"none\", \"polar_express\", got string "
       "\"polar\""},
      {R"({"optimizer": {"params": {"ns_schedule": 5}}})",
       "optimizer.params.ns_schedule: expected \"none\", \"polar_express\" or an array of "
       "ns_steps [a, b, c], got 5"},
      {R"({"optimizer": {"params": {"ns_schedule": [[1, 2, 3]]}}})",
       "optimizer.params.ns_schedule: expected an array of 5 [a, b, c] (one per ns_steps), got "
       "array [[1,2,3]]"},
      {R"({"optimizer": {"params": {"ns_steps": 1, "ns_schedule": [[1, 2]]}}})",
       "optimizer.params.ns_schedule[0]: expected an array of 3 numbers, got array [1,2]"},
      {R"({"optimizer": {"params": {"ns_steps": 1, "ns_schedule": [[1, 2, "x"]]}}})",
       "optimizer.params.ns_schedule[0][2]: expected a number, got string \"x\""},
      {R"({"optimizer": {"params": {"ns_variant": "grams"}}})",
       "optimizer.params.ns_variant: expected one of \"standard\", \"gram\", \"auto\", got "
       "string "
       "\"grams\" (did you mean \"gram\"?)"},
      {R"({"optimizer": {"params": {"ns_gram_restart": -1}}})",
       "optimizer.params.ns_gram_restart: expected an integer in [0, 100], got -1"},
  });
}

BOOST_AUTO_TEST_CASE(misspelled_keys_name_the_path_and_the_nearest_key) {
  check_errors({
      {R"({"gradient_clippng": 1})",
       "unknown key 'gradient_clippng' (did you mean "
       "'gradient_clipping'?)"},
      {R"({"Gradient_Accumulation_Steps": 2})", "(did you mean 'gradient_accumulation_steps'?)"},
      {R"({"per_head_moun": true})", "unknown key 'per_head_moun' (did you mean 'per_head_muon'?)"},
      {R"({"zero_optimisation": {}})",
       "unknown key 'zero_optimisation' (did you mean "
       "'zero_optimization'?)"},
      {R"({"fp16": {"loss_scale_windw": 10}})",
       "unknown key 'fp16.loss_scale_windw' (did you mean 'loss_scale_window'?)"},
      {R"({"bf16": {"enable": true}})", "unknown key 'bf16.enable' (did you mean 'enabled'?)"},
      {R"({"zero_optimization": {"reduce_bucket": 5}})",
       "unknown key 'zero_optimization.reduce_bucket' (did you mean 'reduce_bucket_size'?)"},
      {R"({"optimizer": {"tpye": "Muon"}})", "unknown key 'optimizer.tpye' (did you mean 'type'?)"},
      {R"({"optimizer": {"parms": {}}})", "unknown key 'optimizer.parms' (did you mean 'params'?)"},
      {R"({"optimizer": {"params": {"momentun": 0.9}}})",
       "unknown key 'optimizer.params.momentun' (did you mean 'momentum'?)"},
      {R"({"optimizer": {"params": {"ns_step": 5}}})",
       "unknown key 'optimizer.params.ns_step' (did you mean 'ns_steps'?)"},
      {R"({"zmuon": {"bakcend": "host"}})",
       "unknown key 'zmuon.bakcend' (did you mean 'backend'?)"},
      {R"({"zmuon": {"timeout": 5}})", "unknown key 'zmuon.timeout' (did you mean 'timeout_ms'?)"},
      {R"({"fp16.enabled": true})", "key 'fp16.enabled' holds a '.': nest sections as objects"},
      // Nothing close: the valid keys are listed.
      {R"({"fp16": {"xyzzy": 1}})",
       "unknown key 'fp16.xyzzy' (valid keys under 'fp16': enabled, "
       "loss_scale, initial_scale_power"},
      {R"({"steps_per_prnt": 10})",
       "unknown key 'steps_per_prnt' (did you mean 'steps_per_print'?)"},
  });
}

// A hostile key of 60 MB: refused with its start and length, not echoed whole. Comparing it
// with every valid key by edit distance took 27 s; by length first it costs one pass.
BOOST_AUTO_TEST_CASE(a_huge_unknown_key_is_refused_with_its_start_only) {
  const std::string key = "momentum" + std::string(60u << 20, 'x');
  json j = {{"optimizer", {{"params", {{key, 1}}}}}};
  auto cfg = zmuon::parse_config(j);
  BOOST_REQUIRE(!cfg);
  const std::string message = cfg.err().message();
  BOOST_TEST_MESSAGE(message);
  BOOST_CHECK_LT(message.size(), 1000u);
  BOOST_CHECK_NE(message.find("unknown key 'optimizer.params.momentumxxx"), std::string::npos);
  BOOST_CHECK_NE(message.find(std::to_string(key.size() + 17) + " bytes"), std::string::npos);
  BOOST_CHECK_NE(message.find("did you mean 'momentum'?"), std::string::npos);
}

BOOST_AUTO_TEST_CASE(wrong_types_name_the_key_and_what_is_expected) {
  check_errors({
      {R"([1, 2])", "the config: expected a JSON object, got array [1,2]"},
      {R"({"fp16": true})", "fp16: expected an object, got boolean true"},
      {R"({"optimizer": {"params": 3}})", "optimizer.params: expected an object, got 3"},
      {R"({"fp16": {"enabled": 1}})", "fp16.enabled: expected true or false, got 1"},
      {R"({"optimizer": {"params": {"momentum": "0.9"}}})",
       "optimizer.params.momentum: expected a number in [0, 1), got string \"0.9\""},
      {R"({"gradient_accumulation_steps": 2.5})",
       "gradient_accumulation_steps: expected an integer in [1, 1048576], got 2.5"},
      {R"({"zero_optimization": {"reduce_bucket_size": "big"}})",
       "zero_optimization.reduce_bucket_size: expected an integer >= 1, got string \"big\""},
      {R"({"optimizer": {"params": {"betas": 0.9}}})",
       "optimizer.params.betas: expected an array of 2 numbers in [0, 1), got 0.9"},
      {R"({"optimizer": {"params": {"ns_coefficients": [1, 2, "c"]}}})",
       "optimizer.params.ns_coefficients[2]: expected a number, got string \"c\""},
      {R"({"optimizer": {"params": {"nesterov": "yes"}}})",
       "optimizer.params.nesterov: expected true or false, got string \"yes\""},
      {R"({"optimizer": {"params": {"adjust_lr": "orignal"}}})",
       "optimizer.params.adjust_lr: expected one of \"original\", \"match_rms_adamw\", "
       "\"spectral\", \"rms\", got string \"orignal\" (did you mean \"original\"?)"},
      {R"({"optimizer": {"params": {"qk_clip_tau": -1}}})",
       "optimizer.params.qk_clip_tau: expected a number >= 0"},
      {R"({"optimizer": {"type": "AdamW"}})", "optimizer.type: expected \"Muon\""},
      {R"({"zmuon": {"backend": "gpu"}})",
       "zmuon.backend: expected one of \"host\", \"cuda\", got string \"gpu\""},
      {R"({"zmuon": {"comm": "mpi"}})", "zmuon.comm: expected one of \"auto\", \"caf\", \"nccl\""},
      {R"({"zmuon": {"momentum_before_vote": "maybe"}})",
       "zmuon.momentum_before_vote: expected one of \"auto\", \"on\", \"off\""},
      {R"({"zmuon": {"muon_transport": "fp16"}})",
       "zmuon.muon_transport: expected one of \"auto\", \"bf16\", \"fp32\", got string "
       "\"fp16\" (did you mean \"bf16\"?)"},
      {R"({"zmuon": {"trace": 5}})", "zmuon.trace: expected a string, got 5"},
      {R"({"zmuon": {"ranks": null}})", "zmuon.ranks: expected an integer in [1, 1024], got null"},
  });
}

BOOST_AUTO_TEST_CASE(values_out_of_range_name_the_allowed_range) {
  check_errors({
      {R"({"optimizer": {"params": {"momentum": 1}}})", "momentum: expected a number in [0, 1)"},
      {R"({"optimizer": {"params": {"momentum": -0.1}}})", "expected a number in [0, 1), got -0.1"},
      {R"({"optimizer": {"params": {"momentum": 0.9999999999}}})", "in [0, 1)"},  // 1.0f
      {R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})",
       "optimizer.params.betas[1]: expected a number in [0, 1), got 1.0"},
      {R"({"optimizer": {"params": {"betas": [0.9]}}})", "expected an array of 2 numbers"},
      {R"({"optimizer": {"params": {"eps": 0}}})", "optimizer.params.eps: expected a number > 0"},
      {R"({"optimizer": {"params": {"ns_steps": 0}}})",
       "ns_steps: expected an integer in [1, 100], got 0"},
      {R"({"optimizer": {"params": {"ns_coefficients": [1, 2]}}})",
       "optimizer.params.ns_coefficients: expected an array of 3 numbers, got array [1,2]"},
      {R"({"optimizer": {"params": {"ns_coefficients": [1, 2, 3, 4]}}})", "array of 3 numbers"},
      {R"({"optimizer": {"params": {"lr": -1}}})", "optimizer.params.lr: expected a number >= 0"},
      {R"({"optimizer": {"params": {"weight_decay": -0.1}}})",
       "weight_decay: expected a number >= 0"},
      {R"({"zero_optimization": {"stage": 2}})",
       "zero_optimization.stage: expected 3 (zmuon implements ZeRO stage 3), got 2"},
      {R"({"zero_optimization": {"reduce_bucket_size": 0}})", "expected an integer >= 1, got 0"},
      {R"({"zero_optimization": {"reduce_bucket_size": -5}})", "expected an integer >= 1, got -5"},
      {R"({"gradient_accumulation_steps": 0})", "gradient_accumulation_steps: expected an integer"},
      {R"({"train_micro_batch_size_per_gpu": 0})", "train_micro_batch_size_per_gpu: expected"},
      {R"({"gradient_clipping": -1})", "gradient_clipping: expected a number >= 0, got -1"},
      {R"({"fp16": {"loss_scale": -1}})", "fp16.loss_scale: expected a number >= 0"},
      {R"({"fp16": {"min_loss_scale": 0}})", "fp16.min_loss_scale: expected a number > 0"},
      {R"({"fp16": {"hysteresis": 0}})", "fp16.hysteresis: expected an integer >= 1"},
      {R"({"fp16": {"hysteresis": 3e9}})", "that fits in a 32-bit integer"},
      {R"({"fp16": {"loss_scale_window": 0}})", "fp16.loss_scale_window: expected an integer >= 1"},
      {R"({"fp16": {"initial_scale_power": 65}})", "expected an integer in [0, 64]"},
      {R"({"gradient_clipping": 1e39})", "that fits in a 32-bit float"},
      {R"({"zmuon": {"ranks": 0}})", "zmuon.ranks: expected an integer in [1, 1024]"},
      {R"({"zmuon": {"timeout_ms": 0}})",
       "zmuon.timeout_ms: expected an integer in [1, 2592000000], got 0"},
      {R"({"zmuon": {"max_buckets_in_flight": -1}})",
       "zmuon.max_buckets_in_flight: expected an integer >= 0, got -1"},
      {R"({"zmuon": {"device": -1}})", "zmuon.device: expected an integer >= 0, got -1"},
      // Keys that are fine alone but not together.
      {R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", "both true"},
  });
}

BOOST_AUTO_TEST_CASE(accepted_spellings) {
  auto cfg = zmuon::parse_config(json::parse(R"({
      "zero_optimization": {"stage": 3.0, "reduce_bucket_size": 5e8},
      "optimizer": {"type": "muon", "params": {"lr": 0.01, "weight_decay": 0.1,
                                               "momentum": 0, "adjust_lr": "match_rms_adamw"}},
      "zmuon": {"backend": "CUDA", "muon_transport": "FP32", "device": 3}})"));
  BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
  BOOST_TEST(cfg->engine.reduce_bucket_size == 500'000'000);
  BOOST_TEST(cfg->engine.muon.lr == 0.01f);  // lr is both groups' (DeepSpeed's rule)
  BOOST_TEST(cfg->engine.adamw.lr == 0.01f);
  BOOST_TEST(cfg->engine.muon.weight_decay == 0.1f);  // one weight decay for both groups
  BOOST_TEST(cfg->engine.adamw.weight_decay == 0.1f);
  BOOST_TEST(cfg->engine.muon.momentum == 0.0f);
  BOOST_TEST((cfg->engine.muon.adjust_lr == zmuon::adjust_lr_rule::match_rms_adamw));
  BOOST_TEST(cfg->engine.compute == "cuda");  // choices in any case, stored canonically
  BOOST_TEST((cfg->engine.muon.transport == zmuon::muon_transport::fp32));
  BOOST_TEST(cfg->engine.first_device == 3);  // local rank 0's GPU
}

BOOST_AUTO_TEST_CASE(set_overrides) {
  json j = example();
  BOOST_REQUIRE(!zmuon::apply_override(j, "optimizer.params.momentum=0.9"));
  BOOST_REQUIRE(!zmuon::apply_override(j, "zmuon.backend=cuda"));  // not JSON: a string
  BOOST_REQUIRE(!zmuon::apply_override(j, "fp16.enabled=true"));
  BOOST_REQUIRE(!zmuon::apply_override(j, "optimizer.params.betas=[0.8, 0.99]"));
  BOOST_REQUIRE(!zmuon::apply_override(j, "zero_optimization.reduce_bucket_size=1e6"));
  BOOST_REQUIRE(!zmuon::apply_override(j, "zmuon.trace=/tmp/a b=c"));     // first '=' splits
  BOOST_REQUIRE(!zmuon::apply_override(j, R"(fp16={"hysteresis": 3})"));  // merged
  BOOST_REQUIRE(!zmuon::apply_override(j, "optimizer.params.muon_lr=0.05"));
  auto cfg = zmuon::parse_config(j);
  BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
  BOOST_TEST(cfg->engine.muon.momentum == 0.9f);
  BOOST_TEST(cfg->engine.compute == "cuda");
  BOOST_TEST(cfg->engine.fp16.enabled);
  BOOST_TEST(cfg->engine.fp16.hysteresis == 3);
  BOOST_TEST(cfg->engine.adamw.beta1 == 0.8f);
  BOOST_TEST(cfg->engine.adamw.beta2 == 0.99f);
  BOOST_TEST(cfg->engine.reduce_bucket_size == 1'000'000);
  BOOST_TEST(cfg->trace == "/tmp/a b=c");
  BOOST_TEST(cfg->engine.muon.lr == 0.05f);

  // Into an empty config: sections are created; null restores the default.
  json fresh;
  BOOST_REQUIRE(!zmuon::apply_override(fresh, "optimizer.params.ns_steps=7"));
  BOOST_REQUIRE(!zmuon::apply_override(fresh, "optimizer.params.ns_steps=null"));
  cfg = zmuon::parse_config(fresh);
  BOOST_REQUIRE(cfg);
  BOOST_TEST(cfg->engine.muon.ns.steps == 5);

  // Bad paths change nothing and say what is wrong.
  const json before = j;
  auto message = [&](const std::string& o) { return zmuon::apply_override(j, o).message(); };
  BOOST_TEST(message("optimizer.params.momentun=0.9")
             == "--set optimizer.params.momentun=0.9: unknown key 'optimizer.params.momentun' "
                "(did you mean 'momentum'?)");
  BOOST_TEST(message("optimizer.parms.lr=1")
             == "--set optimizer.parms.lr=1: unknown key 'optimizer.parms' (did you mean "
                "'params'?)");
  BOOST_TEST(message("fp16.enabled.x=1").find("'fp16.enabled' is a value, not a section")
             != std::string::npos);
  BOOST_TEST(message("fp16..enabled=1").find("empty key") != std::string::npos);
  BOOST_TEST(message("momentum").find("expected key.path=value") != std::string::npos);
  BOOST_TEST(j == before);
}

BOOST_AUTO_TEST_CASE(load_config_layers_and_names_the_source) {
  // file < --set, in order; the base sits under the file.
  auto cfg = zmuon::load_config(ZMUON_EXAMPLE_CONFIG,
                                {"zmuon.ranks=2", "gradient_accumulation_steps=3", "zmuon.ranks=5"},
                                {{"train_micro_batch_size_per_gpu", 2}});
  BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
  BOOST_TEST(cfg->engine.world == 5);
  BOOST_TEST(cfg->gas == 3);
  BOOST_TEST(cfg->micro_batch == 8);  // the file's value beats the base
  cfg = zmuon::load_config("", {}, {{"train_micro_batch_size_per_gpu", 2}});
  BOOST_REQUIRE(cfg);
  BOOST_TEST(cfg->micro_batch == 2);

  cfg = zmuon::load_config(ZMUON_EXAMPLE_CONFIG, {"optimizer.params.momentum=abc"});
  BOOST_REQUIRE(!cfg);
  BOOST_TEST(cfg.err().message()
             == "--set optimizer.params.momentum=abc: optimizer.params.momentum: expected a "
                "number in [0, 1), got string \"abc\"");
  auto bad = write_file("test_config_bad_key.json", R"({"bf16": {"enabeld": true}})");
  cfg = zmuon::load_config(bad, {});
  BOOST_REQUIRE(!cfg);
  BOOST_TEST(cfg.err().message() == bad + ": unknown key 'bf16.enabeld' (did you mean 'enabled'?)");
}

BOOST_AUTO_TEST_CASE(invalid_json_reports_the_position) {
  auto path = write_file("test_config_invalid.json", "{\n  \"fp16\": {enabled: true}\n}\n");
  auto cfg = zmuon::load_config(path, {});
  BOOST_REQUIRE(!cfg);
  BOOST_TEST_MESSAGE(cfg.err().message());
  BOOST_TEST(cfg.err().message().rfind(path + ": invalid JSON: ", 0) == 0);
  BOOST_TEST(cfg.err().message().find("line 2, column 12") != std::string::npos);

  path = write_file("test_config_empty.json", "  \n");
  cfg = zmuon::load_config(path, {});
  BOOST_REQUIRE(!cfg);
  BOOST_TEST(cfg.err().message() == path + ": the config file is empty");

  path = write_file("test_config_comments.json", "// comments are allowed\n{\"zmuon\": {}}\n");
  BOOST_TEST(static_cast<bool>(zmuon::load_config(path, {})));
}

BOOST_AUTO_TEST_CASE(missing_file_names_the_path) {
  auto cfg = zmuon::load_config("/nonexistent/zmuon.json", {});
  BOOST_REQUIRE(!cfg);
  BOOST_TEST((cfg.err().code() == zmuon::errc::io_error));
  BOOST_TEST(cfg.err().message()
             == "cannot open config file '/nonexistent/zmuon.json': No such file or directory");
}

BOOST_AUTO_TEST_CASE(launcher_rejects_a_bad_config) {
  auto bad = write_file("test_config_launch.json", R"({"optimizer": {"params": {"momentun": 1}}})");
  // Malformed configs, each as a file given to zmuon-launch --config.
  auto file = [](const std::string& name, const std::string& text) {
    return "--config " + write_file("test_config_launch_" + name + ".json", text);
  };
  const std::string prefix = "zmuon-launch: config error: test_config_launch_";
  const std::vector<case_t> cases = {
      {file("offload", R"({"zero_optimization": {"offload_param": {"device": "cpu"}}})"),
       prefix
           + "offload.json: zero_optimization.offload_param.device string \"cpu\" is refused: "
             "zmuon keeps each rank's shards in that rank's own memory; it has no CPU or NVMe "
             "offload"},
      {file("misspelled", R"({"gradient_acumulation_steps": 4})"),
       prefix
           + "misspelled.json: unknown key 'gradient_acumulation_steps' (did you mean "
             "'gradient_accumulation_steps'?)"},
      {file("wrong_type", R"({"fp16": {"enabled": "yes"}})"),
       prefix + "wrong_type.json: fp16.enabled: expected true or false, got string \"yes\""},
      {file("negative_bucket", R"({"zero_optimization": {"reduce_bucket_size": -5}})"),
       prefix
           + "negative_bucket.json: zero_optimization.reduce_bucket_size: expected an integer "
             ">= 1, got -5"},
      {file("stage", R"({"zero_optimization": {"stage": 2}})"),
       prefix
           + "stage.json: zero_optimization.stage: expected 3 (zmuon implements ZeRO stage 3), "
             "got 2"},
      {file("optimizer", R"({"optimizer": {"type": "AdamW"}})"),
       prefix
           + "optimizer.json: optimizer.type: expected \"Muon\" (any case; zmuon implements "
             "only Muon, with AdamW for the parameters Muon does not take), got string "
             "\"AdamW\""},
      {file("empty", ""), prefix + "empty.json: the config file is empty"},
      {file("invalid", "{\"fp16\": {\"enabled\": true,}}"),
       prefix
           + "invalid.json: invalid JSON: parse error at line 1, column 27: syntax error "
             "while parsing object key"},
      {"--config " + bad, "zmuon-launch: config error: " + bad
                              + ": unknown key 'optimizer.params.momentun' (did you mean "
                                "'momentum'?)"},
      {"--config /nonexistent/zmuon.json", "zmuon-launch: config error: cannot open config file"},
      // Found by exploratory testing: a crash (a stack overflow) and an abort (an uncaught
      // exception); a directory and /dev/zero are checked in-process below.
      {file("deep", std::string(100000, '[') + std::string(100000, ']')),
       prefix + "deep.json: invalid JSON: nesting deeper than 100 levels at line 1, column 101"},
      {file("1e309", R"({"gradient_clipping": 1e309})"),
       prefix + "1e309.json: invalid JSON: number 1e309 is out of range at line 1, column 23"},
      {"--set zero_optimization.stage=2",
       "zmuon-launch: config error: --set "
       "zero_optimization.stage=2: zero_optimization.stage: "
       "expected 3"},
      {"--config " + std::string(ZMUON_EXAMPLE_CONFIG) + " --set zmuon.bakend=cuda",
       "unknown key 'zmuon.bakend' (did you mean 'backend'?)"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.config) {
      int status = 0;
      auto out = zmuon::test::run_launch(c.config + " --steps 1", &status);
      BOOST_TEST(WIFEXITED(status));
      BOOST_TEST(WEXITSTATUS(status) == 2);
      BOOST_TEST(out.find(c.expected) != std::string::npos, "output: " << out);
      BOOST_TEST(out.find("step ") == std::string::npos);  // nothing ran
    }
  }
}

BOOST_AUTO_TEST_CASE(launcher_flags_beat_set_beats_config) {
  int status = 0;
  auto out = zmuon::test::run_launch(std::string("--config ") + ZMUON_EXAMPLE_CONFIG
                            + " --set zmuon.ranks=2 --set gradient_accumulation_steps=2"
                              " --set train_micro_batch_size_per_gpu=3 --ranks 3 --steps 1",
                        &status);
  BOOST_REQUIRE_MESSAGE(status == 0, out);
  BOOST_TEST(
      out.find("3 ranks, gas 2, micro-batch 3, global batch 18, 1 steps") != std::string::npos,
      out);
}

// Found by tests/fuzz/fuzz_config: a --set value that is not JSON is kept as a string as given;
// invalid UTF-8 in it made the error message's JSON dump throw.
BOOST_AUTO_TEST_CASE(an_override_with_invalid_utf8_is_an_error_not_a_crash) {
  auto cfg = zmuon::load_config("", {"optimizer.params.momentum=0\xff\xff"});
  BOOST_REQUIRE(!cfg);
  BOOST_TEST(cfg.err().message().find("optimizer.params.momentum") != std::string::npos,
             cfg.err().message());
}

// json_changes: one line per differing leaf, with its dotted path; keys on one side only show
// "(none)"; equal documents give nothing.
BOOST_AUTO_TEST_CASE(json_changes_name_each_differing_leaf) {
  const auto before =
      nlohmann::json::parse(R"({"seed": 1, "a": {"b": 2, "c": [1, 2], "gone": true}})");
  const auto after =
      nlohmann::json::parse(R"({"seed": 1, "a": {"b": 3, "c": [1, 2]}, "new": "x"})");
  const std::vector<std::string> want{"a.b 2 -> 3", "a.gone true -> (none)", "new (none) -> \"x\""};
  BOOST_TEST(zmuon::json_changes(before, after) == want, boost::test_tools::per_element());
  BOOST_TEST(zmuon::json_changes(before, before).empty());
}

// Cautious weight decay is one switch for both groups (as weight_decay); NorMuon's keys reach
// the Muon options; bad values name their key.
BOOST_AUTO_TEST_CASE(cautious_weight_decay_and_normuon_keys) {
  auto cfg = zmuon::parse_config(json::parse(R"({
      "optimizer": {"type": "Muon", "params": {"weight_decay": 0.1, "cautious_weight_decay": true,
                                               "variant": "NorMuon", "normuon_beta2": 0.9,
                                               "normuon_eps": 1e-6}}})"));
  BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
  BOOST_TEST(cfg->engine.muon.cautious_weight_decay);
  BOOST_TEST(cfg->engine.adamw.cautious_weight_decay);
  BOOST_TEST((cfg->engine.muon.variant == zmuon::muon_variant::normuon));
  BOOST_TEST(cfg->engine.muon.normuon_beta2 == 0.9f);
  BOOST_TEST(cfg->engine.muon.normuon_eps == 1e-6f);
  auto plain = zmuon::parse_config(json::parse(R"({"optimizer": {"type": "Muon"}})"));
  BOOST_REQUIRE_MESSAGE(plain, why(plain));
  BOOST_TEST(!plain->engine.muon.cautious_weight_decay);
  BOOST_TEST(!plain->engine.adamw.cautious_weight_decay);
  BOOST_TEST((plain->engine.muon.variant == zmuon::muon_variant::muon));
  for (auto [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"optimizer": {"params": {"variant": "adam"}}})",
            "optimizer.params.variant: expected one of \"muon\", \"normuon\""},
           {R"({"optimizer": {"params": {"normuon_beta2": 1.0}}})",
            "optimizer.params.normuon_beta2: expected a number in [0, 1)"},
           {R"({"optimizer": {"params": {"normuon_eps": 0}}})", "optimizer.params.normuon_eps"},
           {R"({"optimizer": {"params": {"cautious_weight_decay": 1}}})",
            "optimizer.params.cautious_weight_decay"}}) {
    auto bad = zmuon::parse_config(json::parse(text));
    BOOST_REQUIRE(!bad);
    BOOST_TEST(bad.err().message().find(expected) != std::string::npos, bad.err().message());
  }
}
