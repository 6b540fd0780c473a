// Error and result types of zmuon's public API. Errors are returned, never thrown across the API.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace zmuon {

/// What went wrong, coarsely; the message says exactly what.
enum class errc : uint8_t {
  none = 0,
  invalid_argument,     // a value out of range, a zero-size tensor, heads that do not divide rows
  unknown_parameter,    // a name that was never registered
  duplicate_parameter,  // a name registered twice
  shape_mismatch,       // a gradient or buffer of the wrong size
  bad_state,            // a call out of order (step before any gradient, register after start)
  comm_failure,         // a peer died, a collective failed or diverged
  timeout,              // a request was not answered in time
  io_error,             // a file could not be read or written
  internal,             // a broken invariant inside zmuon (a bug)
  unsupported,          // valid, but not available in this build or backend (e.g. device buffers)
  device_failure,       // a CUDA, cuBLAS or NCCL call failed (the rank's GPU state is lost)
};

const char* to_string(errc code);

/// An error code with a message that names what is wrong. Default-constructed means "no error".
class error {
public:
  error() = default;
  error(errc code, std::string message) : code_(code), message_(std::move(message)) {}

  errc code() const { return code_; }
  const std::string& message() const { return message_; }
  explicit operator bool() const { return code_ != errc::none; }

  /// "unknown_parameter: gradient for 'fc9.weight', which is not registered"
  std::string to_string() const;

private:
  errc code_ = errc::none;
  std::string message_;
};

/// Either a value or an error.
template <class T>
class expected {
public:
  expected(T value) : data_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  expected(error err) : data_(std::move(err)) {}  // NOLINT(google-explicit-constructor)

  explicit operator bool() const { return data_.index() == 0; }
  T& operator*() { return std::get<0>(data_); }
  const T& operator*() const { return std::get<0>(data_); }
  T* operator->() { return &std::get<0>(data_); }
  const T* operator->() const { return &std::get<0>(data_); }
  const error& err() const { return std::get<1>(data_); }

private:
  std::variant<T, error> data_;
};

}  // namespace zmuon
