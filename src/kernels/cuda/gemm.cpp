// gemm_runner: cuBLASLt plans cached per shape, with cublasGemmStridedBatchedEx as the fallback.

#include "kernels/cuda/gemm.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/owners.hpp"
#include "kernels/cuda/sm90/sm90_gemm.hpp"

namespace zmuon::gpu {
namespace {

/// cuBLAS's recommendation for Hopper.
constexpr int64_t kWorkspaceBytes = int64_t{32} << 20;

template <class Opaque, cublasStatus_t (*Destroy)(Opaque*)>
struct lt_deleter {
  void operator()(Opaque* p) const {
    if (p != nullptr)
      (void)Destroy(p);
  }
};
using matmul_desc =
    std::unique_ptr<cublasLtMatmulDescOpaque_t,
                    lt_deleter<cublasLtMatmulDescOpaque_t, cublasLtMatmulDescDestroy>>;
using matrix_layout =
    std::unique_ptr<cublasLtMatrixLayoutOpaque_t,
                    lt_deleter<cublasLtMatrixLayoutOpaque_t, cublasLtMatrixLayoutDestroy>>;
using preference =
    std::unique_ptr<cublasLtMatmulPreferenceOpaque_t,
                    lt_deleter<cublasLtMatmulPreferenceOpaque_t, cublasLtMatmulPreferenceDestroy>>;

/// A bf16 column-major [rows, cols] layout with leading dimension ld, `batch` of them `stride`
/// elements apart.
matrix_layout make_layout(int rows, int cols, int ld, int64_t stride, int batch) {
  cublasLtMatrixLayout_t raw = nullptr;
  ZMUON_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&raw, CUDA_R_16BF, static_cast<uint64_t>(rows),
                                                static_cast<uint64_t>(cols), ld));
  matrix_layout layout(raw);
  const int32_t count = batch;
  ZMUON_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &count, sizeof count));
  ZMUON_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
      raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  return layout;
}

}  // namespace

struct gemm_runner::plan {
  matmul_desc desc;
  matrix_layout a, b, cd;
  cublasLtMatmulAlgo_t algo;
};

gemm_runner::gemm_runner(cublasHandle_t cublas) : cublas_(cublas), workspace_(kWorkspaceBytes) {
  ZMUON_CUBLAS_CHECK(cublasLtCreate(&lt_));
}

gemm_runner::~gemm_runner() {
  plans_.clear();
  if (lt_ != nullptr)
    (void)cublasLtDestroy(lt_);
}

void gemm_runner::set_autotune(bool on) {
  autotune_ = on;
  plans_.clear();
}

gemm_runner::key gemm_runner::key_of(const gemm_shape& g) {
  return key{g.op_a, g.op_b, g.m,        g.n,        g.k,        g.lda,
             g.ldb,  g.ldc,  g.stride_a, g.stride_b, g.stride_c, g.batch};
}

const gemm_runner::plan* gemm_runner::find_plan(const gemm_shape& g, const operands& x) {
  const key k = key_of(g);
  auto found = plans_.find(k);
  if (found != plans_.end())
    return found->second.get();

  auto p = std::make_unique<plan>();
  cublasLtMatmulDesc_t desc = nullptr;
  ZMUON_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  p->desc.reset(desc);
  ZMUON_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.op_a, sizeof g.op_a));
  ZMUON_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.op_b, sizeof g.op_b));
  // Stored shapes: op(A) is [m, k], op(B) is [k, n].
  const bool ta = g.op_a != CUBLAS_OP_N;
  const bool tb = g.op_b != CUBLAS_OP_N;
  p->a = make_layout(ta ? g.k : g.m, ta ? g.m : g.k, g.lda, g.stride_a, g.batch);
  p->b = make_layout(tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, g.stride_b, g.batch);
  p->cd = make_layout(g.m, g.n, g.ldc, g.stride_c, g.batch);

  cublasLtMatmulPreference_t raw_pref = nullptr;
  ZMUON_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
  preference pref(raw_pref);
  const uint64_t workspace_bytes = workspace_.bytes();
  ZMUON_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace_bytes, sizeof workspace_bytes));
  std::array<cublasLtMatmulHeuristicResult_t, kMaxCandidates> results{};
  int found_count = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      lt_, desc, p->a.get(), p->b.get(), p->cd.get(), p->cd.get(), raw_pref,
      autotune_ ? candidates() : 1, results.data(), &found_count);
  if (status != CUBLAS_STATUS_SUCCESS || found_count == 0) {
    plans_.emplace(k, nullptr);  // remembered: the fallback path, without asking again
    return nullptr;
  }
  p->algo = results[0].algo;
  if (found_count > 1 && can_repeat(x)) {
    // One choice per shape and device for the whole process, so that every rank's backend
    // runs the same algorithm and results do not depend on which backend timed what.
    static std::mutex chosen_mutex;
    static std::map<std::pair<int, key>, cublasLtMatmulAlgo_t> chosen;
    int device = 0;
    ZMUON_CUDA_CHECK(cudaGetDevice(&device));
    const std::lock_guard<std::mutex> lock(chosen_mutex);
    const auto earlier = chosen.find({device, k});
    p->algo = earlier != chosen.end()
                  ? earlier->second
                  : (chosen[{device, k}] = fastest(*p, x, results.data(), found_count));
  }
  return plans_.emplace(k, std::move(p)).first->second.get();
}

namespace {
std::atomic<int> candidate_count{8};
}  // namespace

int gemm_runner::candidates() {
  return candidate_count.load(std::memory_order_relaxed);
}

void gemm_runner::set_candidates(int count) {
  candidate_count.store(std::clamp(count, 1, kMaxCandidates), std::memory_order_relaxed);
}

bool gemm_runner::can_repeat(const operands& x) const {
  // Timing runs the GEMM several times: only when that leaves D as one run would (C is not D,
  // or beta is 0), and never while the stream is being captured into a graph.
  if (x.c == x.d && x.beta != 0.0f)
    return false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  ZMUON_CUDA_CHECK(cudaStreamIsCapturing(x.stream, &capture));
  return capture == cudaStreamCaptureStatusNone;
}

cublasLtMatmulAlgo_t gemm_runner::fastest(const plan& p, const operands& x,
                                          const cublasLtMatmulHeuristicResult_t* candidates,
                                          int count) {
  constexpr int kWarmups = 1;
  constexpr int kReps = 3;
  cuda_event start;
  cuda_event stop;
  cublasLtMatmulAlgo_t best = candidates[0].algo;
  float best_ms = 0.0f;
  for (int i = 0; i < count; ++i) {
    const auto once = [&] {
      return cublasLtMatmul(lt_, p.desc.get(), &x.alpha, x.a, p.a.get(), x.b, p.b.get(), &x.beta,
                            x.c, p.cd.get(), x.d, p.cd.get(), &candidates[i].algo,
                            workspace_.data(), workspace_.bytes(), x.stream);
    };
    bool usable = true;
    for (int w = 0; w < kWarmups && usable; ++w)
      usable = once() == CUBLAS_STATUS_SUCCESS;
    if (!usable)
      continue;
    start.record(x.stream);
    for (int r = 0; r < kReps; ++r)
      ZMUON_CUBLAS_CHECK(once());
    stop.record(x.stream);
    ZMUON_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    ZMUON_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    if (i == 0 || ms < best_ms) {
      best_ms = ms;
      best = candidates[i].algo;
    }
  }
  return best;
}

void gemm_runner::run(cudaStream_t stream, const gemm_shape& g, float alpha, const __nv_bfloat16* a,
                      const __nv_bfloat16* b, float beta, const __nv_bfloat16* c,
                      __nv_bfloat16* d) {
  const plan* p =
      path_ == gemm_path::lt ? find_plan(g, operands{stream, alpha, a, b, beta, c, d}) : nullptr;
  if (p != nullptr) {
    const cublasStatus_t status = cublasLtMatmul(
        lt_, p->desc.get(), &alpha, a, p->a.get(), b, p->b.get(), &beta, c, p->cd.get(), d,
        p->cd.get(), &p->algo, workspace_.data(), workspace_.bytes(), stream);
    if (status == CUBLAS_STATUS_SUCCESS)
      return;
    if (status != CUBLAS_STATUS_NOT_SUPPORTED)
      ZMUON_CUBLAS_CHECK(status);
    // The heuristic's algorithm refused the call: this shape takes the fallback from now on.
    plans_[key_of(g)] = nullptr;
  }
  if (beta != 0.0f && c != d) {
    // C and D are [ldc, n] column-major blocks stride_c apart: copy them whole.
    const int64_t span = (g.batch - 1) * g.stride_c + static_cast<int64_t>(g.ldc) * g.n;
    ZMUON_CUDA_CHECK(cudaMemcpyAsync(d, c, static_cast<size_t>(span) * sizeof(__nv_bfloat16),
                                     cudaMemcpyDeviceToDevice, stream));
  }
  ZMUON_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      cublas_, g.op_a, g.op_b, g.m, g.n, g.k, &alpha, a, CUDA_R_16BF, g.lda, g.stride_a, b,
      CUDA_R_16BF, g.ldb, g.stride_b, &beta, d, CUDA_R_16BF, g.ldc, g.stride_c, g.batch,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm_runner::run_pointers(cudaStream_t stream, const gemm_shape& g, float alpha,
                               const void* const* a, const void* const* b, float beta,
                               void* const* c, int count) {
  (void)stream;  // cublas_ is bound to it already (see the constructor's contract)
  ZMUON_CUBLAS_CHECK(cublasGemmBatchedEx(
      cublas_, g.op_a, g.op_b, g.m, g.n, g.k, &alpha, a, CUDA_R_16BF, g.lda, b, CUDA_R_16BF, g.ldb,
      &beta, c, CUDA_R_16BF, g.ldc, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// The own Hopper GEMM's reference (sm90_gemm.hpp): the same product on cuBLAS, every tile.
void sm90_gemm_on_cublas(gemm_runner& runner, cudaStream_t stream, const sm90_gemm_args& a,
                         __nv_bfloat16* out) {
  // Column-major: D^T [n, m] = Q P^T, with Q read as [k, n] transposed and P as [k, m].
  const gemm_shape shape{CUBLAS_OP_T,
                         CUBLAS_OP_N,
                         static_cast<int>(a.n),
                         static_cast<int>(a.m),
                         static_cast<int>(a.k),
                         static_cast<int>(a.q.ld),
                         static_cast<int>(a.p.ld),
                         static_cast<int>(a.d.ld),
                         a.q.stride,
                         a.p.stride,
                         a.d.stride,
                         static_cast<int>(a.batch)};
  if (a.beta != 0.0f && a.c.ld != a.d.ld)
    throw failure(error(errc::invalid_argument, "sm90_gemm_on_cublas: C and D need one ld"));
  runner.run(stream, shape, a.alpha, a.q.data, a.p.data, a.beta, a.beta != 0.0f ? a.c.data : out,
             out);
}

}  // namespace zmuon::gpu
