// bench_ns: zmuon's CUDA Newton-Schulz (NS5) against the device's own ceilings, in one run.
//
// Measures the bf16 GEMM ceiling (cuBLAS, 8192^3, random data) and the device-to-device copy
// bandwidth, then times the backend's newton_schulz() with the engine's default variant
// (automatic: Gram on wide batches with the work for it; the standard iteration beside it
// there) on the shapes, the batch of 48 x 768x768 and the same 48 matrices one call
// each, and the Muon matrices of a GPT-2 124M and a Llama-style 1B table batched by shape
// ("TABLE table" rows: batch = matrices, "graph ms" holds the full-GEMM floor at the measured
// ceiling). Each timing: input restored, stream idle, events around the one call (so host
// launch overhead counts), median of --reps. The shapes' rows time fp32 in and out, and (the
// "bf16 ms" column) bf16 in and out, which is what the step runs. Prints a table and, with --json
// PATH, writes the figures for bench/ns_torch.py's final table. Then the symmetric products' sweep
// (standard iteration): every shape and table again at each smallest block side of --sym (0: full
// products), direct and replayed from graphs, with the blocks per side used.
//
//   bench_ns [--reps N] [--json PATH] [--sym 0,256,512,1024] [--only 4096x4096,...]
//                                    # --only: those shapes' rows (and sweep), no tables
//   bench_ns [--reps N] --tables     # the tables only, group by group (ZMUON_GEMM_CANDIDATES=N
//                                    # times N cuBLASLt algorithms per shape instead of 8)
//   bench_ns [--reps N] --split      # one group as one call against its sub-batches, serial
//                                    # (lanes joined between) and on the lanes
//
// With --variant standard|gram|both (default both), --schedule ns5|polar_express (default ns5),
// --gram-restart N (default 3) or --steps N (default 5), it times the NS variants instead, on
// 768x768, 768x3072, 2048x8192, 4096x4096, 4096x11008 and 11008x4096, and prints each result's
// orthogonality error ||O O^T - I||_F / sqrt(m) (fp32 cuBLAS Gram matrix, double sum);
// --shapes BxRxC,RxC,... times those batches instead (where Gram starts to pay: kGramAutoMinWork).

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda/bench_common.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_compute.hpp"
#include "kernels/cuda/ns_tuning.hpp"
#include "kernels/cuda/owners.hpp"
#include "kernels/ns_variants.hpp"

namespace {

using namespace zmuon::bench;

uint16_t to_bf16_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

struct ceilings {
  double gemm_tflops;
  double copy_tbps;
};

ceilings measure_ceilings(const main_stream& stream, int reps) {
  ceilings c{};
  {
    const int n = 8192;
    const size_t count = static_cast<size_t>(n) * n;
    const std::vector<float> host = random_floats(count, 1);
    std::vector<uint16_t> bits(count);
    for (size_t i = 0; i < count; ++i)
      bits[i] = to_bf16_bits(host[i]);
    device_array<__nv_bfloat16> a(static_cast<int64_t>(count));
    device_array<__nv_bfloat16> b(static_cast<int64_t>(count));
    device_array<__nv_bfloat16> d(static_cast<int64_t>(count));
    ZMUON_CUDA_CHECK(cudaMemcpy(a.data(), bits.data(), a.bytes(), cudaMemcpyHostToDevice));
    std::reverse(bits.begin(), bits.end());
    ZMUON_CUDA_CHECK(cudaMemcpy(b.data(), bits.data(), b.bytes(), cudaMemcpyHostToDevice));
    zmuon::gpu::cublas_handle cublas;
    device_array<unsigned char> workspace(int64_t{32} << 20);
    ZMUON_CUBLAS_CHECK(cublasSetStream(cublas.get(), stream));
    ZMUON_CUBLAS_CHECK(cublasSetWorkspace(cublas.get(), workspace.data(), workspace.bytes()));
    const float one = 1.0f;
    const float zero = 0.0f;
    const auto gemm = [&] {
      ZMUON_CUBLAS_CHECK(cublasGemmEx(cublas.get(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one,
                                      a.data(), CUDA_R_16BF, n, b.data(), CUDA_R_16BF, n, &zero,
                                      d.data(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
    };
    for (int i = 0; i < 3; ++i)
      gemm();
    const double ms = median_ms(
        stream, reps, [] {}, gemm);
    c.gemm_tflops = 2.0 * n * static_cast<double>(n) * n / (ms * 1e-3) / 1e12;
  }
  {
    const int64_t count = int64_t{1} << 29;  // 2 GiB of floats each way
    device_array<float> src(count);
    device_array<float> dst(count);
    ZMUON_CUDA_CHECK(cudaMemsetAsync(src.data(), 0x3F, src.bytes(), stream));
    const auto copy = [&] {
      ZMUON_CUDA_CHECK(
          cudaMemcpyAsync(dst.data(), src.data(), src.bytes(), cudaMemcpyDeviceToDevice, stream));
    };
    copy();
    const double ms = median_ms(
        stream, reps, [] {}, copy);
    c.copy_tbps = 2.0 * static_cast<double>(src.bytes()) / (ms * 1e-3) / 1e12;
  }
  return c;
}

struct result {
  shape s;
  double ms;  // the backend as the engine runs it (its default variant, cuBLASLt GEMMs)
  double tflops;
  double copy_ms;                    // the fallback path: copy C into D, cublasGemmStridedBatchedEx
  double bf16_ms;                    // bf16 in and out, as the step's coordinator calls it
  double graph_ms;                   // the iterations' GEMMs replayed from a CUDA graph
  double enqueue_ms;                 // host time to enqueue one call (launch overhead)
  const char* variant = "standard";  // what the default variant ran
  double standard_ms = 0;            // the standard iteration, where the default ran Gram
};

/// "a,b,c" -> {"a", "b", "c"} (empty items dropped); `sep` instead of the comma.
std::vector<std::string> split_list(const std::string& list, char sep = ',') {
  std::vector<std::string> items;
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(sep, at), list.size());
    if (comma > at)
      items.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return items;
}

/// Median host milliseconds that `body` takes to return (it only enqueues).
double median_enqueue_ms(const main_stream& stream, int reps, const std::function<void()>& body) {
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    ZMUON_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto start = std::chrono::steady_clock::now();
    body();
    const auto stop = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  ZMUON_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char* argv[]) {
  int reps = 20;
  std::string json_path;
  std::vector<int64_t> sym_sides = {0, 256, 512, 1024};
  std::vector<std::string> only;  // --only: these shapes' rows, no tables
  // --variant / --schedule / --gram-restart / --steps: the variants table instead.
  bool variants_mode = false;
  bool tables_mode = false;  // --tables: only the tables, group by group
  bool split_mode = false;   // --split: sub-batches of one group against one call
  // --update-flipped: NS's update reads B' in the other operand layout (newton_schulz.hpp)
  bool update_flipped = false;
  std::vector<zmuon::ns_variant> variants = {zmuon::ns_variant::standard, zmuon::ns_variant::gram};
  std::string schedule = "ns5";
  zmuon::ns_options variant_ns;
  std::vector<shape> variant_shapes;  // --shapes; empty: the shapes
  const char* usage =
      "usage: bench_ns [--reps N] [--json PATH] [--sym 0,256,512,1024] [--update-flipped]\n"
      "                [--only 4096x4096,8192x8192]\n"
      "       bench_ns [--reps N] --tables\n"
      "       bench_ns [--reps N] --split\n"
      "       bench_ns [--reps N] [--variant standard|gram|both] [--schedule ns5|polar_express]\n"
      "                [--gram-restart N] [--steps N] [--shapes 3x512x2048,768x3072]\n";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--reps" && has_value) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--update-flipped") {
      update_flipped = true;
    } else if (arg == "--tables") {
      tables_mode = true;
    } else if (arg == "--split") {
      split_mode = true;
    } else if (arg == "--json" && has_value) {
      json_path = argv[++i];
    } else if (arg == "--sym" && has_value) {
      sym_sides.clear();
      for (const std::string& side : split_list(argv[++i]))
        sym_sides.push_back(std::atoll(side.c_str()));
    } else if (arg == "--only" && has_value) {
      only = split_list(argv[++i]);
    } else if (arg == "--variant" && has_value) {
      variants_mode = true;
      const std::string v = argv[++i];
      if (v == "standard") {
        variants = {zmuon::ns_variant::standard};
      } else if (v == "gram") {
        variants = {zmuon::ns_variant::gram};
      } else if (v != "both") {
        std::fprintf(stderr, "bench_ns: --variant %s: expected standard, gram or both\n%s",
                     v.c_str(), usage);
        return 2;
      }
    } else if (arg == "--schedule" && has_value) {
      variants_mode = true;
      schedule = argv[++i];
      if (schedule != "ns5" && schedule != "polar_express") {
        std::fprintf(stderr, "bench_ns: --schedule %s: expected ns5 or polar_express\n%s",
                     schedule.c_str(), usage);
        return 2;
      }
    } else if (arg == "--gram-restart" && has_value) {
      variants_mode = true;
      variant_ns.gram_restart = std::max(0, std::atoi(argv[++i]));
    } else if (arg == "--shapes" && has_value) {
      variants_mode = true;
      for (const std::string& text : split_list(argv[++i])) {
        std::vector<int64_t> sides;
        for (const std::string& side : split_list(text, 'x'))
          sides.push_back(std::atoll(side.c_str()));
        if (sides.size() == 2)
          sides.insert(sides.begin(), 1);
        if (sides.size() != 3 || *std::min_element(sides.begin(), sides.end()) < 1) {
          std::fprintf(stderr, "bench_ns: --shapes %s: expected BATCHxROWSxCOLS or ROWSxCOLS\n%s",
                       text.c_str(), usage);
          return 2;
        }
        variant_shapes.push_back({text, sides[0], sides[1], sides[2]});
      }
    } else if (arg == "--steps" && has_value) {
      variants_mode = true;
      variant_ns.steps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "%s", usage);
      return 2;
    }
  }
  if (schedule == "polar_express")
    variant_ns.schedule = zmuon::polar_express_schedule(variant_ns.steps);

  auto made = zmuon::make_cuda_compute_backend();
  if (!made) {
    std::fprintf(stderr, "bench_ns: %s\n", made.err().to_string().c_str());
    return 1;
  }
  try {
    auto& backend = dynamic_cast<zmuon::gpu::cuda_compute&>(**made);
    // cuBLASLt algorithms timed per shape: the engine's 8 unless the environment says (1..64).
    zmuon::gpu::ns_tuning::set_gemm_candidates(
        static_cast<int>(zmuon::gpu::env_number("ZMUON_GEMM_CANDIDATES", 1, 64, 8)));
    zmuon::gpu::ns_tuning(backend).set_update_flipped(update_flipped);
    if (update_flipped)
      std::printf("NS update: B' in the other operand layout (--update-flipped)\n");
    if (variants_mode)
      return run_variants(backend, reps, variant_ns, variants, schedule, variant_shapes);
    if (split_mode)
      return run_split(backend, reps);
    const main_stream stream{&backend};
    cudaDeviceProp prop{};
    ZMUON_CUDA_CHECK(cudaGetDeviceProperties(&prop, backend.device()));

    const ceilings top = measure_ceilings(stream, reps);
    std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
    std::printf(
        "ceiling: bf16 GEMM 8192^3 (cuBLAS) %.1f TFLOP/s; device copy %.2f TB/s "
        "(read + write)\n",
        top.gemm_tflops, top.copy_tbps);
    if (tables_mode)
      return run_tables(backend, reps, top.gemm_tflops);

    // NS5, (3.4445, -4.7750, 2.0315), with the variant the engine runs by default (automatic:
    // Gram for wide batches with the work for it); `standard` times the plain iteration.
    const zmuon::ns_options ns = zmuon::automatic_ns();
    zmuon::ns_options standard = ns;
    standard.variant = zmuon::ns_variant::standard;
    std::vector<shape> shapes = {
        {"768x768", 1, 768, 768},     {"768x3072", 1, 768, 3072},     {"2048x8192", 1, 2048, 8192},
        {"4096x4096", 1, 4096, 4096}, {"4096x11008", 1, 4096, 11008}, {"8192x8192", 1, 8192, 8192},
        {"48x768x768", 48, 768, 768},
    };
    if (!only.empty()) {  // the shapes named, in the order named
      std::vector<shape> picked;
      for (const std::string& label : only) {
        const auto found = std::find_if(shapes.begin(), shapes.end(),
                                        [&](const shape& s) { return s.label == label; });
        if (found == shapes.end()) {
          std::fprintf(stderr, "bench_ns: --only %s: no such shape\n%s", label.c_str(), usage);
          return 2;
        }
        picked.push_back(*found);
      }
      shapes = picked;
    }
    std::vector<result> results;
    for (const shape& s : shapes) {
      table_buffers buffers({s.label, {s}}, 7);  // one group: the shape's input, kept pristine
      float* const x = buffers.x[0].data();
      const auto restore = [&] { buffers.restore(stream); };
      const auto run = [&] { backend.newton_schulz(x, s.batch, s.rows, s.cols, ns); };
      const auto flops = [&](double ms) { return ns_flops(s, ns.steps) / (ms * 1e-3) / 1e12; };
      // Three untimed runs, then the median; `before` restores the input (fp32 by default).
      const auto measure = [&](const std::function<void()>& body,
                               const std::function<void()>& before = {}) {
        const std::function<void()>& again = before ? before : restore;
        for (int i = 0; i < 3; ++i) {
          again();
          body();
        }
        return median_ms(stream, reps, again, body);
      };
      result r{s, 0, 0, 0, 0, 0, 0};
      zmuon::gpu::ns_tuning(backend).set_gemm_path(zmuon::gpu::gemm_path::copy_then_gemm);
      r.copy_ms = measure(run);
      zmuon::gpu::ns_tuning(backend).set_gemm_path(zmuon::gpu::gemm_path::lt);
      r.ms = measure(run);
      r.bf16_ms =
          measure([&] { buffers.run(backend, ns, true); }, [&] { buffers.restore(stream, true); });
      r.tflops = flops(r.ms);
      r.enqueue_ms = median_enqueue_ms(stream, reps, run);
      zmuon::gpu::ns_tuning(backend).set_graphs(zmuon::gpu::graph_mode::on);
      r.graph_ms = measure(run);
      zmuon::gpu::ns_tuning(backend).set_graphs(zmuon::gpu::graph_mode::automatic);
      if (zmuon::ns_uses_gram(ns, s.rows, s.cols,
                              zmuon::gpu_automatic_variant(s.batch, s.rows, s.cols))) {
        r.variant = "gram";
        r.standard_ms =
            measure([&] { backend.newton_schulz(x, s.batch, s.rows, s.cols, standard); });
      }
      results.push_back(r);

      if (s.batch > 1) {  // the same matrices, one call each
        const int64_t per = s.rows * s.cols;
        const auto loop = [&] {
          for (int64_t k = 0; k < s.batch; ++k)
            backend.newton_schulz(x + k * per, 1, s.rows, s.cols, ns);
        };
        result l{shape{s.label + " loop", s.batch, s.rows, s.cols}, 0, 0, 0, 0, 0, 0};
        l.ms = measure(loop);
        l.tflops = flops(l.ms);
        l.enqueue_ms = median_enqueue_ms(stream, reps, loop);
        zmuon::gpu::ns_tuning(backend).set_graphs(zmuon::gpu::graph_mode::on);
        l.graph_ms = measure(loop);
        zmuon::gpu::ns_tuning(backend).set_graphs(zmuon::gpu::graph_mode::automatic);
        results.push_back(l);
      }
    }
    const std::vector<table> tables = only.empty() ? parameter_tables() : std::vector<table>{};
    for (const table& t : tables) {
      double flops = 0;
      int64_t matrices = 0;
      for (const shape& g : t.groups) {
        flops += ns_flops(g, ns.steps);
        matrices += g.batch;
      }
      table_buffers buffers(t, 11);
      const auto restore = [&] { buffers.restore(stream); };
      const auto run = [&] { buffers.run(backend, ns); };
      warm_up(restore, run);
      result r{shape{t.label + " table", matrices, 0, 0}, 0, 0, 0, 0, 0, 0};
      r.ms = median_ms(stream, std::max(3, reps / 4), restore, run);
      r.tflops = flops / (r.ms * 1e-3) / 1e12;
      r.enqueue_ms = median_enqueue_ms(stream, std::max(3, reps / 4), run);
      r.graph_ms = flops / (top.gemm_tflops * 1e12) * 1e3;  // the full-GEMM floor
      r.variant = "auto";                                   // per group, as the engine runs it
      results.push_back(r);
    }
    backend.synchronize();

    // The symmetric products' sweep: each shape (as one batched call) and each table (one call
    // per group) at every smallest block side, direct and from graphs.
    std::printf(
        "\nsymmetric products: ms per smallest block side (blocks per side of the "
        "largest group in brackets), direct / graph; then the defaults with cuBLASLt's "
        "first algorithm and with the timed choice\n");
    std::vector<table> sweep = tables;
    for (const shape& s : shapes)
      sweep.push_back(table{s.label, {s}});
    for (const table& t : sweep) {
      table_buffers buffers(t, 13);
      const auto restore = [&] { buffers.restore(stream); };
      const auto run = [&] { buffers.run(backend, standard); };
      std::printf("SYM %-12s", t.label.c_str());
      for (const int64_t side : sym_sides) {
        zmuon::gpu::ns_tuning(backend).set_symmetric_block(side);
        int64_t blocks = 1;
        for (const shape& g : t.groups)
          blocks = std::max(blocks, zmuon::gpu::ns_tuning(backend).symmetric_blocks(
                                        std::min(g.rows, g.cols), g.batch));
        double ms[2];
        for (int graphs = 0; graphs < 2; ++graphs) {
          zmuon::gpu::ns_tuning(backend).set_graphs(graphs == 1 ? zmuon::gpu::graph_mode::on
                                                                : zmuon::gpu::graph_mode::off);
          warm_up(restore, run);
          ms[graphs] = median_ms(stream, std::max(3, reps / 2), restore, run);
        }
        zmuon::gpu::ns_tuning(backend).set_graphs(zmuon::gpu::graph_mode::automatic);
        std::printf("  %5lld[%2lld] %8.3f / %8.3f", static_cast<long long>(side),
                    static_cast<long long>(blocks), ms[0], ms[1]);
      }
      // The engine's defaults, with cuBLASLt's first algorithm instead of the timed choice.
      zmuon::gpu::ns_tuning(backend).set_symmetric_block(
          zmuon::gpu::ns_workspace::kDefaultSymmetricBlock);
      zmuon::gpu::ns_tuning(backend).set_autotune(false);
      warm_up(restore, run);
      const double heuristic_ms = median_ms(stream, std::max(3, reps / 2), restore, run);
      zmuon::gpu::ns_tuning(backend).set_autotune(true);
      warm_up(restore, run);
      const double tuned_ms = median_ms(stream, std::max(3, reps / 2), restore, run);
      std::printf("  default: heuristic %8.3f tuned %8.3f\n", heuristic_ms, tuned_ms);
      std::fflush(stdout);
    }
    zmuon::gpu::ns_tuning(backend).set_symmetric_block(
        zmuon::gpu::ns_workspace::kDefaultSymmetricBlock);

    std::printf("\nzmuon NS5 (cuda backend, bf16 GEMMs, fp32 in/out), median of %d\n", reps);
    std::printf(
        "(the engine's default variant, named; standard: the plain iteration where that is "
        "Gram; copy: C copied into D + cublasGemmStridedBatchedEx; bf16: bf16 in and out, as "
        "the step's coordinator calls it; graph: the GEMMs replayed from a CUDA graph; enqueue: "
        "host time to issue the call)\n");
    std::printf("%-18s %-9s %10s %10s %9s %12s %10s %10s %10s %10s\n", "shape", "variant", "ms",
                "TFLOP/s", "ceiling", "standard ms", "copy ms", "bf16 ms", "graph ms", "enqueue");
    for (const result& r : results) {
      char standard_text[16] = "";
      if (r.standard_ms > 0)
        std::snprintf(standard_text, sizeof standard_text, "%.3f", r.standard_ms);
      std::printf("%-18s %-9s %10.3f %10.1f %8.0f%% %12s %10.3f %10.3f %10.3f %10.3f\n",
                  r.s.label.c_str(), r.variant, r.ms, r.tflops, 100.0 * r.tflops / top.gemm_tflops,
                  standard_text, r.copy_ms, r.bf16_ms, r.graph_ms, r.enqueue_ms);
    }
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      out << "{\n  \"device\": \"" << prop.name << "\",\n";
      out << "  \"gemm_tflops\": " << top.gemm_tflops << ",\n";
      out << "  \"copy_tbps\": " << top.copy_tbps << ",\n";
      out << "  \"reps\": " << reps << ",\n  \"ns\": [\n";
      for (size_t i = 0; i < results.size(); ++i) {
        const result& r = results[i];
        out << "    {\"label\": \"" << r.s.label << "\", \"batch\": " << r.s.batch
            << ", \"rows\": " << r.s.rows << ", \"cols\": " << r.s.cols << ", \"ms\": " << r.ms
            << ", \"tflops\": " << r.tflops << ", \"copy_ms\": " << r.copy_ms
            << ", \"bf16_ms\": " << r.bf16_ms << ", \"graph_ms\": " << r.graph_ms
            << ", \"enqueue_ms\": " << r.enqueue_ms << ", \"variant\": \"" << r.variant
            << "\", \"standard_ms\": " << r.standard_ms << "}"
            << (i + 1 < results.size() ? ",\n" : "\n");
      }
      out << "  ]\n}\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ns: %s\n", e.what());
    return 1;
  }
  return 0;
}
