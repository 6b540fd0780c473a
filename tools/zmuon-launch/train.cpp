#include "zmuon-launch/train.hpp"

#include <cmath>
#include <limits>

namespace zmuon::example {

namespace {

constexpr float fp16_max = 65504.0f;

// The host's fp16 loss scaling: the gradient of (scale * loss), with values past fp16's range
// turned into inf as an fp16 backward pass would.
void scale_like_fp16(tensor_map& grads, float scale) {
  for (auto& [name, g] : grads)
    for (auto& v : g) {
      v *= scale;
      if (std::fabs(v) > fp16_max)
        v = std::copysign(std::numeric_limits<float>::infinity(), v);
    }
}

}  // namespace

error register_model(engine& eng, const train_options& opts) {
  if (auto err = check_config(opts.model))
    return err;
  auto init = init_params(opts.model, opts.seed);
  for (const auto& spec : param_table(opts.model))
    if (auto err = eng.add_parameter(spec, init.at(spec.name)))
      return err;
  return arm_faults(eng, opts.faults);
}

expected<std::vector<step_record>> train(engine& eng, const train_options& opts,
                                         const std::function<void(const step_record&)>& on_step,
                                         const std::function<void(int)>& on_step_start) {
  if (opts.steps < 0 || opts.gas < 1 || opts.micro_batch < 1)
    return error{errc::invalid_argument, "steps >= 0, gas >= 1 and micro_batch >= 1 needed"};
  std::vector<step_record> records;
  int world = eng.world();
  if (opts.checkpoint_every < 0)
    return error{errc::invalid_argument, "checkpoint_every must be >= 0"};
  for (int s = static_cast<int>(eng.last_step()) + 1; s <= opts.steps; ++s) {
    if (on_step_start)
      on_step_start(s);
    auto params = eng.parameters();
    if (!params)
      return params.err();
    float scale = 1;
    if (opts.fp16) {
      auto current = eng.loss_scale();
      if (!current)
        return current.err();
      scale = *current;
    }
    double loss = 0;
    for (int k = 0; k < opts.gas; ++k) {  // this process's ranks (all of them in one process)
      std::vector<tensor_map> grads;      // of micro-batch k, by local rank
      for (int r = eng.first_rank(); r < eng.first_rank() + eng.local_ranks(); ++r) {
        int64_t first = static_cast<int64_t>(r * opts.gas + k) * opts.micro_batch;
        auto b = make_batch(opts.model, opts.seed, s, first, opts.micro_batch);
        auto lg = forward_backward(opts.model, *params, b);
        loss += lg.loss;
        if (opts.fp16)
          scale_like_fp16(lg.grads, scale);
        grads.push_back(std::move(lg.grads));
      }
      // Every local rank at once: they pack in parallel, within the bound on buckets in flight.
      if (auto err = eng.reduce_all(grads))
        return err;
    }
    auto info = eng.step();
    if (!info)
      return info.err();
    auto total = eng.sum_over_nodes({loss});  // the other processes' ranks, if any
    if (!total)
      return total.err();
    step_record rec{*info, total->at(0) / (world * opts.gas)};
    records.push_back(rec);
    if (on_step)
      on_step(rec);
    if (!opts.checkpoint_dir.empty() && opts.checkpoint_every > 0 && s % opts.checkpoint_every == 0)
      if (auto err = eng.save_checkpoint(opts.checkpoint_dir, opts.checkpoint_config))
        return err;
  }
  return records;
}

}  // namespace zmuon::example
