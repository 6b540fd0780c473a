// bench_sm90_gemm: zmuon's own Hopper GEMM (kernels/cuda/sm90_gemm.hpp) against cuBLAS(Lt) on
// the products Newton-Schulz runs, same operands, same device, one run:
//   - each case's result against cuBLAS's whole product (max |ours - cuBLAS| / max |cuBLAS|);
//   - each case's median ms and TFLOP/s, counted as full GEMMs (a symmetric product's skipped
//     tiles count too: that is its gain), ours and cuBLAS's.
// Usage: bench_sm90_gemm [--reps N]   (exit 1 when a result differs by more than 1e-2)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda/bench_common.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/owners.hpp"
#include "kernels/cuda/sm90_gemm.hpp"

namespace {

using zmuon::gpu::device_array;
using bf16 = __nv_bfloat16;

struct gemm_case {
  std::string label;
  int64_t batch, m, n, k;
  float alpha, beta;
  bool symmetric;  // P Q^T and C symmetric: P = Q (and C symmetric)
};

std::vector<bf16> random_bf16(size_t n, uint64_t seed) {
  std::vector<bf16> v(n);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    x = __float2bfloat16(static_cast<float>(state >> 40) / static_cast<float>(1 << 24) - 0.5f);
  }
  return v;
}

/// Symmetrizes each [m, m] matrix of `v` in place (upper from lower).
void symmetrize(std::vector<bf16>& v, int64_t batch, int64_t m) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = i + 1; j < m; ++j)
        v[static_cast<size_t>(b * m * m + i * m + j)] =
            v[static_cast<size_t>(b * m * m + j * m + i)];
}

device_array<bf16> upload(const std::vector<bf16>& host) {
  device_array<bf16> d(static_cast<int64_t>(host.size()));
  ZMUON_CUDA_CHECK(
      cudaMemcpy(d.data(), host.data(), host.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  return d;
}

std::vector<float> download(const device_array<bf16>& d, int64_t n) {
  std::vector<bf16> host(static_cast<size_t>(n));
  ZMUON_CUDA_CHECK(
      cudaMemcpy(host.data(), d.data(), host.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> out(host.size());
  for (size_t i = 0; i < host.size(); ++i)
    out[i] = __bfloat162float(host[i]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::atoi(argv[++i]);
  }
  try {
    if (!zmuon::gpu::sm90_gemm_available()) {
      std::fprintf(stderr, "bench_sm90_gemm: needs a compute capability 9.0 GPU\n");
      return 2;
    }
    cudaStream_t stream = nullptr;
    ZMUON_CUDA_CHECK(cudaStreamCreate(&stream));
    cublasHandle_t cublas = nullptr;
    ZMUON_CUBLAS_CHECK(cublasCreate(&cublas));
    ZMUON_CUBLAS_CHECK(cublasSetStream(cublas, stream));
    zmuon::gpu::gemm_runner runner(cublas);

    // The symmetric products Newton-Schulz runs (A = X X^T over k = n, B = c A A + b A over
    // k = m, the Gram variant's R and [m, m] products), and two whole products for scale.
    const std::vector<gemm_case> cases = {
        {"A=XX^T 48x768, k 768 (sym)", 48, 768, 768, 768, 1.0f, 0.0f, true},
        {"A=XX^T 48x768, k 768 (full)", 48, 768, 768, 768, 1.0f, 0.0f, false},
        {"B=cAA+bA 48x768 (sym)", 48, 768, 768, 768, 2.0315f, -4.7750f, true},
        {"R=XX^T 12x768, k 3072 (sym)", 12, 768, 768, 3072, 1.0f, 0.0f, true},
        {"R=XX^T 32x512, k 2048 (sym)", 32, 512, 512, 2048, 1.0f, 0.0f, true},
        {"A=XX^T 32x2048, k 2048 (sym)", 32, 2048, 2048, 2048, 1.0f, 0.0f, true},
        {"B=cAA+bA 32x2048 (sym)", 32, 2048, 2048, 2048, 2.0315f, -4.7750f, true},
        {"R=XX^T 16x2048, k 8192 (sym)", 16, 2048, 2048, 8192, 1.0f, 0.0f, true},
        {"8192^3 (full)", 1, 8192, 8192, 8192, 1.0f, 0.0f, false},
    };
    std::printf("%-30s %10s %10s %10s %10s %9s %10s\n", "case", "ours ms", "cuBLAS ms", "ours TF/s",
                "cuBLAS TF/s", "speedup", "rel. diff");
    bool ok = true;
    for (const gemm_case& g : cases) {
      std::vector<bf16> p_host = random_bf16(static_cast<size_t>(g.batch * g.m * g.k), 1);
      std::vector<bf16> c_host = random_bf16(static_cast<size_t>(g.batch * g.m * g.n), 3);
      if (g.symmetric)
        symmetrize(c_host, g.batch, g.m);
      const std::vector<bf16> q_host =
          g.symmetric ? p_host : random_bf16(static_cast<size_t>(g.batch * g.n * g.k), 2);
      device_array<bf16> p = upload(p_host);
      device_array<bf16> q = upload(q_host);
      device_array<bf16> c = upload(c_host);
      const int64_t out_numel = g.batch * g.m * g.n;
      device_array<bf16> ours(out_numel);
      device_array<bf16> ref(out_numel);

      zmuon::gpu::sm90_gemm_args a;
      a.batch = g.batch;
      a.m = g.m;
      a.n = g.n;
      a.k = g.k;
      a.p = {p.data(), g.k, g.m * g.k};
      a.q = {q.data(), g.k, g.n * g.k};
      a.alpha = g.alpha;
      a.beta = g.beta;
      a.c = {c.data(), g.n, g.m * g.n};
      a.d = {ours.data(), g.n, g.m * g.n};
      a.symmetric = g.symmetric;

      auto run_ref = [&] { zmuon::gpu::sm90_gemm_on_cublas(runner, stream, a, ref.data()); };
      auto run_ours = [&] { zmuon::gpu::sm90_gemm(stream, a); };
      run_ref();
      run_ours();
      ZMUON_CUDA_CHECK(cudaStreamSynchronize(stream));

      const std::vector<float> r = download(ref, out_numel);
      const std::vector<float> o = download(ours, out_numel);
      double scale = 0.0;
      double diff = 0.0;
      for (size_t i = 0; i < r.size(); ++i) {
        scale = std::max(scale, static_cast<double>(std::fabs(r[i])));
        diff = std::max(diff, static_cast<double>(std::fabs(r[i] - o[i])));
      }
      const double rel = scale > 0 ? diff / scale : diff;
      ok = ok && rel <= 1e-2;

      const double ms_ref = zmuon::bench::median_ms(
          stream, reps, [] {}, run_ref);
      const double ms_ours = zmuon::bench::median_ms(
          stream, reps, [] {}, run_ours);
      const double flops = 2.0 * static_cast<double>(g.batch) * g.m * g.n * g.k;
      std::printf("%-30s %10.4f %10.4f %10.1f %10.1f %8.2fx %10.2e%s\n", g.label.c_str(), ms_ours,
                  ms_ref, flops / ms_ours * 1e-9, flops / ms_ref * 1e-9, ms_ref / ms_ours, rel,
                  rel <= 1e-2 ? "" : "  FAIL");
    }
    ZMUON_CUBLAS_CHECK(cublasDestroy(cublas));
    ZMUON_CUDA_CHECK(cudaStreamDestroy(stream));
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sm90_gemm: %s\n", e.what());
    return 1;
  }
}
