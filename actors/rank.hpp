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
  std::shared_ptr<compute_backend> store_backend;
  std::shared_ptr<compute_backend> coordinator_backend;
};

/// Spawns rank `rank`'s actors. The store and the coordinator get their own backend instances
/// (made by `make_backend`), since they may run on different threads. With a `tracer` every actor
/// records its messages to the rank's trace file (trace/trace.hpp).
expected<rank_actors> spawn_rank(caf::actor_system& sys, std::shared_ptr<const plan> pl, int rank,
                                 const engine_options& opts, comm_actor comm,
                                 std::shared_ptr<trace::recorder> tracer = nullptr);

/// Sends every actor of the rank an exit message.
void stop_rank(const rank_actors& r);

}  // namespace zmuon
