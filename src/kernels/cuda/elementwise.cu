// The element-wise kernels (add, scale, momentum, Muon update, AdamW, fp32 <-> bf16) and the
// fused non-finite scan with sum of squares. One element per thread (grid-striding only past
// 2^38 elements; the slice kernels: 4 where aligned), 64-bit indices throughout, arithmetic in
// the same order as the host backend's loops.

#include "kernels/bf16.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/reduce.cuh"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace zmuon::gpu {
namespace {

__device__ inline int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__global__ void add_kernel(float* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dst[i] += src[i];
}

__global__ void scale_kernel(float* __restrict__ x, int64_t n, float factor) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    x[i] *= factor;
}

// The Muon phase's u and update as fp32, or as bf16 bits under bf16 transport (rounded and
// widened with kernels/bf16.hpp's functions, so a bf16 kernel gives the bits of the fp32 kernel
// followed by to_bf16, or preceded by from_bf16).
__device__ inline void store(float* dst, float v) {
  *dst = v;
}
__device__ inline void store(uint16_t* dst, float v) {
  *dst = to_bf16(v);
}
__device__ inline float load(const float* src) {
  return *src;
}
__device__ inline float load(const uint16_t* src) {
  return from_bf16(*src);
}

/// a * x + b * y as one fma over the rounded second product, spelled out: left to the compiler,
/// which product it fuses depends on how the operands were loaded, and the per-parameter and
/// slice kernels must give the same bits (momentum, the first and second moments).
__device__ inline float mix(float a, float x, float b, float y) {
  return __fmaf_rn(a, x, __fmul_rn(b, y));
}

template <class U>
__global__ void momentum_kernel(float* __restrict__ m, const float* __restrict__ g,
                                U* __restrict__ u, int64_t n, float beta, bool nesterov) {
  const float one_minus_beta = 1.0f - beta;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float gi = g[i];
    const float mi = mix(beta, m[i], one_minus_beta, gi);
    m[i] = mi;
    store(u + i, nesterov ? mix(beta, mi, one_minus_beta, gi) : mi);
  }
}

template <class O>
__global__ void apply_update_kernel(float* __restrict__ p, const O* __restrict__ o, int64_t n,
                                    float decay, float step) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    p[i] = p[i] * decay - step * load(o + i);
}

__global__ void to_bf16_kernel(uint16_t* __restrict__ dst, const float* __restrict__ src,
                               int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dst[i] = to_bf16(src[i]);
}

__global__ void from_bf16_kernel(float* __restrict__ dst, const uint16_t* __restrict__ src,
                                 int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dst[i] = from_bf16(src[i]);
}

struct adamw_factors {
  float beta1, beta2, eps, decay, step_size, inv_sqrt_bc2;
};

/// p * decay - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps), its roundings spelled out as mix.
__device__ inline float adamw_param(float p, float m, float v, const adamw_factors& f) {
  const float denominator = __fmaf_rn(sqrtf(v), f.inv_sqrt_bc2, f.eps);
  return __fmaf_rn(p, f.decay, -__fdiv_rn(__fmul_rn(f.step_size, m), denominator));
}

__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g,
                             float* __restrict__ m, float* __restrict__ v, int64_t n,
                             adamw_factors f) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float gi = g[i];
    const float mi = mix(f.beta1, m[i], 1.0f - f.beta1, gi);
    const float vi = mix(f.beta2, v[i], __fmul_rn(1.0f - f.beta2, gi), gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = adamw_param(p[i], mi, vi, f);
  }
}

/// kernels/scalar_rules.hpp's rule, one element per thread.
template <class Rule>
__global__ void scalar_rule_kernel(float* __restrict__ p, const float* __restrict__ g,
                                   float* __restrict__ m, float* __restrict__ v, int64_t n,
                                   scalar_factors f) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    float pi = p[i];
    float mi = m[i];
    float vi = v[i];
    Rule::apply(f, pi, g[i], mi, vi);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

// -- over several parameters: the slices of one call in a kernel parameter ---------------------

/// Slices per launch: the table travels as the kernel's parameter (well inside its 4 KB).
constexpr int kSliceTable = 64;
/// Elements a block of a slice kernel covers; every block works inside one slice.
constexpr int64_t kSliceBlockElements = int64_t{kThreads} * 4;

struct slice_table {
  int count = 0;
  int64_t shard[kSliceTable];
  int64_t state[kSliceTable];
  int64_t n[kSliceTable];
  float step[kSliceTable];           // apply_update: lr * the slice's scale
  const float* grad[kSliceTable];    // momentum, AdamW: the slice's gradient (grad_of)
  int first_block[kSliceTable + 1];  // blocks of slice s: [first_block[s], first_block[s + 1])
};

struct unit_table {
  int count = 0;
  const uint16_t* src[kSliceTable];
  uint16_t* dst[kSliceTable];
  int64_t n[kSliceTable];
  int first_block[kSliceTable + 1];
};

struct piece_table {
  int count = 0;
  const float* src[kSliceTable];
  int64_t dst[kSliceTable];
  int64_t n[kSliceTable];
  int first_block[kSliceTable + 1];
};

/// This block's slice and its elements [begin, end) of it.
struct block_slice {
  int s;
  int64_t begin, end;
};

/// Table: slice_table, piece_table or unit_table.
template <class Table>
__device__ inline block_slice slice_of_block(const Table& t, int b = static_cast<int>(blockIdx.x)) {
  int lo = 0;  // the last slice whose first block is <= b (empty slices are never in a table)
  int hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.first_block[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t begin = (b - t.first_block[lo]) * kSliceBlockElements;
  return {lo, begin, min(t.n[lo], begin + kSliceBlockElements)};
}

// The slice kernels move 4 consecutive elements per thread (16-byte fp32 and 8-byte bf16
// accesses) where a slice's arrays allow it, with each element's arithmetic that of the
// per-parameter kernels above, so that the results are the same bits either way.

template <int W>
using width = std::integral_constant<int, W>;

/// W elements of an array, widened to fp32.
template <int W>
struct pack {
  float v[W];
};

__device__ inline pack<1> load_pack(width<1>, const float* p) {
  return {{*p}};
}
__device__ inline pack<4> load_pack(width<4>, const float* p) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  return {{q.x, q.y, q.z, q.w}};
}
__device__ inline pack<1> load_pack(width<1>, const uint16_t* p) {
  return {{from_bf16(*p)}};
}
__device__ inline pack<4> load_pack(width<4>, const uint16_t* p) {
  const ushort4 q = *reinterpret_cast<const ushort4*>(p);
  return {{from_bf16(q.x), from_bf16(q.y), from_bf16(q.z), from_bf16(q.w)}};
}
__device__ inline void store_pack(width<1>, float* p, const pack<1>& x) {
  *p = x.v[0];
}
__device__ inline void store_pack(width<4>, float* p, const pack<4>& x) {
  *reinterpret_cast<float4*>(p) = make_float4(x.v[0], x.v[1], x.v[2], x.v[3]);
}
__device__ inline void store_pack(width<1>, uint16_t* p, const pack<1>& x) {
  *p = to_bf16(x.v[0]);
}
__device__ inline void store_pack(width<4>, uint16_t* p, const pack<4>& x) {
  *reinterpret_cast<ushort4*>(p) =
      make_ushort4(to_bf16(x.v[0]), to_bf16(x.v[1]), to_bf16(x.v[2]), to_bf16(x.v[3]));
}

/// Whether 4-element accesses from p are aligned.
template <class T>
__device__ inline bool aligned4(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

/// Calls body(width, i) over this block's elements [begin, end) of its slice: 4 at a time from
/// begin + 4 * thread where `aligned` (every array's slice start aligned4; begin is a multiple of
/// 4), the slice's last partial group and unaligned slices one at a time.
template <class Body>
__device__ inline void for_elements(const block_slice& part, bool aligned, const Body& body) {
  static_assert(kSliceBlockElements == 4 * kThreads, "a block's elements: 4 per thread");
  if (!aligned) {
    for (int64_t i = part.begin + threadIdx.x; i < part.end; i += kThreads)
      body(width<1>{}, i);
    return;
  }
  const int64_t i = part.begin + 4 * static_cast<int64_t>(threadIdx.x);
  if (i + 4 <= part.end) {
    body(width<4>{}, i);
    return;
  }
  for (int64_t k = i; k < part.end; ++k)
    body(width<1>{}, k);
}

/// Where a slice kernel's blocks add the scan of the gradient they read: to partial blockIdx.x
/// of a part (kMaxReduceBlocks of them, zeroed before the part's first launch), each launch
/// after the one before it on the stream: the same bits on every run.
struct scan_partials {
  double* sums = nullptr;  // null: no scan
  int* flags = nullptr;
};

// The momentum read at m and the new one written at m_out (m itself, or the store's spare: the
// two then do not overlap); u written. With a scan, the grid is at most kMaxReduceBlocks and
// each block runs the table's blocks b, b + gridDim.x, ..., scanning the gradient it reads.
template <bool Scan, class U>
__global__ void momentum_slices_kernel(const float* m, float* m_out, U* __restrict__ u,
                                       int64_t origin, const __grid_constant__ slice_table t,
                                       float beta, bool nesterov, scan_partials scan) {
  double sum = 0.0;
  int nonfinite = 0;
  const int blocks = Scan ? t.first_block[t.count] : static_cast<int>(blockIdx.x) + 1;
  for (int b = static_cast<int>(blockIdx.x); b < blocks; b += static_cast<int>(gridDim.x)) {
    const block_slice part = slice_of_block(t, b);
    const float* ms = m + t.state[part.s];
    float* ms_out = m_out + t.state[part.s];
    const float* gs = t.grad[part.s];
    U* us = u + (t.state[part.s] - origin);
    const float one_minus_beta = 1.0f - beta;
    const bool aligned = aligned4(ms) && aligned4(ms_out) && aligned4(gs) && aligned4(us);
    for_elements(part, aligned, [&](auto w, int64_t i) {
      const auto gi = load_pack(w, gs + i);
      auto mi = load_pack(w, ms + i);
      auto ui = mi;
#pragma unroll
      for (int k = 0; k < decltype(w)::value; ++k) {
        const float mk = mix(beta, mi.v[k], one_minus_beta, gi.v[k]);
        mi.v[k] = mk;
        ui.v[k] = nesterov ? mix(beta, mk, one_minus_beta, gi.v[k]) : mk;
        if constexpr (Scan) {
          nonfinite |= !isfinite(gi.v[k]);
          sum += static_cast<double>(gi.v[k]) * static_cast<double>(gi.v[k]);
        }
      }
      store_pack(w, ms_out + i, mi);
      store_pack(w, us + i, ui);
    });
  }
  if constexpr (Scan) {
    sum = block_sum(sum);
    nonfinite = __syncthreads_or(nonfinite);
    if (threadIdx.x == 0) {
      scan.sums[blockIdx.x] += sum;
      scan.flags[blockIdx.x] |= nonfinite;
    }
  }
}

template <class O>
__global__ void apply_update_slices_kernel(float* __restrict__ p, const O* __restrict__ o,
                                           int64_t origin, const __grid_constant__ slice_table t,
                                           float decay) {
  const block_slice part = slice_of_block(t);
  float* ps = p + t.shard[part.s];
  const O* os = o + (t.state[part.s] - origin);
  const float step = t.step[part.s];
  for_elements(part, aligned4(ps) && aligned4(os), [&](auto w, int64_t i) {
    auto pi = load_pack(w, ps + i);
    const auto oi = load_pack(w, os + i);
#pragma unroll
    for (int k = 0; k < decltype(w)::value; ++k)
      pi.v[k] = pi.v[k] * decay - step * oi.v[k];
    store_pack(w, ps + i, pi);
  });
}

__global__ void adamw_slices_kernel(float* __restrict__ p, float* __restrict__ m,
                                    float* __restrict__ v, const __grid_constant__ slice_table t,
                                    adamw_factors f) {
  const block_slice part = slice_of_block(t);
  float* ps = p + t.shard[part.s];
  const float* gs = t.grad[part.s];
  float* mv = m + t.state[part.s];
  float* vv = v + t.state[part.s];
  const bool aligned = aligned4(ps) && aligned4(gs) && aligned4(mv) && aligned4(vv);
  for_elements(part, aligned, [&](auto w, int64_t i) {
    const auto gi = load_pack(w, gs + i);
    auto mi = load_pack(w, mv + i);
    auto vi = load_pack(w, vv + i);
    auto pi = load_pack(w, ps + i);
#pragma unroll
    for (int k = 0; k < decltype(w)::value; ++k) {
      mi.v[k] = mix(f.beta1, mi.v[k], 1.0f - f.beta1, gi.v[k]);
      vi.v[k] = mix(f.beta2, vi.v[k], __fmul_rn(1.0f - f.beta2, gi.v[k]), gi.v[k]);
      pi.v[k] = adamw_param(pi.v[k], mi.v[k], vi.v[k], f);
    }
    store_pack(w, mv + i, mi);
    store_pack(w, vv + i, vi);
    store_pack(w, ps + i, pi);
  });
}

__global__ void copy_pieces_kernel(float* __restrict__ dst, const __grid_constant__ piece_table t) {
  const block_slice part = slice_of_block(t);
  const float* src = t.src[part.s];
  float* to = dst + t.dst[part.s];
  for_elements(part, aligned4(src) && aligned4(to),
               [&](auto w, int64_t i) { store_pack(w, to + i, load_pack(w, src + i)); });
}

__device__ inline void copy_units(width<1>, const uint16_t* src, uint16_t* dst) {
  *dst = *src;
}
__device__ inline void copy_units(width<4>, const uint16_t* src, uint16_t* dst) {
  *reinterpret_cast<ushort4*>(dst) = *reinterpret_cast<const ushort4*>(src);
}

__global__ void copy_units_kernel(const __grid_constant__ unit_table t) {
  const block_slice part = slice_of_block(t);
  const uint16_t* src = t.src[part.s];
  uint16_t* dst = t.dst[part.s];
  for_elements(part, aligned4(src) && aligned4(dst),
               [&](auto w, int64_t i) { copy_units(w, src + i, dst + i); });
}

/// Fills a Table (slice_table, piece_table or unit_table) with up to kSliceTable of `items` at a
/// time
/// (`fill(table, i, item)` sets entry i's own fields; empty items are skipped) and calls
/// launch(table, blocks) for each, every item covered by blocks of kSliceBlockElements.
template <class Table, class Item, class Fill, class Launch>
void in_tables(const std::vector<Item>& items, const Fill& fill, const Launch& launch) {
  Table t;
  t.first_block[0] = 0;
  const auto flush = [&] {
    if (t.count > 0)
      launch(t, t.first_block[t.count]);
    t.count = 0;
  };
  for (const Item& item : items) {
    if (item.n <= 0)
      continue;
    const int i = t.count;
    fill(t, i, item);
    t.n[i] = item.n;
    t.first_block[i + 1] =
        t.first_block[i]
        + static_cast<int>((item.n + kSliceBlockElements - 1) / kSliceBlockElements);
    if (++t.count == kSliceTable)
      flush();
  }
  flush();
}

/// in_tables for parameter slices; `step` of a slice is lr * its scale (the per-parameter
/// launcher's product, formed the same way), `grad` its gradient in `g` or its own (grad_of).
template <class Launch>
void for_each_table(const std::vector<param_slice>& slices, float lr, const float* g,
                    const Launch& launch) {
  in_tables<slice_table>(
      slices,
      [lr, g](slice_table& t, int i, const param_slice& s) {
        t.shard[i] = s.shard_offset;
        t.state[i] = s.state_offset;
        t.step[i] = lr * s.scale;
        t.grad[i] = grad_of(s, g);
      },
      launch);
}

/// First pass: each block's sum of squares (in double) and whether it saw inf or NaN. Four
/// loads in flight per thread before their use.
__global__ void sum_squares_partial_kernel(const float* __restrict__ x, int64_t n,
                                           double* __restrict__ partial_sums,
                                           int* __restrict__ partial_flags) {
  const int64_t stride = grid_stride();
  int64_t i = first_index();
  double sum = 0.0;
  int nonfinite = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[k] = __ldg(x + i + k * stride);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      nonfinite |= !isfinite(v[k]);
      sum += static_cast<double>(v[k]) * static_cast<double>(v[k]);
    }
  }
  for (; i < n; i += stride) {
    const float vi = __ldg(x + i);
    nonfinite |= !isfinite(vi);
    sum += static_cast<double>(vi) * static_cast<double>(vi);
  }
  sum = block_sum(sum);
  nonfinite = __syncthreads_or(nonfinite);
  if (threadIdx.x == 0) {
    partial_sums[blockIdx.x] = sum;
    partial_flags[blockIdx.x] = nonfinite;
  }
}

/// Second pass, one block: the partials in a fixed order.
__global__ void sum_squares_final_kernel(const double* __restrict__ partial_sums,
                                         const int* __restrict__ partial_flags, int count,
                                         reduction* __restrict__ result) {
  double sum = 0.0;
  int nonfinite = 0;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x)) {
    sum += partial_sums[i];
    nonfinite |= partial_flags[i];
  }
  sum = block_sum(sum);
  nonfinite = __syncthreads_or(nonfinite);
  if (threadIdx.x == 0) {
    result->sum_squares = sum;
    result->nonfinite = nonfinite;
  }
}

}  // namespace

void launch_add(const launch_context& ctx, float* dst, const float* src, int64_t n) {
  if (n <= 0)
    return;
  add_kernel<<<grid_for(n), kThreads, 0, ctx.stream>>>(dst, src, n);
  ZMUON_LAUNCH_CHECK();
}

void launch_scale(const launch_context& ctx, float* x, int64_t n, float factor) {
  if (n <= 0)
    return;
  scale_kernel<<<grid_for(n), kThreads, 0, ctx.stream>>>(x, n, factor);
  ZMUON_LAUNCH_CHECK();
}

void launch_sum_squares(const launch_context& ctx, const float* x, int64_t n,
                        const reduction_scratch& scratch) {
  const int blocks = reduce_grid_for(n, ctx.sm_count);
  sum_squares_partial_kernel<<<blocks, kThreads, 0, ctx.stream>>>(x, n, scratch.partial_sums,
                                                                  scratch.partial_flags);
  ZMUON_LAUNCH_CHECK();
  launch_sum_partials(ctx, scratch.partial_sums, scratch.partial_flags, blocks, scratch.result);
}

void launch_sum_partials(const launch_context& ctx, const double* partial_sums,
                         const int* partial_flags, int count, reduction* result) {
  sum_squares_final_kernel<<<1, kThreads, 0, ctx.stream>>>(partial_sums, partial_flags, count,
                                                           result);
  ZMUON_LAUNCH_CHECK();
}

namespace {

template <class U>
void momentum(const launch_context& ctx, float* m, const float* g, U* u, int64_t n, float beta,
              bool nesterov) {
  if (n <= 0)
    return;
  momentum_kernel<<<grid_for(n), kThreads, 0, ctx.stream>>>(m, g, u, n, beta, nesterov);
  ZMUON_LAUNCH_CHECK();
}

template <class O>
void apply_update(const launch_context& ctx, float* p, const O* o, int64_t n, float lr, float scale,
                  float weight_decay) {
  if (n <= 0)
    return;
  // The same float products as the host backend, formed once on the host.
  const float decay = 1.0f - lr * weight_decay;
  const float step = lr * scale;
  apply_update_kernel<<<grid_for(n), kThreads, 0, ctx.stream>>>(p, o, n, decay, step);
  ZMUON_LAUNCH_CHECK();
}

}  // namespace

void launch_momentum(const launch_context& ctx, float* m, const float* g, float* u, int64_t n,
                     float beta, bool nesterov) {
  momentum(ctx, m, g, u, n, beta, nesterov);
}

void launch_momentum(const launch_context& ctx, float* m, const float* g, uint16_t* u, int64_t n,
                     float beta, bool nesterov) {
  momentum(ctx, m, g, u, n, beta, nesterov);
}

void launch_apply_update(const launch_context& ctx, float* p, const float* o, int64_t n, float lr,
                         float scale, float weight_decay) {
  apply_update(ctx, p, o, n, lr, scale, weight_decay);
}

void launch_apply_update(const launch_context& ctx, float* p, const uint16_t* o, int64_t n,
                         float lr, float scale, float weight_decay) {
  apply_update(ctx, p, o, n, lr, scale, weight_decay);
}

void launch_to_bf16(const launch_context& ctx, uint16_t* dst, const float* src, int64_t n) {
  if (n <= 0)
    return;
  to_bf16_kernel<<<grid_for(n), kThreads, 0, ctx.stream>>>(dst, src, n);
  ZMUON_LAUNCH_CHECK();
}

void launch_from_bf16(const launch_context& ctx, float* dst, const uint16_t* src, int64_t n) {
  if (n <= 0)
    return;
  from_bf16_kernel<<<grid_for(n), kThreads, 0, ctx.stream>>>(dst, src, n);
  ZMUON_LAUNCH_CHECK();
}

namespace {

/// torch.optim.AdamW's arrangement: the factors kernels/scalar_rules.hpp forms on the host for
/// every backend (bias corrections in double).
adamw_factors factors_of(const scalar_args& args) {
  const scalar_factors f = scalar_factors_of(args);
  return {f.beta1, f.beta2, f.eps, f.decay, f.step_size, f.inv_sqrt_bc2};
}

}  // namespace

void launch_adamw(const launch_context& ctx, float* p, const float* g, float* m, float* v,
                  int64_t n, const scalar_args& args) {
  if (n <= 0)
    return;
  adamw_kernel<<<grid_for(n), kThreads, 0, ctx.stream>>>(p, g, m, v, n, factors_of(args));
  ZMUON_LAUNCH_CHECK();
}

void launch_scalar_rule(const launch_context& ctx, float* p, const float* g, float* m, float* v,
                        int64_t n, const scalar_args& args) {
  if (n <= 0)
    return;
  const scalar_factors f = scalar_factors_of(args);
  visit_scalar_rule(args.algorithm, [&](auto rule) {
    scalar_rule_kernel<decltype(rule)><<<grid_for(n), kThreads, 0, ctx.stream>>>(p, g, m, v, n, f);
  });
  ZMUON_LAUNCH_CHECK();
}

void launch_copy_pieces(const launch_context& ctx, float* dst,
                        const std::vector<copy_piece>& pieces) {
  in_tables<piece_table>(
      pieces,
      [](piece_table& t, int i, const copy_piece& p) {
        t.src[i] = p.src;
        t.dst[i] = p.dst_offset;
      },
      [&](const piece_table& t, int blocks) {
        copy_pieces_kernel<<<blocks, kThreads, 0, ctx.stream>>>(dst, t);
        ZMUON_LAUNCH_CHECK();
      });
}

void launch_copy_units(const launch_context& ctx, const std::vector<unit_piece>& pieces) {
  in_tables<unit_table>(
      pieces,
      [](unit_table& t, int i, const unit_piece& p) {
        t.src[i] = p.src;
        t.dst[i] = p.dst;
      },
      [&](const unit_table& t, int blocks) {
        copy_units_kernel<<<blocks, kThreads, 0, ctx.stream>>>(t);
        ZMUON_LAUNCH_CHECK();
      });
}

void launch_momentum_slices(const launch_context& ctx, const float* m, float* m_out, const float* g,
                            fp32_or_bf16 u, int64_t origin, const std::vector<param_slice>& slices,
                            float beta, bool nesterov, double* partial_sums, int* partial_flags) {
  const scan_partials scan{partial_sums, partial_flags};
  for_each_table(slices, 0.0f, g, [&](const slice_table& t, int blocks) {
    auto run = [&](auto* out) {
      if (scan.sums == nullptr)
        momentum_slices_kernel<false>
            <<<blocks, kThreads, 0, ctx.stream>>>(m, m_out, out, origin, t, beta, nesterov, scan);
      else
        momentum_slices_kernel<true>
            <<<std::min(blocks, kMaxReduceBlocks), kThreads, 0, ctx.stream>>>(
                m, m_out, out, origin, t, beta, nesterov, scan);
    };
    if (u.bf16 != nullptr)
      run(u.bf16);
    else
      run(u.f32);
    ZMUON_LAUNCH_CHECK();
  });
}

void launch_apply_update_slices(const launch_context& ctx, float* p, fp32_or_bf16 o, int64_t origin,
                                const std::vector<param_slice>& slices, float lr,
                                float weight_decay) {
  const float decay = 1.0f - lr * weight_decay;
  for_each_table(slices, lr, nullptr, [&](const slice_table& t, int blocks) {
    if (o.f32 != nullptr)
      apply_update_slices_kernel<<<blocks, kThreads, 0, ctx.stream>>>(p, o.f32, origin, t, decay);
    else
      apply_update_slices_kernel<<<blocks, kThreads, 0, ctx.stream>>>(p, o.bf16, origin, t, decay);
    ZMUON_LAUNCH_CHECK();
  });
}

void launch_adamw_slices(const launch_context& ctx, float* p, const float* g, float* m, float* v,
                         const std::vector<param_slice>& slices, const scalar_args& args) {
  const adamw_factors f = factors_of(args);
  for_each_table(slices, 0.0f, g, [&](const slice_table& t, int blocks) {
    adamw_slices_kernel<<<blocks, kThreads, 0, ctx.stream>>>(p, m, v, t, f);
    ZMUON_LAUNCH_CHECK();
  });
}

}  // namespace zmuon::gpu
