// What one rank does as an owner in each Muon chunk: which whole matrices it holds after the
// gather, where they sit in its buffer, and how they batch by shape for Newton-Schulz. A pure
// function of the plan and the rank.
#pragma once

#include <vector>

#include "plan/plan.hpp"

namespace zmuon {

struct owned_matrix {
  int param = 0;
  int64_t full_offset = 0;  // start of the whole matrix in the owner's chunk buffer
};

/// Same-shape blocks of one hyperparameter group back to back: one batched Newton-Schulz call
/// (each group may run its own NS options).
struct ns_group {
  int64_t offset = 0;
  int64_t batch = 0;  // blocks (a per-head parameter contributes `heads` blocks)
  int64_t rows = 0;   // of one block
  int64_t cols = 0;
  int hparam_group = 0;
  std::vector<int> params;
};

struct chunk_ownership {
  std::vector<owned_matrix> owned;  // in table order
  std::vector<ns_group> groups;
  int64_t full_size = 0;
};

/// Elements of parameter p's shard q that are real (the last shards carry padding).
inline int64_t valid_len(const param_layout& p, int q) {
  int64_t v = p.numel - static_cast<int64_t>(q) * p.shard_len;
  return v < 0 ? 0 : (v > p.shard_len ? p.shard_len : v);
}

std::vector<chunk_ownership> make_ownership(const plan& pl, int rank);

/// NorMuon's row moments live with each matrix's owner (the rank that holds the whole matrix
/// after the gather), one per row of the whole matrix, the owner's matrices in table order.
/// Per parameter: where its rows start in its owner's buffer (-1 for AdamW parameters).
std::vector<int64_t> row_moment_offsets(const plan& pl);
/// The row moments rank `rank` holds.
int64_t row_moment_total(const plan& pl, int rank);

}  // namespace zmuon
