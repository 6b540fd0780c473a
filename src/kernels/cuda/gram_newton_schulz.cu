// The Gram variant of Newton-Schulz with cuBLAS and the own Hopper GEMM (see
// gram_newton_schulz.hpp).

#include "kernels/cuda/gram_newton_schulz.hpp"

#include <climits>
#include <string>
#include <utility>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/ns_normalize.hpp"
#include "kernels/cuda/sm90/sm90_gemm.hpp"
#include "kernels/ns_variants.hpp"

namespace zmuon::gpu {
namespace {

[[noreturn]] void reject(const std::string& what) {
  throw failure(error(errc::invalid_argument, "newton_schulz (gram): " + what));
}

}  // namespace

gram_ns_workspace::gram_ns_workspace(cublasHandle_t cublas)
    : gemm_(cublas), own_gemm_device_(sm90_gemm_available()) {}

void gram_ns_workspace::run(const launch_context& ctx, ns_io x, int64_t batch, int64_t rows,
                            int64_t cols, const ns_options& ns) {
  if (batch <= 0 || rows <= 0 || cols <= 0)
    return;
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows;
  const int64_t n = tall ? rows : cols;
  if (n > INT_MAX || batch > INT_MAX)
    reject("matrix side or batch past cuBLAS's int range");
  const int64_t numel = m * n;
  const int64_t gram = m * m;
  x_.reserve(batch * numel);
  x_next_.reserve(batch * numel);
  for (auto* a : {&r_, &z_, &t_, &q_, &q_next_})
    a->reserve(batch * gram);
  partial_sums_.reserve(batch * normalize_slices(batch, numel, ctx.sm_count));
  inv_norms_.reserve(batch);

  launch_normalize_to_bf16(ctx, x, batch, numel, static_cast<double>(ns.eps), partial_sums_.data(),
                           inv_norms_.data(), x_.data());
  // The blocks alternate between x_ and x_next_; with bf16 in and out, between x and x_next_
  // so that the last block writes x itself (step_output), and nothing is copied back.
  const bool in_place = lands_in_caller_buffer(x);
  int blocks = 0;
  for (int step = 0; step < ns.steps; step += gram_block_steps(ns, ns.steps - step))
    ++blocks;
  __nv_bfloat16* cur = x_.data();
  int done = 0;
  for (int step = 0; step < ns.steps; ++done) {
    __nv_bfloat16* const next = in_place ? step_output(done + 1, blocks, x.bf16, x_next_.data())
                                         : (cur == x_.data() ? x_next_.data() : x_.data());
    const int count = gram_block_steps(ns, ns.steps - step);
    block(ctx.stream, batch, m, n, tall, ns, step, count, cur, next);
    cur = next;
    step += count;
  }
  if (cur != x.bf16)
    launch_ns_result(ctx, cur, batch * numel, x);
}

void gram_ns_workspace::block(cudaStream_t stream, int64_t batch, int64_t m, int64_t n, bool tall,
                              const ns_options& ns, int first, int count, const __nv_bfloat16* cur,
                              __nv_bfloat16* next) {
  // cuBLAS column-major terms, as ns_workspace::iterate: the wide X is Xc = X^T ([n, m], ld n)
  // for a wide row-major input and X itself ([m, n], ld m) for a tall one. The [m, m] matrices
  // are column-major; R, Z, T and Q are polynomials of one R, so they commute.
  const int mi = static_cast<int>(m);
  const int ni = static_cast<int>(n);
  const int bi = static_cast<int>(batch);
  const int ld_x = tall ? mi : ni;
  const int64_t numel = m * n;
  const int64_t gram = m * m;
  // R = X X^T.
  const gemm_shape gram_shape{tall ? CUBLAS_OP_N : CUBLAS_OP_T,
                              tall ? CUBLAS_OP_T : CUBLAS_OP_N,
                              mi,
                              mi,
                              ni,
                              ld_x,
                              ld_x,
                              mi,
                              numel,
                              numel,
                              gram,
                              bi};
  // [m, m] times [m, m].
  const gemm_shape square{CUBLAS_OP_N, CUBLAS_OP_N, mi, mi, mi, mi, mi, mi, gram, gram, gram, bi};
  // X' = Q X (wide: Xc' = Xc Q^T; tall: X' = Q X).
  const gemm_shape apply =
      tall ? gemm_shape{CUBLAS_OP_N, CUBLAS_OP_N, mi, ni, mi, mi, mi, mi, gram, numel, numel, bi}
           : gemm_shape{CUBLAS_OP_N, CUBLAS_OP_T, ni, mi, mi, ni, mi, ni, numel, gram, numel, bi};

  // The own GEMM (row-major terms; every [m, m] matrix is symmetric, so P Q = P Q^T and the
  // layouts agree with cuBLAS's): R = X X^T over a wide X's rows, and the [m, m] products.
  const bool own = own_gemm_ && own_gemm_device_;
  const bool own_gram = own && !tall && sm90_gemm_suits_symmetric(batch, m, n);
  const bool own_square = own && sm90_gemm_suits_symmetric(batch, m, m);
  // D = alpha * P Q + beta * C for [m, m] matrices.
  const auto product = [&](float alpha, const __nv_bfloat16* p, const __nv_bfloat16* q, float beta,
                           const __nv_bfloat16* c, __nv_bfloat16* d) {
    if (!own_square) {
      gemm_.run(stream, square, alpha, p, q, beta, beta != 0.0f ? c : d, d);
      return;
    }
    sm90_gemm_args g;
    g.batch = batch;
    g.m = g.n = g.k = m;
    g.p = {p, m, gram};
    g.q = {q, m, gram};
    g.alpha = alpha;
    g.beta = beta;
    g.c = {c, m, gram};
    g.d = {d, m, gram};
    g.symmetric = true;
    sm90_gemm(stream, g);
  };

  __nv_bfloat16* r = r_.data();
  __nv_bfloat16* z = z_.data();
  __nv_bfloat16* t = t_.data();
  __nv_bfloat16* q = q_.data();
  __nv_bfloat16* q_next = q_next_.data();
  if (own_gram) {
    sm90_gemm_args g;
    g.batch = batch;
    g.m = g.n = m;
    g.k = n;
    g.p = g.q = {cur, n, numel};
    g.d = {r, m, gram};
    g.symmetric = true;
    sm90_gemm(stream, g);
  } else {
    gemm_.run(stream, gram_shape, 1.0f, cur, cur, 0.0f, r, r);
  }
  // Z' = Z + a*I carries every "+ a*..." term: Q = a*I + Z is Z' itself, and Z*Q + a*Q,
  // Z*R + a*R and T*Z + a*T are Z'*Q, Z'*R and T*Z', products that read no C.
  for (int j = 0; j < count; ++j) {
    const auto& abc = ns_coefficients_at(ns, first + j);
    product(abc[2], r, r, abc[1], r, z);  // Z = c*R*R + b*R
    launch_add_to_diagonal(stream, z, m, batch, abc[0]);
    const __nv_bfloat16* const z_plus = z;
    if (j == 0) {  // Q = Z'; z takes Q's free buffer for the next Z
      std::swap(q, z);
    } else {  // Q = Z' Q
      product(1.0f, z_plus, q, 0.0f, nullptr, q_next);
      std::swap(q, q_next);
    }
    if (j + 1 < count) {
      product(1.0f, z_plus, r, 0.0f, nullptr, t);  // T = Z' R
      product(1.0f, t, z_plus, 0.0f, nullptr, r);  // R = T Z'
    }
  }
  if (tall) {
    gemm_.run(stream, apply, 1.0f, q, cur, 0.0f, next, next);
  } else {
    gemm_.run(stream, apply, 1.0f, cur, q, 0.0f, next, next);
  }
}

int64_t gram_ns_workspace::bytes() const {
  return static_cast<int64_t>(x_.bytes() + x_next_.bytes() + r_.bytes() + z_.bytes() + t_.bytes()
                              + q_.bytes() + q_next_.bytes() + partial_sums_.bytes()
                              + inv_norms_.bytes())
         + gemm_.bytes();
}

}  // namespace zmuon::gpu
