// What the GPU kernel tests share (test_cuda_kernels.cpp and test_cuda_newton_schulz.cpp, one
// executable): the host and CUDA backends, fresh random inputs (seed printed), copies to and
// from a backend, error measures, and the tolerances (see test_cuda_kernels.cpp's header).
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/compute.hpp"

namespace zmuon::cuda_test {

constexpr double kElementwiseTolerance = 1e-6;
/// bf16 GEMM operands against fp32: relative error between these two.
constexpr double kBf16Band[2] = {1e-3, 1e-2};
/// NS5 on the GPU against the host's arithmetic with bf16 storage (bf16_reference).
/// Measured on the H200 (bench/dev/gpu-check.sh): 4.4e-3..7.1e-3 for single matrices, worst
/// of a batch of 48 square 64x64 matrices 1.02e-2 (square matrices have singular values near 0,
/// where NS is most sensitive to summation order).
constexpr double kNs5ToBf16Reference = 1.5e-2;
/// NS5 in bf16 against NS5 in fp32: bf16's own error, amplified by five iterations.
constexpr double kNs5ToHost = 3e-2;
constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();

/// Sizes around the block size (256) and one large odd size.
inline const std::vector<int64_t> kSizes = {1, 255, 257, 4099, 1000003};

struct backends {
  std::unique_ptr<compute_backend> host;
  std::unique_ptr<compute_backend> gpu;
};

inline backends& env() {
  static backends instance = [] {
    backends b;
    auto host = make_compute_backend("host");
    auto gpu = make_compute_backend("cuda");
    BOOST_TEST_REQUIRE(static_cast<bool>(host));
    BOOST_TEST_REQUIRE(static_cast<bool>(gpu), (gpu ? std::string() : gpu.err().to_string()));
    b.host = std::move(*host);
    b.gpu = std::move(*gpu);
    return b;
  }();
  return instance;
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 engine = [] {
    const uint64_t seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    BOOST_TEST_MESSAGE("random seed " << seed);
    return std::mt19937_64(seed);
  }();
  return engine;
}

/// Fresh normal(0, sigma) values, none of them exactly zero.
inline std::vector<float> random_vector(int64_t n, float sigma = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    do
      x = dist(rng());
    while (x == 0.0f);
  }
  return v;
}

inline device_buffer upload(compute_backend& backend, const std::vector<float>& values) {
  const auto n = static_cast<int64_t>(values.size());
  device_buffer buffer = backend.allocate(n);
  backend.copy_from_host(buffer.data(), values.data(), n);
  return buffer;
}

/// Reads n floats back into a poisoned vector, so an element nothing wrote stays NaN.
inline std::vector<float> download(compute_backend& backend, const float* data, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), kPoison);
  backend.synchronize();
  backend.copy_to_host(out.data(), data, n);
  return out;
}

/// ‖got − want‖ / ‖want‖ in double; infinite when got holds a non-finite value.
/// With `least_norm`, over the larger of ‖want‖ and it.
inline double relative_error(const std::vector<float>& got, const std::vector<float>& want,
                             double least_norm = 0.0) {
  BOOST_TEST_REQUIRE(got.size() == want.size());
  double diff = 0.0;
  double norm = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]))
      return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  const double over = std::max(std::sqrt(norm), least_norm);
  return over > 0.0 ? std::sqrt(diff) / over : std::sqrt(diff);
}

/// Elements that differ bit for bit (a NaN never matches); a count rather than Boost's
/// element-by-element report, which would flood the log on a wrong kernel.
inline int64_t mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return static_cast<int64_t>(std::max(got.size(), want.size()));
  int64_t count = 0;
  for (size_t i = 0; i < got.size(); ++i)
    count += !(got[i] == want[i]);
  return count;
}

/// One vector on both backends.
struct mirrored {
  explicit mirrored(const std::vector<float>& values)
      : size(static_cast<int64_t>(values.size())),
        host(upload(*env().host, values)),
        gpu(upload(*env().gpu, values)) {}

  std::vector<float> host_values() { return download(*env().host, host.data(), size); }
  std::vector<float> gpu_values() { return download(*env().gpu, gpu.data(), size); }
  double error() { return relative_error(gpu_values(), host_values()); }
  /// The difference's norm over the larger of the host values' norm and `scale` * sqrt(size):
  /// for values that may cancel (an EMA of random inputs), whose rounding follows the inputs'
  /// scale, not the result's.
  double error_at_scale(double scale) {
    return relative_error(gpu_values(), host_values(), scale * std::sqrt(double(size)));
  }

  int64_t size;
  device_buffer host;
  device_buffer gpu;
};

inline void check_elementwise(const std::string& what, int64_t n, double error) {
  BOOST_TEST_MESSAGE(what << " n=" << n << ": relative error " << error);
  BOOST_TEST(error <= kElementwiseTolerance, what << " n=" << n << ": " << error);
}

/// `batch` row-major [rows, cols] matrices, back to back.
struct ns_case {
  int64_t batch;
  int64_t rows;
  int64_t cols;
};

}  // namespace zmuon::cuda_test
