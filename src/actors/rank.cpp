#include "actors/rank.hpp"

#include "caf/all.hpp"

#include "actors/staging.hpp"

namespace zmuon {

rank_actors spawn_rank(caf::actor_system& sys, std::shared_ptr<const plan> pl, int rank,
                       const engine_options& opts, comm_actor comm,
                       std::shared_ptr<compute_backend> backend,
                       std::shared_ptr<trace::recorder> tracer) {
  rank_actors r;
  r.rank = rank;
  r.backend = std::move(backend);
  r.store =
      spawn_partition_store(sys, pl, rank, r.backend, tracer, momentum_may_precede_vote(opts, *pl));
  r.reducer = spawn_reducer(sys, pl, rank, r.store, comm,
                            comm_on_host(opts.comm) ? nullptr : r.backend, tracer);
  r.scaler = spawn_loss_scaler(sys, opts.fp16, r.store, comm, tracer);
  r.coordinator = spawn_muon_coordinator(sys, pl, rank, opts,
                                         coordinator_peers{r.reducer, r.scaler, r.store, comm},
                                         r.backend, tracer);
  return r;
}

void stop_rank(const rank_actors& r) {
  caf::anon_send_exit(r.coordinator, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(r.scaler, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(r.reducer, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(r.store, caf::exit_reason::user_shutdown);
}

}  // namespace zmuon
