#include "plan/ownership.hpp"

#include <algorithm>
#include <tuple>

namespace zmuon {

std::vector<chunk_ownership> make_ownership(const plan& pl, int rank) {
  std::vector<chunk_ownership> out(pl.chunks.size());
  for (size_t c = 0; c < pl.chunks.size(); ++c) {
    auto& own = out[c];
    std::vector<int> mine;
    for (int i : pl.chunks[c].params)
      if (pl.params[i].owner == rank)
        mine.push_back(i);
    // Lay out by block shape and hyperparameter group so that the blocks of one NS call are
    // contiguous; ties keep table order.
    auto block = [&](int i) {
      auto& p = pl.params[i];
      return std::make_tuple(p.rows / p.heads, p.cols, p.hparam_group);
    };
    std::vector<int> by_shape = mine;
    std::stable_sort(by_shape.begin(), by_shape.end(),
                     [&](int a, int b) { return block(a) < block(b); });
    std::vector<int64_t> offset_of(pl.params.size(), -1);
    for (int i : by_shape) {
      auto& p = pl.params[i];
      auto [rows, cols, hparams] = block(i);
      if (own.groups.empty() || own.groups.back().rows != rows || own.groups.back().cols != cols
          || own.groups.back().hparam_group != hparams)
        own.groups.push_back(ns_group{own.full_size, 0, rows, cols, hparams, {}});
      own.groups.back().batch += p.heads;
      own.groups.back().params.push_back(i);
      offset_of[i] = own.full_size;
      own.full_size += p.numel;
    }
    for (int i : mine)
      own.owned.push_back(owned_matrix{i, offset_of[i]});
  }
  return out;
}

std::vector<int64_t> row_moment_offsets(const plan& pl) {
  std::vector<int64_t> out(pl.params.size(), -1);
  std::vector<int64_t> next(static_cast<size_t>(std::max(pl.world, 1)), 0);
  for (size_t i = 0; i < pl.params.size(); ++i) {
    const auto& p = pl.params[i];
    if (!p.muon || p.owner < 0 || p.owner >= pl.world)
      continue;
    out[i] = next[p.owner];
    next[p.owner] += p.rows;
  }
  return out;
}

int64_t row_moment_total(const plan& pl, int rank) {
  int64_t total = 0;
  for (const auto& p : pl.params)
    if (p.muon && p.owner == rank)
      total += p.rows;
  return total;
}

}  // namespace zmuon
