#include "zmuon/engine.hpp"

#include <chrono>
#include <csignal>
#include <cstring>

#include <nlohmann/json.hpp>

#include "caf/all.hpp"

#include "actors/rank.hpp"
#include "checkpoint/checkpoint.hpp"
#include "comm/caf_comm.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"
#include "plan/ownership.hpp"

namespace zmuon {

namespace {

struct engine_config : caf::actor_system_config {
  engine_config() {
    register_messages(*this);
    set("logger.verbosity", caf::atom("quiet"));
  }
};

error check_options(const engine_options& o) {
  auto bad = [](const std::string& what) { return error{errc::invalid_argument, what}; };
  if (o.world < 1)
    return bad("world must be >= 1, got " + std::to_string(o.world));
  if (o.reduce_bucket_size < 1)
    return bad("reduce_bucket_size must be >= 1");
  if (o.gradient_clipping < 0)
    return bad("gradient_clipping must be >= 0 (0 = off)");
  const auto& m = o.muon;
  if (!(m.momentum >= 0 && m.momentum < 1))
    return bad("muon momentum must be in [0, 1)");
  if (m.ns.steps < 1)
    return bad("ns_steps must be >= 1");
  if (!m.ns.schedule.empty() && static_cast<int>(m.ns.schedule.size()) != m.ns.steps)
    return bad("ns coefficient schedule has " + std::to_string(m.ns.schedule.size())
               + " entries but ns_steps is " + std::to_string(m.ns.steps));
  const auto& a = o.adamw;
  if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1))
    return bad("adamw betas must be in [0, 1)");
  if (!(a.eps > 0))
    return bad("adamw eps must be > 0");
  const auto& f = o.fp16;
  if (f.enabled && f.loss_scale <= 0 && f.loss_scale_window < 1)
    return bad("fp16 loss_scale_window must be >= 1");
  if (f.enabled && !(f.min_loss_scale > 0))
    return bad("fp16 min_loss_scale must be > 0");
  if (o.comm != "caf")
    return bad("comm backend '" + o.comm + "' is not available in-process (use caf)");
  if (o.timeout_ms < 1)
    return bad("timeout_ms must be >= 1");
  return {};
}

/// Fault injection: poison element 0 of a parameter's gradient (it lives in rank 0's part of the
/// bucket's rank-major staging).
void inject_nonfinite(const fault_options& faults, const plan& pl, const bucket_layout& bucket,
                      uint64_t step, int rank, int micro, std::vector<float>& staging) {
  for (const auto& f : faults.nonfinite) {
    if (f.step != step || f.rank != rank || f.micro != micro)
      continue;
    int i = pl.find(f.param);
    if (i >= bucket.first_param && i < bucket.end_param)
      staging[pl.params[i].shard_offset - bucket.shard_offset] = f.value;
  }
}

}  // namespace

struct engine::impl {
  engine_options opts;
  engine_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::vector<param_spec> table;
  std::vector<std::vector<float>> init;
  std::shared_ptr<const plan> pl;
  std::vector<caf_comm_actor> comms;
  std::vector<rank_actors> ranks;
  std::vector<int> micros;  // micro-batches handed over per rank in the open step
  uint64_t step = 0;        // last step number issued
  lr_schedule muon_lr;
  lr_schedule adam_lr;

  caf::duration timeout() const {
    return caf::duration{std::chrono::milliseconds(opts.timeout_ms)};
  }

  // Blocking request from the host thread; errors come back as zmuon::error.
  template <class Reply, class Handle, class Msg>
  expected<Reply> ask(const Handle& h, Msg msg) {
    caf::scoped_actor self{*sys};
    expected<Reply> out = error{errc::internal, "no reply"};
    self->request(h, timeout(), std::move(msg))
        .receive([&](Reply& r) { out = std::move(r); },
                 [&](caf::error& err) { out = from_caf_error(err); });
    return out;
  }

  error start();
};

engine::engine() : impl_(std::make_unique<impl>()) {}

engine::~engine() {
  for (auto& r : impl_->ranks)
    stop_rank(r);
  for (auto& c : impl_->comms)
    caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
}

expected<std::unique_ptr<engine>> engine::create(const engine_options& opts) {
  if (auto err = check_options(opts))
    return err;
  if (auto be = make_compute_backend(opts.compute); !be)
    return be.err();
  std::unique_ptr<engine> eng(new engine());
  eng->impl_->opts = opts;
  eng->impl_->sys = std::make_unique<caf::actor_system>(eng->impl_->cfg);
  eng->impl_->micros.assign(opts.world, 0);
  float muon_lr = opts.muon.lr;
  float adam_lr = opts.adamw.lr;
  eng->impl_->muon_lr = [muon_lr](uint64_t) { return muon_lr; };
  eng->impl_->adam_lr = [adam_lr](uint64_t) { return adam_lr; };
  return eng;
}

error engine::add_parameter(const param_spec& spec, const std::vector<float>& init) {
  auto& d = *impl_;
  if (d.pl)
    return {errc::bad_state,
            "parameter '" + spec.name + "' registered after the first reduce() or step()"};
  std::vector<param_spec> probe = d.table;
  probe.push_back(spec);
  auto checked = make_plan(probe, d.opts.world, d.opts.reduce_bucket_size, d.opts.per_head_muon);
  if (!checked)
    return checked.err();
  const auto& p = checked->params.back();
  if (!init.empty() && static_cast<int64_t>(init.size()) != p.numel)
    return {errc::shape_mismatch, "initial values of '" + spec.name + "' have "
                                      + std::to_string(init.size()) + " elements, shape needs "
                                      + std::to_string(p.numel)};
  d.table.push_back(spec);
  d.init.push_back(init.empty() ? std::vector<float>(p.numel, 0.0f) : init);
  return {};
}

error engine::impl::start() {
  if (pl)
    return {};
  if (table.empty())
    return {errc::bad_state, "no parameter is registered"};
  auto made = make_plan(table, opts.world, opts.reduce_bucket_size, opts.per_head_muon);
  if (!made)
    return made.err();
  for (const auto& f : opts.faults.nonfinite)
    if (made->find(f.param) < 0 || f.rank < 0 || f.rank >= opts.world)
      return {errc::invalid_argument, "fault injection names parameter '" + f.param + "' on rank "
                                          + std::to_string(f.rank)
                                          + ", which is not a registered parameter or rank"};
  pl = std::make_shared<const plan>(std::move(*made));
  comms = spawn_caf_comm_group(*sys, opts.world);
  for (int r = 0; r < opts.world; ++r) {
    auto spawned = spawn_rank(*sys, pl, r, opts, comms[r]);
    if (!spawned)
      return spawned.err();
    ranks.push_back(std::move(*spawned));
  }
  // Each rank's initial shard of every parameter.
  for (int r = 0; r < opts.world; ++r) {
    auto shard = std::make_shared<std::vector<float>>(pl->shard_total, 0.0f);
    for (size_t i = 0; i < pl->params.size(); ++i) {
      const auto& p = pl->params[i];
      int64_t n = valid_len(p, r);
      if (n > 0)
        std::memcpy(shard->data() + p.shard_offset, init[i].data() + r * p.shard_len,
                    n * sizeof(float));
    }
    auto done = ask<ack>(ranks[r].store, load_params{0, shard});
    if (!done)
      return done.err();
  }
  init.clear();
  return {};
}

error engine::reduce(int rank, const tensor_map& grads) {
  auto& d = *impl_;
  if (rank < 0 || rank >= d.opts.world)
    return {errc::invalid_argument, "rank " + std::to_string(rank) + " is outside [0, "
                                        + std::to_string(d.opts.world) + ")"};
  if (auto err = d.start())
    return err;
  const auto& pl = *d.pl;
  for (const auto& [name, data] : grads) {  // check everything before anything is sent
    int i = pl.find(name);
    if (i < 0)
      return {errc::unknown_parameter,
              "gradient for '" + name + "', which is not a registered parameter"};
    if (static_cast<int64_t>(data.size()) != pl.params[i].numel)
      return {errc::shape_mismatch, "gradient of '" + name + "' has " + std::to_string(data.size())
                                        + " elements, expected "
                                        + std::to_string(pl.params[i].numel)};
  }
  int micro = d.micros[rank]++;
  uint64_t step = d.step + 1;
  for (size_t b = 0; b < pl.buckets.size(); ++b) {
    const auto& bucket = pl.buckets[b];
    // Rank-major packing: rank q's part holds shard q of every parameter of the bucket.
    auto staging = std::make_shared<std::vector<float>>(bucket.shard_len * pl.world, 0.0f);
    for (int i = bucket.first_param; i < bucket.end_param; ++i) {
      const auto& p = pl.params[i];
      auto it = grads.find(p.name);
      if (it == grads.end())
        continue;
      for (int q = 0; q < pl.world; ++q) {
        int64_t n = valid_len(p, q);
        if (n > 0)
          std::memcpy(
              staging->data() + q * bucket.shard_len + (p.shard_offset - bucket.shard_offset),
              it->second.data() + q * p.shard_len, n * sizeof(float));
      }
    }
    inject_nonfinite(d.opts.faults, pl, bucket, step, rank, micro, *staging);
    caf::anon_send(d.ranks[rank].reducer,
                   micro_grads{step, micro, static_cast<int32_t>(b), std::move(staging)});
  }
  return {};
}

expected<step_info> engine::step() {
  auto& d = *impl_;
  if (auto err = d.start())
    return err;
  for (int r = 0; r < d.opts.world; ++r)
    if (d.micros[r] != d.micros[0])
      return error{errc::bad_state,
                   "rank " + std::to_string(r) + " handed over " + std::to_string(d.micros[r])
                       + " micro-batches but rank 0 handed over " + std::to_string(d.micros[0])};
  if (d.micros[0] == 0)
    return error{errc::bad_state,
                 "step() before any gradient was handed over (call reduce() "
                 "for every rank first)"};
  uint64_t step = ++d.step;
  if (d.opts.faults.kill_at_step == step)
    std::raise(SIGKILL);  // fault injection: the process dies as this step begins
  step_request req{step, d.muon_lr(step), d.adam_lr(step)};
  // Every coordinator gets its request before any reply is awaited: the step's collectives
  // need all ranks.
  caf::scoped_actor self{*d.sys};
  using handle = decltype(self->request(d.ranks[0].coordinator, d.timeout(), req));
  std::vector<handle> pending;
  for (auto& r : d.ranks)
    pending.push_back(self->request(r.coordinator, d.timeout(), req));
  std::vector<expected<step_result>> results;
  for (auto& h : pending) {
    expected<step_result> out = error{errc::internal, "no reply"};
    h.receive([&](step_result& res) { out = std::move(res); },
              [&](caf::error& err) { out = from_caf_error(err); });
    results.push_back(std::move(out));
  }
  std::fill(d.micros.begin(), d.micros.end(), 0);
  step_info info;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r])
      return error{results[r].err().code(),
                   "rank " + std::to_string(r) + ": " + results[r].err().message()};
    const auto& res = *results[r];
    if (r == 0) {
      info.step = res.step;
      info.skipped = res.skipped;
      info.grad_norm = res.grad_norm;
      info.clip_coef = res.clip_coef;
      info.loss_scale = res.loss_scale;
      info.next_loss_scale = res.next_loss_scale;
      info.micro_batches = res.micros;
    } else if (res.skipped != info.skipped || res.next_loss_scale != info.next_loss_scale) {
      return error{errc::internal, "ranks disagree on step " + std::to_string(step)};
    }
    info.ns_params += res.ns_params;
    info.ns_matrices += res.ns_matrices;
  }
  return info;
}

expected<rank_state> engine::snapshot(int rank) {
  auto& d = *impl_;
  if (rank < 0 || rank >= d.opts.world)
    return error{errc::invalid_argument, "rank " + std::to_string(rank) + " is outside [0, "
                                             + std::to_string(d.opts.world) + ")"};
  if (auto err = d.start())
    return err;
  return d.ask<rank_state>(d.ranks[rank].store, snapshot_atom::value);
}

expected<tensor_map> engine::parameters() {
  auto& d = *impl_;
  if (auto err = d.start())
    return err;
  const auto& pl = *d.pl;
  tensor_map out;
  for (const auto& p : pl.params)
    out[p.name].resize(p.numel);
  for (int r = 0; r < pl.world; ++r) {
    auto shard = d.ask<std::vector<float>>(d.ranks[r].store, params_atom::value);
    if (!shard)
      return shard.err();
    for (const auto& p : pl.params) {
      int64_t n = valid_len(p, r);
      if (n > 0)
        std::memcpy(out[p.name].data() + r * p.shard_len, shard->data() + p.shard_offset,
                    n * sizeof(float));
    }
  }
  return out;
}

error engine::save_checkpoint(const std::string& dir, const std::string& config_json) {
  auto& d = *impl_;
  if (auto err = d.start())
    return err;
  if (d.micros[0] != 0)
    return {errc::bad_state, "save_checkpoint with micro-batches of step "
                                 + std::to_string(d.step + 1)
                                 + " handed over (save between steps)"};
  checkpoint_manifest meta;
  meta.config = nlohmann::json::parse(config_json, nullptr, false);
  if (meta.config.is_discarded())
    return {errc::invalid_argument, "save_checkpoint: the config is not valid JSON"};
  meta.step = d.step;
  std::vector<rank_state> states;
  for (int r = 0; r < d.opts.world; ++r) {
    auto st = d.ask<rank_state>(d.ranks[r].store, snapshot_atom::value);
    if (!st)
      return st.err();
    auto sc = d.ask<loss_scale_snapshot>(d.ranks[r].scaler, scaler_state_atom::value);
    if (!sc)
      return sc.err();
    if (r == 0) {
      meta.adam_steps = st->adam_steps;
      meta.scaler = *sc;
    } else if (st->adam_steps != meta.adam_steps || sc->scale != meta.scaler.scale
               || sc->iter != meta.scaler.iter) {
      return {errc::internal, "rank " + std::to_string(r) + " disagrees with rank 0 on the AdamW "
                                  "step count or the loss scale"};
    }
    states.push_back(std::move(*st));
  }
  const auto& f = d.opts.faults;
  after_shard_file hook;
  if (f.kill_in_save_at_step != 0 && f.kill_in_save_at_step == d.step)
    hook = [after = f.kill_in_save_after_files](int written) {
      if (written >= after)
        std::raise(SIGKILL);  // fault injection: the process dies in the middle of the save
    };
  auto written = write_checkpoint(dir, *d.pl, states, std::move(meta), hook);
  return written ? error{} : written.err();
}

expected<checkpoint_info> engine::load_checkpoint(const std::string& dir) {
  auto& d = *impl_;
  if (auto err = d.start())
    return err;
  if (d.micros[0] != 0)
    return error{errc::bad_state, "load_checkpoint with micro-batches of step "
                                      + std::to_string(d.step + 1) + " handed over"};
  auto loaded = read_checkpoint(dir, *d.pl);
  if (!loaded)
    return loaded.err();
  const auto& m = loaded->manifest;
  for (int r = 0; r < d.opts.world; ++r) {
    auto state = std::make_shared<const rank_state>(std::move(loaded->states[r]));
    if (auto done = d.ask<ack>(d.ranks[r].store, load_state{m.step, state}); !done)
      return done.err();
    if (auto done = d.ask<ack>(d.ranks[r].scaler, restore_scaler{m.step, m.scaler}); !done)
      return done.err();
  }
  d.step = m.step;
  return checkpoint_info{loaded->path, m.step, m.world, m.config.dump()};
}

uint64_t engine::last_step() const {
  return impl_->step;
}

expected<float> engine::loss_scale() {
  auto& d = *impl_;
  if (auto err = d.start())
    return err;
  return d.ask<float>(d.ranks[0].scaler, scale_atom::value);
}

void engine::set_lr_schedules(lr_schedule muon_lr, lr_schedule adam_lr) {
  if (muon_lr)
    impl_->muon_lr = std::move(muon_lr);
  if (adam_lr)
    impl_->adam_lr = std::move(adam_lr);
}

int engine::world() const {
  return impl_->opts.world;
}

const plan* engine::layout() const {
  return impl_->pl.get();
}

const engine_options& engine::options() const {
  return impl_->opts;
}

}  // namespace zmuon
