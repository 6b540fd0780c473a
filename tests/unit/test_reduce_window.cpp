// engine::reduce's bound on a rank's reduce buckets in flight (max_buckets_in_flight), read from
// the message trace: the host records each bucket it hands over (`send micro_grads`) and the
// reducer's answer when it takes it (`reply`), in the order it does both, so the trace shows how
// many of a rank's buckets were unanswered at every hand-over. One engine of one rank, one engine
// of two ranks (unbounded; with reduce_all, a thread per rank, bounded), and two engines of one
// rank each connected in one process (two nodes
// of a launcher job, world 2: the window holds, the bits match one engine of two ranks, and a
// bucket that cannot land times out naming itself).
#define BOOST_TEST_MODULE reduce_window
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "comm/caf_comm.hpp"
#include "engine/job.hpp"
#include "node/node_setup.hpp"
#include "plan/plan.hpp"
#include "support/engine_fixture.hpp"
#include "support/trace_files.hpp"

namespace fs = std::filesystem;
using namespace zmuon;

namespace {

const int gas = 2;
const int steps = 3;

// 64-element buckets: one per parameter, six in all.
std::vector<param_spec> table() {
  return {{"a.weight", {8, 8}}, {"b.weight", {4, 16}}, {"c.weight", {16, 4}},
          {"d.weight", {8, 8}}, {"bias", {64}},        {"embed.weight", {8, 8}}};
}

struct traced_run {
  tensor_map params;
  int buckets = 0;
  int most_in_flight = 0;  // the most of one rank's buckets unanswered at a hand-over (with it)
  int sends = 0;
  int replies = 0;
};

// Each rank's trace file: at each host `send micro_grads`, how many of that rank's buckets (this
// one included) have no host `reply` yet; and every bucket answered once.
void read_window(const std::vector<std::string>& files, traced_run& out) {
  for (const auto& file : files) {
    std::set<std::string> open;
    for (const auto& rec : test::read_jsonl(file)) {
      if (rec.value("actor", "") != "host")
        continue;
      const std::string ev = rec.value("ev", ""), id = rec.value("id", "");
      if (ev == "send" && rec.value("type", "") == "micro_grads") {
        BOOST_TEST(rec.value("req", false), "bucket " << id << " handed over without a request");
        open.insert(id);
        ++out.sends;
        out.most_in_flight = std::max(out.most_in_flight, static_cast<int>(open.size()));
      } else if (ev == "reply" && !id.empty() && id[0] == 'g') {
        BOOST_TEST(open.erase(id) == 1u, "answer " << id << " to no open bucket");
        BOOST_TEST(rec.value("error", "").empty(),
                   "bucket " << id << ": " << rec.value("error", ""));
        ++out.replies;
      }
    }
    BOOST_TEST(open.empty(), open.size() << " bucket(s) in " << file << " never answered");
  }
}

// `all`: each micro-batch of every rank through one reduce_all() (a thread per rank), else
// reduce() rank after rank on this thread.
traced_run run(int world, int window, const std::string& name, bool all = false) {
  const std::string dir = "test_reduce_window_" + name;
  fs::remove_all(dir);
  auto o = test::options(world);
  o.reduce_bucket_size = 64;
  o.max_buckets_in_flight = window;
  o.timeout_ms = 5'000;  // a window that deadlocks fails here, not at ctest's limit
  o.trace_dir = dir;
  traced_run out;
  {
    auto eng = test::make_engine(o);
    auto t = table();
    test::register_table(*eng, t, 3);
    for (int s = 1; s <= steps; ++s) {
      for (int k = 0; k < gas; ++k) {
        std::vector<tensor_map> grads;
        for (int r = 0; r < world; ++r)
          grads.push_back(test::random_grads(t, 3, s, r, k));
        if (all) {
          const auto err = eng->reduce_all(grads);
          BOOST_REQUIRE_MESSAGE(!err, err.to_string());
        } else {
          for (int r = 0; r < world; ++r)
            test::reduce_ok(*eng, r, grads[r]);
        }
      }
      test::step_ok(*eng);
    }
    out.params = test::params_of(*eng);
    out.buckets = static_cast<int>(eng->layout()->buckets.size());
  }  // the engine is gone here: the trace files are complete
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r)
    files.push_back(test::trace_file(dir, r));
  read_window(files, out);
  BOOST_TEST(out.sends == world * steps * gas * out.buckets);
  BOOST_TEST(out.replies == out.sends);
  return out;
}

// Two engines of one rank each on one actor system, their caf comms connected in-process: two
// nodes of a launcher job (zmuon-launch --ranks-per-node 1) in one test process, each engine
// driving one local rank, so each applies the window.
struct two_nodes {
  engine_config cfg;
  caf::actor_system sys{cfg};
  std::vector<caf_comm_actor> comms = spawn_caf_comm_group(sys, 2);
  std::unique_ptr<engine> eng[2];

  explicit two_nodes(engine_options o) {
    o.world = 2;
    for (int r = 0; r < 2; ++r) {
      node_setup node;
      node.system = &sys;
      node.first_rank = r;
      node.comms = {comms[r]};
      node.node_first_ranks = {0, 1};
      auto made = engine::create(o, node);
      BOOST_REQUIRE_MESSAGE(made, (made ? "" : made.err().to_string()));
      eng[r] = std::move(*made);
      test::register_table(*eng[r], table(), 3);
    }
  }
  ~two_nodes() {  // the engines go before their actor system
    eng[0].reset();
    eng[1].reset();
  }
};

bool same_params(const tensor_map& a, const tensor_map& b) {
  if (a.size() != b.size())
    return false;
  for (const auto& [name, v] : b)
    if (!a.count(name) || !test::same_bits(a.at(name), v))
      return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(one_local_rank_keeps_at_most_the_window_in_flight) {
  for (int window : {1, 2, 3}) {
    auto r = run(1, window, "w" + std::to_string(window));
    BOOST_REQUIRE_EQUAL(r.buckets, 6);
    // At most `window` unanswered, and the window fills (six buckets a micro-batch).
    BOOST_TEST(r.most_in_flight == window, "window " << window);
  }
}

BOOST_AUTO_TEST_CASE(unbounded_keeps_every_bucket_in_flight_until_step) {
  auto r = run(1, 0, "unbounded");
  // Nothing is awaited before step(): both micro-batches' buckets are in flight at once.
  BOOST_TEST(r.most_in_flight == gas * r.buckets);
}

BOOST_AUTO_TEST_CASE(the_window_does_not_change_the_result) {
  auto unbounded = run(1, 0, "same_unbounded");
  for (int window : {1, 2})
    BOOST_TEST(
        same_params(run(1, window, "same_w" + std::to_string(window)).params, unbounded.params),
        "window " << window << " changed the parameters");
}

BOOST_AUTO_TEST_CASE(several_local_ranks_hand_over_unbounded) {
  // One host thread hands over rank 0's buckets, then rank 1's: a bucket lands only once both did,
  // so a window here would wait out the timeout. It does not apply: every bucket of the step stays
  // in flight until step(), and the steps succeed.
  auto r = run(2, 2, "two_local");
  BOOST_TEST(r.most_in_flight == gas * r.buckets);
}

BOOST_AUTO_TEST_CASE(reduce_all_keeps_the_window_with_several_local_ranks) {
  // The ranks hand over on a thread each: the window holds on every rank (and fills), and the
  // result is the unbounded one's, bit for bit.
  const auto unbounded = run(3, 0, "all_unbounded");
  for (int window : {1, 2}) {
    auto r = run(3, window, "all_w" + std::to_string(window), true);
    BOOST_TEST(r.most_in_flight == window, "window " << window);
    BOOST_TEST(same_params(r.params, unbounded.params), "window " << window);
  }
}

BOOST_AUTO_TEST_CASE(reduce_all_checks_every_rank_before_any_hands_over) {
  auto o = test::options(2);
  o.reduce_bucket_size = 64;
  auto eng = test::make_engine(o);
  test::register_table(*eng, table(), 3);
  std::vector<tensor_map> grads{test::random_grads(table(), 3, 1, 0, 0),
                                test::random_grads(table(), 3, 1, 1, 0)};
  grads[1]["bias"].pop_back();  // rank 1's is one element short
  auto err = eng->reduce_all(grads);
  BOOST_TEST((err.code() == errc::shape_mismatch));
  BOOST_TEST(err.to_string().find("reduce_all(): rank 1: ") != std::string::npos, err.to_string());
  BOOST_TEST(err.to_string().find("bias") != std::string::npos, err.to_string());
  err = eng->reduce_all({grads[0]});
  BOOST_TEST((err.code() == errc::invalid_argument));
  BOOST_TEST(err.to_string().find("1 gradient sets for 2 local rank(s)") != std::string::npos);
  // Nothing was handed over: a step now has no micro-batch, and a whole one goes through.
  grads[1] = test::random_grads(table(), 3, 1, 1, 0);
  BOOST_TEST(!eng->reduce_all(grads));
  const auto info = eng->step();
  BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
  BOOST_TEST(info->micro_batches == 1);
}

BOOST_AUTO_TEST_CASE(one_rank_per_node_keeps_the_window_and_the_result) {
  // World 2 as two nodes of one rank (window 1, each host on its own thread, as two processes)
  // against world 2 in one engine (two local ranks: unbounded): the same bits on every rank.
  auto o = test::options(2);
  o.reduce_bucket_size = 64;
  o.max_buckets_in_flight = 1;
  o.timeout_ms = 5'000;
  const std::string dir = "test_reduce_window_nodes";
  fs::remove_all(dir);
  o.trace_dir = dir;
  std::vector<rank_state> split(2);
  {
    two_nodes nodes(o);
    auto host = [&](int r) {
      auto& eng = *nodes.eng[r];
      for (int s = 1; s <= steps; ++s) {
        for (int k = 0; k < gas; ++k)
          if (auto err = eng.reduce(r, test::random_grads(table(), 3, s, r, k)))
            return err.to_string();
        if (auto info = eng.step(); !info)
          return info.err().to_string();
      }
      auto snap = eng.snapshot(r);
      if (!snap)
        return snap.err().to_string();
      split[r] = std::move(*snap);
      return std::string{};
    };
    std::string failed[2];
    std::thread node1([&] { failed[1] = host(1); });
    failed[0] = host(0);
    node1.join();
    BOOST_REQUIRE_MESSAGE(failed[0].empty() && failed[1].empty(), failed[0] << failed[1]);
  }
  traced_run window;
  read_window({dir + "/trace-node0-rank0.jsonl", dir + "/trace-node1-rank1.jsonl"}, window);
  BOOST_TEST(window.sends == 2 * steps * gas * 6);
  BOOST_TEST(window.most_in_flight == 1);

  o.trace_dir.clear();
  o.max_buckets_in_flight = 0;
  auto one = test::make_engine(o);
  test::register_table(*one, table(), 3);
  for (int s = 1; s <= steps; ++s) {
    for (int k = 0; k < gas; ++k)
      for (int r = 0; r < 2; ++r)
        test::reduce_ok(*one, r, test::random_grads(table(), 3, s, r, k));
    test::step_ok(*one);
  }
  for (int r = 0; r < 2; ++r) {
    auto whole = test::snapshot_of(*one, r);
    BOOST_TEST(test::same_bits(split[r].params, whole.params), "rank " << r << " parameters");
    BOOST_TEST(test::same_bits(split[r].momentum, whole.momentum), "rank " << r << " momentum");
  }
}

BOOST_AUTO_TEST_CASE(a_bucket_that_never_lands_times_out_naming_it) {
  // Node 1 never hands over: node 0's bucket 0 cannot land, and with a window of 1 reduce()
  // waits for it before bucket 1, until the timeout.
  auto o = test::options(2);
  o.reduce_bucket_size = 64;
  o.max_buckets_in_flight = 1;
  o.timeout_ms = 300;
  two_nodes nodes(o);
  auto err = nodes.eng[0]->reduce(0, test::random_grads(table(), 3, 1, 0, 0));
  BOOST_TEST_MESSAGE("error: " << err.to_string());
  BOOST_TEST((err.code() == errc::timeout));
  BOOST_TEST(err.message().find("rank 0: bucket 0 of micro-batch 0 of step 1") != std::string::npos,
             err.message());
  BOOST_TEST(err.message().find("300 ms") != std::string::npos, err.message());
}
