// bench_sm90_gemm: zmuon's own Hopper GEMM (kernels/cuda/sm90/sm90_gemm.hpp) against
// cuBLAS(Lt) on the products Newton-Schulz runs, same operands, same device, one run:
//   - each case's result against cuBLAS's whole product (max |ours - cuBLAS| / max |cuBLAS|);
//   - each case's median ms and TFLOP/s, counted as full GEMMs (a symmetric product's skipped
//     tiles count too: that is its gain), cuBLAS's and each block shape's of ours (one 128x128
//     tile per block, two per block, and the shape sm90_gemm chooses), and the best speedup.
// Then NS's update X' = B' X on cuBLAS in each operand layout it could take (B' is symmetric, so
// op(B') may be N or T; TN, both operands K-major, is the layout of the whole products above),
// each as the median of single calls and as the mean of 20 calls back to back (sustained, as
// in NS, where the clocks may drop under the power limit).
// Usage: bench_sm90_gemm [--reps N] [--only TEXT]   (exit 1 when a result differs by more than
// 1e-2; --only runs the cases whose label contains TEXT, e.g. under a profiler)
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
#include <utility>
#include <vector>

#include "bench/cuda/bench_common.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/owners.hpp"
#include "kernels/cuda/sm90/sm90_gemm.hpp"

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

/// Max |a - b| / max |b|.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0.0;
  double diff = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  if (!std::isfinite(diff))
    return 1e30;
  return scale > 0 ? diff / scale : diff;
}

/// The update table (see the header); false when NN's result differs from NT's by more than 1e-2.
bool update_layouts(zmuon::gpu::gemm_runner& runner, cudaStream_t stream, int reps,
                    const std::string& only) {
  constexpr int kSustained = 20;
  struct layout {
    const char* name;
    cublasOperation_t a, b;
  };
  const layout layouts[] = {{"NT (NS)", CUBLAS_OP_N, CUBLAS_OP_T},
                            {"NN", CUBLAS_OP_N, CUBLAS_OP_N},
                            {"TN", CUBLAS_OP_T, CUBLAS_OP_N}};
  std::printf("\n%-30s", "X'=B'X on cuBLAS, ms");
  for (const layout& l : layouts)
    std::printf(" %10s %10s", l.name, "sustained");
  std::printf(" %10s\n", "NN vs NT");
  bool ok = true;
  const std::pair<int, int> sides[] = {{2048, 8192}, {4096, 4096}, {4096, 11008}, {8192, 8192}};
  for (const auto& [m, n] : sides) {
    const std::string label = "update " + std::to_string(m) + "x" + std::to_string(n);
    if (label.find(only) == std::string::npos)
      continue;
    std::vector<bf16> b_host = random_bf16(static_cast<size_t>(m) * m, 4);
    symmetrize(b_host, 1, m);
    device_array<bf16> b = upload(b_host);
    device_array<bf16> x = upload(random_bf16(static_cast<size_t>(m) * n, 5));
    device_array<bf16> out(int64_t{m} * n);
    std::printf("%-30s", label.c_str());
    std::vector<float> nt;
    double diff = 0.0;
    for (const layout& l : layouts) {
      // Column-major: X' seen as [n, m] = op(X seen as [n, m]) op(B'); TN reads X's buffer as
      // [m, n] transposed (same bytes and FLOPs; its result is another product).
      const int lda = l.a == CUBLAS_OP_N ? n : m;
      const zmuon::gpu::gemm_shape shape{l.a, l.b, n, m, m, lda, m, n, 0, 0, 0, 1};
      auto once = [&] {
        runner.run(stream, shape, 1.0f, x.data(), b.data(), 0.0f, out.data(), out.data());
      };
      once();
      ZMUON_CUDA_CHECK(cudaStreamSynchronize(stream));
      if (l.b == CUBLAS_OP_T && l.a == CUBLAS_OP_N)
        nt = download(out, int64_t{m} * n);
      else if (l.a == CUBLAS_OP_N)
        diff = relative_difference(download(out, int64_t{m} * n), nt);
      const double single = zmuon::bench::median_ms(
          stream, reps, [] {}, once);
      const double sustained = zmuon::bench::median_ms(
                                   stream, 3, [] {},
                                   [&] {
                                     for (int r = 0; r < kSustained; ++r)
                                       once();
                                   })
                               / kSustained;
      std::printf(" %10.4f %10.4f", single, sustained);
    }
    ok = ok && diff <= 1e-2;
    std::printf(" %10.2e%s\n", diff, diff <= 1e-2 ? "" : "  FAIL");
    std::fflush(stdout);
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr, "usage: bench_sm90_gemm [--reps N] [--only TEXT]\n");
      return 2;
    }
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
        {"Z=cRR+bR 12x768 (sym)", 12, 768, 768, 768, 2.0315f, -4.7750f, true},
        {"Z=cRR+bR 6x768 (sym)", 6, 768, 768, 768, 2.0315f, -4.7750f, true},
        {"A=XX^T 1x768, k 768 (sym)", 1, 768, 768, 768, 1.0f, 0.0f, true},
        {"R=XX^T 32x512, k 2048 (sym)", 32, 512, 512, 2048, 1.0f, 0.0f, true},
        {"A=XX^T 32x2048, k 2048 (sym)", 32, 2048, 2048, 2048, 1.0f, 0.0f, true},
        {"B=cAA+bA 32x2048 (sym)", 32, 2048, 2048, 2048, 2.0315f, -4.7750f, true},
        {"B=cAA 32x2048 (sym, no C)", 32, 2048, 2048, 2048, 2.0315f, 0.0f, true},
        {"R=XX^T 16x2048, k 8192 (sym)", 16, 2048, 2048, 8192, 1.0f, 0.0f, true},
        {"A=XX^T 1x4096, k 4096 (sym)", 1, 4096, 4096, 4096, 1.0f, 0.0f, true},
        {"B=cAA+bA 1x4096 (sym)", 1, 4096, 4096, 4096, 2.0315f, -4.7750f, true},
        {"A=XX^T 1x8192, k 8192 (sym)", 1, 8192, 8192, 8192, 1.0f, 0.0f, true},
        {"B=cAA+bA 1x8192 (sym)", 1, 8192, 8192, 8192, 2.0315f, -4.7750f, true},
        {"4096^3 (full)", 1, 4096, 4096, 4096, 1.0f, 0.0f, false},
        {"8192^3 (full)", 1, 8192, 8192, 8192, 1.0f, 0.0f, false},
    };
    const std::vector<std::pair<zmuon::gpu::sm90_block, const char*>> shapes = {
        {zmuon::gpu::sm90_block::one_tile, "1 tile"},
        {zmuon::gpu::sm90_block::two_tiles, "2 tiles"},
        {zmuon::gpu::sm90_block::automatic, "chosen"}};
    std::printf("%-30s %10s %11s", "case", "cuBLAS ms", "cuBLAS TF/s");
    for (const auto& shape : shapes)
      std::printf(" %10s", shape.second);
    std::printf(" %9s %10s\n", "best/cuBLAS", "rel. diff");
    bool ok = true;
    for (const gemm_case& g : cases) {
      if (g.label.find(only) == std::string::npos)
        continue;
      // As NS runs them: B = c A A + b A and Z = c R R + b R read C from P's own buffer.
      const bool c_is_p = g.symmetric && g.beta != 0.0f && g.k == g.n;
      std::vector<bf16> p_host = random_bf16(static_cast<size_t>(g.batch * g.m * g.k), 1);
      std::vector<bf16> c_host = random_bf16(static_cast<size_t>(g.batch * g.m * g.n), 3);
      if (g.symmetric)
        symmetrize(c_host, g.batch, g.m);
      if (c_is_p)
        symmetrize(p_host, g.batch, g.m);
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
      a.c = c_is_p ? zmuon::gpu::sm90_operand{p.data(), g.k, g.m * g.k}
                   : zmuon::gpu::sm90_operand{c.data(), g.n, g.m * g.n};
      a.d = {ours.data(), g.n, g.m * g.n};
      a.symmetric = g.symmetric;

      auto run_ref = [&] { zmuon::gpu::sm90_gemm_on_cublas(runner, stream, a, ref.data()); };
      run_ref();
      ZMUON_CUDA_CHECK(cudaStreamSynchronize(stream));
      const std::vector<float> r = download(ref, out_numel);
      const double ms_ref = zmuon::bench::median_ms(
          stream, reps, [] {}, run_ref);
      const double flops = 2.0 * static_cast<double>(g.batch) * g.m * g.n * g.k;
      std::printf("%-30s %10.4f %11.1f", g.label.c_str(), ms_ref, flops / ms_ref * 1e-9);

      double worst = 0.0;
      double best_ms = 1e30;
      for (const auto& shape : shapes) {
        a.shape = shape.first;
        ZMUON_CUDA_CHECK(cudaMemset(ours.data(), 0xff, static_cast<size_t>(out_numel) * 2));
        auto run_ours = [&] { zmuon::gpu::sm90_gemm(stream, a); };
        run_ours();
        ZMUON_CUDA_CHECK(cudaStreamSynchronize(stream));
        const std::vector<float> o = download(ours, out_numel);
        worst = std::max(worst, relative_difference(o, r));
        const double ms = zmuon::bench::median_ms(
            stream, reps, [] {}, run_ours);
        best_ms = std::min(best_ms, ms);
        std::printf(" %10.4f", ms);
      }
      ok = ok && worst <= 1e-2;
      std::printf(" %10.2fx %10.2e%s\n", ms_ref / best_ms, worst, worst <= 1e-2 ? "" : "  FAIL");
      std::fflush(stdout);
    }
    ok = update_layouts(runner, stream, reps, only) && ok;
    ZMUON_CUBLAS_CHECK(cublasDestroy(cublas));
    ZMUON_CUDA_CHECK(cudaStreamDestroy(stream));
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sm90_gemm: %s\n", e.what());
    return 1;
  }
}
