// Which tiles of D each block of sm90_gemm computes, in plain C++ (host and device), so that
// tests without a GPU can check that the blocks cover the product's tiles once each.
//
// Tiles are 128 x 128; a block has one consumer (one tile) or two (two tiles sharing one operand's
// slices). Unsymmetric: a row's neighbouring tiles, row-major, the row's last block alone when
// the row has an odd count. Symmetric (only tiles from the diagonal on, T per side): row r's
// T - r tiles in neighbouring pairs (sharing P's rows), then the odd rows' last tiles (r, T-1),
// paired down the last column (sharing Q's rows), so that at most the very last block computes
// one tile alone. For 4096^2 that is 264 blocks, two waves of 132, where pairs within rows alone
// left 16 halves (272 blocks, three waves).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ZMUON_SM90_HD __host__ __device__
#else
#define ZMUON_SM90_HD
#endif

namespace zmuon::gpu::sm90 {

/// Consumer g of a block computes D's tile (m[g], n[g]); `active` consumers work (1 or 2). With
/// two, they share P's rows (m[0] == m[1]) or, with `share_q`, Q's rows (n[0] == n[1]).
struct block_work {
  int m[2] = {0, 0};
  int n[2] = {0, 0};
  int active = 1;
  bool share_q = false;

  /// Consumer g's tile row and column (g a runtime value: no indexing, so `m` and `n` stay in
  /// registers on the device).
  ZMUON_SM90_HD int row(int g) const { return g == 0 ? m[0] : m[1]; }
  ZMUON_SM90_HD int col(int g) const { return g == 0 ? n[0] : n[1]; }
};

ZMUON_SM90_HD constexpr int row_pairs(int tiles, int row) {
  return (tiles - row) / 2;
}
/// The first symmetric row with an odd count of tiles, and how many such rows there are.
ZMUON_SM90_HD constexpr int first_odd_row(int tiles) {
  return tiles % 2 == 0 ? 1 : 0;
}
ZMUON_SM90_HD constexpr int odd_rows(int tiles) {
  return tiles > first_odd_row(tiles) ? (tiles - first_odd_row(tiles) + 1) / 2 : 0;
}

/// Blocks per matrix of `tiles_m` x `tiles_n` tiles (`symmetric`: square, upper tiles only).
ZMUON_SM90_HD constexpr int64_t blocks_per_matrix(int consumers, bool symmetric, int tiles_m,
                                                  int tiles_n) {
  if (!symmetric)
    return int64_t{tiles_m} * ((tiles_n + consumers - 1) / consumers);
  if (consumers == 1)
    return int64_t{tiles_n} * (tiles_n + 1) / 2;
  int64_t blocks = (odd_rows(tiles_n) + 1) / 2;
  for (int row = 0; row < tiles_n; ++row)
    blocks += row_pairs(tiles_n, row);
  return blocks;
}

/// The tiles of block `t` (0 <= t < blocks_per_matrix) of a matrix with `tiles_n` tiles a row.
ZMUON_SM90_HD inline block_work tiles_of_block(int consumers, bool symmetric, int tiles_n, int t) {
  block_work w;
  if (consumers == 1) {
    int row = 0;
    if (symmetric) {
      while (t >= tiles_n - row) {
        t -= tiles_n - row;
        ++row;
      }
      t += row;
    } else {
      row = t / tiles_n;
      t %= tiles_n;
    }
    w.m[0] = w.m[1] = row;
    w.n[0] = w.n[1] = t;
    return w;
  }
  if (!symmetric) {
    const int groups = (tiles_n + 1) / 2;
    w.m[0] = w.m[1] = t / groups;
    w.n[0] = t % groups * 2;
    w.n[1] = w.n[0] + 1;
    w.active = tiles_n - w.n[0] >= 2 ? 2 : 1;
    return w;
  }
  for (int row = 0; row < tiles_n; ++row) {
    if (t < row_pairs(tiles_n, row)) {
      w.m[0] = w.m[1] = row;
      w.n[0] = row + 2 * t;
      w.n[1] = w.n[0] + 1;
      w.active = 2;
      return w;
    }
    t -= row_pairs(tiles_n, row);
  }
  w.share_q = true;
  w.m[0] = first_odd_row(tiles_n) + 4 * t;
  w.m[1] = w.m[0] + 2;
  w.n[0] = w.n[1] = tiles_n - 1;
  w.active = w.m[1] < tiles_n ? 2 : 1;
  return w;
}

/// What slot `slot` (0 .. active) of a stage holds: P's rows (`p`) or Q's rows of tile row or
/// column `tile`. Slot 0: P's rows of tile 0; slot 1: Q's rows of tile 0; slot 2 (two tiles):
/// the rows of the operand the second tile does not share.
struct slot_rows {
  bool p = true;
  int tile = 0;
};
ZMUON_SM90_HD inline slot_rows slot_of(const block_work& w, int slot) {
  if (slot == 0)
    return {true, w.m[0]};
  if (slot == 1)
    return {false, w.n[0]};
  return w.share_q ? slot_rows{true, w.m[1]} : slot_rows{false, w.n[1]};
}

/// The slots consumer `group` multiplies: P's rows of its tile and Q's rows of its tile.
ZMUON_SM90_HD inline int p_slot(const block_work& w, int group) {
  return group == 1 && w.share_q ? 2 : 0;
}
ZMUON_SM90_HD inline int q_slot(const block_work& w, int group) {
  return group == 0 || w.share_q ? 1 : 2;
}

}  // namespace zmuon::gpu::sm90
