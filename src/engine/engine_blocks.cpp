// Registration of Muon's blocks (split_sizes, expert stacks) and MuonClip's host side: the
// query/key pairs and the logits the host reports per micro-batch, kept per local rank until the
// step carries them to the rank's coordinator.
#include <algorithm>
#include <cmath>

#include "engine/impl.hpp"

namespace zmuon {

error engine::set_muon_blocks(const std::string& name, const std::vector<int64_t>& split_sizes,
                              const std::vector<int64_t>& split_heads, matrix_view view) {
  auto& d = *impl_;
  if (d.pl)
    return {errc::bad_state,
            "Muon blocks of '" + name + "' set after the first reduce() or step()"};
  if (static_cast<int>(view) > static_cast<int>(matrix_view::flatten))
    return {errc::invalid_argument, "Muon blocks of '" + name + "': view must be automatic, "
                                                               "expert_stack or flatten"};
  auto it = std::find_if(d.table.begin(), d.table.end(),
                         [&](const param_spec& s) { return s.name == name; });
  if (it == d.table.end())
    return {errc::unknown_parameter, "'" + name + "' is not a registered parameter"};
  param_spec changed = *it;
  changed.split_sizes = split_sizes;
  changed.split_heads = split_heads;
  changed.view = view;
  if (!split_sizes.empty() && changed.heads > 0 && split_heads.empty()) {
    // heads given at registration apply inside every block
    changed.split_heads.assign(split_sizes.size(), changed.heads);
  }
  if (!split_sizes.empty())
    changed.heads = 0;
  // The plan's own check, on a table of this parameter alone: nothing changes if it fails.
  param_spec alone = changed;
  alone.qk_clip_key.clear();
  if (auto pl = make_plan({alone}, 1, kMaxParamElements); !pl)
    return pl.err();
  *it = std::move(changed);
  return {};
}

error engine::add_qk_clip(const std::string& query, const std::string& key, int64_t query_heads,
                          int64_t key_heads) {
  auto& d = *impl_;
  if (d.pl)
    return {errc::bad_state,
            "MuonClip pair of '" + query + "' added after the first reduce() or step()"};
  if (query_heads < 1 || key_heads < 1 || query_heads % key_heads != 0)
    return {errc::invalid_argument, "MuonClip pair of '" + query + "': query heads "
                                        + std::to_string(query_heads) + " and key heads "
                                        + std::to_string(key_heads)
                                        + " must be >= 1, the key's dividing the query's"};
  auto find = [&](const std::string& name) {
    return std::find_if(d.table.begin(), d.table.end(),
                        [&](const param_spec& s) { return s.name == name; });
  };
  auto q = find(query);
  auto k = find(key);
  if (q == d.table.end() || k == d.table.end())
    return {errc::unknown_parameter, "MuonClip pair: '" + (q == d.table.end() ? query : key)
                                         + "' is not a registered parameter"};
  if (q == k)
    return {errc::invalid_argument, "MuonClip pair: '" + query + "' is its own key"};
  if (!q->qk_clip_key.empty())
    return {errc::invalid_argument,
            "MuonClip pair: '" + query + "' already has key '" + q->qk_clip_key + "'"};
  for (const auto& [spec, heads] : {std::pair{&*q, query_heads}, std::pair{&*k, key_heads}})
    if (spec->shape.size() < 2 || spec->shape[0] % heads != 0)
      return {errc::invalid_argument, "MuonClip pair: " + std::to_string(heads)
                                          + " heads do not divide the rows (shape[0]) of '"
                                          + spec->name + "'"};
  q->qk_clip_key = key;
  q->qk_clip_heads = query_heads;
  q->qk_clip_key_heads = key_heads;
  return {};
}

error engine::report_qk_logits(int rank, const std::string& query,
                               const std::vector<float>& max_logits) {
  auto& d = *impl_;
  if (auto err = d.start_for(rank))
    return err;
  const int i = d.pl->find(query);
  const int pair = i < 0 ? -1 : d.pl->find_qk_pair(i);
  if (pair < 0)
    return {i < 0 ? errc::unknown_parameter : errc::invalid_argument,
            "report_qk_logits: '" + query + "' is not the query of a MuonClip pair (add_qk_clip)"};
  const auto& p = d.pl->qk_pairs[pair];
  if (static_cast<int64_t>(max_logits.size()) != p.query_heads)
    return {errc::shape_mismatch, "report_qk_logits: '" + query + "' has "
                                      + std::to_string(p.query_heads) + " heads, got "
                                      + std::to_string(max_logits.size()) + " values"};
  for (size_t h = 0; h < max_logits.size(); ++h)
    if (!std::isfinite(max_logits[h]))
      return {errc::invalid_argument, "report_qk_logits: '" + query + "' head " + std::to_string(h)
                                          + " has a non-finite logit"};
  auto& mine = d.qk_logits[rank - d.first_rank];
  if (mine.empty())
    mine.assign(static_cast<size_t>(d.pl->qk_values), -std::numeric_limits<float>::max());
  for (int64_t h = 0; h < p.query_heads; ++h) {
    float& at = mine[static_cast<size_t>(p.value_offset + h)];
    at = std::max(at, max_logits[static_cast<size_t>(h)]);
  }
  return {};
}

}  // namespace zmuon
