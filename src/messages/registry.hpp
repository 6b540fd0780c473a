// Registers zmuon's message types and error category with an actor system config.
#pragma once

namespace caf {
class actor_system_config;
}

namespace zmuon {

void register_messages(caf::actor_system_config& cfg);

}  // namespace zmuon
