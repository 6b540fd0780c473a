// The per-matrix normalization and bf16 conversions of Newton-Schulz (kernels defined in
// newton_schulz.cu), for the other NS evaluations (gram_newton_schulz.cu) to share.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/launch.hpp"

namespace zmuon::gpu {

/// Partial sums per matrix that launch_normalize_to_bf16 needs: `batch` times this many doubles.
int normalize_slices(int64_t batch, int64_t numel, int sm_count);

/// out[k] = bf16(x[k] / (||x[k]||_F + eps)) for `batch` matrices of `numel` elements stored
/// back to back, on ctx.stream. partial_sums: batch * normalize_slices(batch, numel, sm_count)
/// doubles; inv_norms: batch floats.
void launch_normalize_to_bf16(const launch_context& ctx, const float* x, int64_t batch,
                              int64_t numel, double eps, double* partial_sums, float* inv_norms,
                              __nv_bfloat16* out);

/// out[i] = float(in[i]) for n elements, on ctx.stream.
void launch_from_bf16(const launch_context& ctx, const __nv_bfloat16* in, int64_t n, float* out);

}  // namespace zmuon::gpu
