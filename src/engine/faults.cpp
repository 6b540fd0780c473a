// arm_faults: the test hook behind faults.hpp, kept out of the public engine.

#include "engine/faults.hpp"

#include "engine/impl.hpp"

namespace zmuon {

struct engine_access {
  static engine::impl& of(engine& eng) { return *eng.impl_; }
  static const engine::impl& of(const engine& eng) { return *eng.impl_; }
};

error arm_faults(engine& eng, const fault_options& faults) {
  auto& d = engine_access::of(eng);
  if (d.pl != nullptr)
    return {errc::bad_state, "faults are armed before the engine starts"};
  d.faults = faults;
  return {};
}

const fault_options& armed_faults(const engine& eng) {
  return engine_access::of(eng).faults;
}

}  // namespace zmuon
