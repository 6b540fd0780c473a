// MuonClip's geometry (Kimi K2, arXiv:2507.20534): which rows of this rank's shard a step clips,
// and by what factor, from each query head's largest logit over all ranks and micro-batches. A
// pure function of the plan, the rank and the step's values: the coordinator sends its result to
// the store (qk_clip_scale), and every rank derives the same heads from the same maxima.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "messages/messages.hpp"
#include "plan/ownership.hpp"

namespace zmuon {

/// The factor of one head: when its largest logit S exceeds tau, its query and its key are each
/// scaled by sqrt(tau / S), so that their product's logits scale by tau / S (Algorithm 1). 1
/// otherwise.
inline float qk_factor(double tau, double max_logit) {
  return tau > 0 && max_logit > tau ? static_cast<float>(std::sqrt(tau / max_logit)) : 1.0f;
}

/// Rows [r0, r1) of parameter p scaled by `factor`: the part in `rank`'s shard, if any.
inline void add_clip_rows(const param_layout& p, int rank, int64_t r0, int64_t r1, float factor,
                          std::vector<clip_range>& out) {
  const int64_t row_len = p.numel / p.shape[0];
  auto [first, last] = shard_part(p, rank, r0 * row_len, r1 * row_len);
  if (last > first)
    out.push_back(clip_range{p.shard_offset + first - static_cast<int64_t>(rank) * p.shard_len,
                             last - first, factor});
}

/// The ranges of `rank`'s shard to clip, from the step's maxima (`max`, plan::qk_values of them)
/// and each pair's tau (`tau`, by plan::qk_pairs index); `any` is set when some head of some pair
/// is clipped (the same on every rank, whether or not its shard holds the rows).
inline std::vector<clip_range> qk_clip_ranges(const plan& pl, int rank,
                                              const std::vector<double>& tau,
                                              const std::vector<double>& max, bool& any) {
  std::vector<clip_range> out;
  for (size_t i = 0; i < pl.qk_pairs.size(); ++i) {
    const auto& pair = pl.qk_pairs[i];
    const auto& q = pl.params[pair.query];
    const auto& k = pl.params[pair.key];
    const int64_t group = pair.query_heads / pair.key_heads;  // query heads per key head (GQA)
    const int64_t dq = q.shape[0] / pair.query_heads;
    const int64_t dk = k.shape[0] / pair.key_heads;
    for (int64_t j = 0; j < pair.key_heads; ++j) {
      double group_max = -std::numeric_limits<double>::infinity();
      for (int64_t h = j * group; h < (j + 1) * group; ++h) {
        const double s = max[pair.value_offset + h];
        group_max = std::max(group_max, s);
        const float f = qk_factor(tau[i], s);
        if (f != 1.0f) {
          any = true;
          add_clip_rows(q, rank, h * dq, (h + 1) * dq, f, out);
        }
      }
      // A key head shared by a group of query heads takes the group's largest logit.
      const float f = qk_factor(tau[i], group_max);
      if (f != 1.0f)
        add_clip_rows(k, rank, j * dk, (j + 1) * dk, f, out);
    }
  }
  return out;
}

}  // namespace zmuon
