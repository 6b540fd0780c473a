// The per-matrix normalization and bf16 conversions of Newton-Schulz (kernels defined in
// newton_schulz.cu), for the other NS evaluations (gram_newton_schulz.cu) to share, and where an
// evaluation reads its input and writes its result: fp32 values, or the bf16 bits of the Muon
// phase's bf16 transport (read and written directly, so that no fp32 copy of the chunk exists).
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

/// out = result, n elements, on ctx.stream: widened to fp32, or copied as bf16.
void launch_ns_result(const launch_context& ctx, const __nv_bfloat16* result, int64_t n, ns_io out);

}  // namespace zmuon::gpu
