#include "plan/plan.hpp"

#include <algorithm>
#include <numeric>

namespace zmuon {

namespace {

bool default_is_muon(const param_spec& p) {
  return p.shape.size() >= 2 && p.name.find("embed") == std::string::npos
         && p.name.find("lm_head") == std::string::npos;
}

error validate(const param_spec& p, const std::unordered_map<std::string, int>& seen) {
  if (p.name.empty())
    return {errc::invalid_argument, "a parameter needs a non-empty name"};
  if (seen.count(p.name))
    return {errc::duplicate_parameter, "parameter '" + p.name + "' is registered twice"};
  if (p.shape.empty())
    return {errc::invalid_argument, "parameter '" + p.name + "' has an empty shape"};
  int64_t numel = 1;
  for (auto d : p.shape) {
    if (d <= 0)
      return {errc::invalid_argument, "parameter '" + p.name + "' has a dimension of size "
                                          + std::to_string(d) + " (zero-size parameter)"};
    if (d > kMaxParamElements / numel)  // also keeps the product from wrapping
      return {errc::invalid_argument, "parameter '" + p.name + "' has more than 2^40 elements "
                                          "(its dimensions multiply past 1099511627776)"};
    numel *= d;
  }
  if (p.heads < 0)
    return {errc::invalid_argument, "parameter '" + p.name + "': heads must be >= 0"};
  if (p.heads > 0) {
    if (p.shape.size() < 2)
      return {errc::invalid_argument,
              "parameter '" + p.name + "': heads need a matrix (ndim >= 2)"};
    if (p.shape[0] % p.heads != 0)
      return {errc::invalid_argument, "parameter '" + p.name + "': heads=" + std::to_string(p.heads)
                                          + " do not divide rows=" + std::to_string(p.shape[0])};
  }
  if (p.hparam_group < 0 || p.hparam_group >= kMaxHparamGroups)
    return {errc::invalid_argument, "parameter '" + p.name + "': hyperparameter group "
                                        + std::to_string(p.hparam_group) + " is outside [0, "
                                        + std::to_string(kMaxHparamGroups) + ")"};
  if (p.group == param_group::muon && p.shape.size() < 2)
    return {errc::invalid_argument,
            "parameter '" + p.name + "' is put in the Muon group but is not a matrix"};
  return {};
}

// A block whole in one rank's shard stays there while the rank's share allows; the rest
// longest-processing-time first: the heaviest NS block to the least-loaded rank, ties to the
// lower rank and, for equal cost, table and row order. Deterministic, so identical on every rank.
// The blocks of one parameter (experts, split blocks) may go to different ranks.
void assign_owners(plan& pl) {
  const std::vector<std::vector<int>> owners =
      owners_at_world(pl, pl.world, pl.layout, &pl.owner_cost);
  for (size_t i = 0; i < pl.params.size(); ++i) {
    auto& p = pl.params[i];
    for (size_t b = 0; b < owners[i].size(); ++b)
      p.blocks[b].owner = owners[i][b];
    if (p.muon)
      p.owner = p.blocks.front().owner;
  }
}

bool is_expert_stack(const param_spec& p) {
  return p.view == matrix_view::expert_stack
         || (p.view == matrix_view::automatic && p.shape.size() == 3);
}

error validate_blocks(const param_spec& p) {
  auto bad = [&](const std::string& what) {
    return error{errc::invalid_argument, "parameter '" + p.name + "': " + what};
  };
  if (p.view == matrix_view::expert_stack && p.shape.size() < 3)
    return bad("an expert stack needs ndim >= 3 ([experts, rows, cols]), got ndim "
               + std::to_string(p.shape.size()));
  if (p.split_sizes.empty()) {
    if (!p.split_heads.empty())
      return bad("split_heads given without split_sizes");
    if (p.heads > 0 && is_expert_stack(p) && p.shape[1] % p.heads != 0)
      return bad("heads=" + std::to_string(p.heads)
                 + " do not divide an expert's rows=" + std::to_string(p.shape[1]));
    return {};
  }
  if (p.shape.size() < 2)
    return bad("split_sizes need a matrix (ndim >= 2)");
  if (p.heads > 0)
    return bad("heads and split_sizes together: give the heads per block (split_heads)");
  if (!p.split_heads.empty() && p.split_heads.size() != p.split_sizes.size())
    return bad("split_heads has " + std::to_string(p.split_heads.size()) + " entries for "
               + std::to_string(p.split_sizes.size()) + " split_sizes");
  const int64_t rows = is_expert_stack(p) ? p.shape[1] : p.shape[0];
  int64_t sum = 0;
  for (size_t k = 0; k < p.split_sizes.size(); ++k) {
    const int64_t size = p.split_sizes[k];
    if (size <= 0 || size > rows)
      return bad("split size " + std::to_string(size) + " is outside [1, " + std::to_string(rows)
                 + "]");
    sum += size;
    const int64_t h = p.split_heads.empty() ? 0 : p.split_heads[k];
    if (h < 0 || (h > 0 && size % h != 0))
      return bad("split_heads[" + std::to_string(k) + "]=" + std::to_string(h)
                 + " do not divide the block's rows=" + std::to_string(size));
  }
  if (sum != rows)
    return bad("split_sizes sum to " + std::to_string(sum)
               + ", not the matrix's rows=" + std::to_string(rows));
  return {};
}

// The host's box order of a matrix (param_spec::boxes): inside its matrix view, tiling it, on a
// parameter that is one NS block (no expert stack, heads or split sizes).
error validate_boxes(const param_spec& p) {
  if (p.boxes.empty())
    return {};
  auto bad = [&](const std::string& what) {
    return error{errc::invalid_argument, "parameter '" + p.name + "': box order: " + what};
  };
  if (p.shape.size() < 2)
    return bad("boxes need a matrix (ndim >= 2)");
  if (is_expert_stack(p))
    return bad(
        "an expert stack's experts are its blocks: its boxes would cut them (use "
        "view flatten, or hold whole experts)");
  if (p.heads > 0 || !p.split_sizes.empty())
    return bad("a matrix of heads or split blocks is held in row order only");
  const int64_t rows = p.shape[0];
  const int64_t cols =
      std::accumulate(p.shape.begin() + 1, p.shape.end(), int64_t{1}, std::multiplies<>());
  int64_t area = 0;
  for (size_t k = 0; k < p.boxes.size(); ++k) {
    const matrix_box& b = p.boxes[k];
    if (b.rows < 1 || b.cols < 1 || b.row0 < 0 || b.col0 < 0 || b.row0 > rows - b.rows
        || b.col0 > cols - b.cols)
      return bad("box " + std::to_string(k) + " (rows " + std::to_string(b.row0) + " + "
                 + std::to_string(b.rows) + ", columns " + std::to_string(b.col0) + " + "
                 + std::to_string(b.cols) + ") is empty or outside the [" + std::to_string(rows)
                 + ", " + std::to_string(cols) + "] matrix");
    area += b.rows * b.cols;
    if (area > rows * cols)  // also keeps the sum from wrapping
      break;
  }
  if (area != rows * cols)
    return bad("the boxes cover " + std::to_string(area) + " elements of the ["
               + std::to_string(rows) + ", " + std::to_string(cols) + "] matrix's "
               + std::to_string(rows * cols));
  // Inside, and their areas sum to the matrix's: they tile it unless two overlap.
  std::vector<size_t> by_row(p.boxes.size());
  std::iota(by_row.begin(), by_row.end(), size_t{0});
  std::sort(by_row.begin(), by_row.end(),
            [&](size_t a, size_t b) { return p.boxes[a].row0 < p.boxes[b].row0; });
  for (size_t i = 0; i < by_row.size(); ++i) {
    const matrix_box& a = p.boxes[by_row[i]];
    for (size_t j = i + 1; j < by_row.size() && p.boxes[by_row[j]].row0 < a.row0 + a.rows; ++j) {
      const matrix_box& b = p.boxes[by_row[j]];
      if (b.col0 < a.col0 + a.cols && a.col0 < b.col0 + b.cols)
        return bad("boxes " + std::to_string(by_row[i]) + " and " + std::to_string(by_row[j])
                   + " overlap");
    }
  }
  return {};
}

// The NS blocks of Muon parameter p (its rows, cols and view already set).
void make_blocks(const param_spec& spec, param_layout& p, bool per_head) {
  const bool experts = is_expert_stack(spec);
  const int64_t count = experts ? spec.shape[0] : 1;
  const int64_t rows = p.rows / count;
  for (int64_t e = 0; e < count; ++e) {
    if (spec.split_sizes.empty()) {
      int64_t heads = per_head && spec.heads > 0 ? spec.heads : 1;
      p.blocks.push_back(muon_block{e * rows, rows, heads, -1});
      continue;
    }
    int64_t row0 = e * rows;
    for (size_t k = 0; k < spec.split_sizes.size(); ++k) {
      int64_t h = spec.split_heads.empty() ? 0 : spec.split_heads[k];
      p.blocks.push_back(muon_block{row0, spec.split_sizes[k], per_head && h > 0 ? h : 1, -1});
      row0 += spec.split_sizes[k];
    }
  }
  p.heads = 0;  // the matrices Newton-Schulz sees
  for (const auto& b : p.blocks)
    p.heads += b.heads;
}

// MuonClip pairs: after the whole table is in (a key may be registered after its query).
error make_qk_pairs(const std::vector<param_spec>& table, plan& pl) {
  for (int i = 0; i < static_cast<int>(table.size()); ++i) {
    const auto& q = table[i];
    if (q.qk_clip_key.empty())
      continue;
    auto bad = [&](const std::string& what) {
      return error{errc::invalid_argument, "MuonClip pair of query '" + q.name + "': " + what};
    };
    const int k = pl.find(q.qk_clip_key);
    if (k < 0)
      return error{errc::unknown_parameter, "MuonClip pair of query '" + q.name + "': key '"
                                                + q.qk_clip_key
                                                + "' is not a registered parameter"};
    if (k == i)
      return bad("the key is the query itself");
    const int64_t qh = q.qk_clip_heads;
    const int64_t kh = q.qk_clip_key_heads;
    if (qh < 1 || kh < 1 || qh % kh != 0)
      return bad("query heads " + std::to_string(qh) + " and key heads " + std::to_string(kh)
                 + ": both >= 1 and the key's dividing the query's");
    if (q.shape.size() < 2 || q.shape[0] % qh != 0)
      return bad(std::to_string(qh) + " heads do not divide the query's rows (shape[0])");
    if (!q.boxes.empty() || !table[k].boxes.empty())
      return bad("a query or key held in boxes: its heads are rows in their order");
    const auto& ks = table[k].shape;
    if (ks.size() < 2 || ks[0] % kh != 0)
      return bad(std::to_string(kh) + " heads do not divide the key's rows (shape[0])");
    pl.qk_pairs.push_back(qk_pair{i, k, qh, kh, pl.qk_values});
    pl.qk_values += qh;
  }
  return {};
}

}  // namespace

int holder_of(int64_t begin, int64_t end, int64_t shard_len) {
  if (shard_len <= 0 || end <= begin)
    return -1;
  const int64_t q = begin / shard_len;
  return end <= (q + 1) * shard_len ? static_cast<int>(q) : -1;
}

std::vector<std::vector<int>> owners_at_world(const plan& pl, int world, shard_layout layout,
                                              std::vector<double>* cost_of_rank, bool keep_held) {
  auto cost = [&](const std::pair<int, int>& ib) {
    auto& p = pl.params[ib.first];
    auto& b = p.blocks[ib.second];
    return static_cast<double>(b.heads) * ns_cost(b.rows / b.heads, p.cols);
  };
  world = std::max(world, 1);
  std::vector<std::pair<int, int>> order;  // (parameter, block), heaviest first
  std::vector<std::vector<int>> owners(pl.params.size());
  std::vector<std::vector<int>> holder(pl.params.size());  // the rank holding it whole, or -1
  double total = 0, largest = 0;
  for (int i = 0; i < static_cast<int>(pl.params.size()); ++i) {
    const auto& p = pl.params[i];
    if (!p.muon)
      continue;
    owners[i].assign(p.blocks.size(), -1);
    const int64_t shard_len = shard_length(p.numel, p.shape[0], world, layout);
    for (int b = 0; b < static_cast<int>(p.blocks.size()); ++b) {
      const auto& block = p.blocks[b];
      holder[i].push_back(
          holder_of(block.row0 * p.cols, (block.row0 + block.rows) * p.cols, shard_len));
      order.emplace_back(i, b);
      total += cost({i, b});
      largest = std::max(largest, cost({i, b}));
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](const auto& a, const auto& b) { return cost(a) > cost(b); });
  // First the blocks whole in one rank's shard, each kept there while that rank's load stays
  // within a balanced share (FSDP2's rows of a few experts on many ranks would pile up).
  const double share = std::max(total / world, largest) * (1 + 1e-9);
  std::vector<double> load(static_cast<size_t>(world), 0.0);
  for (const auto& [i, b] : order) {
    const int q = holder[i][b];
    if (keep_held && q >= 0 && load[q] + cost({i, b}) <= share) {
      owners[i][b] = q;
      load[q] += cost({i, b});
    }
  }
  for (const auto& [i, b] : order) {
    if (owners[i][b] >= 0)
      continue;
    auto least = std::min_element(load.begin(), load.end());
    owners[i][b] = static_cast<int>(least - load.begin());
    *least += cost({i, b});
  }
  if (cost_of_rank)
    *cost_of_rank = std::move(load);
  return owners;
}

int plan::muon_count() const {
  return static_cast<int>(
      std::count_if(params.begin(), params.end(), [](const param_layout& p) { return p.muon; }));
}

int64_t shard_length(int64_t numel, int64_t dim0, int world, shard_layout layout) {
  if (layout == shard_layout::rows)
    return (dim0 + world - 1) / world * (numel / dim0);
  return (numel + world - 1) / world;
}

std::pair<int64_t, int64_t> rank_slice(int64_t numel, int64_t shard_len, int rank) {
  const int64_t begin = std::min(numel, static_cast<int64_t>(rank) * shard_len);
  return {begin, std::min(numel, begin + shard_len)};
}

int plan::find_qk_pair(int query) const {
  for (size_t k = 0; k < qk_pairs.size(); ++k)
    if (qk_pairs[k].query == query)
      return static_cast<int>(k);
  return -1;
}

double ns_cost(int64_t rows, int64_t cols) {
  double lo = static_cast<double>(std::min(rows, cols));
  return static_cast<double>(std::max(rows, cols)) * lo * lo;
}

expected<plan> make_plan(const std::vector<param_spec>& table, int world, int64_t bucket_elements,
                         bool per_head, shard_layout layout) {
  if (world < 1)
    return error{errc::invalid_argument, "world size must be >= 1, got " + std::to_string(world)};
  if (bucket_elements < 1)
    return error{errc::invalid_argument,
                 "reduce_bucket_size must be >= 1, got " + std::to_string(bucket_elements)};
  plan pl;
  pl.world = world;
  pl.layout = layout;
  for (auto& spec : table) {
    if (auto err = validate(spec, pl.index))
      return err;
    if (auto err = validate_blocks(spec))
      return err;
    if (auto err = validate_boxes(spec))
      return err;
    param_layout p;
    p.name = spec.name;
    p.shape = spec.shape;
    p.hparam_group = spec.hparam_group;
    p.numel =
        std::accumulate(spec.shape.begin(), spec.shape.end(), int64_t{1}, std::multiplies<>());
    p.shard_len = shard_length(p.numel, spec.shape[0], world, layout);
    p.shard_offset = pl.shard_total;
    pl.shard_total += p.shard_len;
    p.muon = spec.group == param_group::muon
             || (spec.group == param_group::automatic && default_is_muon(spec));
    if (p.muon) {
      // Expert stacks [E, r, c...] -> E blocks of [r, prod(c...)]; others (conv weights
      // [out, in, kh, kw]) -> [out, in*kh*kw].
      p.rows = is_expert_stack(spec) ? spec.shape[0] * spec.shape[1] : spec.shape[0];
      p.cols = p.numel / p.rows;
      make_blocks(spec, p, per_head);  // its Muon-state offset: with its chunk's, below
      p.boxes = spec.boxes;            // AdamW's rule is element-wise: any order is its own
    } else {
      p.state_offset = pl.adam_state_total;
      pl.adam_state_total += p.shard_len;
    }
    pl.index.emplace(p.name, static_cast<int>(pl.params.size()));
    pl.params.push_back(std::move(p));
  }

  // Reduce buckets: consecutive parameters, at most bucket_elements full elements each; a
  // parameter larger than a bucket gets a bucket of its own (never dropped).
  for (int i = 0; i < static_cast<int>(pl.params.size()); ++i) {
    auto& p = pl.params[i];
    bool fits = !pl.buckets.empty()
                && (pl.buckets.back().shard_len + p.shard_len) * world <= bucket_elements;
    if (!fits) {
      bucket_layout b;
      b.first_param = i;
      b.shard_offset = p.shard_offset;
      pl.buckets.push_back(b);
    }
    auto& b = pl.buckets.back();
    b.end_param = i + 1;
    b.shard_len += p.shard_len;
    p.bucket = static_cast<int>(pl.buckets.size()) - 1;
  }

  // Muon chunks: the same rule over the Muon parameters in table order.
  for (int i = 0; i < static_cast<int>(pl.params.size()); ++i) {
    auto& p = pl.params[i];
    if (!p.muon)
      continue;
    bool fits = !pl.chunks.empty() && pl.chunks.back().full_elements + p.numel <= bucket_elements;
    if (!fits)
      pl.chunks.emplace_back();
    auto& c = pl.chunks.back();
    c.params.push_back(i);
    c.shard_len += p.shard_len;
    c.full_elements += p.numel;
    p.chunk = static_cast<int>(pl.chunks.size()) - 1;
  }
  // The Muon state, chunk after chunk; inside a chunk its parameters in the order an owner lays
  // its blocks out for Newton-Schulz (ns_order), so that at world 1 the owner's buffer is the
  // shard's own layout and the chunk needs no gather and no scatter (muon_coordinator).
  for (auto& c : pl.chunks) {
    c.state_offset = pl.muon_state_total;
    std::vector<int> order = c.params;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return ns_order(pl.params[a], pl.params[a].blocks.front())
             < ns_order(pl.params[b], pl.params[b].blocks.front());
    });
    for (int i : order) {
      pl.params[i].state_offset = pl.muon_state_total;
      pl.muon_state_total += pl.params[i].shard_len;
    }
  }

  if (auto err = make_qk_pairs(table, pl))
    return err;
  assign_owners(pl);
  return pl;
}

}  // namespace zmuon
