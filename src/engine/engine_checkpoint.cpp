// engine::save_checkpoint / load_checkpoint / last_step over checkpoint/checkpoint.hpp: the
// stores' and loss scalers' state in, the files out, and back (resharded by the reader).
//
// One process or several, the same steps: each process handles its own ranks, and the processes
// agree through sum_over_nodes (the identity in one process) on a slot per rank that the
// process running it fills. A process that fails still takes part in every agreement, so the
// others end with an error naming it instead of waiting for it. The checkpoint directory must be
// one every process sees (a shared filesystem).
#include <csignal>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.hpp"
#include "engine/hand_over.hpp"
#include "engine/impl.hpp"
#include "engine/job.hpp"
#include "engine/lifecycle.hpp"
#include "engine/registry.hpp"

namespace zmuon {

namespace {

// A matrix the host holds in boxes (engine::set_box_order): the files would hold its elements
// in the host's order, which another job's host need not share. Every process has the same
// table: each refuses alike, before any agreement.
error refuse_boxes(const plan& pl, const char* what) {
  for (const auto& p : pl.params)
    if (!p.boxes.empty())
      return {errc::unsupported, std::string(what) + ": '" + p.name
                                     + "' is held in boxes (set_box_order), and the files would "
                                       "hold its elements in that order; save and load through "
                                       "the host's own checkpoint (e.g. torch.distributed.checkpoint)"};
  return {};
}

/// The first rank whose slot (`width` values from `first`, one slot per rank) does not start
/// with 1, or -1.
int first_failed(const std::vector<double>& slots, size_t first, int width, int world) {
  for (int r = 0; r < world; ++r)
    if (slots[first + static_cast<size_t>(r) * width] != 1.0)
      return r;
  return -1;
}

/// Step 1 of save_checkpoint: the loss scalers of this process's ranks, none while a step is
/// open.
error scalers_of(engine_job& job, const engine_hand_over& hand,
                 std::vector<loss_scale_snapshot>& scalers) {
  for (int i = 0; i < job.local; ++i) {
    if (hand.micros[i] != 0)
      return {errc::bad_state, "save_checkpoint with micro-batches of step "
                                   + std::to_string(job.step + 1)
                                   + " handed over (save between steps)"};
    auto sc = job.ask<loss_scale_snapshot>(job.ranks[i].scaler, scaler_state_atom::value);
    if (!sc)
      return sc.err();
    scalers.push_back(*sc);
  }
  return {};
}

/// Step 2: the lead makes the step's directory under `dir`; every process says whether its
/// ranks are ready (`own`: why not). Slot 0: the directory's suffix + 1 (0: none made); then
/// one per rank. Returns the directory's name.
expected<std::string> prepare_dir(engine& eng, const engine_job& job, const std::string& dir,
                                  error own) {
  const int world = job.opts.world;
  std::vector<double> ready(world + 1, 0.0);
  if (job.first_rank == 0 && !own) {  // the lead
    auto suffix = create_checkpoint_dir(dir, job.step);
    if (suffix)
      ready[0] = *suffix + 1;
    else
      own = suffix.err();
  }
  for (int i = 0; i < job.local; ++i)
    ready[1 + job.first_rank + i] = own ? 0.0 : 1.0;
  auto agreed = eng.sum_over_nodes(ready);
  if (!agreed)
    return agreed.err();
  if (own)
    return own;
  if (int r = first_failed(*agreed, 1, 1, world); r >= 0 || (*agreed)[0] < 1)
    return error{errc::comm_failure,
                 "save_checkpoint: " + job.process_of(r >= 0 ? r : 0)
                     + " could not prepare its part of the checkpoint (its own error names why)"};
  return checkpoint_dir_name(job.step, static_cast<int>((*agreed)[0]) - 1);
}

/// Per rank, what its shard file's writer reports: written, bytes, CRC-32, AdamW steps, loss
/// scale, scaler iteration.
constexpr int kSlotWidth = 6;

/// Step 3: each process writes its ranks' shard files into `out`, one rank's state at a time (a
/// copy from its store, written straight to the file and dropped); their entries and counters
/// go round: every rank's slot (kSlotWidth values), checked.
expected<std::vector<double>> write_shards(engine& eng, engine_job& job, const engine_registry& reg,
                                           const std::string& out,
                                           const std::vector<loss_scale_snapshot>& scalers,
                                           checkpoint_manifest& meta) {
  const int world = job.opts.world;
  std::vector<double> files(static_cast<size_t>(world) * kSlotWidth, 0.0);
  const auto& f = reg.faults;
  error own;
  for (int i = 0; i < job.local; ++i) {
    const int r = job.first_rank + i;
    auto state = job.ask<rank_state>(job.ranks[i].store, saved_state_atom::value);
    if (!state) {
      own = state.err();
      break;
    }
    if (r == 0)  // the same on every rank: rank 0's go in the manifest
      for (int64_t n : state->adam_param_steps)
        if (n != state->adam_steps) {
          meta.adam_param_steps = state->adam_param_steps;
          break;
        }
    auto file = write_shard_file(out, *reg.pl, r, *state, job.step);
    if (!file) {
      own = file.err();
      break;
    }
    double* slot = files.data() + static_cast<size_t>(r) * kSlotWidth;
    slot[0] = 1;
    slot[1] = static_cast<double>(file->bytes);
    slot[2] = file->crc32;
    slot[3] = static_cast<double>(state->adam_steps);
    slot[4] = scalers[i].scale;
    slot[5] = static_cast<double>(scalers[i].iter);
    if (f.kill_in_save_at_step != 0 && f.kill_in_save_at_step == job.step
        && i + 1 >= f.kill_in_save_after_files)
      std::raise(SIGKILL);  // fault injection: the process dies in the middle of the save
  }
  auto written = eng.sum_over_nodes(files);
  if (!written)
    return written.err();
  if (own)
    return own;
  const std::vector<double>& w = *written;
  if (int r = first_failed(w, 0, kSlotWidth, world); r >= 0)
    return error{errc::comm_failure, "save_checkpoint: rank " + std::to_string(r)
                                         + "'s shard file was not written (" + job.process_of(r)
                                         + " failed: its own error names why)"};
  for (int r = 1; r < world; ++r)
    if (w[r * kSlotWidth + 3] != w[3] || w[r * kSlotWidth + 4] != w[4]
        || w[r * kSlotWidth + 5] != w[5])
      return error{errc::internal, "rank " + std::to_string(r)
                                       + " disagrees with rank 0 on the AdamW "
                                         "step count or the loss scale"};
  return written;
}

/// Step 4: the lead writes the manifest (`meta` with the files `w` reports) and `latest`;
/// every process learns whether it did.
error commit(engine& eng, const engine_job& job, const engine_registry& reg, const std::string& dir,
             const std::string& name, const std::vector<double>& w,
             const std::vector<loss_scale_snapshot>& scalers, checkpoint_manifest meta) {
  error own;
  std::vector<double> committed{0.0};
  if (job.first_rank == 0) {                       // the lead
    meta.adam_steps = static_cast<int64_t>(w[3]);  // rank 0's; every rank agreed on it
    meta.scaler = scalers[0];
    for (int r = 0; r < job.opts.world; ++r) {
      const double* slot = w.data() + static_cast<size_t>(r) * kSlotWidth;
      meta.files.push_back(
          {shard_file_name(r), r, static_cast<uint64_t>(slot[1]), static_cast<uint32_t>(slot[2])});
    }
    own = commit_checkpoint(dir, name, *reg.pl, std::move(meta));
    committed[0] = own ? 0.0 : 1.0;
  }
  auto done = eng.sum_over_nodes(committed);
  if (!done)
    return done.err();
  if (own)
    return own;
  if ((*done)[0] != 1.0)
    return {errc::comm_failure, "save_checkpoint: " + job.process_of(0)
                                    + " could not commit the checkpoint (its own error names why)"};
  return {};
}

}  // namespace

error engine::save_checkpoint(const std::string& dir, const std::string& config_json) {
  auto& d = *impl_;
  auto& job = *d.job;
  if (auto err = d.start())
    return err;
  if (auto err = refuse_boxes(*d.registry->pl, "save_checkpoint"))
    return err;
  if (auto err = d.withdraw_ahead())  // a hand-over ahead of the step is not between steps
    return d.stop(err, engine_lifecycle::in_step(job.step + 1));
  // 1. This process's ranks' loss scalers (their shards come one rank at a time in 3, so that
  //    at most one rank's state is copied at once). A failure here still joins the agreements
  //    below.
  checkpoint_manifest meta;
  meta.step = job.step;
  meta.config = nlohmann::json::parse(config_json, nullptr, false);
  std::vector<loss_scale_snapshot> scalers;
  error own = meta.config.is_discarded()
                  ? error{errc::invalid_argument, "save_checkpoint: the config is not valid JSON"}
                  : scalers_of(job, *d.hand_over, scalers);
  // 2. The step's directory, made by the lead.
  auto name = prepare_dir(*this, job, dir, std::move(own));
  if (!name)
    return name.err();
  // 3. The shard files.
  auto written = write_shards(*this, job, *d.registry, dir + "/" + *name, scalers, meta);
  if (!written)
    return written.err();
  // 4. The manifest and `latest`.
  return commit(*this, job, *d.registry, dir, *name, *written, scalers, std::move(meta));
}

expected<checkpoint_info> engine::load_checkpoint(const std::string& dir) {
  auto& d = *impl_;
  auto& job = *d.job;
  auto& hand = *d.hand_over;
  if (auto err = d.start())
    return err;
  if (auto err = refuse_boxes(*d.registry->pl, "load_checkpoint"))
    return err;
  if (auto err = d.withdraw_ahead())  // a hand-over ahead of the step is not between steps
    return d.stop(err, engine_lifecycle::in_step(job.step + 1));
  const int world = job.opts.world;
  error own;
  for (int i = 0; !own && i < job.local; ++i)
    if (hand.micros[i] != 0)
      own = {errc::bad_state, "load_checkpoint with micro-batches of step "
                                  + std::to_string(job.step + 1) + " handed over"};
  auto loaded = own ? expected<loaded_checkpoint>(own)
                    : read_checkpoint(dir, *d.registry->pl, job.first_rank, job.local);
  if (!loaded)
    own = loaded.err();
  // Every process must have read the same checkpoint: slot per rank {read, step}.
  std::vector<double> read(static_cast<size_t>(world) * 2, 0.0);
  for (int i = 0; i < job.local && !own; ++i) {
    read[2 * (job.first_rank + i)] = 1;
    read[2 * (job.first_rank + i) + 1] = static_cast<double>(loaded->manifest.step);
  }
  auto agreed = sum_over_nodes(read);
  if (!agreed)
    return agreed.err();
  if (own)
    return own;
  if (int r = first_failed(*agreed, 0, 2, world); r >= 0)
    return error{errc::comm_failure, "load_checkpoint: " + job.process_of(r)
                                         + " could not read the checkpoint (its own error names "
                                           "why)"};
  for (int r = 0; r < world; ++r)
    if ((*agreed)[2 * r + 1] != (*agreed)[1])
      return error{errc::comm_failure,
                   "load_checkpoint: " + job.process_of(r) + " read the checkpoint of step "
                       + std::to_string(static_cast<uint64_t>((*agreed)[2 * r + 1]))
                       + ", rank 0 that of step "
                       + std::to_string(static_cast<uint64_t>((*agreed)[1]))
                       + ": the directory must be one every process sees"};

  const auto& m = loaded->manifest;
  // Once a rank has taken its state, the ranks hold two checkpoints' states until all have: a
  // failure here stops the engine.
  const std::string handing =
      "while handing the checkpoint of step " + std::to_string(m.step) + " to its ranks";
  for (int i = 0; i < job.local; ++i) {
    auto state = std::make_shared<const rank_state>(std::move(loaded->states[job.first_rank + i]));
    if (auto done = job.ask<ack>(job.ranks[i].store, load_state{m.step, state}); !done)
      return d.stop(done.err(), handing);
    if (auto done = job.ask<ack>(job.ranks[i].scaler, restore_scaler{m.step, m.scaler}); !done)
      return d.stop(done.err(), handing);
  }
  job.step = m.step;
  return checkpoint_info{loaded->path, m.step, m.world, m.config.dump()};
}

uint64_t engine::last_step() const {
  return impl_->job->step;
}

}  // namespace zmuon
