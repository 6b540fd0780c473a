// Newton-Schulz on the GPU: bf16 operands, fp32 accumulation, one strided-batched cuBLAS GEMM per
// product over all `batch` same-shape matrices (gemm.hpp), with b*A and a*X carried by the GEMMs'
// beta: per iteration, A = X X^T; B = c*A*A + b*A; X' = B*X + a*X, three GEMMs and nothing else.
//
// X is kept in bf16 between iterations (as the published PyTorch reference does); only the
// input (fp32, normalized per matrix on the device) and the output (back to fp32, in place) are
// converted. Tall matrices are not copied into a transposed buffer: a row-major tall [rows, cols]
// matrix already is the column-major wide X = u^T, so only the GEMMs' transpose flags differ.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <map>
#include <vector>

#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/owners.hpp"
#include "zmuon/options.hpp"

namespace zmuon::gpu {

/// Buffers kept across calls so that a step of a steady shape allocates nothing: the iterate X
/// and its successor (ping-pong), A = X X^T, B = b*A + c*A*A, and the per-matrix norms.
class ns_workspace {
public:
  /// `cublas` must be bound to the stream of every later run() (it serves the fallback path).
  explicit ns_workspace(cublasHandle_t cublas) : gemm_(cublas) {}

  /// Orthogonalizes `batch` row-major [rows, cols] fp32 matrices stored back to back at x, in
  /// place, on ctx.stream. Throws gpu::failure.
  void run(const launch_context& ctx, float* x, int64_t batch, int64_t rows, int64_t cols,
           const ns_options& ns);

  void set_gemm_path(gemm_path path) {
    gemm_.set_path(path);
    graphs_.clear();
  }
  /// Replay the iterations' GEMMs from a CUDA graph captured once per shape and coefficients
  /// (the kernels that touch x stay outside it, so x may change from call to call).
  void set_use_graphs(bool use) { use_graphs_ = use; }

private:
  /// Enqueues the `ns.steps` iterations on the workspace's buffers; returns the final X.
  __nv_bfloat16* iterate(cudaStream_t stream, int64_t batch, int64_t m, int64_t n, bool tall,
                         const ns_options& ns);
  const graph_exec& graph_for(cudaStream_t stream, int64_t batch, int64_t m, int64_t n, bool tall,
                              const ns_options& ns);

  gemm_runner gemm_;
  bool use_graphs_ = false;
  std::map<std::vector<int64_t>, graph_exec> graphs_;
  device_array<__nv_bfloat16> x_;
  device_array<__nv_bfloat16> x_next_;
  device_array<__nv_bfloat16> a_;
  device_array<__nv_bfloat16> b_;
  device_array<double> partial_sums_;
  device_array<float> inv_norms_;
};

}  // namespace zmuon::gpu
