// zmuon-launch: the main job. Trains the example model on synthetic data with N in-process
// ranks on the CPU backend and prints one line per step. Options: defaults < --config FILE <
// --set key.path=value < flags (launch/config.hpp).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "launch/config.hpp"
#include "launch/exe/faults.hpp"
#include "launch/exe/train.hpp"
#include "launch/safetensors.hpp"

namespace {

// The launcher's own defaults, over job_config's and under any config file: the example model
// trains with AdamW lr 3e-3 (docs/NOTES.md; the engine's default is 3e-4).
nlohmann::json launcher_defaults() {
  return {{"optimizer", {{"params", {{"adam_lr", 3e-3}}}}}};
}

// CLI::NonNegativeNumber's message prints DBL_MAX in full.
const CLI::Validator non_negative(
    [](std::string& text) {
      double x = std::strtod(text.c_str(), nullptr);  // not a number: the conversion reports it
      return x >= 0 || std::isnan(x) ? std::string() : "must be >= 0, got " + text;
    },
    "NONNEGATIVE");

int run(int argc, char** argv) {
  // The flags write here (its values are the defaults --help shows); only those given are used.
  zmuon::job_config flags = *zmuon::parse_config(launcher_defaults());
  zmuon::example::train_options topts;
  topts.steps = 30;
  std::string config_path;
  std::vector<std::string> sets;
  std::string save_params;
  CLI::App app{"zmuon-launch: train the example model with Muon under ZeRO-3 (in-process ranks)"};
  app.footer(
      "Precedence: the defaults shown < --config FILE < --set (in order) < the flags above, each "
      "a shorthand for the config key in its description.\nConfig keys: "
      "examples/zmuon_config.json (DeepSpeed's shape with the engine's defaults; unknown keys are "
      "errors).");
  app.add_option("--config", config_path,
                 "DeepSpeed-style JSON config (see examples/zmuon_config.json)")
      ->type_name("FILE");
  app.add_option("--set", sets,
                 "override one config key, e.g. --set optimizer.params.momentum=0.9; the value is "
                 "JSON, else a string; null restores the default; repeatable")
      ->type_name("KEY.PATH=VALUE")
      ->allow_extra_args(false);
  // Each flag and the config key it sets.
  std::vector<std::pair<CLI::Option*, std::string>> flag_keys{
      {app.add_option("--ranks", flags.engine.world, "number of ranks (zmuon.ranks)")
           ->capture_default_str()
           ->check(CLI::Range(1, 1024)),
       "zmuon.ranks"},
      {app.add_option("--gas", flags.gas,
                      "gradient accumulation steps, micro-batches per step "
                      "(gradient_accumulation_steps)")
           ->capture_default_str()
           ->check(CLI::Range(1, 1 << 20)),
       "gradient_accumulation_steps"},
      {app.add_option("--micro-batch", flags.micro_batch,
                      "samples per rank per micro-batch (train_micro_batch_size_per_gpu)")
           ->capture_default_str()
           ->check(CLI::Range(1, 1 << 20)),
       "train_micro_batch_size_per_gpu"},
      {app.add_option("--lr", flags.engine.muon.lr, "Muon learning rate (optimizer.params.muon_lr)")
           ->capture_default_str()
           ->check(non_negative),
       "optimizer.params.muon_lr"},
      {app.add_option("--adam-lr", flags.engine.adamw.lr,
                      "AdamW learning rate, embeddings and biases (optimizer.params.adam_lr)")
           ->capture_default_str()
           ->check(non_negative),
       "optimizer.params.adam_lr"},
      {app.add_option("--weight-decay", flags.engine.muon.weight_decay,
                      "decoupled weight decay, Muon and AdamW (optimizer.params.weight_decay)")
           ->capture_default_str()
           ->check(non_negative),
       "optimizer.params.weight_decay"},
      {app.add_option("--clip", flags.engine.gradient_clipping,
                      "max global gradient norm, 0 = off (gradient_clipping)")
           ->capture_default_str()
           ->check(non_negative),
       "gradient_clipping"},
      {app.add_option("--bucket-size", flags.engine.reduce_bucket_size,
                      "elements per reduce bucket and Muon chunk "
                      "(zero_optimization.reduce_bucket_size)")
           ->capture_default_str()
           ->check(CLI::PositiveNumber),
       "zero_optimization.reduce_bucket_size"},
  };
  auto* fp16 = app.add_flag("--fp16", flags.engine.fp16.enabled,
                            "fp16 loss scaling on the host, DeepSpeed's dynamic rules "
                            "(fp16.enabled=true)");
  app.add_option("--steps", topts.steps, "optimizer steps")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", topts.seed, "seed of the model init and the synthetic data")
      ->capture_default_str();
  app.add_option("--save-params", save_params,
                 "write the final full parameters (fp32, by name) to this safetensors file");
  auto* save_ckpt =
      app.add_option("--save-checkpoint", topts.checkpoint_dir,
                     "save a checkpoint under DIR every --every steps (DIR/latest names the "
                     "newest; the two newest are kept)")
          ->type_name("DIR");
  auto* every = app.add_option("--every", topts.checkpoint_every, "steps between checkpoints")
                    ->check(CLI::PositiveNumber)
                    ->needs(save_ckpt);
  save_ckpt->needs(every);
  std::string resume;
  app.add_option("--resume", resume,
                 "continue from the checkpoint in DIR (its `latest`, or DIR itself) up to --steps; "
                 "the world size may differ from the one that saved")
      ->type_name("DIR");
  zmuon::example::fault_flags faults;
  zmuon::example::add_fault_flags(app, faults);
  CLI11_PARSE(app, argc, argv);

  // The flags given become the last overrides, so the config's checks apply to them too.
  for (const auto& [option, key] : flag_keys)
    if (option->count() > 0)
      sets.push_back(key + "=" + option->results().back());
  if (fp16->count() > 0)
    sets.push_back(flags.engine.fp16.enabled ? "fp16.enabled=true" : "fp16.enabled=false");
  auto job = zmuon::load_config(config_path, sets, launcher_defaults());
  if (!job) {
    std::cerr << "zmuon-launch: config error: " << job.err().message() << "\n";
    return 2;
  }
  zmuon::engine_options eopts = job->engine;
  if (auto err = zmuon::example::apply_fault_flags(faults, eopts.faults)) {
    std::cerr << "zmuon-launch: " << err.message() << "\n";
    return 2;
  }
  topts.gas = job->gas;
  topts.micro_batch = job->micro_batch;
  topts.fp16 = eopts.fp16.enabled;
  auto eng = zmuon::engine::create(eopts);
  if (!eng) {
    std::cerr << "zmuon-launch: " << eng.err().to_string() << "\n";
    return 2;
  }
  if (auto err = zmuon::example::register_model(**eng, topts)) {
    std::cerr << "zmuon-launch: " << err.to_string() << "\n";
    return 2;
  }
  if (!resume.empty()) {
    auto info = (*eng)->load_checkpoint(resume);
    if (!info) {
      std::cerr << "zmuon-launch: cannot resume: " << info.err().to_string() << "\n";
      return 1;
    }
    std::printf("resumed from %s at step %llu (saved by %d ranks)\n", info->path.c_str(),
                static_cast<unsigned long long>(info->step), info->world);
  }
  topts.checkpoint_config =
      nlohmann::json{{"config", zmuon::config_json(*job)}, {"seed", topts.seed}}.dump(
          -1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::printf("zmuon-launch: %d ranks, gas %d, micro-batch %d, global batch %d, %d steps%s\n",
              eopts.world, topts.gas, topts.micro_batch,
              eopts.world * topts.gas * topts.micro_batch, topts.steps,
              topts.fp16 ? ", fp16 loss scaling" : "");
  auto records = zmuon::example::train(**eng, topts, [](const auto& rec) {
    std::printf("step %4llu  loss %.6f  grad_norm %.6f  loss_scale %g  skipped %d\n",
                static_cast<unsigned long long>(rec.info.step), rec.loss, rec.info.grad_norm,
                rec.info.loss_scale, rec.info.skipped ? 1 : 0);
    std::fflush(stdout);
  });
  if (!records) {
    std::cerr << "zmuon-launch: " << records.err().to_string() << "\n";
    return 1;
  }
  if (!save_params.empty()) {
    auto params = (*eng)->parameters();
    if (!params) {
      std::cerr << "zmuon-launch: " << params.err().to_string() << "\n";
      return 1;
    }
    std::vector<zmuon::named_tensor> tensors;
    for (const auto& spec : zmuon::example::param_table(topts.model))
      tensors.push_back({spec.name, spec.shape, params->at(spec.name)});
    if (auto err = zmuon::write_safetensors(save_params, tensors, {{"producer", "zmuon-launch"}})) {
      std::cerr << "zmuon-launch: " << err.to_string() << "\n";
      return 1;
    }
    std::printf("saved %zu parameters to %s\n", tensors.size(), save_params.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return run(argc, argv);
}
