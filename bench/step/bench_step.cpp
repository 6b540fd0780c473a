// zmuon-bench-step: the whole optimizer step through the engine for a model's parameter table
// (shapes only, random gradients), and the bytes each rank moves per step beside what
// DeepSpeed's ZeRO-3 Muon scheme moves for the same table.
//
//   zmuon-bench-step [--table gpt2-124m|llama-1b|tiny] [--world N] [--compute host|cuda]
//                    [--comm caf|nccl] [--steps N] [--gas N] [--bucket-size N]
//
// Times, per step: reduce() of every micro-batch on every rank (host packing and hand-over, the
// reduce-scatters run behind it) and step() (waits for the reduce-scatters, then the vote, the
// norm, the Muon pipeline and AdamW; answered when the GPU work has finished). Prints the
// median over the steps after the first (warm-up).
//
// Bytes per rank per step are counted from the partition plan (fp32 payloads):
//   zmuon: reduce-scatter of each micro-batch's gradient ((W-1)/W of every parameter),
//          gather of u shards to each Muon matrix's owner and scatter of the result shards.
//   DeepSpeed ZeRO-3 (the seed PR's scheme): the same reduce-scatter, then per step all-gathers
//          of each Muon matrix's gradient and momentum, and of the updates and momenta after
//          the round-robin NS: 4 all-gathers of (W-1)/W of every Muon matrix per rank.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "plan/ownership.hpp"
#include "zmuon/engine.hpp"

namespace {

using zmuon::param_group;
using zmuon::param_spec;

std::vector<param_spec> make_table(const std::string& name) {
  std::vector<param_spec> t;
  auto add = [&](std::string n, std::vector<int64_t> shape, param_group g) {
    t.push_back(param_spec{std::move(n), std::move(shape), g, 0});
  };
  if (name == "gpt2-124m") {  // q, k, v, o, fc, proj per layer: 72 Muon matrices
    add("wte", {50257, 768}, param_group::adamw);
    add("wpe", {1024, 768}, param_group::adamw);
    for (int l = 0; l < 12; ++l) {
      const std::string p = "h" + std::to_string(l) + ".";
      for (const char* m : {"q", "k", "v", "o"})
        add(p + m, {768, 768}, param_group::muon);
      add(p + "fc", {3072, 768}, param_group::muon);
      add(p + "proj", {768, 3072}, param_group::muon);
      add(p + "ln1", {768}, param_group::adamw);
      add(p + "ln2", {768}, param_group::adamw);
      add(p + "fc.bias", {3072}, param_group::adamw);
    }
    add("ln_f", {768}, param_group::adamw);
  } else if (name == "llama-1b") {  // q, k, v, o, gate, up, down per layer: 112 Muon matrices
    add("embed", {128256, 2048}, param_group::adamw);
    for (int l = 0; l < 16; ++l) {
      const std::string p = "l" + std::to_string(l) + ".";
      add(p + "q", {2048, 2048}, param_group::muon);
      add(p + "k", {512, 2048}, param_group::muon);
      add(p + "v", {512, 2048}, param_group::muon);
      add(p + "o", {2048, 2048}, param_group::muon);
      add(p + "gate", {8192, 2048}, param_group::muon);
      add(p + "up", {8192, 2048}, param_group::muon);
      add(p + "down", {2048, 8192}, param_group::muon);
      add(p + "norm1", {2048}, param_group::adamw);
      add(p + "norm2", {2048}, param_group::adamw);
    }
    add("norm", {2048}, param_group::adamw);
  } else if (name == "tiny") {
    add("embed", {1000, 64}, param_group::adamw);
    for (int l = 0; l < 2; ++l) {
      add("w" + std::to_string(l), {64, 256}, param_group::muon);
      add("u" + std::to_string(l), {256, 64}, param_group::muon);
    }
  }
  return t;
}

std::vector<float> random_floats(int64_t n, uint64_t seed, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = scale * (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) - 0.5f);
  }
  return v;
}

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct traffic {
  double reduce_mb = 0;      // reduce-scatters of the step's micro-batches (the same in both)
  double zmuon_muon_mb = 0;  // gather + scatter
  double deepspeed_muon_mb = 0;
};

// Bytes rank `rank` sends per step (fp32), from the plan.
traffic bytes_per_step(const zmuon::plan& pl, int rank, int gas) {
  const int w = pl.world;
  double reduce = 0, muon = 0, muon_numel = 0;
  for (const auto& p : pl.params) {
    reduce += static_cast<double>(p.numel) * (w - 1) / w;
    if (!p.muon)
      continue;
    muon_numel += static_cast<double>(p.numel);
    if (p.owner != rank) {
      muon += 2.0 * static_cast<double>(zmuon::valid_len(p, rank));  // gather + scatter
    } else {
      for (int q = 0; q < w; ++q)
        if (q != rank)
          muon += static_cast<double>(zmuon::valid_len(p, q));  // scatter to q
    }
  }
  traffic t;
  t.reduce_mb = gas * reduce * 4 / 1e6;
  t.zmuon_muon_mb = muon * 4 / 1e6;
  t.deepspeed_muon_mb = 4.0 * muon_numel * (w - 1) / w * 4 / 1e6;
  return t;
}

}  // namespace

int main(int argc, char* argv[]) {
  std::string table_name = "gpt2-124m";
  zmuon::engine_options opts;
  opts.world = 1;
  opts.compute = "cuda";
  opts.comm = "nccl";
  opts.reduce_bucket_size = 50'000'000;
  opts.timeout_ms = 600'000;
  int steps = 5;
  int gas = 1;
  CLI::App app{"zmuon-bench-step: the optimizer step for a model's parameter table"};
  app.add_option("--table", table_name)->check(CLI::IsMember({"gpt2-124m", "llama-1b", "tiny"}));
  app.add_option("--world", opts.world)->check(CLI::Range(1, 64));
  app.add_option("--compute", opts.compute)->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--comm", opts.comm)->check(CLI::IsMember({"caf", "nccl"}));
  app.add_option("--steps", steps)->check(CLI::Range(2, 1000));
  app.add_option("--gas", gas)->check(CLI::Range(1, 64));
  app.add_option("--bucket-size", opts.reduce_bucket_size)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const auto table = make_table(table_name);
  auto made = zmuon::engine::create(opts);
  if (!made) {
    std::fprintf(stderr, "zmuon-bench-step: %s\n", made.err().to_string().c_str());
    return 2;
  }
  auto& eng = **made;
  zmuon::tensor_map grads;
  int64_t total = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    int64_t n = 1;
    for (auto d : table[i].shape)
      n *= d;
    total += n;
    if (auto err = eng.add_parameter(table[i], random_floats(n, 100 + i, 0.04f))) {
      std::fprintf(stderr, "zmuon-bench-step: %s\n", err.to_string().c_str());
      return 2;
    }
    grads[table[i].name] = random_floats(n, 900 + i, 2e-3f);
  }

  std::vector<double> reduce_ms, step_ms;
  int64_t ns_matrices = 0;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < gas; ++k)
      for (int r = 0; r < opts.world; ++r)
        if (auto err = eng.reduce(r, grads)) {
          std::fprintf(stderr, "zmuon-bench-step: %s\n", err.to_string().c_str());
          return 1;
        }
    const auto t1 = std::chrono::steady_clock::now();
    auto info = eng.step();
    const auto t2 = std::chrono::steady_clock::now();
    if (!info) {
      std::fprintf(stderr, "zmuon-bench-step: %s\n", info.err().to_string().c_str());
      return 1;
    }
    ns_matrices = info->ns_matrices;
    if (s > 0) {
      reduce_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      step_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
  }
  const zmuon::plan& pl = *eng.layout();
  std::printf(
      "table %s: %zu parameters, %.1f M elements, %d Muon matrices; world %d, compute "
      "%s, comm %s, gas %d, bucket %lld\n",
      table_name.c_str(), table.size(), static_cast<double>(total) / 1e6, pl.muon_count(),
      opts.world, opts.compute.c_str(), opts.comm.c_str(), gas,
      static_cast<long long>(opts.reduce_bucket_size));
  std::printf(
      "median of %d steps after a warm-up step: reduce() hand-over %.2f ms, step() %.2f "
      "ms; NS matrices per step %lld\n",
      steps - 1, median(reduce_ms), median(step_ms), static_cast<long long>(ns_matrices));
  for (int r = 0; r < opts.world; ++r) {
    const traffic t = bytes_per_step(pl, r, gas);
    std::printf(
        "rank %d sends per step: reduce-scatters %.1f MB; Muon phase: zmuon %.1f MB, "
        "DeepSpeed ZeRO-3 scheme %.1f MB (%.2fx zmuon's)\n",
        r, t.reduce_mb, t.zmuon_muon_mb, t.deepspeed_muon_mb,
        t.zmuon_muon_mb > 0 ? t.deepspeed_muon_mb / t.zmuon_muon_mb : 0.0);
  }
  return 0;
}
