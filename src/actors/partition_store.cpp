#include "actors/partition_store.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <optional>
#include <tuple>
#include <vector>

#include "caf/all.hpp"

#include "messages/errors.hpp"
#include "plan/ownership.hpp"
#include "trace/trace.hpp"

namespace zmuon {

namespace {

struct store_state {
  std::shared_ptr<const plan> pl;
  int rank = 0;
  std::shared_ptr<compute_backend> be;
  device_buffer params;
  device_buffer grads;
  // Per reduce bucket: whether its gradient shard holds this step's values. A bucket not written
  // reads as zero: its first slice of a step is copied in rather than added (one read of the
  // gradient fewer), nothing zeroes the whole gradient after a step (one write fewer), and
  // `materialize` zeroes the buckets still unwritten before anything reads the gradient.
  std::vector<bool> written;
  // Per reduce bucket, the scan of its gradient shard, taken by the call that wrote it
  // (accumulate_scanned), so that the step's scan reads no gradient; `scanned` says whether the
  // bucket's kept scan is that of what it holds (not after a copy from pageable host memory,
  // nor after the unscale).
  std::unique_ptr<part_scans> bucket_scans;
  std::vector<bool> scanned;
  device_buffer momentum;
  device_buffer exp_avg;
  device_buffer exp_avg_sq;
  // The backend's calls over several parameters: each Muon chunk's, and every AdamW parameter's.
  std::vector<std::vector<param_slice>> chunk_slices;
  std::vector<param_slice> adam_slices;
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
    std::shared_ptr<scan_result> result;
    caf::typed_response_promise<grad_scan> promise;
  };
  std::deque<pending_scan> scans;
  std::deque<caf::typed_response_promise<ack>> finishing;
  trace::track tr;
  static const char* name;
};
const char* store_state::name = "partition_store";

using store_pointer = partition_store_actor::stateful_pointer<store_state>;

/// Every bucket changed outside accumulate_scanned: their kept scans are stale.
void gradient_rewritten(store_pointer self) {
  self->state.scanned.assign(self->state.scanned.size(), false);
}

/// The parameters' slices, in the order given, for the backend's calls over several parameters.
std::vector<param_slice> slices_of(const plan& pl, const std::vector<int>& params) {
  std::vector<param_slice> slices;
  slices.reserve(params.size());
  for (int i : params) {
    const auto& p = pl.params[i];
    slices.push_back(param_slice{p.shard_offset, p.state_offset, p.shard_len, 1.0f});
  }
  return slices;
}

/// Runs `call(subset, key)` once per distinct key over the slices, in first-seen order: one
/// backend call per set of parameters that share their values. `key(k)` is slice k's values, or
/// nullopt to leave it out.
template <class Key, class KeyOf, class Call>
void by_key(const std::vector<param_slice>& slices, KeyOf key_of, Call call) {
  std::vector<std::pair<Key, std::vector<param_slice>>> sets;
  for (size_t k = 0; k < slices.size(); ++k) {
    std::optional<Key> key = key_of(k);
    if (!key)
      continue;
    auto it =
        std::find_if(sets.begin(), sets.end(), [&](const auto& s) { return s.first == *key; });
    if (it == sets.end()) {
      sets.emplace_back(*key, std::vector<param_slice>{});
      it = sets.end() - 1;
    }
    it->second.push_back(slices[k]);
  }
  for (const auto& [key, subset] : sets)
    call(subset, key);
}

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

/// The gradient is zero from here on: every bucket unwritten, nothing touched.
void forget_gradient(store_pointer self) {
  auto& st = self->state;
  st.written.assign(st.pl->buckets.size(), false);
}

/// Before the gradient is read: the buckets no slice reached this step are zeroed.
void materialize(store_pointer self) {
  auto& st = self->state;
  const auto& buckets = st.pl->buckets;
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (st.written[b])
      continue;
    st.be->accumulate_scanned(st.grads.data() + buckets[b].shard_offset, nullptr,
                              buckets[b].shard_len, accumulate_mode::zero, *st.bucket_scans,
                              static_cast<int>(b));
    st.written[b] = true;
    st.scanned[b] = true;
  }
}

// Sends gpu_done{step, what} to the store once the backend's queued work has finished.
void notify_when_done(store_pointer self, uint64_t step, gpu_event what) {
  auto handle = caf::actor_cast<partition_store_actor>(self);
  gpu_done msg{step, what, 0};
  self->state.be->when_done([handle, msg] { caf::anon_send(handle, msg); });
}

// The scan of the gradient for `step`, whose result comes back with gpu_done (no thread waits
// for the GPU).
caf::result<grad_scan> scan_for(store_pointer self, uint64_t step) {
  auto& st = self->state;
  materialize(self);
  auto promise = self->make_response_promise<grad_scan>();
  auto result = std::make_shared<scan_result>();
  if (std::find(st.scanned.begin(), st.scanned.end(), false) == st.scanned.end())
    st.be->scan_parts_async(*st.bucket_scans, result.get());
  else
    st.be->scan_async(st.grads.data(), st.grads.size(), result.get());
  st.scans.push_back(store_state::pending_scan{step, result, promise});
  notify_when_done(self, step, gpu_event::scan_landed);
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

/// apply_update_slices(), or with cautious weight decay a call per slice (a bf16 update widened
/// first).
void apply_slices(compute_backend& be, float* p, fp32_or_bf16 o, int64_t origin,
                  const std::vector<param_slice>& slices, float lr, float weight_decay,
                  bool cautious) {
  if (!cautious)
    return be.apply_update_slices(p, o, origin, slices, lr, weight_decay);
  for (const param_slice& s : slices) {
    const int64_t at = s.state_offset - origin;
    if (o.f32 != nullptr) {
      be.apply_update_cautious(p + s.shard_offset, o.f32 + at, s.n, lr, s.scale, weight_decay);
      continue;
    }
    device_buffer wide = be.allocate_for_overwrite(s.n);
    be.from_bf16(wide.data(), o.bf16 + at, s.n);
    be.apply_update_cautious(p + s.shard_offset, wide.data(), s.n, lr, s.scale, weight_decay);
  }
}

/// normuon_step: each NS block of the listed parameters that this rank owns normalized in place
/// in the owner buffer (a bf16 one through an fp32 copy) with its own row moments, its heads as
/// separate matrices whose rows are the block's rows (NorMuon per matrix, arXiv:2510.05491).
caf::error normalize_rows(store_state& st, const normuon_step& msg) {
  const auto& pl = *st.pl;
  const std::string what = "normuon_step: chunk " + std::to_string(msg.chunk);
  if (msg.chunk < 0 || msg.chunk >= static_cast<int32_t>(pl.chunks.size()))
    return make_caf_error(errc::invalid_argument,
                          "normuon_step: no Muon chunk " + std::to_string(msg.chunk));
  if (msg.full.data == nullptr && msg.full.bf16 == nullptr)
    return make_caf_error(errc::invalid_argument, what + ": no owner buffer");
  auto owned = [&](int32_t param, size_t b) { return st.full_offset[param][b] >= 0; };
  for (const auto& a : msg.params) {
    bool any = false;
    if (a.param >= 0 && a.param < static_cast<int32_t>(pl.params.size())
        && pl.params[a.param].chunk == msg.chunk)
      for (size_t b = 0; b < st.full_offset[a.param].size(); ++b)
        any = any || owned(a.param, b);
    if (!any)
      return make_caf_error(errc::invalid_argument, what + ": parameter " + std::to_string(a.param)
                                                        + " has no block this rank owns there");
    const auto& p = pl.params[a.param];
    for (size_t b = 0; b < p.blocks.size(); ++b)
      if (owned(a.param, b)
          && st.full_offset[a.param][b] + p.blocks[b].rows * p.cols > msg.full.size)
        return make_caf_error(
            errc::shape_mismatch,
            what + ": the owner buffer holds " + std::to_string(msg.full.size) + " floats");
  }
  for (const auto& a : msg.params) {
    const auto& p = pl.params[a.param];
    for (size_t k = 0; k < p.blocks.size(); ++k) {
      if (!owned(a.param, k))
        continue;
      const muon_block& b = p.blocks[k];
      float* v = st.row_moments.data() + st.row_offset[a.param][k];
      const int64_t at = st.full_offset[a.param][k];
      const int64_t n = b.rows * p.cols;
      if (msg.full.data != nullptr) {
        st.be->normuon_rows(msg.full.data + at, v, b.heads, b.rows / b.heads, p.cols, a.beta2,
                            a.eps);
        continue;
      }
      device_buffer wide = st.be->allocate_for_overwrite(n);
      st.be->from_bf16(wide.data(), msg.full.bf16 + at, n);
      st.be->normuon_rows(wide.data(), v, b.heads, b.rows / b.heads, p.cols, a.beta2, a.eps);
      st.be->to_bf16(msg.full.bf16 + at, wide.data(), n);
    }
  }
  return {};
}

/// A message's per-parameter entries: none, or one per parameter of the chunk.
template <class Args>
caf::error check_args(const std::vector<Args>& args, size_t params, const char* what, int chunk) {
  if (args.empty() || args.size() == params)
    return {};
  return make_caf_error(errc::shape_mismatch, std::string(what) + ": chunk " + std::to_string(chunk)
                                                  + " has " + std::to_string(params)
                                                  + " parameters, got "
                                                  + std::to_string(args.size()) + " entries");
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

partition_store_actor::behavior_type store_impl(store_pointer self, std::shared_ptr<const plan> pl,
                                                int rank, std::shared_ptr<compute_backend> backend,
                                                std::shared_ptr<trace::recorder> tracer) {
  auto& st = self->state;
  st.tr = trace::track(std::move(tracer), "partition_store");
  st.pl = std::move(pl);
  st.rank = rank;
  st.be = std::move(backend);
  st.params = st.be->allocate(st.pl->shard_total);
  st.grads = st.be->allocate(st.pl->shard_total);
  st.written.assign(st.pl->buckets.size(), true);  // allocated zero
  st.bucket_scans = st.be->make_part_scans(static_cast<int>(st.pl->buckets.size()));
  st.scanned.assign(st.pl->buckets.size(), true);  // zero parts
  st.momentum = st.be->allocate(st.pl->muon_state_total);
  st.exp_avg = st.be->allocate(st.pl->adam_state_total);
  st.exp_avg_sq = st.be->allocate(st.pl->adam_state_total);
  std::vector<int> adam_params;
  for (size_t i = 0; i < st.pl->params.size(); ++i)
    if (!st.pl->params[i].muon)
      adam_params.push_back(static_cast<int>(i));
  st.adam_slices = slices_of(*st.pl, adam_params);
  st.adam_param_steps.assign(adam_params.size(), 0);
  for (const auto& c : st.pl->chunks)
    st.chunk_slices.push_back(slices_of(*st.pl, c.params));
  st.row_moments = st.be->allocate(row_moment_total(*st.pl, rank));
  st.row_offset = row_moment_offsets(*st.pl);
  st.full_offset.resize(st.pl->params.size());
  for (size_t i = 0; i < st.pl->params.size(); ++i)
    st.full_offset[i].assign(st.pl->params[i].blocks.size(), -1);
  for (const auto& own : make_ownership(*st.pl, rank))
    for (const auto& m : own.owned)
      st.full_offset[m.param][m.block] = m.full_offset;
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
        auto& st = self->state;
        const auto& pl = *st.pl;
        if (msg.bucket < 0 || msg.bucket >= static_cast<int32_t>(pl.buckets.size())
            || msg.slice.data == nullptr || msg.slice.size != pl.buckets[msg.bucket].shard_len)
          return make_caf_error(
              errc::shape_mismatch,
              "accumulate: bucket " + std::to_string(msg.bucket) + " slice has the wrong size");
        auto& b = pl.buckets[msg.bucket];
        float* dst = st.grads.data() + b.shard_offset;
        const bool first = !st.written[msg.bucket];
        // The scan in the same pass where the slice is in the backend's own memory.
        const bool own_memory = !msg.from_host || !st.be->device_memory();
        if (own_memory)
          st.be->accumulate_scanned(dst, msg.slice.data, b.shard_len,
                                    first ? accumulate_mode::copy : accumulate_mode::add,
                                    *st.bucket_scans, msg.bucket);
        else if (first)  // pageable: copied out before it returns
          st.be->copy_from_host_async(dst, msg.slice.data, b.shard_len);
        else
          st.be->add_from_host(dst, msg.slice.data, b.shard_len);
        st.written[msg.bucket] = true;
        st.scanned[msg.bucket] = own_memory;
        return ack{msg.step};
      },
      [=](scan_grads& msg) {
        ZMUON_TRACE_RECV(self, msg);
        return scan_for(self, msg.step);
      },
      [=](discard_grads& msg) -> ack {
        ZMUON_TRACE_RECV(self, msg);
        forget_gradient(self);
        return ack{msg.step};
      },
      [=](unscale_clip& msg) -> ack {
        ZMUON_TRACE_RECV(self, msg);
        auto& st = self->state;
        if (msg.factor == 1.0f)  // x * 1 is x: no pass over every gradient (gas 1, no scale, clip)
          return ack{msg.step};
        materialize(self);
        st.be->scale(st.grads.data(), st.grads.size(), msg.factor);
        gradient_rewritten(self);
        return ack{msg.step};
      },
      [=](muon_momentum& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        const keep_alive held = std::move(msg.out.owner);  // as in accumulate
        auto& st = self->state;
        const auto& pl = *st.pl;
        if (auto err = check_chunk(pl, msg.chunk, msg.out, "muon_momentum"))
          return err;
        const auto& c = pl.chunks[msg.chunk];
        if (auto err = check_args(msg.params, c.params.size(), "muon_momentum", msg.chunk))
          return err;
        materialize(self);
        const fp32_or_bf16 out{msg.out.data, msg.out.bf16};
        const auto& slices = st.chunk_slices[msg.chunk];
        if (msg.params.empty()) {
          st.be->momentum_slices(st.momentum.data(), st.grads.data(), out, c.state_offset, slices,
                                 msg.beta, msg.nesterov);
          return ack{msg.step};
        }
        // An untouched parameter: beta 1 keeps m exactly (its gradient is zero), u = m.
        using key = std::pair<float, bool>;
        by_key<key>(
            slices,
            [&](size_t k) -> std::optional<key> {
              const auto& a = msg.params[k];
              return a.touched ? key{a.beta, a.nesterov} : key{1.0f, false};
            },
            [&](const std::vector<param_slice>& subset, const key& k) {
              st.be->momentum_slices(st.momentum.data(), st.grads.data(), out, c.state_offset,
                                     subset, k.first, k.second);
            });
        return ack{msg.step};
      },
      [=](apply_muon& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        const keep_alive held = std::move(msg.update.owner);  // as in accumulate
        auto& st = self->state;
        const auto& pl = *st.pl;
        if (auto err = check_chunk(pl, msg.chunk, msg.update, "apply_muon"))
          return err;
        const auto& c = pl.chunks[msg.chunk];
        if (!msg.scales.empty() && msg.scales.size() != c.params.size())
          return make_caf_error(errc::shape_mismatch,
                                "apply_muon: chunk " + std::to_string(msg.chunk) + " has "
                                    + std::to_string(c.params.size()) + " parameters, got "
                                    + std::to_string(msg.scales.size()) + " scales");
        if (auto err = check_args(msg.params, c.params.size(), "apply_muon", msg.chunk))
          return err;
        std::vector<param_slice>& slices = st.chunk_slices[msg.chunk];
        for (size_t k = 0; k < slices.size(); ++k)
          slices[k].scale = msg.scales.empty() ? 1.0f : msg.scales[k];
        const fp32_or_bf16 update{msg.update.data, msg.update.bf16};
        if (msg.params.empty()) {
          apply_slices(*st.be, st.params.data(), update, c.state_offset, slices, msg.lr,
                       msg.weight_decay, msg.cautious);
          return ack{msg.step};
        }
        using key = std::tuple<float, float, bool>;  // lr, weight decay, cautious; untouched: out
        by_key<key>(
            slices,
            [&](size_t k) -> std::optional<key> {
              const auto& a = msg.params[k];
              return a.touched ? std::optional<key>(key{a.lr, a.weight_decay, a.cautious})
                               : std::nullopt;
            },
            [&](const std::vector<param_slice>& subset, const key& k) {
              apply_slices(*st.be, st.params.data(), update, c.state_offset, subset, std::get<0>(k),
                           std::get<1>(k), std::get<2>(k));
            });
        return ack{msg.step};
      },
      [=](adamw_step& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        auto& st = self->state;
        if (!msg.params.empty() && msg.params.size() != st.adam_slices.size())
          return make_caf_error(errc::shape_mismatch,
                                "adamw_step: " + std::to_string(msg.params.size()) + " entries for "
                                    + std::to_string(st.adam_slices.size()) + " AdamW parameters");
        ++st.adam_steps;
        materialize(self);
        // One call per set of parameters that share their values and step count.
        using key = std::tuple<float, float, float, float, float, int64_t, bool>;
        by_key<key>(
            st.adam_slices,
            [&](size_t k) -> std::optional<key> {
              adamw_param_args a{msg.lr, msg.beta1, msg.beta2, msg.eps, msg.weight_decay, true};
              a.cautious = msg.cautious;
              if (!msg.params.empty())
                a = msg.params[k];
              if (!a.touched)
                return std::nullopt;
              int64_t n = ++st.adam_param_steps[k];
              return key{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, n, a.cautious};
            },
            [&](const std::vector<param_slice>& subset, const key& k) {
              auto [lr, beta1, beta2, eps, wd, n, cautious] = k;
              adamw_args args{lr, beta1, beta2, eps, wd, n};
              args.cautious = cautious;
              st.be->adamw_slices(st.params.data(), st.grads.data(), st.exp_avg.data(),
                                  st.exp_avg_sq.data(), subset, args);
            });
        return ack{msg.step};
      },
      [=](normuon_step& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        const keep_alive held = std::move(msg.full.owner);  // as in accumulate
        if (auto err = normalize_rows(self->state, msg))
          return err;
        return ack{msg.step};
      },
      [=](finish_step& msg) -> caf::result<ack> {
        // Answered once the step's kernels have finished (so that the host's step time is the
        // GPU's), through gpu_done.
        ZMUON_TRACE_RECV(self, msg);
        auto& st = self->state;
        forget_gradient(self);
        st.finishing.push_back(self->make_response_promise<ack>());
        auto promise = st.finishing.back();
        notify_when_done(self, msg.step, gpu_event::step_done);
        return promise;
      },
      [=](gpu_done& msg) { on_gpu_done(self, msg); },
      [=](qk_clip_scale& msg) -> caf::result<ack> { return scale_clipped_heads(self, msg); },
      [=](load_params& msg) -> caf::result<ack> {
        ZMUON_TRACE_RECV(self, msg);
        auto& st = self->state;
        if (!msg.shard || static_cast<int64_t>(msg.shard->size()) != st.params.size())
          return make_caf_error(errc::shape_mismatch,
                                "load_params: rank " + std::to_string(st.rank) + " needs "
                                    + std::to_string(st.params.size()) + " floats");
        st.be->copy_from_host(st.params.data(), msg.shard->data(), st.params.size());
        return ack{msg.step};
      },
      [=](load_state& msg) -> caf::result<ack> {
        auto& st = self->state;
        if (auto err = check_state(st, msg.state.get()))
          return err;
        const rank_state& in = *msg.state;
        auto& be = *st.be;
        be.copy_from_host(st.params.data(), in.params.data(), in.params.size());
        be.copy_from_host(st.momentum.data(), in.momentum.data(), in.momentum.size());
        be.copy_from_host(st.exp_avg.data(), in.exp_avg.data(), in.exp_avg.size());
        be.copy_from_host(st.exp_avg_sq.data(), in.exp_avg_sq.data(), in.exp_avg_sq.size());
        if (in.row_moments.empty())
          be.fill_zero(st.row_moments.data(), st.row_moments.size());
        else
          be.copy_from_host(st.row_moments.data(), in.row_moments.data(), in.row_moments.size());
        be.synchronize();
        st.adam_steps = in.adam_steps;
        if (in.adam_param_steps.empty())
          st.adam_param_steps.assign(st.adam_param_steps.size(), in.adam_steps);
        else
          st.adam_param_steps = in.adam_param_steps;
        forget_gradient(self);
        return ack{msg.step};
      },
      [=](snapshot_atom) -> store_snapshot {
        materialize(self);  // the gradient too: written first where it is only marked zero
        store_snapshot snap = saved_state(self);
        snap.grads = to_host(*self->state.be, self->state.grads);
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
                                            std::shared_ptr<trace::recorder> tracer) {
  return sys.spawn(store_impl, std::move(pl), rank, std::move(backend), std::move(tracer));
}

}  // namespace zmuon
