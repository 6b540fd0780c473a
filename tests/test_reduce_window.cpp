// engine::reduce's bound on a rank's reduce buckets in flight (max_buckets_in_flight), read from
// the message trace: the host records each bucket it hands over (`send micro_grads`) and the
// reducer's answer when it takes it (`reply`), in the order it does both, so the trace shows how
// many of a rank's buckets were unanswered at every hand-over.
#define BOOST_TEST_MODULE reduce_window
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <map>
#include <set>

#include "plan/plan.hpp"
#include "tests/engine_fixture.hpp"
#include "tests/trace_files.hpp"

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

// Every rank's trace: at each host `send micro_grads`, how many of that rank's buckets (this one
// included) have no host `reply` yet; and every bucket answered once.
void read_window(const std::string& dir, int world, traced_run& out) {
  for (int r = 0; r < world; ++r) {
    std::set<std::string> open;
    for (const auto& rec : test::read_jsonl(test::trace_file(dir, r))) {
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
    BOOST_TEST(open.empty(), open.size() << " bucket(s) of rank " << r << " never answered");
  }
}

traced_run run(int world, int window, const std::string& name) {
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
      for (int k = 0; k < gas; ++k)
        for (int r = 0; r < world; ++r)
          test::reduce_ok(*eng, r, test::random_grads(t, 3, s, r, k));
      test::step_ok(*eng);
    }
    out.params = test::params_of(*eng);
    out.buckets = static_cast<int>(eng->layout()->buckets.size());
  }  // the engine is gone here: the trace files are complete
  read_window(dir, world, out);
  BOOST_TEST(out.sends == world * steps * gas * out.buckets);
  BOOST_TEST(out.replies == out.sends);
  return out;
}

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
