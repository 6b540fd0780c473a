// node_supervisor: one per node. It watches every other node in two ways: a CAF
// monitor on that node's supervisor (a dead process or a closed connection is a down message at
// once) and heartbeats (a node that stops answering for `heartbeat_timeout` is lost too). A lost
// node ends the job on every node: the supervisor that notices tells the others, logs the loss,
// writes it into the node's job_end (the engine then fails every call with it) and aborts this
// node's comm actors (their pending collectives fail, so the host loop unwinds). It never ends
// the process: that is the host's choice (zmuon-launch exits with 3). It is a scheduled actor:
// its heartbeats need a scheduler thread that no rank's handler holds (node_scheduler_threads).
//
// Interface:
//   watch_nodes               from the node after the rendezvous: every node's supervisor and
//                             ranks; starts the monitors and heartbeats
//   (step_atom, step)         from the host loop: the step this node is in (sent on to the
//                             others at once, as a heartbeat)
//   heartbeat, node_lost,     from the other nodes' supervisors
//   node_done
//   finish_atom -> bool       from the host loop at the end: the barrier; answered when every node
//                             has finished (true) or one was lost (an error naming it)
//   failure_atom -> string    from the host loop after an error: the loss of a node that caused
//                             it, waiting up to `failure_wait` for one to be noticed; "" if none
//   (fail_atom, what)         from the host loop: this node failed on its own; tell the others
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "caf/actor_system.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "comm/caf_comm.hpp"
#include "node/job_end.hpp"
#include "node/node_messages.hpp"

namespace zmuon {

/// Local: the job's nodes, once the rendezvous answered.
struct watch_nodes {
  std::vector<caf::actor> supervisors;    // by node rank
  std::vector<int32_t> node_first_ranks;  // by node rank
  int32_t world = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, watch_nodes& x) {
  return f(caf::meta::type_name("watch_nodes"), x.supervisors, x.node_first_ranks, x.world);
}

using node_supervisor_actor =
    caf::typed_actor<caf::reacts_to<watch_nodes>, caf::reacts_to<step_atom, uint64_t>,
                     caf::reacts_to<heartbeat>, caf::reacts_to<node_lost>,
                     caf::reacts_to<node_done>, caf::replies_to<finish_atom>::with<bool>,
                     caf::replies_to<failure_atom>::with<std::string>,
                     caf::reacts_to<fail_atom, std::string>, caf::reacts_to<tick_atom>>;

struct supervisor_options {
  int node = 0;
  std::chrono::milliseconds heartbeat_timeout{10'000};
  std::chrono::milliseconds failure_wait{3'000};  // how long failure_atom waits for a report
  std::vector<caf_comm_actor> comms;              // this node's comm actors, aborted on a loss
  std::shared_ptr<job_end> end;                   // written when the job ends (may be null)
};

node_supervisor_actor spawn_node_supervisor(caf::actor_system& sys, supervisor_options opts);

/// "node 1 (ranks 2-3)": a node and its global ranks.
std::string describe_node(int node, const std::vector<int32_t>& node_first_ranks, int world);

}  // namespace zmuon
