// What bench_ns's modes share (bench_ns.cpp: the shapes against the ceilings; bench_modes.cpp:
// --variant and --tables): shapes and their full-GEMM FLOPs, random inputs, timing on the
// backend's main stream, and the parameter tables laid out as the engine's owners run them.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/bf16.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_compute.hpp"
#include "kernels/cuda/ns_tuning.hpp"
#include "kernels/cuda/owners.hpp"
#include "zmuon/options.hpp"

namespace zmuon::bench {

using gpu::cuda_event;
using gpu::device_array;

struct shape {
  std::string label;
  int64_t batch;
  int64_t rows;
  int64_t cols;
};

/// Full-GEMM FLOPs of `steps` NS iterations: A = X X^T, A*A and B*X on the wide [m, n] view.
inline double ns_flops(const shape& s, int steps) {
  const double m = static_cast<double>(std::min(s.rows, s.cols));
  const double n = static_cast<double>(std::max(s.rows, s.cols));
  return static_cast<double>(s.batch) * steps * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n);
}

/// Normal-ish random floats (sum of uniforms), fast enough for 10^8 values.
inline std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  const auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<float>(state >> 40) / static_cast<float>(1 << 24);
  };
  for (float& x : v)
    x = (next() + next() + next() - 1.5f) * 2.0f;
  return v;
}

/// The backend's main stream, looked up at every use: the backend's stream() joins the
/// Newton-Schulz lanes first (kernels/cuda/stream_set.hpp), so an event recorded or a copy
/// enqueued on it comes after every NS call made before.
struct main_stream {
  const zmuon::gpu::cuda_compute* backend;
  operator cudaStream_t() const { return backend->stream(); }
};

/// Median milliseconds of `reps` runs of `body`, each between two events on `stream`, after
/// `before` (not timed) and a synchronize. `Stream`: a main_stream (looked up at every use) or
/// a cudaStream_t.
template <class Stream>
double median_ms(const Stream& stream, int reps, const std::function<void()>& before,
                 const std::function<void()>& body) {
  cuda_event start;
  cuda_event stop;
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    before();
    ZMUON_CUDA_CHECK(cudaStreamSynchronize(stream));
    start.record(stream);
    body();
    stop.record(stream);
    ZMUON_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    ZMUON_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

/// Same-shape groups run one newton_schulz call each, as an owner runs a chunk.
struct table {
  std::string label;
  std::vector<shape> groups;
};

/// A table's groups on the device: random inputs kept pristine, and the buffers NS runs on, in
/// fp32 and (the same values rounded) in bf16, as the step's bf16 transport hands them over.
struct table_buffers {
  table_buffers(const table& t, uint64_t seed) : groups(t.groups) {
    for (const shape& g : groups) {
      const int64_t numel = g.batch * g.rows * g.cols;
      const std::vector<float> input = random_floats(static_cast<size_t>(numel), seed);
      std::vector<uint16_t> halves(input.size());
      std::transform(input.begin(), input.end(), halves.begin(),
                     [](float v) { return zmuon::to_bf16(v); });
      pristine.emplace_back(numel);
      x.emplace_back(numel);
      pristine16.emplace_back(numel);
      x16.emplace_back(numel);
      ZMUON_CUDA_CHECK(cudaMemcpy(pristine.back().data(), input.data(), pristine.back().bytes(),
                                  cudaMemcpyHostToDevice));
      ZMUON_CUDA_CHECK(cudaMemcpy(pristine16.back().data(), halves.data(),
                                  pristine16.back().bytes(), cudaMemcpyHostToDevice));
    }
  }
  void restore(cudaStream_t stream, bool bf16 = false) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (bf16)
        ZMUON_CUDA_CHECK(cudaMemcpyAsync(x16[i].data(), pristine16[i].data(), x16[i].bytes(),
                                         cudaMemcpyDeviceToDevice, stream));
      else
        ZMUON_CUDA_CHECK(cudaMemcpyAsync(x[i].data(), pristine[i].data(), x[i].bytes(),
                                         cudaMemcpyDeviceToDevice, stream));
    }
  }
  void run(zmuon::compute_backend& backend, const zmuon::ns_options& ns, bool bf16 = false) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (bf16)
        backend.newton_schulz_bf16(x16[i].data(), groups[i].batch, groups[i].rows, groups[i].cols,
                                   ns);
      else
        backend.newton_schulz(x[i].data(), groups[i].batch, groups[i].rows, groups[i].cols, ns);
    }
  }

  std::vector<shape> groups;
  std::vector<device_array<float>> pristine, x;
  std::vector<device_array<uint16_t>> pristine16, x16;
};

/// Whole parameter tables, one batched call per group of same-shape matrices (what the engine's
/// owner runs): GPT-2 124M (12 layers: q, k, v, o 768x768, fc 3072x768, proj 768x3072: 72
/// matrices) and a Llama-style 1B (16 layers, hidden 2048, 8 KV heads of 64: q, o 2048x2048,
/// k, v 512x2048, gate, up 8192x2048, down 2048x8192: 112 matrices).
inline std::vector<table> parameter_tables() {
  return {
      {"gpt2-124m", {{"", 48, 768, 768}, {"", 12, 3072, 768}, {"", 12, 768, 3072}}},
      {"llama-1b",
       {{"", 32, 2048, 2048}, {"", 32, 512, 2048}, {"", 32, 8192, 2048}, {"", 16, 2048, 8192}}},
  };
}

/// Two untimed runs first (algorithm timing, graph capture).
inline void warm_up(const std::function<void()>& restore, const std::function<void()>& run) {
  for (int i = 0; i < 2; ++i) {
    restore();
    run();
  }
}

/// --variant: each of the shapes with each variant asked for (bench_modes.cpp).
int run_variants(gpu::cuda_compute& backend, int reps, const ns_options& base,
                 const std::vector<ns_variant>& variants, const std::string& schedule,
                 std::vector<shape> shapes);
/// --tables: the parameter tables group by group, standard and Gram (bench_modes.cpp).
int run_tables(gpu::cuda_compute& backend, int reps, double gemm_tflops);
/// --split: sub-batches of one group, serial and on the lanes, against one call (bench_modes.cpp).
int run_split(gpu::cuda_compute& backend, int reps);

}  // namespace zmuon::bench
