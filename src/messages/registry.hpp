// Registers zmuon's message types and error category with an actor system config, and the
// settings every zmuon actor system shares.
#pragma once

namespace caf {
class actor_system_config;
}

namespace zmuon {

void register_messages(caf::actor_system_config& cfg);

/// register_messages, CAF's log quiet, and how idle scheduler threads wait for work: a short spin,
/// then a condition variable that a new job wakes at once. CAF's default spends the 25 ms after
/// the spin in 50 us sleeps, each of which a message from outside the scheduler (the host
/// thread's requests, a CUDA completion callback) waits out: 1-3 of them lie on a step's
/// critical path (docs/DECISIONS.md, bench/host/actor_wake.cpp).
void configure_actor_system(caf::actor_system_config& cfg);

}  // namespace zmuon
