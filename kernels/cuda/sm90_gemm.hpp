// A bf16 GEMM of our own for Hopper (sm_90a: bulk tensor copies and wgmma), written for the
// Newton-Schulz products of GPT-2-sized matrices, whose 768-sided batched GEMMs cuBLAS runs at
// 61-65 % of the bf16 ceiling (docs/NOTES.md, sessions 3-5):
//
//   D[b] = alpha * P[b] Q[b]^T + beta * C[b]      for b in [0, batch)
//
// P is [m, k] and Q is [n, k], both row-major with k contiguous (both operands "K-major", the
// layout wgmma reads without transposing); C and D are [m, n] row-major. Two extras serve
// Newton-Schulz:
//   - `dt`, when set, also receives D^T ([n, m] row-major), so that the iteration keeps X in both
//     layouts and every product reads K-major operands;
//   - `symmetric` (m == n, and P Q^T and C symmetric, as A = X X^T and B = b A + c A A are):
//     only the tiles on and above the diagonal are computed, each off-diagonal one also written
//     mirrored, which saves (T-1)/(2T) of the FLOPs for T tiles per side (5/12 at 768).
// One block computes one 128 x 128 tile of one matrix: a producer warp streams 64-wide slices
// of P and Q into a ring of shared-memory stages, a consumer warpgroup multiplies them with
// wgmma into fp32 registers, and writes the tile once with alpha and beta applied.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace zmuon::gpu {

struct sm90_operand {
  const __nv_bfloat16* data = nullptr;
  int64_t ld = 0;      // elements between rows
  int64_t stride = 0;  // elements between the batch's matrices
};

struct sm90_output {
  __nv_bfloat16* data = nullptr;
  int64_t ld = 0;
  int64_t stride = 0;
};

struct sm90_gemm_args {
  int64_t batch = 0, m = 0, n = 0, k = 0;
  sm90_operand p, q;
  float alpha = 1.0f;
  float beta = 0.0f;
  sm90_operand c;  // read only when beta != 0
  sm90_output d;
  sm90_output dt;  // optional: D^T, [n, m]
  bool symmetric = false;
};

/// The tile sides: m and n must be multiples of kSm90Tile, k of kSm90Slice.
inline constexpr int64_t kSm90Tile = 128;
inline constexpr int64_t kSm90Slice = 64;

/// Whether `args` has the shapes and alignment the kernel takes (sides in whole tiles, 16-byte
/// aligned rows and matrices, a symmetric product square). Says nothing about the device.
bool sm90_gemm_fits(const sm90_gemm_args& args);

/// Whether the current device runs the kernel (compute capability 9.0 exactly: sm_90a code).
bool sm90_gemm_available();

/// Enqueues the GEMM on `stream`. Throws gpu::failure when `args` does not fit or a launch
/// fails. Nothing is allocated; capturing it into a CUDA graph is fine.
void sm90_gemm(cudaStream_t stream, const sm90_gemm_args& args);

/// Rows [m, n] of `batch` row-major matrices into their transposes [n, m] (ld m), on `stream`.
void transpose_bf16(cudaStream_t stream, const __nv_bfloat16* in, __nv_bfloat16* out, int64_t batch,
                    int64_t m, int64_t n);

}  // namespace zmuon::gpu
