// DeepSpeed users' ZeRO-3 configs run unmodified: the shapes HF transformers, accelerate,
// DeepSpeedExamples and DeepSpeed's Muon page document run two steps of zmuon-launch with their
// notes; DeepSpeed's lr rule on the update; each scheduler against its formula; typos named with
// the nearest key, all at once; --strict; the csv_monitor files and the JSON Lines stream.
#define BOOST_TEST_MODULE config_deepspeed
#include <boost/test/unit_test.hpp>

#include "support/config_checks.hpp"
#include "support/run_launch.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "zmuon/config.hpp"
#include "zmuon/engine.hpp"
#include "zmuon/lr_schedule.hpp"

namespace {

// HF transformers' documented ZeRO-3 config, its optimizer switched to Muon and its offload
// devices "none" (zmuon refuses CPU offload: see refused_keys_say_why).
const char* kHfZero3 = R"({
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000,
           "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "Muon",
                "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                               "warmup_num_steps": "auto"}},
  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {"device": "none", "pin_memory": true},
    "offload_param": {"device": "none", "pin_memory": true},
    "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
    "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true},
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
  "wall_clock_breakdown": false
})";

// accelerate's ZeRO-3 template: WarmupDecayLR with every value "auto", fp16 on.
const char* kAccelerateZero3 = R"({
  "fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 1000,
           "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
  "optimizer": {"type": "Muon", "params": {"lr": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                           "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "zero_optimization": {
    "stage": 3, "overlap_comm": true, "contiguous_gradients": true,
    "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto", "sub_group_size": 1e9,
    "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
    "stage3_gather_16bit_weights_on_model_save": "auto"},
  "gradient_accumulation_steps": 1, "gradient_clipping": "auto", "steps_per_print": 2000,
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
  "wall_clock_breakdown": false
})";

// DeepSpeedExamples' cifar ds_config in ZeRO-3 shape: the batch given as train_batch_size.
const char* kDeepSpeedExamples = R"({
  "train_batch_size": 16, "steps_per_print": 2000,
  "optimizer": {"type": "Muon", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                           "weight_decay": 3e-7}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                               "warmup_num_steps": 1000}},
  "gradient_clipping": 1.0, "prescale_gradients": false,
  "fp16": {"enabled": true, "fp16_master_weights_and_grads": false, "loss_scale": 0,
           "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1,
           "initial_scale_power": 15},
  "wall_clock_breakdown": false,
  "zero_optimization": {"stage": 3, "allgather_partitions": true, "reduce_scatter": true,
                        "allgather_bucket_size": 50000000, "reduce_bucket_size": 50000000,
                        "overlap_comm": true, "contiguous_gradients": true, "cpu_offload": false}
})";

// DeepSpeed's own Muon + ZeRO-3 example (its config-json page).
const char* kDeepSpeedMuon = R"({
  "optimizer": {"type": "Muon", "params": {"lr": 0.001, "momentum": 0.9, "weight_decay": 0.0,
                                           "muon_lr": 0.001, "ns_method": "gram"}},
  "zero_optimization": {"stage": 3, "save_muon_momentum_buffer_in_memory": true}
})";

struct shaped {
  std::string name;
  const char* text;
  std::vector<std::string> notes;  // substrings the notes must hold
};

const std::vector<shaped>& four_configs() {
  static const std::vector<shaped> configs = {
      {"hf",
       kHfZero3,
       {"accepted with no effect in zmuon: ", "zero_optimization.overlap_comm",
        "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.offload_param.device",
        "\"auto\" resolved: ", "train_micro_batch_size_per_gpu = 8 (zmuon's default)",
        "optimizer.params.lr = each group's default: Muon 0.02, AdamW 3e-4",
        "scheduler.params.warmup_max_lr = each group's lr",
        "train_batch_size = 16 (micro-batch 8 x gas 1 x world 2)"}},
      {"accelerate",
       kAccelerateZero3,
       {"zero_optimization.contiguous_gradients",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save",
        "scheduler.params.total_num_steps = 2 (the job's steps)",
        "gradient_clipping = 0.0 (zmuon's default)"}},
      {"examples",
       kDeepSpeedExamples,
       {"prescale_gradients", "fp16.fp16_master_weights_and_grads",
        "zero_optimization.allgather_bucket_size", "zero_optimization.cpu_offload"}},
      {"muon", kDeepSpeedMuon, {"zero_optimization.save_muon_momentum_buffer_in_memory"}},
  };
  return configs;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines)
    out += l + "\n";
  return out;
}

zmuon::config_context job_of(int world, int64_t steps) {
  zmuon::config_context ctx;
  ctx.world = world;
  ctx.total_steps = steps;
  return ctx;
}

}  // namespace

BOOST_AUTO_TEST_CASE(four_deepspeed_configs_parse_with_their_notes) {
  for (const auto& c : four_configs()) {
    BOOST_TEST_CONTEXT(c.name) {
      auto cfg = zmuon::parse_config(json::parse(c.text), job_of(2, 2));
      BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
      const std::string notes = joined(cfg->notes);
      for (const auto& n : c.notes)
        BOOST_TEST(notes.find(n) != std::string::npos, "notes:\n" << notes << "missing: " << n);
    }
  }
  // DeepSpeedExamples' batch: 16 = micro x gas 1 x world 2, so the micro-batch is 8.
  auto ex = zmuon::parse_config(json::parse(kDeepSpeedExamples), job_of(2, 2));
  BOOST_REQUIRE(ex);
  BOOST_TEST(ex->micro_batch == 8);
  BOOST_TEST(ex->gas == 1);
  BOOST_TEST(ex->engine.gradient_clipping == 1.0f);
  BOOST_TEST(ex->engine.adamw.beta2 == 0.999f);
  BOOST_TEST(ex->engine.fp16.initial_scale_power == 15);
  BOOST_TEST((ex->scheduler.type == zmuon::lr_schedule_type::warmup_lr));
  BOOST_TEST(ex->steps_per_print == 2000);
  // DeepSpeed's Muon example: ns_method "gram" is the Gram variant, momentum Muon's.
  auto muon = zmuon::parse_config(json::parse(kDeepSpeedMuon));
  BOOST_REQUIRE(muon);
  BOOST_TEST((muon->engine.muon.ns.variant == zmuon::ns_variant::gram));
  BOOST_TEST(muon->engine.muon.momentum == 0.9f);
  BOOST_TEST(muon->engine.muon.lr == 0.001f);
  BOOST_TEST(muon->engine.adamw.lr == 0.001f);  // lr, since no adam_lr
}

BOOST_AUTO_TEST_CASE(four_deepspeed_configs_run_two_steps_of_zmuon_launch) {
  for (const auto& c : four_configs()) {
    BOOST_TEST_CONTEXT(c.name) {
      const auto path = write_file("test_config_deepspeed_" + c.name + ".json", c.text);
      int status = 0;
      auto out = zmuon::test::run_launch("--config " + path + " --steps 2 --ranks 2", &status);
      BOOST_TEST(WIFEXITED(status));
      BOOST_TEST(WEXITSTATUS(status) == 0, out);
      BOOST_TEST(out.find("step    2  loss") != std::string::npos, out);
      for (const auto& n : c.notes)
        BOOST_TEST(out.find(n) != std::string::npos, "missing note: " << n << "\n" << out);
    }
  }
}

// DeepSpeed: the Muon group's lr is muon_lr, else lr, else 0.02; AdamW's adam_lr, else lr, else
// 3e-4. Checked on the update: AdamW's first step moves each element by lr * g / (|g| + eps),
// Muon's by lr times an update that does not depend on lr.
BOOST_AUTO_TEST_CASE(lr_rule_on_the_update) {
  const std::vector<float> w0(8 * 4, 0.5f), b0(4, 0.25f);
  std::vector<float> gw(8 * 4), gb = {0.5f, -1.0f, 2.0f, -0.25f};
  for (size_t i = 0; i < gw.size(); ++i)
    gw[i] = std::sin(0.7f * static_cast<float>(i)) + 0.1f;
  auto step_with = [&](const std::string& params) {
    auto eng = zmuon::engine::create_from_json(R"({"zmuon": {"ranks": 1}, "optimizer": {"params": )"
                                               + params + "}}");
    BOOST_REQUIRE_MESSAGE(eng, why(eng));
    BOOST_REQUIRE(!(*eng)->add_parameter({"w", {8, 4}}, w0));
    BOOST_REQUIRE(!(*eng)->add_parameter({"b", {4}}, b0));
    BOOST_REQUIRE(!(*eng)->reduce(0, zmuon::tensor_map{{"w", gw}, {"b", gb}}));
    BOOST_REQUIRE((*eng)->step());
    auto p = (*eng)->parameters();
    BOOST_REQUIRE(p);
    return *p;
  };
  auto adam_moved = [&](const zmuon::tensor_map& p, float lr) {
    for (size_t i = 0; i < gb.size(); ++i) {
      const float want = b0[i] - lr * gb[i] / (std::fabs(gb[i]) + 1e-10f);
      BOOST_TEST(p.at("b")[i] == want, boost::test_tools::tolerance(1e-6f));
    }
  };
  auto muon_delta = [&](const zmuon::tensor_map& p) {
    std::vector<float> d(w0.size());
    for (size_t i = 0; i < d.size(); ++i)
      d[i] = w0[i] - p.at("w")[i];
    return d;
  };
  // Only lr: both groups take it.
  auto only_lr = step_with(R"({"lr": 0.01})");
  adam_moved(only_lr, 0.01f);
  // muon_lr and adam_lr: each its own; lr beside them changes nothing.
  auto own = step_with(R"({"lr": 0.5, "muon_lr": 0.04, "adam_lr": 0.002})");
  adam_moved(own, 0.002f);
  const auto d1 = muon_delta(only_lr), d4 = muon_delta(own);
  double norm = 0;
  for (size_t i = 0; i < d1.size(); ++i) {
    BOOST_TEST(d4[i] == 4.0f * d1[i], boost::test_tools::tolerance(1e-4f));
    norm += d1[i] * d1[i];
  }
  BOOST_TEST(norm > 1e-6);  // the Muon parameter moved
  // Neither: DeepSpeed's Muon defaults, 0.02 and 3e-4.
  auto neither = step_with(R"({"momentum": 0.95})");
  adam_moved(neither, 3e-4f);
  const auto d2 = muon_delta(neither);
  for (size_t i = 0; i < d1.size(); ++i)
    BOOST_TEST(d2[i] == 2.0f * d1[i], boost::test_tools::tolerance(1e-4f));
}

// The scheduler is part of the config's canonical JSON (what nodes agree on, what a checkpoint
// records), and that JSON reads back as the same schedule.
BOOST_AUTO_TEST_CASE(the_scheduler_round_trips_through_config_json) {
  for (const char* sched :
       {R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 9, "warmup_max_lr": [0.1, 0.01],
                                                "warmup_type": "linear"}})",
        R"({"type": "WarmupLR", "params": {"warmup_num_steps": 7}})",
        R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 50, "cos_min_ratio": 0.2}})",
        R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01,
                                           "cycle_second_step_size": 3, "decay_step_size": 2}})",
        R"({"type": "LRRangeTest", "params": {"lr_range_test_staircase": true}})"}) {
    BOOST_TEST_CONTEXT(sched) {
      auto cfg = zmuon::parse_config(json{{"scheduler", json::parse(sched)}});
      BOOST_REQUIRE_MESSAGE(cfg, why(cfg));
      const json written = zmuon::config_json(*cfg);
      auto again = zmuon::parse_config(written);
      BOOST_REQUIRE_MESSAGE(again, why(again) << "\n" << written.dump());
      BOOST_TEST(zmuon::config_json(*again) == written, written.dump());
      for (uint64_t applied : {0, 1, 3, 8, 20})
        for (int g : {0, 1})
          BOOST_TEST(zmuon::scheduled_lr(again->scheduler, g, 0.02, applied)
                         == zmuon::scheduled_lr(cfg->scheduler, g, 0.02, applied),
                     boost::test_tools::tolerance(1e-7));
    }
  }
}

BOOST_AUTO_TEST_CASE(schedulers_follow_their_formulas) {
  using zmuon::scheduled_lr;
  const auto tol = boost::test_tools::tolerance(1e-12);
  zmuon::lr_schedule_options s;
  // WarmupLR, linear: min + (max - min) k / N, k = applied - 1; min before the first step().
  s.type = zmuon::lr_schedule_type::warmup_lr;
  s.warmup_type = zmuon::warmup_shape::linear;
  s.warmup_min_lr = {0.001, 0.001};
  s.warmup_max_lr = {0.011, 0.011};
  s.warmup_num_steps = 10;
  BOOST_TEST(scheduled_lr(s, 0, 0.5, 0) == 0.001, tol);
  BOOST_TEST(scheduled_lr(s, 0, 0.5, 5) == 0.001 + 0.01 * 4 / 10, tol);
  BOOST_TEST(scheduled_lr(s, 1, 0.5, 11) == 0.011, tol);  // warm-up's end
  BOOST_TEST(scheduled_lr(s, 1, 0.5, 500) == 0.011, tol);
  // log: gamma = log(k + 1) / log(N).
  s.warmup_type = zmuon::warmup_shape::log;
  BOOST_TEST(scheduled_lr(s, 0, 0.5, 5) == 0.001 + 0.01 * std::log(5.0) / std::log(10.0), tol);
  // No maximum: the group's own lr, per group.
  s.warmup_max_lr = {NAN, NAN};
  BOOST_TEST(scheduled_lr(s, 0, 0.02, 11) == 0.02, tol);
  BOOST_TEST(scheduled_lr(s, 1, 3e-4, 11) == 3e-4, tol);
  // WarmupDecayLR: after warm-up, linear decay to 0 at total_num_steps.
  s.type = zmuon::lr_schedule_type::warmup_decay_lr;
  s.warmup_type = zmuon::warmup_shape::linear;
  s.warmup_min_lr = {0, 0};
  s.warmup_max_lr = {0.01, 0.01};
  s.total_num_steps = 20;
  BOOST_TEST(scheduled_lr(s, 0, 1, 11) == 0.01, tol);        // k = 10: decay starts
  BOOST_TEST(scheduled_lr(s, 0, 1, 16) == 0.01 * 0.5, tol);  // (20 - 15) / (20 - 10)
  BOOST_TEST(scheduled_lr(s, 0, 1, 26) == 0.0, tol);         // past the end: 0
  // WarmupCosineLR: lr x ratio; the cosine reaches cos_min_ratio at total_num_steps.
  s = {};
  s.type = zmuon::lr_schedule_type::warmup_cosine_lr;
  s.warmup_type = zmuon::warmup_shape::linear;
  s.warmup_num_steps = 4;
  s.total_num_steps = 12;
  s.cos_min_ratio = 0.1;
  BOOST_TEST(scheduled_lr(s, 0, 0.02, 0) == 0.0, tol);             // before the first step()
  BOOST_TEST(scheduled_lr(s, 0, 0.02, 4) == 0.02 * 3 / 4, tol);    // k = 3: warm-up
  BOOST_TEST(scheduled_lr(s, 0, 0.02, 8) == 0.02 * 0.55, tol);     // halfway: 0.1 + 0.9 / 2
  BOOST_TEST(scheduled_lr(s, 1, 0.002, 12) == 0.002 * 0.1, tol);   // the cosine's minimum
  BOOST_TEST(scheduled_lr(s, 1, 0.002, 100) == 0.002 * 0.1, tol);  // and after it
  // OneCycle: up over the first step size, down over the second, then decay.
  s = {};
  s.type = zmuon::lr_schedule_type::one_cycle;
  s.cycle_min_lr = {0.001, 0.0001};
  s.cycle_max_lr = {0.01, 0.001};
  s.cycle_first_step_size = 4;
  s.decay_lr_rate = 1;
  s.decay_step_size = 2;
  BOOST_TEST(scheduled_lr(s, 0, 1, 0) == 0.001, tol);
  BOOST_TEST(scheduled_lr(s, 0, 1, 4) == 0.01, tol);  // the peak
  BOOST_TEST(scheduled_lr(s, 1, 1, 4) == 0.001, tol);
  BOOST_TEST(scheduled_lr(s, 0, 1, 6) == 0.001 + 0.009 * 0.5, tol);     // half way down
  BOOST_TEST(scheduled_lr(s, 0, 1, 12) == 0.001 / (1 + 1.0 * 2), tol);  // decay: 4 / 2 intervals
  // LRRangeTest: min x (1 + rate x (k + 1) / size), floored when staircase.
  s = {};
  s.type = zmuon::lr_schedule_type::lr_range_test;
  s.lr_range_test_min_lr = {1e-3, 1e-4};
  s.lr_range_test_step_size = 10;
  BOOST_TEST(scheduled_lr(s, 0, 1, 15) == 1e-3 * 2.5, tol);
  s.lr_range_test_staircase = true;
  BOOST_TEST(scheduled_lr(s, 1, 1, 15) == 1e-4 * 2.0, tol);
}

// The engine runs the config's scheduler for both groups, as DeepSpeed steps it: skipped steps
// do not advance it.
BOOST_AUTO_TEST_CASE(the_engine_runs_the_scheduler_and_skips_do_not_advance_it) {
  auto eng = zmuon::engine::create_from_json(R"({
      "zmuon": {"ranks": 1}, "fp16": {"enabled": true},
      "optimizer": {"params": {"muon_lr": 0.02, "adam_lr": 0.002}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear",
                                                   "warmup_num_steps": 4}}})");
  BOOST_REQUIRE_MESSAGE(eng, why(eng));
  auto& e = **eng;
  BOOST_REQUIRE(!e.add_parameter({"b", {4}}, std::vector<float>(4, 1.0f)));
  auto lrs = e.next_lrs();
  BOOST_TEST(lrs[0] == 0.0f);  // WarmupLR's minimum before its first step()
  BOOST_TEST(lrs[1] == 0.0f);
  auto step = [&](float g) {
    BOOST_REQUIRE(!e.reduce(0, zmuon::tensor_map{{"b", std::vector<float>(4, g)}}));
    auto info = e.step();
    BOOST_REQUIRE(info);
    return info->skipped;
  };
  BOOST_TEST(!step(1.0f));
  BOOST_TEST(!step(1.0f));
  lrs = e.next_lrs();  // k = 1: a quarter of the way
  BOOST_TEST(lrs[0] == 0.02f * 0.25f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(lrs[1] == 0.002f * 0.25f, boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(step(NAN));  // skipped
  BOOST_TEST(e.skipped_steps() == 1u);
  lrs = e.next_lrs();
  BOOST_TEST(lrs[0] == 0.02f * 0.25f, boost::test_tools::tolerance(1e-6f));
}

BOOST_AUTO_TEST_CASE(typos_and_wrong_types_name_the_right_key) {
  check_errors({
      {R"({"train_batch_sise": 8})", "(did you mean 'train_batch_size'?)"},
      {R"({"steps_per_prnt": 10})", "(did you mean 'steps_per_print'?)"},
      {R"({"wall_clock_breakdwn": false})", "(did you mean 'wall_clock_breakdown'?)"},
      {R"({"tensorbord": {"enabled": false}})", "(did you mean 'tensorboard'?)"},
      {R"({"zero_optimisation": {}})", "(did you mean 'zero_optimization'?)"},
      {R"({"zero_optimization": {"overlap_com": true}})",
       "unknown key 'zero_optimization.overlap_com' (did you mean 'overlap_comm'?)"},
      {R"({"zero_optimization": {"contigous_gradients": true}})",
       "(did you mean 'contiguous_gradients'?)"},
      {R"({"zero_optimization": {"stage3_prefetch_bucket": 1}})",
       "(did you mean 'stage3_prefetch_bucket_size'?)"},
      {R"({"zero_optimization": {"stage3_max_live_params": 1}})",
       "(did you mean 'stage3_max_live_parameters'?)"},
      {R"({"zero_optimization": {"stage3_param_persistance_threshold": 1}})",
       "(did you mean 'stage3_param_persistence_threshold'?)"},
      {R"({"zero_optimization": {"stage3_gather_16bit_weights_on_save": true}})",
       "(did you mean 'stage3_gather_16bit_weights_on_model_save'?)"},
      {R"({"zero_optimization": {"offload_optimizer": {"devic": "none"}}})",
       "unknown key 'zero_optimization.offload_optimizer.devic' (did you mean 'device'?)"},
      {R"({"optimizer": {"params": {"ns_metod": "gram"}}})", "(did you mean 'ns_method'?)"},
      {R"({"optimizer": {"params": {"muon_lrr": 0.02}}})", "(did you mean 'muon_lr'?)"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max": 0.01}}})",
       "unknown key 'scheduler.params.warmup_max' (did you mean 'warmup_max_lr'?) (for WarmupLR)"},
      {R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9,
                                                              "cos_min_ration": 0.1}}})",
       "(did you mean 'cos_min_ratio'?)"},
      {R"({"scheduler": {"type": "WarmupDecay"}})", "(did you mean \"WarmupDecayLR\"?)"},
      {R"({"csv_monitor": {"output_pth": "x"}})", "(did you mean 'output_path'?)"},
      {R"({"fp16": {"initial_scale_powr": 16}})", "(did you mean 'initial_scale_power'?)"},
      {R"({"bf16": {"enabled": "yes"}})", "bf16.enabled: expected true or false, got string"},
      {R"({"zero_optimization": {"overlap_comm": 1}})",
       "zero_optimization.overlap_comm: expected true or false, got 1"},
      {R"({"train_batch_size": "32"})", "train_batch_size: expected an integer"},
      {R"({"zero_optimization": {"stage3_max_live_parameters": "many"}})",
       "zero_optimization.stage3_max_live_parameters: expected an integer, got string"},
      {R"({"optimizer": {"params": {"ns_method": "newton"}}})",
       "optimizer.params.ns_method: expected one of \"standard\", \"gram\""},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1.5}}})",
       "scheduler.params.warmup_num_steps: expected an integer >= 1, got 1.5"},
  });
  // Several at once: one message, every key named with its nearest.
  const std::string message = error_of(R"({
      "train_batch_sise": 8, "zero_optimization": {"stage3_prefetch_bucket": 1,
      "overlap_com": true}, "bf16": {"enabled": "yes"}})");
  BOOST_TEST(message.rfind("the config has 4 problems:\n", 0) == 0, message);
  for (const char* want :
       {"(did you mean 'train_batch_size'?)", "(did you mean 'stage3_prefetch_bucket_size'?)",
        "(did you mean 'overlap_comm'?)", "bf16.enabled: expected true"})
    BOOST_TEST(message.find(want) != std::string::npos, message);
}

// DeepSpeed rejects a key given twice in one object (its JSON loader): so does zmuon, naming it.
BOOST_AUTO_TEST_CASE(a_duplicate_key_is_an_error) {
  auto cfg = zmuon::parse_config_text(R"({"optimizer": {"params": {"lr": 0.1, "lr": 0.2}}})");
  BOOST_REQUIRE(!cfg);
  BOOST_TEST(cfg.err().message().find("key \"lr\" appears twice in the object at /optimizer/params")
                 != std::string::npos,
             cfg.err().message());
}

BOOST_AUTO_TEST_CASE(refused_keys_say_why) {
  check_errors({
      {R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": true}}})",
       "zero_optimization.offload_optimizer.device string \"cpu\" is refused: zmuon keeps each "
       "rank's shards in that rank's own memory"},
      {R"({"zero_optimization": {"stage": 2}})",
       "zero_optimization.stage: expected 3 (zmuon implements ZeRO stage 3), got 2"},
      {R"({"optimizer": {"type": "AdamW"}})", "zmuon implements only Muon"},
      {R"({"zero_optimization": {"zero_quantized_weights": true}})", "no ZeRO++ qwZ"},
      {R"({"flops_profiler": {"enabled": true}})", "zmuon has no FLOPs profiler"},
      {R"({"compression_training": {"enabled": true}})",
       "compression_training.enabled is true: zmuon has no compression training"},
      {R"({"tensorboard": {"enabled": true}})",
       "tensorboard.enabled is true: zmuon writes no tensorboard files itself"},
      {R"({"scheduler": {"type": "StepLR"}})", "the host's to drive"},
      {R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}})",
       "neither the job (zmuon-launch --steps) nor the host"},
      {R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 8,
           "gradient_accumulation_steps": 1, "zmuon": {"ranks": 4}})",
       "train_batch_size 30 is not train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
       "world = 8 x 1 x 4 = 32"},
  });
  check_errors({
      {R"({"scheduler": {"type": "WarmupLR", "params": 5}})",
       "scheduler.params: expected an object, got 5"},
      {R"({"train_batch_size": 1099511627776, "zmuon": {"ranks": 1}})",
       "train_batch_size 1099511627776 makes the micro-batch 1099511627776, more than 1048576"},
  });
  // Off is accepted: offload device "none", a disabled feature section.
  auto off = zmuon::parse_config(json::parse(
      R"({"zero_optimization": {"offload_param": {"device": "none"}},
          "compression_training": {"enabled": false}, "flops_profiler": {"enabled": false}})"));
  BOOST_REQUIRE_MESSAGE(off, why(off));
  // A Python host writes tensorboard itself: accepted, forwarded.
  zmuon::config_context python;
  python.host_values = R"({"host": "python", "lr": 0.05})";
  auto tb = zmuon::parse_config(
      json::parse(R"({"tensorboard": {"enabled": true}, "optimizer": {"params": {"lr": "auto"}}})"),
      python);
  BOOST_REQUIRE_MESSAGE(tb, why(tb));
  BOOST_TEST(tb->monitor.forwarded == std::vector<std::string>{"tensorboard"});
  BOOST_TEST(tb->engine.muon.lr == 0.05f);  // "auto" from the host's lr
  BOOST_TEST(tb->engine.adamw.lr == 0.05f);
  BOOST_TEST(
      joined(tb->notes).find("optimizer.params.lr = 0.05 (the host's lr)") != std::string::npos,
      joined(tb->notes));
}

BOOST_AUTO_TEST_CASE(strict_turns_the_notes_into_errors) {
  const auto path = write_file("test_config_deepspeed_strict.json",
                               R"({"zero_optimization": {"stage": 3, "overlap_comm": true}})");
  int status = 0;
  auto out = zmuon::test::run_launch("--config " + path + " --strict --steps 1", &status);
  BOOST_TEST(WEXITSTATUS(status) == 2, out);
  BOOST_TEST(out.find("strict mode (--strict, zmuon.strict) makes the config's notes errors:\n"
                      "  accepted with no effect in zmuon: zero_optimization.overlap_comm")
                 != std::string::npos,
             out);
  out = zmuon::test::run_launch("--config " + path + " --set zmuon.strict=true --steps 1", &status);
  BOOST_TEST(WEXITSTATUS(status) == 2, out);
  out = zmuon::test::run_launch("--config " + path + " --steps 1", &status);
  BOOST_TEST(WEXITSTATUS(status) == 0, out);
}

BOOST_AUTO_TEST_CASE(csv_monitor_files_and_the_json_lines_stream) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::absolute("test_config_deepspeed_monitor");
  fs::remove_all(dir);
  const std::string config = R"({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
      "optimizer": {"params": {"muon_lr": 0.02, "adam_lr": 0.002}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "linear",
                                                   "warmup_num_steps": 4}},
      "wall_clock_breakdown": true,
      "csv_monitor": {"enabled": true, "output_path": ")"
                             + dir.string() + R"(",
                      "job_name": "job"},
      "zmuon": {"metrics_file": ")"
                             + (dir / "steps.jsonl").string() + R"("}})";
  const auto path = write_file("test_config_deepspeed_monitor.json", config);
  int status = 0;
  auto out = zmuon::test::run_launch("--config " + path + " --ranks 2 --steps 3", &status);
  BOOST_REQUIRE_MESSAGE(WEXITSTATUS(status) == 0, out);
  // DeepSpeed's layout: a file per figure, "step,<name>", a row per step keyed by samples.
  auto rows = [&](const std::string& name) {
    std::ifstream in(dir / "job" / ("Train_Samples_" + name + ".csv"));
    BOOST_REQUIRE_MESSAGE(in, "no csv file for " << name);
    std::string header;
    std::getline(in, header);
    BOOST_TEST(header == "step," + name);
    std::vector<std::pair<long, double>> out;
    for (std::string line; std::getline(in, line);) {
      const auto comma = line.find(',');
      BOOST_REQUIRE(comma != std::string::npos);
      out.emplace_back(std::stol(line.substr(0, comma)), std::stod(line.substr(comma + 1)));
    }
    return out;
  };
  const auto lr = rows("lr");
  BOOST_REQUIRE(lr.size() == 3u);
  for (int s = 1; s <= 3; ++s) {
    BOOST_TEST(lr[s - 1].first == s * 2 * 3 * 2);  // samples: micro x gas x world per step
    BOOST_TEST(lr[s - 1].second == 0.02 * (s - 2 < 0 ? 0 : s - 2) / 4.0,
               boost::test_tools::tolerance(1e-6));
  }
  BOOST_TEST(rows("train_loss").size() == 3u);
  BOOST_TEST(rows("adam_lr").size() == 3u);
  BOOST_TEST(rows("elapsed_time_ms_step").size() == 3u);
  // The stream: one JSON record per step.
  std::ifstream in(dir / "steps.jsonl");
  std::vector<json> records;
  for (std::string line; std::getline(in, line);)
    records.push_back(json::parse(line));
  BOOST_REQUIRE(records.size() == 3u);
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    BOOST_TEST(r["step"] == i + 1);
    BOOST_TEST(r["loss"].is_number());
    BOOST_TEST(r["grad_norm"].get<double>() > 0);
    BOOST_TEST(r["skipped"] == false);
    BOOST_TEST(r["lr"]["adamw"].get<double>() == 0.002 * (i < 1 ? 0 : i - 1) / 4.0,
               boost::test_tools::tolerance(1e-6));
    BOOST_TEST(r["step_ms"].get<double>() > 0);
    BOOST_TEST(r["ns_ms"].is_number());
    BOOST_TEST(r["memory_bytes"].is_number());
  }
}
