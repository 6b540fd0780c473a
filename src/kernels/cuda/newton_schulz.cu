// Newton-Schulz iteration with cuBLAS (see newton_schulz.hpp), and its small kernels: the
// per-matrix sum of squares, the per-matrix 1/(||X||_F + eps), the fp32 <-> bf16 passes, the
// diagonal shift B += a*I and the mirror copies of the symmetric products' blocks.

#include "kernels/cuda/newton_schulz.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/ns_normalize.hpp"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/sm90/sm90_gemm.hpp"

namespace zmuon::gpu {
namespace {

/// Graphs kept per workspace; a run of more distinct shapes than this starts the cache afresh.
constexpr size_t kMaxGraphs = 64;

// The per-matrix passes move kWidth consecutive elements per thread and access (16-byte loads
// and stores) where every matrix's start and `out` allow it (vector_width), else one.
constexpr int kWidth = 8;

template <int Width>
__device__ inline void load(const float* p, float (&v)[Width]) {
  if constexpr (Width == kWidth) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    v[0] = *p;
  }
}
template <int Width>
__device__ inline void load(const __nv_bfloat16* p, float (&v)[Width]) {
  if constexpr (Width == kWidth) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
    for (int i = 0; i < kWidth / 2; ++i) {
      const float2 f = __bfloat1622float2(pairs[i]);
      v[2 * i] = f.x;
      v[2 * i + 1] = f.y;
    }
  } else {
    v[0] = __bfloat162float(*p);
  }
}
template <int Width>
__device__ inline void store(__nv_bfloat16* p, const float (&v)[Width]) {
  if constexpr (Width == kWidth) {
    uint4 raw;
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
    for (int i = 0; i < kWidth / 2; ++i)
      pairs[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
    *p = __float2bfloat16_rn(v[0]);
  }
}
template <int Width>
__device__ inline void store(float* p, const float (&v)[Width]) {
  if constexpr (Width == kWidth) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    *p = v[0];
  }
}

/// kWidth where `numel` and every pointer allow 16-byte accesses of each matrix, else 1.
int vector_width(int64_t numel, std::initializer_list<const void*> pointers) {
  bool aligned = numel % kWidth == 0;
  for (const void* p : pointers)
    aligned = aligned && reinterpret_cast<uintptr_t>(p) % 16 == 0;
  return aligned ? kWidth : 1;
}

// Grids of the per-matrix kernels: blockIdx.x is the matrix, blockIdx.y a slice of it that
// grid-strides over the matrix's groups of Width elements. T: float or __nv_bfloat16 (ns_io).
template <int Width, class T>
__global__ void matrix_sum_squares_kernel(const T* __restrict__ x, int64_t numel,
                                          double* __restrict__ partial_sums) {
  const T* xm = x + static_cast<int64_t>(blockIdx.x) * numel;
  const int64_t groups = numel / Width;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  double sum = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < groups;
       i += stride) {
    float v[Width];
    load<Width>(xm + i * Width, v);
    for (int j = 0; j < Width; ++j)
      sum += static_cast<double>(v[j]) * v[j];
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0)
    partial_sums[static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y] = sum;
}

__global__ void matrix_inv_norm_kernel(const double* __restrict__ partial_sums, int slices,
                                       double eps, float* __restrict__ inv_norms) {
  const double* parts = partial_sums + static_cast<int64_t>(blockIdx.x) * slices;
  double sum = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < slices; i += static_cast<int>(blockDim.x))
    sum += parts[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0)
    inv_norms[blockIdx.x] = static_cast<float>(1.0 / (sqrt(sum) + eps));
}

template <int Width, class T>
__global__ void to_bf16_scaled_kernel(const T* __restrict__ x, int64_t numel,
                                      const float* __restrict__ inv_norms,
                                      __nv_bfloat16* __restrict__ out) {
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * numel;
  const float factor = inv_norms[blockIdx.x];
  const int64_t groups = numel / Width;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < groups;
       i += stride) {
    float v[Width];
    load<Width>(x + offset + i * Width, v);
    for (int j = 0; j < Width; ++j)
      v[j] *= factor;
    store<Width>(out + offset + i * Width, v);
  }
}

template <int Width>
__global__ void from_bf16_kernel(const __nv_bfloat16* __restrict__ in, int64_t n,
                                 float* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n / Width;
       i += stride) {
    float v[Width];
    load<Width>(in + i * Width, v);
    store<Width>(out + i * Width, v);
  }
}

/// B[q] += a*I for `batch` column-major [m, m] matrices stored back to back (only the diagonal
/// is read and written): the update X' = B X + a X then needs no read of X as the GEMM's C.
__global__ void add_to_diagonal_kernel(__nv_bfloat16* __restrict__ b, int64_t m, int64_t count,
                                       float a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    __nv_bfloat16* at = b + (i / m) * m * m + (i % m) * (m + 1);
    *at = __float2bfloat16_rn(__bfloat162float(*at) + a);
  }
}

constexpr int kTile = 32;     // side of the mirror kernel's tiles (blocks are multiples of it)
constexpr int kTileRows = 8;  // rows of threads per tile; each thread moves kTile / kTileRows

/// For each of the column-major m×m matrices at a (gridDim.z of them, m*m apart), whose lower
/// blocks (side s, a multiple of kTile) hold a symmetric matrix: fills every upper block from
/// the transposed lower one, and, when `lower_to` is given, copies the lower and diagonal
/// blocks there too. One kTile×kTile tile per thread block, transposed through shared memory
/// so that reads and writes are both coalesced.
__global__ void mirror_blocks_kernel(__nv_bfloat16* __restrict__ a, int64_t m, int64_t s,
                                     __nv_bfloat16* __restrict__ lower_to) {
  __shared__ __nv_bfloat16 tile[kTile][kTile + 1];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t offset = static_cast<int64_t>(blockIdx.z) * m * m;
  __nv_bfloat16* am = a + offset;
  if (row0 / s >= col0 / s) {  // a lower or diagonal block: computed by the GEMMs
    if (lower_to == nullptr)
      return;
    for (int y = static_cast<int>(threadIdx.y); y < kTile; y += kTileRows) {
      const int64_t at = (col0 + y) * m + row0 + threadIdx.x;
      lower_to[offset + at] = am[at];
    }
    return;
  }
  // Upper tile (rows row0.., cols col0..) = transpose of the lower tile (rows col0.., cols row0..).
  for (int y = static_cast<int>(threadIdx.y); y < kTile; y += kTileRows)
    tile[y][threadIdx.x] = am[(row0 + y) * m + col0 + threadIdx.x];
  __syncthreads();
  for (int y = static_cast<int>(threadIdx.y); y < kTile; y += kTileRows)
    am[(col0 + y) * m + row0 + threadIdx.x] = tile[threadIdx.x][y];
}

/// Slices per matrix: enough blocks in all to fill the device a few times, at least one
/// block's worth of elements per slice, within gridDim.y's limit.
int slices_for(int64_t batch, int64_t numel, int sm_count) {
  const int64_t wanted = (int64_t{8} * sm_count + batch - 1) / batch;
  const int64_t useful = (numel + kThreads - 1) / kThreads;
  return static_cast<int>(std::clamp<int64_t>(std::min(wanted, useful), 1, 65535));
}

[[noreturn]] void reject(const std::string& what) {
  throw failure(error(errc::invalid_argument, "newton_schulz: " + what));
}

}  // namespace

ns_workspace::ns_workspace(cublasHandle_t cublas)
    : gemm_(cublas), own_gemm_device_(sm90_gemm_available()) {}

bool ns_workspace::own_gram_product(int64_t batch, int64_t m, int64_t n, bool tall) const {
  return own_gemm_ && own_gemm_device_ && !tall && sm90_gemm_suits_symmetric(batch, m, n);
}

bool ns_workspace::own_square_product(int64_t batch, int64_t m) const {
  return own_gemm_ && own_gemm_device_ && sm90_gemm_suits_symmetric(batch, m, m);
}

int64_t ns_workspace::bytes() const {
  int64_t total = static_cast<int64_t>(x_.bytes() + x_next_.bytes() + a_.bytes() + b_.bytes()
                                       + partial_sums_.bytes() + inv_norms_.bytes())
                  + gemm_.bytes();
  for (const auto& [key, pointers] : block_pointers_)
    total += static_cast<int64_t>(pointers.bytes());
  return total;
}

bool ns_workspace::graphs_wanted(int64_t batch, int64_t m, int64_t n) const {
  if (graphs_mode_ != graph_mode::automatic)
    return graphs_mode_ == graph_mode::on;
  // Where launches cost as much as the GEMMs: one NS5 of a 768x3072 matrix is 40 GFLOP.
  constexpr double kLaunchBoundFlops = 2e11;
  const auto md = static_cast<double>(m);
  const auto nd = static_cast<double>(n);
  return 5.0 * static_cast<double>(batch) * (4.0 * md * md * nd + 2.0 * md * md * md)
         <= kLaunchBoundFlops;
}

int64_t ns_workspace::symmetric_blocks(int64_t m, int64_t batch) const {
  // Block GEMMs of side 256 fit batches of 2048-sided Gram matrices. A single matrix needs
  // blocks of 512 to fill the device. Below 4 blocks' worth, the mirror copies and the smaller
  // GEMMs cost more than the FLOPs they save.
  constexpr int64_t kSmallBatch = 8;
  const int64_t min_side = batch < kSmallBatch ? 2 * symmetric_min_side_ : symmetric_min_side_;
  if (symmetric_min_side_ <= 0 || m < 4 * symmetric_min_side_)
    return 1;
  constexpr int64_t kMaxBlocks = 16;
  for (int64_t k = std::min(kMaxBlocks, m / min_side); k > 1; --k) {
    if (m % k == 0 && (m / k) % kTile == 0)
      return k;
  }
  return 1;
}

// Layout of the pointer arrays, P = batch * k(k+1)/2 block GEMMs per product, block (i, j),
// i >= j, of matrix q at index q * k(k+1)/2 + (i(i+1)/2 + j) within each run of P:
//   [0, 2P)   A = X X^T, operands X_i, X_j with X = x_     (cur is x_)
//   [2P, 4P)  the same with X = x_next_                       (cur is x_next_)
//   [4P, 5P)  A's block (i, j)                               (output of both)
//   [5P, 7P)  A*A's operands: A's row block i, column block j
//   [7P, 8P)  B's block (i, j)                               (output, beta * A's block in it)
void* const* ns_workspace::block_pointers(cudaStream_t stream, int64_t batch, int64_t m, int64_t n,
                                          bool tall, int64_t k) {
  std::vector<int64_t> key{batch, m, n, tall ? 1 : 0, k};
  auto found = block_pointers_.find(key);
  if (found != block_pointers_.end())
    return found->second.data();
  const int64_t per_matrix = k * (k + 1) / 2;
  const int64_t count = batch * per_matrix;
  const int64_t side = m / k;
  std::vector<void*> host(static_cast<size_t>(8 * count));
  auto at = [&](int64_t run, int64_t index) -> void*& {
    return host[static_cast<size_t>(run * count + index)];
  };
  for (int64_t q = 0; q < batch; ++q) {
    int64_t index = q * per_matrix;
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j <= i; ++j, ++index) {
        // Wide: block row i of X is column block i of Xc ([n, m], ld n); tall: row block i of
        // X ([m, n], ld m).
        const int64_t xi = q * m * n + (tall ? i * side : i * side * n);
        const int64_t xj = q * m * n + (tall ? j * side : j * side * n);
        for (int parity = 0; parity < 2; ++parity) {
          __nv_bfloat16* x = parity == 0 ? x_.data() : x_next_.data();
          at(2 * parity, index) = x + xi;
          at(2 * parity + 1, index) = x + xj;
        }
        const int64_t gram = q * m * m;
        at(4, index) = a_.data() + gram + j * side * m + i * side;
        at(5, index) = a_.data() + gram + i * side;      // row block i: [side, m], ld m
        at(6, index) = a_.data() + gram + j * side * m;  // column block j: [m, side], ld m
        at(7, index) = b_.data() + gram + j * side * m + i * side;
      }
    }
  }
  device_array<void*> pointers(static_cast<int64_t>(host.size()));
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(pointers.data(), host.data(), host.size() * sizeof(void*),
                                   cudaMemcpyHostToDevice, stream));
  ZMUON_CUDA_CHECK(cudaStreamSynchronize(stream));  // once per shape: `host` goes out of scope
  return block_pointers_.emplace(std::move(key), std::move(pointers)).first->second.data();
}

void ns_workspace::run(const launch_context& ctx, ns_io x, int64_t batch, int64_t rows,
                       int64_t cols, const ns_options& ns) {
  if (batch <= 0 || rows <= 0 || cols <= 0)
    return;
  // The wide view: X is [m, n] with m <= n, so that A = X X^T is the small Gram matrix.
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows;
  const int64_t n = tall ? rows : cols;
  if (n > INT_MAX || batch > INT_MAX)
    reject("matrix side or batch past cuBLAS's int range");
  const int64_t numel = m * n;

  bool moved = x_.reserve(batch * numel);
  moved |= x_next_.reserve(batch * numel);
  moved |= a_.reserve(batch * m * m);
  moved |= b_.reserve(batch * m * m);
  if (moved) {  // these point into the old buffers
    graphs_.clear();
    block_pointers_.clear();
  }
  partial_sums_.reserve(batch * slices_for(batch, numel, ctx.sm_count));
  inv_norms_.reserve(batch);

  // X = x / (||x||_F + eps), per matrix, in bf16.
  launch_normalize_to_bf16(ctx, x, batch, numel, static_cast<double>(ns.eps), partial_sums_.data(),
                           inv_norms_.data(), x_.data());

  // Outside any graph capture: the symmetric products' pointer arrays for this shape.
  const int64_t blocks = symmetric_blocks(m, batch);
  if (blocks > 1 && ns.steps > 0)
    block_pointers(ctx.stream, batch, m, n, tall, blocks);

  const graph_exec* graph = ns.steps > 0 && graphs_wanted(batch, m, n)
                                ? graph_for(ctx.stream, batch, m, n, tall, ns)
                                : nullptr;
  if (graph != nullptr) {
    graph->launch(ctx.stream);
    // Back in place (fp32 or bf16); the layout never changed.
    launch_ns_result(ctx, ns.steps % 2 == 0 ? x_.data() : x_next_.data(), batch * numel, x);
    return;
  }
  // bf16 in and out: the last iteration writes x itself (no copy back), unless A = X X^T runs
  // on block pointer arrays, which point into x_ and x_next_ only.
  const bool pointers_into_x = blocks > 1 && !own_gram_product(batch, m, n, tall);
  if (lands_in_caller_buffer(x) && ns.steps > 0 && !pointers_into_x) {
    iterate(ctx.stream, batch, m, n, tall, ns, x.bf16);
    return;
  }
  launch_ns_result(ctx, iterate(ctx.stream, batch, m, n, tall, ns), batch * numel, x);
}

__nv_bfloat16* ns_workspace::iterate(cudaStream_t stream, int64_t batch, int64_t m, int64_t n,
                                     bool tall, const ns_options& ns, __nv_bfloat16* out) {
  // In cuBLAS's column-major terms a wide row-major X is Xc = X^T ([n, m], ld n), and a tall
  // row-major input is X itself ([m, n], ld m).
  const int mi = static_cast<int>(m);
  const int ni = static_cast<int>(n);
  const int bi = static_cast<int>(batch);
  const int ld_x = tall ? mi : ni;
  const int64_t numel = m * n;
  const int64_t gram = m * m;
  // A = X X^T (wide: Xc^T Xc; tall: X X^T).
  const cublasOperation_t gram_a = tall ? CUBLAS_OP_N : CUBLAS_OP_T;
  const cublasOperation_t gram_b = tall ? CUBLAS_OP_T : CUBLAS_OP_N;
  const gemm_shape gram_shape{gram_a, gram_b, mi, mi, ni, ld_x, ld_x, mi, numel, numel, gram, bi};
  // B = c*A*A + b*A.
  const gemm_shape square_shape{CUBLAS_OP_N, CUBLAS_OP_N, mi,   mi,   mi,   mi,
                                mi,          mi,          gram, gram, gram, bi};
  // X' = B' X with B' = B + a*I (wide: Xc' = Xc B'^T; tall: X' = B' X). B' is symmetric, so
  // its operand may be read either way (set_update_flipped).
  const cublasOperation_t keep = CUBLAS_OP_N, flip = CUBLAS_OP_T;
  const cublasOperation_t b_op =
      tall ? (update_flipped_ ? flip : keep) : (update_flipped_ ? keep : flip);
  const gemm_shape update_shape =
      tall ? gemm_shape{b_op, CUBLAS_OP_N, mi, ni, mi, mi, mi, mi, gram, numel, numel, bi}
           : gemm_shape{CUBLAS_OP_N, b_op, ni, mi, mi, ni, mi, ni, numel, gram, numel, bi};
  // The symmetric products' block GEMMs: one pointer-array batched call per product.
  const int64_t k = symmetric_blocks(m, batch);
  void* const* pointers = k > 1 ? block_pointers(stream, batch, m, n, tall, k) : nullptr;
  const int count = static_cast<int>(batch * k * (k + 1) / 2);
  const int side = static_cast<int>(m / k);
  const gemm_shape gram_block{gram_a, gram_b, side, side, ni, ld_x, ld_x, mi, 0, 0, 0, count};
  const gemm_shape square_block{CUBLAS_OP_N, CUBLAS_OP_N, side, side, mi, mi,
                                mi,          mi,          0,    0,    0,  count};
  const dim3 tiles(static_cast<unsigned>(m / kTile), static_cast<unsigned>(m / kTile),
                   static_cast<unsigned>(batch));
  const dim3 tile_threads(kTile, kTileRows);
  auto run_of = [&](int run) { return pointers + static_cast<int64_t>(run) * count; };
  // The own GEMM's symmetric products (row-major terms: A and B are symmetric, so their layout
  // is cuBLAS's too): A = X X^T over X's rows, B = c*A*A + b*A over A's rows.
  const bool own_gram = own_gram_product(batch, m, n, tall);
  const bool own_square = own_square_product(batch, m);
  sm90_gemm_args own_a;
  own_a.batch = batch;
  own_a.m = own_a.n = m;
  own_a.k = n;
  own_a.d = {a_.data(), m, gram};
  own_a.symmetric = true;
  sm90_gemm_args own_b;
  own_b.batch = batch;
  own_b.m = own_b.n = own_b.k = m;
  own_b.p = own_b.q = own_b.c = {a_.data(), m, gram};
  own_b.d = {b_.data(), m, gram};
  own_b.symmetric = true;

  __nv_bfloat16* cur = x_.data();
  for (int step = 0; step < ns.steps; ++step) {
    __nv_bfloat16* const next = out != nullptr
                                    ? step_output(step + 1, ns.steps, out, x_next_.data())
                                    : (cur == x_.data() ? x_next_.data() : x_.data());
    // As the host backend: the schedule (if any) has ns.steps entries; the modulo only guards.
    const auto& abc = ns.schedule.empty()
                          ? ns.coefficients
                          : ns.schedule[static_cast<size_t>(step) % ns.schedule.size()];
    // A = X X^T.
    if (own_gram) {
      own_a.p = own_a.q = {cur, n, numel};
      sm90_gemm(stream, own_a);
    } else if (k > 1) {
      const int parity = cur == x_.data() ? 0 : 1;
      gemm_.run_pointers(stream, gram_block, 1.0f, run_of(2 * parity), run_of(2 * parity + 1), 0.0f,
                         run_of(4), count);
    } else {
      gemm_.run(stream, gram_shape, 1.0f, cur, cur, 0.0f, a_.data(), a_.data());
    }
    // B = c*A*A + b*A.
    if (own_square) {
      if (k > 1 && !own_gram) {  // A's upper blocks
        mirror_blocks_kernel<<<tiles, tile_threads, 0, stream>>>(a_.data(), m, side, nullptr);
        ZMUON_LAUNCH_CHECK();
      }
      own_b.alpha = abc[2];
      own_b.beta = abc[1];
      sm90_gemm(stream, own_b);
    } else if (k > 1) {
      // A's upper blocks, and A's lower blocks into B (the beta * A term of B's GEMM).
      mirror_blocks_kernel<<<tiles, tile_threads, 0, stream>>>(a_.data(), m, side, b_.data());
      ZMUON_LAUNCH_CHECK();
      gemm_.run_pointers(stream, square_block, abc[2], run_of(5), run_of(6), abc[1], run_of(7),
                         count);
      mirror_blocks_kernel<<<tiles, tile_threads, 0, stream>>>(b_.data(), m, side, nullptr);
      ZMUON_LAUNCH_CHECK();
    } else {
      gemm_.run(stream, square_shape, abc[2], a_.data(), a_.data(), abc[1], a_.data(), b_.data());
    }
    // B' = B + a*I, so that X' = B' X reads X once (as a GEMM operand, not again as its C).
    launch_add_to_diagonal(stream, b_.data(), m, batch, abc[0]);
    if (tall) {
      gemm_.run(stream, update_shape, 1.0f, b_.data(), cur, 0.0f, next, next);
    } else {
      gemm_.run(stream, update_shape, 1.0f, cur, b_.data(), 0.0f, next, next);
    }
    cur = next;
  }
  return cur;
}

const graph_exec* ns_workspace::graph_for(cudaStream_t stream, int64_t batch, int64_t m, int64_t n,
                                          bool tall, const ns_options& ns) {
  std::vector<int64_t> key{batch,
                           m,
                           n,
                           tall ? 1 : 0,
                           ns.steps,
                           symmetric_blocks(m, batch),
                           own_gram_product(batch, m, n, tall) ? 1 : 0,
                           own_square_product(batch, m) ? 1 : 0,
                           update_flipped_ ? 1 : 0};
  for (int step = 0; step < ns.steps; ++step) {
    const auto& abc = ns.schedule.empty()
                          ? ns.coefficients
                          : ns.schedule[static_cast<size_t>(step) % ns.schedule.size()];
    for (const float coefficient : abc) {
      uint32_t bits;
      std::memcpy(&bits, &coefficient, sizeof bits);
      key.push_back(bits);
    }
  }
  const auto found = graphs_.find(key);
  if (found == graphs_.end()) {
    // First sight: run directly (which also times the GEMMs' candidate algorithms, impossible
    // while capturing); the second call captures.
    if (graphs_.size() >= kMaxGraphs)
      graphs_.clear();
    graphs_.emplace(std::move(key), graph_exec());
    return nullptr;
  }
  if (!found->second.empty())
    return &found->second;
  graphs_.erase(found);

  cudaGraph_t graph = nullptr;
  ZMUON_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    iterate(stream, batch, m, n, tall, ns);
  } catch (...) {
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr)
      (void)cudaGraphDestroy(graph);
    throw;
  }
  ZMUON_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  ZMUON_CUDA_CHECK(status);
  return &graphs_.emplace(std::move(key), graph_exec(exec)).first->second;
}

// -- shared with the other NS evaluations (ns_normalize.hpp) -------------------------------------

int normalize_slices(int64_t batch, int64_t numel, int sm_count) {
  return slices_for(batch, numel, sm_count);
}

namespace {

template <int Width, class T>
void normalize_to_bf16(const launch_context& ctx, const T* x, int64_t batch, int64_t numel,
                       double eps, double* partial_sums, float* inv_norms, __nv_bfloat16* out) {
  // No more slices than normalize_slices(batch, numel) reserved room for.
  const int slices = slices_for(batch, numel / Width, ctx.sm_count);
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(slices));
  matrix_sum_squares_kernel<Width><<<grid, kThreads, 0, ctx.stream>>>(x, numel, partial_sums);
  ZMUON_LAUNCH_CHECK();
  matrix_inv_norm_kernel<<<static_cast<unsigned>(batch), kThreads, 0, ctx.stream>>>(
      partial_sums, slices, eps, inv_norms);
  ZMUON_LAUNCH_CHECK();
  to_bf16_scaled_kernel<Width><<<grid, kThreads, 0, ctx.stream>>>(x, numel, inv_norms, out);
  ZMUON_LAUNCH_CHECK();
}

template <class T>
void normalize_to_bf16(const launch_context& ctx, const T* x, int64_t batch, int64_t numel,
                       double eps, double* partial_sums, float* inv_norms, __nv_bfloat16* out) {
  // The same width for fp32 and bf16 inputs of the same layout: the sums' order, and so the
  // norms' bits, then agree (bf16 calls give the fp32 calls' bits: ns_normalize.hpp).
  if (vector_width(numel, {x, out}) == kWidth)
    normalize_to_bf16<kWidth>(ctx, x, batch, numel, eps, partial_sums, inv_norms, out);
  else
    normalize_to_bf16<1>(ctx, x, batch, numel, eps, partial_sums, inv_norms, out);
}

}  // namespace

void launch_normalize_to_bf16(const launch_context& ctx, ns_io x, int64_t batch, int64_t numel,
                              double eps, double* partial_sums, float* inv_norms,
                              __nv_bfloat16* out) {
  if (x.bf16 != nullptr)
    normalize_to_bf16(ctx, x.bf16, batch, numel, eps, partial_sums, inv_norms, out);
  else
    normalize_to_bf16(ctx, x.f32, batch, numel, eps, partial_sums, inv_norms, out);
}

void launch_add_to_diagonal(cudaStream_t stream, __nv_bfloat16* b, int64_t m, int64_t batch,
                            float a) {
  if (batch <= 0 || m <= 0)
    return;
  add_to_diagonal_kernel<<<grid_for(batch * m), kThreads, 0, stream>>>(b, m, batch * m, a);
  ZMUON_LAUNCH_CHECK();
}

void launch_ns_result(const launch_context& ctx, const __nv_bfloat16* result, int64_t n,
                      ns_io out) {
  if (n <= 0)
    return;
  if (out.bf16 != nullptr) {
    ZMUON_CUDA_CHECK(cudaMemcpyAsync(out.bf16, result, static_cast<size_t>(n) * sizeof(*result),
                                     cudaMemcpyDeviceToDevice, ctx.stream));
    return;
  }
  if (vector_width(n, {result, out.f32}) == kWidth)
    from_bf16_kernel<kWidth><<<grid_for(n / kWidth), kThreads, 0, ctx.stream>>>(result, n, out.f32);
  else
    from_bf16_kernel<1><<<grid_for(n), kThreads, 0, ctx.stream>>>(result, n, out.f32);
  ZMUON_LAUNCH_CHECK();
}

}  // namespace zmuon::gpu
