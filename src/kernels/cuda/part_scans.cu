// The store's accumulate with its scan in the same pass (compute_backend::accumulate_scanned):
// dst = src, dst += src or dst = 0, and each block's sum of squares and non-finite flag of dst's
// new values as a part's partial results, so that the scan before a step reads a few thousand
// partials instead of the whole gradient.

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/reduce.cuh"

#include <cstdint>
#include <string>

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

/// The block's scan (its threads' `sum` and `nonfinite`) as partial blockIdx.x; block 0 zeroes
/// the partials no block of this launch writes, so that the part's unused ones read as zero.
__device__ inline void write_partials(double sum, int nonfinite, double* partial_sums,
                                      int* partial_flags) {
  sum = block_sum(sum);
  nonfinite = __syncthreads_or(nonfinite);
  if (threadIdx.x == 0) {
    partial_sums[blockIdx.x] = sum;
    partial_flags[blockIdx.x] = nonfinite;
  }
  if (blockIdx.x == 0)
    for (int b = static_cast<int>(gridDim.x + threadIdx.x); b < kMaxReduceBlocks;
         b += static_cast<int>(blockDim.x)) {
      partial_sums[b] = 0.0;
      partial_flags[b] = 0;
    }
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
  write_partials(sum, nonfinite, partial_sums, partial_flags);
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

/// The pieces of one bucket in destination order; piece k is elements [start[k], start[k + 1])
/// of their concatenation.
struct piece_scan_table {
  int count = 0;
  const float* src[kPieceScanTable];
  int64_t dst[kPieceScanTable];
  int64_t start[kPieceScanTable + 1];
};

/// accumulated<Mode> over n elements of d and s by the block's threads, 4 at a time where both
/// allow 16-byte accesses from the same element, adding each new value to the scan. `Store`
/// false: the scan alone, nothing written (copy mode; d only sets the 16-byte grouping, so that
/// the sum's order is the copy's).
template <accumulate_mode Mode, bool Store = true>
__device__ inline void accumulate_span(float* __restrict__ d, const float* __restrict__ s,
                                       int64_t n, double& sum, int& nonfinite) {
  static_assert(Store || Mode == accumulate_mode::copy, "a scan alone reads the source only");
  const auto one = [&](int64_t i) {
    const float v = accumulated<Mode>(Mode == accumulate_mode::add ? d[i] : 0.0f, s[i]);
    if constexpr (Store)
      d[i] = v;
    nonfinite |= !isfinite(v);
    sum += static_cast<double>(v) * static_cast<double>(v);
  };
  const auto at = [](const float* p) { return reinterpret_cast<uintptr_t>(p); };
  int64_t head = n;  // elements before the first 16-byte boundary of both, or all of them
  if (at(d) % 16 == at(s) % 16)
    head = min(n, static_cast<int64_t>((16 - at(d) % 16) % 16 / sizeof(float)));
  const int64_t quads = (n - head) / 4;
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x)
    one(i);
  float4* d4 = reinterpret_cast<float4*>(d + head);
  const float4* s4 = reinterpret_cast<const float4*>(s + head);
  for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
    const float4 x = s4[q];
    float4 y = make_float4(0, 0, 0, 0);
    if constexpr (Mode == accumulate_mode::add)
      y = d4[q];
    const float v[4] = {accumulated<Mode>(y.x, x.x), accumulated<Mode>(y.y, x.y),
                        accumulated<Mode>(y.z, x.z), accumulated<Mode>(y.w, x.w)};
    if constexpr (Store)
      d4[q] = make_float4(v[0], v[1], v[2], v[3]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      nonfinite |= !isfinite(v[k]);
      sum += static_cast<double>(v[k]) * static_cast<double>(v[k]);
    }
  }
  for (int64_t i = head + 4 * quads + threadIdx.x; i < n; i += blockDim.x)
    one(i);
}

/// Block b takes elements [b * per, (b + 1) * per) of the pieces' concatenation, piece after
/// piece, and writes the scan of what it wrote (`Store` false: would write) as partial b.
template <accumulate_mode Mode, bool Store = true>
__global__ void accumulate_pieces_scan_kernel(float* __restrict__ dst,
                                              const __grid_constant__ piece_scan_table t,
                                              int64_t per, double* __restrict__ partial_sums,
                                              int* __restrict__ partial_flags) {
  const int64_t total = t.start[t.count];
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * per;
  const int64_t hi = min(total, lo + per);
  int k = 0;  // the piece holding lo: the last one starting at or before it
  for (int hi_k = t.count - 1; k < hi_k;) {
    const int mid = (k + hi_k + 1) / 2;
    if (t.start[mid] <= lo)
      k = mid;
    else
      hi_k = mid - 1;
  }
  double sum = 0.0;
  int nonfinite = 0;
  for (int64_t a = lo; a < hi; ++k) {
    const int64_t b = min(hi, t.start[k + 1]);
    const int64_t j = a - t.start[k];
    accumulate_span<Mode, Store>(dst + t.dst[k] + j, t.src[k] + j, b - a, sum, nonfinite);
    a = b;
  }
  write_partials(sum, nonfinite, partial_sums, partial_flags);
}

/// The pieces' table and the grid over their concatenation: `per` elements a block, `used`
/// blocks (at least one, so that the part's partials are written).
struct pieces_grid {
  piece_scan_table t;
  int64_t per = 0;
  int used = 1;
};

pieces_grid grid_of(const launch_context& ctx, const std::vector<copy_piece>& pieces,
                    const char* what) {
  pieces_grid g;
  piece_scan_table& t = g.t;
  t.start[0] = 0;
  for (const copy_piece& p : pieces) {
    if (p.n <= 0)
      continue;
    if (t.count == kPieceScanTable)
      throw failure(error(errc::invalid_argument, std::string(what) + ": more than "
                                                      + std::to_string(kPieceScanTable)
                                                      + " pieces in one launch"));
    t.src[t.count] = p.src;
    t.dst[t.count] = p.dst_offset;
    t.start[t.count + 1] = t.start[t.count] + p.n;
    ++t.count;
  }
  const int64_t total = t.start[t.count];
  const int blocks = reduce_grid_for(total / 4 + 1, ctx.sm_count);
  g.per = (total + blocks - 1) / blocks;
  g.used = total == 0 ? 1 : static_cast<int>((total + g.per - 1) / g.per);
  return g;
}

}  // namespace

void launch_accumulate_pieces_scanned(const launch_context& ctx, float* dst,
                                      const std::vector<copy_piece>& pieces, accumulate_mode mode,
                                      double* partial_sums, int* partial_flags) {
  const pieces_grid g = grid_of(ctx, pieces, "accumulate_pieces_scanned");
  if (mode == accumulate_mode::add)
    accumulate_pieces_scan_kernel<accumulate_mode::add>
        <<<g.used, kThreads, 0, ctx.stream>>>(dst, g.t, g.per, partial_sums, partial_flags);
  else
    accumulate_pieces_scan_kernel<accumulate_mode::copy>
        <<<g.used, kThreads, 0, ctx.stream>>>(dst, g.t, g.per, partial_sums, partial_flags);
  ZMUON_LAUNCH_CHECK();
}

void launch_scan_pieces(const launch_context& ctx, const float* grouping,
                        const std::vector<copy_piece>& pieces, double* partial_sums,
                        int* partial_flags) {
  const pieces_grid g = grid_of(ctx, pieces, "scan_pieces");
  accumulate_pieces_scan_kernel<accumulate_mode::copy, false><<<g.used, kThreads, 0, ctx.stream>>>(
      const_cast<float*>(grouping), g.t, g.per, partial_sums, partial_flags);
  ZMUON_LAUNCH_CHECK();
}

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
