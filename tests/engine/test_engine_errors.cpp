// Skipped steps and bad input, end to end through the engine: an overflow on one rank skips the
// step everywhere and leaves the state bit-identical; bad calls get errors that name what is
// wrong and change nothing.
#define BOOST_TEST_MODULE engine_errors
#include "support/engine_fixture.hpp"

#include <chrono>
#include <cmath>
#include <limits>

using namespace zmuon;
using namespace zmuon::test;

namespace {

const std::vector<param_spec> table{{"w1", {24, 40}}, {"w2", {40, 24}}, {"bias", {40}}};

struct world_state {
  std::vector<rank_state> ranks;
};

world_state capture(engine& eng) {
  world_state s;
  for (int r = 0; r < eng.world(); ++r)
    s.ranks.push_back(snapshot_of(eng, r));
  return s;
}

void check_unchanged(const world_state& a, const world_state& b, bool grads_too) {
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    BOOST_TEST(same_bits(a.ranks[r].params, b.ranks[r].params));
    BOOST_TEST(same_bits(a.ranks[r].momentum, b.ranks[r].momentum));
    BOOST_TEST(same_bits(a.ranks[r].exp_avg, b.ranks[r].exp_avg));
    BOOST_TEST(same_bits(a.ranks[r].exp_avg_sq, b.ranks[r].exp_avg_sq));
    BOOST_TEST(a.ranks[r].adam_steps == b.ranks[r].adam_steps);
    if (grads_too)
      BOOST_TEST(same_bits(a.ranks[r].grads, b.ranks[r].grads));
  }
}

void expect_error(const error& err, errc code, const std::string& names) {
  BOOST_REQUIRE_MESSAGE(err, "expected an error naming '" << names << "'");
  BOOST_TEST_MESSAGE("error: " << err.to_string());
  BOOST_TEST(to_string(err.code()) == to_string(code));
  BOOST_TEST(err.message().find(names) != std::string::npos);
}

void hand_over(engine& eng, int step, int micros, float scale = 1.0f) {
  for (int k = 0; k < micros; ++k)
    for (int r = 0; r < eng.world(); ++r) {
      auto g = random_grads(table, 21, step, r, k);
      for (auto& [name, v] : g)
        for (auto& x : v)
          x *= scale;
      reduce_ok(eng, r, g);
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(overflow_on_one_rank_skips_the_step_everywhere) {
  auto o = options(4);
  o.fp16.enabled = true;
  o.fp16.hysteresis = 1;  // back off at the first overflow
  auto eng = make_engine(o);
  register_table(*eng, table, 21);
  hand_over(*eng, 1, 2, 65536.0f);
  BOOST_REQUIRE(!step_ok(*eng).skipped);

  auto before = capture(*eng);
  for (int k = 0; k < 2; ++k)  // step 2: rank 2, micro-batch 1 holds one inf
    for (int r = 0; r < 4; ++r) {
      auto g = random_grads(table, 21, 2, r, k);
      for (auto& [name, v] : g)
        for (auto& x : v)
          x *= 65536.0f;
      if (r == 2 && k == 1)
        g["w2"][17] = std::numeric_limits<float>::infinity();
      reduce_ok(*eng, r, g);
    }
  auto info = step_ok(*eng);
  BOOST_TEST(info.skipped);
  BOOST_TEST(info.loss_scale == 65536.0f);
  BOOST_TEST(info.next_loss_scale == 32768.0f);
  BOOST_TEST(info.ns_params == 0);
  auto after = capture(*eng);
  check_unchanged(before, after, false);
  for (auto& r : after.ranks)  // the poisoned gradient is gone
    for (float g : r.grads)
      BOOST_REQUIRE(g == 0.0f);
  auto scale = eng->loss_scale();
  BOOST_REQUIRE(scale);
  BOOST_TEST(*scale == 32768.0f);

  // The next finite step proceeds and equals a run that never saw the bad step.
  hand_over(*eng, 3, 2, 32768.0f);
  auto next = step_ok(*eng);
  BOOST_TEST(!next.skipped);
  BOOST_TEST(next.ns_params == 2);
  auto ref = make_engine(o);
  register_table(*ref, table, 21);
  hand_over(*ref, 1, 2, 65536.0f);
  step_ok(*ref);
  hand_over(*ref, 3, 2, 65536.0f);
  step_ok(*ref);
  double d = rel_diff(params_of(*eng), params_of(*ref));
  BOOST_TEST_MESSAGE("after the skipped step vs a run without it: " << d);
  BOOST_TEST(d <= 1e-6);
}

BOOST_AUTO_TEST_CASE(nan_without_fp16_skips_and_keeps_scale_one) {
  auto eng = make_engine(options(2));
  register_table(*eng, table, 22);
  auto before = capture(*eng);
  for (int r = 0; r < 2; ++r) {
    auto g = random_grads(table, 22, 1, r, 0);
    if (r == 1)
      g["bias"][0] = std::numeric_limits<float>::quiet_NaN();
    reduce_ok(*eng, r, g);
  }
  auto info = step_ok(*eng);
  BOOST_TEST(info.skipped);
  BOOST_TEST(info.next_loss_scale == 1.0f);
  check_unchanged(before, capture(*eng), true);
}

BOOST_AUTO_TEST_CASE(bad_input_is_named_and_changes_nothing) {
  auto eng = make_engine(options(2));
  register_table(*eng, table, 23);
  expect_error(eng->add_parameter({"w1", {3, 3}}), errc::duplicate_parameter, "w1");
  expect_error(eng->add_parameter({"empty", {4, 0}}), errc::invalid_argument, "empty");
  expect_error(eng->add_parameter({"heads", {30, 8}, param_group::automatic, 4}),
               errc::invalid_argument, "heads=4 do not divide rows=30");
  expect_error(eng->add_parameter({"short", {2, 2}}, {1.0f}), errc::shape_mismatch, "short");
  expect_error(eng->add_parameter({"huge", {int64_t{1} << 32, int64_t{1} << 32}}),
               errc::invalid_argument, "'huge' has more than 2^40 elements");

  auto before = capture(*eng);  // starts the engine
  auto early = eng->step();
  BOOST_REQUIRE(!early);
  expect_error(early.err(), errc::bad_state, "before any gradient");

  auto g = random_grads(table, 23, 1, 0, 0);
  g["w9"] = std::vector<float>(4, 1.0f);
  expect_error(eng->reduce(0, g), errc::unknown_parameter, "w9");
  g.erase("w9");
  g["w2"].pop_back();
  expect_error(eng->reduce(0, g), errc::shape_mismatch, "w2");
  expect_error(eng->reduce(5, random_grads(table, 23, 1, 0, 0)), errc::invalid_argument, "rank 5");
  expect_error(eng->add_parameter({"late", {2, 2}}), errc::bad_state, "late");
  check_unchanged(before, capture(*eng), true);

  reduce_ok(*eng, 0, random_grads(table, 23, 1, 0, 0));  // rank 1 hands over nothing
  auto uneven = eng->step();
  BOOST_REQUIRE(!uneven);
  expect_error(uneven.err(), errc::bad_state, "rank 1 handed over 0");
  reduce_ok(*eng, 1, random_grads(table, 23, 1, 1, 0));
  BOOST_TEST(!step_ok(*eng).skipped);  // the engine is still usable
}

// A schedule's rate that is not finite, or negative, is refused when the step would use it,
// before the step begins: nothing changes, and a step() with a good rate then runs as if the
// bad one had never been asked for (bit for bit against an engine that never saw it).
BOOST_AUTO_TEST_CASE(bad_learning_rates_are_refused_before_the_step) {
  auto eng = make_engine(options(2));
  auto ref = make_engine(options(2));
  for (auto* e : {eng.get(), ref.get()}) {
    register_table(*e, table, 29);
    for (int r = 0; r < 2; ++r)
      reduce_ok(*e, r, random_grads(table, 29, 1, r, 0));
  }
  const auto before = capture(*eng);
  const float bad[] = {INFINITY, -INFINITY, NAN, -0.5f};
  for (float lr : bad) {
    eng->set_lr_schedules([lr](uint64_t) { return lr; }, nullptr);
    auto s = eng->step();
    BOOST_REQUIRE(!s);
    expect_error(s.err(), errc::invalid_argument, "the Muon learning rate for step 1 is ");
    BOOST_TEST(s.err().message().find("must be finite and >= 0") != std::string::npos);
    eng->set_lr_schedules([](uint64_t) { return 0.02f; }, [lr](uint64_t) { return lr; });
    s = eng->step();
    BOOST_REQUIRE(!s);
    expect_error(s.err(), errc::invalid_argument, "the AdamW learning rate for step 1 is ");
    eng->set_lr_schedules(nullptr, [](uint64_t) { return 3e-4f; });
  }
  check_unchanged(before, capture(*eng), true);
  ref->set_lr_schedules([](uint64_t) { return 0.02f; }, [](uint64_t) { return 3e-4f; });
  BOOST_TEST(!step_ok(*eng).skipped);
  BOOST_TEST(!step_ok(*ref).skipped);
  const auto got = params_of(*eng), want = params_of(*ref);
  for (const auto& [name, v] : want)
    BOOST_TEST(same_bits(got.at(name), v), name);
}

BOOST_AUTO_TEST_CASE(bad_options_are_named) {
  auto o = options(0);
  auto e = engine::create(o);
  BOOST_REQUIRE(!e);
  expect_error(e.err(), errc::invalid_argument, "world");
  o = options(2);
  o.muon.ns.schedule.assign(3, {1.0f, 0.0f, 0.0f});
  e = engine::create(o);
  BOOST_REQUIRE(!e);
  expect_error(e.err(), errc::invalid_argument, "schedule");
  o = options(2);
  o.muon.ns.gram_restart = -1;
  e = engine::create(o);
  BOOST_REQUIRE(!e);
  expect_error(e.err(), errc::invalid_argument, "ns_gram_restart must be in [0, 100]");
  // Upper bounds: a billion NS steps would run for ever, a timeout past 30 days overflows.
  o = options(2);
  o.muon.ns.steps = 101;
  e = engine::create(o);
  BOOST_REQUIRE(!e);
  expect_error(e.err(), errc::invalid_argument, "ns_steps must be in [1, 100], got 101");
  o = options(2);
  o.momentum_before_vote = "yes";
  e = engine::create(o);
  BOOST_REQUIRE(!e);
  expect_error(e.err(), errc::invalid_argument,
               "momentum_before_vote must be auto, on or off, got 'yes'");
  o = options(kMaxRanksPerProcess + 1);  // thousands of ranks in one process took minutes
  e = engine::create(o);
  BOOST_REQUIRE(!e);
  expect_error(e.err(), errc::invalid_argument, "a process runs 1 to 1024 ranks (world is 1025)");
  o = options(2);
  o.timeout_ms = kMaxTimeoutMs + 1;
  e = engine::create(o);
  BOOST_REQUIRE(!e);
  expect_error(e.err(), errc::invalid_argument, "timeout_ms must be in [1, 2592000000] (30 days)");
  // Checked before any backend starts, so no GPU needed; auto means gram on cuda.
  for (const auto& [variant, name] :
       {std::pair{ns_variant::gram, "gram"}, std::pair{ns_variant::automatic, "auto (gram)"}})
    for (const int restart : {0, 4}) {
      o = options(2);
      o.compute = "cuda";
      o.muon.ns.variant = variant;
      o.muon.ns.gram_restart = restart;
      e = engine::create(o);
      BOOST_REQUIRE(!e);
      expect_error(e.err(), errc::invalid_argument,
                   "ns_gram_restart " + std::to_string(restart) + " with ns_variant "
                       + std::string(name) + " on the cuda backend");
    }
  o = options(2);  // the host runs auto as standard: any restart interval is fine
  o.muon.ns.variant = ns_variant::automatic;
  o.muon.ns.gram_restart = 0;
  BOOST_TEST(static_cast<bool>(engine::create(o)));
  o = options(2);
  o.compute = "tpu";
  e = engine::create(o);
  BOOST_REQUIRE(!e);
  expect_error(e.err(), errc::invalid_argument, "tpu");
  o = options(2);
  o.comm = "mpi";
  e = engine::create(o);
  BOOST_REQUIRE(!e);
  expect_error(e.err(), errc::invalid_argument,
               "unknown comm backend 'mpi' (valid: auto, caf, nccl)");
  o = options(2);
  o.comm = "nccl";
  e = engine::create(o);
  BOOST_REQUIRE(!e);
  expect_error(e.err(), errc::invalid_argument, "comm backend 'nccl' needs compute backend 'cuda'");
}

// comm "auto" (the default) decides at create(): caf for the host backend, whatever the world;
// engine::options() shows the choice (nccl on cuda: test_engine_cuda).
BOOST_AUTO_TEST_CASE(auto_comm_is_caf_on_the_host) {
  const engine_options defaults;
  BOOST_TEST(defaults.comm == "auto");
  for (const int world : {1, 3}) {
    auto o = options(world);
    o.comm = "auto";
    auto e = engine::create(o);
    BOOST_REQUIRE_MESSAGE(e, (e ? "" : e.err().to_string()));
    BOOST_TEST((*e)->options().comm == "caf");
  }
}

// Work that takes longer than timeout_ms: the call that waits for it says so, naming the setting,
// and the engine then takes no further call (its ranks are still part of the way through it),
// each refusal naming the first failure; destroying it does not hang. One 1024 x 1536 Muon
// matrix is about 30 GFLOP of Newton-Schulz, far more than 20 ms of any CPU's work, so the
// start, the reduce-scatter or the step is not answered in time (which one depends on the load).
BOOST_AUTO_TEST_CASE(work_past_the_timeout_stops_the_engine) {
  const std::vector<param_spec> big{{"w", {1024, 1536}}, {"b", {64}}};
  auto o = options(2);
  o.timeout_ms = 20;
  auto eng = make_engine(o);
  register_table(*eng, big, 24);
  error first;
  for (int r = 0; r < 2 && !first; ++r)
    first = eng->reduce(r, random_grads(big, 24, 1, r, 0));
  if (!first) {
    auto s = eng->step();
    BOOST_REQUIRE_MESSAGE(!s, "step 1 took less than 20 ms");
    first = s.err();
  }
  expect_error(first, errc::timeout, "ms (timeout_ms, zmuon.timeout_ms)");
  const std::string stopped = "the engine stopped ";
  const std::string cause = "(" + first.to_string() + ")";
  const error refusals[] = {eng->reduce(0, random_grads(big, 24, 2, 0, 0)), eng->step().err(),
                            eng->snapshot(1).err(), eng->parameters().err()};
  for (const error& e : refusals) {
    expect_error(e, errc::bad_state, stopped);
    BOOST_TEST(e.message().find(cause) != std::string::npos);
    BOOST_TEST(e.message().find("load a checkpoint into a new engine") != std::string::npos);
  }
}

// After a timeout the engine's end does not wait for the computation nobody will read: the
// host's Newton-Schulz is cancelled between iterations (compute_backend::cancel). One
// [256, 32768] matrix over 100 iterations is about 860 GFLOP, tens of seconds on a CPU, which
// the end used to wait out; one iteration is well under a second.
BOOST_AUTO_TEST_CASE(the_end_after_a_timeout_cancels_the_computation) {
  const std::vector<param_spec> big{{"w", {256, 32768}}};
  auto o = options(1);
  o.timeout_ms = 500;
  o.muon.ns.steps = 100;
  auto eng = make_engine(o);
  register_table(*eng, big, 25);
  error failed = eng->reduce(0, random_grads(big, 25, 1, 0, 0));
  if (!failed)
    failed = eng->step().err();
  expect_error(failed, errc::timeout, "ms (timeout_ms, zmuon.timeout_ms)");
  const auto begin = std::chrono::steady_clock::now();
  eng.reset();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  BOOST_TEST(took < 5.0, "the engine's end took " << took << " s");
}
