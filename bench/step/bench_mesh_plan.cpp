// zmuon-bench-mesh-plan: from the plan alone (no data, no device), what each rank does per step
// when FSDP2 shards a model over S processes and HSDP replicates that R times (world R x S):
// its Newton-Schulz work and the bytes it sends, for zmuon (python/zmuon/_mesh.py moves each
// process's pieces to the engine's rows and back; the engine gathers each NS block to one owner
// in the world and scatters the result) beside the all-gather scheme (every rank all-gathers
// every Muon matrix over its shard group and runs every NS itself), and beside the direct scheme
// (each NS block's owner receives only the pieces it lacks from their holders and sends the
// result to every holder, replicas included; AdamW where its elements are held). The gradients'
// own reduction (FSDP2's reduce-scatter, HSDP's all-reduce) is the same for all and left out.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/step/step_tables.hpp"
#include "plan/ownership.hpp"
#include "plan/plan.hpp"

namespace {

using zmuon::plan;

struct rank_figures {
  double ns_gflop = 0;
  double bytes = 0;
  double direct_bytes = 0;  // the direct scheme's, for the same owners
};

// [begin, end) of torch.chunk's piece i of n in `parts` (FSDP2's Shard(0), the engine's rows).
std::pair<int64_t, int64_t> chunk(int64_t n, int64_t parts, int64_t i) {
  const int64_t c = (n + parts - 1) / parts;
  return {std::min(n, i * c), std::min(n, (i + 1) * c)};
}

int64_t overlap(std::pair<int64_t, int64_t> a, std::pair<int64_t, int64_t> b) {
  return std::max<int64_t>(0, std::min(a.second, b.second) - std::max(a.first, b.first));
}

// Newton-Schulz FLOPs of one [m, n] matrix, `steps` iterations (A = XX^T, B = bA + cA^2, BX).
double ns_flops(int64_t rows, int64_t cols, int steps) {
  const double lo = static_cast<double>(std::min(rows, cols));
  const double hi = static_cast<double>(std::max(rows, cols));
  return steps * (4.0 * lo * lo * hi + 2.0 * lo * lo * lo);
}

// zmuon at world R x S: the process at mesh (i, j) is process i * S + j and holds FSDP2's shard
// j. R = 1: the engine's rows are FSDP2's shards, nothing moves. R > 1: the engine cuts each
// flattened parameter evenly over the world, and the process at (i, j) runs engine rank
// j * R + i (python/zmuon/_mesh.py's engine_of: its part then lies in its own shard where the
// world divides the rows); each engine rank's part comes from one holder of each shard it meets
// (its own process if that is one, else holder e % R) and goes back to all R holders. Bytes per
// process; NS work per engine rank (the same figures, relabelled).
std::vector<rank_figures> zmuon_figures(const plan& pl, int replicas, int shards, int steps) {
  const int world = pl.world;
  std::vector<rank_figures> out(static_cast<size_t>(world));
  auto process_of = [&](int e) {
    return replicas == 1 ? e : (e % replicas) * shards + e / replicas;
  };
  for (int r = 0; r < world; ++r) {
    const auto bytes = zmuon::bench::plan_bytes(pl, r, 1);
    for (const auto& [kind, b] : bytes)
      if (kind != "reduce_scatter")
        out[process_of(r)].bytes += static_cast<double>(b);
  }
  for (const auto& p : pl.params) {
    const int64_t cols = p.numel / p.shape[0];
    for (const auto& b : p.blocks)
      if (p.muon)
        out[b.owner].ns_gflop += b.heads * ns_flops(b.rows / b.heads, p.cols, steps) / 1e9;
    if (replicas == 1)
      continue;  // FSDP2 on every process: its shards are the engine's rows
    for (int e = 0; e < world; ++e) {
      const auto mine = chunk(p.numel, world, e);
      for (int j = 0; j < shards; ++j) {
        const auto rows = chunk(p.shape[0], shards, j);
        const int64_t n = overlap(mine, {rows.first * cols, rows.second * cols}) * 4;
        if (n == 0)
          continue;
        const bool holds = process_of(e) % shards == j;
        if (!holds)  // in: the gradient from one holder
          out[(e % replicas) * shards + j].bytes += static_cast<double>(n);
        out[process_of(e)].bytes +=  // out: to every holder
            static_cast<double>(n) * (replicas - (holds ? 1 : 0));
      }
    }
  }
  return out;
}

// The direct scheme, for the plan's owners: each block's owner receives each piece it lacks from
// the holder in its own replica group and sends the result to those holders; each piece then
// goes down a chain of its replicas (replica group g + 1 from g, and on: R - 1 sends of it).
// AdamW runs where its elements are held (replicas alike, no bytes). Plus the vote.
void add_direct_bytes(const plan& pl, int replicas, int shards, std::vector<rank_figures>& out) {
  for (int r = 0; r < pl.world; ++r) {
    const auto bytes = zmuon::bench::plan_bytes(pl, r, 1);
    auto vote = bytes.find("vote");
    out[r].direct_bytes += vote == bytes.end() ? 0.0 : static_cast<double>(vote->second);
  }
  for (const auto& p : pl.params) {
    if (!p.muon)
      continue;
    const int64_t cols = p.numel / p.shape[0];
    for (const auto& b : p.blocks) {
      const auto block = zmuon::block_elements(p, b);
      const int group = b.owner / shards;  // the owner's replica group and shard
      const int own = b.owner % shards;
      for (int j = 0; j < shards; ++j) {
        const auto rows = chunk(p.shape[0], shards, j);
        const double n =
            4.0 * static_cast<double>(overlap(block, {rows.first * cols, rows.second * cols}));
        if (j != own) {
          out[group * shards + j].direct_bytes += n;  // in: the piece it lacks
          out[b.owner].direct_bytes += n;             // out: to its holder in the group
        }
        for (int g = 0; g + 1 < replicas; ++g)  // down the chain of the piece's replicas
          out[((group + g) % replicas) * shards + j].direct_bytes += n;
      }
    }
  }
}

// The all-gather scheme: every Muon matrix all-gathered (ring) over each shard group, every NS
// on every rank.
rank_figures all_gather_figures(const plan& pl, int shards, int steps) {
  rank_figures f;
  for (const auto& p : pl.params) {
    if (!p.muon)
      continue;
    f.bytes += 4.0 * static_cast<double>(p.numel) * (shards - 1) / shards;
    for (const auto& b : p.blocks)
      f.ns_gflop += b.heads * ns_flops(b.rows / b.heads, p.cols, steps) / 1e9;
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "zmuon-bench-mesh-plan: NS work and bytes per rank under FSDP2 / HSDP, from the "
      "plan alone"};
  std::vector<std::string> tables{"llama-1b", "moe"};
  std::vector<std::string> meshes{"1x8", "8x8", "1x64", "64x8", "1x512"};
  int steps = 5;
  app.add_option("--tables", tables, "parameter tables (bench/step/step_tables.hpp)");
  app.add_option("--meshes", meshes, "R x S: R replicas of FSDP2 over S processes");
  app.add_option("--ns-steps", steps, "Newton-Schulz iterations");
  CLI11_PARSE(app, argc, argv);
  std::printf(
      "| table | mesh R x S | zmuon NS GFLOP/rank max | max/mean | zmuon MB/rank max | "
      "mean | direct MB/rank max | mean | all-gather NS GFLOP/rank | all-gather MB/rank |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& name : tables) {
    const auto table = zmuon::bench::make_table(name);
    if (table.empty()) {
      std::fprintf(stderr, "unknown table '%s'\n", name.c_str());
      return 2;
    }
    for (const auto& mesh : meshes) {
      const auto x = mesh.find('x');
      if (x == std::string::npos) {
        std::fprintf(stderr, "a mesh is RxS, got '%s'\n", mesh.c_str());
        return 2;
      }
      const int replicas = std::stoi(mesh.substr(0, x));
      const int shards = std::stoi(mesh.substr(x + 1));
      auto pl =
          zmuon::make_plan(table, replicas * shards, int64_t{1} << 40, true,
                           replicas == 1 ? zmuon::shard_layout::rows : zmuon::shard_layout::flat);
      if (!pl) {
        std::fprintf(stderr, "%s\n", pl.err().to_string().c_str());
        return 1;
      }
      auto ranks = zmuon_figures(*pl, replicas, shards, steps);
      add_direct_bytes(*pl, replicas, shards, ranks);
      auto max_of = [&](auto field) {
        double m = 0;
        for (const auto& r : ranks)
          m = std::max(m, r.*field);
        return m;
      };
      auto mean_of = [&](auto field) {
        double s = 0;
        for (const auto& r : ranks)
          s += r.*field;
        return s / static_cast<double>(ranks.size());
      };
      const auto gathered = all_gather_figures(*pl, shards, steps);
      std::printf("| %s | %d x %d | %.1f | %.3f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                  name.c_str(), replicas, shards, max_of(&rank_figures::ns_gflop),
                  max_of(&rank_figures::ns_gflop) / mean_of(&rank_figures::ns_gflop),
                  max_of(&rank_figures::bytes) / 1e6, mean_of(&rank_figures::bytes) / 1e6,
                  max_of(&rank_figures::direct_bytes) / 1e6,
                  mean_of(&rank_figures::direct_bytes) / 1e6, gathered.ns_gflop,
                  gathered.bytes / 1e6);
    }
  }
  return 0;
}
