#include "actors/partition_store.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "caf/all.hpp"

#include "actors/gradient_shard.hpp"
#include "actors/update_rule.hpp"
#include "messages/errors.hpp"
#include "plan/ownership.hpp"
#include "trace/trace.hpp"

namespace zmuon {

namespace {

/// Parameters of one hyperparameter group inside a Muon chunk or among the AdamW parameters,
/// with their slices: what one backend call of the step takes.
struct group_slices {
  int group = 0;
  std::vector<int> params;  // table order
  std::vector<param_slice> slices;
};

struct store_state {
  std::shared_ptr<const plan> pl;
  int rank = 0;
  std::shared_ptr<compute_backend> be;
  device_buffer params;
  // The open step's gradient (gradient_shard.hpp).
  std::unique_ptr<gradient_shard> grad;
  device_buffer momentum;
  // The new momentum of a step whose Muon momentum went ahead of its vote (momentum_writes::
  // spare): allocated on first need, it becomes the momentum when that step finishes
  // (spare_step: the step it holds, 0 none).
  device_buffer momentum_spare;
  uint64_t spare_step = 0;
  device_buffer exp_avg;
  device_buffer exp_avg_sq;
  // The backend's calls over several parameters, per group: each Muon chunk's, and the AdamW
  // parameters'. Built once from the plan.
  std::vector<std::vector<group_slices>> chunk_groups;
  std::vector<group_slices> adam_groups;
  std::vector<int> adam_index;                 // per parameter: its AdamW ordinal, or -1
  std::vector<std::vector<int>> owned_params;  // per chunk: those with a block this rank owns
  // The step's values (unscale_clip): per group, and per parameter whether it is touched; each
  // group's Muon rule derived from them.
  uint64_t values_step = 0;
  std::shared_ptr<const std::vector<group_hparams>> groups;
  std::vector<muon_rule> rules;
  std::vector<uint8_t> touched;
  int group_count = 1;
  // NorMuon's row moments of the NS blocks this rank owns (plan/ownership.hpp), and per
  // parameter and block where its rows start there and where the whole block sits in its
  // chunk's owner buffer (-1: another rank's block).
  device_buffer row_moments;
  std::vector<std::vector<int64_t>> row_offset;
  std::vector<std::vector<int64_t>> full_offset;
  int64_t adam_steps = 0;                 // applied steps
  std::vector<int64_t> adam_param_steps;  // per AdamW parameter: the steps that touched it
  // Work on the backend whose completion comes back as gpu_done, oldest first.
  struct pending_scan {
    uint64_t step;
    int32_t chunks_ahead;  // scan_grads::chunks_ahead
    std::shared_ptr<scan_result> result;
    caf::typed_response_promise<grad_scan> promise;
  };
  std::deque<pending_scan> scans;
  // A scan that waits for the momentum calls of its step's chunks ahead of the vote
  // (gradient_shard::momentum_scans_due).
  std::optional<pending_scan> after_momentum;
  std::deque<caf::typed_response_promise<ack>> finishing;
  trace::track tr;
  static const char* name;
};
const char* store_state::name = "partition_store";

using store_pointer = partition_store_actor::stateful_pointer<store_state>;

// MuonClip after the step's update: each range lies in this rank's parameter shard.
caf::result<ack> scale_clipped_heads(store_pointer self, const qk_clip_scale& msg) {
  ZMUON_TRACE_RECV(self, msg);
  auto& st = self->state;
  for (const auto& r : msg.ranges)
    if (r.offset < 0 || r.n < 0 || r.offset + r.n > st.params.size())
      return make_caf_error(errc::shape_mismatch,
                            "qk_clip_scale: range [" + std::to_string(r.offset) + ", "
                                + std::to_string(r.offset + r.n) + ") is outside rank "
                                + std::to_string(st.rank) + "'s " + std::to_string(st.params.size())
                                + " parameter elements");
  for (const auto& r : msg.ranges)
    st.be->scale(st.params.data() + r.offset, r.n, r.factor);
  return ack{msg.step};
}

// Sends gpu_done{step, what} to the store once the backend's queued work has finished.
void notify_when_done(store_pointer self, uint64_t step, gpu_event what) {
  auto handle = caf::actor_cast<partition_store_actor>(self);
  gpu_done msg{step, what, 0};
  self->state.be->when_done([handle, msg] { caf::anon_send(handle, msg); });
}

// Starts a scan, whose result comes back with gpu_done as soon as the scan has landed (no
// thread waits for the GPU, nor the scan for Newton-Schulz ahead of the vote).
void start_scan(store_pointer self, store_state::pending_scan scan) {
  auto& st = self->state;
  auto handle = caf::actor_cast<partition_store_actor>(self);
  const gpu_done landed{scan.step, gpu_event::scan_landed, 0};
  st.grad->scan_async(scan.result.get(), [handle, landed] { caf::anon_send(handle, landed); });
  st.scans.push_back(std::move(scan));
}

// The scan of the gradient for the step. Where its momentum goes ahead of the vote and the
// buckets left the Muon gradients' scan to the momentum calls, it starts once the calls of the
// chunks sent ahead of the vote are enqueued (update_momentum).
caf::result<grad_scan> scan_for(store_pointer self, const scan_grads& msg) {
  auto& st = self->state;
  auto promise = self->make_response_promise<grad_scan>();
  if (st.after_momentum) {  // an earlier step's that never got its calls (that step failed)
    st.after_momentum->promise.deliver(make_caf_error(
        errc::bad_state, "scan_grads: step " + std::to_string(st.after_momentum->step)
                             + " never asked for the momentum of its chunks ahead of the vote"));
    st.after_momentum.reset();
  }
  store_state::pending_scan scan{msg.step, msg.chunks_ahead, std::make_shared<scan_result>(),
                                 promise};
  if (st.grad->momentum_scans_due(msg.chunks_ahead))
    st.after_momentum = std::move(scan);
  else
    start_scan(self, std::move(scan));
  return promise;
}

void on_gpu_done(store_pointer self, const gpu_done& msg) {
  auto& st = self->state;
  if (msg.what == gpu_event::scan_landed && !st.scans.empty()) {
    auto scan = std::move(st.scans.front());
    st.scans.pop_front();
    scan.promise.deliver(grad_scan{scan.step, scan.result->nonfinite, scan.result->sum_squares});
  } else if (msg.what == gpu_event::step_done && !st.finishing.empty()) {
    st.finishing.front().deliver(ack{msg.step});
    st.finishing.pop_front();
  }
}

std::vector<float> to_host(compute_backend& be, const device_buffer& buf) {
  std::vector<float> out(buf.size());
  if (buf.size() > 0)
    be.copy_to_host(out.data(), buf.data(), buf.size());
  return out;
}

// Everything but the gradient, copied to host vectors once the queued work has finished: what a
// checkpoint keeps.
store_snapshot saved_state(store_pointer self) {
  auto& st = self->state;
  auto& be = *st.be;
  be.synchronize();
  store_snapshot snap{to_host(be, st.params),     {},
                      to_host(be, st.momentum),   to_host(be, st.exp_avg),
                      to_host(be, st.exp_avg_sq), st.adam_steps,
                      st.adam_param_steps};
  snap.row_moments = to_host(be, st.row_moments);
  return snap;
}

caf::error check_chunk(const plan& pl, int32_t chunk, const float_view& view, const char* what) {
  if (chunk < 0 || chunk >= static_cast<int32_t>(pl.chunks.size()))
    return make_caf_error(errc::invalid_argument,
                          std::string(what) + ": no Muon chunk " + std::to_string(chunk));
  if ((view.data == nullptr && view.bf16 == nullptr) || view.size != pl.chunks[chunk].shard_len)
    return make_caf_error(errc::shape_mismatch, std::string(what) + ": chunk "
                                                    + std::to_string(chunk) + " needs "
                                                    + std::to_string(pl.chunks[chunk].shard_len)
                                                    + " floats, got " + std::to_string(view.size));
  return {};
}

/// A state to load must fit this rank's buffers exactly.
caf::error check_state(const store_state& st, const rank_state* in) {
  auto fits = [](const char* what, size_t got, int64_t need) -> std::string {
    if (static_cast<int64_t>(got) == need)
      return {};
    return std::string(what) + " has " + std::to_string(got) + " floats, the store holds "
           + std::to_string(need);
  };
  if (in == nullptr)
    return make_caf_error(errc::invalid_argument, "load_state: no state");
  for (auto msg : {fits("params", in->params.size(), st.params.size()),
                   fits("momentum", in->momentum.size(), st.momentum.size()),
                   fits("exp_avg", in->exp_avg.size(), st.exp_avg.size()),
                   fits("exp_avg_sq", in->exp_avg_sq.size(), st.exp_avg_sq.size())})
    if (!msg.empty())
      return make_caf_error(errc::shape_mismatch,
                            "load_state: rank " + std::to_string(st.rank) + ": " + msg);
  if (in->adam_steps < 0)
    return make_caf_error(errc::invalid_argument, "load_state: negative AdamW step count");
  if (!in->adam_param_steps.empty() && in->adam_param_steps.size() != st.adam_param_steps.size())
    return make_caf_error(errc::shape_mismatch,
                          "load_state: " + std::to_string(in->adam_param_steps.size())
                              + " AdamW step counts for "
                              + std::to_string(st.adam_param_steps.size()) + " AdamW parameters");
  for (int64_t n : in->adam_param_steps)
    if (n < 0)
      return make_caf_error(errc::invalid_argument, "load_state: negative AdamW step count");
  if (!in->row_moments.empty()) {
    if (auto msg = fits("row_moments", in->row_moments.size(), st.row_moments.size()); !msg.empty())
      return make_caf_error(errc::shape_mismatch,
                            "load_state: rank " + std::to_string(st.rank) + ": " + msg);
    for (float v : in->row_moments)
      if (!(v >= 0.0f) || !std::isfinite(v))
        return make_caf_error(errc::invalid_argument,
                              "load_state: NorMuon row moments must be finite and >= 0");
  }
  return {};
}

// -- setup: the plan's calls, built once ----------------------------------------------------------

/// The parameters' slices by hyperparameter group, groups in first-seen order.
std::vector<group_slices> by_group(const plan& pl, const std::vector<int>& params) {
  std::vector<group_slices> out;
  for (int i : params) {
    const auto& p = pl.params[i];
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const group_slices& g) { return g.group == p.hparam_group; });
    if (it == out.end())
      it = out.insert(out.end(), group_slices{p.hparam_group, {}, {}});
    it->params.push_back(i);
    it->slices.push_back(param_slice{p.shard_offset, p.state_offset, p.shard_len, 1.0f});
  }
  return out;
}

void init_state(store_state& st, std::shared_ptr<const plan> pl, int rank,
                std::shared_ptr<compute_backend> backend, bool muon_in_momentum) {
  st.pl = std::move(pl);
  st.rank = rank;
  st.be = std::move(backend);
  const plan& p = *st.pl;
  st.params = st.be->allocate(p.shard_total);
  st.grad = std::make_unique<gradient_shard>(st.pl, st.be, muon_in_momentum);
  st.momentum = st.be->allocate(p.muon_state_total);
  st.exp_avg = st.be->allocate(p.adam_state_total);
  st.exp_avg_sq = st.be->allocate(p.adam_state_total);
  std::vector<int> adam_params;
  st.adam_index.assign(p.params.size(), -1);
  for (size_t i = 0; i < p.params.size(); ++i) {
    st.group_count = std::max(st.group_count, p.params[i].hparam_group + 1);
    if (!p.params[i].muon) {
      st.adam_index[i] = static_cast<int>(adam_params.size());
      adam_params.push_back(static_cast<int>(i));
    }
  }
  st.adam_groups = by_group(p, adam_params);
  st.adam_param_steps.assign(adam_params.size(), 0);
  for (const auto& c : p.chunks)
    st.chunk_groups.push_back(by_group(p, c.params));
  st.row_moments = st.be->allocate(row_moment_total(p, rank));
  st.row_offset = row_moment_offsets(p);
  st.full_offset.resize(p.params.size());
  for (size_t i = 0; i < p.params.size(); ++i)
    st.full_offset[i].assign(p.params[i].blocks.size(), -1);
  st.owned_params.resize(p.chunks.size());
  for (const auto& own : make_ownership(p, rank))
    for (const auto& m : own.owned) {
      st.full_offset[m.param][m.block] = m.full_offset;
      auto& list = st.owned_params[p.params[m.param].chunk];
      if (list.empty() || list.back() != m.param)  // table order, a parameter's blocks together
        list.push_back(m.param);
    }
}

// -- the step's values
// ------------------------------------------------------------------------------

/// unscale_clip: the step applies; its values serve the step's later messages.
caf::error take_step_values(store_state& st, unscale_clip& msg) {
  const std::string what = "unscale_clip: step " + std::to_string(msg.step);
  if (!msg.groups || static_cast<int>(msg.groups->size()) < st.group_count)
    return make_caf_error(errc::invalid_argument,
                          what + ": needs the values of " + std::to_string(st.group_count)
                              + " hyperparameter groups, got "
                              + std::to_string(msg.groups ? msg.groups->size() : 0));
  if (!msg.touched.empty() && msg.touched.size() != st.pl->params.size())
    return make_caf_error(errc::shape_mismatch,
                          what + ": " + std::to_string(msg.touched.size()) + " touched flags for "
                              + std::to_string(st.pl->params.size()) + " parameters");
  st.values_step = msg.step;
  st.spare_step = 0;  // the step's momentum not yet written anywhere
  st.groups = std::move(msg.groups);
  st.rules = muon_rules_of(*st.groups);
  st.touched = std::move(msg.touched);
  return {};
}

/// An update message of `step` needs that step's values.
caf::error check_values(const store_state& st, uint64_t step, const char* what) {
  if (st.groups && st.values_step == step)
    return {};
  return make_caf_error(errc::bad_state, std::string(what) + ": step " + std::to_string(step)
                                             + " has no values (unscale_clip comes first)");
}

bool is_touched(const store_state& st, int param) {
  return st.touched.empty() || st.touched[param] != 0;
}

/// Calls call(slices, touched) for the group's touched slices, then its untouched ones (each
/// set only when not empty).
template <class Call>
void by_touch(const store_state& st, const group_slices& gs, Call call) {
  std::vector<param_slice> on, off;
  for (size_t k = 0; k < gs.params.size(); ++k)
    (is_touched(st, gs.params[k]) ? on : off).push_back(st.grad->read(gs.slices[k], gs.params[k]));
  if (!on.empty())
    call(on, true);
  if (!off.empty())
    call(off, false);
}

// -- the update ---------------------------------------------------------------------------------

/// muon_momentum: per group, m and u of its touched parameters (the new m into the spare
/// where msg.writes says so, and then the scan of the gradients read, where the buckets left
/// it to this call: gradient_shard::momentum_scan); an untouched one takes beta 1 (its gradient
/// is zero: m stays exactly) and u = m.
caf::error momentum_of(store_pointer self, const muon_momentum& msg) {
  auto& st = self->state;
  if (auto err = check_chunk(*st.pl, msg.chunk, msg.out, "muon_momentum"))
    return err;
  if (auto err = check_values(st, msg.step, "muon_momentum"))
    return err;
  st.grad->materialize(gradient_shard::reader::in_place);
  float* m_out = st.momentum.data();
  st.spare_step = 0;  // written in place: nothing for finish_step to swap in
  if (msg.writes == momentum_writes::spare) {
    if (st.momentum_spare.size() != st.momentum.size())
      st.momentum_spare = st.be->allocate(st.pl->muon_state_total);
    m_out = st.momentum_spare.data();
    st.spare_step = msg.step;
  }
  const fp32_or_bf16 out{msg.out.data, msg.out.bf16};
  const int64_t origin = st.pl->chunks[msg.chunk].state_offset;
  scan_into scan =
      msg.writes == momentum_writes::spare ? st.grad->momentum_scan(msg.chunk) : scan_into{};
  for (const auto& gs : st.chunk_groups[msg.chunk]) {
    const muon_rule& rule = st.rules[gs.group];
    by_touch(st, gs, [&](const std::vector<param_slice>& slices, bool touched) {
      st.be->momentum_slices(st.momentum.data(), m_out, st.grad->buffer().data(), out, origin,
                             slices, touched ? rule.momentum : 1.0f, touched && rule.nesterov,
                             scan);
      scan.first = false;
    });
  }
  return {};
}

/// muon_momentum, then the scan that waited for it once no chunk's call is due (also after a
/// refused call: the scan then takes the chunk's Muon gradients itself).
caf::error update_momentum(store_pointer self, const muon_momentum& msg) {
  auto& st = self->state;
  caf::error err = momentum_of(self, msg);
  if (st.after_momentum && (err || !st.grad->momentum_scans_due(st.after_momentum->chunks_ahead))) {
    auto scan = std::move(*st.after_momentum);
    st.after_momentum.reset();
    start_scan(self, std::move(scan));
  }
  return err;
}

/// apply_muon: per group, its touched parameters' update under the group's rule. An fp32 update
/// arrives scaled; a bf16 one unscaled, and each parameter takes its first block's scale here.
caf::error apply_update(store_pointer self, const apply_muon& msg) {
  auto& st = self->state;
  const auto& pl = *st.pl;
  if (auto err = check_chunk(pl, msg.chunk, msg.update, "apply_muon"))
    return err;
  if (auto err = check_values(st, msg.step, "apply_muon"))
    return err;
  const fp32_or_bf16 update{msg.update.data, msg.update.bf16};
  const bool scale_here = msg.update.bf16 != nullptr;
  for (const auto& gs : st.chunk_groups[msg.chunk]) {
    const muon_rule& rule = st.rules[gs.group];
    std::vector<param_slice> slices;
    for (size_t k = 0; k < gs.params.size(); ++k) {
      if (!is_touched(st, gs.params[k]))
        continue;
      const auto& p = pl.params[gs.params[k]];
      const auto& b0 = p.blocks.front();
      slices.push_back(gs.slices[k]);
      slices.back().scale = scale_here ? rule.scale(b0.rows / b0.heads, p.cols) : 1;
    }
    if (!slices.empty())
      st.be->muon_update_slices(st.params.data(), update, pl.chunks[msg.chunk].state_offset, slices,
                                rule);
  }
  return {};
}

/// adamw_step: per group, the non-Muon rule on its touched parameters, a call per step count
/// (a parameter some steps left untouched counts fewer).
caf::error run_scalar_rule(store_pointer self, const adamw_step& msg) {
  auto& st = self->state;
  if (auto err = check_values(st, msg.step, "adamw_step"))
    return err;
  ++st.adam_steps;
  st.grad->materialize(gradient_shard::reader::in_place);
  for (const auto& gs : st.adam_groups) {
    std::vector<std::pair<int64_t, std::vector<param_slice>>> by_count;
    for (size_t k = 0; k < gs.params.size(); ++k) {
      if (!is_touched(st, gs.params[k]))
        continue;
      const int64_t n = ++st.adam_param_steps[st.adam_index[gs.params[k]]];
      auto it = std::find_if(by_count.begin(), by_count.end(),
                             [&](const auto& c) { return c.first == n; });
      if (it == by_count.end())
        it = by_count.insert(by_count.end(), {n, {}});
      it->second.push_back(st.grad->read(gs.slices[k], gs.params[k]));
    }
    for (const auto& [n, slices] : by_count)
      st.be->scalar_update_slices(st.params.data(), st.grad->buffer().data(), st.exp_avg.data(),
                                  st.exp_avg_sq.data(), slices,
                                  scalar_args_of((*st.groups)[gs.group].adamw, n));
  }
  return {};
}

/// normuon_step: each NS block this rank owns of the chunk's touched parameters whose rule has a
/// transform after NS (NorMuon), transformed in place in the owner buffer (a bf16 one through
/// an fp32 copy) with its own row moments, its heads as separate matrices whose rows are the
/// block's rows (NorMuon per matrix, arXiv:2510.05491); an fp32 one then takes its scale.
caf::error transform_blocks(store_state& st, const normuon_step& msg) {
  const auto& pl = *st.pl;
  const std::string what = "normuon_step: chunk " + std::to_string(msg.chunk);
  if (msg.chunk < 0 || msg.chunk >= static_cast<int32_t>(pl.chunks.size()))
    return make_caf_error(errc::invalid_argument,
                          "normuon_step: no Muon chunk " + std::to_string(msg.chunk));
  if (msg.full.data == nullptr && msg.full.bf16 == nullptr)
    return make_caf_error(errc::invalid_argument, what + ": no owner buffer");
  if (auto err = check_values(st, msg.step, "normuon_step"))
    return err;
  std::vector<int> params;
  for (int i : st.owned_params[msg.chunk])
    if (st.rules[pl.params[i].hparam_group].transforms() && is_touched(st, i))
      params.push_back(i);
  for (int i : params) {
    const auto& p = pl.params[i];
    for (size_t b = 0; b < p.blocks.size(); ++b)
      if (st.full_offset[i][b] >= 0
          && st.full_offset[i][b] + p.blocks[b].rows * p.cols > msg.full.size)
        return make_caf_error(
            errc::shape_mismatch,
            what + ": the owner buffer holds " + std::to_string(msg.full.size) + " floats");
  }
  for (int i : params) {
    const auto& p = pl.params[i];
    const muon_rule& rule = st.rules[p.hparam_group];
    for (size_t k = 0; k < p.blocks.size(); ++k) {
      const int64_t at = st.full_offset[i][k];
      if (at < 0)
        continue;
      const muon_block& b = p.blocks[k];
      const int64_t rows = b.rows / b.heads;
      float* v = st.row_moments.data() + st.row_offset[i][k];
      if (msg.full.data != nullptr) {
        st.be->post_ns(msg.full.data + at, v, b.heads, rows, p.cols, rule,
                       rule.scale(rows, p.cols));
        continue;
      }
      const int64_t n = b.rows * p.cols;
      device_buffer wide = st.be->allocate_for_overwrite(n);
      st.be->from_bf16(wide.data(), msg.full.bf16 + at, n);
      st.be->post_ns(wide.data(), v, b.heads, rows, p.cols, rule, 1.0f);  // scaled by receivers
      st.be->to_bf16(msg.full.bf16 + at, wide.data(), n);
    }
  }
  return {};
}

/// The answer to a request of `step`: its error, or ack.
caf::result<ack> answered(uint64_t step, caf::error err) {
  if (err)
    return err;
  return ack{step};
}

/// unscale_clip: the step's values kept; the gradient times the factor.
caf::error unscale(store_pointer self, unscale_clip& msg) {
  auto& st = self->state;
  if (auto err = take_step_values(st, msg))
    return err;
  if (msg.factor == 1.0f)  // x * 1 is x: no pass over every gradient (gas 1, no scale, clip)
    return {};
  st.grad->scale(msg.factor);
  return {};
}

/// load_params: the parameter shard set.
caf::error set_params(store_state& st, const load_params& msg) {
  if (!msg.shard || static_cast<int64_t>(msg.shard->size()) != st.params.size())
    return make_caf_error(errc::shape_mismatch, "load_params: rank " + std::to_string(st.rank)
                                                    + " needs " + std::to_string(st.params.size())
                                                    + " floats");
  st.be->copy_from_host(st.params.data(), msg.shard->data(), st.params.size());
  return {};
}

/// finish_step: the gradient marked zero; answered once the step's kernels have finished (so
/// that the host's step time is the GPU's), through gpu_done, or at once (`when_done` false:
/// the host orders its stream after them).
caf::result<ack> finish(store_pointer self, const finish_step& msg) {
  const uint64_t step = msg.step;
  auto& st = self->state;
  if (st.spare_step == step) {  // every chunk's new momentum went there: it is the momentum now
    std::swap(st.momentum, st.momentum_spare);
    st.spare_step = 0;
  }
  st.grad->forget();
  if (!msg.when_done)
    return ack{step};
  auto& finishing = st.finishing;
  finishing.push_back(self->make_response_promise<ack>());
  auto promise = finishing.back();
  notify_when_done(self, step, gpu_event::step_done);
  return promise;
}

/// load_state: params, momentum, Adam moments, step counts and row moments replaced; the
/// gradient zero.
caf::error load_state_into(store_pointer self, const rank_state* in) {
  auto& st = self->state;
  if (auto err = check_state(st, in))
    return err;
  auto& be = *st.be;
  be.copy_from_host(st.params.data(), in->params.data(), in->params.size());
  be.copy_from_host(st.momentum.data(), in->momentum.data(), in->momentum.size());
  be.copy_from_host(st.exp_avg.data(), in->exp_avg.data(), in->exp_avg.size());
  be.copy_from_host(st.exp_avg_sq.data(), in->exp_avg_sq.data(), in->exp_avg_sq.size());
  if (in->row_moments.empty())
    be.fill_zero(st.row_moments.data(), st.row_moments.size());
  else
    be.copy_from_host(st.row_moments.data(), in->row_moments.data(), in->row_moments.size());
  be.synchronize();
  st.adam_steps = in->adam_steps;
  if (in->adam_param_steps.empty())
    st.adam_param_steps.assign(st.adam_param_steps.size(), in->adam_steps);
  else
    st.adam_param_steps = in->adam_param_steps;
  self->state.grad->forget();
  return {};
}

partition_store_actor::behavior_type store_impl(store_pointer self, std::shared_ptr<const plan> pl,
                                                int rank, std::shared_ptr<compute_backend> backend,
                                                std::shared_ptr<trace::recorder> tracer,
                                                bool muon_in_momentum) {
  self->state.tr = trace::track(std::move(tracer), "partition_store");
  init_state(self->state, std::move(pl), rank, std::move(backend), muon_in_momentum);
  // A CUDA failure inside a handler ends the store with a device_failure naming the call; the
  // coordinator monitors the store and fails the step with it.
  self->set_exception_handler([](std::exception_ptr& eptr) { return error_from_exception(eptr); });
  return {
      [=](accumulate& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        // The view's memory goes when the handler returns, before CAF sends the answer (the
        // message itself lives until the store takes its next one): a requester that hears the
        // answer finds it released.
        const keep_alive held = std::move(msg.slice.owner);
        return answered(msg.step, self->state.grad->accumulate(msg));
      },
      [=](scan_grads& msg) {
        ZMUON_TRACE_RECV(self, msg);
        return scan_for(self, msg);
      },
      [=](discard_grads& msg) -> ack {
        ZMUON_TRACE_RECV(self, msg);
        self->state.spare_step = 0;  // a refused step's spare is never the momentum
        self->state.grad->forget();
        return ack{msg.step};
      },
      [=](unscale_clip& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        return answered(msg.step, unscale(self, msg));
      },
      [=](muon_momentum& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        const keep_alive held = std::move(msg.out.owner);  // as in accumulate
        return answered(msg.step, update_momentum(self, msg));
      },
      [=](apply_muon& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        const keep_alive held = std::move(msg.update.owner);  // as in accumulate
        return answered(msg.step, apply_update(self, msg));
      },
      [=](adamw_step& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        return answered(msg.step, run_scalar_rule(self, msg));
      },
      [=](normuon_step& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        const keep_alive held = std::move(msg.full.owner);  // as in accumulate
        return answered(msg.step, transform_blocks(self->state, msg));
      },
      [=](finish_step& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        return finish(self, msg);
      },
      [=](gpu_done& msg) { on_gpu_done(self, msg); },
      [=](qk_clip_scale& msg) -> caf::result<ack> { return scale_clipped_heads(self, msg); },
      [=](copy_in_grads& msg) -> ack {
        ZMUON_TRACE_RECV(self, msg);
        self->state.grad->materialize();  // enqueued: the host waits for its backend
        return ack{msg.step};
      },
      [=](begin_reads& msg) {
        ZMUON_TRACE_RECV(self, msg);
        self->state.grad->materialize(gradient_shard::reader::in_place);
      },
      [=](load_params& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        return answered(msg.step, set_params(self->state, msg));
      },
      [=](load_state& msg) -> caf::result<ack> {
        return answered(msg.step, load_state_into(self, msg.state.get()));
      },
      [=](snapshot_atom) -> store_snapshot {
        self->state.grad->materialize();  // the gradient too, where only marked zero
        store_snapshot snap = saved_state(self);
        snap.grads = to_host(*self->state.be, self->state.grad->buffer());
        return snap;
      },
      [=](saved_state_atom) -> store_snapshot { return saved_state(self); },
      [=](params_view_atom) -> float_view {
        auto& st = self->state;
        return float_view{st.params.data(), st.params.size()};
      },
      [=](params_atom) -> std::vector<float> {
        auto& st = self->state;
        st.be->synchronize();
        return to_host(*st.be, st.params);
      },
  };
}

}  // namespace

partition_store_actor spawn_partition_store(caf::actor_system& sys, std::shared_ptr<const plan> pl,
                                            int rank, std::shared_ptr<compute_backend> backend,
                                            std::shared_ptr<trace::recorder> tracer,
                                            bool muon_in_momentum) {
  return sys.spawn(store_impl, std::move(pl), rank, std::move(backend), std::move(tracer),
                   muon_in_momentum);
}

}  // namespace zmuon
