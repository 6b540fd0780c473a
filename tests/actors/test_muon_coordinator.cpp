// The Muon coordinator alone: reducer, loss scaler, store and comm replaced by recording doubles
// that share one trace, under CAF's testing scheduler. The comm double plays the other ranks of a
// world of 1 or 2; the Newton-Schulz results are checked against the host backend run here.
#define BOOST_TEST_MODULE muon_coordinator
#include "support/actor_fixture.hpp"

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <cmath>

#include "actors/muon_coordinator.hpp"
#include "plan/ownership.hpp"
#include "plan/plan.hpp"

namespace zmuon::test {
namespace {

std::shared_ptr<compute_backend> host_backend() {
  auto made = make_compute_backend("host");
  BOOST_REQUIRE(made);
  return std::shared_ptr<compute_backend>(std::move(*made));
}

/// The u shard values the store double writes (rank r's shard of parameter i).
float u_value(int i, int r, int64_t k) {
  return static_cast<float>(std::sin(1.0 + 7.0 * i + 3.0 * r + 0.37 * static_cast<double>(k)));
}
/// What another rank, owner of parameter i, scatters to this rank.
float remote_result(int i, int64_t k) {
  return 10.0f + static_cast<float>(i) + 0.01f * static_cast<float>(k);
}

struct coord_fixture : actor_fixture {
  std::shared_ptr<trace_log> trace = std::make_shared<trace_log>();
  std::shared_ptr<flush_log> flushes = std::make_shared<flush_log>();
  std::shared_ptr<check_log> checks = std::make_shared<check_log>();
  std::shared_ptr<step_store_log> stored = std::make_shared<step_store_log>();
  std::shared_ptr<comm_log> comms = std::make_shared<comm_log>();
  std::shared_ptr<compute_backend> be = host_backend();
  engine_options opts;
  std::shared_ptr<const plan> pl;
  int rank = 0;
  bool hold_a2a = false;  // all-to-alls wait for complete_a2a
  std::map<std::pair<int, int>, std::vector<std::vector<float>>> sent;  // (gather?, chunk)
  std::vector<group_hparams> groups;  // the hyperparameter groups a test sent, for the reference
  muon_coordinator_actor coord;

  coord_fixture() {
    flushes->trace = checks->trace = stored->trace = comms->trace = trace;
    flushes->micros = 4;
    checks->scale = 1024.0f;
    checks->next_scale = 2048.0f;
    opts.gradient_clipping = 1.0f;
    opts.muon.momentum = 0.9f;
    opts.muon.nesterov = false;
    opts.muon.weight_decay = 0.1f;
    opts.adamw = adamw_options{3e-4f, 0.8f, 0.99f, 1e-8f, 0.05f};
    stored->fill_u = [this](const muon_momentum& m) {  // u of this rank's shards, zero padding
      const auto& ch = pl->chunks[m.chunk];
      for (int i : ch.params) {
        const auto& p = pl->params[i];
        for (int64_t k = 0; k < p.shard_len; ++k)
          m.out.data[p.state_offset - ch.state_offset + k] =
              k < valid_len(p, rank) ? u_value(i, rank, k) : 0.0f;
      }
    };
    comms->on_request = [this](comm_log::call& c) { serve(c); };
  }
  ~coord_fixture() { stored->fill_u = nullptr, comms->on_request = nullptr; }

  void start(std::vector<param_spec> table, int world, int64_t bucket, int r) {
    auto made = make_plan(table, world, bucket);
    BOOST_REQUIRE(made);
    pl = std::make_shared<const plan>(std::move(*made));
    rank = r;
    coordinator_peers peers{
        keep(sys.spawn(fake_reducer, flushes)), keep(sys.spawn(fake_scaler, checks)),
        keep(sys.spawn(fake_step_store, stored)), keep(sys.spawn(fake_comm, comms))};
    coord = keep(spawn_muon_coordinator(sys, pl, rank, opts, peers, be));
    run();
  }

  void serve(comm_log::call& c) {
    if (c.kind == comm_log::call::all_to_all) {
      auto& out = sent[{c.a2a.tag.kind == collective_kind::gather, c.a2a.tag.index}];
      for (const auto& segs : c.a2a.sends)  // the values as sent
        out.push_back(gather_segments(segs));
      if (!hold_a2a)
        complete_a2a(c);
    }
  }

  void complete_a2a(comm_log::call& c) {
    bool gather = c.a2a.tag.kind == collective_kind::gather;
    for (int q = 0; q < pl->world; ++q)
      fill_segments(c.a2a.recvs[q], q == rank ? gather_segments(c.a2a.sends[q])
                                    : gather  ? gather_recv(c.a2a.tag.index, q)
                                              : scatter_recv(c.a2a.tag.index, q));
    c.finish();
  }

  // -- what the protocol says travels, derived from the plan here --------------------------------
  template <class F>
  std::vector<float> concat(int c, F&& part) {
    std::vector<float> out;
    for (int i : pl->chunks[c].params)
      part(i, pl->params[i], out);
    return out;
  }
  std::vector<float> gather_recv(int c, int q) {  // q's u shards of the matrices I own
    return concat(c, [&](int i, const param_layout& p, std::vector<float>& out) {
      for (int64_t k = 0; p.owner == rank && k < valid_len(p, q); ++k)
        out.push_back(u_value(i, q, k));
    });
  }
  std::vector<float> scatter_recv(int c, int q) {  // my result shards of the matrices q owns
    return concat(c, [&](int i, const param_layout& p, std::vector<float>& out) {
      for (int64_t k = 0; p.owner == q && k < valid_len(p, rank); ++k)
        out.push_back(remote_result(i, k));
    });
  }
  std::vector<float> gather_send(int c, int q) {  // my u shards of the matrices q owns
    return concat(c, [&](int i, const param_layout& p, std::vector<float>& out) {
      for (int64_t k = 0; p.owner == q && k < valid_len(p, rank); ++k)
        out.push_back(u_value(i, rank, k));
    });
  }
  std::vector<float> scatter_send(int c, int q) {  // q's shards of my orthogonalized matrices
    return concat(c, [&](int i, const param_layout& p, std::vector<float>& out) {
      auto full = reference_update(i);
      for (int64_t k = 0; p.owner == rank && k < valid_len(p, q); ++k)
        out.push_back(full[q * p.shard_len + k]);
    });
  }
  /// NS of matrix i, each block (each head of it) alone, scaled by sqrt(max(1, rows/cols)) of a
  /// block (0.2 * sqrt(max(rows, cols)) under match_rms_adamw), with its group's NS options where
  /// the test sent groups (`groups`), else the options'.
  std::vector<float> reference_update(int i) {
    const auto& p = pl->params[i];
    const bool grouped = p.hparam_group < static_cast<int>(groups.size());
    const muon_options& muon = grouped ? groups[p.hparam_group].muon : opts.muon;
    std::vector<float> full(p.numel);
    for (int q = 0; q < pl->world; ++q)
      for (int64_t k = 0; k < valid_len(p, q); ++k)
        full[q * p.shard_len + k] = u_value(i, q, k);
    for (const auto& b : p.blocks) {  // each split block's heads, each with its block's scale
      const int64_t rows = b.rows / b.heads;
      const double scale = muon.adjust_lr == adjust_lr_rule::match_rms_adamw
                               ? 0.2 * std::sqrt(double(std::max(rows, p.cols)))
                               : std::sqrt(std::max(1.0, double(rows) / double(p.cols)));
      for (int64_t h = 0; h < b.heads; ++h) {
        float* x = full.data() + (b.row0 + h * rows) * p.cols;
        host_backend()->newton_schulz(x, 1, rows, p.cols, muon.ns);
        for (int64_t k = 0; k < rows * p.cols; ++k)
          x[k] = static_cast<float>(x[k] * scale);
      }
    }
    return full;
  }
  /// This rank's update of chunk c: its shard of each matrix, zero padding.
  std::vector<float> expected_update(int c) {
    const auto& ch = pl->chunks[c];
    std::vector<float> out(ch.shard_len, 0.0f);
    for (int i : ch.params) {
      const auto& p = pl->params[i];
      auto full = p.owner == rank ? reference_update(i) : std::vector<float>{};
      for (int64_t k = 0; k < valid_len(p, rank); ++k)
        out[p.state_offset - ch.state_offset + k] =
            p.owner == rank ? full[rank * p.shard_len + k] : remote_result(i, k);
    }
    return out;
  }

  /// Step s's request: one hyperparameter group, the options' values with lr 0.02 (Muon) and
  /// 0.001 (AdamW).
  step_request request(uint64_t s) const {
    group_hparams g{opts.muon, opts.adamw};
    g.muon.lr = 0.02f;
    g.adamw.lr = 0.001f;
    return step_request{s, {g}};
  }
  std::shared_ptr<reply_slot<step_result>> step(uint64_t s) { return step(request(s)); }
  std::shared_ptr<reply_slot<step_result>> step(step_request req) {
    auto r = ask<step_result>(coord, std::move(req));
    run();
    return r;
  }
  std::vector<std::string> lines_of(const std::string& peer) const {
    std::vector<std::string> out;
    for (const auto& l : trace->lines)
      if (l.rfind(peer + ":", 0) == 0)
        out.push_back(l);
    return out;
  }
  /// The Muon parameters whose first block this rank owns: the step's ns_params.
  int32_t owned_params(int rank) const {
    int32_t n = 0;
    for (const auto& p : pl->params)
      n += p.muon && p.blocks.front().owner == rank;
    return n;
  }
  size_t position(const std::string& line) const {
    auto it = std::find(trace->lines.begin(), trace->lines.end(), line);
    BOOST_REQUIRE_MESSAGE(it != trace->lines.end(), "'" << line << "' was never received");
    return static_cast<size_t>(it - trace->lines.begin());
  }
  /// zmuon.momentum_before_vote on, for steps of `micros` micro-batches without clipping or a
  /// loss scale (call before start()).
  void ahead_of_the_vote(int micros) {
    opts.gradient_clipping = 0.0f;
    opts.momentum_before_vote = "on";
    flushes->micros = micros;
    checks->scale = checks->next_scale = 1.0f;
  }
  void check_updates() {
    BOOST_REQUIRE_EQUAL(stored->applies.size(), pl->chunks.size());
    for (const auto& [msg, values] : stored->applies) {
      auto want = expected_update(msg.chunk);
      BOOST_REQUIRE_EQUAL(values.size(), want.size());
      for (size_t k = 0; k < want.size(); ++k)
        BOOST_CHECK_MESSAGE(
            std::abs(values[k] - want[k]) <= 1e-5f,
            "chunk " << msg.chunk << " [" << k << "] " << values[k] << " != " << want[k]);
    }
  }
};

const std::vector<param_spec> kOneMatrix = {{"w", {4, 3}}, {"bias", {3}}};
const std::vector<param_spec> kThreeMatrices = {{"a", {4, 3}}, {"b", {3, 5}}, {"c", {2, 6}}};
// World 2, chunks of one matrix each: w0 -> rank 0, w1 -> rank 1, w2 -> rank 0 (LPT, ties low);
// w2 has 15 elements, so rank 1's shard holds 7 and one padding element.
const std::vector<param_spec> kWorldTwo = {
    {"w0", {4, 6}}, {"w1", {6, 4}}, {"w2", {3, 5}}, {"bias", {5}}};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(muon_coordinator_alone, coord_fixture)

BOOST_AUTO_TEST_CASE(clean_step_world_one_sends_exactly_the_protocol) {
  start(kOneMatrix, 1, 1000, 0);
  // Raw norm = sqrt(ss) / (scale * micros) = 2.5 > clip 1: clipped.
  const double scale = 1024.0, micros = 4.0, raw_norm = 2.5;
  checks->sum_squares = std::pow(raw_norm * scale * micros, 2);  // from the vote
  auto r = step(1);
  // World 1: the owner's buffer is the shard's own layout, so no gather and no scatter; NS
  // runs on momentum's u where the store wrote it, and the update is read from there.
  const std::vector<std::string> expected = {"reducer: flush 1",      "scaler: check_overflow 1",
                                             "store: unscale_clip 1", "store: muon_momentum 1/0",
                                             "store: adamw_step 1",   "store: apply_muon 1/0",
                                             "store: finish_step 1"};
  BOOST_CHECK_EQUAL_COLLECTIONS(trace->lines.begin(), trace->lines.end(), expected.begin(),
                                expected.end());
  double clip = 1.0 / (raw_norm + 1e-6);  // torch's clip_grad_norm_ coefficient
  BOOST_REQUIRE_EQUAL(stored->unscales.size(), 1u);
  BOOST_CHECK_CLOSE(stored->unscales[0].factor, clip / (scale * micros), 1e-4);
  const auto& res = value_of(r);
  BOOST_CHECK_EQUAL(res.step, 1u);
  BOOST_CHECK(!res.skipped);
  BOOST_CHECK_CLOSE(res.grad_norm, raw_norm, 1e-9);
  BOOST_CHECK_CLOSE(res.clip_coef, clip, 1e-4);
  BOOST_CHECK_EQUAL(res.loss_scale, 1024.0f);
  BOOST_CHECK_EQUAL(res.next_loss_scale, 2048.0f);
  BOOST_CHECK_EQUAL(res.micros, 4);
  BOOST_CHECK_EQUAL(res.ns_params, 1);
  BOOST_CHECK_EQUAL(res.ns_matrices, 1);
  // The step's values cross once, with unscale_clip: one group, every parameter touched.
  const auto& sent = stored->unscales.at(0);
  BOOST_REQUIRE(sent.groups && sent.groups->size() == 1u);
  BOOST_CHECK(sent.touched.empty());
  const auto& g0 = sent.groups->at(0);
  BOOST_CHECK_EQUAL(g0.muon.momentum, 0.9f);
  BOOST_CHECK(!g0.muon.nesterov);
  BOOST_CHECK_EQUAL(g0.muon.lr, 0.02f);
  BOOST_CHECK_EQUAL(g0.muon.weight_decay, 0.1f);
  BOOST_CHECK_EQUAL(stored->momentums.at(0).out.size, pl->chunks[0].shard_len);
  check_updates();
  const auto& a = g0.adamw;
  BOOST_CHECK(a.lr == 0.001f && a.beta1 == 0.8f && a.beta2 == 0.99f && a.eps == 1e-8f
              && a.weight_decay == 0.05f);
  // The next step runs the same way: the coordinator is idle again.
  checks->sum_squares = std::pow(0.5 * scale * micros, 2);  // below the clip: not clipped
  auto r2 = step(2);
  BOOST_CHECK_EQUAL(value_of(r2).clip_coef, 1.0f);
  BOOST_CHECK_CLOSE(stored->unscales.at(1).factor, 1.0 / (scale * micros), 1e-5);
  BOOST_CHECK_EQUAL(trace->lines.size(), 2 * expected.size());
}

BOOST_AUTO_TEST_CASE(overflowed_step_discards_and_runs_nothing_of_muon) {
  start(kOneMatrix, 1, 1000, 0);
  checks->overflow = true;
  auto r = step(1);
  const std::vector<std::string> expected = {"reducer: flush 1", "scaler: check_overflow 1",
                                             "store: discard_grads 1"};
  BOOST_CHECK_EQUAL_COLLECTIONS(trace->lines.begin(), trace->lines.end(), expected.begin(),
                                expected.end());
  BOOST_CHECK(comms->calls.empty());  // no gather, no scatter
  BOOST_CHECK(stored->momentums.empty() && stored->applies.empty() && stored->adamws.empty()
              && stored->unscales.empty());
  BOOST_CHECK_EQUAL(be->ns_matrix_count(), 0);  // no Newton-Schulz
  const auto& res = value_of(r);
  BOOST_CHECK(res.skipped);
  BOOST_CHECK_EQUAL(res.loss_scale, 1024.0f);
  BOOST_CHECK_EQUAL(res.next_loss_scale, 2048.0f);
  BOOST_CHECK_EQUAL(res.ns_params, 0);
  BOOST_CHECK_EQUAL(res.ns_matrices, 0);
}

// zmuon.momentum_before_vote at world 1, one micro-batch, no clipping, no loss scale: unscale_clip
// and chunk 0's momentum (the new momentum into the store's spare, and u) go out beside the
// vote; the vote answers while that u is still being written (a busy store), and nothing else
// is sent for the momentum; the non-Muon rule and the update wait for the vote.
BOOST_AUTO_TEST_CASE(momentum_ahead_of_the_vote_writes_the_spare) {
  ahead_of_the_vote(1);
  checks->sum_squares = 6.25;
  start(kOneMatrix, 1, 1000, 0);
  stored->hold_momentum = 0;
  auto r = step(1);
  const std::vector<std::string> before = {"reducer: flush 1", "scaler: check_overflow 1",
                                           "store: unscale_clip 1", "store: muon_momentum 1/0"};
  BOOST_CHECK_EQUAL_COLLECTIONS(trace->lines.begin(), trace->lines.end(), before.begin(),
                                before.end());
  BOOST_REQUIRE_EQUAL(stored->momentums.size(), 1u);
  BOOST_CHECK((stored->momentums[0].writes == momentum_writes::spare));
  BOOST_CHECK(!r->done);
  stored->fill_u(stored->momentums[0]);
  stored->answer_held(1);
  run();
  const std::vector<std::string> after = {"store: adamw_step 1", "store: apply_muon 1/0",
                                          "store: finish_step 1"};
  BOOST_CHECK_EQUAL_COLLECTIONS(trace->lines.begin() + before.size(), trace->lines.end(),
                                after.begin(), after.end());
  BOOST_REQUIRE_EQUAL(stored->unscales.size(), 1u);
  BOOST_CHECK_EQUAL(stored->unscales[0].factor, 1.0f);
  const auto& res = value_of(r);
  BOOST_CHECK(!res.skipped);
  BOOST_CHECK_EQUAL(res.grad_norm, 2.5);
  BOOST_CHECK_EQUAL(res.clip_coef, 1.0f);
  BOOST_CHECK_EQUAL(stored->momentums.size(), 1u);
  check_updates();
}

// Every chunk of a step ahead of its vote writes the spare, those asked for after the vote
// passed too: the store makes the spare the momentum at finish_step, whole.
BOOST_AUTO_TEST_CASE(every_chunk_of_a_step_ahead_writes_the_spare) {
  ahead_of_the_vote(1);
  start(kThreeMatrices, 1, 12, 0);
  BOOST_REQUIRE_GT(pl->chunks.size(), 1u);
  BOOST_CHECK(!value_of(step(1)).skipped);
  BOOST_REQUIRE_EQUAL(stored->momentums.size(), pl->chunks.size());
  for (const auto& m : stored->momentums)
    BOOST_CHECK_MESSAGE((m.writes == momentum_writes::spare), "chunk " << m.chunk);
  check_updates();
}

// The same with a vote that refuses the step: the u in flight lands first, then the gradient is
// discarded (the spare left unused); no Newton-Schulz after it, no update, no non-Muon rule.
BOOST_AUTO_TEST_CASE(momentum_ahead_of_a_refusing_vote_writes_no_state) {
  ahead_of_the_vote(1);
  checks->overflow = true;
  start(kOneMatrix, 1, 1000, 0);
  stored->hold_momentum = 0;
  auto r = step(1);
  BOOST_CHECK(!r->done);  // the u still in flight
  stored->answer_held(1);
  run();
  const std::vector<std::string> expected = {"reducer: flush 1", "scaler: check_overflow 1",
                                             "store: unscale_clip 1", "store: muon_momentum 1/0",
                                             "store: discard_grads 1"};
  BOOST_CHECK_EQUAL_COLLECTIONS(trace->lines.begin(), trace->lines.end(), expected.begin(),
                                expected.end());
  BOOST_REQUIRE_EQUAL(stored->momentums.size(), 1u);
  BOOST_CHECK((stored->momentums[0].writes == momentum_writes::spare));
  BOOST_CHECK_EQUAL(be->ns_matrix_count(), 0);
  BOOST_CHECK(value_of(r).skipped);
  // The next step, clean, runs the whole protocol.
  checks->overflow = false;
  stored->hold_momentum = -1;
  BOOST_CHECK(!value_of(step(2)).skipped);
  BOOST_CHECK_EQUAL(stored->applies.size(), 1u);
}

// Where the step's unscale factor is not 1 (two micro-batches), the momentum waits for the vote.
BOOST_AUTO_TEST_CASE(momentum_waits_for_the_vote_where_the_factor_needs_it) {
  ahead_of_the_vote(2);
  start(kOneMatrix, 1, 1000, 0);
  auto r = step(1);
  BOOST_CHECK(!value_of(r).skipped);
  BOOST_REQUIRE_EQUAL(stored->momentums.size(), 1u);
  BOOST_CHECK((stored->momentums[0].writes == momentum_writes::both));
  BOOST_CHECK(position("scaler: check_overflow 1") < position("store: unscale_clip 1"));
}

BOOST_AUTO_TEST_CASE(step_without_gradients_is_an_error) {
  start(kOneMatrix, 1, 1000, 0);
  flushes->micros = 0;
  check_error(step(1), errc::bad_state, "no gradient");
  BOOST_CHECK(trace->lines == std::vector<std::string>{"reducer: flush 1"});
}

BOOST_AUTO_TEST_CASE(second_step_while_one_runs_is_refused) {
  start(kOneMatrix, 2, 1000, 0);
  comms->on_request = nullptr;  // the first step stops at its gather
  auto first = step(1);
  BOOST_REQUIRE_EQUAL(comms->calls.size(), 1u);
  auto second = step(2);
  check_error(second, errc::bad_state, "while step 1 is running");
  BOOST_CHECK(!first->done);
  comms->on_request = [this](comm_log::call& c) { serve(c); };
  serve(comms->calls[0]);
  run();
  BOOST_CHECK(!value_of(first).skipped);
  BOOST_CHECK_EQUAL(flushes->calls.size(), 1u);  // the refused step started nothing
}

// The non-Muon rule goes out once the last chunk's NS is enqueued, and that chunk's scatter
// only once the store has answered it (its kernels enqueued first: on a device they run beside
// the NS, not behind the scatter, which waits for the NS).
BOOST_AUTO_TEST_CASE(the_last_scatter_waits_for_the_non_muon_rule) {
  start(kOneMatrix, 2, 1000, 0);
  stored->hold_adamw = true;
  auto r = step(1);
  run();
  BOOST_CHECK(!r->done);
  BOOST_CHECK(lines_of("comm") == (std::vector<std::string>{"comm: gather 1/0"}));
  BOOST_CHECK_EQUAL(stored->adamws.size(), 1u);
  BOOST_CHECK(stored->applies.empty());
  stored->answer_held(1);
  run();
  BOOST_CHECK(!value_of(r).skipped);
  BOOST_CHECK(lines_of("comm")
              == (std::vector<std::string>{"comm: gather 1/0", "comm: scatter 1/0"}));
  BOOST_CHECK_EQUAL(stored->applies.size(), 1u);
}

BOOST_AUTO_TEST_CASE(peer_error_fails_the_step_and_the_next_step_runs) {
  start(kOneMatrix, 1, 1000, 0);
  stored->fail_on = "muon_momentum";  // before anything is written: the rest never goes out
  stored->fail_with = make_caf_error(errc::shape_mismatch, "momentum refused by the test");
  check_error(step(1), errc::shape_mismatch, "momentum refused");
  BOOST_CHECK(stored->adamws.empty());
  BOOST_CHECK(lines_of("comm").empty());
  stored->fail_on.clear();
  BOOST_CHECK(!value_of(step(2)).skipped);
}

// A step that ends while the store still writes a chunk's u (a busy store: chunk 1's momentum
// is held) frees nothing that the store writes into, whichever way it ends: chunk 0's gather
// fails (a peer's error), or the coordinator itself ends (an engine stopping after a timeout,
// which the CI's ASan caught as a write into a freed u). The request's view keeps u allocated
// until the message is gone; only then does the host backend count its bytes released.
BOOST_DATA_TEST_CASE_F(coord_fixture, an_ended_step_frees_no_buffer_the_store_still_writes,
                       boost::unit_test::data::make({false, true}), end_coordinator) {
  start(kThreeMatrices, 2, 12, 0);
  hold_a2a = true;
  stored->hold_momentum = 1;
  const int64_t before = be->memory().in_use;
  auto r = step(1);
  BOOST_REQUIRE(lines_of("comm") == std::vector<std::string>{"comm: gather 1/0"});
  BOOST_REQUIRE_EQUAL(stored->momentums.size(), 2u);  // chunk 1's is the held one
  if (end_coordinator)
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  else
    comms->calls.at(0).fail(make_caf_error(errc::bad_state, "gather refused by the test"));
  run();
  if (!end_coordinator)
    check_error(r, errc::bad_state, "gather refused");
  comms->calls.clear();                                // the comm is done with chunk 0
  stored->momentums.erase(stored->momentums.begin());  // answered
  const muon_momentum& held = stored->momentums.at(0);
  const int64_t u_bytes = pl->chunks[1].shard_len * static_cast<int64_t>(sizeof(float));
  BOOST_CHECK_EQUAL(held.out.size, pl->chunks[1].shard_len);
  BOOST_REQUIRE_EQUAL(be->memory().in_use - before, u_bytes);
  stored->fill_u(held);  // the store's write lands in memory still allocated
  stored->momentums.clear();
  BOOST_CHECK_EQUAL(be->memory().in_use - before, 0);
  stored->answer_held(1);  // a late answer: nobody waits for it any more
  run();
}

BOOST_AUTO_TEST_CASE(collectives_follow_g0_g1_s0_g2_s1_s2_whatever_the_reply_order) {
  start(kThreeMatrices, 2, 12, 0);
  BOOST_REQUIRE_EQUAL(pl->chunks.size(), 3u);
  hold_a2a = true;
  auto r = step(1);
  // G0 and G1 are both out before either is answered; S0 waits for G0.
  auto a2a = [&] { return lines_of("comm"); };
  BOOST_CHECK(a2a() == (std::vector<std::string>{"comm: gather 1/0", "comm: gather 1/1"}));
  complete_a2a(comms->calls.at(1));  // G1 answered first: still no S0, and no G2
  run();
  BOOST_CHECK_EQUAL(a2a().size(), 2u);
  complete_a2a(comms->calls.at(0));  // G0: now S0, then G2
  run();
  hold_a2a = false;
  for (size_t i = 2; i < comms->calls.size(); ++i)
    complete_a2a(comms->calls[i]);
  run();
  const std::vector<std::string> order = {"comm: gather 1/0",  "comm: gather 1/1",
                                          "comm: scatter 1/0", "comm: gather 1/2",
                                          "comm: scatter 1/1", "comm: scatter 1/2"};
  auto got = a2a();
  BOOST_CHECK_EQUAL_COLLECTIONS(got.begin(), got.end(), order.begin(), order.end());
  for (int c = 0; c < 3; ++c) {  // each chunk: momentum < gather < scatter < apply
    auto id = "1/" + std::to_string(c);
    BOOST_CHECK(position("store: muon_momentum " + id) < position("comm: gather " + id));
    BOOST_CHECK(position("comm: gather " + id) < position("comm: scatter " + id));
    BOOST_CHECK(position("comm: scatter " + id) < position("store: apply_muon " + id));
    if (c > 0)  // the update before the next scatter, which on a device waits for its NS
      BOOST_CHECK(position("store: apply_muon 1/" + std::to_string(c - 1))
                  < position("comm: scatter " + id));
  }
  // The non-Muon rule goes out beside the last chunk's NS: after its gather, before its
  // scatter (which waits for the rule's answer: its work enqueued before the scatter's).
  BOOST_CHECK(position("comm: gather 1/2") < position("store: adamw_step 1"));
  BOOST_CHECK(position("store: adamw_step 1") < position("comm: scatter 1/2"));
  BOOST_CHECK(position("store: apply_muon 1/2") < position("store: finish_step 1"));
  BOOST_CHECK_EQUAL(value_of(r).ns_params, owned_params(0));
  check_updates();
}

// Under a comm that enqueues on the device's stream, chunk c+1's momentum is requested only
// once chunk c's gather is answered (enqueued), so the gather and its NS never queue behind it;
// the updates still come out right.
BOOST_AUTO_TEST_CASE(device_comm_orders_each_momentum_after_the_gather_before_it) {
  opts.comm = "nccl";
  start(kThreeMatrices, 2, 12, 0);
  BOOST_REQUIRE_EQUAL(pl->chunks.size(), 3u);
  hold_a2a = true;
  auto r = step(1);
  auto momenta = [&] {
    size_t n = 0;
    for (const auto& l : lines_of("store"))
      n += l.rfind("store: muon_momentum", 0) == 0;
    return n;
  };
  BOOST_CHECK_EQUAL(momenta(), 1u);  // G0 out and unanswered: no momentum for chunk 1 yet
  complete_a2a(comms->calls.at(0));  // G0 answered: chunk 1's momentum, then G1
  run();
  BOOST_CHECK_EQUAL(momenta(), 2u);
  hold_a2a = false;
  for (size_t i = 1; i < comms->calls.size(); ++i)
    complete_a2a(comms->calls[i]);
  run();
  BOOST_CHECK(!value_of(r).skipped);
  for (int c = 1; c < 3; ++c)
    BOOST_CHECK(position("comm: gather 1/" + std::to_string(c - 1))
                < position("store: muon_momentum 1/" + std::to_string(c)));
  check_updates();
}

BOOST_AUTO_TEST_CASE(each_parameter_steps_with_its_hyperparameter_groups_values) {
  // One chunk holding "a" (group 0) and "b" (group 1); AdamW "bias" in group 1, "gain" in 0.
  std::vector<param_spec> table = {{"a", {4, 3}}, {"b", {3, 5}}, {"bias", {3}}, {"gain", {5}}};
  table[1].hparam_group = table[2].hparam_group = 1;
  start(table, 1, 1000, 0);
  BOOST_REQUIRE_EQUAL(pl->chunks.size(), 1u);
  auto req = request(1);
  group_hparams g1 = req.groups[0];
  g1.muon.lr = 0.5f;
  g1.muon.momentum = 0.7f;
  g1.muon.nesterov = true;
  g1.muon.weight_decay = 0.3f;
  g1.muon.ns.steps = 3;
  g1.muon.ns.coefficients = {2.0f, -1.5f, 0.5f};
  g1.muon.ns.variant = ns_variant::standard;
  g1.muon.adjust_lr = adjust_lr_rule::match_rms_adamw;
  g1.adamw = adamw_options{0.004f, 0.5f, 0.6f, 1e-6f, 0.2f};
  req.groups.push_back(g1);
  groups = req.groups;
  auto r = step(req);
  BOOST_REQUIRE(!value_of(r).skipped);
  // One table for the step, with unscale_clip; the chunk's messages carry none.
  const auto& sent = *stored->unscales.at(0).groups;
  BOOST_REQUIRE_EQUAL(sent.size(), 2u);
  BOOST_CHECK(sent[0].muon.momentum == 0.9f && !sent[0].muon.nesterov && sent[0].muon.lr == 0.02f
              && sent[0].muon.weight_decay == 0.1f);
  BOOST_CHECK(sent[1].muon.momentum == 0.7f && sent[1].muon.nesterov && sent[1].muon.lr == 0.5f
              && sent[1].muon.weight_decay == 0.3f);
  check_updates();  // "b" orthogonalized with its group's 3 steps, coefficients and scale
  BOOST_CHECK(sent[1].adamw.lr == 0.004f && sent[1].adamw.beta1 == 0.5f
              && sent[1].adamw.beta2 == 0.6f && sent[1].adamw.eps == 1e-6f
              && sent[1].adamw.weight_decay == 0.2f);
  BOOST_CHECK(sent[0].adamw.lr == 0.001f && sent[0].adamw.beta1 == 0.8f
              && sent[0].adamw.beta2 == 0.99f && sent[0].adamw.eps == 1e-8f
              && sent[0].adamw.weight_decay == 0.05f);
  // The next request's values apply to the next step.
  req.step = 2;
  req.groups[0].muon.momentum = 0.5f;
  req.groups[1].muon.ns.steps = 4;
  groups = req.groups;
  stored->unscales.clear();
  stored->applies.clear();
  BOOST_REQUIRE(!value_of(step(req)).skipped);
  const auto& next = *stored->unscales.at(0).groups;
  BOOST_CHECK(next.at(0).muon.momentum == 0.5f && next.at(1).muon.momentum == 0.7f);
  check_updates();
}

BOOST_AUTO_TEST_CASE(a_parameter_no_rank_touched_is_marked_and_the_collectives_stay) {
  std::vector<param_spec> table = kThreeMatrices;
  table.push_back({"bias", {3}});
  table.push_back({"gain", {5}});
  start(table, 2, 1000, 0);
  auto req = request(1);
  req.touched = {1, 0, 1, 0, 1};  // "b" and "bias" got no gradient on any rank
  auto r = step(req);
  BOOST_REQUIRE(!value_of(r).skipped);
  // NS still runs on every matrix (this rank's share of them): the same collectives.
  BOOST_CHECK_EQUAL(value_of(r).ns_params, owned_params(0));
  BOOST_CHECK(stored->unscales.at(0).touched == (std::vector<uint8_t>{1, 0, 1, 0, 1}));
  BOOST_CHECK(lines_of("comm")
              == (std::vector<std::string>{"comm: gather 1/0", "comm: scatter 1/0"}));
}

BOOST_AUTO_TEST_CASE(step_without_muon_parameters_runs_adamw_only) {
  start({{"embed", {4, 3}}, {"bias", {3}}}, 1, 1000, 0);
  BOOST_CHECK(!value_of(step(1)).skipped);
  BOOST_CHECK(lines_of("store")
              == (std::vector<std::string>{"store: unscale_clip 1", "store: adamw_step 1",
                                           "store: finish_step 1"}));
  BOOST_CHECK(lines_of("comm").empty());
}

BOOST_AUTO_TEST_CASE(per_head_matrix_is_orthogonalized_block_by_block) {
  start({{"qkv", {6, 4}, param_group::automatic, 3}, {"up", {8, 2}}}, 1, 1000, 0);
  auto r = step(1);
  BOOST_CHECK_EQUAL(value_of(r).ns_params, 2);
  BOOST_CHECK_EQUAL(value_of(r).ns_matrices, 3 + 1);  // three [2, 4] heads and one [8, 2]
  check_updates();
}

// World 1: the plan lays the Muon state out in the owner's NS order ("w" [2, 4] before "up"
// [8, 2], against the table's order), so u is the owner's buffer: no collective at all, and
// the updates come out right.
BOOST_AUTO_TEST_CASE(world_one_runs_ns_in_place_of_the_gather_and_the_scatter) {
  start({{"up", {8, 2}}, {"w", {2, 4}}, {"bias", {3}}}, 1, 1000, 0);
  BOOST_REQUIRE(pl->params[1].state_offset < pl->params[0].state_offset);
  auto r = step(1);
  BOOST_CHECK(!value_of(r).skipped);
  BOOST_CHECK(lines_of("comm").empty());
  BOOST_CHECK_EQUAL(value_of(r).ns_matrices, 2);
  check_updates();
}

// A matrix split into blocks of two shapes: the owner lays its blocks out apart (by shape), not
// as the shard holds them, so even at world 1 the gather and the scatter move them.
BOOST_AUTO_TEST_CASE(world_one_gathers_blocks_the_shard_does_not_hold_in_ns_order) {
  param_spec qkv{"qkv", {6, 4}};
  qkv.split_sizes = {4, 2};
  start({qkv, {"up", {8, 2}}}, 1, 1000, 0);
  auto r = step(1);
  BOOST_CHECK(!value_of(r).skipped);
  BOOST_CHECK(lines_of("comm")
              == (std::vector<std::string>{"comm: gather 1/0", "comm: scatter 1/0"}));
  BOOST_CHECK_EQUAL(value_of(r).ns_matrices, 3);
  check_updates();
}

void check_world_two(coord_fixture& f, int rank) {
  f.checks->sum_squares = 400.0;  // both ranks' (the vote's) sum
  f.start(kWorldTwo, 2, 24, rank);
  const auto& pl = *f.pl;
  BOOST_REQUIRE_EQUAL(pl.chunks.size(), 3u);
  BOOST_REQUIRE(pl.params[0].owner == 0 && pl.params[1].owner == 1 && pl.params[2].owner == 0);
  auto r = f.step(1);
  const std::vector<std::string> order = {"comm: gather 1/0",  "comm: gather 1/1",
                                          "comm: scatter 1/0", "comm: gather 1/2",
                                          "comm: scatter 1/1", "comm: scatter 1/2"};
  auto got = f.lines_of("comm");
  BOOST_CHECK_EQUAL_COLLECTIONS(got.begin(), got.end(), order.begin(), order.end());
  for (int c = 0; c < 3; ++c)
    for (int q = 0; q < 2; ++q) {  // what this rank handed the comm for every peer
      BOOST_TEST_CONTEXT("rank " << rank << ", chunk " << c << ", to rank " << q) {
        const auto& gathered = f.sent.at({true, c}).at(q);
        const auto& scattered = f.sent.at({false, c}).at(q);
        BOOST_CHECK(gathered == f.gather_send(c, q));
        auto want = f.scatter_send(c, q);
        BOOST_REQUIRE_EQUAL(scattered.size(), want.size());
        for (size_t k = 0; k < want.size(); ++k)
          BOOST_CHECK_SMALL(scattered[k] - want[k], 1e-5f);
      }
    }
  f.check_updates();
  const auto& res = value_of(r);
  BOOST_CHECK_CLOSE(res.grad_norm, std::sqrt(400.0) / (1024.0 * 4.0), 1e-9);
  int owned = rank == 0 ? 2 : 1;
  BOOST_CHECK_EQUAL(res.ns_params, owned);
  BOOST_CHECK_EQUAL(res.ns_matrices, owned);
}

BOOST_AUTO_TEST_CASE(clean_step_world_two_rank_zero) {
  check_world_two(*this, 0);
}
BOOST_AUTO_TEST_CASE(clean_step_world_two_rank_one) {
  check_world_two(*this, 1);
}

// NorMuon: normuon_step goes to the store after the gather's NS and before the scatter, only in
// an applied step; cautious weight decay rides on the step's table (unscale_clip).
BOOST_AUTO_TEST_CASE(normuon_step_follows_ns_only_in_applied_steps) {
  start(kOneMatrix, 2, 1000, 0);
  auto req = [this](uint64_t s) {
    step_request r = request(s);
    r.groups[0].muon.variant = muon_variant::normuon;
    r.groups[0].muon.cautious_weight_decay = r.groups[0].adamw.cautious_weight_decay = true;
    return r;
  };
  auto r = step(req(1));
  const std::vector<std::string> expected = {"reducer: flush 1",        "scaler: check_overflow 1",
                                             "store: unscale_clip 1",   "store: muon_momentum 1/0",
                                             "comm: gather 1/0",        "store: adamw_step 1",
                                             "store: normuon_step 1/0", "comm: scatter 1/0",
                                             "store: apply_muon 1/0",   "store: finish_step 1"};
  BOOST_CHECK_EQUAL_COLLECTIONS(trace->lines.begin(), trace->lines.end(), expected.begin(),
                                expected.end());
  BOOST_CHECK(!value_of(r).skipped);
  const auto& rule = stored->unscales.at(0).groups->at(0);
  BOOST_CHECK(rule.muon.cautious_weight_decay && rule.adamw.cautious_weight_decay);
  trace->lines.clear();
  checks->overflow = true;
  auto skipped = step(req(2));
  BOOST_CHECK(value_of(skipped).skipped);
  for (const auto& line : trace->lines)
    BOOST_CHECK_MESSAGE(line.find("normuon_step") == std::string::npos, line);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace zmuon::test
