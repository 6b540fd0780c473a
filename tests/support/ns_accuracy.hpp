// Accuracy measures of a Newton-Schulz result and test matrices with a known polar factor, for
// test_kernels (host) and test_cuda_kernels (GPU). Everything here is double precision and plain
// loops: small matrices only.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace zmuon::ns_accuracy {

/// n standard normal floats from `seed`.
inline std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (auto& x : v)
    x = normal(gen);
  return v;
}

/// Element (i, k) of the wide view (r <= c) of a row-major [rows, cols] matrix.
template <class T>
double wide_at(const std::vector<T>& m, int64_t rows, int64_t cols, int64_t i, int64_t k) {
  return static_cast<double>(rows > cols ? m[k * cols + i] : m[i * cols + k]);
}

/// G = W W^T ([r, r]) of the wide view W [r, c] of a row-major [rows, cols] matrix.
template <class T>
std::vector<double> wide_gram(const std::vector<T>& m, int64_t rows, int64_t cols) {
  const int64_t r = std::min(rows, cols), c = std::max(rows, cols);
  std::vector<double> g(static_cast<size_t>(r * r));
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = i; j < r; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < c; ++k)
        s += wide_at(m, rows, cols, i, k) * wide_at(m, rows, cols, j, k);
      g[i * r + j] = g[j * r + i] = s;
    }
  }
  return g;
}

/// ||O O^T - I||_F / sqrt(r) of the wide view O [r, c] of a row-major [rows, cols] result: 0 for
/// orthonormal rows, the RMS of (sigma_i^2 - 1) over the singular values otherwise.
template <class T>
double orthogonality_error(const std::vector<T>& o, int64_t rows, int64_t cols) {
  const int64_t r = std::min(rows, cols);
  const auto g = wide_gram(o, rows, cols);
  double sum = 0.0;
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < r; ++j) {
      const double d = g[i * r + j] - (i == j ? 1.0 : 0.0);
      sum += d * d;
    }
  }
  return std::sqrt(sum / static_cast<double>(r));
}

/// ||O - P||_F / ||P||_F: the distance of a result O to the exact polar factor P (same layout).
template <class T>
double polar_distance(const std::vector<T>& o, const std::vector<double>& p) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double d = static_cast<double>(o[i]) - p[i];
    diff += d * d;
    norm += p[i] * p[i];
  }
  return std::sqrt(diff / norm);
}

/// Eigen-decomposition of a symmetric [n, n] matrix by cyclic Jacobi: returns the eigenvalues;
/// when `vectors` is given, it receives V (row-major, eigenvector j in column j), a = V diag V^T.
inline std::vector<double> symmetric_eigen(std::vector<double> a, int64_t n,
                                           std::vector<double>* vectors = nullptr) {
  std::vector<double> v;
  if (vectors != nullptr) {
    v.assign(static_cast<size_t>(n * n), 0.0);
    for (int64_t i = 0; i < n; ++i)
      v[i * n + i] = 1.0;
  }
  double scale = 0.0;
  for (double x : a)
    scale += x * x;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0.0;
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t q = p + 1; q < n; ++q)
        off += a[p * n + q] * a[p * n + q];
    }
    if (off <= 1e-30 * scale || off < 1e-300)
      break;
    for (int64_t p = 0; p < n; ++p) {
      for (int64_t q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (std::fabs(apq) < 1e-300)
          continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double cs = 1.0 / std::sqrt(t * t + 1), sn = t * cs;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = cs * akp - sn * akq;
          a[k * n + q] = sn * akp + cs * akq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = cs * apk - sn * aqk;
          a[q * n + k] = sn * apk + cs * aqk;
        }
        if (vectors != nullptr) {
          for (int64_t k = 0; k < n; ++k) {
            const double vkp = v[k * n + p], vkq = v[k * n + q];
            v[k * n + p] = cs * vkp - sn * vkq;
            v[k * n + q] = sn * vkp + cs * vkq;
          }
        }
      }
    }
  }
  std::vector<double> eig(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    eig[i] = a[i * n + i];
  if (vectors != nullptr)
    *vectors = std::move(v);
  return eig;
}

/// A test input and its exact polar factor, both row-major [rows, cols].
struct test_matrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> x;
  std::vector<double> polar;
};

/// An [r, c] matrix (r <= c) with orthonormal rows: Gaussian rows, modified Gram-Schmidt twice.
inline std::vector<double> orthonormal_rows(int64_t r, int64_t c, std::mt19937& gen) {
  std::normal_distribution<double> normal;
  std::vector<double> q(static_cast<size_t>(r * c));
  for (auto& v : q)
    v = normal(gen);
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < i; ++j) {
        double dot = 0.0;
        for (int64_t k = 0; k < c; ++k)
          dot += q[i * c + k] * q[j * c + k];
        for (int64_t k = 0; k < c; ++k)
          q[i * c + k] -= dot * q[j * c + k];
      }
      double norm = 0.0;
      for (int64_t k = 0; k < c; ++k)
        norm += q[i * c + k] * q[i * c + k];
      norm = std::sqrt(norm);
      for (int64_t k = 0; k < c; ++k)
        q[i * c + k] /= norm;
    }
  }
  return q;
}

/// Stores the wide [r, c] matrices w (rounded to float) and p into t's [rows, cols] layout.
inline void store_wide(test_matrix& t, const std::vector<double>& w, const std::vector<double>& p) {
  const bool tall = t.rows > t.cols;
  const int64_t c = std::max(t.rows, t.cols);
  t.x.assign(w.size(), 0.0f);
  t.polar.assign(p.size(), 0.0);
  for (int64_t i = 0; i < t.rows; ++i) {
    for (int64_t j = 0; j < t.cols; ++j) {
      const int64_t at = tall ? j * c + i : i * c + j;
      t.x[i * t.cols + j] = static_cast<float>(w[at]);
      t.polar[i * t.cols + j] = p[at];
    }
  }
}

/// W = U diag(sigma) V^T with random orthogonal U [r, r] and orthonormal V^T [r, c], r = the
/// short side, sigma[i] log-spaced from sigma_min to 1: its polar factor is exactly U V^T.
inline test_matrix with_singular_values(int64_t rows, int64_t cols, double sigma_min,
                                        uint32_t seed) {
  const int64_t r = std::min(rows, cols), c = std::max(rows, cols);
  std::mt19937 gen(seed);
  const auto u = orthonormal_rows(r, r, gen);
  const auto vt = orthonormal_rows(r, c, gen);
  std::vector<double> w(static_cast<size_t>(r * c), 0.0), p(w.size(), 0.0);
  for (int64_t l = 0; l < r; ++l) {
    const double s = r == 1 ? 1.0 : std::pow(sigma_min, static_cast<double>(l) / (r - 1));
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t k = 0; k < c; ++k) {
        w[i * c + k] += u[i * r + l] * s * vt[l * c + k];
        p[i * c + k] += u[i * r + l] * vt[l * c + k];
      }
    }
  }
  test_matrix t;
  t.rows = rows;
  t.cols = cols;
  store_wide(t, w, p);
  return t;
}

/// A Gaussian matrix; its polar factor (W W^T)^{-1/2} W from a Jacobi eigen-decomposition of the
/// Gram matrix of the float input, in double.
inline test_matrix gaussian(int64_t rows, int64_t cols, uint32_t seed) {
  const int64_t r = std::min(rows, cols), c = std::max(rows, cols);
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal;
  std::vector<double> w(static_cast<size_t>(r * c));
  for (auto& v : w)
    v = static_cast<float>(normal(gen));  // what the backend sees
  test_matrix t;
  t.rows = r;
  t.cols = c;
  std::vector<double> vecs;
  const auto eig = symmetric_eigen(wide_gram(w, r, c), r, &vecs);
  // G^{-1/2} = V diag(eig^{-1/2}) V^T; P = G^{-1/2} W.
  std::vector<double> inv_sqrt(static_cast<size_t>(r * r), 0.0);
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < r; ++j) {
      double s = 0.0;
      for (int64_t l = 0; l < r; ++l)
        s += vecs[i * r + l] * vecs[j * r + l] / std::sqrt(eig[l]);
      inv_sqrt[i * r + j] = s;
    }
  }
  std::vector<double> p(w.size(), 0.0);
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t l = 0; l < r; ++l) {
      for (int64_t k = 0; k < c; ++k)
        p[i * c + k] += inv_sqrt[i * r + l] * w[l * c + k];
    }
  }
  t.rows = rows;
  t.cols = cols;
  store_wide(t, w, p);
  return t;
}

/// NS5's (a, b, c), docs/DESIGN.md §2.
inline constexpr std::array<double, 3> kNs5Coefficients = {3.4445, -4.7750, 2.0315};

/// Double-precision Newton-Schulz of one row-major [rows, cols] matrix, written independently of
/// the backends: transpose tall to wide, X / (||X||_F + 1e-7), `steps` iterations of
/// X <- a X + (b A + c A^2) X, A = X X^T.
inline std::vector<double> ns5_reference(const std::vector<double>& g, int64_t rows, int64_t cols,
                                         int steps = 5,
                                         const std::array<double, 3>& abc = kNs5Coefficients) {
  const double a = abc[0], b = abc[1], c = abc[2];
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
  std::vector<double> x(m * n);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      (tall ? x[j * n + i] : x[i * n + j]) = g[i * cols + j];
  double norm = 0;
  for (double v : x)
    norm += v * v;
  norm = std::sqrt(norm) + 1e-7;
  for (double& v : x)
    v /= norm;
  for (int it = 0; it < steps; ++it) {
    std::vector<double> A(m * m, 0), B(m * m, 0), X(m * n, 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < n; ++k)
          A[i * m + j] += x[i * n + k] * x[j * n + k];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double aa = 0;
        for (int64_t k = 0; k < m; ++k)
          aa += A[i * m + k] * A[k * m + j];
        B[i * m + j] = b * A[i * m + j] + c * aa;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double bx = 0;
        for (int64_t k = 0; k < m; ++k)
          bx += B[i * m + k] * x[k * n + j];
        X[i * n + j] = a * x[i * n + j] + bx;
      }
    x = X;
  }
  std::vector<double> out(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = tall ? x[j * n + i] : x[i * n + j];
  return out;
}

/// NorMuon's normalization of one [rows, cols] matrix in double (Algorithm 1 of
/// arXiv:2510.05491 with Dion's Frobenius rescale): per row v = b2 v + (1-b2) mean_j o^2 and
/// o /= sqrt(v) + eps; then o *= |o| / |o'|. `o` and the row moments `v` change in place.
inline void normuon_reference(double* o, double* v, int64_t rows, int64_t cols, double b2,
                              double eps) {
  double before = 0, after = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double sq = 0;
    for (int64_t j = 0; j < cols; ++j)
      sq += o[i * cols + j] * o[i * cols + j];
    before += sq;
    v[i] = b2 * v[i] + (1 - b2) * sq / static_cast<double>(cols);
    for (int64_t j = 0; j < cols; ++j) {
      o[i * cols + j] /= std::sqrt(v[i]) + eps;
      after += o[i * cols + j] * o[i * cols + j];
    }
  }
  const double factor = std::sqrt(before) / std::max(std::sqrt(after), 1e-8);
  for (int64_t k = 0; k < rows * cols; ++k)
    o[k] *= factor;
}

}  // namespace zmuon::ns_accuracy
