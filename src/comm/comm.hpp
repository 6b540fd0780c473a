// The communication interface: one comm actor per rank issues that rank's collectives, in the
// order its clients ask (docs/DESIGN.md §3, §5). Requests carry views of buffers the requester owns
// until the reply. Implementations: caf (collectives as messages between the ranks' comm actors,
// comm/caf_comm.hpp) and, with the CUDA backend, nccl.
//
// Interface:
//   reduce_scatter_req -> comm_done          mean over ranks; in: world*count floats rank-major
//   all_reduce_req     -> all_reduce_result  sum or max of a few doubles, in rank order
//   all_to_all_req     -> comm_done          grouped send/recv (gather-to-owner, scatter)
// A collective that fails (a dead peer, sizes that disagree between ranks) answers an error of
// errc::comm_failure that names the collective and the rank.
#pragma once

#include "caf/replies_to.hpp"
#include "caf/typed_actor.hpp"

#include "messages/messages.hpp"

namespace zmuon {

using comm_actor = caf::typed_actor<caf::replies_to<reduce_scatter_req>::with<comm_done>,
                                    caf::replies_to<all_reduce_req>::with<all_reduce_result>,
                                    caf::replies_to<all_to_all_req>::with<comm_done>>;

}  // namespace zmuon
