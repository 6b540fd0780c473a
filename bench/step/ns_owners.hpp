// zmuon-bench-step --ns-owners: each rank's Newton-Schulz as the plan makes it an owner
// (plan/ownership.hpp: per Muon chunk, one batched call per shape group, on the transport's
// element type as the coordinator runs it), timed one rank at a time on this process's backend:
// what each rank's NS takes on a device of its own, and their balance (max / mean) beside the
// plan's predicted one (ns_cost). The target is an NS load imbalance of at most 1.15 at world 8;
// this measures it on one GPU.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zmuon/options.hpp"
#include "zmuon/param.hpp"
#include "zmuon/status.hpp"

namespace zmuon::bench {

struct owner_time {
  int rank = 0;
  int matrices = 0;      // blocks counted once per parameter
  int calls = 0;         // batched NS calls (shape groups over the chunks)
  double predicted = 0;  // the plan's NS cost of its matrices
  double ms = 0;         // median over the repetitions
};

struct owners_report {
  std::vector<owner_time> ranks;
  double predicted_imbalance = 0;  // max / mean of `predicted`
  double measured_imbalance = 0;   // max / mean of `ms`
};

/// Times every rank's owner work of `table` at `opts.world` (its compute backend, bucket size,
/// NS options and transport), `reps` times each after one warm-up; prints the table and returns
/// the figures, or an error naming what could not be made.
expected<owners_report> time_ns_owners(const std::vector<param_spec>& table,
                                       const engine_options& opts, int reps);

nlohmann::json to_json(const owners_report& r);

}  // namespace zmuon::bench
