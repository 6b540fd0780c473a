// What the host registers for each parameter: its name, logical shape, optimizer group and heads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zmuon {

/// Which optimizer a parameter uses. `automatic` applies the default rule: Muon when the logical
/// shape has ndim >= 2 and the name contains neither "embed" nor "lm_head".
enum class param_group : uint8_t { automatic, muon, adamw };

/// How Muon views a parameter's shape as matrices (param_spec::view).
enum class matrix_view : uint8_t {
  automatic,     // expert_stack for ndim 3, flatten otherwise
  expert_stack,  // [E, rows, prod(rest)]: E matrices, each its own NS, owner and scale
  flatten,       // [shape[0], prod(shape[1:])]: one matrix (conv weights)
};

/// A box of a parameter's matrix view [rows, cols]: rows [row0, row0 + rows) x columns
/// [col0, col0 + cols) (param_spec::boxes).
struct matrix_box {
  int64_t row0 = 0;
  int64_t rows = 0;
  int64_t col0 = 0;
  int64_t cols = 0;
  bool operator==(const matrix_box& o) const {
    return row0 == o.row0 && rows == o.rows && col0 == o.col0 && cols == o.cols;
  }
};

/// The most hyperparameter groups one engine takes (param_spec::hparam_group is below it).
inline constexpr int32_t kMaxHparamGroups = 4096;

/// What the host registers.
struct param_spec {
  std::string name;
  std::vector<int64_t> shape;
  param_group group = param_group::automatic;
  int64_t heads = 0;  // > 0: Muon per head, rows = heads * head_dim
  /// Whose hyperparameters the parameter steps with (engine::set_group_hparams); every rank and
  /// process registers the same value.
  int32_t hparam_group = 0;
  /// Row blocks of a fused matrix (e.g. QKV: {q, k, v}), each orthogonalized and scaled on its
  /// own; they sum to the rows of one matrix. Empty: one block.
  std::vector<int64_t> split_sizes = {};
  /// Heads inside each split block (same length as split_sizes; 0 or 1: the whole block).
  std::vector<int64_t> split_heads = {};
  /// How Muon views the tensor. automatic: ndim 3 is a stack of expert matrices [E, rows, cols],
  /// any other ndim >= 2 is [shape[0], prod(shape[1:])].
  matrix_view view = matrix_view::automatic;
  /// MuonClip (engine::add_qk_clip): on a query parameter, its key parameter's name and both
  /// head counts. Empty: not a query.
  std::string qk_clip_key = {};
  int64_t qk_clip_heads = 0;
  int64_t qk_clip_key_heads = 0;
  /// The order the host holds a Muon matrix's elements in (engine::set_box_order): these boxes
  /// of its matrix view [shape[0], prod(shape[1:])] back to back, each row-major, tiling it
  /// (tensor parallel's row-parallel weight under FSDP2: each process holds one box). The rank
  /// shards cut that order; Newton-Schulz runs on the natural matrix. Empty: row-major order.
  std::vector<matrix_box> boxes = {};
};

}  // namespace zmuon
