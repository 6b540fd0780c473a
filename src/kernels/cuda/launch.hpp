// What every launcher takes: the stream it enqueues on and the device's size, from which it
// picks its grid. Launchers never synchronize unless their name says so.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace zmuon::gpu {

struct launch_context {
  cudaStream_t stream = nullptr;
  int sm_count = 1;
};

/// Threads per block of every element-wise and reduction kernel.
inline constexpr int kThreads = 256;
/// Upper bound on the blocks of a reduction's first pass (and so on its partial results).
inline constexpr int kMaxReduceBlocks = 1024;

/// Blocks that cover n elements with one element per thread, capped so that the grid stays
/// well inside gridDim.x's limit; kernels grid-stride over whatever is left.
inline unsigned grid_for(int64_t n) {
  constexpr int64_t kMaxBlocks = int64_t{1} << 30;
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

/// Blocks of a reduction's first pass: enough to fill the device a few times over, no more.
inline int reduce_grid_for(int64_t n, int sm_count) {
  const int64_t wanted = std::min<int64_t>(int64_t{4} * sm_count, kMaxReduceBlocks);
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, wanted));
}

}  // namespace zmuon::gpu
