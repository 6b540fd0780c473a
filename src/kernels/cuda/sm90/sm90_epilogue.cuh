// The epilogues of sm90_gemm.cu's kernel: a consumer warpgroup's 128 x 128 fp32 tile (wgmma's
// accumulator fragments) becomes D = alpha * acc + beta * C in bf16, written through shared
// memory so that every global access is 16 bytes wide, and, for an off-diagonal tile of a
// symmetric product, written mirrored too. Included by sm90_gemm.cu only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/sm90/sm90_gemm.hpp"

namespace zmuon::gpu::sm90 {

constexpr int kTile = static_cast<int>(kSm90Tile);
constexpr int kGroupThreads = 128;    // one consumer warpgroup
constexpr int kStagedLd = kTile + 8;  // floats per staged epilogue row: 8 more keeps half-warps
                                      // off each other's banks when the fragments go in
constexpr int kStagedBytes = kTile * kStagedLd * 4;

/// What the kernel is launched with (besides the operands' tensor maps).
struct kernel_params {
  int blocks_per_matrix;  // sm90::blocks_per_matrix
  int tiles_n;            // tiles per row of D
  int slices;             // k / kSlice
  int symmetric;
  float alpha;
  float beta;
  const __nv_bfloat16* c;
  int64_t ld_c, stride_c;
  __nv_bfloat16* d;
  int64_t ld_d, stride_d;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/// Syncs one consumer warpgroup (named barrier 2 + group).
__device__ __forceinline__ void group_sync(int group) {
  if (group == 0)
    asm volatile("bar.sync 2, %0;" ::"n"(kGroupThreads) : "memory");
  else
    asm volatile("bar.sync 3, %0;" ::"n"(kGroupThreads) : "memory");
}

/// Calls f(row, col, x, y) for each pair of neighbouring accumulators thread `t` of a consumer
/// warpgroup holds: (row, col) and (row, col + 1) of the tile, in wgmma's m64n128 fp32 layout
/// (acc0 rows 0-63, acc1 rows 64-127).
template <typename F>
__device__ __forceinline__ void for_each_pair(const float (&acc0)[64], const float (&acc1)[64],
                                              int t, F&& f) {
  const int lane = t % 32;
  const int warp = t / 32;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float(&acc)[64] = h == 0 ? acc0 : acc1;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half)
        f(h * 64 + warp * 16 + lane / 4 + half * 8, j * 8 + (lane % 4) * 2, acc[4 * j + 2 * half],
          acc[4 * j + 2 * half + 1]);
    }
  }
}

/// The mirror of a staged tile (rows kStagedLd floats apart, holding D's rounded values): its
/// columns written as the rows of D's tile (col0, row0). Each thread takes 16 rows of one column
/// (32 bytes of a row of the mirror) per pass; neighbouring threads take neighbouring columns, so
/// the shared-memory reads do not conflict.
__device__ __forceinline__ void write_mirror(const float* tile, __nv_bfloat16* d, int64_t ld_d,
                                             int64_t row0, int64_t col0, int t) {
  for (int i = t; i < kTile * (kTile / 16); i += kGroupThreads) {
    const int col = i % kTile;
    const int row = (i / kTile) * 16;
    uint4 out[2];
    __nv_bfloat162* packed = reinterpret_cast<__nv_bfloat162*>(out);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      packed[e] = __floats2bfloat162_rn(tile[(row + 2 * e) * kStagedLd + col],
                                        tile[(row + 2 * e + 1) * kStagedLd + col]);
    uint4* to = reinterpret_cast<uint4*>(d + (col0 + col) * ld_d + row0 + row);
    to[0] = out[0];
    to[1] = out[1];
  }
}

/// The tile through shared memory (the stages are free by now), so that every global access is
/// 16 bytes wide and whole rows of D and of its mirror are written by neighbouring threads: the
/// accumulators go in as fp32, alpha * acc + beta * C is formed and rounded along D's rows
/// (C read 16 bytes at a time), the rounded values go back, and the mirror pass writes them
/// down D's columns into the mirror's rows. `t` is the thread's index in its warpgroup.
__device__ __forceinline__ void store_staged(const float (&acc0)[64], const float (&acc1)[64],
                                             float* tile, const kernel_params& prm, int64_t matrix,
                                             int tile_m, int tile_n, bool mirror, int group,
                                             int t) {
  for_each_pair(acc0, acc1, t, [&](int row, int col, float x, float y) {
    *reinterpret_cast<float2*>(tile + row * kStagedLd + col) = make_float2(x, y);
  });
  group_sync(group);
  const int64_t row0 = int64_t{tile_m} * kTile;
  const int64_t col0 = int64_t{tile_n} * kTile;
  const __nv_bfloat16* c = prm.c != nullptr ? prm.c + matrix * prm.stride_c : nullptr;
  __nv_bfloat16* d = prm.d + matrix * prm.stride_d;
  // Rows: 16 runs of 8 columns per row, one run per thread per pass; unrolled so that several
  // passes' loads of C are in flight at once.
#pragma unroll 4
  for (int pass = 0; pass < kTile * (kTile / 8) / kGroupThreads; ++pass) {
    const int i = t + pass * kGroupThreads;
    const int row = i / (kTile / 8);
    const int col = (i % (kTile / 8)) * 8;
    float* at = tile + row * kStagedLd + col;
    float v[8];
    *reinterpret_cast<float4*>(v) = *reinterpret_cast<const float4*>(at);
    *reinterpret_cast<float4*>(v + 4) = *reinterpret_cast<const float4*>(at + 4);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      v[e] *= prm.alpha;
    if (c != nullptr) {
      const uint4 raw = *reinterpret_cast<const uint4*>(c + (row0 + row) * prm.ld_c + col0 + col);
      const __nv_bfloat162* old = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[2 * e] += prm.beta * __low2float(old[e]);
        v[2 * e + 1] += prm.beta * __high2float(old[e]);
      }
    }
    uint4 out;
    __nv_bfloat162* packed = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      packed[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
    *reinterpret_cast<uint4*>(d + (row0 + row) * prm.ld_d + col0 + col) = out;
    if (mirror) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[2 * e] = __low2float(packed[e]);
        v[2 * e + 1] = __high2float(packed[e]);
      }
      *reinterpret_cast<float4*>(at) = *reinterpret_cast<const float4*>(v);
      *reinterpret_cast<float4*>(at + 4) = *reinterpret_cast<const float4*>(v + 4);
    }
  }
  if (!mirror)
    return;
  group_sync(group);
  write_mirror(tile, d, prm.ld_d, row0, col0, t);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

}  // namespace zmuon::gpu::sm90
