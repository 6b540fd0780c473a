// Kernels of cautious weight decay (arXiv:2510.12402) and NorMuon's row normalization
// (arXiv:2510.05491): the CUDA side of compute_backend::apply_update_cautious, AdamW's
// scalar_update with scalar_args::cautious, and post_ns under NorMuon. Arithmetic as the host
// backend's loops.
#pragma once

#include <cstdint>

#include "kernels/compute.hpp"
#include "kernels/cuda/launch.hpp"

namespace zmuon::gpu {

/// p = p - lr*wd*p*[p*o >= 0] - lr*scale*o.
void launch_apply_update_cautious(const launch_context& ctx, float* p, const float* o, int64_t n,
                                  float lr, float scale, float weight_decay);
/// AdamW whose decay applies only where p * m_hat / (sqrt(v_hat) + eps) >= 0.
void launch_adamw_cautious(const launch_context& ctx, float* p, const float* g, float* m, float* v,
                           int64_t n, const scalar_args& args);
/// NorMuon's normalization of `batch` row-major [rows, cols] blocks of x, v their row moments.
/// `scratch` holds 2 * batch * rows floats of the backend's memory.
void launch_normuon_rows(const launch_context& ctx, float* x, float* v, int64_t batch, int64_t rows,
                         int64_t cols, float beta2, float eps, double* scratch);

}  // namespace zmuon::gpu
