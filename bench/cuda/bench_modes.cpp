// bench_ns's --variant and --tables modes (see bench_ns.cpp's header for the command lines).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cuda/bench_common.hpp"
#include "kernels/ns_variants.hpp"

namespace zmuon::bench {
namespace {

// -- --variant / --schedule: the NS variants per shape --------------------------------------------

/// ||O O^T - I||_F / sqrt(m) of the wide view of the row-major [rows, cols] fp32 `o` on the
/// device: the Gram matrix by an fp32 cuBLAS GEMM, the norm summed on the host in double.
double orthogonality_error(const main_stream& stream, const float* o, int64_t rows, int64_t cols) {
  const int m = static_cast<int>(std::min(rows, cols));
  const int n = static_cast<int>(std::max(rows, cols));
  zmuon::gpu::cublas_handle cublas;
  ZMUON_CUBLAS_CHECK(cublasSetStream(cublas.get(), stream));
  device_array<float> g(int64_t{m} * m);
  const float one = 1.0f;
  const float zero = 0.0f;
  // Column-major: a row-major wide [m, n] o is O^T ([n, m], ld n); a tall one is O ([m, n], ld m).
  const bool tall = rows > cols;
  ZMUON_CUBLAS_CHECK(cublasSgemm(cublas.get(), tall ? CUBLAS_OP_N : CUBLAS_OP_T,
                                 tall ? CUBLAS_OP_T : CUBLAS_OP_N, m, m, n, &one, o, tall ? m : n,
                                 o, tall ? m : n, &zero, g.data(), m));
  std::vector<float> host(static_cast<size_t>(m) * m);
  ZMUON_CUDA_CHECK(cudaStreamSynchronize(stream));
  ZMUON_CUDA_CHECK(cudaMemcpy(host.data(), g.data(), g.bytes(), cudaMemcpyDeviceToHost));
  double sum = 0.0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < m; ++j) {
      const double d = host[static_cast<size_t>(i) * m + j] - (i == j ? 1.0 : 0.0);
      sum += d * d;
    }
  }
  return std::sqrt(sum / m);
}

}  // namespace

/// For each of `shapes` (empty: the shapes) and each variant asked for: the median time
/// of one call and the orthogonality error of its result, on the same random input.
int run_variants(zmuon::gpu::cuda_compute& backend, int reps, const zmuon::ns_options& base,
                 const std::vector<zmuon::ns_variant>& variants, const std::string& schedule,
                 std::vector<shape> shapes) {
  const main_stream stream{&backend};
  if (shapes.empty())
    shapes = {{"768x768", 1, 768, 768},       {"768x3072", 1, 768, 3072},
              {"2048x8192", 1, 2048, 8192},   {"4096x4096", 1, 4096, 4096},
              {"4096x11008", 1, 4096, 11008}, {"11008x4096", 1, 11008, 4096}};
  std::printf("NS variants, schedule %s, %d steps, gram restart %d, median of %d\n",
              schedule.c_str(), base.steps, base.gram_restart, reps);
  std::printf("(gram runs on shapes whose long side > %.1f x the short one; others: standard)\n",
              zmuon::kGramMinAspect);
  std::printf(
      "(cuBLAS-only ms: the same call with every GEMM on cuBLAS, the own Hopper GEMM off)\n");
  std::printf("%-12s %-9s %10s %10s %14s %14s\n", "shape", "variant", "ms", "vs first",
              "orthogonality", "cuBLAS-only ms");
  for (const shape& s : shapes) {
    table_buffers buffers({s.label, {s}}, 7);  // one group: the shape's input, kept pristine
    float* const x = buffers.x[0].data();
    const auto restore = [&] { buffers.restore(stream); };
    double first_ms = 0.0;
    for (const zmuon::ns_variant v : variants) {
      zmuon::ns_options ns = base;
      ns.variant = v;
      const auto run = [&] { backend.newton_schulz(x, s.batch, s.rows, s.cols, ns); };
      const auto timed = [&](bool own_gemm) {  // three untimed calls, then the median
        zmuon::gpu::ns_tuning(backend).set_own_gemm(own_gemm);
        for (int i = 0; i < 3; ++i) {
          restore();
          run();
        }
        return median_ms(stream, reps, restore, run);
      };
      const double cublas_ms = timed(false);
      const double ms = timed(true);
      restore();
      run();
      const double orth = orthogonality_error(stream, x, s.rows, s.cols);
      if (first_ms == 0.0)
        first_ms = ms;
      const bool gram = zmuon::ns_uses_gram(ns, s.rows, s.cols,
                                            zmuon::gpu_automatic_variant(s.batch, s.rows, s.cols));
      std::printf("%-12s %-9s %10.3f %9.2fx %14.4g %14.3f\n", s.label.c_str(),
                  v == zmuon::ns_variant::gram ? (gram ? "gram" : "gram(std)") : "standard", ms,
                  first_ms / ms, orth, cublas_ms);
    }
  }
  return 0;
}

/// --tables: each table's groups timed alone and together (the lanes run consecutive calls side
/// by side), against the full-GEMM floor; and GPT-2's table with its tall group laid out wide
/// (one group of 24 768x3072), to see what one group per (short, long) shape would buy. Then
/// the same with the Gram variant (floors stay those of the standard iteration's FLOPs).
int run_tables(zmuon::gpu::cuda_compute& backend, int reps, double gemm_tflops) {
  const main_stream stream{&backend};
  std::vector<table> tables = parameter_tables();
  tables.push_back({"gpt2-124m wide", {{"", 48, 768, 768}, {"", 24, 768, 3072}}});
  std::printf("tables (NS5, median of %d; GEMM candidates timed per shape: %d)\n", reps,
              zmuon::gpu::gemm_runner::candidates());
  std::printf(
      "ms: fp32 in and out; bf16: bf16 in and out (the step's transport); passes: the\n"
      "same calls with 0 iterations (norms, scaling, copies in and out), fp32 / bf16\n");
  std::printf("%-24s %9s %12s %9s %13s %9s %9s %9s\n", "table / group", "ms", "cuBLAS-only",
              "bf16 ms", "passes ms", "floor ms", "of floor", "bf16 of");
  for (const bool gram : {false, true}) {
    zmuon::ns_options ns;  // NS5; with the Gram variant at its default restart on wide shapes
    if (gram) {
      ns.variant = zmuon::ns_variant::gram;
      std::printf("-- the Gram variant (restart %d) where the long side > %.1f x the short one\n",
                  ns.gram_restart, zmuon::kGramMinAspect);
    }
    zmuon::ns_options passes = ns;
    passes.steps = 0;
    for (const table& t : tables) {
      std::vector<table> parts;
      for (const shape& g : t.groups)
        parts.push_back(
            {std::to_string(g.batch) + "x" + std::to_string(g.rows) + "x" + std::to_string(g.cols),
             {g}});
      parts.push_back({t.label, t.groups});
      for (const table& part : parts) {
        double flops = 0;
        for (const shape& g : part.groups)
          flops += ns_flops(g, ns.steps);
        table_buffers buffers(part, 11);
        const auto timed = [&](const zmuon::ns_options& options, bool bf16) {
          const auto restore = [&] { buffers.restore(stream, bf16); };
          const auto run = [&] { buffers.run(backend, options, bf16); };
          warm_up(restore, run);
          return median_ms(stream, reps, restore, run);
        };
        // The default (the own Hopper GEMM where it applies), then cuBLAS for every GEMM.
        zmuon::gpu::ns_tuning(backend).set_own_gemm(false);
        const double cublas_ms = timed(ns, false);
        zmuon::gpu::ns_tuning(backend).set_own_gemm(true);
        const double ms = timed(ns, false);
        const double bf16_ms = timed(ns, true);
        const double passes_ms = timed(passes, false);
        const double passes_bf16_ms = timed(passes, true);
        const double floor_ms = flops / (gemm_tflops * 1e12) * 1e3;
        char passes_text[32];
        std::snprintf(passes_text, sizeof passes_text, "%.3f/%.3f", passes_ms, passes_bf16_ms);
        std::printf("%-24s %9.3f %12.3f %9.3f %13s %9.3f %8.0f%% %8.0f%%\n",
                    (part.label == t.label ? part.label : "  " + part.label).c_str(), ms, cublas_ms,
                    bf16_ms, passes_text, floor_ms, 100.0 * floor_ms / ms,
                    100.0 * floor_ms / bf16_ms);
      }
    }
  }
  return 0;
}

/// --split: one group as one call against the same matrices in serial sub-batches (the lanes
/// joined after each, so that a sub-batch's operands can stay in L2 across its iterations) and
/// in sub-batches on the lanes (consecutive calls side by side), bf16 in and out as the step.
int run_split(zmuon::gpu::cuda_compute& backend, int reps) {
  const main_stream stream{&backend};
  const std::vector<shape> groups = {{"48x768x768", 48, 768, 768},
                                     {"12x768x3072", 12, 768, 3072},
                                     {"32x2048x2048", 32, 2048, 2048},
                                     {"32x8192x2048", 32, 8192, 2048}};
  std::printf("sub-batches (NS5, auto variant, bf16 in and out, median of %d): ms\n", reps);
  std::printf("%-14s %6s %10s %10s %10s\n", "group", "sub", "whole", "serial", "lanes");
  zmuon::ns_options ns;
  ns.variant = zmuon::ns_variant::automatic;
  for (const shape& g : groups) {
    table_buffers buffers({g.label, {g}}, 17);
    uint16_t* const x = buffers.x16[0].data();
    const int64_t per = g.rows * g.cols;
    const auto restore = [&] { buffers.restore(stream, true); };
    const auto timed = [&](const std::function<void()>& run) {
      warm_up(restore, run);
      return median_ms(stream, reps, restore, run);
    };
    const double whole = timed([&] { backend.newton_schulz_bf16(x, g.batch, g.rows, g.cols, ns); });
    for (const int64_t sub : {2, 4, 6, 8, 12, 16, 24}) {
      if (sub >= g.batch || g.batch % sub != 0)
        continue;
      const auto pieces = [&](bool join) {
        return [&, join] {
          for (int64_t k = 0; k < g.batch; k += sub) {
            backend.newton_schulz_bf16(x + k * per, sub, g.rows, g.cols, ns);
            if (join)
              (void)backend.stream();
          }
        };
      };
      const double serial = timed(pieces(true));
      const double lanes = timed(pieces(false));
      std::printf("%-14s %6lld %10.3f %10.3f %10.3f\n", g.label.c_str(),
                  static_cast<long long>(sub), whole, serial, lanes);
    }
  }
  return 0;
}

}  // namespace zmuon::bench
