#include "zmuon/engine.hpp"

#include "engine/impl.hpp"

#include "engine/hand_over.hpp"
#include "engine/job.hpp"
#include "engine/lifecycle.hpp"
#include "engine/registry.hpp"
#include "engine/views.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>

#include "caf/all.hpp"

#include "actors/rank.hpp"
#include "comm/caf_comm.hpp"
#include "kernels/ns_variants.hpp"
#ifdef ZMUON_HAVE_NCCL
#include "comm/nccl_comm.hpp"
#endif
#include "messages/errors.hpp"
#include "messages/registry.hpp"
#include "node/node_setup.hpp"
#include "plan/ownership.hpp"
#include "trace/trace.hpp"

namespace zmuon {

namespace {

error check_options(const engine_options& o) {
  auto bad = [](const std::string& what) { return error{errc::invalid_argument, what}; };
  if (o.world < 1)
    return bad("world must be >= 1, got " + std::to_string(o.world));
  if (o.first_device < 0)
    return bad("zmuon.device must be >= 0, got " + std::to_string(o.first_device));
  if (o.reduce_bucket_size < 1)
    return bad("reduce_bucket_size must be >= 1");
  if (o.gradient_clipping < 0)
    return bad("gradient_clipping must be >= 0 (0 = off)");
  const auto& m = o.muon;
  if (!(m.momentum >= 0 && m.momentum < 1))
    return bad("muon momentum must be in [0, 1)");
  if (auto err = check_ns_options(m.ns, o.compute))
    return err;
  if (!(m.normuon_beta2 >= 0 && m.normuon_beta2 < 1))
    return bad("normuon_beta2 must be in [0, 1)");
  if (!(m.normuon_eps > 0) || !std::isfinite(m.normuon_eps))
    return bad("normuon_eps must be finite and > 0");
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
  if (o.comm != "caf" && o.comm != "nccl")
    return bad("unknown comm backend '" + o.comm + "' (valid: auto, caf, nccl)");
  if (o.comm == "nccl" && o.compute != "cuda")
    return bad("comm backend 'nccl' needs compute backend 'cuda' (got '" + o.compute + "')");
#ifndef ZMUON_HAVE_NCCL
  if (o.comm == "nccl")
    return bad("comm backend 'nccl' is not built in (configure with -DZMUON_CUDA=ON)");
#endif
  if (o.timeout_ms < 1 || o.timeout_ms > kMaxTimeoutMs)
    return bad("timeout_ms must be in [1, " + std::to_string(kMaxTimeoutMs) + "] (30 days), got "
               + std::to_string(o.timeout_ms));
  if (o.max_buckets_in_flight < 0)
    return bad("max_buckets_in_flight must be >= 0 (0 = unbounded), got "
               + std::to_string(o.max_buckets_in_flight));
  if (o.momentum_before_vote != "auto" && o.momentum_before_vote != "on"
      && o.momentum_before_vote != "off")
    return bad("momentum_before_vote must be auto, on or off, got '" + o.momentum_before_vote
               + "'");
  return {};
}

/// `o` with comm "auto" decided (options.hpp): nccl where every rank has a GPU of its own
/// (`own_gpus`) and nccl is built in, caf otherwise. One process: on cuda with a GPU for each
/// rank; a node of a multi-process job: the rendezvous handed out an NCCL id, which it makes for
/// "auto" only when every rank of the job has a GPU no other rank lists.
engine_options with_comm_decided(engine_options o, bool own_gpus) {
  if (o.comm != "auto")
    return o;
  o.comm = "caf";
#ifdef ZMUON_HAVE_NCCL
  if (own_gpus && o.compute == "cuda")
    o.comm = "nccl";
#else
  (void)own_gpus;
#endif
  return o;
}

}  // namespace

// One compute backend per rank. On CUDA, local rank i uses GPU first_device + i modulo the
// visible GPUs (caf comm: several ranks may share one GPU; nccl: one GPU per rank).
expected<std::vector<std::shared_ptr<compute_backend>>> engine_job::make_backends() const {
  const int devices = compute_device_count(opts.compute);
  if (opts.compute == "cuda" && devices > 0 && opts.first_device >= devices)
    return error{errc::invalid_argument, "zmuon.device is " + std::to_string(opts.first_device)
                                             + " but " + std::to_string(devices)
                                             + " GPU(s) are visible (0 to "
                                             + std::to_string(devices - 1) + ")"};
  if (opts.comm == "nccl" && devices < opts.first_device + local)
    return error{errc::invalid_argument,
                 "comm backend 'nccl' needs one GPU per rank: " + std::to_string(local)
                     + " rank(s) in this process from GPU " + std::to_string(opts.first_device)
                     + " but " + std::to_string(devices)
                     + " GPU(s) visible (use comm 'caf' to run several ranks on one GPU)"};
  if (opts.compute == "host")
    share_host_blas_threads(local);
  std::vector<std::shared_ptr<compute_backend>> out;
  for (int i = 0; i < local; ++i) {  // local rank i on GPU i (modulo the visible GPUs)
    auto be =
        make_compute_backend(opts.compute, devices > 0 ? (opts.first_device + i) % devices : 0);
    if (!be)
      return be.err();
    out.push_back(std::move(*be));
  }
  return out;
}

error engine_job::spawn_comms(const std::vector<std::shared_ptr<compute_backend>>& backends) {
  if (!comms.empty()) {  // a node of a multi-process job: the launcher connected its caf comms
    if (opts.comm != "nccl")
      return {};
#ifdef ZMUON_HAVE_NCCL
    // The ranks' collectives run on NCCL; the caf comms stay for the host's own collectives.
    if (nccl_id.empty())
      return {errc::invalid_argument,
              "comm backend 'nccl': the rendezvous handed out no NCCL unique id"};
    auto joined = spawn_nccl_comms(*sys, first_rank, opts.world, nccl_id, backends);
    if (!joined)
      return joined.err();
    rank_comms = std::move(*joined);
    return {};
#endif
  }
  if (opts.comm == "nccl") {
#ifdef ZMUON_HAVE_NCCL
    auto group = spawn_nccl_comm_group(*sys, backends);
    if (!group)
      return group.err();
    comms = std::move(*group);
    return {};
#endif
  }
  (void)backends;  // the caf comm moves host memory and needs no backend
  for (auto& c : spawn_caf_comm_group(*sys, opts.world, traces))
    comms.push_back(c);
  return {};
}

engine::impl::impl()
    : job(std::make_unique<engine_job>()),
      registry(std::make_unique<engine_registry>()),
      hand_over(std::make_unique<engine_hand_over>()),
      lifecycle(std::make_unique<engine_lifecycle>()) {}

engine::impl::~impl() = default;

error engine::impl::configure(const engine_options& o, caf::actor_system* system, int first,
                              int local_ranks, int node) {
  hand_over->open(local_ranks);
  registry->constant_rates(o);
  return job->configure(o, system, first, local_ranks, node);
}

error engine::impl::stop(error err, const std::string& when) {
  return lifecycle->stop(std::move(err), when, job->end.get());
}

engine::engine() : impl_(std::make_unique<impl>()) {}

engine::~engine() {
  if (impl_->job->leave_job)
    impl_->job->leave_job();
  for (auto& r : impl_->job->ranks) {
    if (r.backend)  // a computation still running (after a timeout) ends early: nobody reads it
      r.backend->cancel();
    stop_rank(r);
  }
  for (auto& c : impl_->job->rank_comms)
    caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
  for (auto& c : impl_->job->comms)
    caf::anon_send_exit(c, caf::exit_reason::user_shutdown);
}

expected<std::unique_ptr<engine>> engine::create(const engine_options& options) {
  const engine_options opts = with_comm_decided(
      options, options.compute == "cuda"
                   && compute_device_count("cuda") >= options.first_device + options.world);
  if (auto err = check_options(opts))
    return err;
  if (opts.world > kMaxRanksPerProcess)
    return error{errc::invalid_argument,
                 "a process runs 1 to " + std::to_string(kMaxRanksPerProcess) + " ranks (world is "
                     + std::to_string(opts.world) + ")"};
  if (auto be = make_compute_backend(opts.compute); !be)
    return be.err();
  std::unique_ptr<engine> eng(new engine());
  auto& d = *eng->impl_;
  auto& job = *d.job;
  job.cfg.set("scheduler.max-threads", scheduler_threads(opts.world));
  job.own_sys = std::make_unique<caf::actor_system>(job.cfg);
  if (auto err = d.configure(opts, job.own_sys.get(), 0, opts.world))
    return err;
  return eng;
}

expected<std::unique_ptr<engine>> engine::create(const engine_options& options,
                                                 const node_setup& node) {
  std::unique_ptr<engine> eng(new engine());
  if (auto err = eng->impl_->adopt(options, node))
    return err;
  return eng;
}

error engine::impl::adopt(const engine_options& options, const node_setup& node) {
  engine_options o = with_comm_decided(options, !node.nccl_unique_id.empty());
  if (node.world > 0)
    o.world = node.world;
  if (auto err = check_options(o))
    return err;
  int local_ranks = static_cast<int>(node.comms.size());
  if (!node.system || local_ranks < 1 || node.first_rank < 0
      || node.first_rank + local_ranks > o.world || node.node_first_ranks.empty())
    return {errc::invalid_argument, "node setup: ranks [" + std::to_string(node.first_rank) + ", "
                                        + std::to_string(node.first_rank + local_ranks)
                                        + ") do not fit in world " + std::to_string(o.world)
                                        + " (or no actor system / node table)"};
  if (auto be = make_compute_backend(o.compute); !be)
    return be.err();
  int node_index = static_cast<int>(
      std::find(node.node_first_ranks.begin(), node.node_first_ranks.end(), node.first_rank)
      - node.node_first_ranks.begin());
  if (auto err = configure(o, node.system, node.first_rank, local_ranks, node_index))
    return err;
  job->comms = node.comms;
  job->nccl_id = node.nccl_unique_id;
  job->node_first_ranks = node.node_first_ranks;
  job->end = node.end;
  return {};
}

error engine::impl::start_for(int rank) {
  if (job->join_job)  // a process of a multi-process job knows its ranks once it has joined
    if (auto err = start())
      return err;
  if (auto err = job->check_local(rank))
    return err;
  return start();
}

error engine_job::check_local(int rank) const {
  if (rank >= first_rank && rank < first_rank + local)
    return {};
  return {errc::invalid_argument, "rank " + std::to_string(rank) + " is outside ["
                                      + std::to_string(first_rank) + ", "
                                      + std::to_string(first_rank + local) + ")"};
}

error engine::start() {
  return impl_->start();
}

error engine::impl::start() {
  if (auto err = lifecycle->refusal(job->end.get()))
    return err;
  std::lock_guard<std::mutex> lock(lifecycle->start_mutex);
  return start_locked();
}

error engine::impl::start_locked() {
  auto& job = *this->job;
  auto& reg = *registry;
  auto& hand = *hand_over;
  if (reg.pl)
    return {};
  if (reg.table.empty())
    return {errc::bad_state, "no parameter is registered"};
  if (job.join_job && !job.sys) {  // create_node(): join the job now that the table is known
    auto joined = job.join_job(reg.table);
    if (!joined)
      return joined.err();
    if (auto err = adopt(job.opts, *joined))
      return err;
  }
  auto made = make_plan(reg.table, job.opts.world, job.opts.reduce_bucket_size,
                        job.opts.per_head_muon, job.opts.layout);
  if (!made)
    return made.err();
  for (const auto& f : reg.faults.nonfinite)
    if (made->find(f.param) < 0 || f.rank < 0 || f.rank >= job.opts.world)
      return {errc::invalid_argument, "fault injection names parameter '" + f.param + "' on rank "
                                          + std::to_string(f.rank)
                                          + ", which is not a registered parameter or rank"};
  reg.pl = std::make_shared<const plan>(std::move(*made));
  std::vector<std::pair<int, std::string>> muon_params;
  for (size_t i = 0; i < reg.pl->params.size(); ++i)
    if (reg.pl->params[i].muon)
      muon_params.emplace_back(static_cast<int>(i), reg.pl->params[i].name);
  for (auto& rec : job.traces)
    rec->plan(muon_params, static_cast<int>(reg.pl->chunks.size()));
  // From here on a failure leaves a part-started engine: it stops.
  const std::string starting = "while starting";
  auto backends = job.make_backends();
  if (!backends)
    return stop(backends.err(), starting);
  for (auto& be : *backends)
    be->time_calls(job.time_calls);
  for (size_t i = 0; job.opts.trace_compute_calls && i < job.traces.size(); ++i)  // calls as spans
    (*backends)[i]->trace_calls([rec = job.traces[i]](const compute_backend::traced_call& c) {
      rec->compute(c.name, c.track, c.start_ns, c.end_ns - c.start_ns);
    });
  if (auto err = job.spawn_comms(*backends))
    return stop(err, starting);
  for (int i = 0; i < job.local; ++i) {
    hand.windows.emplace_back(*job.sys, job.first_rank + i, job.opts.timeout_ms,
                              job.traces.empty() ? nullptr : job.traces[i]);
    hand.packed.emplace_back(reg.pl->buckets.size());
  }
  for (int i = 0; i < job.local; ++i)
    job.ranks.push_back(spawn_rank(*job.sys, reg.pl, job.first_rank + i, job.opts,
                                   job.rank_comms.empty() ? job.comms[i] : job.rank_comms[i],
                                   (*backends)[i], job.traces.empty() ? nullptr : job.traces[i]));
  // Each rank's initial shard of every parameter.
  for (int k = 0; k < job.local; ++k) {
    int r = job.first_rank + k;
    auto shard = std::make_shared<std::vector<float>>(reg.pl->shard_total, 0.0f);
    for (size_t i = 0; i < reg.pl->params.size(); ++i) {
      const auto& p = reg.pl->params[i];
      int64_t n = valid_len(p, r);
      if (n > 0 && !reg.init[i].empty())
        std::memcpy(shard->data() + p.shard_offset, reg.init[i].data() + r * p.shard_len,
                    n * sizeof(float));
    }
    auto done = job.ask<ack>(job.ranks[k].store, load_params{0, shard});
    if (!done)
      return stop(done.err(), starting);
  }
  reg.init.clear();
  return {};
}

error engine::impl::copy_in_kept() {
  for (int i = 0; i < job->local; ++i) {
    if (!hand_over->kept[i])  // the rank's buckets all skip the reduce-scatter only if kept:
      continue;               // a packed one may wait on other ranks, which a refusal need not
    if (auto err = hand_over->windows[i].wait_until(0))  // every bucket of it with the store
      return err;
    if (auto done = job->ask<ack>(job->ranks[i].store, copy_in_grads{job->step + 1}); !done)
      return done.err();
    if (auto err =
            on_backend("step", job->first_rank + i, [&] { job->ranks[i].backend->synchronize(); }))
      return err;
    hand_over->kept[i] = 0;
    hand_over->ahead[i] = 0;  // read now: nothing left to withdraw
    hand_over->begun[i] = 0;
  }
  return {};
}

expected<step_info> engine::step() {
  return run_step(std::nullopt);
}

expected<step_info> engine::step(void* cuda_stream) {
  return run_step(cuda_stream);
}

expected<step_info> engine::run_step(std::optional<void*> cuda_stream) {
  auto& d = *impl_;
  auto& job = *d.job;
  auto& hand = *d.hand_over;
  if (auto err = d.start())
    return err;
  std::vector<compute_backend*> backends;
  for (auto& r : job.ranks)
    backends.push_back(r.backend.get());
  const host_call_timer timed(std::move(backends), "step");
  // Refused before the step begins: everything stays as it was, the gradients included, for a
  // step() with good input (those the caller keeps copied in first).
  const auto refused = [&](error err) -> error {
    if (auto kept = d.copy_in_kept())
      return d.stop(kept, engine_lifecycle::in_step(job.step + 1));
    return err;
  };
  for (int i = 0; i < job.local; ++i)
    if (hand.micros[i] != hand.micros[0])
      return refused({errc::bad_state, "rank " + std::to_string(job.first_rank + i)
                                           + " handed over " + std::to_string(hand.micros[i])
                                           + " micro-batches but rank "
                                           + std::to_string(job.first_rank) + " handed over "
                                           + std::to_string(hand.micros[0])});
  if (hand.micros[0] == 0)
    return error{errc::bad_state,
                 "step() before any gradient was handed over (call reduce() "
                 "for every rank first)"};
  // The groups' values are checked before the step begins: a schedule's bad rate is refused.
  auto groups = d.step_groups(job.step + 1);
  if (!groups)
    return refused(groups.err());
  // Gradients handed over ahead of the step are read after the caller's work up to now.
  if (cuda_stream)
    if (auto err = d.check_ahead_stream(*cuda_stream))
      return refused(err);
  if (auto err = d.begin_ahead_reads(cuda_stream))
    return d.stop(err, engine_lifecycle::in_step(job.step + 1));
  // The buckets still in flight land first (the flush would wait for them anyway), so that
  // their buffers are gone before the step's own. A rank whose hand-overs were all kept until
  // the step has no such buffers: its buckets' answers are taken once its request is out, which
  // then does not wait for their trip back (the flush still orders the step after them).
  for (size_t i = 0; i < hand.windows.size(); ++i)
    if (!hand.only_kept[i])
      if (auto err = hand.windows[i].drain())
        return d.stop(err, engine_lifecycle::in_step(job.step + 1));
  uint64_t step = ++job.step;
  job.host_collectives = 0;
  if (job.step_started)
    job.step_started(step);
  if (d.registry->faults.kill_at_step == step)
    std::raise(SIGKILL);  // fault injection: the process dies as this step begins
  auto touched = d.step_touched();
  if (!touched)
    return d.stop(touched.err(), engine_lifecycle::in_step(step));
  step_request req{step, std::move(*groups), std::move(*touched)};
  req.enqueued = cuda_stream.has_value();
  // Every coordinator gets its request before any reply is awaited: the step's collectives
  // need all ranks.
  caf::scoped_actor self{*job.sys};
  using handle = decltype(self->request(job.ranks[0].coordinator, job.timeout(), req));
  std::vector<handle> pending;
  std::vector<int64_t> sent_at;  // traced: when each rank's request went out
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    auto rank_req = req;  // MuonClip: each rank's own logits; the ranks' max is a collective
    rank_req.qk_logits = std::move(hand.qk_logits[i]);
    hand.qk_logits[i].clear();
    sent_at.push_back(trace::now_ns());
    pending.push_back(self->request(job.ranks[i].coordinator, job.timeout(), std::move(rank_req)));
  }
  for (size_t i = 0; i < hand.windows.size(); ++i)
    if (hand.only_kept[i])
      if (auto err = hand.windows[i].drain())
        return d.stop(err, engine_lifecycle::in_step(step));
  std::vector<expected<step_result>> results;
  for (size_t r = 0; r < pending.size(); ++r) {
    auto& h = pending[r];
    expected<step_result> out = error{errc::internal, "no reply"};
    h.receive([&](step_result& res) { out = std::move(res); },
              [&](caf::error& err) { out = job.reply_error(err, "step " + std::to_string(step)); });
    if (!job.traces.empty())
      job.trace_step(static_cast<int>(r), req, trace::request_id(self->id(), h.id()), sent_at[r],
                     out);
    results.push_back(std::move(out));
  }
  std::fill(hand.micros.begin(), hand.micros.end(), 0);
  std::fill(hand.kept.begin(), hand.kept.end(), 0);
  std::fill(hand.only_kept.begin(), hand.only_kept.end(), 1);
  std::fill(hand.ahead.begin(), hand.ahead.end(), 0);
  std::fill(hand.begun.begin(), hand.begun.end(), 0);
  step_info info;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r])
      return d.stop(error{results[r].err().code(), "rank " + std::to_string(job.first_rank + r)
                                                       + ": " + results[r].err().message()},
                    engine_lifecycle::in_step(step));
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
      return d.stop(error{errc::internal, "ranks disagree on step " + std::to_string(step)},
                    engine_lifecycle::in_step(step));
    }
    info.ns_params += res.ns_params;
    info.ns_matrices += res.ns_matrices;
  }
  job.skipped_steps += info.skipped ? 1 : 0;
  // The caller's later work after the step's, on the device (the step answered on enqueue).
  for (int i = 0; cuda_stream && i < job.local; ++i)
    if (auto err = on_backend("step", job.first_rank + i,
                              [&] { job.ranks[i].backend->make_stream_wait(*cuda_stream); }))
      return d.stop(err, engine_lifecycle::in_step(step));
  return info;
}

expected<rank_state> engine::snapshot(int rank) {
  auto& d = *impl_;
  auto& job = *d.job;
  auto& hand = *d.hand_over;
  if (auto err = d.start_for(rank))
    return err;
  // The copy holds every bucket handed over so far: the rank's unlanded ones land first.
  if (auto err = hand.windows[rank - job.first_rank].wait_until(0))
    return err;
  return job.ask<rank_state>(job.ranks[rank - job.first_rank].store, snapshot_atom::value);
}

expected<float> engine::loss_scale() {
  auto& d = *impl_;
  auto& job = *d.job;
  if (auto err = d.start())
    return err;
  return job.ask<float>(job.ranks[0].scaler, scale_atom::value);
}

std::array<float, 2> engine::next_lrs() const {
  const auto& job = *impl_->job;
  const auto& reg = *impl_->registry;
  const uint64_t next = job.step + 1;
  // A node's engine sets its schedules when it joins the job: until then, the options' rates.
  return {reg.muon_lr ? reg.muon_lr(next) : job.opts.muon.lr,
          reg.adam_lr ? reg.adam_lr(next) : job.opts.adamw.lr};
}

uint64_t engine::skipped_steps() const {
  return impl_->job->skipped_steps;
}

void engine::set_lr_schedules(lr_schedule muon_lr, lr_schedule adam_lr) {
  if (muon_lr)
    impl_->registry->muon_lr = std::move(muon_lr);
  if (adam_lr)
    impl_->registry->adam_lr = std::move(adam_lr);
}

int engine::world() const {
  return impl_->job->opts.world;
}

int engine::first_rank() const {
  return impl_->job->first_rank;
}

int engine::local_ranks() const {
  return impl_->job->local;
}

const plan* engine::layout() const {
  return impl_->registry->pl.get();
}

const engine_options& engine::options() const {
  return impl_->job->opts;
}

}  // namespace zmuon
