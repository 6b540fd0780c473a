// Check macros at the CUDA / cuBLAS / NCCL boundary. A failed call throws `gpu::failure`, which
// carries a zmuon::error naming the call, the library's error and the file and line; the backend's
// callers (and make_cuda_compute_backend) turn it back into an error. Library code never exit()s.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <exception>
#include <stdexcept>
#include <string>

#include "zmuon/status.hpp"

namespace zmuon::gpu {

/// A CUDA, cuBLAS or NCCL call that failed. `what()` is the error's full text.
class failure : public std::runtime_error {
public:
  explicit failure(error err) : std::runtime_error(err.to_string()), error_(std::move(err)) {}
  const error& err() const { return error_; }

private:
  error error_;
};

[[noreturn]] void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t code, const char* call, const char* file,
                                     int line);
[[noreturn]] void throw_nccl_error(ncclResult_t code, const char* call, const char* file, int line);

/// "cudaErrorNoDevice (no CUDA-capable device is detected)"
std::string describe(cudaError_t code);
/// "CUBLAS_STATUS_NOT_SUPPORTED"
const char* describe(cublasStatus_t code);

/// A whole number from the environment within [low, high], unset or empty `otherwise`; anything
/// else throws gpu::failure (errc::invalid_argument) naming the variable, the range and the value.
long env_number(const char* name, long low, long high, long otherwise);

/// The zmuon::error behind an exception escaping a backend call: a gpu::failure's own error,
/// anything else as errc::internal with its what().
error to_error(const std::exception& e);

}  // namespace zmuon::gpu

#define ZMUON_CUDA_CHECK(call)                                                  \
  do {                                                                          \
    const cudaError_t zmuon_status_ = (call);                                   \
    if (zmuon_status_ != cudaSuccess)                                           \
      ::zmuon::gpu::throw_cuda_error(zmuon_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define ZMUON_CUBLAS_CHECK(call)                                                  \
  do {                                                                            \
    const cublasStatus_t zmuon_status_ = (call);                                  \
    if (zmuon_status_ != CUBLAS_STATUS_SUCCESS)                                   \
      ::zmuon::gpu::throw_cublas_error(zmuon_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define ZMUON_NCCL_CHECK(call)                                                  \
  do {                                                                          \
    const ncclResult_t zmuon_status_ = (call);                                  \
    if (zmuon_status_ != ncclSuccess)                                           \
      ::zmuon::gpu::throw_nccl_error(zmuon_status_, #call, __FILE__, __LINE__); \
  } while (0)

/// After every kernel launch: a bad configuration or a missing kernel image shows up here.
#define ZMUON_LAUNCH_CHECK() ZMUON_CUDA_CHECK(cudaGetLastError())
