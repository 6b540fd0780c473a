// What the host registers before the engine starts: the parameters, Muon's blocks (split_sizes,
// expert stacks), the order the host holds a matrix in (boxes) and MuonClip's query/key pairs. Each
// call checks its own part alone; start() plans the whole table once.
#include <algorithm>

#include "engine/impl.hpp"
#include "engine/job.hpp"
#include "engine/registry.hpp"

namespace zmuon {

namespace {

// The plan's own check of a changed parameter, on a table of it alone (its MuonClip key, which
// names another parameter, left out): the caller changes nothing if it fails.
error check_alone(param_spec spec) {
  spec.qk_clip_key.clear();
  auto pl = make_plan({spec}, 1, kMaxParamElements);
  return pl ? error{} : pl.err();
}

}  // namespace

error engine::add_parameter(const param_spec& spec, const std::vector<float>& init) {
  auto& job = *impl_->job;
  auto& reg = *impl_->registry;
  if (reg.pl)
    return {errc::bad_state,
            "parameter '" + spec.name + "' registered after the first reduce() or step()"};
  // The new parameter alone is checked (its name against a set): registration stays linear in
  // the number of parameters; start() plans the whole table once.
  if (reg.table_names.count(spec.name) > 0)
    return {errc::duplicate_parameter, "parameter '" + spec.name + "' is registered twice"};
  auto checked = make_plan({spec}, job.opts.world, job.opts.reduce_bucket_size,
                           job.opts.per_head_muon, job.opts.layout);
  if (!checked)
    return checked.err();
  const auto& p = checked->params.back();
  if (!init.empty() && static_cast<int64_t>(init.size()) != p.numel)
    return {errc::shape_mismatch, "initial values of '" + spec.name + "' have "
                                      + std::to_string(init.size()) + " elements, shape needs "
                                      + std::to_string(p.numel)};
  // The values first: a failed allocation (bad_alloc) leaves the table as it was. None given:
  // zeros, kept as an empty vector (the shards start zeroed).
  reg.init.push_back(init);
  try {
    reg.table.push_back(spec);
    reg.table_names.emplace(spec.name, reg.table.size() - 1);
  } catch (...) {
    if (reg.table.size() > reg.init.size() - 1)
      reg.table.pop_back();
    reg.init.pop_back();
    throw;
  }
  return {};
}

error engine::set_muon_blocks(const std::string& name, const std::vector<int64_t>& split_sizes,
                              const std::vector<int64_t>& split_heads, matrix_view view) {
  auto& reg = *impl_->registry;
  if (reg.pl)
    return {errc::bad_state,
            "Muon blocks of '" + name + "' set after the first reduce() or step()"};
  if (static_cast<int>(view) > static_cast<int>(matrix_view::flatten))
    return {errc::invalid_argument, "Muon blocks of '" + name + "': view must be automatic, "
                                                               "expert_stack or flatten"};
  param_spec* it = reg.find(name);
  if (!it)
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
  if (auto err = check_alone(changed))
    return err;
  *it = std::move(changed);
  return {};
}

error engine::set_box_order(const std::string& name, const std::vector<matrix_box>& boxes) {
  auto& reg = *impl_->registry;
  if (reg.pl)
    return {errc::bad_state, "box order of '" + name + "' set after the first reduce() or step()"};
  param_spec* it = reg.find(name);
  if (!it)
    return {errc::unknown_parameter, "'" + name + "' is not a registered parameter"};
  const bool paired = !it->qk_clip_key.empty()
                      || std::any_of(reg.table.begin(), reg.table.end(),
                                     [&](const param_spec& s) { return s.qk_clip_key == name; });
  if (paired && !boxes.empty())
    return {errc::invalid_argument, "box order of '" + name
                                        + "': it is a MuonClip query or key, whose heads are rows "
                                          "in their order"};
  param_spec changed = *it;
  changed.boxes = boxes;
  if (auto err = check_alone(changed))
    return err;
  *it = std::move(changed);
  return {};
}

error engine::add_qk_clip(const std::string& query, const std::string& key, int64_t query_heads,
                          int64_t key_heads) {
  auto& reg = *impl_->registry;
  if (reg.pl)
    return {errc::bad_state,
            "MuonClip pair of '" + query + "' added after the first reduce() or step()"};
  if (query_heads < 1 || key_heads < 1 || query_heads % key_heads != 0)
    return {errc::invalid_argument, "MuonClip pair of '" + query + "': query heads "
                                        + std::to_string(query_heads) + " and key heads "
                                        + std::to_string(key_heads)
                                        + " must be >= 1, the key's dividing the query's"};
  param_spec* q = reg.find(query);
  param_spec* k = reg.find(key);
  if (!q || !k)
    return {errc::unknown_parameter,
            "MuonClip pair: '" + (q ? key : query) + "' is not a registered parameter"};
  if (q == k)
    return {errc::invalid_argument, "MuonClip pair: '" + query + "' is its own key"};
  if (!q->qk_clip_key.empty())
    return {errc::invalid_argument,
            "MuonClip pair: '" + query + "' already has key '" + q->qk_clip_key + "'"};
  for (const auto& [spec, heads] : {std::pair{q, query_heads}, std::pair{k, key_heads}})
    if (spec->shape.size() < 2 || spec->shape[0] % heads != 0)
      return {errc::invalid_argument, "MuonClip pair: " + std::to_string(heads)
                                          + " heads do not divide the rows (shape[0]) of '"
                                          + spec->name + "'"};
  for (const param_spec* spec : {q, k})
    if (!spec->boxes.empty())
      return {errc::invalid_argument, "MuonClip pair: '" + spec->name
                                          + "' is held in boxes (set_box_order), and its heads "
                                            "are rows in their order"};
  q->qk_clip_key = key;
  q->qk_clip_heads = query_heads;
  q->qk_clip_key_heads = key_heads;
  return {};
}

}  // namespace zmuon
