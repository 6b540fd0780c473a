// The host compute backend's kernels against double-precision references written here, on
// seeded random inputs of awkward sizes. Every tolerance is stated where it is checked.
#define BOOST_TEST_MODULE kernels
#include <algorithm>
#include <array>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/compute.hpp"
#include "kernels/cuda/gemm_choice.hpp"      // plain C++: the GEMM engine per capability
#include "kernels/cuda/sm90/sm90_tiles.hpp"  // plain C++: which tiles each block computes
#ifdef ZMUON_HAVE_CUDA
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/sm90/sm90_gemm.hpp"
#endif
#include "support/bf16_reference.hpp"
#include "support/host_kernels.hpp"
#include "support/ns_accuracy.hpp"
#include "support/part_scans.hpp"
#include "support/slice_calls.hpp"

extern "C" int openblas_get_num_threads(void);  // OpenBLAS, the host backend's BLAS

namespace zmuon {
namespace {

using namespace test;

const std::vector<int64_t> kSizes = {1, 7, 1000003};

}  // namespace

// -- factory and memory --------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(factory_names_backends) {
  auto host = make_compute_backend("host");
  BOOST_REQUIRE(host);
  BOOST_TEST((*host)->name() == "host");

  auto nope = make_compute_backend("nope");
  BOOST_REQUIRE(!nope);
  BOOST_TEST(std::string(to_string(nope.err().code())) == "invalid_argument");
  BOOST_TEST(nope.err().message().find("nope") != std::string::npos, nope.err().to_string());
  BOOST_TEST(nope.err().message().find("host") != std::string::npos, nope.err().to_string());

#ifndef ZMUON_HAVE_CUDA
  auto cuda = make_compute_backend("cuda");
  BOOST_REQUIRE(!cuda);
  BOOST_TEST(cuda.err().message().find("not built in") != std::string::npos,
             cuda.err().to_string());
#endif
}

BOOST_AUTO_TEST_CASE(allocate_is_zero_filled_and_copies_round_trip) {
  auto be = host_backend();
  for (int64_t n : kSizes) {
    device_buffer buf = be->allocate(n);
    BOOST_REQUIRE_EQUAL(buf.size(), n);
    const auto zeros = download(*be, buf);
    BOOST_TEST(std::all_of(zeros.begin(), zeros.end(), [](float x) { return x == 0.0f; }));

    const auto data = random_floats(n, 11);
    be->copy_from_host(buf.data(), data.data(), n);
    BOOST_TEST(download(*be, buf) == data);

    device_buffer other = be->allocate(n);
    be->copy(other.data(), buf.data(), n);
    BOOST_TEST(download(*be, other) == data);

    be->fill_zero(other.data(), n);
    const auto cleared = download(*be, other);
    BOOST_TEST(std::all_of(cleared.begin(), cleared.end(), [](float x) { return x == 0.0f; }));
  }
}

#ifdef ZMUON_HAVE_CUDA
// The own Hopper GEMM refuses shapes it does not take with a message naming them, before any
// CUDA call (so this runs without a GPU; the pointers are never read).
BOOST_AUTO_TEST_CASE(sm90_gemm_refuses_what_does_not_fit) {
  alignas(16) static __nv_bfloat16 x[16];
  gpu::sm90_gemm_args a;
  a.batch = 1;
  a.m = 100;  // not whole tiles
  a.n = 256;
  a.k = 256;
  a.p = {x, 256, 0};
  a.q = {x, 256, 0};
  a.d = {x, 256, 0};
  const auto refusal = [&](const std::string& why) {
    BOOST_TEST(!gpu::sm90_gemm_fits(a));
    try {
      gpu::sm90_gemm(nullptr, a);
      BOOST_TEST(false, "sm90_gemm ran a shape it does not take");
    } catch (const gpu::failure& e) {
      BOOST_TEST((e.err().code() == errc::invalid_argument));
      BOOST_TEST(std::string(e.what()).find(why) != std::string::npos, e.what());
    }
  };
  refusal("m 100, n 256, k 256 not supported: m and n must be multiples of 128");
  a.m = 256;
  a.k = 96;
  refusal("k of 64");
  a.k = 256;
  a.symmetric = true;
  a.n = 128;
  refusal("must be square");
  a.n = 256;
  a.d = {x + 1, 256, 0};  // rows not 16-byte aligned
  refusal("16-byte aligned");
  a.d = {x, 256, 0};
  BOOST_TEST(gpu::sm90_gemm_fits(a));
  a.symmetric = false;  // 65535 x 256 x 256 tiles: past the grid's 2^31 - 1 blocks
  a.batch = 65535;
  a.m = a.n = 32768;
  a.d = {x, 32768, 0};
  refusal("more than 2^31 - 1 tiles");
}

// A number from the environment must be whole and in range. Anything else is refused with the
// variable's name and value, so that a typo does not quietly time something else.
BOOST_AUTO_TEST_CASE(environment_numbers_refuse_what_they_do_not_take) {
  const char* name = "ZMUON_TEST_NUMBER";
  const auto refused = [&](const std::string& value, auto read, const std::string& why) {
    ::setenv(name, value.c_str(), 1);
    try {
      read();
      BOOST_TEST(false, "took " << name << "=" << value);
    } catch (const gpu::failure& e) {
      BOOST_TEST((e.err().code() == errc::invalid_argument));
      BOOST_TEST(std::string(e.what()).find(why) != std::string::npos, e.what());
    }
  };
  ::unsetenv(name);
  BOOST_TEST(gpu::env_number(name, 1, 64, 8) == 8);
  ::setenv(name, "", 1);
  BOOST_TEST(gpu::env_number(name, 1, 64, 8) == 8);
  ::setenv(name, "1", 1);
  BOOST_TEST(gpu::env_number(name, 1, 64, 8) == 1);
  ::setenv(name, "64", 1);
  BOOST_TEST(gpu::env_number(name, 1, 64, 8) == 64);
  const auto as_number = [&] { return gpu::env_number(name, 1, 64, 8); };
  refused("65", as_number, "ZMUON_TEST_NUMBER must be a whole number from 1 to 64, not '65'");
  refused("0", as_number, "not '0'");
  refused("8x", as_number, "not '8x'");
  refused("99999999999999999999", as_number, "not '99999999999999999999'");
  ::unsetenv(name);
}
#endif

// The own GEMM's blocks cover every tile of D once (every tile on and above the diagonal when
// symmetric), for one and two tiles a block and 1 to 70 tiles a side; two-tile blocks share P's
// rows or Q's, and a symmetric product leaves at most its last block with one tile. Each
// consumer's stage slots hold its own tile's P and Q rows (what the kernel's producer loads and
// its consumers read, sm90_tiles.hpp).
BOOST_AUTO_TEST_CASE(sm90_blocks_cover_each_tile_once) {
  for (const int consumers : {1, 2})
    for (const bool symmetric : {false, true})
      for (int tiles = 1; tiles <= 70; ++tiles) {
        const int rows = symmetric ? tiles : tiles / 2 + 1;
        const int64_t blocks = gpu::sm90::blocks_per_matrix(consumers, symmetric, rows, tiles);
        std::vector<int> count(static_cast<size_t>(rows * tiles), 0);
        int64_t alone = 0;
        for (int b = 0; b < blocks; ++b) {
          const gpu::sm90::block_work w = gpu::sm90::tiles_of_block(consumers, symmetric, tiles, b);
          BOOST_TEST_REQUIRE((w.active >= 1 && w.active <= consumers));
          if (w.active == 2)
            BOOST_TEST_REQUIRE((w.share_q ? w.n[0] == w.n[1] : w.m[0] == w.m[1]));
          alone += consumers - w.active;
          for (int g = 0; g < w.active; ++g) {
            // The slots the consumer multiplies hold its tile's P rows and Q rows, among the
            // 1 + active slots the producer fills.
            const int p = gpu::sm90::p_slot(w, g), q = gpu::sm90::q_slot(w, g);
            BOOST_TEST_REQUIRE((p <= w.active && q <= w.active));
            const auto p_rows = gpu::sm90::slot_of(w, p), q_rows = gpu::sm90::slot_of(w, q);
            BOOST_TEST_REQUIRE((p_rows.p && p_rows.tile == w.m[g]));
            BOOST_TEST_REQUIRE((!q_rows.p && q_rows.tile == w.n[g]));
            BOOST_TEST_REQUIRE((w.m[g] >= 0 && w.m[g] < rows && w.n[g] >= 0 && w.n[g] < tiles),
                               "block " << b << " of " << blocks << ", tiles " << tiles);
            ++count[static_cast<size_t>(w.m[g] * tiles + w.n[g])];
          }
        }
        for (int i = 0; i < rows; ++i)
          for (int j = 0; j < tiles; ++j)
            BOOST_TEST_REQUIRE(
                count[static_cast<size_t>(i * tiles + j)] == (symmetric && j < i ? 0 : 1),
                "tile (" << i << ", " << j << ") of " << tiles << " a side, " << consumers
                         << " a block");
        if (symmetric)
          BOOST_TEST(alone <= 1);
      }
  // The figures the block choice rests on: 4096^2 (32 tiles a side) in 264 two-tile blocks, two
  // waves of the H200's 132 multiprocessors; 8192^2 in 1040.
  BOOST_TEST(gpu::sm90::blocks_per_matrix(2, true, 32, 32) == 264);
  BOOST_TEST(gpu::sm90::blocks_per_matrix(2, true, 64, 64) == 1040);
}

// The GEMM engine each device gets: the own sm_90a kernel on compute capability 9.0 only (H100,
// H200, GH200), cuBLAS on every other device the fat binary covers (cmake/cuda.cmake), including
// the later Blackwell parts that sm_90a code does not run on.
BOOST_AUTO_TEST_CASE(symmetric_gemm_engine_per_capability) {
  using gpu::symmetric_gemm;
  struct device {
    int major, minor;
    symmetric_gemm want;
  };
  const device devices[] = {
      {7, 5, symmetric_gemm::cublas},     // T4, RTX 20
      {8, 0, symmetric_gemm::cublas},     // A100
      {8, 6, symmetric_gemm::cublas},     // A10, RTX 30
      {8, 7, symmetric_gemm::cublas},     // Jetson Orin
      {8, 9, symmetric_gemm::cublas},     // L4, L40S, RTX 40
      {9, 0, symmetric_gemm::own_sm90a},  // H100, H200, GH200
      {10, 0, symmetric_gemm::cublas},    // B200, GB200
      {10, 3, symmetric_gemm::cublas},    // B300
      {11, 0, symmetric_gemm::cublas},    // Thor
      {12, 0, symmetric_gemm::cublas},    // RTX 50, RTX PRO 6000
      {12, 1, symmetric_gemm::cublas},    // GB10
      {9, 1, symmetric_gemm::cublas},     // no such device: sm_90a code would not run there
  };
  for (const device& d : devices)
    BOOST_TEST((gpu::symmetric_gemm_for({d.major, d.minor}) == d.want),
               "capability " << d.major << "." << d.minor);
}

// The host backend's BLAS threads share the cores among the ranks that run NS at once.
BOOST_AUTO_TEST_CASE(blas_threads_share_the_cores_among_the_ranks) {
  BOOST_TEST(host_blas_threads(1, 2) == 2);
  BOOST_TEST(host_blas_threads(4, 2) == 1);  // more ranks than cores: one thread each
  BOOST_TEST(host_blas_threads(2, 16) == 8);
  BOOST_TEST(host_blas_threads(3, 16) == 5);
  BOOST_TEST(host_blas_threads(0, 8) == 8);
  BOOST_TEST(host_blas_threads(1, 0) == 1);  // hardware_concurrency() may say 0
  const int set = share_host_blas_threads(64);
  if (std::getenv("OPENBLAS_NUM_THREADS") || std::getenv("GOTO_NUM_THREADS")
      || std::getenv("OMP_NUM_THREADS")) {
    BOOST_TEST(set == 0);  // the user's setting wins
  } else {
    BOOST_TEST(set == 1);
    BOOST_TEST(openblas_get_num_threads() == 1);
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    BOOST_TEST(share_host_blas_threads(1) == host_blas_threads(1, cores));
    BOOST_TEST(openblas_get_num_threads() == host_blas_threads(1, cores));
  }
}

// -- element-wise --------------------------------------------------------------------------------
// Inputs are O(1); one fp32 rounding of an O(1) result is <= 6e-8, so rtol = atol = 1e-6 leaves
// slack for rounding yet catches any formula error.

BOOST_AUTO_TEST_CASE(add_matches_reference) {
  auto be = host_backend();
  for (int64_t n : kSizes) {
    const auto dst = random_floats(n, 21), src = random_floats(n, 22);
    std::vector<double> ref(dst.size());
    for (size_t i = 0; i < ref.size(); ++i)
      ref[i] = double(dst[i]) + double(src[i]);
    auto d = upload(*be, dst), s = upload(*be, src);
    be->add(d.data(), s.data(), n);
    check_close(download(*be, d), ref, 1e-6, 1e-6, "add");
  }
}

BOOST_AUTO_TEST_CASE(scale_matches_reference) {
  auto be = host_backend();
  const float factor = 0.37f;
  for (int64_t n : kSizes) {
    const auto x = random_floats(n, 31);
    std::vector<double> ref(x.size());
    for (size_t i = 0; i < ref.size(); ++i)
      ref[i] = double(x[i]) * double(factor);
    auto d = upload(*be, x);
    be->scale(d.data(), n, factor);
    check_close(download(*be, d), ref, 1e-6, 1e-6, "scale");
  }
}

BOOST_AUTO_TEST_CASE(scan_and_norm_match_reference) {
  // Both accumulate in double; only the summation order may differ: rtol 1e-12.
  auto be = host_backend();
  for (int64_t n : kSizes) {
    const auto x = random_floats(n, 41, -3.0f, 3.0f);
    double ref = 0.0;
    for (float v : x)
      ref += double(v) * double(v);
    auto d = upload(*be, x);
    const scan_result s = be->scan(d.data(), n);
    BOOST_TEST(!s.nonfinite);
    BOOST_TEST(s.sum_squares == ref, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(be->frobenius_norm(d.data(), n) == std::sqrt(ref),
               boost::test_tools::tolerance(1e-12));
  }
}

BOOST_AUTO_TEST_CASE(scan_detects_nonfinite_anywhere) {
  auto be = host_backend();
  const float specials[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (int64_t n : kSizes) {
    const auto clean = random_floats(n, 51);
    auto d = upload(*be, clean);
    BOOST_TEST(!be->scan(d.data(), n).nonfinite);
    for (int64_t pos : {int64_t{0}, n / 2, n - 1}) {
      for (float special : specials) {
        auto dirty = clean;
        dirty[pos] = special;
        be->copy_from_host(d.data(), dirty.data(), n);
        BOOST_TEST(be->scan(d.data(), n).nonfinite,
                   "value " << special << " at " << pos << " of " << n << " not detected");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(momentum_matches_reference) {
  auto be = host_backend();
  const float beta = 0.95f;
  for (bool nesterov : {true, false}) {
    for (int64_t n : kSizes) {
      auto m_ref = to_double(random_floats(n, 61));
      std::vector<double> u_ref(m_ref.size());
      auto m = upload(*be, random_floats(n, 61));
      auto u = be->allocate(n);
      for (uint32_t step = 0; step < 3; ++step) {  // m carries over between steps
        const auto g = random_floats(n, 62 + step);
        for (size_t i = 0; i < m_ref.size(); ++i) {
          m_ref[i] = beta * m_ref[i] + (1.0 - beta) * g[i];
          u_ref[i] = nesterov ? (1.0 - beta) * g[i] + beta * m_ref[i] : m_ref[i];
        }
        auto gd = upload(*be, g);
        be->momentum(m.data(), gd.data(), u.data(), n, beta, nesterov);
      }
      const std::string tag = nesterov ? "momentum (nesterov)" : "momentum (plain)";
      check_close(download(*be, m), m_ref, 1e-6, 1e-6, tag + " m");
      check_close(download(*be, u), u_ref, 1e-6, 1e-6, tag + " u");
    }
  }
}

BOOST_AUTO_TEST_CASE(apply_update_matches_reference) {
  auto be = host_backend();
  const float lr = 0.05f, scale = 1.7f, wd = 0.1f;
  for (int64_t n : kSizes) {
    const auto p = random_floats(n, 71), o = random_floats(n, 72);
    std::vector<double> ref(p.size());
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] = p[i] * (1.0 - double(lr) * wd) - double(lr) * scale * o[i];
    }
    auto pd = upload(*be, p), od = upload(*be, o);
    be->apply_update(pd.data(), od.data(), n, lr, scale, wd);
    check_close(download(*be, pd), ref, 1e-6, 1e-6, "apply_update");
  }
}

// The calls over several parameters (the store's, one per Muon chunk or for all AdamW
// parameters) equal the per-parameter calls at each slice's offsets (support/slice_calls.hpp).
BOOST_AUTO_TEST_CASE(slice_calls_equal_per_parameter_calls) {
  check_slice_calls(*host_backend());
}

// The store's accumulate with each bucket's scan in the same pass (support/part_scans.hpp).
BOOST_AUTO_TEST_CASE(part_scans_follow_each_accumulate) {
  check_part_scans(*host_backend());
}

// The same with the source read from a bucket's pieces (support/part_scans.hpp).
BOOST_AUTO_TEST_CASE(piece_scans_follow_each_accumulate) {
  check_piece_scans(*host_backend());
}

BOOST_AUTO_TEST_CASE(adamw_matches_reference_over_three_steps) {
  // A large lr makes any slip in bias correction or weight decay far exceed the tolerance.
  auto be = host_backend();
  scalar_args args;
  args.lr = 0.1f;
  args.weight_decay = 0.1f;
  for (int64_t n : kSizes) {
    const auto p0 = random_floats(n, 81);
    auto p_ref = to_double(p0);
    std::vector<double> m_ref(p_ref.size(), 0.0), v_ref(p_ref.size(), 0.0);
    auto p = upload(*be, p0);
    auto m = be->allocate(n), v = be->allocate(n);
    for (int64_t step = 1; step <= 3; ++step) {
      const auto g = random_floats(n, 82 + static_cast<uint32_t>(step));
      const double b1 = args.beta1, b2 = args.beta2;
      for (size_t i = 0; i < p_ref.size(); ++i) {
        m_ref[i] = b1 * m_ref[i] + (1 - b1) * g[i];
        v_ref[i] = b2 * v_ref[i] + (1 - b2) * double(g[i]) * g[i];
        const double m_hat = m_ref[i] / (1 - std::pow(b1, step));
        const double v_hat = v_ref[i] / (1 - std::pow(b2, step));
        p_ref[i] = p_ref[i] * (1 - double(args.lr) * args.weight_decay)
                   - double(args.lr) * m_hat / (std::sqrt(v_hat) + double(args.eps));
      }
      args.step = step;
      auto gd = upload(*be, g);
      be->scalar_update(p.data(), gd.data(), m.data(), v.data(), n, args);
    }
    check_close(download(*be, m), m_ref, 1e-6, 1e-6, "adamw m");
    check_close(download(*be, v), v_ref, 1e-5, 0.0, "adamw v");
    check_close(download(*be, p), p_ref, 1e-5, 1e-5, "adamw p");
  }
}

// -- Newton-Schulz -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(newton_schulz_matches_reference) {
  const ns_options ns;                               // NS5 defaults
  check_ns_against_reference(1, 33, 33, ns, 101);    // square
  check_ns_against_reference(1, 17, 50, ns, 102);    // wide
  check_ns_against_reference(1, 61, 23, ns, 103);    // tall: the transposition path
  check_ns_against_reference(3, 24, 40, ns, 104);    // a batch
  check_ns_against_reference(3, 40, 24, ns, 105);    // a batch of tall matrices
  check_ns_against_reference(1, 1, 7, ns, 106);      // a row
  check_ns_against_reference(1, 7, 1, ns, 107);      // a column
  check_ns_against_reference(1, 257, 130, ns, 108);  // large enough for blocked sgemm
}

BOOST_AUTO_TEST_CASE(newton_schulz_with_schedule_matches_reference) {
  ns_options ns;
  ns.schedule = {{3.4445f, -4.7750f, 2.0315f},
                 {3.0f, -3.2f, 1.2f},
                 {2.5f, -2.0f, 0.6f},
                 {2.0f, -1.5f, 0.5f},
                 {1.875f, -1.25f, 0.375f}};
  check_ns_against_reference(1, 29, 45, ns, 111);
  check_ns_against_reference(2, 45, 29, ns, 112);
}

BOOST_AUTO_TEST_CASE(newton_schulz_schedule_of_defaults_equals_plain) {
  auto be = host_backend();
  const ns_options plain;
  ns_options scheduled;
  scheduled.schedule.assign(5, plain.coefficients);
  for (auto shape : {std::pair<int64_t, int64_t>{31, 70}, {70, 31}}) {
    const auto input = random_floats(2 * shape.first * shape.second, 121);
    auto a = upload(*be, input), b = upload(*be, input);
    be->newton_schulz(a.data(), 2, shape.first, shape.second, plain);
    be->newton_schulz(b.data(), 2, shape.first, shape.second, scheduled);
    BOOST_TEST(download(*be, a) == download(*be, b));
  }
}

BOOST_AUTO_TEST_CASE(newton_schulz_singular_values_near_one) {
  // NS5 does not converge to exactly 1: it maps singular values into roughly [0.7, 1.2]. Checked
  // here: every eigenvalue of O O^T (the squared singular values) within [0.5^2, 1.5^2], and the
  // diagonal of O O^T within [0.5, 1.5].
  auto be = host_backend();
  for (auto shape : {std::pair<int64_t, int64_t>{64, 200}, {200, 64}}) {
    const int64_t rows = shape.first, cols = shape.second;
    auto buf = upload(*be, random_floats(rows * cols, 131));
    be->newton_schulz(buf.data(), 1, rows, cols, ns_options{});
    const auto o = download(*be, buf);
    // Gram matrix of the short side: O O^T for wide, O^T O for tall.
    const bool tall = rows > cols;
    const int64_t r = tall ? cols : rows, c = tall ? rows : cols;
    auto at = [&](int64_t i, int64_t k) {
      return double(tall ? o[k * cols + i] : o[i * cols + k]);
    };
    std::vector<double> gram(static_cast<size_t>(r * r));
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < r; ++j) {
        double s = 0.0;
        for (int64_t k = 0; k < c; ++k)
          s += at(i, k) * at(j, k);
        gram[i * r + j] = s;
      }
    }
    double diag_lo = 1e9, diag_hi = -1e9;
    for (int64_t i = 0; i < r; ++i) {
      diag_lo = std::min(diag_lo, gram[i * r + i]);
      diag_hi = std::max(diag_hi, gram[i * r + i]);
    }
    const auto eig = ns_accuracy::symmetric_eigen(gram, r);
    const auto [eig_lo, eig_hi] = std::minmax_element(eig.begin(), eig.end());
    const double sv_lo = std::sqrt(std::max(0.0, *eig_lo)), sv_hi = std::sqrt(*eig_hi);
    BOOST_TEST_MESSAGE("NS [" << rows << " x " << cols << "]: Gram diagonal in [" << diag_lo << ", "
                              << diag_hi << "], singular values in [" << sv_lo << ", " << sv_hi
                              << "]");
    BOOST_TEST(diag_lo >= 0.5);
    BOOST_TEST(diag_hi <= 1.5);
    BOOST_TEST(sv_lo >= 0.5);
    BOOST_TEST(sv_hi <= 1.5);
  }
}

BOOST_AUTO_TEST_CASE(newton_schulz_concurrent_instances_agree) {
  // Several in-process ranks each own a backend and call sgemm from their own threads at once,
  // sharing OpenBLAS's thread pool. Each result must match the serial one (relative Frobenius
  // error <= 1e-6; OpenBLAS does not split the summation over threads, so it is 0 in practice).
  const int64_t rows = 96, cols = 160;
  const auto input = random_floats(2 * rows * cols, 161);
  auto serial_be = host_backend();
  auto serial = upload(*serial_be, input);
  serial_be->newton_schulz(serial.data(), 2, rows, cols, ns_options{});
  const auto expect = to_double(download(*serial_be, serial));

  constexpr int kRanks = 4;
  std::vector<std::vector<float>> results(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      auto made = make_compute_backend("host");
      if (!made)
        return;  // leaves results[rank] empty, which fails below
      auto& be = **made;
      auto buf = upload(be, input);
      for (int round = 0; round < 3; ++round) {
        be.copy_from_host(buf.data(), input.data(), buf.size());
        be.newton_schulz(buf.data(), 2, rows, cols, ns_options{});
      }
      results[rank] = download(be, buf);
    });
  }
  for (auto& t : threads)
    t.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    BOOST_REQUIRE_EQUAL(results[rank].size(), expect.size());
    const double err = relative_frobenius_error(results[rank], expect);
    BOOST_TEST_MESSAGE("NS on rank thread " << rank << ": relative error to serial " << err);
    BOOST_TEST(err <= 1e-6, "rank thread " << rank << ": relative error " << err);
  }
}

BOOST_AUTO_TEST_CASE(newton_schulz_zero_steps_only_normalizes) {
  // Exercises the normalization and both transpositions without any GEMM: rtol 1e-6.
  auto be = host_backend();
  ns_options ns;
  ns.steps = 0;
  const int64_t rows = 13, cols = 5;
  const auto input = random_floats(rows * cols, 141);
  auto buf = upload(*be, input);
  be->newton_schulz(buf.data(), 1, rows, cols, ns);
  check_close(download(*be, buf), ns_reference(input.data(), rows, cols, ns), 1e-6, 0.0,
              "NS, zero steps");
}

BOOST_AUTO_TEST_CASE(newton_schulz_of_zero_matrix_is_zero) {
  auto be = host_backend();
  auto buf = be->allocate(6 * 9);
  be->newton_schulz(buf.data(), 1, 6, 9, ns_options{});
  const auto out = download(*be, buf);
  BOOST_TEST(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));
}

BOOST_AUTO_TEST_CASE(ns_matrix_count_counts_matrices) {
  auto be = host_backend();
  BOOST_TEST(be->ns_matrix_count() == 0);
  auto buf = upload(*be, random_floats(3 * 8 * 5, 151));
  be->newton_schulz(buf.data(), 3, 8, 5, ns_options{});
  BOOST_TEST(be->ns_matrix_count() == 3);
  be->newton_schulz(buf.data(), 1, 8, 5, ns_options{});
  BOOST_TEST(be->ns_matrix_count() == 4);
  be->newton_schulz(buf.data(), 0, 8, 5, ns_options{});
  BOOST_TEST(be->ns_matrix_count() == 4);
}

// fp32 -> bf16 against the arithmetic reference (support/bf16_reference.hpp), exactly: every
// tie and its neighbours at every exponent (subnormals included), overflow to inf, inf, NaNs
// (whose payload sits only in the low bits too: they must stay NaN, not become inf), 10^6
// random bit patterns; bf16 -> fp32 for all 65536 bit patterns.
BOOST_AUTO_TEST_CASE(bf16_conversion_matches_reference_rounding) {
  auto be = host_backend();
  const auto in = test::bf16_test_inputs(1'000'000, 20261203);
  const auto n = static_cast<int64_t>(in.size());
  std::vector<uint16_t> out(in.size());
  be->to_bf16(out.data(), in.data(), n);
  int64_t wrong = 0, ties = 0, nans = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint32_t u = test::bits_of_float(in[i]);
    bool ok;
    if (std::isnan(in[i])) {
      ++nans;
      ok = test::is_bf16_nan(out[i]) && (out[i] >> 15) == (u >> 31);
    } else {
      ties += (u & 0xffff) == 0x8000;
      ok = out[i] == test::reference_bf16(in[i]);
    }
    if (!ok && ++wrong <= 5)
      BOOST_ERROR("to_bf16(bits 0x" << std::hex << u << ") = 0x" << out[i] << ", expected 0x"
                                    << test::reference_bf16(in[i]) << std::dec);
  }
  BOOST_TEST_MESSAGE(in.size() << " inputs (" << ties << " ties, " << nans << " NaNs)");
  BOOST_TEST(wrong == 0);
  BOOST_TEST(ties > 60000);  // the inputs hold every tie
  // Spot checks of the reference itself, by hand: ties go to the even neighbour.
  BOOST_TEST(test::reference_bf16(test::float_of_bits(0x3f808000u)) == 0x3f80);  // 1 + 2^-8
  BOOST_TEST(test::reference_bf16(test::float_of_bits(0x3f818000u)) == 0x3f82);  // 1 + 3*2^-8
  BOOST_TEST(test::reference_bf16(test::float_of_bits(0x7f7f8000u)) == 0x7f80);  // to inf
  BOOST_TEST(test::reference_bf16(test::float_of_bits(0x00018000u)) == 0x0002);  // subnormal

  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b)
    all[b] = static_cast<uint16_t>(b);
  std::vector<float> wide(all.size());
  be->from_bf16(wide.data(), all.data(), static_cast<int64_t>(all.size()));
  int64_t wrong_wide = 0;
  for (uint32_t b = 0; b < 65536; ++b)
    wrong_wide += test::bits_of_float(wide[b]) != b << 16;
  BOOST_TEST(wrong_wide == 0);
}

// Cautious weight decay (arXiv:2510.12402): elements where p and o disagree in sign keep their
// value but for the update; the others decay as apply_update does. Exact cases by construction.
BOOST_AUTO_TEST_CASE(apply_update_cautious_decays_where_signs_agree) {
  auto be = test::host_backend();
  const std::vector<float> p0{1.0f, -2.0f, 0.5f, -0.25f, 0.0f, 3.0f};
  const std::vector<float> o{0.5f, 0.25f, -1.0f, -2.0f, 1.0f, 0.0f};
  device_buffer p = be->allocate(6), ob = be->allocate(6);
  be->copy_from_host(p.data(), p0.data(), 6);
  be->copy_from_host(ob.data(), o.data(), 6);
  const float lr = 0.5f, scale = 2.0f, wd = 0.5f;
  be->apply_update_cautious(p.data(), ob.data(), 6, lr, scale, wd);
  std::vector<float> got(6);
  be->copy_to_host(got.data(), p.data(), 6);
  for (size_t i = 0; i < 6; ++i) {
    const double agree = static_cast<double>(p0[i]) * o[i] >= 0 ? 1.0 : 0.0;
    const double want = p0[i] - lr * wd * p0[i] * agree - lr * scale * o[i];
    BOOST_TEST(got[i] == static_cast<float>(want), "element " << i);
  }
}

// NorMuon's row normalization (arXiv:2510.05491; Dion's Frobenius rescale) against a double
// reference: 3 blocks, one row all zeros (its moment only decays), two calls (the EMA).
BOOST_AUTO_TEST_CASE(normuon_rows_matches_a_double_reference) {
  auto be = test::host_backend();
  const int64_t batch = 3, rows = 5, cols = 7, n = batch * rows * cols;
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x0(n), v0(batch * rows);
  for (auto& e : x0)
    e = dist(gen);
  for (int64_t j = 0; j < cols; ++j)
    x0[(1 * rows + 2) * cols + j] = 0.0f;  // block 1, row 2
  for (auto& e : v0)
    e = std::abs(dist(gen));
  const float beta2 = 0.9f, eps = 1e-8f;
  std::vector<double> x(x0.begin(), x0.end()), v(v0.begin(), v0.end());
  device_buffer xb = be->allocate(n), vb = be->allocate(batch * rows);
  be->copy_from_host(xb.data(), x0.data(), n);
  be->copy_from_host(vb.data(), v0.data(), batch * rows);
  muon_rule rule;
  rule.transform = muon_variant::normuon;
  rule.normuon_beta2 = beta2;
  rule.normuon_eps = eps;
  for (int call = 0; call < 2; ++call) {
    be->post_ns(xb.data(), vb.data(), batch, rows, cols, rule, 1.0f);
    for (int64_t b = 0; b < batch; ++b) {
      double before = 0, after = 0;
      for (int64_t i = 0; i < rows; ++i) {
        double* r = &x[(b * rows + i) * cols];
        double sq = 0;
        for (int64_t j = 0; j < cols; ++j)
          sq += r[j] * r[j];
        before += sq;
        double& vi = v[b * rows + i];
        vi = beta2 * vi + (1 - beta2) * sq / cols;
        for (int64_t j = 0; j < cols; ++j) {
          r[j] /= std::sqrt(vi) + eps;
          after += r[j] * r[j];
        }
      }
      const double factor = std::sqrt(before) / std::max(std::sqrt(after), 1e-8);
      for (int64_t k = 0; k < rows * cols; ++k)
        x[b * rows * cols + k] *= factor;
    }
  }
  std::vector<float> gx(n), gv(batch * rows);
  be->copy_to_host(gx.data(), xb.data(), n);
  be->copy_to_host(gv.data(), vb.data(), batch * rows);
  double ex = 0, nx = 0, ev = 0, nv = 0;
  for (int64_t k = 0; k < n; ++k) {
    ex += (gx[k] - x[k]) * (gx[k] - x[k]);
    nx += x[k] * x[k];
  }
  for (int64_t k = 0; k < batch * rows; ++k) {
    ev += (gv[k] - v[k]) * (gv[k] - v[k]);
    nv += v[k] * v[k];
  }
  BOOST_TEST_MESSAGE("normuon_rows vs double: x " << std::sqrt(ex / nx) << ", v "
                                                  << std::sqrt(ev / nv));
  BOOST_TEST(std::sqrt(ex / nx) <= 1e-6);
  BOOST_TEST(std::sqrt(ev / nv) <= 1e-6);
  for (int64_t j = 0; j < cols; ++j)
    BOOST_TEST(gx[(1 * rows + 2) * cols + j] == 0.0f);
}

}  // namespace zmuon
