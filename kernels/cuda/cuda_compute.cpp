// The CUDA compute backend: stream, cuBLAS handle and scratch ownership, and the
// compute_backend calls, each a thin wrapper over a launcher of elementwise.cu or newton_schulz.cu.

#include "kernels/cuda/cuda_compute.hpp"

#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/ns_variants.hpp"

namespace zmuon::gpu {
namespace {

/// cuBLAS's own recommendation on Hopper; given explicitly so that no GEMM allocates.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

void release_device_floats(float* p) {
  if (p != nullptr)
    (void)cudaFree(p);
}

int set_device(int device) {
  ZMUON_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

int multiprocessor_count(int device) {
  int count = 0;
  ZMUON_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

}  // namespace

cuda_compute::cuda_compute(int device)
    : device_(set_device(device)),
      cublas_workspace_(static_cast<int64_t>(kCublasWorkspaceBytes)),
      partial_sums_(kMaxReduceBlocks),
      partial_flags_(kMaxReduceBlocks),
      result_(1),
      ns_(cublas_.get()),
      gram_ns_(cublas_.get()) {
  ctx_.stream = stream_.get();
  ctx_.sm_count = multiprocessor_count(device_);
  ZMUON_CUBLAS_CHECK(cublasSetStream(cublas_.get(), stream_.get()));
  ZMUON_CUBLAS_CHECK(
      cublasSetWorkspace(cublas_.get(), cublas_workspace_.data(), cublas_workspace_.bytes()));
  // Only the explicit compute type of each GEMM decides its precision (bf16 in, fp32 sums).
  ZMUON_CUBLAS_CHECK(cublasSetMathMode(cublas_.get(), CUBLAS_DEFAULT_MATH));
}

cuda_compute::~cuda_compute() {
  // Work still queued may use the workspace that the members free next.
  (void)cudaSetDevice(device_);
  (void)cudaStreamSynchronize(stream_.get());
}

cuda_compute::launch_guard cuda_compute::activate() const {
  launch_guard guard{std::unique_lock<std::mutex>(mutex_), ctx_};
  ZMUON_CUDA_CHECK(cudaSetDevice(device_));
  return guard;
}

// -- memory --------------------------------------------------------------------------------------

device_buffer cuda_compute::allocate(int64_t n) {
  if (n <= 0)
    return device_buffer{};
  const launch_guard guard = activate();
  float* data = nullptr;
  ZMUON_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&data), static_cast<size_t>(n) * sizeof(float)));
  device_buffer buffer(data, n, &release_device_floats);
  // Stream-ordered: every user of this backend's buffers (its actors, the nccl comm) enqueues on
  // the same stream, so the zeros land before any later use; nothing waits.
  ZMUON_CUDA_CHECK(cudaMemsetAsync(data, 0, static_cast<size_t>(n) * sizeof(float), ctx_.stream));
  return buffer;
}

void cuda_compute::copy_from_host(float* dst, const float* host_src, int64_t n) {
  if (n <= 0)
    return;
  const launch_guard guard = activate();
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, static_cast<size_t>(n) * sizeof(float),
                                   cudaMemcpyHostToDevice, ctx_.stream));
  stream_.synchronize();
}

void cuda_compute::copy_to_host(float* host_dst, const float* src, int64_t n) {
  if (n <= 0)
    return;
  const launch_guard guard = activate();
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, static_cast<size_t>(n) * sizeof(float),
                                   cudaMemcpyDeviceToHost, ctx_.stream));
  stream_.synchronize();
}

void cuda_compute::copy(float* dst, const float* src, int64_t n) {
  if (n <= 0 || dst == src)
    return;
  const launch_guard guard = activate();
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, ctx_.stream));
}

void cuda_compute::fill_zero(float* x, int64_t n) {
  if (n <= 0)
    return;
  const launch_guard guard = activate();
  ZMUON_CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<size_t>(n) * sizeof(float), ctx_.stream));
}

// -- element-wise --------------------------------------------------------------------------------

void cuda_compute::add(float* dst, const float* src, int64_t n) {
  launch_add(activate(), dst, src, n);
}

void cuda_compute::scale(float* x, int64_t n, float factor) {
  launch_scale(activate(), x, n, factor);
}

reduction cuda_compute::reduce(const float* x, int64_t n) {
  if (n <= 0)
    return reduction{0.0, 0};
  const reduction_scratch scratch{partial_sums_.data(), partial_flags_.data(), result_.data()};
  const launch_guard guard = activate();
  launch_sum_squares(guard, x, n, scratch);
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(host_result_.get(), result_.data(), sizeof(reduction),
                                   cudaMemcpyDeviceToHost, ctx_.stream));
  stream_.synchronize();
  return *host_result_.get();
}

scan_result cuda_compute::scan(const float* x, int64_t n) {
  const reduction r = reduce(x, n);
  scan_result result;
  result.sum_squares = r.sum_squares;
  result.nonfinite = r.nonfinite != 0 || !std::isfinite(r.sum_squares);
  return result;
}

double cuda_compute::frobenius_norm(const float* x, int64_t n) {
  return std::sqrt(reduce(x, n).sum_squares);
}

void cuda_compute::momentum(float* m, const float* g, float* u, int64_t n, float beta,
                            bool nesterov) {
  launch_momentum(activate(), m, g, u, n, beta, nesterov);
}

void cuda_compute::apply_update(float* p, const float* o, int64_t n, float lr, float scale,
                                float weight_decay) {
  launch_apply_update(activate(), p, o, n, lr, scale, weight_decay);
}

void cuda_compute::adamw(float* p, const float* g, float* m, float* v, int64_t n,
                         const adamw_args& args) {
  launch_adamw(activate(), p, g, m, v, n, args);
}

// -- Newton-Schulz -------------------------------------------------------------------------------

void cuda_compute::newton_schulz(float* x, int64_t batch, int64_t rows, int64_t cols,
                                 const ns_options& ns) {
  if (batch <= 0)
    return;
  if (ns_uses_gram(ns, rows, cols)) {
    gram_ns_.run(activate(), x, batch, rows, cols, ns);
  } else {
    ns_.run(activate(), x, batch, rows, cols, ns);
  }
  ns_matrices_ += batch;
}

// -- completion without waiting
// --------------------------------------------------------------------

namespace {

void CUDART_CB run_callback(void* data) {
  std::unique_ptr<std::function<void()>> done(static_cast<std::function<void()>*>(data));
  (*done)();
}

void release_pinned_floats(float* p) {
  if (p != nullptr)
    (void)cudaFreeHost(p);
}

// A scan's result on its way to the caller's scan_result.
struct scan_landing {
  reduction* pinned;
  scan_result* out;
};

void CUDART_CB land_scan(void* data) {
  std::unique_ptr<scan_landing> landing(static_cast<scan_landing*>(data));
  landing->out->sum_squares = landing->pinned->sum_squares;
  landing->out->nonfinite =
      landing->pinned->nonfinite != 0 || !std::isfinite(landing->pinned->sum_squares);
}

}  // namespace

void cuda_compute::when_done(std::function<void()> done) {
  const launch_guard guard = activate();
  auto callback = std::make_unique<std::function<void()>>(std::move(done));
  ZMUON_CUDA_CHECK(cudaLaunchHostFunc(ctx_.stream, run_callback, callback.get()));
  callback.release();  // run_callback owns it now
}

void cuda_compute::scan_async(const float* x, int64_t n, scan_result* out) {
  if (n <= 0) {
    *out = scan_result{};
    return;
  }
  const launch_guard guard = activate();
  const reduction_scratch scratch{partial_sums_.data(), partial_flags_.data(), result_.data()};
  launch_sum_squares(guard, x, n, scratch);
  // The pinned landing place is reused by the next scan; the stream orders copy, then callback.
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(host_result_.get(), result_.data(), sizeof(reduction),
                                   cudaMemcpyDeviceToHost, ctx_.stream));
  auto landing = std::make_unique<scan_landing>(scan_landing{host_result_.get(), out});
  ZMUON_CUDA_CHECK(cudaLaunchHostFunc(ctx_.stream, land_scan, landing.get()));
  landing.release();
}

device_buffer cuda_compute::allocate_host(int64_t n) {
  if (n <= 0)
    return device_buffer{};
  const launch_guard guard = activate();
  float* data = nullptr;
  ZMUON_CUDA_CHECK(
      cudaMallocHost(reinterpret_cast<void**>(&data), static_cast<size_t>(n) * sizeof(float)));
  std::memset(data, 0, static_cast<size_t>(n) * sizeof(float));
  return device_buffer(data, n, &release_pinned_floats);
}

void cuda_compute::copy_to_host_async(float* host_dst, const float* src, int64_t n) {
  if (n <= 0)
    return;
  const launch_guard guard = activate();
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, static_cast<size_t>(n) * sizeof(float),
                                   cudaMemcpyDeviceToHost, ctx_.stream));
}

void cuda_compute::copy_from_host_async(float* dst, const float* host_src, int64_t n) {
  if (n <= 0)
    return;
  const launch_guard guard = activate();
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, static_cast<size_t>(n) * sizeof(float),
                                   cudaMemcpyHostToDevice, ctx_.stream));
}

void cuda_compute::synchronize() {
  const launch_guard guard = activate();
  stream_.synchronize();
}

}  // namespace zmuon::gpu

namespace zmuon {

expected<std::unique_ptr<compute_backend>> make_cuda_compute_backend(int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return error(errc::invalid_argument,
                 "compute backend 'cuda': no CUDA device: "
                     + (status != cudaSuccess ? gpu::describe(status)
                                              : std::string("cudaGetDeviceCount found none")));
  }
  if (device < 0 || device >= count) {
    return error(errc::invalid_argument, "compute backend 'cuda': device " + std::to_string(device)
                                             + " does not exist (" + std::to_string(count)
                                             + " found)");
  }
  try {
    cudaDeviceProp prop{};
    ZMUON_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (prop.major < 9) {
      return error(errc::invalid_argument,
                   "compute backend 'cuda': device " + std::to_string(device) + " (" + prop.name
                       + ") has compute capability " + std::to_string(prop.major) + "."
                       + std::to_string(prop.minor) + "; zmuon is built for sm_90 (Hopper)");
    }
    auto backend = std::make_unique<gpu::cuda_compute>(device);
    // A first kernel: a missing kernel image or a broken context shows up here, not mid-step.
    device_buffer probe = backend->allocate(1);
    backend->scale(probe.data(), 1, 2.0f);
    backend->synchronize();
    return std::unique_ptr<compute_backend>(std::move(backend));
  } catch (const std::exception& e) {
    error err = gpu::to_error(e);
    return error(err.code(), "compute backend 'cuda': " + err.message());
  }
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

expected<std::unique_ptr<compute_backend>> make_cuda_compute_backend() {
  int device = 0;
  const cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return error(errc::invalid_argument,
                 "compute backend 'cuda': no CUDA device: " + gpu::describe(status));
  }
  return make_cuda_compute_backend(device);
}

}  // namespace zmuon
