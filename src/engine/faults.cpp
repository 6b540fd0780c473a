// arm_faults: the test hook behind faults.hpp, kept out of the public engine.

#include "engine/faults.hpp"

#include "engine/impl.hpp"
#include "engine/registry.hpp"

namespace zmuon {

struct engine_access {
  static engine::impl& of(engine& eng) { return *eng.impl_; }
  static const engine::impl& of(const engine& eng) { return *eng.impl_; }
};

error arm_faults(engine& eng, const fault_options& faults) {
  auto& reg = *engine_access::of(eng).registry;
  if (reg.pl != nullptr)
    return {errc::bad_state, "faults are armed before the engine starts"};
  reg.faults = faults;
  return {};
}

const fault_options& armed_faults(const engine& eng) {
  return engine_access::of(eng).registry->faults;
}

}  // namespace zmuon
