// A backend's accumulate_scanned and scan_parts_async (the store's gradient buckets, each
// scanned by the call that wrote it) against host arithmetic: the values written bit for bit,
// the parts' sum of squares against a double sum of what the buffer holds (relative 1e-12) and
// against the backend's own scan() of the whole buffer, and inf or NaN found in whichever part
// holds them until that part is written again (test_kernels on the host backend,
// test_cuda_kernels on the CUDA one, whose kernel scans in the same pass).
#pragma once

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/compute.hpp"
#include "support/host_kernels.hpp"

namespace zmuon::test {

namespace part_scans_detail {

/// The scans of the parts together, once the backend has landed them.
inline scan_result scan_of_parts(compute_backend& be, part_scans& scans) {
  scan_result out;
  be.scan_parts_async(scans, scans.parts(), &out, [] {});
  be.synchronize();
  return out;
}

inline double sum_of_squares(const std::vector<float>& v) {
  double sum = 0.0;
  for (const float x : v)
    sum += static_cast<double>(x) * x;
  return sum;
}

}  // namespace part_scans_detail

inline void check_part_scans(compute_backend& be) {
  using namespace part_scans_detail;
  // Parts of a buffer laid out like a store's buckets: empty, tiny, odd lengths and offsets (one
  // element at a time on CUDA) and whole float4s (four at a time), one longer than a grid.
  const std::vector<int64_t> lengths{0, 1, 5, 1000, 70'001, 262'144, 3, 40'000};
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const int64_t n : lengths) {
    total += n % 4 == 0 ? (4 - total % 4) % 4 : 1;  // the float4 parts 16-byte aligned
    offsets.push_back(total);
    total += n;
  }
  const int parts = static_cast<int>(lengths.size());
  const std::vector<float> first = random_floats(total, 11, -2.0f, 2.0f);
  const std::vector<float> second = random_floats(total, 12, -2.0f, 2.0f);
  std::vector<float> expected = random_floats(total, 13);  // what lies between the parts
  device_buffer buf = upload(be, expected);
  const device_buffer a = upload(be, first), b = upload(be, second);
  std::unique_ptr<part_scans> scans = be.make_part_scans(parts);
  BOOST_REQUIRE_EQUAL(scans->parts(), parts);

  // Nothing written: every part scans as zero.
  const scan_result none = scan_of_parts(be, *scans);
  BOOST_TEST(none.sum_squares == 0.0);
  BOOST_TEST(!none.nonfinite);

  // Copy into every part, add a second slice into every other one, zero part 3.
  std::vector<float> parts_only(static_cast<size_t>(total), 0.0f);  // what the parts hold
  for (int p = 0; p < parts; ++p) {
    const int64_t at = offsets[p];
    const int64_t n = lengths[p];
    be.accumulate_scanned(buf.data() + at, a.data() + at, n, accumulate_mode::copy, *scans, p);
    for (int64_t i = at; i < at + n; ++i)
      expected[i] = first[i];
    if (p % 2 == 1) {
      be.accumulate_scanned(buf.data() + at, b.data() + at, n, accumulate_mode::add, *scans, p);
      for (int64_t i = at; i < at + n; ++i)
        expected[i] = first[i] + second[i];
    }
  }
  be.accumulate_scanned(buf.data() + offsets[3], nullptr, lengths[3], accumulate_mode::zero, *scans,
                        3);
  for (int64_t i = offsets[3]; i < offsets[3] + lengths[3]; ++i)
    expected[i] = 0.0f;
  for (int p = 0; p < parts; ++p)
    for (int64_t i = offsets[p]; i < offsets[p] + lengths[p]; ++i)
      parts_only[i] = expected[i];

  const std::vector<float> got = download(be, buf);
  int64_t differing = 0;
  for (int64_t i = 0; i < total; ++i)
    differing += std::memcmp(&got[i], &expected[i], sizeof(float)) != 0;
  BOOST_TEST(differing == 0, "elements whose bits differ from copy / add / zero (and gaps kept)");

  const double reference = sum_of_squares(parts_only);
  const scan_result all = scan_of_parts(be, *scans);
  BOOST_TEST(!all.nonfinite);
  BOOST_TEST(std::abs(all.sum_squares - reference) <= 1e-12 * reference,
             "parts' sum of squares " << all.sum_squares << ", double reference " << reference);
  // The same as the backend's one-pass scan of each part, summed.
  double whole = 0.0;
  for (int p = 0; p < parts; ++p)
    whole += be.scan(buf.data() + offsets[p], lengths[p]).sum_squares;
  BOOST_TEST(std::abs(all.sum_squares - whole) <= 1e-12 * whole);

  // A NaN added into part 4 and an inf copied into part 6: found; rewritten finite: gone.
  std::vector<float> bad(static_cast<size_t>(total), 0.0f);
  bad[static_cast<size_t>(offsets[4] + lengths[4] / 2)] = std::numeric_limits<float>::quiet_NaN();
  bad[static_cast<size_t>(offsets[6] + 2)] = -std::numeric_limits<float>::infinity();
  const device_buffer poison = upload(be, bad);
  be.accumulate_scanned(buf.data() + offsets[4], poison.data() + offsets[4], lengths[4],
                        accumulate_mode::add, *scans, 4);
  BOOST_TEST(scan_of_parts(be, *scans).nonfinite, "NaN added into part 4");
  be.accumulate_scanned(buf.data() + offsets[4], a.data() + offsets[4], lengths[4],
                        accumulate_mode::copy, *scans, 4);
  BOOST_TEST(!scan_of_parts(be, *scans).nonfinite, "part 4 copied over");
  be.accumulate_scanned(buf.data() + offsets[6], poison.data() + offsets[6], lengths[6],
                        accumulate_mode::copy, *scans, 6);
  BOOST_TEST(scan_of_parts(be, *scans).nonfinite, "inf copied into part 6");
  be.accumulate_scanned(buf.data() + offsets[6], nullptr, lengths[6], accumulate_mode::zero, *scans,
                        6);
  const scan_result cleared = scan_of_parts(be, *scans);
  BOOST_TEST(!cleared.nonfinite, "part 6 zeroed");
  // Parts 4 (first only now) and 6 (zero) changed: the sum follows.
  for (int64_t i = offsets[4]; i < offsets[4] + lengths[4]; ++i)
    parts_only[i] = first[i];
  for (int64_t i = offsets[6]; i < offsets[6] + lengths[6]; ++i)
    parts_only[i] = 0.0f;
  const double after = sum_of_squares(parts_only);
  BOOST_TEST(std::abs(cleared.sum_squares - after) <= 1e-12 * after);
}

/// accumulate_pieces_scanned: a bucket packed from the pieces of several source buffers (odd
/// lengths and offsets, aligned and not, gaps between some), copied and then added, against the
/// same pieces written by host arithmetic: the bits of every element (the gaps zero after a
/// copy) and the part's scan against a double sum (relative 1e-12); a NaN in one piece found; a
/// bucket of more pieces than one CUDA launch takes (kPieceScanTable) the same.
inline void check_piece_scans(compute_backend& be) {
  using namespace part_scans_detail;
  for (const int count : {9, 70, 600}) {  // 600: more than a launch's table (the fallback)
    std::vector<int64_t> lengths;
    for (int k = 0; k < count; ++k)
      lengths.push_back(k == 3 ? 300'001 : k % 4 == 0 ? 4 * (k + 1) : 17 * k + 1);
    int64_t src_total = 0, dst_total = 0;
    std::vector<int64_t> src_at, dst_at;
    for (int k = 0; k < count; ++k) {
      src_total += k % 3;  // sources at odd offsets, some 16-byte aligned
      src_at.push_back(src_total);
      src_total += lengths[k];
      dst_total += k % 5 == 2 ? 3 : 0;  // a gap before some pieces
      dst_at.push_back(dst_total);
      dst_total += lengths[k];
    }
    const int64_t n = dst_total + 2;  // and after the last
    const std::vector<float> first = random_floats(src_total, 21, -2.0f, 2.0f);
    const std::vector<float> second = random_floats(src_total, 22, -2.0f, 2.0f);
    const device_buffer a = upload(be, first), b = upload(be, second);
    device_buffer bucket = upload(be, random_floats(n, 23));  // stale values: the copy clears
    std::unique_ptr<part_scans> scans = be.make_part_scans(2);
    const auto pieces_of = [&](const device_buffer& src) {
      std::vector<copy_piece> pieces;
      for (int k = 0; k < count; ++k)
        pieces.push_back({src.data() + src_at[k], dst_at[k], lengths[k]});
      return pieces;
    };
    std::vector<float> expected(static_cast<size_t>(n), 0.0f);
    for (int k = 0; k < count; ++k)
      for (int64_t i = 0; i < lengths[k]; ++i)
        expected[dst_at[k] + i] = first[src_at[k] + i];
    const auto check = [&](const char* what) {
      const std::vector<float> got = download(be, bucket);
      int64_t differing = 0;
      for (int64_t i = 0; i < n; ++i)
        differing += std::memcmp(&got[i], &expected[i], sizeof(float)) != 0;
      BOOST_TEST(differing == 0, count << " pieces, " << what << ": elements whose bits differ");
      const double reference = sum_of_squares(expected);
      const scan_result scan = scan_of_parts(be, *scans);
      BOOST_TEST(!scan.nonfinite);
      BOOST_TEST(std::abs(scan.sum_squares - reference) <= 1e-12 * reference,
                 count << " pieces, " << what << ": sum of squares " << scan.sum_squares
                       << ", double reference " << reference);
    };
    be.accumulate_pieces_scanned(bucket.data(), n, pieces_of(a), accumulate_mode::copy, *scans, 1);
    check("copied");
    // The same scan without the copy (scan_pieces: the store's gradient read in place), bit for
    // bit, into a destination that keeps what it held.
    {
      const std::vector<float> stale = random_floats(n, 24);
      const device_buffer untouched = upload(be, stale);
      std::unique_ptr<part_scans> alone = be.make_part_scans(2);
      be.scan_pieces(untouched.data(), n, pieces_of(a), *alone, 1);
      const scan_result copied = scan_of_parts(be, *scans), scanned = scan_of_parts(be, *alone);
      BOOST_TEST(!scanned.nonfinite);
      BOOST_TEST(std::memcmp(&copied.sum_squares, &scanned.sum_squares, sizeof(double)) == 0,
                 count << " pieces, scan_pieces: " << scanned.sum_squares << " against the copy's "
                       << copied.sum_squares);
      BOOST_TEST(download(be, untouched) == stale, count << " pieces, scan_pieces wrote");
      // A destination one float past a 16-byte boundary (a bucket's offset in the store's
      // buffer): the copy's grouping changes, and the scan alone follows it.
      device_buffer shifted = upload(be, stale);
      std::unique_ptr<part_scans> copy_shifted = be.make_part_scans(1),
                                  scan_shifted = be.make_part_scans(1);
      be.accumulate_pieces_scanned(shifted.data() + 1, n - 1, pieces_of(a), accumulate_mode::copy,
                                   *copy_shifted, 0);
      be.scan_pieces(untouched.data() + 1, n - 1, pieces_of(a), *scan_shifted, 0);
      const double by_copy = scan_of_parts(be, *copy_shifted).sum_squares,
                   by_scan = scan_of_parts(be, *scan_shifted).sum_squares;
      BOOST_TEST(std::memcmp(&by_copy, &by_scan, sizeof(double)) == 0,
                 count << " pieces, shifted by one: " << by_scan << " against " << by_copy);
      std::vector<float> bad(first);
      bad[src_at[count - 1]] = std::numeric_limits<float>::infinity();
      const device_buffer poison = upload(be, bad);
      be.scan_pieces(untouched.data(), n, pieces_of(poison), *alone, 1);
      BOOST_TEST(scan_of_parts(be, *alone).nonfinite, count << " pieces: an inf scanned");
    }
    // Added where every element is covered: the bucket's own run of pieces, back to back.
    std::vector<copy_piece> whole;
    for (int64_t at = 0; at < n; at += 1000 + at % 7)
      whole.push_back({b.data() + at % 5, at, std::min<int64_t>(1000 + at % 7, n - at)});
    be.accumulate_pieces_scanned(bucket.data(), n, whole, accumulate_mode::add, *scans, 1);
    for (const copy_piece& p : whole)
      for (int64_t i = 0; i < p.n; ++i)
        expected[p.dst_offset + i] += second[p.src - b.data() + i];
    check("added");
    std::vector<float> bad(first);
    bad[src_at[3] + 12'345] = std::numeric_limits<float>::quiet_NaN();
    const device_buffer poison = upload(be, bad);
    be.accumulate_pieces_scanned(bucket.data(), n, pieces_of(poison), accumulate_mode::copy, *scans,
                                 1);
    BOOST_TEST(scan_of_parts(be, *scans).nonfinite, count << " pieces: a NaN copied in");
  }
}

}  // namespace zmuon::test
