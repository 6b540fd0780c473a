// What one rank does as an owner in each Muon chunk: which whole matrices it holds after the
// gather, where they sit in its buffer, and how they batch by shape for Newton-Schulz. A pure
// function of the plan and the rank.
#pragma once

#include <utility>
#include <vector>

#include "plan/plan.hpp"

namespace zmuon {

/// One NS block this rank owns (a whole matrix when the parameter has one block).
struct owned_matrix {
  int param = 0;
  int64_t full_offset = 0;  // start of the block in the owner's chunk buffer
  int block = 0;            // index into param_layout::blocks
};

/// A block's elements [begin, end) in its parameter's flat tensor.
inline std::pair<int64_t, int64_t> block_elements(const param_layout& p, const muon_block& b) {
  return {b.row0 * p.cols, (b.row0 + b.rows) * p.cols};
}

/// The part of rank q's shard of p inside [begin, end): flat elements [first, second).
inline std::pair<int64_t, int64_t> shard_part(const param_layout& p, int q, int64_t begin,
                                              int64_t end);

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
  std::vector<owned_matrix> owned;  // in table order, each parameter's blocks in row order
  std::vector<ns_group> groups;
  int64_t full_size = 0;
  std::vector<int> ns_params;  // parameters whose first block this rank owns (named once)
};

/// Elements of parameter p's shard q that are real (the last shards carry padding).
inline int64_t valid_len(const param_layout& p, int q) {
  int64_t v = p.numel - static_cast<int64_t>(q) * p.shard_len;
  return v < 0 ? 0 : (v > p.shard_len ? p.shard_len : v);
}

inline std::pair<int64_t, int64_t> shard_part(const param_layout& p, int q, int64_t begin,
                                              int64_t end) {
  const int64_t lo = static_cast<int64_t>(q) * p.shard_len;
  const int64_t first = begin > lo ? begin : lo;
  const int64_t last = end < lo + valid_len(p, q) ? end : lo + valid_len(p, q);
  return {first, last > first ? last : first};
}

std::vector<chunk_ownership> make_ownership(const plan& pl, int rank);

/// NorMuon's row moments live with each NS block's owner (the rank that holds the whole block
/// after the gather), one per row of the block, the owner's blocks in table and row order.
/// Per parameter and block (param_layout::blocks): where the block's rows start in its owner's
/// buffer (empty for AdamW parameters). A parameter's row-moment vector is its matrix view's
/// rows (p.rows), block b's at [b.row0, b.row0 + b.rows).
std::vector<std::vector<int64_t>> row_moment_offsets(const plan& pl);
/// The row moments rank `rank` holds.
int64_t row_moment_total(const plan& pl, int rank);

}  // namespace zmuon
