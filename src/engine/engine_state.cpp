// engine::read_state / write_state: the optimizer state by parameter name, without files. The
// ranks' snapshots (as save_checkpoint takes them) go to full tensors and back through the
// checkpoint's map between shards and full tensors (checkpoint/shards.hpp).
//
// In a multi-process job read_state(full) sends every rank's shards to each process's first
// rank (the gather behind parameters()); write_state needs no exchange, since every process is
// given the full tensors and keeps its own ranks' part, but the processes agree on the outcome.
#include <cmath>
#include <map>

#include "checkpoint/shards.hpp"
#include "engine/hand_over.hpp"
#include "engine/impl.hpp"
#include "engine/job.hpp"
#include "engine/lifecycle.hpp"
#include "engine/registry.hpp"
#include "plan/ownership.hpp"

namespace zmuon {

namespace {

/// The state of kind `k` of every local rank, laid out as the parameter shards are (each
/// parameter's elements at its shard_offset), so that the parameter gather carries it too.
std::vector<std::vector<float>> in_shard_layout(const plan& pl, const std::vector<rank_state>& st,
                                                const state_kind& k, int first_rank) {
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < st.size(); ++i) {
    auto& v = out.emplace_back(pl.shard_total, 0.0f);
    for (const auto& p : pl.params) {
      if (!has_kind(k, p.muon))
        continue;
      auto [begin, end] = rank_slice(p.numel, p.shard_len, first_rank + static_cast<int>(i));
      const float* from = (st[i].*k.buffer).data() + offset_in(k, p);
      std::copy(from, from + (end - begin), v.data() + p.shard_offset);
    }
  }
  return out;
}

/// Where param_state keeps a kind's values.
std::vector<float> param_state::*member_of(const state_kind& k) {
  static std::vector<float> param_state::*const members[] = {
      &param_state::param, &param_state::momentum, &param_state::exp_avg, &param_state::exp_avg_sq};
  return members[&k - state_kinds];
}

/// "parameter 'name': what", for errors.
std::string of(const std::string& name, const char* what) {
  return "parameter '" + name + "': " + what;
}

/// The state's counters (step, AdamW steps, loss scaler) and its parameters by name, their
/// tensors still empty; the AdamW step counts are rank 0's (`first`: its snapshot).
optimizer_state counters_of(const plan& pl, const rank_state& first,
                            const loss_scale_snapshot& scaler, uint64_t step) {
  optimizer_state out;
  out.step = step;
  out.adam_steps = first.adam_steps;
  out.scaler = scaler;
  size_t adam_index = 0;
  for (const auto& p : pl.params) {
    param_state ps;
    ps.name = p.name;
    if (!p.muon) {
      const auto& counts = first.adam_param_steps;
      ps.adam_step = adam_index < counts.size() ? counts[adam_index] : first.adam_steps;
      ++adam_index;
    }
    out.params.push_back(std::move(ps));
  }
  return out;
}

/// NorMuon's row moments into `out`: per Muon parameter one per row of its matrix view, each NS
/// block's from its owner rank where that is one of this process's (zeros for the others'
/// blocks); `over_nodes`: read whole over the processes, summed, so that every process has
/// every block's.
error read_row_moments(engine& eng, const engine_job& job, const plan& pl,
                       const std::vector<rank_state>& snaps, bool over_nodes,
                       optimizer_state& out) {
  const std::vector<std::vector<int64_t>> row_offsets = row_moment_offsets(pl);
  std::vector<double> all_rows;
  for (size_t j = 0; j < pl.params.size(); ++j) {
    const auto& p = pl.params[j];
    if (!p.muon)
      continue;
    std::vector<float> v(static_cast<size_t>(p.rows), 0.0f);
    bool any = false;
    for (size_t b = 0; b < p.blocks.size(); ++b) {
      const muon_block& blk = p.blocks[b];
      const int i = blk.owner - job.first_rank;
      if (i < 0 || i >= job.local || row_offsets[j][b] < 0)
        continue;
      const auto& rows = snaps[i].row_moments;
      if (row_offsets[j][b] + blk.rows > static_cast<int64_t>(rows.size()))
        continue;
      std::copy(rows.begin() + row_offsets[j][b], rows.begin() + row_offsets[j][b] + blk.rows,
                v.begin() + blk.row0);
      any = true;
    }
    if (over_nodes)
      all_rows.insert(all_rows.end(), v.begin(), v.end());
    else if (any)
      out.params[j].row_moments = std::move(v);
  }
  if (!over_nodes || all_rows.empty())
    return {};
  auto summed = eng.sum_over_nodes(all_rows);  // one owner per row: the sum is its value, exactly
  if (!summed)
    return summed.err();
  size_t at = 0;
  for (size_t j = 0; j < pl.params.size(); ++j)
    if (pl.params[j].muon) {
      auto& v = out.params[j].row_moments;
      for (int64_t e = 0; e < pl.params[j].rows; ++e)
        v.push_back(static_cast<float>((*summed)[at++]));
    }
  return {};
}

/// Kind `k` of every parameter that keeps it into `out`, from this process's snapshots alone:
/// the full tensors (one process: it has every rank) or this process's elements.
void copy_kind(const plan& pl, const engine_job& job, const std::vector<rank_state>& snaps,
               const state_kind& k, state_scope scope, optimizer_state& out) {
  for (size_t j = 0; j < pl.params.size(); ++j) {
    const auto& p = pl.params[j];
    if (!has_kind(k, p.muon))
      continue;
    auto& v = out.params[j].*member_of(k);
    if (scope == state_scope::full) {
      v.assign(p.numel, 0.0f);
      for (int i = 0; i < job.local; ++i)
        shard_to_full(pl, job.first_rank + i, snaps[i], k, p, v.data());
      continue;
    }
    const int64_t begin = rank_slice(p.numel, p.shard_len, job.first_rank).first;
    const int64_t end = rank_slice(p.numel, p.shard_len, job.first_rank + job.local - 1).second;
    out.params[j].offset = begin;
    v.assign(end - begin, 0.0f);
    for (int i = 0; i < job.local; ++i) {
      auto [b, e] = rank_slice(p.numel, p.shard_len, job.first_rank + i);
      const float* from = (snaps[i].*k.buffer).data() + offset_in(k, p);
      std::copy(from, from + (e - b), v.data() + (b - begin));
    }
  }
}

/// Kind `k`'s full tensors into `out` over the processes: every rank's shards to this process's
/// first rank, in buffers held until every comm has answered (a late piece after a timeout
/// lands in them, not in `out`).
error gather_kind(engine_job& job, const plan& pl, const std::vector<rank_state>& snaps,
                  const state_kind& k, optimizer_state& out) {
  struct buffers {
    std::vector<std::vector<float>> shards, full;
  };
  auto bufs = std::make_shared<buffers>();
  std::vector<float*> shards, target(pl.params.size(), nullptr);
  bufs->shards = in_shard_layout(pl, snaps, k, job.first_rank);
  for (auto& b : bufs->shards)
    shards.push_back(b.data());
  for (size_t j = 0; j < pl.params.size(); ++j)
    if (has_kind(k, pl.params[j].muon))
      target[j] = bufs->full.emplace_back(pl.params[j].numel, 0.0f).data();
  if (auto err = job.shards_to_node_leaders(pl, job.comms, shards, target, bufs))
    return err;
  size_t n = 0;
  for (size_t j = 0; j < pl.params.size(); ++j)
    if (target[j])
      out.params[j].*member_of(k) = std::move(bufs->full[n++]);
  return {};
}

/// Why `v`, parameter `name`'s `kind`, cannot be loaded: a value that is not finite.
error check_finite(const std::string& name, const char* kind, const std::vector<float>& v) {
  for (size_t e = 0; e < v.size(); ++e)
    if (!std::isfinite(v[e]))
      return {errc::invalid_argument, of(name, kind) + " holds " + std::to_string(v[e])
                                          + " at element " + std::to_string(e)
                                          + " (finite values only)"};
  return {};
}

/// Why NorMuon's row moments of `ps` cannot be parameter `p`'s: one per row of its Muon matrix
/// view, finite and >= 0 (none given: zeros).
error check_row_moments(const param_state& ps, const param_layout& p) {
  if (ps.row_moments.empty())
    return {};
  if (!p.muon || static_cast<int64_t>(ps.row_moments.size()) != p.rows)
    return {errc::shape_mismatch,
            of(ps.name, "row_moments has ") + std::to_string(ps.row_moments.size())
                + " values, the parameter keeps " + std::to_string(p.muon ? p.rows : 0)
                + " (one per row of its Muon matrix view)"};
  for (size_t e = 0; e < ps.row_moments.size(); ++e)
    if (!std::isfinite(ps.row_moments[e]) || ps.row_moments[e] < 0)
      return {errc::invalid_argument, of(ps.name, "row_moments") + " holds "
                                          + std::to_string(ps.row_moments[e]) + " at element "
                                          + std::to_string(e) + " (finite, >= 0 only)"};
  return {};
}

/// Why `ps` cannot be parameter `p`'s state: the whole tensor or exactly this process's
/// elements [local_begin, local_end) (read_state(local)'s) of each kind its algorithm keeps,
/// finite values, row moments, a step count >= 0.
error check_param_state(const param_state& ps, const param_layout& p, int64_t local_begin,
                        int64_t local_end) {
  const bool whole = ps.offset == 0 && ps.param.size() == static_cast<size_t>(p.numel);
  if (!whole && ps.offset != local_begin)
    return {errc::invalid_argument,
            of(ps.name, "offset ") + std::to_string(ps.offset)
                + ": write_state takes whole tensors or this process's elements ["
                + std::to_string(local_begin) + ", " + std::to_string(local_end) + ")"};
  for (const state_kind& k : state_kinds) {
    const auto& v = ps.*member_of(k);
    const int64_t need = !has_kind(k, p.muon) ? 0 : whole ? p.numel : local_end - local_begin;
    if (static_cast<int64_t>(v.size()) != need)
      return {errc::shape_mismatch, of(ps.name, k.name) + " has " + std::to_string(v.size())
                                        + " values, the " + (p.muon ? "Muon" : "AdamW")
                                        + " parameter keeps " + std::to_string(need)
                                        + (whole ? "" : " here (this process's elements)")};
    if (auto err = check_finite(ps.name, k.name, v))
      return err;
  }
  if (auto err = check_row_moments(ps, p))
    return err;
  if (!p.muon && ps.adam_step < 0)
    return {errc::invalid_argument,
            of(ps.name, "AdamW step count ") + std::to_string(ps.adam_step) + " is negative"};
  return {};
}

/// Why `state` cannot be loaded into ranks [first_rank, first_rank + local) of plan `pl`:
/// each parameter once and valid (check_param_state), counters in range. Fills `by_index`.
error check_state(const plan& pl, const optimizer_state& state, int first_rank, int local,
                  std::vector<const param_state*>& by_index) {
  for (const auto& ps : state.params) {
    const int j = pl.find(ps.name);
    if (j < 0)
      return {errc::unknown_parameter, "write_state: no parameter '" + ps.name + "'"};
    if (by_index[j])
      return {errc::duplicate_parameter, "write_state: parameter '" + ps.name + "' given twice"};
    by_index[j] = &ps;
    const auto& p = pl.params[j];
    const int64_t local_begin = rank_slice(p.numel, p.shard_len, first_rank).first;
    const int64_t local_end = rank_slice(p.numel, p.shard_len, first_rank + local - 1).second;
    if (auto err = check_param_state(ps, p, local_begin, local_end))
      return err;
  }
  for (size_t j = 0; j < pl.params.size(); ++j)
    if (!by_index[j])
      return {errc::invalid_argument, "write_state: parameter '" + pl.params[j].name
                                          + "' is missing (every registered one is needed)"};
  const auto& sc = state.scaler;
  if (state.adam_steps < 0 || !(sc.scale > 0) || !std::isfinite(sc.scale) || sc.iter < 0
      || sc.hysteresis_left < 1)
    return {errc::invalid_argument,
            "write_state: AdamW steps " + std::to_string(state.adam_steps) + ", loss scale "
                + std::to_string(sc.scale) + ", scaler iteration " + std::to_string(sc.iter)
                + ", hysteresis " + std::to_string(sc.hysteresis_left) + " is not a valid state"};
  return {};
}

/// Every process says whether its ranks `took` the state of step `step` (a slot per rank, over
/// sum_over_nodes); an error names a process that refused or was given another step's.
error agree_on_state(engine& eng, const engine_job& job, bool took, uint64_t step) {
  const int world = job.opts.world;
  std::vector<double> ready(static_cast<size_t>(world) * 2, 0.0);
  for (int i = 0; i < job.local && took; ++i) {
    ready[2 * (job.first_rank + i)] = 1;
    ready[2 * (job.first_rank + i) + 1] = static_cast<double>(step);
  }
  auto agreed = eng.sum_over_nodes(ready);
  if (!agreed)
    return agreed.err();
  if (!took)
    return {};  // this process's own error says why
  for (int r = 0; r < world; ++r) {
    if ((*agreed)[2 * r] != 1.0)
      return {errc::comm_failure,
              "write_state: " + job.process_of(r) + " refused the state (its own error names why)"};
    if ((*agreed)[2 * r + 1] != (*agreed)[1])
      return {errc::comm_failure, "write_state: " + job.process_of(r)
                                      + " was given the state of another step than rank 0"};
  }
  return {};
}

/// Rank `r`'s state out of the full tensors (or this process's elements) of `state`.
std::shared_ptr<const rank_state> rank_state_of(
    const plan& pl, const optimizer_state& state, const std::vector<const param_state*>& by_index,
    const std::vector<std::vector<int64_t>>& row_offsets, int r) {
  auto st = std::make_shared<rank_state>();
  st->params.assign(pl.shard_total, 0.0f);
  st->momentum.assign(pl.muon_state_total, 0.0f);
  st->exp_avg.assign(pl.adam_state_total, 0.0f);
  st->exp_avg_sq.assign(pl.adam_state_total, 0.0f);
  st->adam_steps = state.adam_steps;
  for (size_t j = 0; j < pl.params.size(); ++j)
    if (!pl.params[j].muon)
      st->adam_param_steps.push_back(by_index[j]->adam_step);
  // NorMuon's row moments: each NS block's rows to its owner (none given: zeros).
  st->row_moments.assign(row_moment_total(pl, r), 0.0f);
  for (size_t j = 0; j < pl.params.size(); ++j) {
    const auto& rows = by_index[j]->row_moments;
    for (size_t b = 0; !rows.empty() && b < pl.params[j].blocks.size(); ++b) {
      const muon_block& blk = pl.params[j].blocks[b];
      if (blk.owner == r)
        std::copy(rows.begin() + blk.row0, rows.begin() + blk.row0 + blk.rows,
                  st->row_moments.begin() + row_offsets[j][b]);
    }
  }
  for (size_t j = 0; j < pl.params.size(); ++j) {
    const auto& p = pl.params[j];
    const param_state& ps = *by_index[j];
    auto [begin, end] = rank_slice(p.numel, p.shard_len, r);
    for (const state_kind& k : state_kinds)
      if (has_kind(k, p.muon)) {  // whole tensors start at 0, this process's at ps.offset
        const float* from = (ps.*member_of(k)).data() + (begin - ps.offset);
        std::copy(from, from + (end - begin), ((*st).*k.buffer).data() + offset_in(k, p));
      }
  }
  return st;
}

}  // namespace

expected<std::pair<int64_t, int64_t>> engine::local_range(const std::string& name) {
  auto& d = *impl_;
  auto& job = *d.job;
  auto& reg = *d.registry;
  if (auto err = d.start())
    return err;
  const int k = reg.pl->find(name);
  if (k < 0)
    return error{errc::unknown_parameter, "local_range: no parameter '" + name + "'"};
  const auto& p = reg.pl->params[k];
  return std::pair<int64_t, int64_t>{
      rank_slice(p.numel, p.shard_len, job.first_rank).first,
      rank_slice(p.numel, p.shard_len, job.first_rank + job.local - 1).second};
}

expected<optimizer_state> engine::read_state(state_scope scope) {
  auto& d = *impl_;
  auto& job = *d.job;
  if (auto err = d.start())
    return err;
  const plan& pl = *d.registry->pl;
  // 1. This process's ranks' snapshots (what a checkpoint saves) and the loss scaler's state.
  std::vector<rank_state> snaps;
  for (int i = 0; i < job.local; ++i) {
    auto st = job.ask<rank_state>(job.ranks[i].store, saved_state_atom::value);
    if (!st)
      return st.err();
    snaps.push_back(std::move(*st));
  }
  auto scaler = job.ask<loss_scale_snapshot>(job.ranks[0].scaler, scaler_state_atom::value);
  if (!scaler)
    return scaler.err();
  optimizer_state out = counters_of(pl, snaps[0], *scaler, job.step);
  const bool over_nodes = scope == state_scope::full && job.multi_node();
  // 2. NorMuon's row moments.
  if (auto err = read_row_moments(*this, job, pl, snaps, over_nodes, out))
    return err;
  // 3. Each kind's full tensors (or this process's part), one kind at a time.
  for (const state_kind& k : state_kinds) {
    if (!over_nodes)
      copy_kind(pl, job, snaps, k, scope, out);
    else if (auto err = gather_kind(job, pl, snaps, k, out))
      return d.stop(err, "while gathering the optimizer state");
  }
  return out;
}

error engine::write_state(const optimizer_state& state) {
  auto& d = *impl_;
  auto& job = *d.job;
  auto& hand = *d.hand_over;
  if (auto err = d.start())
    return err;
  if (auto err = d.withdraw_ahead())  // a hand-over ahead of the step is not between steps
    return d.stop(err, engine_lifecycle::in_step(job.step + 1));
  const plan& pl = *d.registry->pl;

  // 1. Everything checked before anything changes.
  error own;
  for (int i = 0; !own && i < job.local; ++i)
    if (hand.micros[i] != 0)
      own = {errc::bad_state, "write_state with micro-batches of step "
                                  + std::to_string(job.step + 1) + " handed over (load between "
                                                                 "steps)"};
  std::vector<const param_state*> by_index(pl.params.size(), nullptr);
  if (!own)
    own = check_state(pl, state, job.first_rank, job.local, by_index);

  // 2. Every process says whether its ranks took it, with the step, so that all load or none.
  if (auto err = agree_on_state(*this, job, !own, state.step))
    return err;
  if (own)
    return own;

  // 3. Each rank's shards out of the full tensors, handed to its store and loss scaler. Once a
  //    rank has taken its state, a failure stops the engine (the ranks would disagree).
  const std::string handing =
      "while handing the optimizer state of step " + std::to_string(state.step) + " to its ranks";
  const std::vector<std::vector<int64_t>> row_offsets = row_moment_offsets(pl);
  for (int i = 0; i < job.local; ++i) {
    auto st = rank_state_of(pl, state, by_index, row_offsets, job.first_rank + i);
    if (auto done = job.ask<ack>(job.ranks[i].store, load_state{state.step, std::move(st)}); !done)
      return d.stop(done.err(), handing);
    if (auto done = job.ask<ack>(job.ranks[i].scaler, restore_scaler{state.step, state.scaler});
        !done)
      return d.stop(done.err(), handing);
  }
  job.step = state.step;
  return {};
}

}  // namespace zmuon
