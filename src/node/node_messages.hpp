// The messages between the nodes of a multi-process job (docs/DESIGN.md §7): joining the
// rendezvous, and the supervisors' heartbeats, loss reports and end-of-job barrier. All of them
// cross processes, so all are registered (register_node_messages) identically on every node.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "caf/actor.hpp"
#include "caf/atom.hpp"
#include "caf/meta/type_name.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

namespace caf {
class actor_system_config;
}

namespace zmuon {

using step_atom = caf::atom_constant<caf::atom("step")>;        // host -> supervisor: step begun
using finish_atom = caf::atom_constant<caf::atom("finish")>;    // host -> supervisor: barrier
using failure_atom = caf::atom_constant<caf::atom("failure")>;  // host -> supervisor: what failed?
using fail_atom = caf::atom_constant<caf::atom("fail")>;        // host -> supervisor: I failed
using tick_atom = caf::atom_constant<caf::atom("tick")>;        // supervisor -> itself

using door_atom = caf::atom_constant<caf::atom("door")>;  // node -> another node's door

/// Node -> rendezvous, before join_request: where the node takes direct connections from the
/// other nodes (its door, published at host:port; port 0: none), so that the nodes connect to
/// each other before any of them holds a handle of another's actors, and nothing between two
/// nodes goes through node 0. The supervisor is monitored from here on.
struct hello {
  int32_t node = 0;
  caf::actor supervisor;
  std::string host;
  uint16_t port = 0;
};

/// Rendezvous -> node, once every node said hello: every node's door, by node rank.
struct hello_reply {
  std::vector<std::string> hosts;
  std::vector<uint16_t> ports;
};

/// A node's door (nodes of a job of three or more): the actor the others connect to directly;
/// it answers with its node's rank, so that a node knows it reached the one it meant.
using node_door_actor = caf::typed_actor<caf::replies_to<door_atom>::with<int32_t>>;

/// Node -> rendezvous: what a node brings to the job. Everything but `ranks` and the handles
/// must be the same on every node.
struct join_request {
  int32_t node = 0;                // the node's rank
  int32_t ranks = 0;               // how many ranks this node runs
  std::vector<std::string> table;  // the parameter table, one line per parameter
  std::string job;                 // the job's config (JSON), zmuon.ranks left out
  caf::actor supervisor;           // the node's supervisor
  std::vector<caf::actor> comms;   // the comm actors of its ranks, by local rank
  /// The GPUs (compute_device_ids) its ranks would run on under the nccl comm, one per rank;
  /// empty where it cannot run it (host backend, fewer GPUs than ranks, no NCCL built in).
  std::vector<std::string> gpus;
};

/// Rendezvous -> node, once every node has joined and all agree.
struct join_reply {
  int32_t world = 0;                      // ranks of the job
  int32_t first_rank = 0;                 // the node's first global rank
  std::vector<int32_t> node_first_ranks;  // by node rank; node n has ranks up to the next entry
  std::vector<caf::actor> comms;          // every rank's comm actor, by global rank
  std::vector<caf::actor> supervisors;    // every node's supervisor, by node rank
  std::string nccl_unique_id;  // the bytes of an ncclUniqueId when the job runs the nccl comm
};

/// Supervisor -> supervisor, every heartbeat interval: alive, and in `step`.
struct heartbeat {
  int32_t node = 0;
  uint64_t step = 0;
};

/// Supervisor -> supervisor: a node was lost (`what` names it, its ranks and its step); the job
/// ends on every node.
struct node_lost {
  int32_t node = 0;
  std::string what;
};

/// Supervisor -> supervisor: this node finished the job; its disconnection is not a failure.
struct node_done {
  int32_t node = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, hello& x) {
  return f(caf::meta::type_name("hello"), x.node, x.supervisor, x.host, x.port);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, hello_reply& x) {
  return f(caf::meta::type_name("hello_reply"), x.hosts, x.ports);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_request& x) {
  return f(caf::meta::type_name("join_request"), x.node, x.ranks, x.table, x.job, x.supervisor,
           x.comms, x.gpus);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_reply& x) {
  return f(caf::meta::type_name("join_reply"), x.world, x.first_rank, x.node_first_ranks, x.comms,
           x.supervisors, x.nccl_unique_id);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, heartbeat& x) {
  return f(caf::meta::type_name("heartbeat"), x.node, x.step);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_lost& x) {
  return f(caf::meta::type_name("node_lost"), x.node, x.what);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_done& x) {
  return f(caf::meta::type_name("node_done"), x.node);
}

/// Registers the messages above (call on every node, before the actor system starts).
void register_node_messages(caf::actor_system_config& cfg);

}  // namespace zmuon
