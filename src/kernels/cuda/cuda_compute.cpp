// The CUDA compute backend: stream, cuBLAS handle and scratch ownership, and the
// compute_backend calls, each a thin wrapper over a launcher of elementwise.cu or newton_schulz.cu.

#include "kernels/cuda/cuda_compute.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "kernels/cuda/cautious_normuon.cuh"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/pinned_cache.hpp"
#include "kernels/ns_variants.hpp"

namespace zmuon::gpu {
namespace {

/// cuBLAS's own recommendation on Hopper; given explicitly so that no GEMM allocates.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

int set_device(int device) {
  ZMUON_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

int multiprocessor_count(int device) {
  int count = 0;
  ZMUON_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

/// The memory of n floats, or of n bf16 values, at p (what a call names: stream_set.hpp).
touched floats(const void* p, int64_t n) {
  return touched{p, static_cast<size_t>(n) * sizeof(float)};
}
touched halves(const void* p, int64_t n) {
  return touched{p, static_cast<size_t>(n) * sizeof(uint16_t)};
}

/// Device memory comes from the device's default stream-ordered pool (cudaMallocAsync /
/// cudaFreeAsync on the rank's stream): a buffer released while work that uses it is still
/// queued goes back to the pool only when the stream gets there, and nothing synchronizes the
/// device (cudaFree does). The pool keeps what it got instead of returning it at every
/// synchronization, so a steady step allocates from the pool, not from the driver.
void keep_pool_memory(int device) {
  cudaMemPool_t pool = nullptr;
  ZMUON_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t threshold = UINT64_MAX;
  ZMUON_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
}

}  // namespace

cuda_compute::ns_lane::ns_lane(cudaStream_t stream)
    : cublas_workspace(static_cast<int64_t>(kCublasWorkspaceBytes)),
      ns(cublas.get()),
      gram_ns(cublas.get()) {
  ZMUON_CUBLAS_CHECK(cublasSetStream(cublas.get(), stream));
  ZMUON_CUBLAS_CHECK(
      cublasSetWorkspace(cublas.get(), cublas_workspace.data(), cublas_workspace.bytes()));
  // Only the explicit compute type of each GEMM decides its precision (bf16 in, fp32 sums).
  ZMUON_CUBLAS_CHECK(cublasSetMathMode(cublas.get(), CUBLAS_DEFAULT_MATH));
}

cuda_compute::cuda_compute(int device)
    : device_(set_device(device)),
      streams_(std::make_shared<stream_set>()),
      pinned_cache_(std::make_shared<pinned_cache>()),
      partial_sums_(kMaxReduceBlocks),
      partial_flags_(kMaxReduceBlocks),
      result_(1),
      watcher_(device_) {
  ctx_.stream = streams_->main();
  ctx_.sm_count = multiprocessor_count(device_);
  keep_pool_memory(device_);
  for (int i = 0; i < stream_set::kLanes; ++i)
    lanes_[i] = std::make_unique<ns_lane>(streams_->lane_stream(i));
}

cuda_compute::~cuda_compute() {
  // Work still queued may use the workspaces that the members free next.
  (void)cudaSetDevice(device_);
  try {
    streams_->synchronize();
    read_timed_calls(true);   // the trace's last calls
  } catch (const failure&) {  // a broken context: nothing left to wait for
  }
}

cuda_compute::launch_guard cuda_compute::activate() const {
  launch_guard guard{std::unique_lock<std::mutex>(mutex_), ctx_};
  ZMUON_CUDA_CHECK(cudaSetDevice(device_));
  streams_->join();
  streams_->forget_marks();  // what follows names no memory
  return guard;
}

cuda_compute::launch_guard cuda_compute::activate(std::initializer_list<touched> memory) const {
  launch_guard guard{std::unique_lock<std::mutex>(mutex_), ctx_, streams_.get(), memory};
  ZMUON_CUDA_CHECK(cudaSetDevice(device_));
  streams_->join_touching(memory);
  return guard;
}

// -- memory --------------------------------------------------------------------------------------

device_buffer cuda_compute::allocate(int64_t n) {
  return allocate_on_stream(n, true);
}

device_buffer cuda_compute::allocate_for_overwrite(int64_t n) {
  return allocate_on_stream(n, false);
}

device_buffer cuda_compute::allocate_on_stream(int64_t n, bool zero) {
  if (n <= 0)
    return device_buffer{};
  const launch_guard guard = activate({});  // fresh memory: no lane uses it
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  float* data = nullptr;
  ZMUON_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data), bytes, ctx_.stream));
  meter_->allocated(static_cast<int64_t>(bytes));
  // Released on the same stream (see keep_pool_memory), from whichever thread drops it last.
  device_buffer buffer(data, n,
                       [streams = streams_, device = device_, meter = meter_, bytes](float* p) {
                         (void)cudaSetDevice(device);
                         try {  // after any lane work that may still use p
                           (void)cudaFreeAsync(p, streams->touching({{p, bytes}}));
                         } catch (const failure&) {  // a broken context: the memory is gone
                         }
                         meter->released(static_cast<int64_t>(bytes));
                       });
  // Stream-ordered: every user of this backend's buffers (its actors, the nccl comm) enqueues on
  // the main stream or forks from it after the allocation and its zeros (marked: the pool may
  // hand out memory that older marks still name); nothing waits.
  if (zero) {
    const call_timer timer(*this, "allocate", ctx_.stream);
    ZMUON_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, ctx_.stream));
  }
  streams_->main_done(std::initializer_list<touched>{{data, bytes}});
  return buffer;
}

void cuda_compute::copy_from_host(float* dst, const float* host_src, int64_t n) {
  if (n <= 0)
    return;
  const launch_guard guard = activate();
  {
    const call_timer timer(*this, "copy_from_host", ctx_.stream);
    ZMUON_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, static_cast<size_t>(n) * sizeof(float),
                                     cudaMemcpyHostToDevice, ctx_.stream));
  }
  streams_->synchronize();
}

void cuda_compute::copy_to_host(float* host_dst, const float* src, int64_t n) {
  if (n <= 0)
    return;
  const launch_guard guard = activate();
  {
    const call_timer timer(*this, "copy_to_host", ctx_.stream);
    ZMUON_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, static_cast<size_t>(n) * sizeof(float),
                                     cudaMemcpyDeviceToHost, ctx_.stream));
  }
  streams_->synchronize();
}

void cuda_compute::copy(float* dst, const float* src, int64_t n) {
  if (n <= 0 || dst == src)
    return;
  const launch_guard guard = activate({floats(dst, n), floats(src, n)});
  const call_timer timer(*this, "copy", ctx_.stream);
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, ctx_.stream));
}

void cuda_compute::copy_boxes(void* dst, const void* src, int64_t cols,
                              const std::vector<matrix_box>& boxes, int elem_bytes, bool to_boxes) {
  int64_t n = 0;
  for (const matrix_box& b : boxes)
    n += b.rows * b.cols;
  if (n <= 0)
    return;
  const auto e = static_cast<size_t>(elem_bytes);
  const launch_guard guard = activate({touched{dst, n * e}, touched{src, n * e}});
  const call_timer timer(*this, "copy_boxes", ctx_.stream);
  auto* natural = static_cast<char*>(to_boxes ? const_cast<void*>(src) : dst);
  auto* packed = static_cast<char*>(to_boxes ? dst : const_cast<void*>(src));
  const size_t pitch = static_cast<size_t>(cols) * e;
  for (const matrix_box& b : boxes) {
    char* at = natural + static_cast<size_t>(b.row0 * cols + b.col0) * e;
    const size_t width = static_cast<size_t>(b.cols) * e;
    if (to_boxes)
      ZMUON_CUDA_CHECK(cudaMemcpy2DAsync(packed, width, at, pitch, width, b.rows,
                                         cudaMemcpyDeviceToDevice, ctx_.stream));
    else
      ZMUON_CUDA_CHECK(cudaMemcpy2DAsync(at, pitch, packed, width, width, b.rows,
                                         cudaMemcpyDeviceToDevice, ctx_.stream));
    packed += width * b.rows;
  }
}

void cuda_compute::fill_zero(float* x, int64_t n) {
  if (n <= 0)
    return;
  const launch_guard guard = activate({floats(x, n)});
  const call_timer timer(*this, "fill_zero", ctx_.stream);
  ZMUON_CUDA_CHECK(cudaMemsetAsync(x, 0, static_cast<size_t>(n) * sizeof(float), ctx_.stream));
}

// -- element-wise --------------------------------------------------------------------------------

void cuda_compute::add(float* dst, const float* src, int64_t n) {
  const launch_guard guard = activate({floats(dst, n), floats(src, n)});
  const call_timer timer(*this, "add", ctx_.stream);
  launch_add(guard, dst, src, n);
}

void cuda_compute::scale(float* x, int64_t n, float factor) {
  const launch_guard guard = activate({floats(x, n)});
  const call_timer timer(*this, "scale", ctx_.stream);
  launch_scale(guard, x, n, factor);
}

void cuda_compute::to_bf16(uint16_t* dst, const float* src, int64_t n) {
  const launch_guard guard = activate({halves(dst, n), floats(src, n)});
  const call_timer timer(*this, "to_bf16", ctx_.stream);
  launch_to_bf16(guard, dst, src, n);
}

void cuda_compute::from_bf16(float* dst, const uint16_t* src, int64_t n) {
  const launch_guard guard = activate({floats(dst, n), halves(src, n)});
  const call_timer timer(*this, "from_bf16", ctx_.stream);
  launch_from_bf16(guard, dst, src, n);
}

reduction cuda_compute::reduce(const float* x, int64_t n) {
  if (n <= 0)
    return reduction{0.0, 0};
  const reduction_scratch scratch{partial_sums_.data(), partial_flags_.data(), result_.data()};
  const launch_guard guard = activate();
  {
    const call_timer timer(*this, "scan", ctx_.stream);
    launch_sum_squares(guard, x, n, scratch);
  }
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(host_result_.get(), result_.data(), sizeof(reduction),
                                   cudaMemcpyDeviceToHost, ctx_.stream));
  streams_->synchronize();
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
  const launch_guard guard = activate({floats(m, n), floats(g, n), floats(u, n)});
  const call_timer timer(*this, "momentum", ctx_.stream);
  launch_momentum(guard, m, g, u, n, beta, nesterov);
}

void cuda_compute::apply_update(float* p, const float* o, int64_t n, float lr, float scale,
                                float weight_decay) {
  const launch_guard guard = activate({floats(p, n), floats(o, n)});
  const call_timer timer(*this, "apply_update", ctx_.stream);
  launch_apply_update(guard, p, o, n, lr, scale, weight_decay);
}

void cuda_compute::momentum_to_bf16(float* m, const float* g, uint16_t* u, int64_t n, float beta,
                                    bool nesterov) {
  const launch_guard guard = activate({floats(m, n), floats(g, n), halves(u, n)});
  const call_timer timer(*this, "momentum", ctx_.stream);
  launch_momentum(guard, m, g, u, n, beta, nesterov);
}

void cuda_compute::apply_update_bf16(float* p, const uint16_t* o, int64_t n, float lr, float scale,
                                     float weight_decay) {
  const launch_guard guard = activate({floats(p, n), halves(o, n)});
  const call_timer timer(*this, "apply_update", ctx_.stream);
  launch_apply_update(guard, p, o, n, lr, scale, weight_decay);
}

void cuda_compute::scalar_update(float* p, const float* g, float* m, float* v, int64_t n,
                                 const scalar_args& args) {
  const launch_guard guard = activate({floats(p, n), floats(g, n), floats(m, n), floats(v, n)});
  const call_timer timer(*this, "adamw", ctx_.stream);  // the non-Muon group's call, any rule
  if (args.algorithm != scalar_algorithm::adamw)
    return launch_scalar_rule(guard, p, g, m, v, n, args);
  if (args.cautious)
    return launch_adamw_cautious(guard, p, g, m, v, n, args);
  launch_adamw(guard, p, g, m, v, n, args);
}

void cuda_compute::apply_update_cautious(float* p, const float* o, int64_t n, float lr, float scale,
                                         float weight_decay) {
  const launch_guard guard = activate({floats(p, n), floats(o, n)});
  const call_timer timer(*this, "apply_update", ctx_.stream);
  launch_apply_update_cautious(guard, p, o, n, lr, scale, weight_decay);
}

void cuda_compute::post_ns(float* x, float* v, int64_t batch, int64_t rows, int64_t cols,
                           const muon_rule& rule, float factor) {
  switch (rule.transform) {  // -Wswitch names a transform without its case
    case muon_variant::normuon:
      normuon_rows(x, v, batch, rows, cols, rule.normuon_beta2, rule.normuon_eps);
      break;
    case muon_variant::muon:
      break;
  }
  if (factor != 1.0f)
    scale(x, batch * rows * cols, factor);
}

void cuda_compute::normuon_rows(float* x, float* v, int64_t batch, int64_t rows, int64_t cols,
                                float beta2, float eps) {
  const int64_t rows_total = batch * rows;
  if (rows_total <= 0 || cols <= 0)
    return;
  // Each row's sums of squares before and after, in double: 4 floats a row.
  device_buffer scratch = allocate_for_overwrite(4 * rows_total);
  const launch_guard guard = activate({floats(x, rows_total * cols), floats(v, rows_total),
                                       floats(scratch.data(), 4 * rows_total)});
  const call_timer timer(*this, "normuon", ctx_.stream);
  launch_normuon_rows(guard, x, v, batch, rows, cols, beta2, eps,
                      reinterpret_cast<double*>(scratch.data()));
}

// -- Newton-Schulz -------------------------------------------------------------------------------

void cuda_compute::newton_schulz(float* x, int64_t batch, int64_t rows, int64_t cols,
                                 const ns_options& ns) {
  run_newton_schulz(ns_io{x, nullptr}, batch, rows, cols, ns);
}

void cuda_compute::newton_schulz_bf16(uint16_t* x, int64_t batch, int64_t rows, int64_t cols,
                                      const ns_options& ns) {
  run_newton_schulz(ns_io{nullptr, reinterpret_cast<__nv_bfloat16*>(x)}, batch, rows, cols, ns);
}

void cuda_compute::run_newton_schulz(ns_io x, int64_t batch, int64_t rows, int64_t cols,
                                     const ns_options& ns) {
  if (batch <= 0)
    return;
  // On the least loaded lane, alongside the NS calls just before it and the main stream's work
  // that follows on other memory (stream_set.hpp).
  const launch_guard guard = activate({});
  const touched memory{x.f32 != nullptr ? static_cast<const void*>(x.f32) : x.bf16,
                       static_cast<size_t>(batch * rows * cols)
                           * (x.f32 != nullptr ? sizeof(float) : sizeof(uint16_t))};
  int lane = 0;
  launch_context on_lane = ctx_;
  on_lane.stream = streams_->fork(lane, memory);
  {
    const call_timer timer(*this, "newton_schulz", on_lane.stream);
    if (ns_uses_gram(ns, rows, cols, gpu_automatic_variant(batch, rows, cols)))
      lanes_[lane]->gram_ns.run(on_lane, x, batch, rows, cols, ns);
    else
      lanes_[lane]->ns.run(on_lane, x, batch, rows, cols, ns);
  }
  // The lane's work: an iteration's multiply-adds, m = min side, n = max side: X X^T (m^2 n),
  // A A (m^3), B X (m^2 n).
  const auto m = static_cast<double>(std::min(rows, cols));
  const auto n = static_cast<double>(std::max(rows, cols));
  streams_->lane_done(lane, memory, static_cast<double>(batch) * m * m * (2 * n + m));
  ns_matrices_ += batch;
}

// -- completion without waiting (completion_watcher.hpp) ----------------------------------------

void cuda_compute::when_done(std::function<void()> done) {
  const launch_guard guard = activate();
  // Also after a device failure: the caller's next CUDA call reports it.
  watcher_.after(ctx_.stream, [done = std::move(done)](bool) { done(); });
}

void cuda_compute::scan_async(const float* x, int64_t n, scan_result* out,
                              std::function<void()> landed) {
  if (n <= 0) {
    *out = scan_result{};
    landed();
    return;
  }
  const launch_guard guard = activate({floats(x, n)});
  const reduction_scratch scratch{partial_sums_.data(), partial_flags_.data(), result_.data()};
  {
    const call_timer timer(*this, "scan", ctx_.stream);
    launch_sum_squares(guard, x, n, scratch);
  }
  land_result(out, std::move(landed));
}

void cuda_compute::scan_parts_async(part_scans& scans, int parts, scan_result* out,
                                    std::function<void()> landed) {
  auto& kept = dynamic_cast<device_part_scans&>(scans);
  const launch_guard guard = activate({});  // the partials are the store's: no lane has them
  {
    const call_timer timer(*this, "scan", ctx_.stream);
    launch_sum_partials(guard, kept.sums.data(), kept.flags.data(),
                        std::clamp(parts, 0, kept.parts()) * kMaxReduceBlocks, result_.data());
  }
  land_result(out, std::move(landed));
}

void cuda_compute::land_result(scan_result* out, std::function<void()> landed) {
  // A pinned place of its own until the watcher has read it: the stream goes on meanwhile, and
  // a later scan's copy must not overwrite it.
  constexpr size_t bytes = sizeof(reduction);
  auto* place = static_cast<reduction*>(pinned_cache_->take(bytes));
  if (place == nullptr)
    ZMUON_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&place), bytes));
  try {
    ZMUON_CUDA_CHECK(
        cudaMemcpyAsync(place, result_.data(), bytes, cudaMemcpyDeviceToHost, ctx_.stream));
    watcher_.after(
        ctx_.stream, [place, out, cache = pinned_cache_, landed = std::move(landed)](bool ok) {
          // A failed device delivered no sums: non-finite, a vote to skip (the step fails anyway).
          out->sum_squares = ok ? place->sum_squares : 0.0;
          out->nonfinite = !ok || place->nonfinite != 0 || !std::isfinite(place->sum_squares);
          cache->put(place, bytes);
          landed();
        });
  } catch (...) {
    pinned_cache_->put(place, bytes);
    throw;
  }
}

device_buffer cuda_compute::host_memory(int64_t n, bool zero) {
  if (n <= 0)
    return device_buffer{};
  const launch_guard guard = activate({});  // host memory: no lane uses it
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  auto* data = static_cast<float*>(pinned_cache_->take(bytes));
  if (data == nullptr)
    ZMUON_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data), bytes));
  if (zero)
    std::memset(data, 0, bytes);
  return device_buffer(data, n, [cache = pinned_cache_, streams = streams_, bytes](float* p) {
    cudaStream_t stream = nullptr;
    try {
      stream = streams->joined();
    } catch (const failure&) {  // a broken context: free at once below
    }
    if (stream != nullptr)
      pinned_cache::release(cache, stream, p, bytes);
    else
      (void)cudaFreeHost(p);
  });
}

void cuda_compute::copy_to_host_async(float* host_dst, const float* src, int64_t n) {
  if (n <= 0)
    return;
  const launch_guard guard = activate({floats(src, n)});
  const call_timer timer(*this, "copy_to_host", ctx_.stream);
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, static_cast<size_t>(n) * sizeof(float),
                                   cudaMemcpyDeviceToHost, ctx_.stream));
}

void cuda_compute::copy_from_host_async(float* dst, const float* host_src, int64_t n) {
  if (n <= 0)
    return;
  const launch_guard guard = activate({floats(dst, n)});
  const call_timer timer(*this, "copy_from_host", ctx_.stream);
  ZMUON_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, static_cast<size_t>(n) * sizeof(float),
                                   cudaMemcpyHostToDevice, ctx_.stream));
}

memory_stats cuda_compute::memory() const {
  memory_stats stats = meter_->read();
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& lane : lanes_)
    stats.workspace += lane->ns.bytes() + lane->gram_ns.bytes()
                       + static_cast<int64_t>(lane->cublas_workspace.bytes());
  return stats;
}

void cuda_compute::synchronize() {
  const launch_guard guard = activate();
  streams_->synchronize();
  watcher_.drain();  // and what the watcher runs once the stream got there (scans' results)
}

error cuda_compute::check_caller_stream(void* stream) {
  const launch_guard guard = activate();
  const auto caller = static_cast<cudaStream_t>(stream);
  // A refused query leaves its error for the next launch check to find: cleared here.
  const auto refused = [](cudaError_t code) -> error {
    (void)cudaGetLastError();
    return {errc::invalid_argument, "the caller's CUDA stream cannot be used: " + describe(code)};
  };
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (const cudaError_t code = cudaStreamIsCapturing(caller, &capture); code != cudaSuccess)
    return refused(code);
  // Waiting for a capturing stream's event would draw the rank's stream into the caller's graph.
  if (capture != cudaStreamCaptureStatusNone)
    return {errc::invalid_argument,
            "the caller's CUDA stream is capturing a CUDA graph: the engine's hand-over cannot be "
            "captured (call it outside the capture)"};
  int device = -1;
  if (const cudaError_t code = cudaStreamGetDevice(caller, &device); code != cudaSuccess)
    return refused(code);
  if (device != device_)
    return {errc::invalid_argument, "the caller's CUDA stream is on GPU " + std::to_string(device)
                                        + ", this rank's on GPU " + std::to_string(device_)};
  return {};
}

// An event's wait takes the work recorded when cudaStreamWaitEvent is called, so one event each
// serves every call.
void cuda_compute::wait_for_stream(void* stream) {
  const launch_guard guard = activate();
  caller_ready_.record(static_cast<cudaStream_t>(stream));
  ZMUON_CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream, caller_ready_.get(), 0));
}

void cuda_compute::make_stream_wait(void* stream) {
  const launch_guard guard = activate();
  caller_may_go_.record(ctx_.stream);
  ZMUON_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), caller_may_go_.get(), 0));
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
