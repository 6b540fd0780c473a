// zmuon-launch: the main job. Trains the example model on synthetic data with N in-process
// ranks on the CPU backend and prints one line per step.
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "launch/exe/train.hpp"
#include "launch/safetensors.hpp"

namespace {

int run(int argc, char** argv) {
  zmuon::engine_options eopts;
  zmuon::example::train_options topts;
  topts.steps = 30;
  std::string save_params;
  float muon_lr = eopts.muon.lr;
  float adam_lr = 3e-3f;
  CLI::App app{"zmuon-launch: train the example model with Muon under ZeRO-3 (in-process ranks)"};
  app.add_option("--ranks", eopts.world, "number of ranks")->capture_default_str()
    ->check(CLI::Range(1, 1024));
  app.add_option("--steps", topts.steps, "optimizer steps")->capture_default_str()
    ->check(CLI::NonNegativeNumber);
  app.add_option("--gas", topts.gas, "gradient accumulation steps (micro-batches per step)")
    ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--micro-batch", topts.micro_batch, "samples per rank per micro-batch")
    ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--seed", topts.seed, "seed of the model init and the synthetic data")
    ->capture_default_str();
  app.add_option("--lr", muon_lr, "Muon learning rate")->capture_default_str();
  app.add_option("--adam-lr", adam_lr, "AdamW learning rate (embeddings, biases)")
    ->capture_default_str();
  app.add_option("--weight-decay", eopts.muon.weight_decay, "decoupled weight decay (both)")
    ->capture_default_str();
  app.add_option("--clip", eopts.gradient_clipping, "max global gradient norm (0 = off)")
    ->capture_default_str();
  app.add_option("--bucket-size", eopts.reduce_bucket_size,
                 "elements per reduce bucket and Muon chunk")->capture_default_str()
    ->check(CLI::PositiveNumber);
  app.add_flag("--fp16", topts.fp16, "fp16 loss scaling on the host (dynamic, DeepSpeed rules)");
  app.add_option("--save-params", save_params,
                 "write the final full parameters (fp32, by name) to this safetensors file");
  CLI11_PARSE(app, argc, argv);

  eopts.muon.lr = muon_lr;
  eopts.adamw.lr = adam_lr;
  eopts.adamw.weight_decay = eopts.muon.weight_decay;
  eopts.fp16.enabled = topts.fp16;
  auto eng = zmuon::engine::create(eopts);
  if (!eng) {
    std::cerr << "zmuon-launch: " << eng.err().to_string() << "\n";
    return 2;
  }
  if (auto err = zmuon::example::register_model(**eng, topts)) {
    std::cerr << "zmuon-launch: " << err.to_string() << "\n";
    return 2;
  }
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
