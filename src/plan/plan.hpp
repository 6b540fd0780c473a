// The partition plan: a pure function of the parameter table, the world size and the bucket size.
// It places every parameter's shards in the ranks' flat buffers, groups parameters into reduce
// buckets and Muon chunks, and picks the owner rank of every Muon matrix. Every rank computes the
// same plan, so collectives are issued in the same order everywhere (docs/DESIGN.md §3).
#pragma once

#include <cstdint>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zmuon/options.hpp"
#include "zmuon/param.hpp"
#include "zmuon/status.hpp"

namespace zmuon {

/// The most elements one parameter may have (2^40: 4 TiB of fp32), so that element counts and
/// offsets stay far from int64_t's range.
inline constexpr int64_t kMaxParamElements = int64_t{1} << 40;

/// One Newton-Schulz block of a Muon parameter: rows [row0, row0 + rows) of its [rows, cols]
/// view, contiguous in the flat tensor, split into `heads` equal matrices. An expert stack
/// [E, r, c] has E blocks of r rows (times its split blocks); a plain matrix has one.
struct muon_block {
  int64_t row0 = 0;
  int64_t rows = 0;
  int64_t heads = 1;
  int owner = -1;  // rank that runs this block's Newton-Schulz
};

/// A MuonClip query/key pair (param_spec::qk_clip_key): head h of the query and head
/// h / (query_heads / key_heads) of the key (GQA).
struct qk_pair {
  int query = 0;  // indices into plan::params
  int key = 0;
  int64_t query_heads = 1;
  int64_t key_heads = 1;
  int64_t value_offset = 0;  // first of this pair's query_heads values in plan::qk_values
};

/// Where one parameter lives.
struct param_layout {
  std::string name;
  std::vector<int64_t> shape;
  bool muon = false;
  int64_t numel = 0;
  int64_t shard_len = 0;     // every rank holds this many (zero padded): shard_length()
  int64_t shard_offset = 0;  // offset of this parameter's shard in a rank's flat shard buffers
  int64_t state_offset = 0;  // offset in the rank's Muon-state or Adam-state flat buffer
  int bucket = 0;            // reduce bucket index
  int hparam_group = 0;      // param_spec::hparam_group
  // Muon only:
  int64_t rows = 0;  // matrix view [rows, cols]: shape[0] x prod(shape[1:])
  int64_t cols = 0;
  int64_t heads = 1;  // independent [rows/heads, cols] blocks
  int owner = -1;     // rank that runs this matrix's Newton-Schulz
  int chunk = -1;     // Muon chunk index
  // The NS blocks in row order, covering all rows; one block: heads and owner above are its.
  std::vector<muon_block> blocks;
  // The host's order of the elements (param_spec::boxes): the shards and the gather carry the
  // boxes back to back; the owner puts the matrix in row-major order for Newton-Schulz and back.
  // Empty: row-major. A boxed parameter is one NS block.
  std::vector<matrix_box> boxes;
};

/// The key an owner lays its NS blocks out by (plan/ownership.hpp): one block's matrix shape and
/// hyperparameter group; blocks with equal keys are batched into one Newton-Schulz call.
inline std::tuple<int64_t, int64_t, int> ns_order(const param_layout& p, const muon_block& b) {
  return {b.rows / b.heads, p.cols, p.hparam_group};
}

/// Consecutive parameters reduced together: their shards are contiguous in every rank's buffer.
struct bucket_layout {
  int first_param = 0;
  int end_param = 0;         // one past the last
  int64_t shard_offset = 0;  // start in the rank's flat shard buffers
  int64_t shard_len = 0;     // elements of this bucket per rank
};

/// Consecutive Muon parameters whose gather-NS-scatter runs together.
struct chunk_layout {
  std::vector<int> params;    // indices into plan::params, in table order
  int64_t state_offset = 0;   // start in the rank's Muon-state buffer (its parameters' states
                              // in ns_order of their first blocks, table order among equals)
  int64_t shard_len = 0;      // Muon-state elements of this chunk per rank
  int64_t full_elements = 0;  // sum of numel over the chunk's matrices
};

struct plan {
  int world = 1;
  shard_layout layout = shard_layout::flat;
  std::vector<param_layout> params;
  std::vector<bucket_layout> buckets;
  std::vector<chunk_layout> chunks;
  int64_t shard_total = 0;                     // per-rank elements of params / grads
  int64_t muon_state_total = 0;                // per-rank elements of Muon momentum
  int64_t adam_state_total = 0;                // per-rank elements of each Adam moment
  std::vector<double> owner_cost;              // NS cost assigned to each rank
  std::unordered_map<std::string, int> index;  // name -> position in params
  std::vector<qk_pair> qk_pairs;               // MuonClip pairs in table order of the query
  int64_t qk_values = 0;                       // sum of the pairs' query_heads

  int find(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? -1 : it->second;
  }
  int muon_count() const;
  /// The pair whose query is parameter `query` (-1: none).
  int find_qk_pair(int query) const;
};

/// NS cost of one [rows, cols] matrix: max(m,n) * min(m,n)^2.
double ns_cost(int64_t rows, int64_t cols);

/// The owner rank of each NS block of each Muon parameter of `pl`'s table at world size
/// `world`, its shards cut by `layout` (per parameter, per param_layout::blocks entry; empty
/// for AdamW ones), as the plan assigns them: a block that lies whole in one rank's shard is
/// that rank's (no gather) while the rank's NS cost stays within max(total / world, the largest
/// block's), the others go longest-processing-time first; each rank's NS cost to
/// `cost_of_rank` when given. A checkpoint's reader finds the saving owners with it; `keep_held`
/// false gives the owners of earlier versions, which assigned every block longest-processing-time
/// first (a checkpoint they saved keeps its row moments there).
std::vector<std::vector<int>> owners_at_world(const plan& pl, int world, shard_layout layout,
                                              std::vector<double>* cost_of_rank = nullptr,
                                              bool keep_held = true);

/// The rank whose shard (`shard_len` elements each) holds all of elements [begin, end), or -1.
int holder_of(int64_t begin, int64_t end, int64_t shard_len);

/// Elements of every rank's shard of a parameter of `numel` elements whose dim 0 is `dim0`:
/// ceil(numel / world) (flat), or ceil(dim0 / world) whole dim-0 slices (rows: FSDP2's Shard(0)).
int64_t shard_length(int64_t numel, int64_t dim0, int world, shard_layout layout);

/// Elements [begin, end) of a flattened parameter of `numel` elements that rank `rank` holds,
/// each rank holding `shard_len` of them (the last ranks fewer, or none).
std::pair<int64_t, int64_t> rank_slice(int64_t numel, int64_t shard_len, int rank);

/// Validates the table (names unique and non-empty, no zero-size shapes, heads dividing rows,
/// split sizes summing to the rows, MuonClip pairs naming registered parameters)
/// and builds the plan. `per_head` false ignores the registered heads.
expected<plan> make_plan(const std::vector<param_spec>& table, int world, int64_t bucket_elements,
                         bool per_head = true, shard_layout layout = shard_layout::flat);

}  // namespace zmuon
