// zmuon-bench-step's parameter tables and the bytes the plan says each rank sends per step
// (shared with tests/engine/test_bench_step.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "zmuon/engine.hpp"
#include "zmuon/param.hpp"

namespace zmuon::bench {

/// gpt2-124m, llama-1b, moe (8 experts a layer as 3-D expert stacks), moe-unstacked (the same
/// matrices one by one) or tiny (shapes only); empty for another name.
std::vector<param_spec> make_table(const std::string& name);

/// Deterministic values in [-scale/2, scale/2).
std::vector<float> random_floats(int64_t n, uint64_t seed, float scale);

/// Registers `table` with `eng`, each parameter at deterministic random values, and fills
/// `grads` with a deterministic random gradient for each. Returns the table's elements.
expected<int64_t> add_table(engine& eng, const std::vector<param_spec>& table, tensor_map& grads);

/// Bytes rank `rank` sends to its peers per step with the caf comm, by collective kind, counted
/// from the plan: reduce_scatter (every bucket's padded fp32 shard to each other rank, per
/// micro-batch), vote and norm (one double to each other rank), gather (my valid shard of each
/// matrix another rank owns) and scatter (the owner's valid shards of its matrices to each other
/// rank), those two at `muon_elem` bytes per element (4: fp32 transport, 2: bf16). Kinds with no
/// bytes are left out.
std::map<std::string, int64_t> plan_bytes(const plan& pl, int rank, int gas, int muon_elem = 4);

/// What DeepSpeed's ZeRO-3 Muon scheme (the seed PR's) sends per rank per step in its Muon phase:
/// all-gathers of each Muon matrix's gradient and momentum before the round-robin NS and of the
/// updates and momenta after it: 4 ring all-gathers, each sending (W-1)/W of every Muon matrix.
/// Its reduce-scatter of the gradients is the same as zmuon's.
double deepspeed_muon_bytes(const plan& pl, int elem = 4);

}  // namespace zmuon::bench
