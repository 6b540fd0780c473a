// compute_backend's scans kept per part (kernels/compute.hpp): the defaults, in host memory.
// In zmuon_base beside call_timing.cpp, which every backend library links.

#include <cmath>
#include <memory>

#include "kernels/compute.hpp"

namespace zmuon {

std::unique_ptr<part_scans> compute_backend::make_part_scans(int parts) {
  return std::make_unique<host_part_scans>(parts);
}

void compute_backend::accumulate_pieces_scanned(float* dst, int64_t n,
                                                const std::vector<copy_piece>& pieces,
                                                accumulate_mode mode, part_scans& scans, int part) {
  device_buffer packed = allocate(n);  // zeros where no piece lands
  copy_pieces(packed.data(), pieces);
  accumulate_scanned(dst, packed.data(), n, mode, scans, part);
}

void compute_backend::scan_pieces(const float* dst, int64_t n,
                                  const std::vector<copy_piece>& pieces, part_scans& scans,
                                  int part) {
  (void)dst;
  device_buffer packed = allocate_for_overwrite(n);
  accumulate_pieces_scanned(packed.data(), n, pieces, accumulate_mode::copy, scans, part);
}

void compute_backend::scan_parts_async(part_scans& scans, scan_result* out,
                                       std::function<void()> landed) {
  scan_result total;
  for (const scan_result& s : dynamic_cast<host_part_scans&>(scans).scans) {
    total.nonfinite = total.nonfinite || s.nonfinite;
    total.sum_squares += s.sum_squares;
  }
  total.nonfinite = total.nonfinite || !std::isfinite(total.sum_squares);
  *out = total;
  landed();
}

}  // namespace zmuon
