#include "actors/muon_coordinator.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "caf/all.hpp"

#include "actors/qk_clip.hpp"
#include "actors/staging.hpp"
#include "messages/errors.hpp"
#include "plan/ownership.hpp"
#include "trace/trace.hpp"

namespace zmuon {

bool momentum_may_precede_vote(const engine_options& opts, const plan& pl) {
  const bool on = opts.momentum_before_vote == "on"
                  || (opts.momentum_before_vote == "auto" && opts.compute == "cuda");
  return on && pl.world == 1 && !pl.chunks.empty() && opts.gradient_clipping <= 0
         && !opts.fp16.enabled;
}

wire_type muon_wire_type(const engine_options& opts) {
  switch (opts.muon.transport) {
    case muon_transport::bf16:
      return wire_type::bf16;
    case muon_transport::fp32:
      return wire_type::fp32;
    case muon_transport::automatic:
      break;
  }
  return opts.compute == "cuda" ? wire_type::bf16 : wire_type::fp32;
}

namespace {

// One Muon chunk moving through the pipeline.
struct chunk_work {
  enum phase {
    idle,
    momentum_requested,
    momentum_done,
    gather_issued,
    ns_done,
    scatter_issued,
    applied
  };
  phase at = idle;
  wire_buffer u;       // this rank's shards of u (chunk.shard_len)
  wire_buffer full;    // whole matrices this rank owns (ownership.full_size)
  wire_buffer result;  // this rank's shards of the update (chunk.shard_len)
};

// A slot in the fixed collective order G0 G1 S0 G2 S1 ...: the same on every rank.
struct slot {
  bool gather = true;
  int chunk = 0;
};

// The fixed order over n chunks.
std::vector<slot> collective_order(int n) {
  std::vector<slot> order;
  for (int c = 0; c < n; ++c) {
    order.push_back(slot{true, c});
    if (c > 0)
      order.push_back(slot{false, c - 1});
  }
  if (n > 0)
    order.push_back(slot{false, n - 1});
  return order;
}

// The chunks whose momentum is asked for before the first scatter, which waits for the vote:
// [0, this) go ahead of it in a step whose momentum does.
int32_t chunks_before_the_vote(int n) {
  int32_t gathers = 0;
  for (const slot& s : collective_order(n)) {
    if (!s.gather)
      break;
    ++gathers;
  }
  return gathers;
}

struct step_work {
  step_request req;
  // The step's values, resolved once (unscale_clip carries them to the store), and each group's
  // Muon rule derived from them.
  std::shared_ptr<const std::vector<group_hparams>> groups;
  std::vector<muon_rule> rules;
  std::vector<uint8_t> touched;  // per parameter; empty: every parameter touched
  caf::typed_response_promise<step_result> promise;
  step_result result;
  std::vector<chunk_work> chunks;
  std::vector<slot> order;
  size_t next_slot = 0;
  size_t applied = 0;
  enum { unsent, sent, done } scalar = unsent;  // 5., sent beside the last chunk's NS
  int64_t ns_before = 0;
  // The vote, where the chunks' momentum runs ahead of it (ahead_of_vote: `ahead`, and every
  // chunk's new momentum goes to the store's spare): until `passed` no request writes the
  // step's state (the scatter, the non-Muon rule); `refused` lets the momentum requests in
  // flight land, then refuses the step.
  bool ahead = false;
  enum class vote_state { passed, pending, refused } vote = vote_state::passed;
  int ahead_in_flight = 0;  // momentum requests of an ahead step not yet answered
};

struct coordinator_state {
  std::shared_ptr<const plan> pl;
  int rank = 0;
  engine_options opts;
  coordinator_peers peers;
  std::shared_ptr<compute_backend> be;
  bool comm_on_host = true;          // the comm backend moves host memory (staged_buffer)
  wire_type wire = wire_type::fp32;  // what the gather and the scatter carry
  group_hparams defaults;  // the options' values, for a group the step request does not list
  int group_count = 1;     // the plan's hyperparameter groups
  std::vector<chunk_ownership> own;
  std::vector<bool> padded;    // per chunk: this rank's shards have padding (the scatter skips it)
  std::vector<bool> in_place;  // per chunk: u is laid out as the owner's buffer (world 1): no
                               // gather and no scatter (laid_out_as_shard)
  bool momentum_before_vote = false;  // momentum_may_precede_vote, decided once
  std::optional<step_work> work;      // the step in progress
  device_buffer bf16_scratch;         // rescale_bf16_blocks' fp32 copy of one block (kept)
  device_buffer box_scratch;          // reorder_boxes' copy of one matrix (kept)
  trace::track tr;
  static const char* name;
};
const char* coordinator_state::name = "muon_coordinator";

using coord_pointer = muon_coordinator_actor::stateful_pointer<coordinator_state>;

// True while `step` is still the step in progress (a failed step drops late replies).
bool current(coord_pointer self, uint64_t step) {
  return self->state.work && self->state.work->req.step == step;
}

void fail_step(coord_pointer self, caf::error err) {
  auto& st = self->state;
  if (!st.work)
    return;
  st.work->promise.deliver(std::move(err));
  st.work.reset();
}

// Runs `then` with the reply of `req` to `dest`, unless the step failed meanwhile.
template <class Reply, class Dest, class Req, class F>
void ask(coord_pointer self, const Dest& dest, Req req, F then) {
  uint64_t step = self->state.work->req.step;
  trace::request(self, self->state.tr, dest, std::move(req))
      .then(
          [=](Reply& reply) mutable {
            if (current(self, step))
              then(reply);
          },
          [=](caf::error& err) {
            if (current(self, step))
              fail_step(self, std::move(err));
          });
}

std::vector<std::vector<segment>> per_rank(int world) {
  return std::vector<std::vector<segment>>(world);
}

void add_segment(std::vector<segment>& list, wire_buffer& buf, int64_t offset, int64_t size) {
  if (size > 0)
    list.push_back(buf.at(offset, size));
}

void advance(coord_pointer self);

// Buffer work of chunk c (allocation, staging copies, release): backend calls, recorded as a
// `buffers` span so that bench/step does not count them as actor plumbing.
template <class F>
void buffers(coord_pointer self, int c, F f) {
  trace::span s(self->state.tr, "buffers",
                trace::stepped("buffers", self->state.work->req.step, -1, c));
  f();
}

// A chunk's GPU work (and its copy to the host mirror) has finished: the chunk moves on.
void on_gpu_done(coord_pointer self, const gpu_done& msg) {
  if (!current(self, msg.step))
    return;
  auto& cw = self->state.work->chunks[msg.index];
  cw.at = msg.what == gpu_event::u_on_host ? chunk_work::momentum_done : chunk_work::ns_done;
  advance(self);
}

// Continues with on_gpu_done once the work enqueued so far has finished: through the backend's
// completion callback when the comm needs the result in host memory (`wait`), else at once (the
// comm's work is ordered after it on the rank's stream, or everything already ran on the host).
void after_gpu(coord_pointer self, gpu_event what, int chunk, bool wait) {
  gpu_done msg{self->state.work->req.step, what, chunk};
  if (!wait) {
    on_gpu_done(self, msg);
    return;
  }
  auto handle = caf::actor_cast<muon_coordinator_actor>(self);
  self->state.be->when_done([handle, msg] { caf::anon_send(handle, msg); });
}

// -- the step's values ---------------------------------------------------------------------------

/// The step's group table: the request's values, the options' for a group it does not list.
std::shared_ptr<const std::vector<group_hparams>> resolve_groups(const coordinator_state& st,
                                                                 const step_request& req) {
  auto out = std::make_shared<std::vector<group_hparams>>(st.group_count, st.defaults);
  for (size_t g = 0; g < req.groups.size() && g < out->size(); ++g)
    (*out)[g] = req.groups[g];
  return out;
}

/// The request's touched mask, one flag per parameter (a parameter beyond it untouched).
std::vector<uint8_t> resolve_touched(const coordinator_state& st, const step_request& req) {
  if (req.touched.empty())
    return {};
  std::vector<uint8_t> out(st.pl->params.size(), 0);
  std::copy_n(req.touched.begin(), std::min(req.touched.size(), out.size()), out.begin());
  return out;
}

/// The step's Muon rule of group g.
const muon_rule& rule_of(const coordinator_state& st, int g) {
  return st.work->rules[g];
}

const muon_rule& rule_of_param(const coordinator_state& st, int param) {
  return rule_of(st, st.pl->params[param].hparam_group);
}

bool touched(const coordinator_state& st, int param) {
  const auto& mask = st.work->touched;
  return mask.empty() || mask[param] != 0;
}

/// Whether chunk c has a parameter the step touches, whose rule has a transform after NS
/// (NorMuon), with a block this rank owns (the store then transforms it).
bool transform_due(const coordinator_state& st, int c) {
  for (const auto& o : st.own[c].owned)
    if (rule_of_param(st, o.param).transforms() && touched(st, o.param))
      return true;
  return false;
}

// -- what the plan says of chunk c on this rank
// ----------------------------------------------------

// Calls f(owner, offset in the chunk's shard buffer, n) for this rank's shard of every NS block
// of chunk c, in table and row order: what the gather sends and the scatter receives.
template <class F>
void for_shard_parts(const coordinator_state& st, int c, F f) {
  const auto& pl = *st.pl;
  const auto& chunk = pl.chunks[c];
  for (int i : chunk.params) {
    const auto& p = pl.params[i];
    const int64_t base =
        p.state_offset - chunk.state_offset - static_cast<int64_t>(st.rank) * p.shard_len;
    for (const auto& b : p.blocks) {
      auto [begin, end] = block_elements(p, b);
      auto [first, last] = shard_part(p, st.rank, begin, end);
      f(b.owner, base + first, last - first);
    }
  }
}

// Calls f(rank q, offset in the owner's full buffer, n) for every rank's shard part of every
// block this rank owns in chunk c, block by block (table and row order), q ascending.
template <class F>
void for_owned_parts(const coordinator_state& st, int c, F f) {
  const auto& pl = *st.pl;
  for (const auto& m : st.own[c].owned) {
    const auto& p = pl.params[m.param];
    auto [begin, end] = block_elements(p, p.blocks[m.block]);
    for (int q = 0; q < pl.world; ++q) {
      auto [first, last] = shard_part(p, q, begin, end);
      f(q, m.full_offset + (first - begin), last - first);
    }
  }
}

// At world 1 this rank owns every block; where each block sits in the owner's buffer where it
// sits in this rank's shard (the plan orders the Muon state as the owner lays out its blocks),
// momentum's u is already the owner's buffer, and the owner's result already this rank's shards
// of the update: the gather and the scatter would copy each element to where it is.
bool laid_out_as_shard(const coordinator_state& st, int c) {
  if (st.pl->world != 1 || st.padded[c] || st.own[c].full_size != st.pl->chunks[c].shard_len)
    return false;
  std::vector<std::pair<int64_t, int64_t>> shard, full;
  for_shard_parts(st, c, [&](int, int64_t at, int64_t n) { shard.emplace_back(at, n); });
  for_owned_parts(st, c, [&](int, int64_t at, int64_t n) { full.emplace_back(at, n); });
  return shard == full;
}

// Under bf16 the receivers scale each parameter by its first block's scale; a block whose own
// scale differs (unequal split sizes) is multiplied here by the ratio, in fp32, then rounded
// back to bf16 (once more than the other blocks).
void rescale_bf16_blocks(coordinator_state& st, int c, uint16_t* full) {
  const auto& pl = *st.pl;
  device_buffer& tmp = st.bf16_scratch;
  for (const auto& m : st.own[c].owned) {
    const auto& p = pl.params[m.param];
    const muon_rule& rule = rule_of_param(st, m.param);
    const auto& b = p.blocks[m.block];
    const auto& b0 = p.blocks.front();
    const float ratio =
        rule.scale(b.rows / b.heads, p.cols) / rule.scale(b0.rows / b0.heads, p.cols);
    if (ratio == 1.0f)
      continue;
    const int64_t n = b.rows * p.cols;
    if (tmp.size() < n)
      tmp = st.be->allocate_for_overwrite(n);
    st.be->from_bf16(tmp.data(), full + m.full_offset, n);
    st.be->scale(tmp.data(), n, ratio);
    st.be->to_bf16(full + m.full_offset, tmp.data(), n);
  }
}

// A matrix the host holds in boxes (param_layout::boxes) arrives in their order and leaves in
// it; Newton-Schulz and NorMuon's rows run on it in row-major order, which this puts it in
// (to_boxes false) and takes it out of, through a copy of the matrix.
void reorder_boxes(coordinator_state& st, int c, const float_view& full, bool to_boxes) {
  const auto& pl = *st.pl;
  for (const auto& m : st.own[c].owned) {
    const auto& p = pl.params[m.param];
    if (p.boxes.empty())
      continue;
    const int elem = full.bf16 != nullptr ? 2 : 4;
    void* x = full.bf16 != nullptr ? static_cast<void*>(full.bf16 + m.full_offset)
                                   : static_cast<void*>(full.data + m.full_offset);
    const int64_t floats = (p.numel * elem + 3) / 4;
    if (st.box_scratch.size() < floats)
      st.box_scratch = st.be->allocate_for_overwrite(floats);
    const std::vector<matrix_box> whole{{0, p.rows, 0, p.cols}};
    st.be->copy_boxes(st.box_scratch.data(), x, p.cols, p.boxes, elem, to_boxes);
    st.be->copy_boxes(x, st.box_scratch.data(), p.cols, whole, elem, false);
  }
}

// -- MuonClip: the heads to clip ----------------------------------------------------------------

bool qk_clip_on(const coordinator_state& st) {
  for (const auto& pair : st.pl->qk_pairs)
    if (rule_of_param(st, pair.query).qk_clip_tau > 0)
      return true;
  return false;
}

// -- the step, top-down -----------------------------------------------------------------------
// Each function is one sub-step of docs/DESIGN.md §1 and hands over to the next.

void begin_step(coord_pointer self);                       // 1. flush
void vote(coord_pointer self);                             // 2. the vote
void refuse(coord_pointer self);                           //   a refused step's end
void unscale(coord_pointer self, double sum_squares);      // 3. unscale_clip
void vote_passed(coord_pointer self, double sum_squares);  // 2-3 with the momentum ahead
void run_muon(coord_pointer self);                         // 4
void advance(coord_pointer self);                          //   the fixed collective order
void request_momentum(coord_pointer self, int c);          //   momentum (store)
void gather(coord_pointer self, int c);                    //   gather u to the owners
void orthogonalize(coord_pointer self, int c);             //   Newton-Schulz on the owner
void transform_in_store(coord_pointer self, int c);        //   NorMuon (store)
void ns_finished(coord_pointer self, int c);               //   the update off to the comm
void scatter(coord_pointer self, int c);                   //   scatter the update
void apply(coord_pointer self, int c);                     //   apply (store)
void scalar_rule(coord_pointer self);                      // 5
void finish(coord_pointer self);                           // 6
void answer(coord_pointer self);                           // 7
template <class Then>
void clip_qk(coord_pointer self, Then then);

// -- 1-3. flush, the vote, unscale_clip -----------------------------------------------------------

// 1. flush: every bucket of the step in the store.
void begin_step(coord_pointer self) {
  auto step = self->state.work->req.step;
  ask<flush_done>(self, self->state.peers.reducer, flush{step}, [=](flush_done& fd) {
    if (fd.micros == 0) {
      fail_step(self, make_caf_error(errc::bad_state,
                                     "step " + std::to_string(step)
                                         + ": no gradient was handed over since the last step"));
      return;
    }
    self->state.work->result.micros = fd.micros;
    vote(self);
  });
}

// The factor that takes the step's summed gradient to its mean, unscaled.
double unscale_of(const step_result& r) {
  return 1.0 / (static_cast<double>(r.loss_scale) * r.micros);
}

// Whether this step's Muon chunks may start before the vote answers (momentum_before_vote: at
// world 1, where the chunks need no collective, with no clipping and no fp16): a step that only
// a non-finite gradient can refuse, whose unscale factor is 1 (one micro-batch, no loss scale:
// unscale_clip changes no gradient the vote's scan may still read), and whose momentum nothing
// but the store's momentum call writes (no NorMuon transform). Its vote's scan then takes the
// Muon gradients' scan from the momentum calls of the chunks asked for before the vote
// (check_overflow's chunks_ahead).
bool ahead_of_vote(const coordinator_state& st) {
  if (!st.momentum_before_vote || st.work->result.micros != 1)
    return false;
  for (int c = 0; c < static_cast<int>(st.pl->chunks.size()); ++c)
    if (!st.in_place[c] || transform_due(st, c))
      return false;
  return true;
}

// 2. The vote: overflow and the gradient's sum of squares from one all-reduce. Overflow ends
// the step: the gradient discarded, the answer `skipped`. Where the chunks may go ahead of it,
// unscale_clip and the chunks' u and Newton-Schulz go out at once, and the vote's answer then
// lets the state be written (vote_passed) or refuses the step once they have landed.
void vote(coord_pointer self) {
  auto& w = *self->state.work;
  auto step = w.req.step;
  const bool ahead = ahead_of_vote(self->state);
  w.ahead = ahead;
  if (ahead)
    w.vote = step_work::vote_state::pending;
  const int32_t chunks_ahead =
      ahead ? chunks_before_the_vote(static_cast<int>(self->state.pl->chunks.size())) : 0;
  ask<overflow_report>(self, self->state.peers.scaler, check_overflow{step, chunks_ahead},
                       [=](overflow_report& rep) {
                         auto& w = *self->state.work;
                         w.result.loss_scale = rep.scale;
                         w.result.next_loss_scale = rep.next_scale;
                         if (!rep.overflow) {
                           if (ahead)
                             vote_passed(self, rep.sum_squares);
                           else
                             unscale(self, rep.sum_squares);
                           return;
                         }
                         if (!ahead) {
                           refuse(self);
                           return;
                         }
                         w.vote = step_work::vote_state::refused;
                         if (w.ahead_in_flight == 0)
                           refuse(self);
                       });
  if (ahead)
    unscale(self, 0.0);
}

// A refused step: the gradient discarded, the answer `skipped`. (Work already enqueued that
// reads the gradient or writes the chunks' buffers is ordered before the caller's next work
// and before those buffers are reused, as every step's is.)
void refuse(coord_pointer self) {
  ask<ack>(self, self->state.peers.store, discard_grads{self->state.work->req.step}, [=](ack&) {
    auto& st = self->state;
    st.work->result.skipped = true;
    st.work->promise.deliver(st.work->result);
    st.work.reset();
  });
}

// The vote passed while the chunks ran ahead of it: the step's norm, then what waited for the
// vote (scatter, non-Muon rule). The chunks' new momentum, in the store's spare, becomes the
// momentum when the step finishes.
void vote_passed(coord_pointer self, double sum_squares) {
  auto& st = self->state;
  auto& w = *st.work;
  auto& r = w.result;
  if (r.loss_scale != 1.0f) {  // ahead_of_vote's factor assumed no loss scale
    fail_step(self, make_caf_error(errc::internal,
                                   "step " + std::to_string(w.req.step) + ": loss scale "
                                       + std::to_string(r.loss_scale)
                                       + " without fp16; the momentum went ahead unscaled"));
    return;
  }
  w.vote = step_work::vote_state::passed;
  r.grad_norm = std::sqrt(sum_squares) * unscale_of(r);
  r.clip_coef = 1.0f;
  // The non-Muon rule first where the last chunk's NS is enqueued, so that it runs beside that
  // NS, as scalar_rule says; then the scatters.
  if (w.chunks.back().at >= chunk_work::gather_issued)
    scalar_rule(self);
  advance(self);
}

// 3. The raw norm and the clip factor; unscale_clip carries the factor and the step's values
// to the store, once. Ahead of the vote (its answer pending) the factor is 1 without the sum
// (no report yet: the result's loss scale is its default, 1), and the norm waits for
// vote_passed.
void unscale(coord_pointer self, double sum_squares) {
  auto& st = self->state;
  auto& r = st.work->result;
  const double unscale = unscale_of(r);
  r.grad_norm = std::sqrt(sum_squares) * unscale;
  float max_norm = st.opts.gradient_clipping;
  double clip = max_norm > 0 ? max_norm / (r.grad_norm + 1e-6) : 1.0;
  r.clip_coef = clip < 1.0 ? static_cast<float>(clip) : 1.0f;
  auto factor = static_cast<float>(unscale * r.clip_coef);
  // Not waited for: the store takes this rank's requests in the order sent, so the momentum
  // after it reads the unscaled gradient (one host round trip less before the first NS); a
  // failure still ends the step.
  unscale_clip msg{st.work->req.step, factor, st.work->groups, st.work->touched};
  ask<ack>(self, st.peers.store, std::move(msg), [](ack&) {});
  run_muon(self);
}

// -- 4. the Muon chunks: momentum, gather, NS, scatter, apply -------------------------------------

void run_muon(coord_pointer self) {
  auto& w = *self->state.work;
  auto n = static_cast<int>(self->state.pl->chunks.size());
  if (n == 0) {
    finish(self);
    return;
  }
  w.chunks.resize(n);
  w.order = collective_order(n);
  advance(self);
}

// Issues the collectives of the fixed order as far as their inputs are ready.
void advance(coord_pointer self) {
  auto& st = self->state;
  auto& w = *st.work;
  if (w.vote == step_work::vote_state::refused)
    return;
  while (w.next_slot < w.order.size()) {
    auto s = w.order[w.next_slot];
    auto& cw = w.chunks[s.chunk];
    if (s.gather) {
      // On a comm that enqueues on the device's stream (nccl) the next chunk's momentum goes
      // out once this chunk's gather is enqueued (answered), so that the gather, and the NS
      // after it, do not queue behind that momentum. A host comm answers when the data has
      // moved: there the momentum overlaps the gather.
      if (cw.at == chunk_work::idle && !st.comm_on_host && s.chunk > 0
          && w.chunks[s.chunk - 1].at < chunk_work::ns_done)
        return;
      if (cw.at == chunk_work::idle) {
        request_momentum(self, s.chunk);
        return;
      }
      if (cw.at != chunk_work::momentum_done)
        return;
      ++w.next_slot;  // first: a gather in place goes on at once, into advance again
      gather(self, s.chunk);
    } else {
      // A scatter goes out once the chunk before it is applied (its update enqueued), and
      // once the non-Muon rule, if sent, is enqueued: on a device that work then runs beside
      // this chunk's NS instead of after this scatter, which waits for the NS.
      if (cw.at != chunk_work::ns_done
          || (s.chunk > 0 && w.chunks[s.chunk - 1].at != chunk_work::applied)
          || w.scalar == step_work::sent || w.vote != step_work::vote_state::passed)
        return;
      ++w.next_slot;
      scatter(self, s.chunk);
    }
  }
}

// The store updates the chunk's momentum and writes u; then u goes to the comm.
void request_momentum(coord_pointer self, int c) {
  auto& st = self->state;
  auto& cw = st.work->chunks[c];
  buffers(self, c, [&] {
    cw.u = wire_buffer(*st.be, st.pl->chunks[c].shard_len, st.wire,
                       st.comm_on_host && !st.in_place[c],  // in place: no comm reads it
                       buffer_init::overwritten);           // momentum writes all of it
  });
  cw.at = chunk_work::momentum_requested;
  muon_momentum msg{st.work->req.step, c, cw.u.compute()};
  const bool spare = st.work->ahead;  // every chunk's new momentum to the spare
  if (spare) {
    msg.writes = momentum_writes::spare;
    ++st.work->ahead_in_flight;
  }
  ask<ack>(self, st.peers.store, std::move(msg), [=](ack&) {
    auto& st = self->state;
    if (spare)
      --st.work->ahead_in_flight;
    if (st.work->vote == step_work::vote_state::refused) {  // the last u in flight ends it
      if (st.work->ahead_in_flight == 0)
        refuse(self);
      return;
    }
    auto& u = st.work->chunks[c].u;
    buffers(self, c, [&] { u.to_comm(*st.be); });
    after_gpu(self, gpu_event::u_on_host, c, u.staged());
  });
}

void gather(coord_pointer self, int c) {
  auto& st = self->state;
  auto& w = *st.work;
  const auto& pl = *st.pl;
  auto& cw = w.chunks[c];
  if (st.in_place[c]) {  // u is the owner's buffer already
    cw.full = std::move(cw.u);
    cw.at = chunk_work::gather_issued;
    orthogonalize(self, c);
    return;
  }
  buffers(self, c, [&] {  // the gather writes every element: each rank's valid part
    cw.full = wire_buffer(*st.be, st.own[c].full_size, st.wire, st.comm_on_host,
                          buffer_init::overwritten);
  });
  all_to_all_req req{collective_tag{collective_kind::gather, w.req.step, 0, c}, per_rank(pl.world),
                     per_rank(pl.world), st.wire};
  for_shard_parts(st, c, [&](int owner, int64_t at, int64_t n) {  // my shard of every block
    add_segment(req.sends[owner], cw.u, at, n);                   // goes to its owner
  });
  for_owned_parts(st, c, [&](int q, int64_t at, int64_t n) {  // every rank's part of my blocks
    add_segment(req.recvs[q], cw.full, at, n);
  });
  cw.at = chunk_work::gather_issued;
  ask<comm_done>(self, st.peers.comm, std::move(req), [=](comm_done&) { orthogonalize(self, c); });
}

// Newton-Schulz on the blocks this rank owns, batched by shape, under their group's rule; fp32
// leaves it scaled (a rule with a transform: by the store, after it), bf16 leaves the scale to
// the receiving stores.
void orthogonalize(coord_pointer self, int c) {
  auto& st = self->state;
  auto& cw = st.work->chunks[c];
  buffers(self, c, [&] {
    cw.u = wire_buffer{};
    cw.full.to_compute(*st.be);
  });
  const float_view full = cw.full.compute();
  reorder_boxes(st, c, full, false);
  trace::span ns(st.tr, "ns", trace::stepped("ns", st.work->req.step, -1, c),
                 trace::span::per_param);
  for (const auto& g : st.own[c].groups) {
    const muon_rule& rule = rule_of(st, g.hparam_group);
    ns.add_bytes(g.batch * g.rows * g.cols * static_cast<int64_t>(sizeof(float)));
    if (full.bf16 != nullptr) {
      st.be->newton_schulz_bf16(full.bf16 + g.offset, g.batch, g.rows, g.cols, rule.ns);
    } else {
      float* x = full.data + g.offset;
      st.be->newton_schulz(x, g.batch, g.rows, g.cols, rule.ns);
      if (!rule.transforms())
        st.be->post_ns(x, nullptr, g.batch, g.rows, g.cols, rule, rule.scale(g.rows, g.cols));
    }
  }
  // Each parameter is named once, by the owner of its first block (an expert stack's or a
  // split matrix's blocks may run on several ranks).
  ns.add_params(st.own[c].ns_params);
  st.work->result.ns_params += static_cast<int32_t>(st.own[c].ns_params.size());
  ns.end();  // on a GPU: the time to enqueue; the NS itself ends before gpu_done
  if (c + 1 == static_cast<int>(st.pl->chunks.size()))
    scalar_rule(self);  // 5., beside this NS
  if (transform_due(st, c)) {
    transform_in_store(self, c);
    return;
  }
  if (full.bf16 != nullptr)
    rescale_bf16_blocks(st, c, full.bf16);
  ns_finished(self, c);
}

// The rule's transform after NS (NorMuon's row normalization) in the store, whose row moments
// change only here, in a step that is applied; an fp32 block takes its scale there too.
void transform_in_store(coord_pointer self, int c) {
  auto& st = self->state;
  normuon_step msg{st.work->req.step, c, st.work->chunks[c].full.compute()};
  ask<ack>(self, st.peers.store, std::move(msg), [=](ack&) {
    auto& st = self->state;
    const float_view full = st.work->chunks[c].full.compute();
    if (full.bf16 != nullptr)  // the blocks' scale ratios after the transform, as unscaled
      rescale_bf16_blocks(st, c, full.bf16);
    ns_finished(self, c);
  });
}

// Chunk c's owner buffer holds its final update: off to the comm.
void ns_finished(coord_pointer self, int c) {
  auto& st = self->state;
  auto& cw = st.work->chunks[c];
  reorder_boxes(st, c, cw.full.compute(), true);
  buffers(self, c, [&] { cw.full.to_comm(*st.be); });
  after_gpu(self, gpu_event::ns_on_host, c, cw.full.staged());
}

void scatter(coord_pointer self, int c) {
  auto& st = self->state;
  auto& w = *st.work;
  const auto& pl = *st.pl;
  const auto& chunk = pl.chunks[c];
  auto& cw = w.chunks[c];
  if (st.in_place[c]) {  // the owner's buffer is this rank's shards of the update already
    cw.result = std::move(cw.full);
    cw.at = chunk_work::scatter_issued;
    apply(self, c);
    return;
  }
  buffers(self, c, [&] {  // the scatter leaves the shards' padding unwritten: zero if any
    cw.result = wire_buffer(*st.be, chunk.shard_len, st.wire, st.comm_on_host,
                            st.padded[c] ? buffer_init::zeros : buffer_init::overwritten);
  });
  all_to_all_req req{collective_tag{collective_kind::scatter, w.req.step, 0, c}, per_rank(pl.world),
                     per_rank(pl.world), st.wire};
  for_owned_parts(st, c, [&](int q, int64_t at, int64_t n) {  // each rank gets its part of
    add_segment(req.sends[q], cw.full, at, n);                // the blocks I own
  });
  for_shard_parts(st, c, [&](int owner, int64_t at, int64_t n) {  // my shard of every block
    add_segment(req.recvs[owner], cw.result, at, n);              // comes from its owner
  });
  cw.at = chunk_work::scatter_issued;
  ask<comm_done>(self, st.peers.comm, std::move(req), [=](comm_done&) { apply(self, c); });
}

// The store applies this rank's shards of the update; the chunk is done.
void apply(coord_pointer self, int c) {
  auto& st = self->state;
  auto& cw = st.work->chunks[c];
  buffers(self, c, [&] {
    cw.full = wire_buffer{};
    cw.result.to_compute(*st.be);
  });
  ask<ack>(self, st.peers.store, apply_muon{st.work->req.step, c, cw.result.compute()}, [=](ack&) {
    auto& w = *self->state.work;
    buffers(self, c, [&] { w.chunks[c] = chunk_work{}; });
    w.chunks[c].at = chunk_work::applied;
    if (++w.applied == w.chunks.size())
      finish(self);
    else
      advance(self);  // the next scatter, now queued behind this update
  });
}

// -- 5-7. the non-Muon rule, MuonClip, answer -----------------------------------------------------

// 5. The non-Muon rule on every non-Muon shard, with the values unscale_clip carried. Sent once
// the last chunk's NS is enqueued (at once without Muon chunks), and that chunk's scatter waits
// for its answer: its shards are not the NS's memory, so on a device it runs beside that NS
// instead of after the scatter, which waits for the NS, and no gather queues behind it.
void scalar_rule(coord_pointer self) {
  auto& w = *self->state.work;
  if (w.scalar != step_work::unsent || w.vote != step_work::vote_state::passed)
    return;  // sent, or held back until the vote passes (vote_passed sends it)
  w.scalar = step_work::sent;
  ask<ack>(self, self->state.peers.store, adamw_step{w.req.step}, [=](ack&) {
    self->state.work->scalar = step_work::done;
    advance(self);  // the last scatter, now queued behind it
    finish(self);
  });
}

// 6. MuonClip, once every chunk is applied and the non-Muon rule done.
void finish(coord_pointer self) {
  auto& w = *self->state.work;
  if (w.applied != w.chunks.size())
    return;
  if (w.scalar != step_work::done) {
    scalar_rule(self);
    return;
  }
  clip_qk(self, [=] { answer(self); });
}

// 7. The gradient marked zero; the step answered once its kernels have finished, or once they
// are enqueued where the host orders its own stream after them.
void answer(coord_pointer self) {
  const auto& req = self->state.work->req;
  ask<ack>(self, self->state.peers.store, finish_step{req.step, !req.enqueued}, [=](ack&) {
    auto& st = self->state;
    auto& w = *st.work;
    w.result.ns_matrices = st.be->ns_matrix_count() - w.ns_before;
    w.promise.deliver(w.result);
    st.work.reset();
  });
}

// MuonClip after the update of an applied step: one max all-reduce of the ranks' per-head
// logits (right after the vote decided the step applies, so every rank issues it), then each
// rank scales its own shard's part of the clipped heads: no gather.
template <class Then>
void clip_qk(coord_pointer self, Then then) {
  auto& st = self->state;
  if (!qk_clip_on(st)) {
    then();
    return;
  }
  const auto& pl = *st.pl;
  const auto& mine = st.work->req.qk_logits;
  std::vector<double> values(static_cast<size_t>(pl.qk_values), -1e300);
  for (size_t v = 0; v < values.size() && v < mine.size(); ++v)
    values[v] = std::max(values[v], static_cast<double>(mine[v]));
  const uint64_t step = st.work->req.step;
  all_reduce_req req{collective_tag{collective_kind::vote, step, 0, 1}, reduce_op::max,
                     std::move(values)};
  ask<all_reduce_result>(self, st.peers.comm, std::move(req), [=](all_reduce_result& res) {
    auto& st = self->state;
    if (res.values.size() != static_cast<size_t>(st.pl->qk_values)) {
      fail_step(self, make_caf_error(errc::bad_state, "step " + std::to_string(step)
                                                          + ": the MuonClip all-reduce returned "
                                                          + std::to_string(res.values.size())
                                                          + " values instead of "
                                                          + std::to_string(st.pl->qk_values)));
      return;
    }
    std::vector<double> tau;  // each pair's, from its query's group
    for (const auto& pair : st.pl->qk_pairs)
      tau.push_back(rule_of_param(st, pair.query).qk_clip_tau);
    bool any = false;
    auto ranges = qk_clip_ranges(*st.pl, st.rank, tau, res.values, any);
    if (!any) {
      then();
      return;
    }
    ask<ack>(self, st.peers.store, qk_clip_scale{step, std::move(ranges)}, [=](ack&) { then(); });
  });
}

muon_coordinator_actor::behavior_type coordinator_impl(coord_pointer self,
                                                       std::shared_ptr<const plan> pl, int rank,
                                                       engine_options opts, coordinator_peers peers,
                                                       std::shared_ptr<compute_backend> be,
                                                       std::shared_ptr<trace::recorder> tracer) {
  auto& st = self->state;
  st.tr = trace::track(std::move(tracer), "muon_coordinator");
  st.own = make_ownership(*pl, rank);
  st.pl = std::move(pl);
  st.rank = rank;
  st.opts = std::move(opts);
  st.peers = std::move(peers);
  st.be = std::move(be);
  st.comm_on_host = comm_on_host(st.opts.comm);
  st.wire = muon_wire_type(st.opts);
  st.momentum_before_vote = momentum_may_precede_vote(st.opts, *st.pl);
  st.defaults = group_hparams{st.opts.muon, st.opts.adamw};
  for (const auto& p : st.pl->params)
    st.group_count = std::max(st.group_count, p.hparam_group + 1);
  for (const auto& chunk : st.pl->chunks) {
    int64_t valid = 0;
    for (int i : chunk.params)
      valid += valid_len(st.pl->params[i], rank);
    st.padded.push_back(valid != chunk.shard_len);
  }
  for (int c = 0; c < static_cast<int>(st.pl->chunks.size()); ++c)
    st.in_place.push_back(laid_out_as_shard(st, c));
  // A failure inside a handler (a CUDA error) or of a peer actor of this rank ends the step in
  // progress with that error instead of leaving the host waiting.
  self->set_exception_handler([=](std::exception_ptr& eptr) -> caf::error {
    caf::error err = error_from_exception(eptr);
    fail_step(self, err);
    return err;
  });
  self->set_down_handler([=](caf::down_msg& down) {
    fail_step(self, down.reason
                        ? down.reason
                        : make_caf_error(errc::bad_state, "a peer actor of rank "
                                                              + std::to_string(rank) + " stopped"));
  });
  self->monitor(st.peers.store);
  self->monitor(st.peers.reducer);
  return {
      [=](step_request& req) -> caf::result<step_result> {
        ZMUON_TRACE_RECV(self, req);
        auto& st = self->state;
        if (st.work)
          return make_caf_error(errc::bad_state,
                                "step " + std::to_string(req.step) + " requested while step "
                                    + std::to_string(st.work->req.step) + " is running");
        st.work.emplace();
        st.work->req = req;
        st.work->groups = resolve_groups(st, req);
        st.work->rules = muon_rules_of(*st.work->groups);
        st.work->touched = resolve_touched(st, req);
        st.work->result.step = req.step;
        st.work->ns_before = st.be->ns_matrix_count();
        st.work->promise = self->make_response_promise<step_result>();
        auto promise = st.work->promise;
        begin_step(self);
        return promise;
      },
      [=](gpu_done& msg) {
        ZMUON_TRACE_RECV(self, msg);
        on_gpu_done(self, msg);
      },
  };
}

}  // namespace

muon_coordinator_actor spawn_muon_coordinator(caf::actor_system& sys,
                                              std::shared_ptr<const plan> pl, int rank,
                                              const engine_options& opts, coordinator_peers peers,
                                              std::shared_ptr<compute_backend> backend,
                                              std::shared_ptr<trace::recorder> tracer) {
  return sys.spawn(coordinator_impl, std::move(pl), rank, opts, std::move(peers),
                   std::move(backend), std::move(tracer));
}

}  // namespace zmuon
