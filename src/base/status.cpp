#include "zmuon/status.hpp"

namespace zmuon {

const char* to_string(errc code) {
  switch (code) {
    case errc::none:
      return "none";
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::unknown_parameter:
      return "unknown_parameter";
    case errc::duplicate_parameter:
      return "duplicate_parameter";
    case errc::shape_mismatch:
      return "shape_mismatch";
    case errc::bad_state:
      return "bad_state";
    case errc::comm_failure:
      return "comm_failure";
    case errc::timeout:
      return "timeout";
    case errc::io_error:
      return "io_error";
    case errc::internal:
      return "internal";
    case errc::unsupported:
      return "unsupported";
    case errc::device_failure:
      return "device_failure";
  }
  return "unknown";
}

std::string error::to_string() const {
  return std::string(zmuon::to_string(code_)) + ": " + message_;
}

}  // namespace zmuon
