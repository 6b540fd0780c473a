#include "actors/rank.hpp"

#include "caf/all.hpp"

namespace zmuon {

expected<rank_actors> spawn_rank(caf::actor_system& sys, std::shared_ptr<const plan> pl, int rank,
                                 const engine_options& opts, comm_actor comm,
                                 std::shared_ptr<trace::recorder> tracer) {
  auto store_be = make_compute_backend(opts.compute);
  if (!store_be)
    return store_be.err();
  auto coord_be = make_compute_backend(opts.compute);
  if (!coord_be)
    return coord_be.err();
  rank_actors r;
  r.rank = rank;
  r.store_backend = std::shared_ptr<compute_backend>(std::move(*store_be));
  r.coordinator_backend = std::shared_ptr<compute_backend>(std::move(*coord_be));
  r.store = spawn_partition_store(sys, pl, rank, r.store_backend, tracer);
  r.reducer = spawn_reducer(sys, pl, rank, r.store, comm, tracer);
  r.scaler = spawn_loss_scaler(sys, opts.fp16, r.store, comm, tracer);
  r.coordinator = spawn_muon_coordinator(sys, pl, rank, opts,
                                         coordinator_peers{r.reducer, r.scaler, r.store, comm},
                                         r.coordinator_backend, tracer);
  return r;
}

void stop_rank(const rank_actors& r) {
  caf::anon_send_exit(r.coordinator, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(r.scaler, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(r.reducer, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(r.store, caf::exit_reason::user_shutdown);
}

}  // namespace zmuon
