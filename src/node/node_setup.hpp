// One node of a multi-process job (zmuon-launch --nodes, node/node.hpp): the engine runs on the
// node's actor system and drives only this node's ranks, whose comm actors the node has already
// connected to the other nodes' through CAF's network layer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "node/job_end.hpp"

namespace caf {
class actor_system;
}

namespace zmuon {

struct node_setup {
  caf::actor_system* system = nullptr;  // the node's actor system; outlives the engine
  int first_rank = 0;                   // global rank of this node's first rank
  std::vector<comm_actor> comms;        // this node's ranks' comm actors, by local rank
  std::vector<int> node_first_ranks;    // first global rank of every node, by node rank
  std::string nccl_unique_id;  // from node 0 when node_options::nccl_unique_id is set; else empty
  int world = 0;               // ranks of the job (0: the engine options' world)
  std::shared_ptr<const job_end> end;  // why the job ended (a lost node); null: one process
};

}  // namespace zmuon
