// The CUDA compute backend (DESIGN.md §4): buffers in device memory, element-wise kernels of
// our own, Newton-Schulz with cuBLAS bf16 GEMMs. Every call enqueues on the backend's one stream
// in call order; calls that hand a value back (scan, frobenius_norm, copy_to_host) wait for it.
//
// Errors: a failing CUDA or cuBLAS call throws gpu::failure (kernels/cuda/check.hpp), whose
// err() is a zmuon::error naming the call, the CUDA error, file and line; the compute_backend
// interface returns no errors, so callers catch at their boundary (gpu::to_error converts).
// After a sticky CUDA error (an illegal access) the device context is unusable for the process.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>

#include "kernels/compute.hpp"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gram_newton_schulz.hpp"
#include "kernels/cuda/newton_schulz.hpp"
#include "kernels/cuda/owners.hpp"

namespace zmuon::gpu {

class cuda_compute final : public compute_backend {
public:
  /// A backend on `device` (an ordinal); throws gpu::failure when that device is unusable.
  explicit cuda_compute(int device);
  ~cuda_compute() override;

  std::string name() const override { return "cuda"; }
  bool device_memory() const override { return true; }

  device_buffer allocate(int64_t n) override;
  /// Both host copies return once the host buffer may be reused or read: they wait.
  void copy_from_host(float* dst, const float* host_src, int64_t n) override;
  void copy_to_host(float* host_dst, const float* src, int64_t n) override;
  /// dst and src must not overlap (cudaMemcpy's rule; the host backend allows it).
  void copy(float* dst, const float* src, int64_t n) override;
  void fill_zero(float* x, int64_t n) override;

  void add(float* dst, const float* src, int64_t n) override;
  void scale(float* x, int64_t n, float factor) override;
  scan_result scan(const float* x, int64_t n) override;
  double frobenius_norm(const float* x, int64_t n) override;
  void momentum(float* m, const float* g, float* u, int64_t n, float beta, bool nesterov) override;
  void apply_update(float* p, const float* o, int64_t n, float lr, float scale,
                    float weight_decay) override;
  void adamw(float* p, const float* g, float* m, float* v, int64_t n,
             const adamw_args& args) override;

  void newton_schulz(float* x, int64_t batch, int64_t rows, int64_t cols,
                     const ns_options& ns) override;

  void synchronize() override;

  void when_done(std::function<void()> done) override;
  void scan_async(const float* x, int64_t n, scan_result* out) override;
  device_buffer allocate_host(int64_t n) override;
  void copy_to_host_async(float* host_dst, const float* src, int64_t n) override;
  void copy_from_host_async(float* dst, const float* host_src, int64_t n) override;

  /// For the NCCL communication backend and for benchmarks: where this backend's work runs.
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_.get(); }
  /// For benchmarks: how Newton-Schulz runs its GEMMs (gemm.hpp).
  void set_ns_gemm_path(gemm_path path) {
    ns_.set_gemm_path(path);
    gram_ns_.set_gemm_path(path);
  }
  /// For benchmarks: replay Newton-Schulz's GEMMs from CUDA graphs (newton_schulz.hpp).
  void set_ns_graphs(bool use) { ns_.set_use_graphs(use); }

private:
  /// The launch context, usable while the guard lives: holds the backend's lock (the actors of
  /// one rank share its backend and run on any scheduler thread, so calls are serialized; each
  /// only enqueues, except the waits named above) with this backend's device current.
  struct launch_guard {
    std::unique_lock<std::mutex> lock;
    const launch_context& ctx;
    operator const launch_context&() const { return ctx; }
  };
  launch_guard activate() const;
  reduction reduce(const float* x, int64_t n);

  mutable std::mutex mutex_;
  int device_;
  cuda_stream stream_;
  cublas_handle cublas_;
  device_array<unsigned char> cublas_workspace_;
  launch_context ctx_;
  device_array<double> partial_sums_;
  device_array<int> partial_flags_;
  device_array<reduction> result_;
  pinned<reduction> host_result_;
  ns_workspace ns_;
  gram_ns_workspace gram_ns_;  // ns_variant::gram (kernels/ns_variants.hpp)
};

}  // namespace zmuon::gpu

namespace zmuon {

/// The CUDA backend on the calling thread's current device (device 0 unless cudaSetDevice was
/// called), or an error (errc::invalid_argument) naming why no GPU is usable; never crashes on
/// a machine without a GPU or driver.
expected<std::unique_ptr<compute_backend>> make_cuda_compute_backend();
/// The same on device ordinal `device` (one rank per GPU under NCCL).
expected<std::unique_ptr<compute_backend>> make_cuda_compute_backend(int device);
/// Visible CUDA devices (0 when there is no GPU or driver).
int cuda_device_count();

}  // namespace zmuon
