// Launchers of the element-wise and reduction kernels (elementwise.cu). Each enqueues on
// ctx.stream, checks the launch, and returns without waiting. Sizes and indices are 64-bit.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/compute.hpp"
#include "kernels/cuda/launch.hpp"

namespace zmuon::gpu {

/// A reduction's result as the device writes it: the sum of squares and a non-finite flag.
struct reduction {
  double sum_squares;
  int nonfinite;
};

/// Scratch space of a two-pass reduction: one partial per block of the first pass.
struct reduction_scratch {
  double* partial_sums;  // kMaxReduceBlocks
  int* partial_flags;    // kMaxReduceBlocks
  reduction* result;     // 1
};

void launch_add(const launch_context& ctx, float* dst, const float* src, int64_t n);
void launch_scale(const launch_context& ctx, float* x, int64_t n, float factor);

/// Writes *scratch.result: the sum of squares of x (double, fixed summation order, so the same
/// input on the same device gives the same bits) and whether any element is inf or NaN.
void launch_sum_squares(const launch_context& ctx, const float* x, int64_t n,
                        const reduction_scratch& scratch);

/// Writes *result from `count` partial results (a first pass's, or part_scans' parts of
/// kMaxReduceBlocks each), summed in a fixed order.
void launch_sum_partials(const launch_context& ctx, const double* partial_sums,
                         const int* partial_flags, int count, reduction* result);

/// compute_backend::accumulate_scanned (part_scans.cu): dst = src, dst += src or dst = 0, and
/// the scan of the new values as kMaxReduceBlocks partial results (unused ones zero).
void launch_accumulate_scanned(const launch_context& ctx, float* dst, const float* src, int64_t n,
                               accumulate_mode mode, double* partial_sums, int* partial_flags);
/// Pieces a fused accumulate_pieces_scanned takes: their table is the kernel's parameter (12 KB;
/// CUDA 12.1 and later take up to 32 KB), so that a bucket of GPT-2's small tensors fits.
inline constexpr int kPieceScanTable = 512;
/// The same with the source packed from `pieces` (at most kPieceScanTable, in increasing,
/// non-overlapping destination order, mode copy or add), read in the same pass: only the
/// pieces' elements of dst are written and scanned (a copy into a bucket with gaps zeroes it
/// first).
void launch_accumulate_pieces_scanned(const launch_context& ctx, float* dst,
                                      const std::vector<copy_piece>& pieces, accumulate_mode mode,
                                      double* partial_sums, int* partial_flags);
/// The scan of launch_accumulate_pieces_scanned(grouping, pieces, copy, ...), bit for bit, with
/// nothing written (`grouping` only sets the sum's grouping, as that copy's destination).
void launch_scan_pieces(const launch_context& ctx, const float* grouping,
                        const std::vector<copy_piece>& pieces, double* partial_sums,
                        int* partial_flags);

void launch_momentum(const launch_context& ctx, float* m, const float* g, float* u, int64_t n,
                     float beta, bool nesterov);
void launch_apply_update(const launch_context& ctx, float* p, const float* o, int64_t n, float lr,
                         float scale, float weight_decay);
/// The same with u written, or o read, as bf16 bits (kernels/bf16.hpp's rounding).
void launch_momentum(const launch_context& ctx, float* m, const float* g, uint16_t* u, int64_t n,
                     float beta, bool nesterov);
void launch_apply_update(const launch_context& ctx, float* p, const uint16_t* o, int64_t n,
                         float lr, float scale, float weight_decay);
/// fp32 -> bf16 bits and back, with kernels/bf16.hpp's functions (the host backend's bits).
void launch_to_bf16(const launch_context& ctx, uint16_t* dst, const float* src, int64_t n);
void launch_from_bf16(const launch_context& ctx, float* dst, const uint16_t* src, int64_t n);
void launch_adamw(const launch_context& ctx, float* p, const float* g, float* m, float* v,
                  int64_t n, const scalar_args& args);

/// The non-Muon rule args.algorithm on one shard, element by element with
/// kernels/scalar_rules.hpp's definition (AdamW has its own kernels above).
void launch_scalar_rule(const launch_context& ctx, float* p, const float* g, float* m, float* v,
                        int64_t n, const scalar_args& args);

/// `n` 2-byte units (the bits of fp32 or bf16 elements) to copy from src to dst.
struct unit_piece {
  const uint16_t* src;
  uint16_t* dst;
  int64_t n;
};
/// Copies every piece's bits, as cudaMemcpyAsync would piece by piece, in one launch per 64
/// pieces (8-byte accesses where a piece's ends are 8-byte aligned): the nccl comm's copies of a
/// rank's own gather and scatter segments.
void launch_copy_units(const launch_context& ctx, const std::vector<unit_piece>& pieces);

/// compute_backend::copy_pieces: up to kSliceTable pieces a launch.
void launch_copy_pieces(const launch_context& ctx, float* dst,
                        const std::vector<copy_piece>& pieces);

/// The same over several parameters (compute_backend's *_slices calls), one launch per
/// kSliceTable slices; the arithmetic of each element is its per-parameter kernel's. The
/// momentum's scan of the gradients it reads, where partial_sums is not null: added to a
/// part's kMaxReduceBlocks partials (partial_flags beside them), which the caller zeroes first.
void launch_momentum_slices(const launch_context& ctx, const float* m, float* m_out, const float* g,
                            fp32_or_bf16 u, int64_t origin, const std::vector<param_slice>& slices,
                            float beta, bool nesterov, double* partial_sums = nullptr,
                            int* partial_flags = nullptr);
void launch_apply_update_slices(const launch_context& ctx, float* p, fp32_or_bf16 o, int64_t origin,
                                const std::vector<param_slice>& slices, float lr,
                                float weight_decay);
void launch_adamw_slices(const launch_context& ctx, float* p, const float* g, float* m, float* v,
                         const std::vector<param_slice>& slices, const scalar_args& args);

}  // namespace zmuon::gpu
