// The CUDA backend's scans kept per part (compute_backend::accumulate_scanned): each part's
// kMaxReduceBlocks partial results in device memory, written by the accumulate's own kernel
// (part_scans.cu) and summed, part by part, by scan_parts_async (cuda_compute.cpp).

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cuda/cuda_compute.hpp"
#include "kernels/cuda/elementwise.cuh"

namespace zmuon::gpu {

std::unique_ptr<part_scans> cuda_compute::make_part_scans(int parts) {
  const launch_guard guard = activate();
  auto scans = std::make_unique<device_part_scans>(parts);
  // Every part a zero part until written.
  ZMUON_CUDA_CHECK(cudaMemsetAsync(scans->sums.data(), 0, scans->sums.bytes(), ctx_.stream));
  ZMUON_CUDA_CHECK(cudaMemsetAsync(scans->flags.data(), 0, scans->flags.bytes(), ctx_.stream));
  return scans;
}

device_part_scans& device_scans_of(part_scans& scans, int part, const char* call) {
  auto& kept = dynamic_cast<device_part_scans&>(scans);
  if (part < 0 || part >= kept.parts())
    throw failure(error(errc::invalid_argument, std::string(call) + ": no part "
                                                    + std::to_string(part) + " of "
                                                    + std::to_string(kept.parts())));
  return kept;
}

void cuda_compute::accumulate_pieces_scanned(float* dst, int64_t n,
                                             const std::vector<copy_piece>& pieces,
                                             accumulate_mode mode, part_scans& scans, int part) {
  int64_t covered = 0;
  for (const copy_piece& p : pieces)
    covered += std::max<int64_t>(p.n, 0);
  // One pass where the kernel's table takes the pieces and the scan of what it writes is the
  // bucket's: a copy (the gaps zeroed first) or an add over every element.
  const bool fused = mode != accumulate_mode::zero && pieces.size() <= kPieceScanTable
                     && (mode == accumulate_mode::copy || covered == n);
  if (!fused) {
    compute_backend::accumulate_pieces_scanned(dst, n, pieces, mode, scans, part);
    return;
  }
  auto& kept = device_scans_of(scans, part, "accumulate_pieces_scanned");
  const int64_t at = int64_t{part} * kMaxReduceBlocks;
  // The sources are the caller's gradients, which no Newton-Schulz lane touches.
  const launch_guard guard = activate({touched{dst, static_cast<size_t>(n) * sizeof(float)}});
  const call_timer timer(*this, "accumulate", ctx_.stream);
  if (mode == accumulate_mode::copy && covered != n)
    ZMUON_CUDA_CHECK(cudaMemsetAsync(dst, 0, static_cast<size_t>(n) * sizeof(float), ctx_.stream));
  launch_accumulate_pieces_scanned(guard, dst, pieces, mode, kept.sums.data() + at,
                                   kept.flags.data() + at);
}

void cuda_compute::scan_pieces(const float* dst, int64_t n, const std::vector<copy_piece>& pieces,
                               part_scans& scans, int part) {
  if (pieces.size() > kPieceScanTable) {  // the packed copy into a stand-in for dst: the
    // float4 grouping of accumulate_scanned follows dst's alignment, so the stand-in has it
    device_buffer stand_in = allocate_for_overwrite(n + 3);
    const auto misaligned = reinterpret_cast<uintptr_t>(dst) % 16 / sizeof(float);
    compute_backend::accumulate_pieces_scanned(stand_in.data() + misaligned, n, pieces,
                                               accumulate_mode::copy, scans, part);
    return;
  }
  auto& kept = device_scans_of(scans, part, "scan_pieces");
  const int64_t at = int64_t{part} * kMaxReduceBlocks;
  // Reads the caller's gradients only, which no Newton-Schulz lane touches.
  const launch_guard guard = activate({});
  const call_timer timer(*this, "scan", ctx_.stream);
  launch_scan_pieces(guard, dst, pieces, kept.sums.data() + at, kept.flags.data() + at);
}

void cuda_compute::accumulate_scanned(float* dst, const float* src, int64_t n, accumulate_mode mode,
                                      part_scans& scans, int part) {
  auto& kept = device_scans_of(scans, part, "accumulate_scanned");
  const int64_t at = int64_t{part} * kMaxReduceBlocks;
  const touched written{dst, static_cast<size_t>(n) * sizeof(float)};
  const touched read{src, mode == accumulate_mode::zero ? 0 : written.bytes};
  const launch_guard guard = activate({written, read});
  const call_timer timer(*this, "accumulate", ctx_.stream);
  launch_accumulate_scanned(guard, dst, src, n, mode, kept.sums.data() + at,
                            kept.flags.data() + at);
}

}  // namespace zmuon::gpu
