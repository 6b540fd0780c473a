// Cautious weight decay and NorMuon's row normalization on the device (cautious_normuon.cuh).
// One element per thread for the element-wise kernels; one block per row, then one block per
// block matrix, for the normalization. Sums of squares in double, as on the host.

#include "kernels/cuda/cautious_normuon.cuh"
#include "kernels/cuda/check.hpp"

#include <cmath>

namespace zmuon::gpu {
namespace {

__device__ inline int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__global__ void apply_update_cautious_kernel(float* __restrict__ p, const float* __restrict__ o,
                                             int64_t n, float coeff, float step) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float pi = p[i];
    const float oi = o[i];
    const float decay = __fmul_rn(pi, oi) >= 0.0f ? __fmul_rn(coeff, pi) : 0.0f;
    p[i] = __fsub_rn(__fsub_rn(pi, decay), __fmul_rn(step, oi));
  }
}

struct cautious_adamw_factors {
  float beta1, beta2, eps, coeff, step_size, inv_sqrt_bc2;
};

__global__ void adamw_cautious_kernel(float* __restrict__ p, const float* __restrict__ g,
                                      float* __restrict__ m, float* __restrict__ v, int64_t n,
                                      cautious_adamw_factors f) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float gi = g[i];
    const float mi = __fmaf_rn(f.beta1, m[i], __fmul_rn(1.0f - f.beta1, gi));
    const float vi = __fmaf_rn(f.beta2, v[i], __fmul_rn(__fmul_rn(1.0f - f.beta2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    const float denominator = __fadd_rn(__fmul_rn(sqrtf(vi), f.inv_sqrt_bc2), f.eps);
    const float dir = __fdiv_rn(mi, denominator);
    const float pi = p[i];
    const float decay = __fmul_rn(pi, dir) >= 0.0f ? __fmul_rn(f.coeff, pi) : 0.0f;
    p[i] = __fsub_rn(__fsub_rn(pi, decay), __fdiv_rn(__fmul_rn(f.step_size, mi), denominator));
  }
}

/// Block-wide sum of one double per thread (kThreads threads); every thread gets the total.
__device__ double block_sum(double x) {
  __shared__ double partial[kThreads];
  partial[threadIdx.x] = x;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = partial[0];
  __syncthreads();
  return total;
}

/// One block per row: v = beta2*v + (1-beta2)*mean(o^2); o /= sqrt(v) + eps; the row's sums of
/// squares before and after go to scratch[row] and scratch[rows_total + row].
__global__ void normuon_row_kernel(float* __restrict__ x, float* __restrict__ v, int64_t cols,
                                   int64_t rows_total, float beta2, float eps,
                                   double* __restrict__ scratch) {
  const int64_t row = blockIdx.x;
  float* r = x + row * cols;
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    sum += static_cast<double>(r[j]) * r[j];
  sum = block_sum(sum);
  const float vi = __fmaf_rn(
      beta2, v[row], __fmul_rn(1.0f - beta2, static_cast<float>(sum / static_cast<double>(cols))));
  const float inv = __fdiv_rn(1.0f, __fadd_rn(sqrtf(vi), eps));
  double after = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float y = __fmul_rn(r[j], inv);
    r[j] = y;
    after += static_cast<double>(y) * y;
  }
  after = block_sum(after);
  if (threadIdx.x == 0) {
    v[row] = vi;
    scratch[row] = sum;
    scratch[rows_total + row] = after;
  }
}

/// One block per block matrix: its elements times ||before||_F / max(||after||_F, 1e-8).
__global__ void normuon_rescale_kernel(float* __restrict__ x, int64_t rows, int64_t cols,
                                       int64_t rows_total, const double* __restrict__ scratch) {
  const int64_t b = blockIdx.x;
  double before = 0.0, after = 0.0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    before += scratch[b * rows + i];
    after += scratch[rows_total + b * rows + i];
  }
  before = block_sum(before);
  after = block_sum(after);
  const auto factor = static_cast<float>(sqrt(before) / fmax(sqrt(after), 1e-8));
  float* m = x + b * rows * cols;
  for (int64_t k = threadIdx.x; k < rows * cols; k += blockDim.x)
    m[k] = __fmul_rn(m[k], factor);
}

}  // namespace

void launch_apply_update_cautious(const launch_context& ctx, float* p, const float* o, int64_t n,
                                  float lr, float scale, float weight_decay) {
  if (n <= 0)
    return;
  apply_update_cautious_kernel<<<grid_for(n), kThreads, 0, ctx.stream>>>(p, o, n, lr * weight_decay,
                                                                         lr * scale);
  ZMUON_LAUNCH_CHECK();
}

void launch_adamw_cautious(const launch_context& ctx, float* p, const float* g, float* m, float* v,
                           int64_t n, const scalar_args& args) {
  if (n <= 0)
    return;
  // The bias corrections in double on the host, as the host backend forms them.
  const double t = static_cast<double>(args.step < 1 ? 1 : args.step);
  cautious_adamw_factors f{};
  f.beta1 = args.beta1;
  f.beta2 = args.beta2;
  f.eps = args.eps;
  f.coeff = args.lr * args.weight_decay;
  f.step_size = static_cast<float>(args.lr / (1.0 - std::pow(static_cast<double>(args.beta1), t)));
  f.inv_sqrt_bc2 =
      static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(args.beta2), t)));
  adamw_cautious_kernel<<<grid_for(n), kThreads, 0, ctx.stream>>>(p, g, m, v, n, f);
  ZMUON_LAUNCH_CHECK();
}

void launch_normuon_rows(const launch_context& ctx, float* x, float* v, int64_t batch, int64_t rows,
                         int64_t cols, float beta2, float eps, double* scratch) {
  const int64_t rows_total = batch * rows;
  if (rows_total <= 0 || cols <= 0)
    return;
  normuon_row_kernel<<<static_cast<unsigned>(rows_total), kThreads, 0, ctx.stream>>>(
      x, v, cols, rows_total, beta2, eps, scratch);
  ZMUON_LAUNCH_CHECK();
  normuon_rescale_kernel<<<static_cast<unsigned>(batch), kThreads, 0, ctx.stream>>>(
      x, rows, cols, rows_total, scratch);
  ZMUON_LAUNCH_CHECK();
}

}  // namespace zmuon::gpu
