// The map between full tensors and the ranks' shards (shards.hpp).
#include "checkpoint/shards.hpp"

#include <algorithm>

namespace zmuon {

const state_kind state_kinds[4] = {
    {"param", "param/", &rank_state::params, false, true},
    {"momentum", "momentum/", &rank_state::momentum, true, false},
    {"exp_avg", "exp_avg/", &rank_state::exp_avg, false, false},
    {"exp_avg_sq", "exp_avg_sq/", &rank_state::exp_avg_sq, false, false},
};

bool has_kind(const state_kind& k, bool muon) {
  return k.always || k.for_muon == muon;
}

int64_t offset_in(const state_kind& k, const param_layout& p) {
  return k.always ? p.shard_offset : p.state_offset;
}

void shard_to_full(const plan& pl, int rank, const rank_state& st, const state_kind& k,
                   const param_layout& p, float* full) {
  auto [begin, end] = rank_slice(p.numel, p.shard_len, rank);
  const float* shard = (st.*k.buffer).data() + offset_in(k, p);
  std::copy(shard, shard + (end - begin), full + begin);
}

}  // namespace zmuon
