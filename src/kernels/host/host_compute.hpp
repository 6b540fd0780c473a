// The CPU compute backend: plain loops for the element-wise kernels and OpenBLAS sgemm (fp32)
// for Newton-Schulz. It is the reference implementation that CI runs (docs/DESIGN.md §5).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/compute.hpp"

namespace zmuon {

/// Runs every call to the end on the calling thread, so `synchronize()` has nothing to wait for.
///
/// One instance per rank: the Newton-Schulz workspace is a member, so an instance must not be
/// used by two threads at once. Several ranks (several instances) may run in one process; their
/// sgemm calls then share OpenBLAS's thread pool, whose size is left at OpenBLAS's default
/// (OPENBLAS_NUM_THREADS sets it).
class host_compute final : public compute_backend {
public:
  std::string name() const override { return "host"; }

  device_buffer allocate(int64_t n) override;
  device_buffer allocate_for_overwrite(int64_t n) override;
  void copy_from_host(float* dst, const float* host_src, int64_t n) override;
  void copy_to_host(float* host_dst, const float* src, int64_t n) override;
  void copy(float* dst, const float* src, int64_t n) override;
  void fill_zero(float* x, int64_t n) override;
  void copy_boxes(void* dst, const void* src, int64_t cols, const std::vector<matrix_box>& boxes,
                  int elem_bytes, bool to_boxes) override;

  void add(float* dst, const float* src, int64_t n) override;
  void scale(float* x, int64_t n, float factor) override;
  scan_result scan(const float* x, int64_t n) override;
  /// One pass: the copy or sum and its sum of squares (in order, as scan()).
  void accumulate_scanned(float* dst, const float* src, int64_t n, accumulate_mode mode,
                          part_scans& scans, int part) override;
  double frobenius_norm(const float* x, int64_t n) override;
  void momentum(float* m, const float* g, float* u, int64_t n, float beta, bool nesterov) override;
  void apply_update(float* p, const float* o, int64_t n, float lr, float scale,
                    float weight_decay) override;
  void apply_update_cautious(float* p, const float* o, int64_t n, float lr, float scale,
                             float weight_decay) override;
  void post_ns(float* x, float* v, int64_t batch, int64_t rows, int64_t cols, const muon_rule& rule,
               float factor) override;
  void scalar_update(float* p, const float* g, float* m, float* v, int64_t n,
                     const scalar_args& args) override;

  void to_bf16(uint16_t* dst, const float* src, int64_t n) override;
  void from_bf16(float* dst, const uint16_t* src, int64_t n) override;

  void newton_schulz(float* x, int64_t batch, int64_t rows, int64_t cols,
                     const ns_options& ns) override;

  void synchronize() override {}

  memory_stats memory() const override;

private:
  /// Orthogonalizes one row-major [rows, cols] matrix in place.
  void newton_schulz_one(float* x, int64_t rows, int64_t cols, const ns_options& ns);
  /// out = X X^T of the wide [r, c] X.
  static void gram(const float* x, int64_t r, int64_t c, float* out);
  /// One standard iteration on the wide [r, c] X: next = a*cur + (b*A + c*A*A)*cur.
  void standard_step(const float* cur, float* next, int64_t r, int64_t c,
                     const std::array<float, 3>& abc);
  /// Steps first..first+count-1 of the Gram variant (ns_variant::gram): next = Q cur.
  void gram_block(const float* cur, float* next, int64_t r, int64_t c, const ns_options& ns,
                  int first, int count);

  // Newton-Schulz workspace, kept across calls so that a step reallocates nothing: the wide
  // iterate X and its successor (ping-pong), A = X X^T and B = b*A + c*A*A (the Gram variant's
  // R and Z), and the Gram variant's Q (ping-pong) and T = a R + Z R.
  std::vector<float> x_;
  std::vector<float> x_next_;
  std::vector<float> a_;
  std::vector<float> b_;
  std::vector<float> q_;
  std::vector<float> q_next_;
  std::vector<float> t_;
};

}  // namespace zmuon
