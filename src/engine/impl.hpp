// engine::impl: the engine's state in four named parts, each in its own header, so that a file
// includes the parts it uses: the job (job.hpp: this process's ranks, their actors and comms),
// the registry (registry.hpp: the parameter table and hyperparameters), the hand-over
// (hand_over.hpp: the open step's gradients in flight) and the lifecycle (lifecycle.hpp: start
// once, stop at the first failure). What needs several parts is here. Internal: not installed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zmuon/engine.hpp"

namespace caf {
class actor_system;
}

namespace zmuon {

struct engine_job;
struct engine_registry;
struct engine_hand_over;
struct engine_lifecycle;

struct engine::impl {
  impl();
  ~impl();

  // Destroyed bottom-up: the hand-over's windows before the job's actor system.
  std::unique_ptr<engine_job> job;
  std::unique_ptr<engine_registry> registry;
  std::unique_ptr<engine_hand_over> hand_over;
  std::unique_ptr<engine_lifecycle> lifecycle;

  /// This process runs ranks [first, first + local_ranks) of `o.world` on `system`.
  error configure(const engine_options& o, caf::actor_system* system, int first, int local_ranks,
                  int node = 0);
  /// Runs on `node`'s actor system as its ranks (engine::create(opts, node), and a joining
  /// process once it has joined).
  error adopt(const engine_options& options, const node_setup& node);
  /// Starts the ranks at the first call that needs them (once, whichever thread gets there
  /// first: reduce() for different ranks may run on different threads), or says why not.
  error start();
  /// start() for a call on global rank `rank`: the rank is checked first (a bad one starts
  /// nothing), except where a joining process learns its ranks only when it starts.
  error start_for(int rank);
  /// The lifecycle's stop() with this job's end: latches `err` as the failure that stops the
  /// engine `when`; returns it.
  error stop(error err, const std::string& when);
  /// Every hyperparameter group's values for `step` (engine_hparams.cpp), by group up to the
  /// highest a parameter uses; a schedule's bad learning rate is an error naming it.
  expected<std::vector<group_hparams>> step_groups(uint64_t step) const;
  /// The open step's touched mask, the same on every rank: 1 where some rank of the job handed
  /// the parameter a gradient (an OR over local ranks, then a sum over processes); empty when
  /// all were. Clears the local marks.
  expected<std::vector<uint8_t>> step_touched();
  /// For a step() refused before it begins, which keeps what was handed over: the gradients
  /// read where the caller keeps them (hand_over's kept_until_step) copied into the stores, and
  /// those copies run, since the caller may write or free them once step() returns.
  error copy_in_kept();
  /// Why `cuda_stream` cannot order the reads of a hand-over ahead of the step, or no error.
  error check_ahead_stream(void* cuda_stream);
  /// The reads of the hand-overs ahead of the step after `cuda_stream`'s work (none: after the
  /// hand-over's), and the store told to start them where it was not yet (begin_reads).
  error begin_ahead_reads(std::optional<void*> cuda_stream);
  /// Local rank `local`'s hand-over ahead of the step, if it made one, withdrawn: its buckets
  /// answered, the reducer and the store told to forget them (nothing was read on the device),
  /// and the rank's open step as if nothing had been handed over. -1: every local rank's.
  error withdraw_ahead(int local = -1);

private:
  error start_locked();
};

}  // namespace zmuon
