// Where a parameter's elements lie in the ranks' shards: the map between full tensors and the
// ranks' flat state buffers. Checkpoint files and engine::read_state / write_state share it.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "plan/plan.hpp"
#include "zmuon/rank_state.hpp"

namespace zmuon {

/// One kind of per-parameter state in a rank's shards.
struct state_kind {
  const char* name;    // "param", "momentum", "exp_avg", "exp_avg_sq"
  const char* prefix;  // its tensors' prefix in a shard file: "param/"
  std::vector<float> rank_state::*buffer;
  bool for_muon;  // momentum for Muon parameters; Adam moments for the others
  bool always;    // params: every parameter
};

/// The prefix of NorMuon's row moments in a shard file: one tensor [rows] per NS block, in the
/// file of the rank that owned it (plan/ownership.hpp's row_moment_offsets): "<prefix><name>"
/// for a parameter of one block, "<prefix><name>@a:b" (rows [a, b) of its matrix view) else.
inline constexpr const char* kRowMomentsPrefix = "row_moments/";

/// param, momentum, exp_avg, exp_avg_sq.
extern const state_kind state_kinds[4];

/// Whether a Muon (or AdamW) parameter has state of kind `k`.
bool has_kind(const state_kind& k, bool muon);
/// Where parameter `p`'s shard starts in a rank's buffer of kind `k`.
int64_t offset_in(const state_kind& k, const param_layout& p);

/// Copies rank `rank`'s real elements of kind `k` of parameter `p` (a parameter of `pl`) from
/// its state into `full`, the whole tensor (numel elements), at their place.
void shard_to_full(const plan& pl, int rank, const rank_state& st, const state_kind& k,
                   const param_layout& p, float* full);

}  // namespace zmuon
