// The throwing half of check.hpp: formats "file:line: call: library error" into a zmuon::error.

#include "kernels/cuda/check.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace zmuon::gpu {
namespace {

std::string where(const char* call, const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash != nullptr ? slash + 1 : file) + ":" + std::to_string(line) + ": " + call
         + ": ";
}

}  // namespace

long env_number(const char* name, long low, long high, long otherwise) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0')
    return otherwise;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || errno != 0 || n < low || n > high)
    throw failure(error(errc::invalid_argument, std::string(name) + " must be a whole number from "
                                                    + std::to_string(low) + " to "
                                                    + std::to_string(high) + ", not '" + v + "'"));
  return n;
}

std::string describe(cudaError_t code) {
  return std::string(cudaGetErrorName(code)) + " (" + cudaGetErrorString(code) + ")";
}

const char* describe(cublasStatus_t code) {
  return cublasGetStatusName(code);
}

void throw_cuda_error(cudaError_t code, const char* call, const char* file, int line) {
  // Clear a non-sticky error so that the next call does not report it again.
  (void)cudaGetLastError();
  throw failure(error(errc::internal, where(call, file, line) + describe(code)));
}

void throw_cublas_error(cublasStatus_t code, const char* call, const char* file, int line) {
  throw failure(error(errc::internal, where(call, file, line) + describe(code)));
}

void throw_nccl_error(ncclResult_t code, const char* call, const char* file, int line) {
  throw failure(error(errc::comm_failure, where(call, file, line) + ncclGetErrorString(code)));
}

error to_error(const std::exception& e) {
  if (const auto* f = dynamic_cast<const failure*>(&e))
    return f->err();
  return error(errc::internal, e.what());
}

}  // namespace zmuon::gpu
