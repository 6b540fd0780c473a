// The per-matrix normalization, bf16 conversions and diagonal shift of Newton-Schulz (kernels
// defined in newton_schulz.cu), for the other NS evaluations (gram_newton_schulz.cu) to share,
// and where an evaluation reads its input and writes its result: fp32 values, or the bf16 bits of
// the Muon phase's bf16 transport (read and written directly, so that no fp32 copy of the chunk
// exists).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/launch.hpp"

namespace zmuon::gpu {

/// The matrices NS orthogonalizes in place: fp32 values at `f32`, or bf16 bits at `bf16`.
/// Reading bf16 widens exactly and writing it copies NS's own bf16 result, so a bf16 call gives
/// the bits that rounding the fp32 call's result would (NS ends in bf16 either way).
struct ns_io {
  float* f32 = nullptr;
  __nv_bfloat16* bf16 = nullptr;
};

/// Partial sums per matrix that launch_normalize_to_bf16 needs: `batch` times this many doubles.
int normalize_slices(int64_t batch, int64_t numel, int sm_count);

/// out[k] = bf16(x[k] / (||x[k]||_F + eps)) for `batch` matrices of `numel` elements stored
/// back to back, on ctx.stream. partial_sums: batch * normalize_slices(batch, numel, sm_count)
/// doubles; inv_norms: batch floats.
void launch_normalize_to_bf16(const launch_context& ctx, ns_io x, int64_t batch, int64_t numel,
                              double eps, double* partial_sums, float* inv_norms,
                              __nv_bfloat16* out);

/// Whether NS's last GEMM may write the caller's bf16 buffer itself: the GEMMs' cuBLASLt plans
/// are chosen on the workspace's buffers (256-byte aligned), and hold for another buffer only
/// as aligned (a plan refused once sends its shape to the slower fallback for good: gemm.hpp).
inline bool lands_in_caller_buffer(const ns_io& x) {
  return x.bf16 != nullptr && reinterpret_cast<uintptr_t>(x.bf16) % 256 == 0;
}

/// For a run of `total` steps (iterations, or the Gram variant's blocks) whose input, normalized,
/// sits in a workspace buffer and whose result should land in the caller's bf16 buffer `out`
/// without a copy: where step `i` (1-based) writes. The steps alternate between `out` and
/// `spare` so that the last one writes `out`, and no step writes the buffer it reads.
inline __nv_bfloat16* step_output(int i, int total, __nv_bfloat16* out, __nv_bfloat16* spare) {
  return (total - i) % 2 == 0 ? out : spare;
}

/// b[q] += a*I for `batch` column-major [m, m] bf16 matrices stored back to back, on `stream`
/// (the diagonals only are read and written): folds NS's "+ a*X" term into the matrix that
/// multiplies X, so that the product reads no C.
void launch_add_to_diagonal(cudaStream_t stream, __nv_bfloat16* b, int64_t m, int64_t batch,
                            float a);

/// out = result, n elements, on ctx.stream: widened to fp32, or copied as bf16.
void launch_ns_result(const launch_context& ctx, const __nv_bfloat16* result, int64_t n, ns_io out);

}  // namespace zmuon::gpu
