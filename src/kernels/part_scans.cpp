// compute_backend's scans kept per part (kernels/compute.hpp): the defaults, in host memory.
// In zmuon_base beside call_timing.cpp, which every backend library links.

#include <algorithm>
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

void compute_backend::scan_slices(const float* g, const std::vector<param_slice>& slices,
                                  scan_into scan) {
  auto& kept = dynamic_cast<host_part_scans&>(*scan.scans);
  scan_result& part = kept.scans.at(static_cast<size_t>(scan.part));
  if (scan.first)
    part = scan_result{};
  for (const param_slice& s : slices) {
    const scan_result one = this->scan(grad_of(s, g), s.n);
    part.nonfinite = part.nonfinite || one.nonfinite;
    part.sum_squares += one.sum_squares;
  }
}

void compute_backend::scan_parts_async(part_scans& scans, int parts, scan_result* out,
                                       std::function<void()> landed) {
  const auto& kept = dynamic_cast<host_part_scans&>(scans).scans;
  scan_result total;
  for (size_t i = 0; i < std::min(kept.size(), static_cast<size_t>(std::max(parts, 0))); ++i) {
    total.nonfinite = total.nonfinite || kept[i].nonfinite;
    total.sum_squares += kept[i].sum_squares;
  }
  total.nonfinite = total.nonfinite || !std::isfinite(total.sum_squares);
  *out = total;
  landed();
}

}  // namespace zmuon
