// The caf communication backend: each rank's comm actor sends its contributions to the peers'
// comm actors as peer_floats / peer_doubles messages and completes a collective once every
// expected contribution has arrived. Reductions add contributions in rank order, so the result
// does not depend on arrival order. Pieces that arrive before the local request wait for it.
//
// Interface (on top of comm_actor):
//   connect_peers  from the rank's creator: the comm actors of all ranks, indexed by rank (this
//                  sets the actor's rank and world); the actor monitors them and fails pending
//                  and later collectives when one dies. Pieces that come earlier wait for it.
//   comm_abort     from the node supervisor (a peer node was lost or stopped answering): pending
//                  and later collectives fail with `reason`, as when a peer's actor goes down
//   peer_floats    from a peer: its part of a reduce-scatter or all-to-all
//   peer_doubles   from a peer: its values of an all-reduce
#pragma once

#include <string>
#include <vector>

#include "caf/actor.hpp"
#include "caf/actor_system.hpp"

#include "comm/comm.hpp"
#include "trace/recorder.hpp"

namespace zmuon {

struct connect_peers {
  int32_t rank = 0;
  std::vector<caf::actor> peers;  // comm actor of every rank, this one included
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, connect_peers& x) {
  return f(caf::meta::type_name("connect_peers"), x.rank, x.peers);
}

struct comm_abort {
  std::string reason;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, comm_abort& x) {
  return f(caf::meta::type_name("comm_abort"), x.reason);
}

using caf_comm_actor =
    comm_actor::extend<caf::reacts_to<connect_peers>, caf::reacts_to<comm_abort>,
                       caf::reacts_to<peer_floats>, caf::reacts_to<peer_doubles>>;

/// Spawns one rank's caf comm actor; connect all of them with connect_peers before use.
caf_comm_actor spawn_caf_comm(caf::actor_system& sys, int rank, int world,
                              std::shared_ptr<trace::recorder> tracer = nullptr);

/// Spawns the comm actors of `world` in-process ranks and connects them; `tracers` (empty, or
/// one per rank) records their messages.
std::vector<caf_comm_actor> spawn_caf_comm_group(
    caf::actor_system& sys, int world,
    const std::vector<std::shared_ptr<trace::recorder>>& tracers = {});

}  // namespace zmuon
