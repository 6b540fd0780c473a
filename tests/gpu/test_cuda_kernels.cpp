// Every CUDA kernel against the host backend, on fresh random inputs (seed printed) of sizes that
// are no multiple of the block size, plus one buffer past 2^31 elements (8.6 GB) for the 64-bit
// index math. Tolerances (‖gpu − host‖ / ‖host‖, see the constants below): fp32 element-wise
// ≤ 1e-6; one Newton-Schulz iteration (bf16 GEMMs) against the fp32 host in [1e-3, 1e-2]; NS5
// within 1e-2 of a host emulation of the same bf16 arithmetic and 3e-2 of fp32 NS5; the Gram
// variant within 5e-2 of the standard path and of fp32 Gram, Polar Express beating NS5's
// orthogonality error (bounds where they are checked). Without a
// usable GPU the executable exits with 77 before Boost.Test starts, which ctest reports as
// "Skipped" (cmake/cuda.cmake). The Newton-Schulz suite is in test_cuda_newton_schulz.cpp (the
// same executable); the helpers both use are in cuda_test_env.hpp.

#define BOOST_TEST_MODULE test_cuda_kernels
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <iostream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/compute.hpp"
#include "kernels/cuda/cuda_compute.hpp"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/ns_tuning.hpp"
#include "kernels/cuda/sm90/sm90_gemm.hpp"
#include "kernels/ns_variants.hpp"
#include "support/bf16_reference.hpp"
#include "support/cuda_test_env.hpp"
#include "support/ns_accuracy.hpp"
#include "support/part_scans.hpp"
#include "support/slice_calls.hpp"

namespace zmuon {
using namespace cuda_test;

BOOST_AUTO_TEST_SUITE(memory)

BOOST_AUTO_TEST_CASE(allocate_zeroes_and_copies_round_trip) {
  compute_backend& gpu = *env().gpu;
  for (const int64_t n : kSizes) {
    device_buffer buffer = gpu.allocate(n);
    BOOST_TEST(buffer.size() == n);
    const std::vector<float> zeros = download(gpu, buffer.data(), n);
    BOOST_TEST(mismatches(zeros, std::vector<float>(static_cast<size_t>(n), 0.0f)) == 0);

    const std::vector<float> values = random_vector(n);
    gpu.copy_from_host(buffer.data(), values.data(), n);
    BOOST_TEST(mismatches(download(gpu, buffer.data(), n), values) == 0);

    device_buffer other = gpu.allocate(n);
    gpu.copy(other.data(), buffer.data(), n);
    BOOST_TEST(mismatches(download(gpu, other.data(), n), values) == 0);

    gpu.fill_zero(other.data(), n);
    BOOST_TEST(mismatches(download(gpu, other.data(), n), zeros) == 0);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(elementwise)

BOOST_AUTO_TEST_CASE(add) {
  for (const int64_t n : kSizes) {
    mirrored dst(random_vector(n));
    mirrored src(random_vector(n));
    env().host->add(dst.host.data(), src.host.data(), n);
    env().gpu->add(dst.gpu.data(), src.gpu.data(), n);
    check_elementwise("add", n, dst.error());
  }
}

BOOST_AUTO_TEST_CASE(scale) {
  for (const int64_t n : kSizes) {
    mirrored x(random_vector(n));
    const float factor = 1.0f / 65536.0f * 3.0f;
    env().host->scale(x.host.data(), n, factor);
    env().gpu->scale(x.gpu.data(), n, factor);
    check_elementwise("scale", n, x.error());
  }
}

BOOST_AUTO_TEST_CASE(scan_and_frobenius_norm) {
  for (const int64_t n : kSizes) {
    mirrored x(random_vector(n, 3.0f));
    const scan_result host = env().host->scan(x.host.data(), n);
    const scan_result gpu = env().gpu->scan(x.gpu.data(), n);
    BOOST_TEST(!host.nonfinite);
    BOOST_TEST(!gpu.nonfinite);
    const double scan_error = std::abs(gpu.sum_squares - host.sum_squares) / host.sum_squares;
    check_elementwise("scan sum of squares", n, scan_error);

    const double host_norm = env().host->frobenius_norm(x.host.data(), n);
    const double gpu_norm = env().gpu->frobenius_norm(x.gpu.data(), n);
    check_elementwise("frobenius_norm", n, std::abs(gpu_norm - host_norm) / host_norm);
  }
}

// The scans that do not wait (the vote's) land through the backend's completion thread while
// the stream goes on: each lands its own sums, a synchronous scan between them takes nothing of
// theirs, and every callback runs after its work and in the order it was asked for.
BOOST_AUTO_TEST_CASE(scans_that_do_not_wait_each_land_their_own_result) {
  compute_backend& gpu = *env().gpu;
  constexpr int kScans = 24;
  const int64_t n = 1 << 20;  // long enough that several are in flight at once
  std::vector<mirrored> xs;
  for (int i = 0; i < kScans; ++i)
    xs.emplace_back(random_vector(n, 1.0f + static_cast<float>(i)));
  std::vector<scan_result> landed(kScans), waited(kScans);
  std::vector<int> order;  // written by the completion thread alone
  std::vector<bool> seen_landed(kScans, false);
  std::promise<void> all_done;
  for (int i = 0; i < kScans; ++i) {
    gpu.scan_async(xs[i].gpu.data(), n, &landed[i], [&, i] {
      order.push_back(i);
      seen_landed[i] = landed[i].sum_squares > 0.0;
    });
    if (i % 3 == 1)  // a synchronous scan between them, of another buffer
      waited[i] = gpu.scan(xs[kScans - 1 - i].gpu.data(), n);
  }
  gpu.when_done([&] { all_done.set_value(); });
  BOOST_REQUIRE(all_done.get_future().wait_for(std::chrono::seconds(30))
                == std::future_status::ready);
  for (int i = 0; i < kScans; ++i) {
    const scan_result alone = gpu.scan(xs[i].gpu.data(), n);
    BOOST_TEST(landed[i].sum_squares == alone.sum_squares, "scan " << i);
    BOOST_TEST(!landed[i].nonfinite);
    BOOST_TEST(seen_landed[i], "scan " << i << " had landed when its callback ran");
    if (i % 3 == 1)
      BOOST_TEST(waited[i].sum_squares == gpu.scan(xs[kScans - 1 - i].gpu.data(), n).sum_squares);
  }
  std::vector<int> in_order(kScans);
  for (int i = 0; i < kScans; ++i)
    in_order[i] = i;
  BOOST_TEST(order == in_order);
}

BOOST_AUTO_TEST_CASE(scan_finds_every_non_finite) {
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (const int64_t n : kSizes) {
    std::vector<float> values = random_vector(n);
    const int64_t positions[] = {0, n / 2, n - 1};
    for (const int64_t at : positions) {
      for (const float special : specials) {
        const float saved = values[static_cast<size_t>(at)];
        values[static_cast<size_t>(at)] = special;
        mirrored x(values);
        BOOST_TEST(env().host->scan(x.host.data(), n).nonfinite);
        BOOST_TEST(env().gpu->scan(x.gpu.data(), n).nonfinite, "n=" << n << " at " << at);
        values[static_cast<size_t>(at)] = saved;
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(momentum) {
  for (const bool nesterov : {true, false}) {
    for (const int64_t n : kSizes) {
      mirrored m(random_vector(n));
      mirrored g(random_vector(n));
      mirrored u(random_vector(n));  // overwritten: anything but its old value is a write
      env().host->momentum(m.host.data(), g.host.data(), u.host.data(), n, 0.95f, nesterov);
      env().gpu->momentum(m.gpu.data(), g.gpu.data(), u.gpu.data(), n, 0.95f, nesterov);
      const std::string what = nesterov ? "momentum (nesterov)" : "momentum";
      // Both are sums that may cancel: their rounding is that of the terms (0.05 g at least).
      check_elementwise(what + " m", n, m.error_at_scale(0.05));
      check_elementwise(what + " u", n, u.error_at_scale(0.05));
    }
  }
}

BOOST_AUTO_TEST_CASE(apply_update) {
  for (const int64_t n : kSizes) {
    mirrored p(random_vector(n));
    mirrored o(random_vector(n));
    env().host->apply_update(p.host.data(), o.host.data(), n, 0.02f, 1.7320508f, 0.1f);
    env().gpu->apply_update(p.gpu.data(), o.gpu.data(), n, 0.02f, 1.7320508f, 0.1f);
    check_elementwise("apply_update", n, p.error());
  }
}

BOOST_AUTO_TEST_CASE(adamw) {
  for (const int64_t n : kSizes) {
    mirrored p(random_vector(n));
    mirrored m(random_vector(n, 0.1f));
    std::vector<float> v_values = random_vector(n, 0.01f);
    for (float& v : v_values)
      v = std::abs(v);  // a second moment is never negative
    mirrored v(v_values);
    scalar_args args;
    args.lr = 3e-4f;
    args.weight_decay = 0.1f;
    for (int64_t step = 1; step <= 3; ++step) {
      args.step = step;
      mirrored g(random_vector(n));
      env().host->scalar_update(p.host.data(), g.host.data(), m.host.data(), v.host.data(), n,
                                args);
      env().gpu->scalar_update(p.gpu.data(), g.gpu.data(), m.gpu.data(), v.gpu.data(), n, args);
    }
    check_elementwise("adamw p", n, p.error());
    // m = 0.9 m + 0.1 g may cancel to far below its terms (σ 0.1): one rounding of the terms
    // (the GPU fuses one product into an fma, the host does not) is then large beside it.
    check_elementwise("adamw m", n, m.error_at_scale(0.1));
    check_elementwise("adamw v", n, v.error());
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(bf16_transport)

// The Muon transport's conversions: the CUDA kernels give the host backend's bits exactly
// (both use kernels/bf16.hpp; the host is checked against an arithmetic reference in
// test_kernels): every tie and its neighbours, inf/NaN, subnormals, 10^6 random bit patterns;
// bf16 -> fp32 for all 65536 patterns. The buffers start at an odd bf16 offset.
BOOST_AUTO_TEST_CASE(bf16_conversion_equals_host_bit_for_bit) {
  compute_backend& gpu = *env().gpu;
  compute_backend& host = *env().host;
  const std::vector<float> in = test::bf16_test_inputs(1'000'000, 20261203);
  const auto n = static_cast<int64_t>(in.size());
  std::vector<uint16_t> want(in.size());
  host.to_bf16(want.data(), in.data(), n);

  device_buffer src = upload(gpu, in);
  device_buffer bits = gpu.allocate(n / 2 + 2);  // n + 1 bf16 of storage
  auto* dst = reinterpret_cast<uint16_t*>(bits.data()) + 1;
  gpu.to_bf16(dst, src.data(), n);
  std::vector<float> storage = download(gpu, bits.data(), bits.size());
  std::vector<uint16_t> got(in.size());
  std::memcpy(got.data(), reinterpret_cast<const uint16_t*>(storage.data()) + 1,
              got.size() * sizeof(uint16_t));
  int64_t wrong = 0;
  for (size_t i = 0; i < in.size(); ++i)
    wrong += got[i] != want[i];
  BOOST_TEST(wrong == 0, wrong << " of " << n << " conversions differ from the host's");

  std::vector<uint16_t> all(65537);
  for (uint32_t b = 0; b < 65536; ++b)
    all[b + 1] = static_cast<uint16_t>(b);
  std::vector<float> packed((all.size() + 1) / 2);
  std::memcpy(packed.data(), all.data(), all.size() * sizeof(uint16_t));
  device_buffer all_gpu = upload(gpu, packed);
  device_buffer wide = gpu.allocate(65536);
  gpu.from_bf16(wide.data(), reinterpret_cast<const uint16_t*>(all_gpu.data()) + 1, 65536);
  std::vector<float> wide_gpu = download(gpu, wide.data(), 65536);
  std::vector<float> wide_host(65536);
  host.from_bf16(wide_host.data(), all.data() + 1, 65536);
  int64_t wrong_wide = 0;
  for (size_t i = 0; i < wide_host.size(); ++i)
    wrong_wide += std::memcmp(&wide_gpu[i], &wide_host[i], sizeof(float)) != 0;
  BOOST_TEST(wrong_wide == 0);
}

/// n bf16 values of `input` rounded on the GPU, in a buffer of (n + 1) / 2 floats.
device_buffer gpu_bf16(compute_backend& gpu, const std::vector<float>& input) {
  const auto n = static_cast<int64_t>(input.size());
  device_buffer wide = upload(gpu, input);
  device_buffer bits = gpu.allocate((n + 1) / 2);
  gpu.to_bf16(reinterpret_cast<uint16_t*>(bits.data()), wide.data(), n);
  return bits;
}

uint16_t* bits_of(device_buffer& b) {
  return reinterpret_cast<uint16_t*>(b.data());
}

/// bf16 values (two per float of storage) of a and b that differ.
int64_t bf16_mismatches(compute_backend& gpu, device_buffer& a, device_buffer& b, int64_t n) {
  const std::vector<float> x = download(gpu, a.data(), a.size());
  const std::vector<float> y = download(gpu, b.data(), b.size());
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i)
    count += reinterpret_cast<const uint16_t*>(x.data())[i]
             != reinterpret_cast<const uint16_t*>(y.data())[i];
  return count;
}

// The calls that read or write bf16 directly (the Muon phase under bf16 transport, where no fp32
// copy of a chunk exists) give the bits of the fp32 calls with to_bf16 after or from_bf16 before
// them: momentum (u and m), the Muon update, and Newton-Schulz in both variants, wide, tall and
// square, batched.
// The CUDA backend's slice kernels (one launch per 64 parameters) give the bits of its
// per-parameter kernels at each slice's offsets (support/slice_calls.hpp).
BOOST_AUTO_TEST_CASE(slice_calls_equal_per_parameter_calls) {
  test::check_slice_calls(*env().gpu);
}

// The accumulate kernel's scan in the same pass, and the parts summed on the device
// (support/part_scans.hpp).
BOOST_AUTO_TEST_CASE(part_scans_follow_each_accumulate) {
  test::check_part_scans(*env().gpu);
}

// The hand-over's one pass: the accumulate reads the caller's gradients piece by piece, with its
// scan (support/part_scans.hpp; over kPieceScanTable pieces through the packed fallback).
BOOST_AUTO_TEST_CASE(piece_scans_follow_each_accumulate) {
  test::check_piece_scans(*env().gpu);
}

// The nccl comm's copies of a rank's own segments (launch_copy_units): 2-byte units, pieces of
// 0 to 70,000 units, every other one at 8-byte aligned ends, the rest at odd offsets; each lands
// where memcpy puts it and nothing between the pieces is written.
BOOST_AUTO_TEST_CASE(copy_units_equals_memcpy_piece_by_piece) {
  compute_backend& gpu = *env().gpu;
  const int64_t units = 2'000'000;
  std::vector<float> src_host = random_vector(units / 2, 1.0f), dst_host = random_vector(units / 2);
  device_buffer src = upload(gpu, src_host), dst = upload(gpu, dst_host);
  auto* src_units = reinterpret_cast<const uint16_t*>(src.data());
  auto* dst_units = reinterpret_cast<uint16_t*>(dst.data());
  std::vector<uint16_t> expected(units);
  std::memcpy(expected.data(), dst_host.data(), units * sizeof(uint16_t));
  std::vector<gpu::unit_piece> pieces;
  int64_t from = 3, to = 1;
  for (int k = 0; k < 150; ++k) {
    const int64_t n = k % 11 == 0 ? 0 : k % 17 == 0 ? 70'000 : (k * 379) % 2500 + 1;
    if (k % 2 == 0) {  // 8-byte aligned starts (4 units)
      from = (from + 3) / 4 * 4;
      to = (to + 3) / 4 * 4;
    }
    pieces.push_back(gpu::unit_piece{src_units + from, dst_units + to, n});
    std::memcpy(expected.data() + to, reinterpret_cast<const uint16_t*>(src_host.data()) + from,
                static_cast<size_t>(n) * sizeof(uint16_t));
    from += n + 5;
    to += n + 3;
  }
  BOOST_REQUIRE_LT(std::max(from, to), units);
  auto& cuda = dynamic_cast<gpu::cuda_compute&>(gpu);
  gpu::launch_copy_units(gpu::launch_context{cuda.stream()}, pieces);
  const std::vector<float> got = download(gpu, dst.data(), units / 2);
  BOOST_TEST(std::memcmp(got.data(), expected.data(), units * sizeof(uint16_t)) == 0);
}

// copy_spans (gather_params into the caller's device buffers): one source buffer to 100 spans of
// 0 to 40,000 floats in another, on the host backend and on CUDA; the same floats land, and
// nothing between the spans is written.
BOOST_AUTO_TEST_CASE(copy_spans_equal_on_host_and_cuda) {
  const int64_t n = 1'000'000;
  const std::vector<float> src_host = random_vector(n, 1.0f), dst_host = random_vector(n);
  std::vector<float> results[2];
  for (int b = 0; b < 2; ++b) {
    compute_backend& be = b == 0 ? *env().host : *env().gpu;
    device_buffer src = upload(be, src_host), dst = upload(be, dst_host);
    std::vector<copy_span> spans;
    int64_t from = 7, to = 1;
    for (int k = 0; k < 100; ++k) {
      const int64_t len = k % 13 == 0 ? 0 : k % 29 == 0 ? 40'000 : (k * 577) % 3000 + 1;
      spans.push_back({src.data() + from, dst.data() + to, len});
      from += len + 1;
      to += len + 2;
    }
    BOOST_REQUIRE_LT(std::max(from, to), n);
    be.copy_spans(spans);
    results[b] = download(be, dst.data(), n);
  }
  BOOST_TEST(results[0] != dst_host);
  BOOST_TEST(std::memcmp(results[0].data(), results[1].data(), n * sizeof(float)) == 0);
}

// copy_boxes (a matrix the host holds in boxes, put in row-major order for Newton-Schulz and
// back): a [300, 257] matrix as 6 boxes of unequal sizes, fp32 and bf16 elements, on the host
// backend and on CUDA; both ways land the same bytes, and there and back is the identity.
BOOST_AUTO_TEST_CASE(copy_boxes_equal_on_host_and_cuda) {
  const int64_t rows = 300, cols = 257, n = rows * cols;
  const std::vector<matrix_box> boxes{{150, 150, 128, 129}, {0, 150, 0, 128},
                                      {150, 150, 0, 128},   {0, 75, 128, 129},
                                      {75, 50, 128, 129},   {125, 25, 128, 129}};
  const std::vector<float> natural = random_vector(n, 1.0f);
  for (const int elem : {4, 2}) {
    std::vector<float> packed[2], back[2];
    for (int b = 0; b < 2; ++b) {
      compute_backend& be = b == 0 ? *env().host : *env().gpu;
      device_buffer src = upload(be, natural), mid = be.allocate(n), out = be.allocate(n);
      be.copy_boxes(mid.data(), src.data(), cols, boxes, elem, true);
      be.copy_boxes(out.data(), mid.data(), cols, boxes, elem, false);
      packed[b] = download(be, mid.data(), n);
      back[b] = download(be, out.data(), n);
    }
    const size_t bytes = static_cast<size_t>(n) * elem;
    BOOST_TEST(std::memcmp(packed[0].data(), natural.data(), bytes) != 0);
    BOOST_TEST(std::memcmp(packed[0].data(), packed[1].data(), bytes) == 0);
    BOOST_TEST(std::memcmp(back[0].data(), natural.data(), bytes) == 0);
    BOOST_TEST(std::memcmp(back[1].data(), natural.data(), bytes) == 0);
  }
}

BOOST_AUTO_TEST_CASE(bf16_calls_equal_the_fp32_calls_with_conversions) {
  compute_backend& gpu = *env().gpu;
  const int64_t n = 1'000'003;
  const std::vector<float> m0 = random_vector(n, 0.1f), g = random_vector(n, 0.1f);
  device_buffer g_gpu = upload(gpu, g);
  for (const bool nesterov : {true, false}) {
    device_buffer m_fp32 = upload(gpu, m0), m_bf16 = upload(gpu, m0);
    device_buffer u = gpu.allocate(n), u_bits = gpu.allocate((n + 1) / 2);
    device_buffer want = gpu.allocate((n + 1) / 2);
    gpu.momentum(m_fp32.data(), g_gpu.data(), u.data(), n, 0.95f, nesterov);
    gpu.to_bf16(bits_of(want), u.data(), n);
    gpu.momentum_to_bf16(m_bf16.data(), g_gpu.data(), bits_of(u_bits), n, 0.95f, nesterov);
    BOOST_TEST(bf16_mismatches(gpu, u_bits, want, n) == 0);
    BOOST_TEST(mismatches(download(gpu, m_bf16.data(), n), download(gpu, m_fp32.data(), n)) == 0);
  }

  const std::vector<float> p0 = random_vector(n);
  device_buffer o_bits = gpu_bf16(gpu, random_vector(n, 0.01f));
  device_buffer o = gpu.allocate(n);
  gpu.from_bf16(o.data(), bits_of(o_bits), n);
  device_buffer p_fp32 = upload(gpu, p0), p_bf16 = upload(gpu, p0);
  gpu.apply_update(p_fp32.data(), o.data(), n, 0.02f, 1.5f, 0.1f);
  gpu.apply_update_bf16(p_bf16.data(), bits_of(o_bits), n, 0.02f, 1.5f, 0.1f);
  BOOST_TEST(mismatches(download(gpu, p_bf16.data(), n), download(gpu, p_fp32.data(), n)) == 0);

  // Matrices whose sizes allow the normalization's 16-byte accesses and one that does not
  // (33 x 65); odd and even counts of iterations (standard) and of blocks (Gram: restart 3), so
  // that a bf16 result lands in x after either parity (step_output in ns_normalize.hpp); graphs off
  // as well as on (a graph's result is copied back, direct runs write x); and x 256-byte
  // aligned (written directly) or 16 bytes past that (copied back: lands_in_caller_buffer),
  // with the elements before it left alone.
  ns_options gram, gram_one_block, four_steps;
  gram.variant = gram_one_block.variant = ns_variant::gram;
  gram_one_block.steps = 3;
  four_steps.steps = 4;
  auto* cuda = dynamic_cast<gpu::cuda_compute*>(&gpu);
  BOOST_TEST_REQUIRE(cuda != nullptr);
  for (const gpu::graph_mode graphs : {gpu::graph_mode::automatic, gpu::graph_mode::off}) {
    gpu::ns_tuning(*cuda).set_graphs(graphs);
    for (const ns_options& ns : {ns_options{}, four_steps, gram, gram_one_block})
      for (const auto& c : {ns_case{3, 64, 200}, {2, 300, 100}, {4, 96, 96}, {2, 33, 65}})
        for (const int64_t shift : {0, 8}) {
          const int64_t numel = c.batch * c.rows * c.cols;
          const std::vector<float> input = random_vector(numel + shift);
          device_buffer x_bits = gpu_bf16(gpu, input), want = gpu_bf16(gpu, input);
          BOOST_TEST_REQUIRE(reinterpret_cast<uintptr_t>(x_bits.data()) % 256 == 0);
          device_buffer x = gpu.allocate(numel);
          gpu.from_bf16(x.data(), bits_of(x_bits) + shift, numel);
          gpu.newton_schulz(x.data(), c.batch, c.rows, c.cols, ns);
          gpu.to_bf16(bits_of(want) + shift, x.data(), numel);
          const int64_t before = gpu.ns_matrix_count();
          gpu.newton_schulz_bf16(bits_of(x_bits) + shift, c.batch, c.rows, c.cols, ns);
          BOOST_TEST(gpu.ns_matrix_count() - before == c.batch);
          BOOST_TEST(bf16_mismatches(gpu, x_bits, want, numel + shift) == 0,
                     (ns.variant == ns_variant::gram ? "gram " : "standard ")
                         << ns.steps << " steps, " << c.batch << " x [" << c.rows << ", " << c.cols
                         << "], graphs " << (graphs == gpu::graph_mode::off ? "off" : "automatic")
                         << ", shift " << shift);
        }
  }
  gpu::ns_tuning(*cuda).set_graphs(gpu::graph_mode::automatic);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(own_gemm)

/// `values` rounded to bf16 on the device.
gpu::device_array<__nv_bfloat16> bf16_on_device(const std::vector<float>& values) {
  std::vector<__nv_bfloat16> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    bits[i] = __float2bfloat16(values[i]);
  gpu::device_array<__nv_bfloat16> d(static_cast<int64_t>(bits.size()));
  ZMUON_CUDA_CHECK(
      cudaMemcpy(d.data(), bits.data(), bits.size() * sizeof(bits[0]), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> floats_of(const gpu::device_array<__nv_bfloat16>& d, int64_t n) {
  std::vector<__nv_bfloat16> bits(static_cast<size_t>(n));
  ZMUON_CUDA_CHECK(
      cudaMemcpy(bits.data(), d.data(), bits.size() * sizeof(bits[0]), cudaMemcpyDeviceToHost));
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    out[i] = __bfloat162float(bits[i]);
  return out;
}

// The own Hopper GEMM (sm90_gemm.hpp) against cuBLAS's whole product on the same bf16 operands:
// D = alpha P Q^T + beta C, plain and symmetric (upper tiles computed, the rest mirrored: D
// must then be symmetric bit for bit), with and without C (also C in P's own buffer, as NS's
// B = c A A + b A has it), batched, tiles of several k slices, each block shape: one or two
// tiles per block (an odd count of tiles a row leaves a block with one; symmetric sides of 3 to
// 8 tiles pair the odd rows' last tiles down the last column, sharing Q's slices, and leave the
// last block with one for 5 and 6; sm90_tiles.hpp). D starts as NaNs, so
// a tile left unwritten fails. Both sum in fp32, so only the order of the sums may differ:
// within 1e-2 relative (bf16's rounding of the outputs is 4e-3).
BOOST_AUTO_TEST_CASE(against_cublas) {
  if (!gpu::sm90_gemm_available()) {
    BOOST_TEST_MESSAGE("own_gemm: not a compute capability 9.0 device, skipped");
    return;
  }
  struct gemm_case {
    int64_t batch, m, n, k;
    float alpha, beta;
    bool symmetric;
    bool c_is_p = false;  // C is P's own buffer (B = c A A + b A)
  };
  const gemm_case cases[] = {{3, 256, 384, 192, 1.0f, 0.0f, false},
                             {2, 128, 256, 512, 0.5f, 3.4445f, false},
                             {1, 384, 640, 128, 1.0f, 1.0f, false},
                             {3, 384, 384, 256, 1.0f, 0.0f, true},
                             {2, 512, 512, 2048, 2.0315f, -4.7750f, true},
                             {2, 640, 640, 64, 1.0f, -1.0f, true},
                             {2, 768, 768, 192, 1.0f, 0.5f, true},
                             {1, 512, 640, 128, 1.0f, 0.0f, false},
                             {2, 384, 384, 384, 2.0315f, -4.7750f, true, true},
                             {2, 640, 640, 640, 1.0f, -1.0f, true, true},
                             {1, 256, 512, 512, 0.5f, 3.4445f, false, true},
                             {2, 896, 896, 128, 1.0f, 0.5f, true},
                             {1, 1024, 1024, 1024, 2.0315f, -4.7750f, true, true},
                             {1, 4096, 4096, 128, 2.0315f, -4.7750f, true},
                             {2, 2048, 2048, 64, 1.0f, 0.0f, false}};
  const gpu::sm90_block shapes[] = {gpu::sm90_block::automatic, gpu::sm90_block::one_tile,
                                    gpu::sm90_block::two_tiles};
  gpu::cublas_handle cublas;
  gpu::gemm_runner runner(cublas.get());
  for (const gemm_case& g : cases)
    for (const gpu::sm90_block shape : shapes) {
      std::vector<float> p_host = random_vector(g.batch * g.m * g.k);
      if (g.c_is_p && g.symmetric) {  // P = A symmetric, as C must be
        for (int64_t b = 0; b < g.batch; ++b)
          for (int64_t i = 0; i < g.m; ++i)
            for (int64_t j = 0; j < i; ++j)
              p_host[static_cast<size_t>(b * g.m * g.m + j * g.m + i)] =
                  p_host[static_cast<size_t>(b * g.m * g.m + i * g.m + j)];
      }
      const std::vector<float> q_host = g.symmetric ? p_host : random_vector(g.batch * g.n * g.k);
      std::vector<float> c_host = random_vector(g.batch * g.m * g.n);
      if (g.symmetric) {  // C symmetric too, as B = c A A + b A needs
        for (int64_t b = 0; b < g.batch; ++b)
          for (int64_t i = 0; i < g.m; ++i)
            for (int64_t j = 0; j < i; ++j)
              c_host[static_cast<size_t>(b * g.m * g.m + j * g.m + i)] =
                  c_host[static_cast<size_t>(b * g.m * g.m + i * g.m + j)];
      }
      const auto p = bf16_on_device(p_host);
      const auto q = bf16_on_device(q_host);
      const auto c = bf16_on_device(c_host);
      const int64_t out = g.batch * g.m * g.n;
      gpu::device_array<__nv_bfloat16> ours(out);
      gpu::device_array<__nv_bfloat16> want(out);

      gpu::sm90_gemm_args a;
      a.batch = g.batch;
      a.m = g.m;
      a.n = g.n;
      a.k = g.k;
      a.p = {p.data(), g.k, g.m * g.k};
      a.q = {q.data(), g.k, g.n * g.k};
      a.alpha = g.alpha;
      a.beta = g.beta;
      a.c = g.c_is_p ? gpu::sm90_operand{p.data(), g.k, g.m * g.k}
                     : gpu::sm90_operand{c.data(), g.n, g.m * g.n};
      a.d = {ours.data(), g.n, g.m * g.n};
      a.symmetric = g.symmetric;
      a.shape = shape;
      BOOST_REQUIRE(gpu::sm90_gemm_fits(a));
      ZMUON_CUDA_CHECK(cudaMemset(ours.data(), 0xff, static_cast<size_t>(out) * 2));
      gpu::sm90_gemm(nullptr, a);
      gpu::sm90_gemm_on_cublas(runner, nullptr, a, want.data());
      ZMUON_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = floats_of(ours, out);
      const std::vector<float> ref = floats_of(want, out);
      const double error = relative_error(got, ref);
      BOOST_TEST_MESSAGE("own GEMM " << g.batch << " x [" << g.m << ", " << g.n << "] over k "
                                     << g.k << (g.symmetric ? " (symmetric)" : "")
                                     << (g.c_is_p ? " (C is P)" : "") << ", block shape "
                                     << static_cast<int>(shape)
                                     << ": relative difference to cuBLAS " << error);
      BOOST_TEST(error <= 1e-2);
      if (g.symmetric) {
        int64_t asymmetric = 0;
        for (int64_t b = 0; b < g.batch; ++b)
          for (int64_t i = 0; i < g.m; ++i)
            for (int64_t j = 0; j < i; ++j)
              asymmetric += got[static_cast<size_t>(b * g.m * g.m + i * g.m + j)]
                            != got[static_cast<size_t>(b * g.m * g.m + j * g.m + i)];
        BOOST_TEST(asymmetric == 0);
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(large)

// 2^31 + 12345 floats (8.6 GB): element indices past int32, byte offsets past 2^33. Values are
// small integers, so every result is exact and checked without a host copy of the buffer.
BOOST_AUTO_TEST_CASE(scale_and_scan_past_two_to_the_31_elements) {
  compute_backend& gpu = *env().gpu;
  const int64_t n = (int64_t{1} << 31) + 12345;
  const auto value_at = [](int64_t i) { return static_cast<float>(i % 7 - 3); };
  device_buffer x = gpu.allocate(n);
  BOOST_TEST_REQUIRE(x.size() == n);

  const int64_t chunk = 7 * (int64_t{1} << 22);  // a multiple of the pattern's period
  std::vector<float> pattern(static_cast<size_t>(chunk));
  for (int64_t i = 0; i < chunk; ++i)
    pattern[static_cast<size_t>(i)] = value_at(i);
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t len = std::min(chunk, n - at);
    gpu.copy_from_host(x.data() + at, pattern.data(), len);
  }
  // Each period of 7 contributes 9 + 4 + 1 + 0 + 1 + 4 + 9 = 28.
  double sum_squares = 28.0 * static_cast<double>(n / 7);
  for (int64_t i = n - n % 7; i < n; ++i)
    sum_squares += static_cast<double>(value_at(i)) * value_at(i);

  gpu.scale(x.data(), n, 2.0f);
  const scan_result scanned = gpu.scan(x.data(), n);
  BOOST_TEST(!scanned.nonfinite);
  BOOST_TEST(scanned.sum_squares == 4.0 * sum_squares);
  BOOST_TEST(gpu.frobenius_norm(x.data(), n) == std::sqrt(4.0 * sum_squares));

  // The buffer's last million elements and its first, after the scale.
  const int64_t tail = 1000000;
  const std::vector<float> end = download(gpu, x.data() + (n - tail), tail);
  int64_t wrong = 0;
  for (int64_t i = 0; i < tail; ++i)
    wrong += end[static_cast<size_t>(i)] != 2.0f * value_at(n - tail + i);
  BOOST_TEST(wrong == 0);
  const std::vector<float> begin = download(gpu, x.data(), 1000);
  int64_t wrong_begin = 0;
  for (int64_t i = 0; i < 1000; ++i)
    wrong_begin += begin[static_cast<size_t>(i)] != 2.0f * value_at(i);
  BOOST_TEST(wrong_begin == 0);

  // A NaN in the very last element is found.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  gpu.copy_from_host(x.data() + (n - 1), &nan, 1);
  BOOST_TEST(gpu.scan(x.data(), n).nonfinite);
  BOOST_TEST_MESSAGE("scan of " << n << " floats: sum of squares " << scanned.sum_squares
                                << " (exact " << 4.0 * sum_squares << ")");
}

BOOST_AUTO_TEST_SUITE_END()

/// scalar_update_slices() over slices of 300, 1 and 4099 elements against scalar_update() on
/// each slice, under `args`: the parameters bit for bit.
void slices_equal_per_parameter_calls(const scalar_args& args) {
  const std::vector<int64_t> lengths{300, 1, 4099};
  int64_t total = 0;
  std::vector<param_slice> slices;
  for (int64_t len : lengths) {
    slices.push_back(param_slice{total, total, len, 1.0f});
    total += len;
  }
  const auto p0 = random_vector(total), g0 = random_vector(total);
  compute_backend& gpu = *env().gpu;
  device_buffer p_a = upload(gpu, p0), p_b = upload(gpu, p0), g = upload(gpu, g0);
  device_buffer m_a = gpu.allocate(total), v_a = gpu.allocate(total);
  device_buffer m_b = gpu.allocate(total), v_b = gpu.allocate(total);
  gpu.scalar_update_slices(p_a.data(), g.data(), m_a.data(), v_a.data(), slices, args);
  for (const auto& s : slices)
    gpu.scalar_update(p_b.data() + s.shard_offset, g.data() + s.shard_offset,
                      m_b.data() + s.state_offset, v_b.data() + s.state_offset, s.n, args);
  const auto a = download(gpu, p_a.data(), total), b = download(gpu, p_b.data(), total);
  BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Cautious weight decay (arXiv:2510.12402) and NorMuon's row normalization (arXiv:2510.05491)
// against the host backend: p and the update of mixed signs with a large decay, so that the mask
// decides about half the elements. The normalization sums in double on both sides (a different
// order): within 1e-5.
BOOST_AUTO_TEST_SUITE(cautious_normuon)

BOOST_AUTO_TEST_CASE(apply_update_cautious) {
  for (const int64_t n : kSizes) {
    mirrored p(random_vector(n));
    mirrored o(random_vector(n));
    env().host->apply_update_cautious(p.host.data(), o.host.data(), n, 0.02f, 1.7320508f, 2.0f);
    env().gpu->apply_update_cautious(p.gpu.data(), o.gpu.data(), n, 0.02f, 1.7320508f, 2.0f);
    check_elementwise("apply_update_cautious", n, p.error());
  }
}

BOOST_AUTO_TEST_CASE(adamw_cautious) {
  for (const int64_t n : kSizes) {
    mirrored p(random_vector(n));
    mirrored m(random_vector(n, 0.1f));
    std::vector<float> v_values = random_vector(n, 0.01f);
    for (float& v : v_values)
      v = std::abs(v);
    mirrored v(v_values);
    scalar_args args;
    args.lr = 3e-4f;
    args.weight_decay = 2.0f;
    args.cautious = true;
    for (int64_t step = 1; step <= 3; ++step) {
      args.step = step;
      mirrored g(random_vector(n));
      env().host->scalar_update(p.host.data(), g.host.data(), m.host.data(), v.host.data(), n,
                                args);
      env().gpu->scalar_update(p.gpu.data(), g.gpu.data(), m.gpu.data(), v.gpu.data(), n, args);
    }
    check_elementwise("adamw cautious p", n, p.error());
    check_elementwise("adamw cautious m", n, m.error_at_scale(0.1));
    check_elementwise("adamw cautious v", n, v.error());
  }
}

BOOST_AUTO_TEST_CASE(adamw_slices_cautious_equal_per_parameter_calls) {
  scalar_args args;
  args.lr = 1e-2f;
  args.weight_decay = 2.0f;
  args.cautious = true;
  slices_equal_per_parameter_calls(args);
}

BOOST_AUTO_TEST_CASE(normuon_rows) {
  struct shape {
    int64_t batch, rows, cols;
  };
  for (const shape& c :
       {shape{3, 64, 200}, shape{2, 33, 65}, shape{1, 1, 5000}, shape{4, 300, 1}}) {
    const int64_t n = c.batch * c.rows * c.cols;
    mirrored x(random_vector(n));
    std::vector<float> v_values = random_vector(c.batch * c.rows, 0.5f);
    for (float& v : v_values)
      v = std::abs(v);
    mirrored v(v_values);
    muon_rule rule;
    rule.transform = muon_variant::normuon;
    rule.normuon_beta2 = 0.9f;
    rule.normuon_eps = 1e-8f;
    for (int step = 0; step < 2; ++step) {
      env().host->post_ns(x.host.data(), v.host.data(), c.batch, c.rows, c.cols, rule, 1.0f);
      env().gpu->post_ns(x.gpu.data(), v.gpu.data(), c.batch, c.rows, c.cols, rule, 1.0f);
    }
    const double ex = x.error(), ev = v.error();
    BOOST_TEST_MESSAGE("normuon_rows " << c.batch << " x [" << c.rows << ", " << c.cols
                                       << "]: x relative error " << ex << ", v " << ev);
    BOOST_TEST(ex <= 1e-5);
    BOOST_TEST(ev <= 1e-5);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(scalar_rules)

// Lion (kernels/scalar_rules.hpp: one definition, run by the host loop and the CUDA generic
// kernel) against the host over 3 steps, with and without cautious decay. The update is +-lr: a
// sign that came out differently (c within an fma's rounding of 0, about 1e-8 of the time)
// would move one element by 2*lr = 2e-4, at most 2e-7 of these vectors' norms; m as AdamW's.
BOOST_AUTO_TEST_CASE(lion_equals_host) {
  for (const int64_t n : kSizes) {
    for (const bool cautious : {false, true}) {
      mirrored p(random_vector(n));
      mirrored m(random_vector(n, 0.1f));
      mirrored v(random_vector(n, 0.01f));  // Lion leaves v alone
      scalar_args args;
      args.algorithm = scalar_algorithm::lion;
      args.lr = 1e-4f;
      args.beta1 = 0.9f;
      args.beta2 = 0.99f;
      args.weight_decay = 0.5f;
      args.cautious = cautious;
      for (int64_t step = 1; step <= 3; ++step) {
        args.step = step;
        mirrored g(random_vector(n));
        env().host->scalar_update(p.host.data(), g.host.data(), m.host.data(), v.host.data(), n,
                                  args);
        env().gpu->scalar_update(p.gpu.data(), g.gpu.data(), m.gpu.data(), v.gpu.data(), n, args);
      }
      const std::string what = cautious ? "lion cautious" : "lion";
      check_elementwise(what + " p", n, p.error());
      check_elementwise(what + " m", n, m.error_at_scale(0.1));
      BOOST_TEST(v.gpu_values() == v.host_values(), what << " v n=" << n);
    }
  }
}

// The slice call runs each slice as the per-parameter call, bit for bit.
BOOST_AUTO_TEST_CASE(lion_slices_equal_per_parameter_calls) {
  scalar_args args;
  args.algorithm = scalar_algorithm::lion;
  args.lr = 1e-3f;
  args.weight_decay = 0.5f;
  slices_equal_per_parameter_calls(args);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace zmuon

/// Exits with 77 (ctest's SKIP_RETURN_CODE) when the CUDA backend cannot start here.
int main(int argc, char* argv[]) {
  auto gpu = zmuon::make_compute_backend("cuda");
  if (!gpu) {
    std::cout << "test_cuda_kernels: SKIPPED, no usable GPU: " << gpu.err().to_string()
              << std::endl;
    return 77;
  }
  gpu->reset();
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
