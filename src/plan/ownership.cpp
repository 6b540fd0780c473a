#include "plan/ownership.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace zmuon {

std::vector<chunk_ownership> make_ownership(const plan& pl, int rank) {
  std::vector<chunk_ownership> out(pl.chunks.size());
  for (size_t c = 0; c < pl.chunks.size(); ++c) {
    auto& own = out[c];
    std::vector<std::pair<int, int>> mine;  // (parameter, block) in table and row order
    for (int i : pl.chunks[c].params) {
      const auto& blocks = pl.params[i].blocks;
      for (int b = 0; b < static_cast<int>(blocks.size()); ++b)
        if (blocks[b].owner == rank)
          mine.emplace_back(i, b);
      if (blocks.front().owner == rank)
        own.ns_params.push_back(i);
    }
    // Lay out by matrix shape and hyperparameter group so that the matrices of one NS call are
    // contiguous; ties keep table and row order.
    auto shape = [&](const std::pair<int, int>& ib) {
      auto& p = pl.params[ib.first];
      return ns_order(p, p.blocks[ib.second]);
    };
    std::vector<std::pair<int, int>> by_shape = mine;
    std::stable_sort(by_shape.begin(), by_shape.end(),
                     [&](const auto& a, const auto& b) { return shape(a) < shape(b); });
    std::map<std::pair<int, int>, int64_t> offset_of;
    for (const auto& ib : by_shape) {
      auto& p = pl.params[ib.first];
      auto& b = p.blocks[ib.second];
      auto [rows, cols, hparams] = shape(ib);
      if (own.groups.empty() || own.groups.back().rows != rows || own.groups.back().cols != cols
          || own.groups.back().hparam_group != hparams)
        own.groups.push_back(ns_group{own.full_size, 0, rows, cols, hparams, {}});
      auto& g = own.groups.back();
      g.batch += b.heads;
      if (g.params.empty() || g.params.back() != ib.first)
        g.params.push_back(ib.first);
      offset_of[ib] = own.full_size;
      own.full_size += b.rows * p.cols;
    }
    for (const auto& ib : mine)
      own.owned.push_back(owned_matrix{ib.first, offset_of[ib], ib.second});
  }
  return out;
}

std::vector<std::vector<int64_t>> row_moment_offsets(const plan& pl) {
  std::vector<std::vector<int64_t>> out(pl.params.size());
  std::vector<int64_t> next(static_cast<size_t>(std::max(pl.world, 1)), 0);
  for (size_t i = 0; i < pl.params.size(); ++i) {
    const auto& p = pl.params[i];
    if (!p.muon)
      continue;
    for (const auto& b : p.blocks) {
      const bool placed = b.owner >= 0 && b.owner < pl.world;
      out[i].push_back(placed ? next[b.owner] : -1);
      if (placed)
        next[b.owner] += b.rows;
    }
  }
  return out;
}

int64_t row_moment_total(const plan& pl, int rank) {
  int64_t total = 0;
  for (const auto& p : pl.params)
    if (p.muon)
      for (const auto& b : p.blocks)
        total += b.owner == rank ? b.rows : 0;
  return total;
}

}  // namespace zmuon
