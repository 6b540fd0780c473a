// The CPU compute backend: element-wise kernels as plain loops, Newton-Schulz with OpenBLAS sgemm.

#include "kernels/host/host_compute.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "kernels/bf16.hpp"
#include "kernels/ns_variants.hpp"

namespace zmuon {
namespace {

/// Sum of squares in double. A float's square cannot overflow a double, nor can any realistic
/// count of them, so the sum is non-finite exactly when some element is inf or NaN.
double sum_of_squares(const float* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double xi = x[i];
    sum += xi * xi;
  }
  return sum;
}

/// dst[c, r] = src[r, c] for a row-major [rows, cols] src.
void transpose(float* dst, const float* src, int64_t rows, int64_t cols) {
  // OpenBLAS's out-of-place transpose: about 25x a tiled loop on a 3072 x 768 matrix (0.7 against
  // 18-21 ms on the development VM), bit for bit the same copy.
  cblas_somatcopy(CblasRowMajor, CblasTrans, static_cast<blasint>(rows), static_cast<blasint>(cols),
                  1.0f, src, static_cast<blasint>(cols), dst, static_cast<blasint>(rows));
}

}  // namespace

// -- memory --------------------------------------------------------------------------------------

int host_blas_threads(int concurrent, int cores) {
  cores = std::max(1, cores);
  return std::max(1, cores / std::clamp(concurrent, 1, cores));
}

int share_host_blas_threads(int local_ranks) {
  for (const char* setting : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"})
    if (std::getenv(setting) != nullptr)
      return 0;
  const int threads =
      host_blas_threads(local_ranks, static_cast<int>(std::thread::hardware_concurrency()));
  openblas_set_num_threads(threads);
  return threads;
}

device_buffer host_compute::allocate(int64_t n) {
  if (n <= 0)
    return device_buffer{};
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  meter_->allocated(bytes);
  return device_buffer(new float[static_cast<size_t>(n)](), n, [meter = meter_, bytes](float* p) {
    delete[] p;
    meter->released(bytes);
  });
}

// Poisoned with quiet NaNs, which cost the host what zeros would: a caller that reads an element
// it promised to overwrite first gets NaN into its results, so the host tests catch what on a GPU
// would read whatever the memory pool held last.
device_buffer host_compute::allocate_for_overwrite(int64_t n) {
  device_buffer buffer = allocate(n);
  std::fill_n(buffer.data(), n, std::numeric_limits<float>::quiet_NaN());
  return buffer;
}

memory_stats host_compute::memory() const {
  memory_stats stats = meter_->read();
  for (const auto* v : {&x_, &x_next_, &a_, &b_, &q_, &q_next_, &t_})
    stats.workspace += static_cast<int64_t>(v->capacity() * sizeof(float));
  return stats;
}

namespace {

void move_floats(float* dst, const float* src, int64_t n) {
  if (n > 0 && dst != src)
    std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace

void host_compute::copy_from_host(float* dst, const float* host_src, int64_t n) {
  const scoped_call_timer timer(*this, "copy_from_host");
  move_floats(dst, host_src, n);
}

void host_compute::copy_to_host(float* host_dst, const float* src, int64_t n) {
  const scoped_call_timer timer(*this, "copy_to_host");
  move_floats(host_dst, src, n);
}

void host_compute::copy(float* dst, const float* src, int64_t n) {
  const scoped_call_timer timer(*this, "copy");
  move_floats(dst, src, n);
}

void host_compute::fill_zero(float* x, int64_t n) {
  const scoped_call_timer timer(*this, "fill_zero");
  if (n > 0)
    std::fill(x, x + n, 0.0f);
}

void host_compute::copy_boxes(void* dst, const void* src, int64_t cols,
                              const std::vector<matrix_box>& boxes, int elem_bytes, bool to_boxes) {
  const scoped_call_timer timer(*this, "copy_boxes");
  auto* natural = static_cast<char*>(to_boxes ? const_cast<void*>(src) : dst);
  auto* packed = static_cast<char*>(to_boxes ? dst : const_cast<void*>(src));
  const auto e = static_cast<size_t>(elem_bytes);
  for (const matrix_box& b : boxes)
    for (int64_t r = 0; r < b.rows; ++r, packed += b.cols * e) {
      char* at = natural + ((b.row0 + r) * cols + b.col0) * e;
      if (to_boxes)
        std::memcpy(packed, at, b.cols * e);
      else
        std::memcpy(at, packed, b.cols * e);
    }
}

// -- element-wise --------------------------------------------------------------------------------

void host_compute::add(float* dst, const float* src, int64_t n) {
  const scoped_call_timer timer(*this, "add");
  for (int64_t i = 0; i < n; ++i)
    dst[i] += src[i];
}

void host_compute::scale(float* x, int64_t n, float factor) {
  const scoped_call_timer timer(*this, "scale");
  for (int64_t i = 0; i < n; ++i)
    x[i] *= factor;
}

scan_result host_compute::scan(const float* x, int64_t n) {
  const scoped_call_timer timer(*this, "scan");
  scan_result result;
  result.sum_squares = sum_of_squares(x, n);
  result.nonfinite = !std::isfinite(result.sum_squares);
  return result;
}

void host_compute::accumulate_scanned(float* dst, const float* src, int64_t n, accumulate_mode mode,
                                      part_scans& scans, int part) {
  scan_result& result = dynamic_cast<host_part_scans&>(scans).scans.at(static_cast<size_t>(part));
  const scoped_call_timer timer(*this, "accumulate");
  double sum = 0.0;
  switch (mode) {
    case accumulate_mode::copy:
      for (int64_t i = 0; i < n; ++i) {
        const double v = dst[i] = src[i];
        sum += v * v;
      }
      break;
    case accumulate_mode::add:
      for (int64_t i = 0; i < n; ++i) {
        const double v = dst[i] += src[i];
        sum += v * v;
      }
      break;
    case accumulate_mode::zero:
      std::fill(dst, dst + std::max<int64_t>(n, 0), 0.0f);
      break;
  }
  result.sum_squares = sum;
  result.nonfinite = !std::isfinite(sum);
}

double host_compute::frobenius_norm(const float* x, int64_t n) {
  const scoped_call_timer timer(*this, "frobenius_norm");
  return std::sqrt(sum_of_squares(x, n));
}

void host_compute::momentum(float* m, const float* g, float* u, int64_t n, float beta,
                            bool nesterov) {
  const scoped_call_timer timer(*this, "momentum");
  const float one_minus_beta = 1.0f - beta;
  for (int64_t i = 0; i < n; ++i) {
    const float mi = beta * m[i] + one_minus_beta * g[i];
    m[i] = mi;
    u[i] = nesterov ? one_minus_beta * g[i] + beta * mi : mi;
  }
}

void host_compute::apply_update(float* p, const float* o, int64_t n, float lr, float scale,
                                float weight_decay) {
  const scoped_call_timer timer(*this, "apply_update");
  const float decay = 1.0f - lr * weight_decay;
  const float step = lr * scale;
  for (int64_t i = 0; i < n; ++i)
    p[i] = p[i] * decay - step * o[i];
}

void host_compute::to_bf16(uint16_t* dst, const float* src, int64_t n) {
  const scoped_call_timer timer(*this, "to_bf16");
  for (int64_t i = 0; i < n; ++i)
    dst[i] = zmuon::to_bf16(src[i]);
}

void host_compute::from_bf16(float* dst, const uint16_t* src, int64_t n) {
  const scoped_call_timer timer(*this, "from_bf16");
  for (int64_t i = 0; i < n; ++i)
    dst[i] = zmuon::from_bf16(src[i]);
}

void host_compute::scalar_update(float* p, const float* g, float* m, float* v, int64_t n,
                                 const scalar_args& args) {
  const scoped_call_timer timer(*this, "adamw");  // the non-Muon group's call, whatever its rule
  const scalar_factors f = scalar_factors_of(args);
  visit_scalar_rule(args.algorithm, [&](auto rule) {
    for (int64_t i = 0; i < n; ++i)
      decltype(rule)::apply(f, p[i], g[i], m[i], v[i]);
  });
}

void host_compute::apply_update_cautious(float* p, const float* o, int64_t n, float lr, float scale,
                                         float weight_decay) {
  const scoped_call_timer timer(*this, "apply_update");
  const float coeff = lr * weight_decay;
  const float step = lr * scale;
  for (int64_t i = 0; i < n; ++i)
    p[i] = p[i] - (p[i] * o[i] >= 0.0f ? coeff * p[i] : 0.0f) - step * o[i];
}

namespace {

/// NorMuon's row normalization (compute_backend::post_ns).
void normuon_rows(float* x, float* v, int64_t batch, int64_t rows, int64_t cols, float beta2,
                  float eps) {
  for (int64_t b = 0; b < batch; ++b) {
    float* block = x + b * rows * cols;
    float* moments = v + b * rows;
    double before = 0.0, after = 0.0;
    for (int64_t i = 0; i < rows; ++i) {
      float* row = block + i * cols;
      double sum = 0.0;
      for (int64_t j = 0; j < cols; ++j)
        sum += static_cast<double>(row[j]) * row[j];
      const float vi =
          beta2 * moments[i] + (1.0f - beta2) * static_cast<float>(sum / static_cast<double>(cols));
      moments[i] = vi;
      const float inv = 1.0f / (std::sqrt(vi) + eps);
      before += sum;
      double row_after = 0.0;
      for (int64_t j = 0; j < cols; ++j) {
        row[j] *= inv;
        row_after += static_cast<double>(row[j]) * row[j];
      }
      after += row_after;
    }
    const auto factor = static_cast<float>(std::sqrt(before) / std::max(std::sqrt(after), 1e-8));
    for (int64_t k = 0; k < rows * cols; ++k)
      block[k] *= factor;
  }
}

}  // namespace

void host_compute::post_ns(float* x, float* v, int64_t batch, int64_t rows, int64_t cols,
                           const muon_rule& rule, float factor) {
  switch (rule.transform) {  // -Wswitch names a transform without its case
    case muon_variant::normuon: {
      const scoped_call_timer timer(*this, "normuon");
      normuon_rows(x, v, batch, rows, cols, rule.normuon_beta2, rule.normuon_eps);
      break;
    }
    case muon_variant::muon:
      break;
  }
  if (factor != 1.0f)
    scale(x, batch * rows * cols, factor);
}

// -- Newton-Schulz -------------------------------------------------------------------------------

void host_compute::newton_schulz(float* x, int64_t batch, int64_t rows, int64_t cols,
                                 const ns_options& ns) {
  const scoped_call_timer timer(*this, "newton_schulz");
  if (batch <= 0)
    return;
  if (rows > 0 && cols > 0) {
    const int64_t numel = rows * cols;
    for (int64_t k = 0; k < batch && !cancelled(); ++k)
      newton_schulz_one(x + k * numel, rows, cols, ns);
  }
  ns_matrices_ += batch;
}

void host_compute::newton_schulz_one(float* x, int64_t rows, int64_t cols, const ns_options& ns) {
  // Work on the wide view X [r, c], r <= c, so that A = X X^T is the small Gram matrix.
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows;
  const int64_t c = tall ? rows : cols;
  const auto numel = static_cast<size_t>(r * c);
  x_.resize(numel);
  x_next_.resize(numel);
  a_.resize(static_cast<size_t>(r * r));
  b_.resize(static_cast<size_t>(r * r));

  float* cur = x_.data();
  float* next = x_next_.data();
  if (tall) {
    transpose(cur, x, rows, cols);
  } else {
    std::memcpy(cur, x, numel * sizeof(float));
  }

  const double denom = std::sqrt(sum_of_squares(cur, r * c)) + static_cast<double>(ns.eps);
  for (size_t i = 0; i < numel; ++i)
    cur[i] = static_cast<float>(cur[i] / denom);

  if (ns_uses_gram(ns, rows, cols, kHostAutomaticVariant)) {
    for (int step = 0; step < ns.steps && !cancelled();) {  // cancel(): the result is garbage
      const int block = gram_block_steps(ns, ns.steps - step);
      gram_block(cur, next, r, c, ns, step, block);
      std::swap(cur, next);
      step += block;
    }
  } else {
    for (int step = 0; step < ns.steps && !cancelled(); ++step) {
      standard_step(cur, next, r, c, ns_coefficients_at(ns, step));
      std::swap(cur, next);
    }
  }

  if (tall) {
    transpose(x, cur, r, c);
  } else {
    std::memcpy(x, cur, numel * sizeof(float));
  }
}

// BLAS dimensions are int: a matrix side past 2^31 (a >= 8 GiB matrix) is out of scope.

namespace {

/// The upper triangle of the symmetric [r, r] matrix m (what syrk writes) into its lower one.
void mirror_upper(float* m, int64_t r) {
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = i + 1; j < r; ++j)
      m[j * r + i] = m[i * r + j];
  }
}

/// out = b*M + c*M*M for a symmetric [r, r] M: M*M = M M^T is a syrk (half of sgemm's work).
/// Starts from out = M, lets syrk's beta carry b, and mirrors the upper triangle it writes.
void symmetric_square(const float* m, float* out, int64_t r, float b, float c) {
  const int ri = static_cast<int>(r);
  std::memcpy(out, m, static_cast<size_t>(r * r) * sizeof(float));
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, ri, ri, c, m, ri, b, out, ri);
  mirror_upper(out, r);
}

}  // namespace

void host_compute::gram(const float* x, int64_t r, int64_t c, float* out) {
  // out = X X^T: syrk computes the upper triangle only.
  const int ri = static_cast<int>(r);
  cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, ri, static_cast<int>(c), 1.0f, x,
              static_cast<int>(c), 0.0f, out, ri);
  mirror_upper(out, r);
}

void host_compute::standard_step(const float* cur, float* next, int64_t r, int64_t c,
                                 const std::array<float, 3>& abc) {
  const int ri = static_cast<int>(r);
  const int ci = static_cast<int>(c);
  float* a = a_.data();
  float* b = b_.data();
  gram(cur, r, c, a);
  symmetric_square(a, b, r, abc[1], abc[2]);  // B = b*A + c*A*A
  // X' = a*X + B*X: start from X' = X and let sgemm's beta carry a.
  std::memcpy(next, cur, static_cast<size_t>(r * c) * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, ci, ri, 1.0f, b, ri, cur, ci, abc[0],
              next, ci);
}

void host_compute::gram_block(const float* cur, float* next, int64_t r, int64_t c,
                              const ns_options& ns, int first, int count) {
  // Steps first..first+count-1 of X_{t+1} = P_t X_t, P_t = a I + b R_t + c R_t^2, R_t = X_t X_t^T,
  // without touching X inside the block: with Z_t = b R_t + c R_t^2, the product
  // Q = P_{count-1}...P_0 accumulates as Q <- a Q + Z Q, and since P_t is a polynomial of R_t,
  // R_{t+1} = P_t R_t P_t = T P_t with T = a R_t + Z_t R_t. At the end X' = Q X.
  const int ri = static_cast<int>(r);
  const auto gram_bytes = static_cast<size_t>(r * r) * sizeof(float);
  q_.resize(static_cast<size_t>(r * r));
  q_next_.resize(q_.size());
  t_.resize(q_.size());
  float* rm = a_.data();  // R
  float* z = b_.data();   // Z
  float* q = q_.data();
  float* q_next = q_next_.data();
  float* t = t_.data();
  gram(cur, r, c, rm);
  for (int j = 0; j < count; ++j) {
    const auto& abc = ns_coefficients_at(ns, first + j);
    symmetric_square(rm, z, r, abc[1], abc[2]);  // Z = b*R + c*R*R
    if (j == 0) {                                // Q = a I + Z
      std::memcpy(q, z, gram_bytes);
      for (int64_t i = 0; i < r; ++i)
        q[i * r + i] += abc[0];
    } else {  // Q = a Q + Z Q
      std::memcpy(q_next, q, gram_bytes);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, ri, ri, 1.0f, z, ri, q, ri, abc[0],
                  q_next, ri);
      std::swap(q, q_next);
    }
    if (j + 1 < count) {
      // T = a R + Z R; R = a T + T Z.
      std::memcpy(t, rm, gram_bytes);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, ri, ri, 1.0f, z, ri, rm, ri,
                  abc[0], t, ri);
      std::memcpy(rm, t, gram_bytes);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, ri, ri, 1.0f, t, ri, z, ri, abc[0],
                  rm, ri);
    }
  }
  // X' = Q X.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ri, static_cast<int>(c), ri, 1.0f, q, ri,
              cur, static_cast<int>(c), 0.0f, next, static_cast<int>(c));
}

}  // namespace zmuon
