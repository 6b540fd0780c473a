// The CUDA backend's scans kept per part (compute_backend::accumulate_scanned): each part's
// kMaxReduceBlocks partial results in device memory, written by the accumulate's own kernel
// (part_scans.cu) and summed, part by part, by scan_parts_async (cuda_compute.cpp).

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

void cuda_compute::accumulate_scanned(float* dst, const float* src, int64_t n, accumulate_mode mode,
                                      part_scans& scans, int part) {
  auto& kept = dynamic_cast<device_part_scans&>(scans);
  if (part < 0 || part >= kept.parts())
    throw failure(error(errc::invalid_argument, "accumulate_scanned: no part "
                                                    + std::to_string(part) + " of "
                                                    + std::to_string(kept.parts())));
  const int64_t at = int64_t{part} * kMaxReduceBlocks;
  const touched written{dst, static_cast<size_t>(n) * sizeof(float)};
  const touched read{src, mode == accumulate_mode::zero ? 0 : written.bytes};
  const launch_guard guard = activate({written, read});
  const call_timer timer(*this, "accumulate", ctx_.stream);
  launch_accumulate_scanned(guard, dst, src, n, mode, kept.sums.data() + at,
                            kept.flags.data() + at);
}

}  // namespace zmuon::gpu
