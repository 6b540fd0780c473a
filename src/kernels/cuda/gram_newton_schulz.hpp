// The Gram variant of Newton-Schulz on the GPU (ns_variant::gram, kernels/ns_variants.hpp): per
// block of steps, R = X X^T once, then only [m, m] products — Z = b*R + c*R*R, Z' = Z + a*I (a
// kernel on the diagonals), Q = Z'*Q (Q = Z' on the block's first step), T = Z'*R, R = T*Z' —
// and X = Q X once at the block's end. Z' carries every "+ a*..." term, so only Z's product
// reads a C. bf16 operands and fp32 accumulation throughout (gemm_runner, gemm.hpp), as
// the standard path; restarts every ns.gram_restart steps (the Polar Express paper's remedy for
// Q's conditioning in low precision) recompute R from X.
//
// On Hopper, the products of sides >= 768 over k >= 2048 run on zmuon's own GEMM, upper tiles
// only (sm90_gemm.hpp): R = X X^T of wide inputs, and all [m, m] products when m >= 2048.
//
// Not replayed from CUDA graphs (ns_tuning::set_graphs applies to the standard path only).
//
// Layout as in newton_schulz.hpp: a row-major tall [rows, cols] matrix is the column-major wide
// X; a row-major wide one is X^T column-major; only the GEMMs' transpose flags differ.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/ns_normalize.hpp"
#include "kernels/cuda/owners.hpp"
#include "zmuon/options.hpp"

namespace zmuon::gpu {

class gram_ns_workspace {
public:
  /// `cublas` must be bound to the stream of every later run().
  /// The current device decides whether the own GEMM (sm_90a code) can run.
  explicit gram_ns_workspace(cublasHandle_t cublas);

  /// Orthogonalizes `batch` row-major [rows, cols] matrices stored back to back at x (fp32 or
  /// bf16, ns_io), in place, on ctx.stream, with the Gram variant whatever the shape (the caller
  /// dispatches with ns_uses_gram). Throws gpu::failure.
  void run(const launch_context& ctx, ns_io x, int64_t batch, int64_t rows, int64_t cols,
           const ns_options& ns);

  void set_gemm_path(gemm_path path) { gemm_.set_path(path); }
  /// Run R = X X^T (wide inputs) and the [m, m] products (all symmetric: polynomials of one R)
  /// on zmuon's own Hopper GEMM where it measured faster (sm90_gemm.hpp; the default), or every
  /// GEMM on cuBLAS.
  void set_own_gemm(bool on) { own_gemm_ = on; }

  /// Device memory held now (buffers kept across calls, the GEMMs' workspace).
  int64_t bytes() const;

private:
  /// Steps first..first+count-1 on the wide [m, n] X at `cur`; writes Q X to `next`.
  void block(cudaStream_t stream, int64_t batch, int64_t m, int64_t n, bool tall,
             const ns_options& ns, int first, int count, const __nv_bfloat16* cur,
             __nv_bfloat16* next);

  gemm_runner gemm_;
  bool own_gemm_ = true;
  bool own_gemm_device_ = false;  // whether the device runs sm_90a code
  device_array<__nv_bfloat16> x_;
  device_array<__nv_bfloat16> x_next_;
  device_array<__nv_bfloat16> r_;
  device_array<__nv_bfloat16> z_;
  device_array<__nv_bfloat16> t_;
  device_array<__nv_bfloat16> q_;
  device_array<__nv_bfloat16> q_next_;
  device_array<double> partial_sums_;
  device_array<float> inv_norms_;
};

}  // namespace zmuon::gpu
