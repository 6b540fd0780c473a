// One rank: its four actors, wired to each other and to the rank's comm actor.
#pragma once

#include <memory>

#include "actors/loss_scaler.hpp"
#include "actors/muon_coordinator.hpp"
#include "actors/partition_store.hpp"
#include "actors/reducer.hpp"

namespace zmuon {

struct rank_actors {
  int rank = 0;
  partition_store_actor store;
  reducer_actor reducer;
  loss_scaler_actor scaler;
  muon_coordinator_actor coordinator;
  std::shared_ptr<compute_backend> backend;  // shared by the rank's actors (one GPU stream)
};

/// Spawns rank `rank`'s actors on `backend`. The actors share it: on CUDA that is one stream,
/// so work that one actor enqueues before its reply runs before work that another enqueues after
/// receiving it (the backend serializes concurrent calls). With a `tracer` every actor records
/// its messages to the rank's trace file (trace/trace.hpp).
rank_actors spawn_rank(caf::actor_system& sys, std::shared_ptr<const plan> pl, int rank,
                       const engine_options& opts, comm_actor comm,
                       std::shared_ptr<compute_backend> backend,
                       std::shared_ptr<trace::recorder> tracer = nullptr);

/// Sends every actor of the rank an exit message.
void stop_rank(const rank_actors& r);

}  // namespace zmuon
