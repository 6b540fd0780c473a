// The C ABI (zmuon/zmuon.h) over the C++ engine, by area: this file the library-wide calls
// (errors, version, logging); c_api_engine.cpp an engine's lifetime and registration,
// c_api_step.cpp the step's hand-over and results, c_api_hparams.cpp hyperparameters and
// update rules, c_api_state.cpp checkpoints and optimizer state, c_api_host.cpp a Python host's
// hooks, c_api_orthogonalize.cpp Newton-Schulz alone.
#include "embed/c_api.hpp"

#include "zmuon/log.hpp"
#include "zmuon/version.hpp"

using namespace zmuon::c_abi;
using zmuon::errc;

namespace zmuon::c_abi {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

}  // namespace zmuon::c_abi

static_assert(ZMUON_INVALID_ARGUMENT == static_cast<int>(errc::invalid_argument));
static_assert(ZMUON_SHAPE_MISMATCH == static_cast<int>(errc::shape_mismatch));
static_assert(ZMUON_INTERNAL == static_cast<int>(errc::internal));
static_assert(ZMUON_UNSUPPORTED == static_cast<int>(errc::unsupported));
static_assert(ZMUON_DEVICE_FAILURE == static_cast<int>(errc::device_failure));
static_assert(ZMUON_FLOAT32 == static_cast<int>(zmuon::element_type::fp32));
static_assert(ZMUON_BFLOAT16 == static_cast<int>(zmuon::element_type::bf16));
static_assert(ZMUON_LOG_ERROR == static_cast<int>(zmuon::log_level::error));
static_assert(ZMUON_LOG_TRACE == static_cast<int>(zmuon::log_level::trace));

extern "C" {

const char* zmuon_last_error(void) {
  return last_error().c_str();
}

const char* zmuon_version(void) {
  return zmuon::version();
}

const char* zmuon_status_name(int status) {
  if (status < 0 || status > ZMUON_DEVICE_FAILURE)
    return "unknown";
  return zmuon::to_string(static_cast<errc>(status));
}

int zmuon_set_log_level(int level) {
  if (level < ZMUON_LOG_ERROR || level > ZMUON_LOG_TRACE)
    return fail(errc::invalid_argument, "zmuon_set_log_level: level " + std::to_string(level)
                                            + " is outside [ZMUON_LOG_ERROR = 0, "
                                              "ZMUON_LOG_TRACE = 4]");
  zmuon::set_log_level(static_cast<zmuon::log_level>(level));
  return ZMUON_OK;
}

int zmuon_set_log_callback(zmuon_log_callback callback, void* user) {
  return guarded("zmuon_set_log_callback", [&]() -> zmuon::error {
    if (!callback) {
      zmuon::set_log_sink({});
      return {};
    }
    zmuon::set_log_sink([callback, user](zmuon::log_level level, std::string_view message) {
      const std::string line(message);  // NUL-terminated
      callback(static_cast<int>(level), line.c_str(), user);
    });
    return {};
  });
}

}  // extern "C"
