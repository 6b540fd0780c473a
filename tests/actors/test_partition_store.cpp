// The partition store alone, on the host compute backend, under CAF's testing scheduler: every
// request's effect on the store's state (read back with snapshot_atom) against a hand
// computation in double precision.
#define BOOST_TEST_MODULE partition_store
#include "support/actor_fixture.hpp"

#include <cmath>
#include <limits>

#include "actors/partition_store.hpp"
#include "kernels/bf16.hpp"
#include "kernels/compute.hpp"
#include "plan/ownership.hpp"
#include "plan/plan.hpp"

namespace zmuon::test {
namespace {

constexpr int kWorld = 2;
constexpr int kRank = 1;

// Buckets of at most 20 elements: [a] [b, c] [embed]; Muon chunks [a] [c]; padding on rank 1.
std::shared_ptr<const plan> make_test_plan() {
  auto pl = make_plan(
      {{"a.weight", {3, 5}}, {"b.bias", {5}}, {"c.weight", {4, 2}}, {"embed", {6, 2}}}, kWorld, 20);
  BOOST_REQUIRE(pl);
  BOOST_REQUIRE_EQUAL(pl->buckets.size(), 3u);
  BOOST_REQUIRE_EQUAL(pl->chunks.size(), 2u);
  BOOST_REQUIRE(pl->params[0].muon && !pl->params[1].muon && pl->params[2].muon
                && !pl->params[3].muon);
  return std::make_shared<const plan>(std::move(*pl));
}

/// Deterministic multiples of 1/8 in [-1, 1]: sums and products of a few stay exact.
std::vector<float> eighths(int64_t n, int seed) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((i * 37 + seed * 11) % 17 - 8) * 0.125f;
  return v;
}

void check_close(const std::vector<float>& got, const std::vector<double>& ref, double rtol,
                 double atol, const std::string& what) {
  BOOST_REQUIRE_EQUAL(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i)
    BOOST_CHECK_MESSAGE(std::abs(got[i] - ref[i]) <= rtol * std::abs(ref[i]) + atol,
                        what << "[" << i << "] = " << got[i] << ", expected " << ref[i]);
}

/// A group's values: Muon's momentum, Nesterov, lr and weight decay; AdamW's `adamw`.
group_hparams muon_values(float beta, bool nesterov, float lr, float wd, adamw_options adamw = {}) {
  group_hparams g;
  g.muon.momentum = beta;
  g.muon.nesterov = nesterov;
  g.muon.lr = lr;
  g.muon.weight_decay = wd;
  g.adamw = adamw;
  return g;
}

group_hparams adamw_values(float lr, float beta1, float beta2, float eps, float wd) {
  return muon_values(0.95f, true, 0.0f, 0.0f, adamw_options{lr, beta1, beta2, eps, wd});
}

/// A host backend of its own (its own memory meter).
std::shared_ptr<compute_backend> host_backend() {
  auto made = make_compute_backend("host");
  BOOST_REQUIRE(made);
  return std::shared_ptr<compute_backend>(std::move(*made));
}

struct store_fixture : actor_fixture {
  std::shared_ptr<const plan> pl = make_test_plan();
  std::shared_ptr<compute_backend> be = host_backend();
  partition_store_actor store = keep(spawn_partition_store(sys, pl, kRank, be));

  store_fixture() { run(); }

  template <class Reply = ack, class Msg>
  std::shared_ptr<reply_slot<Reply>> call(Msg msg) {
    auto r = ask<Reply>(store, std::move(msg));
    run();
    return r;
  }

  store_snapshot snapshot() { return value_of(call<store_snapshot>(snapshot_atom::value)); }

  /// Bucket b's pieces of `g` (the caller's gradients, laid out as the shard): each parameter's
  /// shard where it lies in g, but parameter `skip`'s.
  gradient_pieces pieces_of(const std::vector<float>& g, int b, int skip = -1) const {
    const auto& bk = pl->buckets[b];
    std::vector<copy_piece> pieces;
    for (int i = bk.first_param; i < bk.end_param; ++i)
      if (i != skip)
        pieces.push_back({g.data() + pl->params[i].shard_offset,
                          pl->params[i].shard_offset - bk.shard_offset, pl->params[i].shard_len});
    return std::make_shared<const std::vector<copy_piece>>(std::move(pieces));
  }

  /// call() to another store.
  template <class Reply = ack, class Msg>
  Reply call_on(partition_store_actor& to, Msg msg) {
    auto r = ask<Reply>(to, std::move(msg));
    run();
    return value_of(r);
  }

  void load(const std::vector<float>& params) {
    value_of(call(load_params{0, std::make_shared<const std::vector<float>>(params)}));
  }

  /// Accumulates `grads` (a whole shard) bucket by bucket; the views live until the replies.
  void accumulate_all(uint64_t step, const std::vector<float>& grads) {
    std::vector<float> copy = grads;
    for (int b = 0; b < static_cast<int>(pl->buckets.size()); ++b) {
      const auto& bk = pl->buckets[b];
      auto r = call(accumulate{step, 0, b, {copy.data() + bk.shard_offset, bk.shard_len}});
      BOOST_CHECK_EQUAL(value_of(r).step, step);
    }
  }

  /// The step's values (unscale_clip with factor 1): one table of groups, the touched mask.
  void begin(uint64_t step, std::vector<group_hparams> groups, std::vector<uint8_t> touched = {}) {
    auto table = std::make_shared<const std::vector<group_hparams>>(std::move(groups));
    value_of(call(unscale_clip{step, 1.0f, table, std::move(touched)}));
  }

  /// Runs muon_momentum on every chunk, after the step's values (one group with `beta` and
  /// `nesterov`); returns u in the store's Muon-state layout.
  std::vector<float> momentum_all(uint64_t step, float beta, bool nesterov,
                                  momentum_writes writes = momentum_writes::both) {
    begin(step, {muon_values(beta, nesterov, 0.0f, 0.0f)});
    std::vector<float> u(pl->muon_state_total, -99.0f);
    for (int c = 0; c < static_cast<int>(pl->chunks.size()); ++c) {
      const auto& ch = pl->chunks[c];
      float_view out{u.data() + ch.state_offset, ch.shard_len};
      value_of(call(muon_momentum{step, c, out, writes}));
    }
    return u;
  }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(partition_store_alone, store_fixture)

BOOST_AUTO_TEST_CASE(accumulate_adds_each_slice_into_its_bucket) {
  const auto& b1 = pl->buckets[1];
  auto s1 = eighths(b1.shard_len, 1);
  auto s2 = eighths(b1.shard_len, 2);
  auto s0 = eighths(pl->buckets[0].shard_len, 3);
  BOOST_CHECK_EQUAL(value_of(call(accumulate{4, 0, 1, {s1.data(), b1.shard_len}})).step, 4u);
  BOOST_CHECK_EQUAL(value_of(call(accumulate{4, 1, 1, {s2.data(), b1.shard_len}})).step, 4u);
  value_of(call(accumulate{4, 1, 0, {s0.data(), pl->buckets[0].shard_len}}));
  std::vector<float> expected(pl->shard_total, 0.0f);
  for (int64_t i = 0; i < b1.shard_len; ++i)
    expected[b1.shard_offset + i] = s1[i] + s2[i];  // exact: multiples of 1/8
  for (int64_t i = 0; i < pl->buckets[0].shard_len; ++i)
    expected[pl->buckets[0].shard_offset + i] = s0[i];
  auto snap = snapshot();
  BOOST_CHECK(snap.grads == expected);
  BOOST_CHECK(snap.params == std::vector<float>(pl->shard_total, 0.0f));
  BOOST_CHECK(snap.momentum == std::vector<float>(pl->muon_state_total, 0.0f));
}

// The caller's gradients as a bucket's pieces (a reduced device hand-over): the first copied in
// (zeros where no piece lands), the next added, the scan of what the bucket holds; pieces that
// overlap or leave the bucket are refused and change nothing.
BOOST_AUTO_TEST_CASE(accumulate_reads_a_buckets_pieces_where_they_lie) {
  const auto& b1 = pl->buckets[1];
  const int64_t n = b1.shard_len;
  BOOST_REQUIRE(n >= 4);
  auto g1 = eighths(n, 1);
  auto g2 = eighths(n, 2);
  auto of = [&](const std::vector<float>& g, std::vector<copy_piece> pieces) {
    for (auto& p : pieces)
      p.src = g.data() + p.dst_offset;
    return std::make_shared<const std::vector<copy_piece>>(std::move(pieces));
  };
  accumulate first{4, 0, 1, {}, false, of(g1, {{nullptr, 0, 1}, {nullptr, 2, n - 2}})};
  value_of(call(first));  // element 1 gets no piece: zero
  accumulate second{4, 1, 1, {}, false, of(g2, {{nullptr, 0, 2}, {nullptr, 2, n - 2}})};
  value_of(call(second));
  std::vector<float> expected(pl->shard_total, 0.0f);
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = (i == 1 ? 0.0f : g1[i]) + g2[i];  // exact: multiples of 1/8
    expected[b1.shard_offset + i] = v;
    ss += static_cast<double>(v) * v;
  }
  BOOST_CHECK(snapshot().grads == expected);
  BOOST_CHECK_CLOSE(value_of(call<grad_scan>(scan_grads{4})).sum_squares, ss, 1e-10);
  accumulate overlapping{4, 2, 1, {}, false, of(g1, {{nullptr, 0, 3}, {nullptr, 2, 1}})};
  check_error(call(overlapping), errc::shape_mismatch, "bucket 1");
  accumulate outside{4, 2, 1, {}, false, of(g1, {{nullptr, 1, n}})};
  check_error(call(outside), errc::shape_mismatch, "bucket 1");
  BOOST_CHECK(snapshot().grads == expected);
}

// A bucket's first pieces of a step, each a parameter's gradient where the caller keeps it, are
// read there: the scan, the momentum and the non-Muon rule equal, bit for bit, those of a store
// whose gradients were copied in; a change the caller makes after the accumulate shows in the
// step (nothing copied); a parameter no piece reaches reads zeros; nothing is written into the
// caller's memory. A later micro-batch's add copies the bucket in first.
BOOST_AUTO_TEST_CASE(a_buckets_first_pieces_are_read_in_place_by_the_step) {
  auto copied = keep(spawn_partition_store(sys, pl, kRank, be));
  run();
  const auto params = eighths(pl->shard_total, 3);
  load(params);
  call_on(copied, load_params{0, std::make_shared<const std::vector<float>>(params)});
  accumulate_all(0, eighths(pl->shard_total, 9));  // left in the buffer, only marked zero
  value_of(call(discard_grads{0}));
  auto g = eighths(pl->shard_total, 4);  // the caller's gradients, laid out as the shard
  const auto& gap = pl->params[1];       // b.bias: no piece reaches it
  std::vector<float> flat = g;
  std::fill(flat.begin() + gap.shard_offset, flat.begin() + gap.shard_offset + gap.shard_len, 0.f);
  const auto hand_over = [&](uint64_t step) {
    for (int b = 0; b < static_cast<int>(pl->buckets.size()); ++b)
      value_of(call(accumulate{step, 0, b, {}, false, pieces_of(g, b, 1)}));
  };
  const auto copy_in = [&](uint64_t step) {
    for (int b = 0; b < static_cast<int>(pl->buckets.size()); ++b) {
      const auto& bk = pl->buckets[b];
      call_on(copied, accumulate{step, 0, b, {flat.data() + bk.shard_offset, bk.shard_len}});
    }
  };
  hand_over(1);
  copy_in(1);
  const auto scan = value_of(call<grad_scan>(scan_grads{1}));
  const auto scan_copied = call_on<grad_scan>(copied, scan_grads{1});
  BOOST_CHECK(!scan.nonfinite && !scan_copied.nonfinite);
  BOOST_CHECK_EQUAL(scan.sum_squares, scan_copied.sum_squares);
  BOOST_CHECK_GT(scan.sum_squares, 0.0);

  // The caller changes c.weight's gradient after the accumulate; the copied store gets it anew.
  const auto& changed = pl->params[2];
  for (int64_t i = 0; i < changed.shard_len; ++i) {
    g[changed.shard_offset + i] *= 2.0f;
    flat[changed.shard_offset + i] *= 2.0f;
  }
  call_on(copied, discard_grads{1});
  copy_in(1);
  const std::vector<float> caller = g;
  auto table = std::make_shared<const std::vector<group_hparams>>(std::vector<group_hparams>{
      muon_values(0.9f, true, 0.1f, 0.5f, adamw_options{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f})});
  std::vector<std::vector<float>> u(2, std::vector<float>(pl->muon_state_total, -99.0f));
  int which = 0;
  for (partition_store_actor* to : {&store, &copied}) {
    call_on(*to, unscale_clip{1, 1.0f, table, {}});
    for (int c = 0; c < static_cast<int>(pl->chunks.size()); ++c) {
      const auto& ch = pl->chunks[c];
      call_on(*to, muon_momentum{1, c, {u[which].data() + ch.state_offset, ch.shard_len}});
    }
    call_on(*to, adamw_step{1});
    call_on(*to, finish_step{1, false});
    ++which;
  }
  BOOST_CHECK(g == caller);
  BOOST_CHECK(u[0] == u[1]);
  const auto a = snapshot();
  const auto b = call_on<store_snapshot>(copied, snapshot_atom::value);
  BOOST_CHECK(a.params == b.params);
  BOOST_CHECK(a.params != params);  // AdamW moved them
  BOOST_CHECK(a.momentum == b.momentum);
  BOOST_CHECK(a.exp_avg == b.exp_avg);
  BOOST_CHECK(a.exp_avg_sq == b.exp_avg_sq);
  std::vector<double> changed_m(changed.shard_len);  // momentum from zero: (1 - beta) * 2g
  for (int64_t i = 0; i < changed.shard_len; ++i)
    changed_m[i] = 0.1 * static_cast<double>(g[changed.shard_offset + i]);
  check_close(std::vector<float>(a.momentum.begin() + changed.state_offset,
                                 a.momentum.begin() + changed.state_offset + changed.shard_len),
              changed_m, 1e-6, 0, "c.weight's momentum");

  // Step 2: pieces, then a second micro-batch's slice added: the buffer holds both.
  hand_over(2);
  std::vector<float> more = eighths(pl->shard_total, 5);
  for (int b = 0; b < static_cast<int>(pl->buckets.size()); ++b) {
    const auto& bk = pl->buckets[b];
    value_of(call(accumulate{2, 1, b, {more.data() + bk.shard_offset, bk.shard_len}}));
  }
  std::vector<float> sum(pl->shard_total);
  for (size_t i = 0; i < sum.size(); ++i)
    sum[i] = flat[i] + more[i];  // exact: multiples of 1/8
  BOOST_CHECK(snapshot().grads == sum);

  // A step() refused before it began: copy_in_grads takes the pieces into the buffer, and the
  // caller may write them from then on.
  value_of(call(finish_step{2, false}));
  hand_over(3);
  value_of(call(copy_in_grads{3}));
  std::fill(g.begin(), g.end(), std::nanf(""));
  BOOST_CHECK(snapshot().grads == flat);
}

// A store whose momentum may go ahead of the vote: the buckets read in place scan their non-Muon
// gradients alone, the chunks' spare momentum calls scan the Muon ones, and the vote's scan
// waits for the calls of the chunks ahead of it (chunks_ahead), scans the other chunks' Muon
// gradients itself and sums them all: the sum of squares of a store that scans every gradient
// at the accumulate, and a non-finite value seen wherever it lies.
BOOST_AUTO_TEST_CASE(the_muon_gradients_scan_comes_with_the_momentum_ahead_of_the_vote) {
  auto ahead = keep(spawn_partition_store(sys, pl, kRank, be, nullptr, true));
  run();
  std::vector<float> g = eighths(pl->shard_total, 4);  // the caller's gradients
  const auto hand_over = [&](partition_store_actor& to, uint64_t step) {
    for (int b = 0; b < static_cast<int>(pl->buckets.size()); ++b)
      call_on(to, accumulate{step, 0, b, {}, false, pieces_of(g, b)});
  };
  auto table = std::make_shared<const std::vector<group_hparams>>(
      std::vector<group_hparams>{muon_values(0.9f, true, 0.1f, 0.0f)});
  std::vector<float> u(pl->muon_state_total);
  // The vote asked first, as the loss scaler may; the chunks' momentum follows, those of
  // [0, chunks) ahead of it.
  const auto chunks = static_cast<int32_t>(pl->chunks.size());
  const auto vote_ahead = [&](uint64_t step, std::vector<bool>* answered_early = nullptr,
                              int32_t chunks_ahead = -1) {
    auto r = ask<grad_scan>(ahead, scan_grads{step, chunks_ahead < 0 ? chunks : chunks_ahead});
    run();
    call_on(ahead, unscale_clip{step, 1.0f, table, {}});
    for (int c = 0; c < static_cast<int>(pl->chunks.size()); ++c) {
      if (answered_early)
        answered_early->push_back(r->done);
      const auto& ch = pl->chunks[c];
      call_on(ahead,
              muon_momentum{
                  step, c, {u.data() + ch.state_offset, ch.shard_len}, momentum_writes::spare});
    }
    return value_of(r);
  };

  hand_over(store, 1);
  const grad_scan want = value_of(call<grad_scan>(scan_grads{1}));
  BOOST_REQUIRE(!want.nonfinite && want.sum_squares > 0.0);
  hand_over(ahead, 1);
  std::vector<bool> early;
  const grad_scan got = vote_ahead(1, &early);
  BOOST_CHECK(early == std::vector<bool>(pl->chunks.size(), false));  // waited for every chunk
  BOOST_CHECK(!got.nonfinite);
  BOOST_CHECK_CLOSE(got.sum_squares, want.sum_squares, 1e-10);
  call_on(ahead, finish_step{1, false});

  // One chunk ahead of the vote (the coordinator's later chunks wait for it): the scan waits
  // for chunk 0's call alone and takes chunk 1's gradients itself; chunk 1's call, after the
  // answer, adds nothing.
  hand_over(ahead, 1);
  early.clear();
  const grad_scan one_ahead = vote_ahead(1, &early, 1);
  BOOST_CHECK(early == (std::vector<bool>{false, true}));
  BOOST_CHECK(!one_ahead.nonfinite);
  BOOST_CHECK_CLOSE(one_ahead.sum_squares, want.sum_squares, 1e-10);
  call_on(ahead, finish_step{1, false});

  // A NaN in a Muon gradient of each chunk (a.weight, c.weight), then in a non-Muon one
  // (embed), each found by the vote, one chunk ahead of it or both.
  for (int32_t chunks_ahead : {1, 2})
    for (int param : {0, 2, 3}) {
      g = eighths(pl->shard_total, 5);
      g[pl->params[param].shard_offset + 1] = std::nanf("");
      hand_over(ahead, 2);
      BOOST_CHECK_MESSAGE(vote_ahead(2, nullptr, chunks_ahead).nonfinite,
                          pl->params[param].name << ", chunks ahead " << chunks_ahead);
      call_on(ahead, discard_grads{2});
    }

  // No chunk ahead (a step that does not go ahead): the scan takes the Muon gradients itself,
  // at once.
  g = eighths(pl->shard_total, 4);
  hand_over(ahead, 3);
  const grad_scan itself = call_on<grad_scan>(ahead, scan_grads{3, 0});
  BOOST_CHECK(!itself.nonfinite);
  BOOST_CHECK_CLOSE(itself.sum_squares, want.sum_squares, 1e-10);
  call_on(ahead, discard_grads{3});
  g[pl->params[0].shard_offset] = std::numeric_limits<float>::infinity();  // a.weight
  hand_over(ahead, 4);
  BOOST_CHECK(call_on<grad_scan>(ahead, scan_grads{4, 0}).nonfinite);
}

BOOST_AUTO_TEST_CASE(a_store_whose_every_bucket_is_read_in_place_allocates_no_gradient) {
  // Each store on a backend of its own, so that each one's memory is its own.
  const auto be_in_place = host_backend(), be_copied = host_backend();
  auto in_place = keep(spawn_partition_store(sys, pl, kRank, be_in_place));
  auto copied = keep(spawn_partition_store(sys, pl, kRank, be_copied));
  run();
  const auto params = eighths(pl->shard_total, 3);
  for (partition_store_actor* to : {&in_place, &copied})
    call_on(*to, load_params{0, std::make_shared<const std::vector<float>>(params)});
  auto g = eighths(pl->shard_total, 4);  // the caller's gradients, a piece for every parameter
  std::vector<float> more = eighths(pl->shard_total, 6);
  auto table = std::make_shared<const std::vector<group_hparams>>(std::vector<group_hparams>{
      muon_values(0.9f, true, 0.1f, 0.5f, adamw_options{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f})});
  // A step: bucket by bucket the caller's pieces to one store and the same values to the
  // other's buffer, and with `second` another micro-batch added to both; u of both.
  const auto step = [&](uint64_t s, bool second) {
    for (int b = 0; b < static_cast<int>(pl->buckets.size()); ++b) {
      const auto& bk = pl->buckets[b];
      call_on(in_place, accumulate{s, 0, b, {}, false, pieces_of(g, b)});
      call_on(copied, accumulate{s, 0, b, {g.data() + bk.shard_offset, bk.shard_len}});
      for (partition_store_actor* to : {&in_place, &copied})
        if (second)
          call_on(*to, accumulate{s, 1, b, {more.data() + bk.shard_offset, bk.shard_len}});
    }
    std::vector<std::vector<float>> u(2, std::vector<float>(pl->muon_state_total, -99.0f));
    int which = 0;
    for (partition_store_actor* to : {&in_place, &copied}) {
      BOOST_CHECK(!call_on<grad_scan>(*to, scan_grads{s}).nonfinite);
      call_on(*to, unscale_clip{s, 1.0f, table, {}});
      for (int c = 0; c < static_cast<int>(pl->chunks.size()); ++c) {
        const auto& ch = pl->chunks[c];
        call_on(*to, muon_momentum{s, c, {u[which].data() + ch.state_offset, ch.shard_len}});
      }
      call_on(*to, adamw_step{s});
      call_on(*to, finish_step{s, false});
      ++which;
    }
    BOOST_CHECK(u[0] == u[1]);
    const auto a = call_on<store_snapshot>(in_place, saved_state_atom::value);
    const auto b = call_on<store_snapshot>(copied, saved_state_atom::value);
    BOOST_CHECK(a.params == b.params);
    BOOST_CHECK(a.momentum == b.momentum);
    BOOST_CHECK(a.exp_avg_sq == b.exp_avg_sq);
  };
  const int64_t gradient_bytes = pl->shard_total * static_cast<int64_t>(sizeof(float));
  step(1, false);
  step(2, false);
  BOOST_CHECK_EQUAL(be_copied->memory().in_use - be_in_place->memory().in_use, gradient_bytes);
  // A second micro-batch needs the buffer: allocated then, and kept.
  step(3, true);
  BOOST_CHECK_EQUAL(be_copied->memory().in_use, be_in_place->memory().in_use);
}

BOOST_AUTO_TEST_CASE(scan_reports_sum_of_squares_and_non_finite_values) {
  auto g = eighths(pl->shard_total, 5);
  accumulate_all(2, g);
  double ss = 0;
  for (float x : g)
    ss += static_cast<double>(x) * x;
  auto scan = value_of(call<grad_scan>(scan_grads{2}));
  BOOST_CHECK_EQUAL(scan.step, 2u);
  BOOST_CHECK(!scan.nonfinite);
  BOOST_CHECK_CLOSE(scan.sum_squares, ss, 1e-10);

  // One NaN in the last bucket, then one inf: both are found.
  const auto& last = pl->buckets.back();
  std::vector<float> nan_slice(last.shard_len, 0.0f);
  nan_slice[last.shard_len / 2] = std::nanf("");
  value_of(call(accumulate{
      2, 1, static_cast<int32_t>(pl->buckets.size() - 1), {nan_slice.data(), last.shard_len}}));
  BOOST_CHECK(value_of(call<grad_scan>(scan_grads{2})).nonfinite);
  value_of(call(discard_grads{2}));
  std::vector<float> inf_slice(pl->buckets[0].shard_len, 0.0f);
  inf_slice[0] = -INFINITY;
  value_of(call(accumulate{3, 0, 0, {inf_slice.data(), pl->buckets[0].shard_len}}));
  BOOST_CHECK(value_of(call<grad_scan>(scan_grads{3})).nonfinite);
}

BOOST_AUTO_TEST_CASE(discard_zeroes_grads_and_leaves_the_rest_bit_identical) {
  // Build up non-zero momentum and Adam moments first.
  load(eighths(pl->shard_total, 7));
  accumulate_all(1, eighths(pl->shard_total, 8));
  momentum_all(1, 0.95f, true);
  begin(1, {adamw_values(0.01f, 0.9f, 0.95f, 1e-10f, 0.1f)});
  value_of(call(adamw_step{1}));
  value_of(call(finish_step{1}));
  auto g = eighths(pl->shard_total, 9);
  g[3] = std::nanf("");  // an overflowed step: the gradient holds a NaN
  accumulate_all(2, g);
  auto before = snapshot();
  BOOST_REQUIRE(before.adam_steps == 1);
  BOOST_REQUIRE(before.momentum != std::vector<float>(pl->muon_state_total, 0.0f));
  BOOST_CHECK_EQUAL(value_of(call(discard_grads{2})).step, 2u);
  auto after = snapshot();
  BOOST_CHECK(after.grads == std::vector<float>(pl->shard_total, 0.0f));
  BOOST_CHECK(bit_identical(after.params, before.params));
  BOOST_CHECK(bit_identical(after.momentum, before.momentum));
  BOOST_CHECK(bit_identical(after.exp_avg, before.exp_avg));
  BOOST_CHECK(bit_identical(after.exp_avg_sq, before.exp_avg_sq));
  BOOST_CHECK_EQUAL(after.adam_steps, before.adam_steps);
}

BOOST_AUTO_TEST_CASE(each_step_gradient_starts_from_zero_in_the_buckets_it_never_reached) {
  // Step 1 writes every bucket; nothing zeroes them in between (the store only forgets them).
  BOOST_REQUIRE_GE(pl->buckets.size(), 2u);
  accumulate_all(1, eighths(pl->shard_total, 6));
  value_of(call(finish_step{1}));
  // Step 2 reaches bucket 1 only, twice: the first slice is the value, the second adds to it.
  const auto& b1 = pl->buckets[1];
  auto s1 = eighths(b1.shard_len, 2);
  auto s2 = eighths(b1.shard_len, 3);
  value_of(call(accumulate{2, 0, 1, {s1.data(), b1.shard_len}}));
  value_of(call(accumulate{2, 1, 1, {s2.data(), b1.shard_len}}));
  std::vector<float> expected(pl->shard_total, 0.0f);
  double ss = 0;
  for (int64_t i = 0; i < b1.shard_len; ++i) {
    expected[b1.shard_offset + i] = s1[i] + s2[i];  // exact: multiples of 1/8
    ss += static_cast<double>(expected[b1.shard_offset + i]) * expected[b1.shard_offset + i];
  }
  BOOST_CHECK_CLOSE(value_of(call<grad_scan>(scan_grads{2})).sum_squares, ss, 1e-10);
  BOOST_CHECK(snapshot().grads == expected);
  // A discarded step leaves nothing behind either: step 3 reaches bucket 0 only.
  value_of(call(discard_grads{2}));
  const auto& b0 = pl->buckets[0];
  auto s0 = eighths(b0.shard_len, 4);
  value_of(call(accumulate{3, 0, 0, {s0.data(), b0.shard_len}}));
  std::fill(expected.begin(), expected.end(), 0.0f);
  std::copy(s0.begin(), s0.end(), expected.begin() + b0.shard_offset);
  BOOST_CHECK(snapshot().grads == expected);
}

BOOST_AUTO_TEST_CASE(unscale_clip_multiplies_the_gradient) {
  auto g = eighths(pl->shard_total, 4);
  accumulate_all(1, g);
  const float factor = 0.3f / (1024.0f * 3.0f);
  auto table = std::make_shared<const std::vector<group_hparams>>(1);
  BOOST_CHECK_EQUAL(value_of(call(unscale_clip{1, factor, table})).step, 1u);
  std::vector<double> ref(g.size());
  double ss = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    ref[i] = static_cast<double>(g[i]) * factor;
    ss += ref[i] * ref[i];
  }
  check_close(snapshot().grads, ref, 1e-7, 0, "grads");
  // The buckets' scans kept by the accumulates are stale now: a scan reads the scaled gradient.
  BOOST_CHECK_CLOSE(value_of(call<grad_scan>(scan_grads{1})).sum_squares, ss, 1e-5);
}

BOOST_AUTO_TEST_CASE(muon_momentum_follows_the_ema_and_nesterov_formulas) {
  const float beta = 0.9f;
  auto g = eighths(pl->shard_total, 6);
  accumulate_all(1, g);
  std::vector<double> m(pl->muon_state_total, 0.0), u_ref(pl->muon_state_total, 0.0);
  auto update_ref = [&](bool nesterov) {
    for (const auto& p : pl->params) {
      if (!p.muon)
        continue;
      for (int64_t i = 0; i < p.shard_len; ++i) {
        double gi = g[p.shard_offset + i];
        double& mi = m[p.state_offset + i];
        mi = beta * mi + (1.0 - beta) * gi;
        u_ref[p.state_offset + i] = nesterov ? (1.0 - beta) * gi + beta * mi : mi;
      }
    }
  };
  auto u = momentum_all(1, beta, true);  // m = (1-beta) g; u = (1-beta) g + beta m
  update_ref(true);
  check_close(u, u_ref, 1e-6, 1e-8, "u (nesterov)");
  check_close(snapshot().momentum, m, 1e-6, 1e-8, "m after one step");
  u = momentum_all(2, beta, false);  // same gradient again: m = beta m + (1-beta) g; u = m
  update_ref(false);
  check_close(u, u_ref, 1e-6, 1e-8, "u (plain)");
  auto snap = snapshot();
  check_close(snap.momentum, m, 1e-6, 1e-8, "m after two steps");
  BOOST_CHECK(snap.grads == g);  // momentum reads the gradient, never changes it
  BOOST_CHECK(snap.params == std::vector<float>(pl->shard_total, 0.0f));
}

// Ahead of the vote the new momentum goes to the store's spare (momentum_writes::spare): u as
// in place, the momentum as it was until finish_step of that step makes the spare the
// momentum, with the in-place call's bits (against a second store writing in place); a step
// refused after it (discard_grads) leaves the momentum as it was, and so does a spare written
// by a step that never finished, when the same step runs again in place.
BOOST_AUTO_TEST_CASE(a_spare_momentum_becomes_the_momentum_when_its_step_finishes) {
  auto g = eighths(pl->shard_total, 6);
  const auto be_in_place = host_backend();
  auto in_place = keep(spawn_partition_store(sys, pl, kRank, be_in_place));
  run();
  std::vector<float> m_before = snapshot().momentum;
  for (uint64_t s = 1; s <= 3; ++s) {
    accumulate_all(s, g);
    for (int b = 0; b < static_cast<int>(pl->buckets.size()); ++b) {
      const auto& bk = pl->buckets[b];
      call_on(in_place, accumulate{s, 0, b, {g.data() + bk.shard_offset, bk.shard_len}});
    }
    const auto u_spare = momentum_all(s, 0.9f, true, momentum_writes::spare);
    BOOST_CHECK(snapshot().momentum == m_before);  // not yet the momentum
    if (s == 2) {  // refused: the spare is dropped (the other store: no momentum at all)
      value_of(call(discard_grads{s}));
      call_on(in_place, discard_grads{s});
      BOOST_CHECK(snapshot().momentum == m_before);
      continue;
    }
    call_on(in_place,
            unscale_clip{s,
                         1.0f,
                         std::make_shared<const std::vector<group_hparams>>(
                             std::vector<group_hparams>{muon_values(0.9f, true, 0.0f, 0.0f)}),
                         {}});
    std::vector<float> u_both(pl->muon_state_total, -99.0f);
    for (int c = 0; c < static_cast<int>(pl->chunks.size()); ++c) {
      const auto& ch = pl->chunks[c];
      call_on(in_place, muon_momentum{s, c, {u_both.data() + ch.state_offset, ch.shard_len}});
    }
    BOOST_CHECK(u_spare == u_both);
    value_of(call(finish_step{s, false}));
    call_on(in_place, finish_step{s, false});
    m_before = snapshot().momentum;
    const auto want = call_on<store_snapshot>(in_place, snapshot_atom::value).momentum;
    BOOST_CHECK(m_before == want);  // bit for bit
    BOOST_CHECK(m_before != std::vector<float>(pl->muon_state_total, 0.0f));
  }
  accumulate_all(4, g);
  momentum_all(4, 0.9f, true, momentum_writes::spare);  // a step that ends here, unfinished
  momentum_all(4, 0.9f, true);                          // and again, in place
  const auto in_place_m = snapshot().momentum;
  BOOST_CHECK(in_place_m != m_before);
  value_of(call(finish_step{4, false}));
  BOOST_CHECK(snapshot().momentum == in_place_m);
}

BOOST_AUTO_TEST_CASE(apply_muon_decays_and_subtracts_the_update) {
  auto p0 = eighths(pl->shard_total, 10);
  load(p0);
  const float lr = 0.05f, wd = 0.2f;
  const int c = 1;  // only c.weight
  const auto& ch = pl->chunks[c];
  auto o = eighths(ch.shard_len, 11);
  begin(3, {muon_values(0.95f, true, lr, wd)});
  BOOST_CHECK_EQUAL(value_of(call(apply_muon{3, c, {o.data(), ch.shard_len}})).step, 3u);
  std::vector<double> ref(p0.begin(), p0.end());
  for (int i : ch.params) {
    const auto& p = pl->params[i];
    for (int64_t k = 0; k < p.shard_len; ++k)
      ref[p.shard_offset + k] = p0[p.shard_offset + k] * (1.0 - double(lr) * wd)
                                - double(lr) * o[p.state_offset - ch.state_offset + k];
  }
  check_close(snapshot().params, ref, 1e-6, 1e-7, "params");
}

// Under bf16 transport the Muon phase's views hold bf16 bits (float_view::bf16): momentum
// writes u rounded to bf16 (within one bf16 rounding, 2^-8 relative, of the exact u; m itself
// stays fp32), and the update is read widened from bf16.
BOOST_AUTO_TEST_CASE(bf16_views_round_u_and_widen_the_update) {
  const float beta = 0.9f;
  auto g = eighths(pl->shard_total, 30);
  accumulate_all(1, g);
  std::vector<uint16_t> bits(static_cast<size_t>(pl->muon_state_total), 0xFFFF);
  begin(1, {muon_values(beta, true, 0.0f, 0.0f)});
  for (int c = 0; c < static_cast<int>(pl->chunks.size()); ++c) {
    const auto& ch = pl->chunks[c];
    float_view out{nullptr, ch.shard_len, bits.data() + ch.state_offset};
    value_of(call(muon_momentum{1, c, out}));
  }
  std::vector<double> m_ref(pl->muon_state_total, 0.0);
  for (const auto& p : pl->params) {
    if (!p.muon)
      continue;
    for (int64_t i = 0; i < p.shard_len; ++i) {
      const double gi = g[p.shard_offset + i];
      const double mi = (1.0 - beta) * gi;
      m_ref[p.state_offset + i] = mi;
      const double u = (1.0 - beta) * gi + beta * mi;
      const double got = from_bf16(bits[p.state_offset + i]);
      BOOST_TEST(std::abs(got - u) <= std::abs(u) * 0x1p-8 + 1e-30, p.name << "[" << i << "]");
    }
  }
  check_close(snapshot().momentum, m_ref, 1e-6, 1e-8, "m");

  auto p0 = eighths(pl->shard_total, 31);
  load(p0);
  const float lr = 0.05f, wd = 0.2f;
  const int c = 1;
  const auto& ch = pl->chunks[c];
  std::vector<uint16_t> o(static_cast<size_t>(ch.shard_len));
  const auto values = eighths(ch.shard_len, 32);
  for (size_t k = 0; k < o.size(); ++k)
    o[k] = to_bf16(values[k]);
  begin(4, {muon_values(beta, true, lr, wd)});
  value_of(call(apply_muon{4, c, float_view{nullptr, ch.shard_len, o.data()}}));
  // bf16 arrives unscaled: the store scales c.weight [4, 2] by sqrt(max(1, 4/2)) ("original").
  const double scale = std::sqrt(2.0);
  std::vector<double> ref(p0.begin(), p0.end());
  for (int i : ch.params) {
    const auto& p = pl->params[i];
    for (int64_t k = 0; k < p.shard_len; ++k)
      ref[p.shard_offset + k] =
          p0[p.shard_offset + k] * (1.0 - double(lr) * wd)
          - double(lr) * scale * from_bf16(o[p.state_offset - ch.state_offset + k]);
  }
  check_close(snapshot().params, ref, 1e-6, 1e-7, "params");
}

BOOST_AUTO_TEST_CASE(adamw_step_matches_a_reference_on_non_muon_shards_only) {
  auto p0 = eighths(pl->shard_total, 12);
  load(p0);
  const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  std::vector<double> p(p0.begin(), p0.end()), m(pl->adam_state_total), v(pl->adam_state_total);
  for (int t = 1; t <= 2; ++t) {
    auto g = eighths(pl->shard_total, 20 + t);
    accumulate_all(t, g);
    begin(t, {adamw_values(float(lr), float(b1), float(b2), float(eps), float(wd))});
    value_of(call(adamw_step{uint64_t(t)}));
    value_of(call(finish_step{uint64_t(t)}));
    for (const auto& prm : pl->params) {  // torch.optim.AdamW, in double
      if (prm.muon)
        continue;
      for (int64_t i = 0; i < prm.shard_len; ++i) {
        double gi = g[prm.shard_offset + i];
        double& mi = m[prm.state_offset + i];
        double& vi = v[prm.state_offset + i];
        double& pi = p[prm.shard_offset + i];
        mi = b1 * mi + (1 - b1) * gi;
        vi = b2 * vi + (1 - b2) * gi * gi;
        double mhat = mi / (1 - std::pow(b1, t)), vhat = vi / (1 - std::pow(b2, t));
        pi = pi * (1 - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
      }
    }
  }
  auto snap = snapshot();
  BOOST_CHECK_EQUAL(snap.adam_steps, 2);
  check_close(snap.params, p, 1e-5, 1e-6, "params");  // Muon shards stay p0 (ref untouched)
  check_close(snap.exp_avg, m, 1e-5, 1e-7, "exp_avg");
  check_close(snap.exp_avg_sq, v, 1e-5, 1e-8, "exp_avg_sq");
  BOOST_CHECK(snap.grads == std::vector<float>(pl->shard_total, 0.0f));  // finish_step
  BOOST_CHECK(snap.momentum == std::vector<float>(pl->muon_state_total, 0.0f));
}

// The touched mask: each touched parameter steps with its group's values; an untouched one keeps
// its value, momentum, moments and AdamW step count bit for bit.
BOOST_AUTO_TEST_CASE(untouched_parameters_stay_as_they_are) {
  load(eighths(pl->shard_total, 40));
  accumulate_all(1, eighths(pl->shard_total, 41));
  momentum_all(1, 0.9f, true);
  begin(1, {adamw_values(0.01f, 0.9f, 0.95f, 1e-8f, 0.1f)});
  value_of(call(adamw_step{1}));
  value_of(call(finish_step{1}));
  const auto before = snapshot();
  // Step 2: "c.weight" (chunk 1) and "b.bias" (AdamW 0) untouched; a gradient for the rest.
  auto g = eighths(pl->shard_total, 42);
  for (int i : {1, 2})
    std::fill_n(g.begin() + pl->params[i].shard_offset, pl->params[i].shard_len, 0.0f);
  accumulate_all(2, g);
  begin(2, {muon_values(0.8f, false, 0.1f, 0.5f, adamw_options{0.02f, 0.8f, 0.9f, 1e-6f, 0.0f})},
        {1, 0, 0, 1});
  std::vector<float> u(pl->muon_state_total, -99.0f);
  std::vector<float> o(pl->muon_state_total, 0.25f);
  for (int c = 0; c < 2; ++c) {
    const auto& ch = pl->chunks[c];
    value_of(call(muon_momentum{2, c, {u.data() + ch.state_offset, ch.shard_len}}));
    value_of(call(apply_muon{2, c, {o.data() + ch.state_offset, ch.shard_len}}));
  }
  value_of(call(adamw_step{2}));
  value_of(call(finish_step{2}));
  const auto after = snapshot();
  auto same = [&](const std::vector<float>& x, const std::vector<float>& y, int64_t off,
                  int64_t n) {
    return std::equal(x.begin() + off, x.begin() + off + n, y.begin() + off);
  };
  const auto &a = pl->params[0], &b = pl->params[1], &c = pl->params[2], &e = pl->params[3];
  BOOST_CHECK(same(after.params, before.params, c.shard_offset, c.shard_len));
  BOOST_CHECK(same(after.momentum, before.momentum, c.state_offset, c.shard_len));
  BOOST_CHECK(same(u, before.momentum, c.state_offset, c.shard_len));  // u = m, unused
  BOOST_CHECK(same(after.params, before.params, b.shard_offset, b.shard_len));
  BOOST_CHECK(same(after.exp_avg, before.exp_avg, b.state_offset, b.shard_len));
  BOOST_CHECK(same(after.exp_avg_sq, before.exp_avg_sq, b.state_offset, b.shard_len));
  BOOST_CHECK(after.adam_param_steps == (std::vector<int64_t>{1, 2}));
  BOOST_CHECK_EQUAL(after.adam_steps, 2);
  for (int64_t k = 0; k < valid_len(a, kRank); ++k) {  // the step's values
    double m = 0.8 * before.momentum[a.state_offset + k] + 0.2 * g[a.shard_offset + k];
    BOOST_CHECK_CLOSE(after.momentum[a.state_offset + k], m, 1e-4);
    double p = before.params[a.shard_offset + k] * (1 - 0.1 * 0.5) - 0.1 * 0.25;
    BOOST_CHECK_CLOSE(after.params[a.shard_offset + k], p, 1e-4);
  }
  for (int64_t k = 0; k < valid_len(e, kRank); ++k) {  // its own values and its second step
    double gi = g[e.shard_offset + k];
    double m = 0.8 * before.exp_avg[e.state_offset + k] + 0.2 * gi;
    double v = 0.9 * before.exp_avg_sq[e.state_offset + k] + 0.1 * gi * gi;
    double p = before.params[e.shard_offset + k]
               - 0.02 * (m / (1 - 0.64)) / (std::sqrt(v / (1 - 0.81)) + 1e-6);
    BOOST_CHECK_CLOSE(after.params[e.shard_offset + k], p, 1e-3);
  }
}

// Each parameter takes its own group's values: the store cuts each chunk's slices (and the AdamW
// parameters') by group once, from the plan, and the table says each group's values.
BOOST_AUTO_TEST_CASE(each_parameter_takes_its_groups_values) {
  std::vector<param_spec> specs = {
      {"a.weight", {3, 5}}, {"b.bias", {5}}, {"c.weight", {4, 2}}, {"embed", {6, 2}}};
  specs[0].hparam_group = specs[3].hparam_group = 1;
  auto made = make_plan(specs, kWorld, 100);
  BOOST_REQUIRE(made);
  auto p2 = std::make_shared<const plan>(std::move(*made));
  BOOST_REQUIRE_EQUAL(p2->chunks.size(), 1u);  // a and c in one chunk, of two groups
  auto st2 = keep(spawn_partition_store(sys, p2, kRank, be));
  auto ask2 = [&](auto msg) {
    auto r = ask<ack>(st2, std::move(msg));
    run();
    return value_of(r).step;
  };
  const auto p0 = eighths(p2->shard_total, 50);
  ask2(load_params{0, std::make_shared<const std::vector<float>>(p0)});
  const auto g = eighths(p2->shard_total, 51);
  for (int b = 0; b < static_cast<int>(p2->buckets.size()); ++b) {
    const auto& bk = p2->buckets[b];
    ask2(accumulate{1, 0, b, {const_cast<float*>(g.data()) + bk.shard_offset, bk.shard_len}});
  }
  const std::vector<group_hparams> groups = {
      muon_values(0.9f, false, 0.1f, 0.5f, adamw_options{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f}),
      muon_values(0.5f, false, 0.3f, 0.0f, adamw_options{0.05f, 0.9f, 0.95f, 1e-8f, 0.0f})};
  ask2(unscale_clip{1, 1.0f, std::make_shared<const std::vector<group_hparams>>(groups)});
  const auto& ch = p2->chunks[0];
  std::vector<float> u(ch.shard_len, -99.0f), o(ch.shard_len, 0.25f);
  ask2(muon_momentum{1, 0, {u.data(), ch.shard_len}});
  ask2(apply_muon{1, 0, {o.data(), ch.shard_len}});
  ask2(adamw_step{1});
  auto snap = value_of([&] {
    auto r = ask<store_snapshot>(st2, snapshot_atom::value);
    run();
    return r;
  }());
  std::vector<double> p(p0.begin(), p0.end()), m(p2->muon_state_total, 0.0);
  for (const auto& prm : p2->params) {
    const auto& gv = groups[prm.hparam_group];
    for (int64_t k = 0; k < prm.shard_len; ++k) {  // padding too: it holds a gradient here
      const double gi = g[prm.shard_offset + k];
      double& pi = p[prm.shard_offset + k];
      if (prm.muon) {  // m = (1 - beta) g (no Nesterov: u = m); p decays, minus lr * 0.25
        m[prm.state_offset + k] = (1.0 - gv.muon.momentum) * gi;
        pi = pi * (1.0 - double(gv.muon.lr) * gv.muon.weight_decay) - double(gv.muon.lr) * 0.25;
      } else {  // AdamW's first step: m_hat = g, v_hat = g^2
        pi = pi * (1.0 - double(gv.adamw.lr) * gv.adamw.weight_decay)
             - double(gv.adamw.lr) * gi / (std::abs(gi) + 1e-8);
      }
    }
  }
  check_close(snap.momentum, m, 1e-6, 1e-8, "momentum");
  check_close(snap.params, p, 1e-5, 1e-6, "params");
}

// What a checkpoint save asks for: every state but the gradient, equal bit for bit to the full
// snapshot's, after a step that left momentum and Adam moments non-zero.
BOOST_AUTO_TEST_CASE(saved_state_is_the_snapshot_without_the_gradient) {
  load(eighths(pl->shard_total, 30));
  accumulate_all(1, eighths(pl->shard_total, 31));
  momentum_all(1, 0.9f, true);
  begin(1, {adamw_values(0.01f, 0.9f, 0.95f, 1e-8f, 0.0f)});
  value_of(call(adamw_step{1}));
  value_of(call(finish_step{1}));
  const store_snapshot saved = value_of(call<store_snapshot>(saved_state_atom::value));
  const store_snapshot full = snapshot();
  BOOST_TEST(saved.grads.empty());
  BOOST_TEST(saved.params == full.params);
  BOOST_TEST(saved.momentum == full.momentum);
  BOOST_TEST(saved.exp_avg == full.exp_avg);
  BOOST_TEST(saved.exp_avg_sq == full.exp_avg_sq);
  BOOST_TEST(saved.adam_steps == full.adam_steps);
  BOOST_TEST(saved.adam_steps == 1);
  const bool momentum_moved = saved.momentum != std::vector<float>(pl->muon_state_total, 0.0f);
  const bool moments_moved = saved.exp_avg != std::vector<float>(pl->adam_state_total, 0.0f);
  BOOST_TEST(momentum_moved);
  BOOST_TEST(moments_moved);
}

BOOST_AUTO_TEST_CASE(wrong_size_views_are_errors_that_change_nothing) {
  load(eighths(pl->shard_total, 13));
  accumulate_all(1, eighths(pl->shard_total, 14));
  auto before = snapshot();
  const auto& ch = pl->chunks[0];
  std::vector<float> buf(ch.shard_len + 1, 7.0f);
  auto untouched = buf;
  check_error(call(muon_momentum{1, 0, {buf.data(), ch.shard_len - 1}}), errc::shape_mismatch,
              "chunk 0");
  check_error(call(muon_momentum{1, 0, {buf.data(), ch.shard_len + 1}}), errc::shape_mismatch,
              "chunk 0");
  check_error(call(muon_momentum{1, 0, {nullptr, ch.shard_len}}), errc::shape_mismatch, "chunk 0");
  check_error(call(muon_momentum{1, 2, {buf.data(), ch.shard_len}}), errc::invalid_argument,
              "chunk 2");
  check_error(call(apply_muon{1, 0, {buf.data(), ch.shard_len - 1}}), errc::shape_mismatch,
              "chunk 0");
  check_error(call(apply_muon{1, -1, {buf.data(), ch.shard_len}}), errc::invalid_argument,
              "chunk -1");
  const auto& b0 = pl->buckets[0];
  check_error(call(accumulate{1, 0, 0, {buf.data(), b0.shard_len - 1}}), errc::shape_mismatch,
              "bucket 0");
  check_error(call(accumulate{1, 0, 3, {buf.data(), b0.shard_len}}), errc::shape_mismatch,
              "bucket 3");
  check_error(call(load_params{1, std::make_shared<const std::vector<float>>(3, 1.0f)}),
              errc::shape_mismatch, "load_params");
  check_error(call(load_params{1, nullptr}), errc::shape_mismatch, "load_params");
  // The step's values come first, whole: a table for every group, a flag for every parameter.
  check_error(call(muon_momentum{1, 0, {buf.data(), ch.shard_len}}), errc::bad_state,
              "unscale_clip comes first");
  check_error(call(adamw_step{1}), errc::bad_state, "adamw_step: step 1 has no values");
  check_error(call(unscale_clip{1, 1.0f, nullptr}), errc::invalid_argument, "1 hyperparameter");
  check_error(
      call(unscale_clip{1, 1.0f, std::make_shared<const std::vector<group_hparams>>(1), {1, 0}}),
      errc::shape_mismatch, "2 touched flags for 4 parameters");
  BOOST_CHECK(buf == untouched);  // nothing was written into the caller's view
  auto after = snapshot();
  BOOST_CHECK(bit_identical(after.params, before.params));
  BOOST_CHECK(bit_identical(after.grads, before.grads));
  BOOST_CHECK(bit_identical(after.momentum, before.momentum));
  BOOST_CHECK(bit_identical(after.exp_avg, before.exp_avg));
  BOOST_CHECK(bit_identical(after.exp_avg_sq, before.exp_avg_sq));
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace zmuon::test
