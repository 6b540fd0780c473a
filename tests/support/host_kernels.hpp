// Helpers of the host compute backend's kernel tests (test_kernels, test_ns_variants): the
// backend, seeded inputs, copies in and out, the comparisons with double references, and
// Newton-Schulz in double.
#pragma once

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/compute.hpp"

namespace zmuon::test {

inline std::unique_ptr<compute_backend> host_backend() {
  auto made = make_compute_backend("host");
  BOOST_REQUIRE_MESSAGE(made, "make_compute_backend(\"host\") failed");
  return std::move(*made);
}

/// Uniform in [lo, hi), never exactly zero.
inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    do
      x = dist(gen);
    while (x == 0.0f);
  }
  return v;
}

inline device_buffer upload(compute_backend& be, const std::vector<float>& host) {
  device_buffer buf = be.allocate(static_cast<int64_t>(host.size()));
  be.copy_from_host(buf.data(), host.data(), buf.size());
  return buf;
}

inline std::vector<float> download(compute_backend& be, const device_buffer& buf) {
  std::vector<float> host(static_cast<size_t>(buf.size()));
  be.copy_to_host(host.data(), buf.data(), buf.size());
  be.synchronize();
  return host;
}

inline std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

/// Checks |got - ref| <= rtol*|ref| + atol element-wise and reports the worst element.
inline void check_close(const std::vector<float>& got, const std::vector<double>& ref, double rtol,
                        double atol, const std::string& what) {
  BOOST_REQUIRE_EQUAL(got.size(), ref.size());
  size_t worst = 0;
  double worst_excess = -std::numeric_limits<double>::infinity();
  double worst_err = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double excess = std::isnan(err) ? std::numeric_limits<double>::infinity()
                                          : err - (rtol * std::fabs(ref[i]) + atol);
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
      worst_err = err;
    }
  }
  BOOST_TEST_MESSAGE(what << ": n=" << got.size() << " max abs error " << worst_err);
  BOOST_TEST(worst_excess <= 0.0, what << ": element " << worst << " is " << got[worst]
                                       << ", reference " << ref[worst] << " (rtol " << rtol
                                       << ", atol " << atol << ")");
}

inline double relative_frobenius_error(const std::vector<float>& got,
                                       const std::vector<double>& ref) {
  double diff = 0.0;
  double norm = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

// -- Newton-Schulz reference -------------------------------------------------------------------

/// NS in double with plain loops, for one row-major [rows, cols] matrix.
inline std::vector<double> ns_reference(const float* x, int64_t rows, int64_t cols,
                                        const ns_options& ns) {
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows;  // the wide view X is [r, c]
  const int64_t c = tall ? rows : cols;
  std::vector<double> X(static_cast<size_t>(r * c));
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < c; ++j)
      X[i * c + j] = tall ? x[j * cols + i] : x[i * cols + j];
  }
  double norm = 0.0;
  for (double v : X)
    norm += v * v;
  norm = std::sqrt(norm) + static_cast<double>(ns.eps);
  for (double& v : X)
    v /= norm;

  std::vector<double> A(static_cast<size_t>(r * r)), B(A.size()), next(X.size());
  for (int step = 0; step < ns.steps; ++step) {
    const auto& abc = ns.schedule.empty() ? ns.coefficients : ns.schedule[step];
    const double a = abc[0], b = abc[1], cc = abc[2];
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < r; ++j) {
        double s = 0.0;
        for (int64_t k = 0; k < c; ++k)
          s += X[i * c + k] * X[j * c + k];
        A[i * r + j] = s;
      }
    }
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < r; ++j) {
        double s = 0.0;
        for (int64_t k = 0; k < r; ++k)
          s += A[i * r + k] * A[k * r + j];
        B[i * r + j] = b * A[i * r + j] + cc * s;
      }
    }
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < c; ++j) {
        double s = 0.0;
        for (int64_t k = 0; k < r; ++k)
          s += B[i * r + k] * X[k * c + j];
        next[i * c + j] = a * X[i * c + j] + s;
      }
    }
    X.swap(next);
  }

  std::vector<double> out(X.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = tall ? X[j * c + i] : X[i * cols + j];
  }
  return out;
}

/// Runs the backend's NS on `batch` random [rows, cols] matrices and compares each with the
/// reference: relative Frobenius error <= 1e-4 (fp32 GEMMs against double loops).
inline void check_ns_against_reference(int64_t batch, int64_t rows, int64_t cols,
                                       const ns_options& ns, uint32_t seed) {
  auto be = host_backend();
  const int64_t numel = rows * cols;
  const auto input = random_floats(batch * numel, seed);
  auto buf = upload(*be, input);
  be->newton_schulz(buf.data(), batch, rows, cols, ns);
  const auto got = download(*be, buf);
  for (int64_t k = 0; k < batch; ++k) {
    const auto ref = ns_reference(input.data() + k * numel, rows, cols, ns);
    const std::vector<float> got_k(got.begin() + k * numel, got.begin() + (k + 1) * numel);
    const double err = relative_frobenius_error(got_k, ref);
    BOOST_TEST_MESSAGE("NS [" << rows << " x " << cols << "] matrix " << k << " of " << batch
                              << ": relative Frobenius error " << err);
    BOOST_TEST(err <= 1e-4,
               "NS [" << rows << " x " << cols << "] matrix " << k << ": relative error " << err);
  }
}

}  // namespace zmuon::test
