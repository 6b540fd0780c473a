// zmuon errors inside the actor system: caf::error of category "zmuon" whose context is the
// message. Handlers return these; the engine turns them back into zmuon::error.
#pragma once

#include <exception>
#include <string>

#include "caf/error.hpp"
#include "caf/make_message.hpp"

#include "zmuon/status.hpp"

namespace caf {
class actor_system;
}

namespace zmuon {

inline caf::atom_value error_category() {
  return caf::atom("zmuon");
}

inline caf::error make_caf_error(errc code, std::string message) {
  return caf::error(static_cast<uint8_t>(code), error_category(),
                    caf::make_message(std::move(message)));
}

inline caf::error make_caf_error(const error& err) {
  return make_caf_error(err.code(), err.message());
}

/// The error for an exception that escaped a handler (a CUDA failure is a std::runtime_error
/// whose what() names the call, file and line): errc::device_failure with that text.
caf::error error_from_exception(const std::exception_ptr& eptr);

/// A zmuon::error from any caf::error: ours keep code and message; CAF's own (timeouts, dead
/// receivers) are mapped and rendered.
error from_caf_error(const caf::error& err);

}  // namespace zmuon
