// The host training loop of the main job: the example model on synthetic data, driven through
// the engine exactly as a user's loop would (gather parameters, forward/backward per rank and
// micro-batch, hand the gradients over, step).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/faults.hpp"
#include "zmuon-launch/model.hpp"
#include "zmuon/engine.hpp"

namespace zmuon::example {

struct train_options {
  model_config model;
  int steps = 20;
  int gas = 1;
  int micro_batch = 8;  // samples per rank per micro-batch
  uint64_t seed = 1;
  bool fp16 = false;  // scale the loss by the engine's loss scale, overflow past fp16's range
  std::string checkpoint_dir;              // when set, save a checkpoint there every
  int checkpoint_every = 0;                // this many steps (at steps that are multiples of it)
  std::string checkpoint_config = "null";  // JSON stored in each checkpoint's manifest
  fault_options faults;                    // the fault-injection flags' (tests only)
};

struct step_record {
  step_info info;
  double loss = 0;  // mean loss of the step's global batch, before the step
};

/// Registers the model's parameters (initialized from the seed) with a fresh engine, and arms
/// the faults.
error register_model(engine& eng, const train_options& opts);

/// Runs steps last+1 .. `opts.steps`, where last is the engine's last_step() (0 for a fresh
/// engine, the checkpoint's step after load_checkpoint). Sample j of step s is the same whatever
/// the world size and gas: rank r, micro-batch k holds samples [(r*gas + k)*micro_batch,
/// +micro_batch) of the global batch. `on_step` (optional) sees each step as it finishes,
/// `on_step_start` each step as it begins. On a node of a multi-process job it drives only this
/// process's ranks; the loss is the job's.
expected<std::vector<step_record>> train(
    engine& eng, const train_options& opts,
    const std::function<void(const step_record&)>& on_step = {},
    const std::function<void(int step)>& on_step_start = {});

}  // namespace zmuon::example
