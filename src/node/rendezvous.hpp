// The rendezvous: one actor on node 0, published through CAF's middleman at --master HOST:PORT.
// Every node (node 0 too) joins it once; it assigns global ranks, checks that every node brings
// the same parameter table and config, and hands out the handles the nodes need (docs/DESIGN.md
// §7).
//
// Interface:
//   hello -> hello_reply   from each node's launcher, first (optional: a node that skips it gets
//     no direct connections): answered when all `nodes` said hello, with every node's door
//     (host and port), so that the nodes connect to each other before join_request hands out
//     actor handles. The same node rank checks as join_request's. The node's supervisor is
//     monitored from here on.
//   join_request -> join_reply   from each node's launcher. Answered when all `nodes` have joined:
//     ranks in node-rank order (node n's first rank is the sum of the ranks of nodes < n), every
//     rank's comm actor, every node's supervisor, and the NCCL unique id when one is made.
//     If some node's parameter table or config differs from node 0's, every joiner gets an
//     invalid_argument error naming the first difference (node 0's values only to node 0).
//     Requests beyond the limits (a 4 MiB config, 2^20 parameters) are refused on arrival. A node
//     rank out of range or one that joins twice is an error for that joiner only. A node that dies
//     before everyone has joined fails the join of the others at once (comm_failure naming it).
#pragma once

#include <functional>
#include <string>

#include "caf/actor_system.hpp"
#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "node/node_messages.hpp"

namespace zmuon {

using rendezvous_actor = caf::typed_actor<caf::replies_to<hello>::with<hello_reply>,
                                          caf::replies_to<join_request>::with<join_reply>>;

/// `unique_id`, when set, is called once every node has joined; its bytes go to every node as
/// join_reply::nccl_unique_id (the nccl comm backend's ncclGetUniqueId). With
/// `only_on_own_gpus` (comm "auto") only if every rank has a GPU of its own (own_gpus).
/// `progress`, when set, gets a line each time a node reaches the rendezvous (its hello or its
/// join, whichever comes first), naming the nodes still awaited: "node 1 is in (2 of 3 nodes;
/// waiting for node 2)". From then on its death fails the others' join at once.
rendezvous_actor spawn_rendezvous(caf::actor_system& sys, int nodes,
                                  std::function<std::string()> unique_id = {},
                                  bool only_on_own_gpus = false,
                                  std::function<void(const std::string&)> progress = {});

/// Whether every rank of the joined nodes has a GPU of its own: each node lists one GPU per rank
/// and no GPU is listed twice (two processes on one host may see the same GPU).
bool own_gpus(const std::vector<join_request>& nodes);

/// The first difference between node `base`'s and node `other`'s request: parameter table first,
/// then the config key by key. Empty when they agree. Without `reveal_base`, what `base` has is
/// left out (the message for `other`: node 0's settings are not told to another process). Values
/// from peers are quoted with control bytes escaped.
std::string first_difference(const join_request& base, const join_request& other,
                             bool reveal_base = true);

}  // namespace zmuon
