// A backend's calls over several parameters (momentum_slices, muon_update_slices,
// scalar_update_slices, copy_pieces) against its per-parameter calls, bit for bit, on a layout like
// the store's (test_kernels on the host backend, test_cuda_kernels on the CUDA one, whose slice
// kernels are its own).
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/compute.hpp"
#include "support/host_kernels.hpp"

namespace zmuon::test {

namespace slice_detail {

/// Elements whose bits differ.
inline int64_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t count = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    count += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return count
         + static_cast<int64_t>(a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

}  // namespace slice_detail

/// 150 parameters (more than one launch's table of the CUDA kernels), of lengths from 0 to
/// 70,000 (blocks of several slices and slices of several blocks), whose shards lie in table
/// order with gaps (the AdamW parameters between them) and whose state, like a Muon chunk's,
/// begins at `origin` inside the state buffer; every other slice starts at a multiple of 4
/// elements in every array, the others anywhere.
inline void check_slice_calls(compute_backend& be) {
  using namespace slice_detail;
  constexpr int kParams = 150;
  constexpr int64_t kOrigin = 96;
  std::vector<param_slice> slices;
  int64_t shard_end = 0;
  int64_t state_end = kOrigin;
  for (int k = 0; k < kParams; ++k) {
    const int64_t n = k % 11 == 0 ? 0 : k % 17 == 0 ? 70'000 : (k * 379) % 2500 + 1;
    shard_end += 5;    // another parameter's shard
    if (k % 2 == 0) {  // every other slice 16-byte aligned (the CUDA kernels' 4-wide accesses)
      shard_end = (shard_end + 3) / 4 * 4;
      state_end = (state_end + 3) / 4 * 4;
    }
    slices.push_back(param_slice{shard_end, state_end, n, 0.5f + 0.01f * static_cast<float>(k)});
    shard_end += n;
    state_end += n;
  }
  const int64_t chunk = state_end - kOrigin;
  const std::vector<float> g0 = random_floats(shard_end, 1), p0 = random_floats(shard_end, 2);
  const std::vector<float> m0 = random_floats(state_end, 3);
  std::vector<float> v_pos = random_floats(state_end, 4);
  for (float& x : v_pos)
    x = x * x;  // second moments are not negative
  const device_buffer g = upload(be, g0);
  std::vector<param_slice> reordered(slices.rbegin(), slices.rend());  // last slice first
  std::swap(reordered[3], reordered[kParams / 2]);

  // momentum: fp32 and bf16 u, nesterov on and off.
  for (const bool bf16 : {false, true}) {
    for (const bool nesterov : {true, false}) {
      device_buffer m_each = upload(be, m0), m_all = upload(be, m0);
      const int64_t u_floats = bf16 ? (chunk + 1) / 2 : chunk;
      device_buffer u_each = upload(be, random_floats(u_floats, 5)),
                    u_all = upload(be, random_floats(u_floats, 5));
      for (const param_slice& s : slices) {
        const int64_t at = s.state_offset - kOrigin;
        if (bf16)
          be.momentum_to_bf16(m_each.data() + s.state_offset, g.data() + s.shard_offset,
                              reinterpret_cast<uint16_t*>(u_each.data()) + at, s.n, 0.95f,
                              nesterov);
        else
          be.momentum(m_each.data() + s.state_offset, g.data() + s.shard_offset, u_each.data() + at,
                      s.n, 0.95f, nesterov);
      }
      const auto as_u = [bf16](device_buffer& b) {  // the buffer as fp32 or as bf16 bits
        return bf16 ? fp32_or_bf16{nullptr, reinterpret_cast<uint16_t*>(b.data())}
                    : fp32_or_bf16{b.data(), nullptr};
      };
      // In another order than the state's, as the store passes a chunk's slices (table order).
      be.momentum_slices(m_all.data(), m_all.data(), g.data(), as_u(u_all), kOrigin, reordered,
                         0.95f, nesterov, {});
      const std::string what = std::string("momentum_slices, ") + (bf16 ? "bf16" : "fp32")
                               + (nesterov ? ", nesterov" : "");
      BOOST_TEST(differing(download(be, m_all), download(be, m_each)) == 0, what << ": m");
      BOOST_TEST(differing(download(be, u_all), download(be, u_each)) == 0, what << ": u");

      // The new momentum into another buffer (the store's spare): m as it was, the other buffer
      // and u with the in-place call's bits; where no slice lies, the other buffer untouched.
      const std::vector<float> spare0 = random_floats(m0.size(), 5);
      device_buffer m_kept = upload(be, m0), spare = upload(be, spare0),
                    u_spare = upload(be, random_floats(u_floats, 5));
      be.momentum_slices(m_kept.data(), spare.data(), g.data(), as_u(u_spare), kOrigin, slices,
                         0.95f, nesterov, {});
      BOOST_TEST(differing(download(be, m_kept), m0) == 0, what << ", to a spare: m unchanged");
      BOOST_TEST(differing(download(be, u_spare), download(be, u_each)) == 0,
                 what << ", to a spare: u");
      const std::vector<float> spare_got = download(be, spare), m_want = download(be, m_each);
      std::vector<bool> covered(m0.size(), false);
      for (const param_slice& s : slices)
        std::fill_n(covered.begin() + s.state_offset, s.n, true);
      int64_t wrong = 0;
      for (size_t i = 0; i < spare_got.size(); ++i)
        wrong += spare_got[i] != (covered[i] ? m_want[i] : spare0[i]);
      BOOST_TEST(wrong == 0, what << ", to a spare: the new momentum there, nothing else");
    }
  }

  // momentum with a scan of the gradients it reads, into one part over two calls (the first
  // writes it, over what an earlier call left there; the second adds): the sum of squares of
  // the slices' gradients, a NaN between the slices unseen, one inside a slice seen; m and u the
  // bits of the call without a scan. scan_parts_async sums only the parts it is asked for.
  {
    const std::vector<param_slice> first_half(slices.begin(), slices.begin() + kParams / 2),
        second_half(slices.begin() + kParams / 2, slices.end());
    std::vector<float> g_gaps = g0;  // NaN wherever no slice reads
    std::vector<bool> read(g0.size(), false);
    double want = 0.0;
    for (const param_slice& s : slices)
      for (int64_t i = s.shard_offset; i < s.shard_offset + s.n; ++i) {
        read[i] = true;
        want += static_cast<double>(g0[i]) * static_cast<double>(g0[i]);
      }
    for (size_t i = 0; i < g_gaps.size(); ++i)
      if (!read[i])
        g_gaps[i] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> g_inside = g0;
    g_inside[slices.back().shard_offset + slices.back().n / 2] =
        std::numeric_limits<float>::infinity();
    const device_buffer gaps = upload(be, g_gaps), inside = upload(be, g_inside);
    const std::unique_ptr<part_scans> scans = be.make_part_scans(3);
    device_buffer m_plain = upload(be, m0), m_scan = upload(be, m0), m_dirty = upload(be, m0);
    device_buffer u_plain = upload(be, random_floats(chunk, 5)),
                  u_scan = upload(be, random_floats(chunk, 5));
    const auto u_of = [](device_buffer& b) { return fp32_or_bf16{b.data(), nullptr}; };
    be.momentum_slices(m_dirty.data(), m_dirty.data(), inside.data(), u_of(u_scan), kOrigin, slices,
                       0.95f, true, scan_into{scans.get(), 1, true});  // a NaN left there
    be.momentum_slices(m_plain.data(), m_plain.data(), g.data(), u_of(u_plain), kOrigin, slices,
                       0.95f, true, {});
    be.momentum_slices(m_scan.data(), m_scan.data(), gaps.data(), u_of(u_scan), kOrigin, first_half,
                       0.95f, true, scan_into{scans.get(), 1, true});
    be.momentum_slices(m_scan.data(), m_scan.data(), gaps.data(), u_of(u_scan), kOrigin,
                       second_half, 0.95f, true, scan_into{scans.get(), 1, false});
    scan_result got, none;
    be.scan_parts_async(*scans, 3, &got, [] {});
    be.scan_parts_async(*scans, 1, &none, [] {});
    be.synchronize();
    BOOST_TEST(!got.nonfinite, "momentum_slices' scan: a NaN outside the slices counted");
    BOOST_TEST(std::abs(got.sum_squares - want) <= 1e-12 * want,
               "momentum_slices' scan: " << got.sum_squares << ", want " << want);
    BOOST_TEST((!none.nonfinite && none.sum_squares == 0.0), "scan_parts_async, part 0 alone");
    BOOST_TEST(differing(download(be, m_scan), download(be, m_plain)) == 0, "scanned: m");
    BOOST_TEST(differing(download(be, u_scan), download(be, u_plain)) == 0, "scanned: u");
    be.momentum_slices(m_scan.data(), m_scan.data(), inside.data(), u_of(u_scan), kOrigin,
                       second_half, 0.95f, true, scan_into{scans.get(), 2, true});
    be.scan_parts_async(*scans, 3, &got, [] {});
    be.synchronize();
    BOOST_TEST(got.nonfinite, "momentum_slices' scan: an infinity inside a slice");
  }

  // Every third slice's gradient read where it lies elsewhere (param_slice::grad: the store's
  // gradient read in place), some of them at unaligned addresses, and the buffer's copy of it
  // poisoned: momentum_slices and scalar_update_slices give the per-parameter calls' bits.
  {
    std::vector<param_slice> elsewhere = slices;
    std::vector<float> own_host, poisoned = g0;
    std::vector<int64_t> own_at(slices.size(), -1);
    for (size_t k = 0; k < slices.size(); k += 3) {
      own_host.resize(own_host.size() + k % 2);
      own_at[k] = static_cast<int64_t>(own_host.size());
      const auto first = g0.begin() + slices[k].shard_offset;
      own_host.insert(own_host.end(), first, first + slices[k].n);
      std::fill(poisoned.begin() + slices[k].shard_offset,
                poisoned.begin() + slices[k].shard_offset + slices[k].n,
                std::numeric_limits<float>::quiet_NaN());
    }
    own_host.push_back(0.0f);
    const device_buffer own = upload(be, own_host), g_poisoned = upload(be, poisoned);
    for (size_t k = 0; k < slices.size(); ++k)
      if (own_at[k] >= 0)
        elsewhere[k].grad = own.data() + own_at[k];
    device_buffer m_each = upload(be, m0), m_all = upload(be, m0);
    device_buffer u_each = upload(be, random_floats(chunk, 5)),
                  u_all = upload(be, random_floats(chunk, 5));
    device_buffer p_each = upload(be, p0), p_all = upload(be, p0);
    device_buffer v_each = upload(be, v_pos), v_all = upload(be, v_pos);
    for (const param_slice& s : slices)
      be.momentum(m_each.data() + s.state_offset, g.data() + s.shard_offset,
                  u_each.data() + (s.state_offset - kOrigin), s.n, 0.95f, true);
    be.momentum_slices(m_all.data(), m_all.data(), g_poisoned.data(),
                       fp32_or_bf16{u_all.data(), nullptr}, kOrigin, elsewhere, 0.95f, true, {});
    BOOST_TEST(differing(download(be, m_all), download(be, m_each)) == 0, "momentum, own: m");
    BOOST_TEST(differing(download(be, u_all), download(be, u_each)) == 0, "momentum, own: u");
    const scalar_args args{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
    for (const param_slice& s : slices)
      be.scalar_update(p_each.data() + s.shard_offset, g.data() + s.shard_offset,
                       m_each.data() + s.state_offset, v_each.data() + s.state_offset, s.n, args);
    be.scalar_update_slices(p_all.data(), g_poisoned.data(), m_all.data(), v_all.data(), elsewhere,
                            args);
    BOOST_TEST(differing(download(be, p_all), download(be, p_each)) == 0, "adamw, own: p");
    BOOST_TEST(differing(download(be, v_all), download(be, v_each)) == 0, "adamw, own: v");
  }

  // apply_update: fp32 and bf16 updates, each slice with its own scale.
  for (const bool bf16 : {false, true}) {
    device_buffer p_each = upload(be, p0), p_all = upload(be, p0);
    const device_buffer o = upload(be, random_floats(bf16 ? (chunk + 1) / 2 : chunk, 6));
    auto* o_bits = reinterpret_cast<uint16_t*>(const_cast<float*>(o.data()));
    for (const param_slice& s : slices) {
      const int64_t at = s.state_offset - kOrigin;
      if (bf16)
        be.apply_update_bf16(p_each.data() + s.shard_offset, o_bits + at, s.n, 0.02f, s.scale,
                             0.1f);
      else
        be.apply_update(p_each.data() + s.shard_offset, o.data() + at, s.n, 0.02f, s.scale, 0.1f);
    }
    fp32_or_bf16 update;
    if (bf16)
      update.bf16 = o_bits;
    else
      update.f32 = const_cast<float*>(o.data());
    muon_rule rule;
    rule.lr = 0.02f;
    rule.weight_decay = 0.1f;
    be.muon_update_slices(p_all.data(), update, kOrigin, slices, rule);
    BOOST_TEST(differing(download(be, p_all), download(be, p_each)) == 0,
               "muon_update_slices, " << (bf16 ? "bf16" : "fp32"));
  }

  // copy_pieces: each slice's gradient, from a buffer of its own, packed at its shard offset
  // (the reduce() hand-over's packing of a bucket); the gaps keep what was there.
  std::vector<device_buffer> sources;
  std::vector<copy_piece> pieces;
  for (const param_slice& s : slices) {
    const int64_t skip = sources.size() % 2 == 0 ? 0 : 3;  // aligned sources, and others
    sources.push_back(
        upload(be, random_floats(s.n + skip, 7 + static_cast<uint32_t>(sources.size()))));
    pieces.push_back(copy_piece{sources.back().data() + skip, s.shard_offset, s.n});
  }
  device_buffer packed_each = upload(be, p0), packed_all = upload(be, p0);
  for (const copy_piece& piece : pieces)
    be.copy(packed_each.data() + piece.dst_offset, piece.src, piece.n);
  be.copy_pieces(packed_all.data(), pieces);
  BOOST_TEST(differing(download(be, packed_all), download(be, packed_each)) == 0, "copy_pieces");

  // adamw: two steps (the bias corrections change), state from offset 0 here too.
  device_buffer p_each = upload(be, p0), p_all = upload(be, p0);
  device_buffer m_each = upload(be, m0), m_all = upload(be, m0);
  device_buffer v_each = upload(be, v_pos), v_all = upload(be, v_pos);
  for (int64_t step = 1; step <= 2; ++step) {
    const scalar_args args{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
    for (const param_slice& s : slices)
      be.scalar_update(p_each.data() + s.shard_offset, g.data() + s.shard_offset,
                       m_each.data() + s.state_offset, v_each.data() + s.state_offset, s.n, args);
    be.scalar_update_slices(p_all.data(), g.data(), m_all.data(), v_all.data(), slices, args);
  }
  BOOST_TEST(differing(download(be, p_all), download(be, p_each)) == 0, "scalar_update_slices: p");
  BOOST_TEST(differing(download(be, m_all), download(be, m_each)) == 0, "scalar_update_slices: m");
  BOOST_TEST(differing(download(be, v_all), download(be, v_each)) == 0, "scalar_update_slices: v");
}

}  // namespace zmuon::test
