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

// Longest-processing-time first: heaviest matrix to the least-loaded rank, ties to the lower
// rank and, for equal cost, table order. Deterministic, so identical on every rank.
void assign_owners(plan& pl) {
  const std::vector<int> owners = owners_at_world(pl, pl.world, &pl.owner_cost);
  for (size_t i = 0; i < pl.params.size(); ++i)
    pl.params[i].owner = owners[i];
}

}  // namespace

std::vector<int> owners_at_world(const plan& pl, int world, std::vector<double>* cost_of_rank) {
  std::vector<int> order;
  for (int i = 0; i < static_cast<int>(pl.params.size()); ++i)
    if (pl.params[i].muon)
      order.push_back(i);
  auto cost = [&](int i) {
    auto& p = pl.params[i];
    return static_cast<double>(p.heads) * ns_cost(p.rows / p.heads, p.cols);
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return cost(a) > cost(b); });
  std::vector<double> load(static_cast<size_t>(std::max(world, 1)), 0.0);
  std::vector<int> owners(pl.params.size(), -1);
  for (int i : order) {
    auto least = std::min_element(load.begin(), load.end());
    owners[i] = static_cast<int>(least - load.begin());
    *least += cost(i);
  }
  if (cost_of_rank)
    *cost_of_rank = std::move(load);
  return owners;
}

int plan::muon_count() const {
  return static_cast<int>(
      std::count_if(params.begin(), params.end(), [](const param_layout& p) { return p.muon; }));
}

double ns_cost(int64_t rows, int64_t cols) {
  double lo = static_cast<double>(std::min(rows, cols));
  return static_cast<double>(std::max(rows, cols)) * lo * lo;
}

expected<plan> make_plan(const std::vector<param_spec>& table, int world, int64_t bucket_elements,
                         bool per_head) {
  if (world < 1)
    return error{errc::invalid_argument, "world size must be >= 1, got " + std::to_string(world)};
  if (bucket_elements < 1)
    return error{errc::invalid_argument,
                 "reduce_bucket_size must be >= 1, got " + std::to_string(bucket_elements)};
  plan pl;
  pl.world = world;
  for (auto& spec : table) {
    if (auto err = validate(spec, pl.index))
      return err;
    param_layout p;
    p.name = spec.name;
    p.shape = spec.shape;
    p.hparam_group = spec.hparam_group;
    p.numel =
        std::accumulate(spec.shape.begin(), spec.shape.end(), int64_t{1}, std::multiplies<>());
    p.shard_len = (p.numel + world - 1) / world;
    p.shard_offset = pl.shard_total;
    pl.shard_total += p.shard_len;
    p.muon = spec.group == param_group::muon
             || (spec.group == param_group::automatic && default_is_muon(spec));
    if (p.muon) {
      p.rows = spec.shape[0];
      p.cols = p.numel / p.rows;  // conv weights [out, in, kh, kw] -> [out, in*kh*kw]
      p.heads = per_head && spec.heads > 0 ? spec.heads : 1;
      p.state_offset = pl.muon_state_total;
      pl.muon_state_total += p.shard_len;
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
    if (!fits) {
      chunk_layout c;
      c.state_offset = p.state_offset;
      pl.chunks.push_back(c);
    }
    auto& c = pl.chunks.back();
    c.params.push_back(i);
    c.shard_len += p.shard_len;
    c.full_elements += p.numel;
    p.chunk = static_cast<int>(pl.chunks.size()) - 1;
  }

  assign_owners(pl);
  return pl;
}

}  // namespace zmuon
