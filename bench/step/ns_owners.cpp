#include "bench/step/ns_owners.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "actors/muon_coordinator.hpp"
#include "bench/step/step_tables.hpp"
#include "kernels/compute.hpp"
#include "plan/ownership.hpp"
#include "plan/plan.hpp"

namespace zmuon::bench {

namespace {

double imbalance(const std::vector<double>& v) {
  double sum = 0, most = 0;
  for (double x : v) {
    sum += x;
    most = std::max(most, x);
  }
  return sum > 0 ? most / (sum / static_cast<double>(v.size())) : 0.0;
}

}  // namespace

expected<owners_report> time_ns_owners(const std::vector<param_spec>& table,
                                       const engine_options& opts, int reps) {
  auto made = make_plan(table, opts.world, opts.reduce_bucket_size, opts.per_head_muon);
  if (!made)
    return made.err();
  const plan& pl = *made;
  auto backend = make_compute_backend(opts.compute);
  if (!backend)
    return backend.err();
  compute_backend& be = **backend;
  const bool bf16 = muon_wire_type(opts) == wire_type::bf16;
  const ns_options& ns = opts.muon.ns;

  owners_report out;
  std::vector<double> predicted, measured;
  for (int r = 0; r < pl.world; ++r) {
    const auto own = make_ownership(pl, r);
    owner_time t;
    t.rank = r;
    t.predicted = pl.owner_cost[static_cast<size_t>(r)];
    int64_t largest = 0;
    for (const auto& c : own) {
      largest = std::max(largest, c.full_size);
      t.matrices += static_cast<int>(c.owned.size());
      t.calls += static_cast<int>(c.groups.size());
    }
    // One chunk buffer, as the coordinator holds one per chunk in flight: its values only need
    // to be finite and of the scale NS normalizes anyway.
    device_buffer x = be.allocate_for_overwrite(largest);
    device_buffer wire = be.allocate_for_overwrite(bf16 ? (largest + 1) / 2 : 0);
    if (largest > 0) {
      std::vector<float> values = random_floats(largest, 17 + static_cast<uint64_t>(r), 1.0f);
      be.copy_from_host(x.data(), values.data(), largest);
      if (bf16)
        be.to_bf16(reinterpret_cast<uint16_t*>(wire.data()), x.data(), largest);
    }
    auto run_once = [&] {
      for (const auto& c : own)
        for (const auto& g : c.groups) {
          if (bf16)
            be.newton_schulz_bf16(reinterpret_cast<uint16_t*>(wire.data()) + g.offset, g.batch,
                                  g.rows, g.cols, ns);
          else
            be.newton_schulz(x.data() + g.offset, g.batch, g.rows, g.cols, ns);
        }
      be.synchronize();
    };
    run_once();  // warm-up: workspaces, autotuned GEMMs, graphs
    std::vector<double> times;
    for (int i = 0; i < reps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      run_once();
      times.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
    }
    std::sort(times.begin(), times.end());
    t.ms = times.empty() ? 0.0 : times[times.size() / 2];
    predicted.push_back(t.predicted);
    measured.push_back(t.ms);
    out.ranks.push_back(t);
  }
  out.predicted_imbalance = imbalance(predicted);
  out.measured_imbalance = imbalance(measured);

  double total = 0;
  for (double p : predicted)
    total += p;
  std::printf(
      "NS as each rank's owner work, one rank at a time on one %s backend (%s transport, "
      "median of %d)\n",
      opts.compute.c_str(), bf16 ? "bf16" : "fp32", reps);
  std::printf("  %-6s %9s %7s %16s %12s\n", "rank", "matrices", "calls", "predicted share",
              "NS ms");
  for (const auto& t : out.ranks)
    std::printf("  %-6d %9d %7d %15.1f%% %12.3f\n", t.rank, t.matrices, t.calls,
                total > 0 ? 100.0 * t.predicted / total : 0.0, t.ms);
  std::printf("  imbalance (max / mean): predicted %.3f, measured %.3f\n", out.predicted_imbalance,
              out.measured_imbalance);
  return out;
}

nlohmann::json to_json(const owners_report& r) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& t : r.ranks)
    ranks.push_back({{"rank", t.rank},
                     {"matrices", t.matrices},
                     {"calls", t.calls},
                     {"predicted_cost", t.predicted},
                     {"ns_ms", t.ms}});
  return {{"ranks", ranks},
          {"predicted_imbalance", r.predicted_imbalance},
          {"measured_imbalance", r.measured_imbalance}};
}

}  // namespace zmuon::bench
