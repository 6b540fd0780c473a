// Newton-Schulz iteration with cuBLAS (see newton_schulz.hpp), and its three small kernels: the
// per-matrix sum of squares, the per-matrix 1/(||X||_F + eps), and the fp32 <-> bf16 passes.

#include "kernels/cuda/newton_schulz.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/reduce.cuh"

namespace zmuon::gpu {
namespace {

/// Graphs kept per workspace; a run of more distinct shapes than this starts the cache afresh.
constexpr size_t kMaxGraphs = 64;

// Grids of the per-matrix kernels: blockIdx.x is the matrix, blockIdx.y a slice of it that
// grid-strides over the matrix's elements.
__global__ void matrix_sum_squares_kernel(const float* __restrict__ x, int64_t numel,
                                          double* __restrict__ partial_sums) {
  const float* xm = x + static_cast<int64_t>(blockIdx.x) * numel;
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  double sum = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < numel;
       i += stride) {
    const double v = __ldg(xm + i);
    sum += v * v;
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

__global__ void to_bf16_scaled_kernel(const float* __restrict__ x, int64_t numel,
                                      const float* __restrict__ inv_norms,
                                      __nv_bfloat16* __restrict__ out) {
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * numel;
  const float factor = inv_norms[blockIdx.x];
  const int64_t stride = static_cast<int64_t>(gridDim.y) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < numel;
       i += stride)
    out[offset + i] = __float2bfloat16_rn(x[offset + i] * factor);
}

__global__ void from_bf16_kernel(const __nv_bfloat16* __restrict__ in, int64_t n,
                                 float* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __bfloat162float(in[i]);
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

void ns_workspace::run(const launch_context& ctx, float* x, int64_t batch, int64_t rows,
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
  if (moved)
    graphs_.clear();  // they point into the old buffers
  const int slices = slices_for(batch, numel, ctx.sm_count);
  partial_sums_.reserve(batch * slices);
  inv_norms_.reserve(batch);

  // X = x / (||x||_F + eps), per matrix, in bf16.
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(slices));
  matrix_sum_squares_kernel<<<grid, kThreads, 0, ctx.stream>>>(x, numel, partial_sums_.data());
  ZMUON_LAUNCH_CHECK();
  matrix_inv_norm_kernel<<<static_cast<unsigned>(batch), kThreads, 0, ctx.stream>>>(
      partial_sums_.data(), slices, static_cast<double>(ns.eps), inv_norms_.data());
  ZMUON_LAUNCH_CHECK();
  to_bf16_scaled_kernel<<<grid, kThreads, 0, ctx.stream>>>(x, numel, inv_norms_.data(), x_.data());
  ZMUON_LAUNCH_CHECK();

  __nv_bfloat16* result = nullptr;
  if (use_graphs_ && ns.steps > 0) {
    graph_for(ctx.stream, batch, m, n, tall, ns).launch(ctx.stream);
    result = ns.steps % 2 == 0 ? x_.data() : x_next_.data();
  } else {
    result = iterate(ctx.stream, batch, m, n, tall, ns);
  }

  // Back to fp32, in place; the layout never changed.
  from_bf16_kernel<<<grid_for(batch * numel), kThreads, 0, ctx.stream>>>(result, batch * numel, x);
  ZMUON_LAUNCH_CHECK();
}

__nv_bfloat16* ns_workspace::iterate(cudaStream_t stream, int64_t batch, int64_t m, int64_t n,
                                     bool tall, const ns_options& ns) {
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
  // X' = B*X + a*X (wide: Xc' = Xc B^T + a*Xc; tall: X' = B X + a*X).
  const gemm_shape update_shape =
      tall ? gemm_shape{CUBLAS_OP_N, CUBLAS_OP_N, mi, ni, mi, mi, mi, mi, gram, numel, numel, bi}
           : gemm_shape{CUBLAS_OP_N, CUBLAS_OP_T, ni, mi, mi, ni, mi, ni, numel, gram, numel, bi};
  __nv_bfloat16* cur = x_.data();
  __nv_bfloat16* next = x_next_.data();
  for (int step = 0; step < ns.steps; ++step) {
    // As the host backend: the schedule (if any) has ns.steps entries; the modulo only guards.
    const auto& abc = ns.schedule.empty()
                          ? ns.coefficients
                          : ns.schedule[static_cast<size_t>(step) % ns.schedule.size()];
    gemm_.run(stream, gram_shape, 1.0f, cur, cur, 0.0f, a_.data(), a_.data());
    gemm_.run(stream, square_shape, abc[2], a_.data(), a_.data(), abc[1], a_.data(), b_.data());
    if (tall) {
      gemm_.run(stream, update_shape, 1.0f, b_.data(), cur, abc[0], cur, next);
    } else {
      gemm_.run(stream, update_shape, 1.0f, cur, b_.data(), abc[0], cur, next);
    }
    std::swap(cur, next);
  }
  return cur;
}

const graph_exec& ns_workspace::graph_for(cudaStream_t stream, int64_t batch, int64_t m, int64_t n,
                                          bool tall, const ns_options& ns) {
  std::vector<int64_t> key{batch, m, n, tall ? 1 : 0, ns.steps};
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
  if (found != graphs_.end())
    return found->second;
  if (graphs_.size() >= kMaxGraphs)
    graphs_.clear();

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
  return graphs_.emplace(std::move(key), graph_exec(exec)).first->second;
}

}  // namespace zmuon::gpu

// -- shared with the other NS evaluations (ns_normalize.hpp) -------------------------------------

#include "kernels/cuda/ns_normalize.hpp"  // here, so that this addition stays one block

namespace zmuon::gpu {

int normalize_slices(int64_t batch, int64_t numel, int sm_count) {
  return slices_for(batch, numel, sm_count);
}

void launch_normalize_to_bf16(const launch_context& ctx, const float* x, int64_t batch,
                              int64_t numel, double eps, double* partial_sums, float* inv_norms,
                              __nv_bfloat16* out) {
  const int slices = slices_for(batch, numel, ctx.sm_count);
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(slices));
  matrix_sum_squares_kernel<<<grid, kThreads, 0, ctx.stream>>>(x, numel, partial_sums);
  ZMUON_LAUNCH_CHECK();
  matrix_inv_norm_kernel<<<static_cast<unsigned>(batch), kThreads, 0, ctx.stream>>>(
      partial_sums, slices, eps, inv_norms);
  ZMUON_LAUNCH_CHECK();
  to_bf16_scaled_kernel<<<grid, kThreads, 0, ctx.stream>>>(x, numel, inv_norms, out);
  ZMUON_LAUNCH_CHECK();
}

void launch_from_bf16(const launch_context& ctx, const __nv_bfloat16* in, int64_t n, float* out) {
  from_bf16_kernel<<<grid_for(n), kThreads, 0, ctx.stream>>>(in, n, out);
  ZMUON_LAUNCH_CHECK();
}

}  // namespace zmuon::gpu
