// Strided-batched bf16 GEMMs with fp32 accumulation, D = alpha * op(A) op(B) + beta * C, where
// C and D may be different buffers. cuBLASLt does that in one call (its epilogue reads C and
// writes D), which lets Newton-Schulz fold b*A and a*X into the GEMMs without copying A or X
// first. Plans (descriptors and an algorithm) are cached per shape: the first call of a shape
// times the heuristic's first candidates() algorithms (8) on its own operands and keeps the fastest
// (cuBLASLt's first choice is often not, for the odd sizes NS runs). When cuBLASLt
// offers no algorithm, or the copy path is asked for, D = C is copied and
// cublasGemmStridedBatchedEx runs with beta on D.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <type_traits>

#include "kernels/cuda/owners.hpp"

namespace zmuon::gpu {

/// The shape of one strided-batched GEMM, in cuBLAS's column-major terms. C and D share ldc and
/// stride_c.
struct gemm_shape {
  cublasOperation_t op_a;
  cublasOperation_t op_b;
  int m, n, k;
  int lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;
  int batch;
};

/// How gemm_runner executes: cuBLASLt with C != D (default), or a device copy of C into D and
/// cublasGemmStridedBatchedEx (benchmarks compare the two).
enum class gemm_path : uint8_t { lt, copy_then_gemm };

class gemm_runner {
public:
  /// `cublas` must already be bound to the stream passed to run().
  explicit gemm_runner(cublasHandle_t cublas);
  ~gemm_runner();
  gemm_runner(const gemm_runner&) = delete;
  gemm_runner& operator=(const gemm_runner&) = delete;

  /// How many of the heuristic's algorithms are timed per new shape, for the whole process: 8
  /// unless a benchmark sets another count (1..64, clamped; ns_tuning.hpp).
  static int candidates();
  static void set_candidates(int count);

  void set_path(gemm_path path) { path_ = path; }
  /// Device memory held: the cuBLASLt workspace.
  int64_t bytes() const { return static_cast<int64_t>(workspace_.bytes()); }
  /// Time the candidates (default) or take cuBLASLt's first choice; applies to new shapes.
  void set_autotune(bool on);

  /// D = alpha * op(A) op(B) + beta * C on `stream`; C may equal D; throws gpu::failure.
  void run(cudaStream_t stream, const gemm_shape& g, float alpha, const __nv_bfloat16* a,
           const __nv_bfloat16* b, float beta, const __nv_bfloat16* c, __nv_bfloat16* d);

  /// C[i] = alpha * op(A[i]) op(B[i]) + beta * C[i] for `count` same-shape GEMMs anywhere in
  /// memory: a, b and c are device arrays of `count` pointers (cublasGemmBatchedEx); the
  /// shape's strides and batch are ignored.
  void run_pointers(cudaStream_t stream, const gemm_shape& g, float alpha, const void* const* a,
                    const void* const* b, float beta, void* const* c, int count);

private:
  struct plan;
  /// One call's operands (what timing the candidates runs on).
  struct operands {
    cudaStream_t stream;
    float alpha;
    const __nv_bfloat16* a;
    const __nv_bfloat16* b;
    float beta;
    const __nv_bfloat16* c;
    __nv_bfloat16* d;
  };
  static constexpr int kMaxCandidates = 64;
  using key = std::array<int64_t, 12>;
  static key key_of(const gemm_shape& g);
  /// The cached plan for g, or nullptr when cuBLASLt has no algorithm for it.
  const plan* find_plan(const gemm_shape& g, const operands& x);
  bool can_repeat(const operands& x) const;
  cublasLtMatmulAlgo_t fastest(const plan& p, const operands& x,
                               const cublasLtMatmulHeuristicResult_t* candidates, int count);

  cublasHandle_t cublas_;
  cublasLtHandle_t lt_ = nullptr;
  device_array<unsigned char> workspace_;
  gemm_path path_ = gemm_path::lt;
  bool autotune_ = true;
  std::map<key, std::unique_ptr<plan>> plans_;
};

}  // namespace zmuon::gpu
