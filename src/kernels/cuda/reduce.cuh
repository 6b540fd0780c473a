// Device-side block reduction shared by the reduction kernels. Every thread of the block must
// call it; the sum is valid in thread 0. The order of the additions is fixed by the block's
// shape, so a reduction gives the same bits on every run.
#pragma once

#include "kernels/cuda/launch.hpp"

namespace zmuon::gpu {

__device__ inline double block_sum(double value) {
  constexpr int kWarps = kThreads / 32;
  __shared__ double warp_sums[kWarps];
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_down_sync(0xffffffffu, value, offset);
  if (lane == 0)
    warp_sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kWarps ? warp_sums[lane] : 0.0;
    for (int offset = 16; offset > 0; offset /= 2)
      value += __shfl_down_sync(0xffffffffu, value, offset);
  }
  __syncthreads();  // warp_sums may be reused by the caller's next block_sum
  return value;
}

}  // namespace zmuon::gpu
