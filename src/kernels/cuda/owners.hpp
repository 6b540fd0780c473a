// RAII owners for the CUDA objects the backend holds: streams, events, cuBLAS handles, device
// and pinned host memory. Destructors never throw; a failure while releasing is ignored (the
// context may already be gone at process exit).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/cuda/check.hpp"

namespace zmuon::gpu {

/// Moves a raw handle out of `other`, leaving the empty value behind.
template <class Handle>
Handle take(Handle& other) {
  return std::exchange(other, Handle{});
}

class cuda_stream {
public:
  cuda_stream() { ZMUON_CUDA_CHECK(cudaStreamCreateWithFlags(&handle_, cudaStreamNonBlocking)); }
  ~cuda_stream() {
    if (handle_ != nullptr)
      (void)cudaStreamDestroy(handle_);
  }
  cuda_stream(cuda_stream&& other) noexcept : handle_(take(other.handle_)) {}
  cuda_stream& operator=(cuda_stream&&) = delete;
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;

  cudaStream_t get() const { return handle_; }
  void synchronize() const { ZMUON_CUDA_CHECK(cudaStreamSynchronize(handle_)); }

private:
  cudaStream_t handle_ = nullptr;
};

class cuda_event {
public:
  explicit cuda_event(unsigned flags = cudaEventDefault) {
    ZMUON_CUDA_CHECK(cudaEventCreateWithFlags(&handle_, flags));
  }
  ~cuda_event() {
    if (handle_ != nullptr)
      (void)cudaEventDestroy(handle_);
  }
  cuda_event(cuda_event&& other) noexcept : handle_(take(other.handle_)) {}
  cuda_event& operator=(cuda_event&&) = delete;
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;

  cudaEvent_t get() const { return handle_; }
  void record(cudaStream_t s) const { ZMUON_CUDA_CHECK(cudaEventRecord(handle_, s)); }
  /// True once the work recorded before the event has finished (never blocks).
  bool done() const {
    const cudaError_t status = cudaEventQuery(handle_);
    if (status == cudaErrorNotReady)
      return false;
    ZMUON_CUDA_CHECK(status);
    return true;
  }

private:
  cudaEvent_t handle_ = nullptr;
};

class cublas_handle {
public:
  cublas_handle() { ZMUON_CUBLAS_CHECK(cublasCreate(&handle_)); }
  ~cublas_handle() {
    if (handle_ != nullptr)
      (void)cublasDestroy(handle_);
  }
  cublas_handle(cublas_handle&& other) noexcept : handle_(take(other.handle_)) {}
  cublas_handle& operator=(cublas_handle&&) = delete;
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;

  cublasHandle_t get() const { return handle_; }

private:
  cublasHandle_t handle_ = nullptr;
};

/// Uninitialized device memory for `n` objects of a trivial type T.
template <class T>
class device_array {
public:
  device_array() = default;
  explicit device_array(int64_t n) { reset(n); }
  ~device_array() { release(); }
  device_array(device_array&& other) noexcept
      : data_(take(other.data_)), size_(take(other.size_)) {}
  device_array& operator=(device_array&& other) noexcept {
    if (this != &other) {
      release();
      data_ = take(other.data_);
      size_ = take(other.size_);
    }
    return *this;
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;

  /// Frees the old memory and allocates room for n objects (contents undefined).
  void reset(int64_t n) {
    release();
    if (n <= 0)
      return;
    ZMUON_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), bytes_for(n)));
    size_ = n;
  }
  /// Grows to at least n objects; keeps the allocation when it is big enough already. True
  /// when it allocated anew (pointers into the old memory are gone).
  bool reserve(int64_t n) {
    if (n <= size_)
      return false;
    reset(n);
    return true;
  }

  T* data() const { return data_; }
  int64_t size() const { return size_; }
  size_t bytes() const { return bytes_for(size_); }

private:
  static size_t bytes_for(int64_t n) { return static_cast<size_t>(n) * sizeof(T); }
  void release() {
    if (data_ != nullptr)
      (void)cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  int64_t size_ = 0;
};

/// An instantiated CUDA graph.
class graph_exec {
public:
  graph_exec() = default;
  explicit graph_exec(cudaGraphExec_t handle) : handle_(handle) {}
  ~graph_exec() {
    if (handle_ != nullptr)
      (void)cudaGraphExecDestroy(handle_);
  }
  graph_exec(graph_exec&& other) noexcept : handle_(take(other.handle_)) {}
  graph_exec& operator=(graph_exec&&) = delete;
  graph_exec(const graph_exec&) = delete;
  graph_exec& operator=(const graph_exec&) = delete;

  void launch(cudaStream_t s) const { ZMUON_CUDA_CHECK(cudaGraphLaunch(handle_, s)); }
  bool empty() const { return handle_ == nullptr; }

private:
  cudaGraphExec_t handle_ = nullptr;
};

/// Page-locked host memory for one T, the landing place of small device-to-host results.
template <class T>
class pinned {
public:
  pinned() { ZMUON_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), sizeof(T))); }
  ~pinned() {
    if (data_ != nullptr)
      (void)cudaFreeHost(data_);
  }
  pinned(pinned&& other) noexcept : data_(take(other.data_)) {}
  pinned& operator=(pinned&&) = delete;
  pinned(const pinned&) = delete;
  pinned& operator=(const pinned&) = delete;

  T* get() const { return data_; }

private:
  T* data_ = nullptr;
};

}  // namespace zmuon::gpu
