// A bf16 GEMM of our own for Hopper (sm_90a: bulk tensor copies and wgmma), for the symmetric
// products of Newton-Schulz, A = X X^T and B = c A A + b A (and the Gram variant's [m, m]
// products), which cuBLAS can only compute whole:
//
//   D[b] = alpha * P[b] Q[b]^T + beta * C[b]      for b in [0, batch)
//
// P is [m, k] and Q is [n, k], both row-major with k contiguous (both operands "K-major", the
// layout wgmma reads without transposing); C and D are [m, n] row-major. With `symmetric`
// (m == n, and P Q^T and C symmetric, as A = X X^T and B = b A + c A A are), only the tiles on
// and above the diagonal are computed, each off-diagonal one also written mirrored: (T-1)/(2T)
// of the FLOPs saved for T tiles per side.
// A block computes one or two 128 x 128 tiles of one matrix (sm90_tiles.hpp): a producer
// warp streams 64-wide slices of P and Q into a ring of shared-memory stages, a consumer
// warpgroup per tile multiplies them with wgmma into fp32 registers and writes the tile once
// with alpha and beta applied, through shared memory so that every global access is 16 bytes
// wide. Two tiles share one operand's slices (3/4 of the bytes per FLOP), one tile lets two blocks
// share a multiprocessor (one's epilogue beside the other's wgmmas); sm90_gemm picks per product.
//
// Per tile it is slower than cuBLAS, most of all over short k. It pays only where the skipped
// tiles outweigh that: big symmetric products (docs/PERFORMANCE.md, docs/DECISIONS.md).
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

/// The kernel's block shapes (sm90_gemm chooses by the shape of the product unless told; tests
/// and bench_sm90_gemm compare them):
///   one_tile     one 128 x 128 tile per block, 3 stages, two blocks per multiprocessor;
///   two_tiles    two tiles per block sharing one operand's slices (a row's neighbours, or
///                with `symmetric` also two tiles of the last column), 4 stages, one block per
///                multiprocessor.
enum class sm90_block { automatic, one_tile, two_tiles };

struct sm90_gemm_args {
  int64_t batch = 0, m = 0, n = 0, k = 0;
  sm90_operand p, q;
  float alpha = 1.0f;
  float beta = 0.0f;
  sm90_operand c;  // read only when beta != 0
  sm90_output d;
  bool symmetric = false;
  sm90_block shape = sm90_block::automatic;
};

/// The tile sides: m and n must be multiples of kSm90Tile, k of kSm90Slice.
inline constexpr int64_t kSm90Tile = 128;
inline constexpr int64_t kSm90Slice = 64;

/// Whether `args` has the shapes and alignment the kernel takes (sides in whole tiles, 16-byte
/// aligned rows and matrices, a symmetric product square). Says nothing about the device.
bool sm90_gemm_fits(const sm90_gemm_args& args);

/// Whether the current device runs the kernel (symmetric_gemm_for its capability, gemm_choice.hpp).
bool sm90_gemm_available();
/// For benchmarks (ns_tuning::set_own_gemm_for_new_backends): whether sm90_gemm_available() may
/// say yes at all, for the whole process (default true). Workspaces ask when they are made.
void sm90_gemm_allow(bool on);

/// Whether a symmetric product of `batch` [m, m] results over k should run here rather than
/// on cuBLAS (on the current device; whether it runs the kernel aside): sides in whole tiles,
/// m >= 768, and the upper tiles at least one and a half waves of the device over k >= 2048, or
/// between half a wave and one over shorter k (where it measured faster).
bool sm90_gemm_suits_symmetric(int64_t batch, int64_t m, int64_t k);

class gemm_runner;

/// The same product as cuBLAS's whole GEMM (every tile, `symmetric` ignored) into `out` (laid
/// out as args.d): the reference the tests and bench_sm90_gemm compare with. Throws
/// gpu::failure.
void sm90_gemm_on_cublas(gemm_runner& runner, cudaStream_t stream, const sm90_gemm_args& args,
                         __nv_bfloat16* out);

/// Enqueues the GEMM on `stream`. Throws gpu::failure when `args` does not fit or a launch
/// fails. Nothing is allocated; capturing it into a CUDA graph is fine.
void sm90_gemm(cudaStream_t stream, const sm90_gemm_args& args);

}  // namespace zmuon::gpu
