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
  be.scan_parts_async(scans, &out);
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

}  // namespace zmuon::test
