// The store's accumulate with its scan in the same pass (compute_backend::accumulate_scanned):
// dst = src, dst += src or dst = 0, and each block's sum of squares and non-finite flag of dst's
// new values as a part's partial results, so that the scan before a step reads a few thousand
// partials instead of the whole gradient.

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/reduce.cuh"

#include <cstdint>

namespace zmuon::gpu {
namespace {

template <accumulate_mode Mode>
__device__ inline float accumulated(float d, float s) {
  if constexpr (Mode == accumulate_mode::copy)
    return s;
  else if constexpr (Mode == accumulate_mode::add)
    return d + s;
  else
    return 0.0f;
}

/// Width 4: float4 accesses (dst, src and n allow them); 1: one float at a time.
template <accumulate_mode Mode, int Width>
__global__ void accumulate_scan_kernel(float* __restrict__ dst, const float* __restrict__ src,
                                       int64_t n, double* __restrict__ partial_sums,
                                       int* __restrict__ partial_flags) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double sum = 0.0;
  int nonfinite = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n / Width;
       i += stride) {
    float v[Width];
    if constexpr (Width == 4) {
      float4 d = make_float4(0, 0, 0, 0);
      float4 s = d;
      if constexpr (Mode == accumulate_mode::add)
        d = reinterpret_cast<const float4*>(dst)[i];
      if constexpr (Mode != accumulate_mode::zero)
        s = reinterpret_cast<const float4*>(src)[i];
      v[0] = accumulated<Mode>(d.x, s.x);
      v[1] = accumulated<Mode>(d.y, s.y);
      v[2] = accumulated<Mode>(d.z, s.z);
      v[3] = accumulated<Mode>(d.w, s.w);
      reinterpret_cast<float4*>(dst)[i] = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      const float d = Mode == accumulate_mode::add ? dst[i] : 0.0f;
      const float s = Mode != accumulate_mode::zero ? src[i] : 0.0f;
      dst[i] = v[0] = accumulated<Mode>(d, s);
    }
#pragma unroll
    for (int k = 0; k < Width; ++k) {
      nonfinite |= !isfinite(v[k]);
      sum += static_cast<double>(v[k]) * static_cast<double>(v[k]);
    }
  }
  sum = block_sum(sum);
  nonfinite = __syncthreads_or(nonfinite);
  if (threadIdx.x == 0) {
    partial_sums[blockIdx.x] = sum;
    partial_flags[blockIdx.x] = nonfinite;
  }
  if (blockIdx.x == 0)  // the part's unused partials read as zero
    for (int b = static_cast<int>(gridDim.x + threadIdx.x); b < kMaxReduceBlocks;
         b += static_cast<int>(blockDim.x)) {
      partial_sums[b] = 0.0;
      partial_flags[b] = 0;
    }
}

template <accumulate_mode Mode>
void launch(const launch_context& ctx, float* dst, const float* src, int64_t n,
            double* partial_sums, int* partial_flags) {
  const bool vector = n % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0
                      && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  const int blocks = reduce_grid_for(vector ? n / 4 : n, ctx.sm_count);
  if (vector)
    accumulate_scan_kernel<Mode, 4>
        <<<blocks, kThreads, 0, ctx.stream>>>(dst, src, n, partial_sums, partial_flags);
  else
    accumulate_scan_kernel<Mode, 1>
        <<<blocks, kThreads, 0, ctx.stream>>>(dst, src, n, partial_sums, partial_flags);
  ZMUON_LAUNCH_CHECK();
}

}  // namespace

void launch_accumulate_scanned(const launch_context& ctx, float* dst, const float* src, int64_t n,
                               accumulate_mode mode, double* partial_sums, int* partial_flags) {
  switch (mode) {
    case accumulate_mode::copy:
      return launch<accumulate_mode::copy>(ctx, dst, src, n, partial_sums, partial_flags);
    case accumulate_mode::add:
      return launch<accumulate_mode::add>(ctx, dst, src, n, partial_sums, partial_flags);
    case accumulate_mode::zero:
      return launch<accumulate_mode::zero>(ctx, dst, src, n, partial_sums, partial_flags);
  }
}

}  // namespace zmuon::gpu
