// Newton-Schulz as the CUDA path computes it, on the host: bf16 values where the GPU stores
// bf16 (X, A, B), sums in double where it sums in fp32, so that only the order and width of
// the sums differ. test_cuda_newton_schulz compares the GPU's NS5 with it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "support/cuda_test_env.hpp"
#include "zmuon/options.hpp"

namespace zmuon::cuda_test {

/// Round to the nearest bf16 (ties to even), returned as a float.
inline float round_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// The CUDA path's arithmetic on the host: bf16 values where it stores bf16 (X, A, B), sums in
/// double where it sums in fp32. Only the order and width of the sums differ from the GPU.
inline std::vector<float> bf16_reference(const std::vector<float>& input, const ns_case& c,
                                         const ns_options& ns) {
  const bool tall = c.rows > c.cols;
  const int64_t m = tall ? c.cols : c.rows;
  const int64_t n = tall ? c.rows : c.cols;
  std::vector<float> out(input.size());
  for (int64_t k = 0; k < c.batch; ++k) {
    const float* src = input.data() + k * m * n;
    double sum = 0.0;
    for (int64_t i = 0; i < m * n; ++i)
      sum += static_cast<double>(src[i]) * src[i];
    const auto inv_norm = static_cast<float>(1.0 / (std::sqrt(sum) + ns.eps));
    std::vector<float> x(static_cast<size_t>(m * n));  // the wide X, row-major [m, n]
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const float v = tall ? src[j * m + i] : src[i * n + j];
        x[static_cast<size_t>(i * n + j)] = round_bf16(v * inv_norm);
      }
    }
    std::vector<float> a(static_cast<size_t>(m * m));
    std::vector<float> b(static_cast<size_t>(m * m));
    std::vector<float> next(x.size());
    for (int step = 0; step < ns.steps; ++step) {
      const auto& abc = ns.schedule.empty()
                            ? ns.coefficients
                            : ns.schedule[static_cast<size_t>(step) % ns.schedule.size()];
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < m; ++j) {
          double dot = 0.0;
          for (int64_t l = 0; l < n; ++l)
            dot += static_cast<double>(x[static_cast<size_t>(i * n + l)])
                   * x[static_cast<size_t>(j * n + l)];
          a[static_cast<size_t>(i * m + j)] = round_bf16(static_cast<float>(dot));
        }
      }
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < m; ++j) {
          double dot = 0.0;
          for (int64_t l = 0; l < m; ++l)
            dot += static_cast<double>(a[static_cast<size_t>(i * m + l)])
                   * a[static_cast<size_t>(l * m + j)];
          const size_t ij = static_cast<size_t>(i * m + j);
          b[ij] =
              round_bf16(static_cast<float>(abc[2] * dot + static_cast<double>(abc[1]) * a[ij]));
        }
        b[static_cast<size_t>(i * m + i)] = round_bf16(b[static_cast<size_t>(i * m + i)] + abc[0]);
      }
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0.0;
          for (int64_t l = 0; l < m; ++l)
            dot += static_cast<double>(b[static_cast<size_t>(i * m + l)])
                   * x[static_cast<size_t>(l * n + j)];
          const size_t ij = static_cast<size_t>(i * n + j);
          next[ij] = round_bf16(static_cast<float>(dot));
        }
      }
      std::swap(x, next);
    }
    float* dst = out.data() + k * m * n;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        (tall ? dst[j * m + i] : dst[i * n + j]) = x[static_cast<size_t>(i * n + j)];
      }
    }
  }
  return out;
}

}  // namespace zmuon::cuda_test
