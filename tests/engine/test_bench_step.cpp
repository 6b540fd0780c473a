// zmuon-bench-step's trace figures (tools/zmuon-trace/step_stats.hpp): on a real traced engine run
// (host backend, caf comm, the tiny table) the bytes each rank sent by collective kind equal the
// plan's count (fp32) at world 2 and 4, and the phases are non-negative, sum to the coordinator's
// step and fit inside the step's wall time; on a synthetic trace with hand-computed answers the
// plumbing time, its record count, the phase cut, the window, the wall time and the bytes are
// exact, the compute backend's calls left out of it; the bytes report flags a trace that
// disagrees with the plan, --ns-owners times each rank's own matrices, and the call-time report
// gives per-step means of summed steps.
#define BOOST_TEST_MODULE test_bench_step
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <filesystem>

#include "bench/step/ns_owners.hpp"
#include "bench/step/report.hpp"
#include "bench/step/step_tables.hpp"
#include "plan/ownership.hpp"
#include "plan/plan.hpp"
#include "support/engine_fixture.hpp"
#include "trace/recorder.hpp"
#include "zmuon-trace/reader.hpp"
#include "zmuon-trace/step_stats.hpp"

namespace fs = std::filesystem;
using namespace zmuon;
using trace_tool::step_figures;

namespace {

// "key=value ..." of a map, so that a difference prints whole.
std::string text(const std::map<std::string, int64_t>& m) {
  std::string s;
  for (const auto& [k, v] : m)
    s += k + "=" + std::to_string(v) + " ";
  return s;
}

struct traced_run {
  plan pl;
  std::vector<step_figures> steps;
  std::vector<int64_t> host_ns;  // per step: reduce() start to step() return, on the host
};

// The tiny table on `world` ranks (host backend, caf comm), `steps` steps of `gas` micro-batches,
// traced into a fresh directory; the engine is gone (its files complete) when the trace is read.
traced_run run_tiny(int world, int gas, int steps,
                    muon_transport transport = muon_transport::automatic) {
  const std::string dir = "test_bench_step_w" + std::to_string(world);
  fs::remove_all(dir);
  auto o = test::options(world);
  o.comm = "caf";
  o.muon.transport = transport;
  o.trace_dir = dir;
  o.reduce_bucket_size = 20'000;  // several buckets and chunks
  const auto table = bench::make_table("tiny");
  traced_run out;
  {
    auto eng = test::make_engine(o);
    test::register_table(*eng, table, 7);
    for (int s = 1; s <= steps; ++s) {
      auto t0 = std::chrono::steady_clock::now();
      for (int m = 0; m < gas; ++m)
        for (int r = 0; r < world; ++r) {
          auto err = eng->reduce(r, test::random_grads(table, 3, s, r, m, 0.01f));
          BOOST_REQUIRE_MESSAGE(!err, err.to_string());
        }
      auto info = eng->step();
      BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
      BOOST_REQUIRE(!info->skipped);
      out.host_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - t0)
                                .count());
    }
    out.pl = *eng->layout();
  }
  auto ts = trace_tool::read_traces(dir);
  BOOST_REQUIRE_MESSAGE(ts, (ts ? "" : ts.err().message()));
  out.steps = trace_tool::step_stats(*ts);
  BOOST_REQUIRE_EQUAL(out.steps.size(), static_cast<size_t>(steps));
  fs::remove_all(dir);
  return out;
}

void bytes_match_plan(int world, muon_transport transport = muon_transport::fp32) {
  const int gas = 2;
  const int muon_elem = transport == muon_transport::bf16 ? 2 : 4;
  auto run = run_tiny(world, gas, 3, transport);
  BOOST_REQUIRE_GT(run.pl.chunks.size(), 1u);
  BOOST_REQUIRE_GT(run.pl.buckets.size(), 1u);
  for (const auto& s : run.steps) {
    BOOST_REQUIRE_EQUAL(s.ranks.size(), static_cast<size_t>(world));
    for (const auto& r : s.ranks) {
      auto want = bench::plan_bytes(run.pl, r.rank, gas, muon_elem);
      BOOST_TEST_CONTEXT("world " << world << " step " << s.step << " rank " << r.rank) {
        BOOST_TEST(want.at("reduce_scatter") > 0);
        BOOST_TEST(want.count("gather") + want.count("scatter") > 0u);
        BOOST_TEST(text(r.sent_bytes) == text(want));
        // One piece per peer per collective: buckets x micro-batches for the reduce-scatters.
        BOOST_TEST(r.sent_messages.at("reduce_scatter")
                   == static_cast<int64_t>(run.pl.buckets.size()) * gas * (world - 1));
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(trace_bytes_equal_plan_bytes_world_2) {
  bytes_match_plan(2);
}

BOOST_AUTO_TEST_CASE(trace_bytes_equal_plan_bytes_world_4) {
  bytes_match_plan(4);
}

BOOST_AUTO_TEST_CASE(trace_bytes_equal_plan_bytes_world_4_bf16_transport) {
  bytes_match_plan(4, muon_transport::bf16);
}

BOOST_AUTO_TEST_CASE(phases_are_non_negative_and_fit_the_step) {
  auto run = run_tiny(4, 1, 3);
  for (size_t i = 0; i < run.steps.size(); ++i) {
    const auto& s = run.steps[i];
    BOOST_TEST_CONTEXT("step " << s.step) {
      BOOST_TEST(s.wall_ns > 0);
      BOOST_TEST(s.wall_ns <= run.host_ns[i]);  // inside reduce() start .. step() return
      for (const auto& r : s.ranks) {
        int64_t sum = 0;
        for (const auto& [phase, ns] : r.phase_ns) {
          BOOST_TEST(ns >= 0, "rank " << r.rank << " " << phase);
          sum += ns;
        }
        BOOST_TEST(r.window_ns > 0);
        BOOST_TEST(sum == r.window_ns, "rank " << r.rank);  // `other` included: exact
        BOOST_TEST(r.window_ns <= s.wall_ns, "rank " << r.rank);
        for (const char* p : {"flush", "vote", "momentum", "adamw"})
          BOOST_TEST(r.phase_ns.count(p) == 1u, "rank " << r.rank << " has no " << p);
        BOOST_TEST(r.plumbing_ns > 0);
        BOOST_TEST(r.plumbing_ns <= s.wall_ns * 2);  // 2 cores at most run the rank's actors
      }
    }
  }
}

// A synthetic trace, one rank, step 1, with every time chosen (ns); the answers are worked out
// by hand in the comments.
BOOST_AUTO_TEST_CASE(plumbing_and_phases_of_a_synthetic_trace) {
  const std::string dir = "test_bench_step_synthetic";
  fs::remove_all(dir);
  {
    auto rec = trace::recorder::open(dir, 0, 0, 2);
    BOOST_REQUIRE(rec);
    auto& r = **rec;
    auto f = [](const char* type, const char* op = nullptr, int64_t bytes = 0) {
      trace::fields x;
      x.type = type;
      x.step = 1;
      x.op = op;
      x.bytes = bytes;
      return x;
    };
    r.send("host", 1000, f("micro_grads"), "g1.0.0", false);  // wall starts: 1000
    r.recv("reducer", 1100, 50, f("micro_grads"), "g1.0.0");  // plumbing 50, 1 record in
    r.send("reducer", 1120, f("reduce_scatter_req", "reduce_scatter"), "r1.1", true);
    r.span("reducer", "reduce_scatter", 1120, 1180, f("x"), nullptr, true);  // to 2300
    r.send("caf_comm", 1130, f("peer_floats", "reduce_scatter", 800), "p", false, 1);
    r.recv("partition_store", 1200, 400, f("accumulate"), "r1.2");     // work, not plumbing
    r.recv("muon_coordinator", 2000, 100, f("step_request"), "r0.1");  // window starts: 2000
    r.send("muon_coordinator", 2050, f("flush"), "r2.1", true);        // 1 record in the recv
    r.span("muon_coordinator", "flush", 2050, 450, f("x"), nullptr, true);
    r.reply("muon_coordinator", 2500, f("flush_done"), "r2.1", {}, 200);  // own + flush span
    r.send("muon_coordinator", 2600, f("check_overflow"), "r2.2", true);  // + this: 3 records
    r.recv("loss_scaler", 2620, 30, f("check_overflow"), "r2.2");         // 1 record in (send)
    r.send("loss_scaler", 2640, f("all_reduce_req", "vote"), "r3.1", true);
    r.span("loss_scaler", "vote", 2640, 300, f("x"), nullptr, true);
    r.reply("loss_scaler", 2940, f("all_reduce_result"), "r3.1", {}, 20);  // own + vote span
    r.span("muon_coordinator", "overflow_check", 2600, 400, f("x"), nullptr, true);
    r.reply("muon_coordinator", 3000, f("overflow_report"), "r2.2", {}, 1000);  // 300 of it
    r.span("muon_coordinator", "ns", 3100, 700, f("ns"));  // compute inside that continuation
    // The backend's own calls (trace_calls) are not phases: they change no figure below.
    r.compute("newton_schulz", 1, 3150, 600);
    r.compute("scan", 0, 2510, 80);
    r.send("muon_coordinator", 3900, f("muon_momentum"), "r2.3", true);
    r.send("caf_comm", 3920, f("peer_floats", "gather", 4096), "p", false, 1);
    r.send("caf_comm", 3930, f("peer_floats", "scatter", 100), "p", false, 1);
    r.send("caf_comm", 3940, f("peer_floats", "scatter", 60), "p", false, 1);
    r.recv("partition_store", 3950, 500, f("muon_momentum"), "r2.3");
    r.span("muon_coordinator", "momentum", 3900, 600, f("x"), nullptr, true);
    r.reply("muon_coordinator", 4500, f("ack"), "r2.3", {}, 100);  // window ends: 4600
    r.span("host", "step", 1900, 2800, f("x"), nullptr, true);     // wall ends: 4700
    r.flush();
  }
  auto ts = trace_tool::read_traces(dir, {&std::cerr, false});  // rank 0's file of world 2
  BOOST_REQUIRE_MESSAGE(ts, (ts ? "" : ts.err().message()));
  auto steps = trace_tool::step_stats(*ts);
  BOOST_REQUIRE_EQUAL(steps.size(), 1u);
  BOOST_REQUIRE_EQUAL(steps[0].ranks.size(), 1u);
  const auto& s = steps[0];
  const auto& r = s.ranks[0];
  BOOST_TEST(s.wall_ns == 3700);
  BOOST_TEST(r.window_ns == 2600);
  // reducer 50 + coordinator 100 + 200 + (1000 - 700) + 100 + loss_scaler 30 + 20
  BOOST_TEST(r.plumbing_ns == 800);
  BOOST_TEST(r.activations == 7);
  // records written inside them: 1 + 1 + 3 + 1 + 2 + (own, span, ns, send) 4 + (own, span) 2
  BOOST_TEST(r.plumbing_records == 14);
  BOOST_TEST(r.plumbing_net_ns(10) == 800 - 140);
  BOOST_TEST(r.plumbing_net_ns(1000) == 0);
  // [2000,2050) reduce_scatter, [2050,2500) flush, [2500,2600) other, [2600,2640) and
  // [2940,3000) overflow_check, [2640,2940) vote, [3000,3100) other, [3100,3800) ns,
  // [3800,3900) other, [3900,4500) momentum, [4500,4600) other.
  const std::map<std::string, int64_t> phases{
      {"reduce_scatter", 50}, {"flush", 450}, {"overflow_check", 100}, {"vote", 300}, {"ns", 700},
      {"momentum", 600},      {"other", 400}};
  BOOST_TEST(text(r.phase_ns) == text(phases));
  const std::map<std::string, int64_t> bytes{
      {"reduce_scatter", 800}, {"gather", 4096}, {"scatter", 160}};
  BOOST_TEST(text(r.sent_bytes) == text(bytes));
  BOOST_TEST(r.sent_messages.at("scatter") == 2);
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(bytes_report_flags_a_trace_that_disagrees_with_the_plan) {
  auto made = make_plan(bench::make_table("tiny"), 2, 1 << 14);
  BOOST_REQUIRE(made);
  std::vector<std::map<std::string, int64_t>> sent{bench::plan_bytes(*made, 0, 1),
                                                   bench::plan_bytes(*made, 1, 1)};
  auto agree = bench::report_bytes(*made, sent, 1, 4, true);
  BOOST_TEST(!agree.mismatch);
  BOOST_TEST(agree.ranks.size() == 2u);
  BOOST_TEST(agree.ranks[1]["deepspeed_muon_bytes"].get<double>()
             == bench::deepspeed_muon_bytes(*made));
  sent[1]["gather"] += 4;  // one float more than the plan
  BOOST_TEST(bench::report_bytes(*made, sent, 1, 4, true).mismatch);
  BOOST_TEST(!bench::report_bytes(*made, sent, 1, 4, false).mismatch);  // plan only: no check
}

// --ns-owners on the tiny table: every Muon matrix timed once, on the rank the plan names, in as
// many calls as its shape groups make, with the plan's cost per rank (ns_cost summed here over
// the owned matrices: another path to the same figure) and its max / mean.
BOOST_AUTO_TEST_CASE(ns_owners_times_each_rank_s_own_matrices) {
  engine_options o;
  o.world = 3;
  o.compute = "host";
  o.reduce_bucket_size = 1 << 14;
  const auto table = bench::make_table("tiny");
  auto report = bench::time_ns_owners(table, o, 2);
  BOOST_REQUIRE_MESSAGE(report, (report ? "" : report.err().to_string()));
  auto made = make_plan(table, o.world, o.reduce_bucket_size);
  BOOST_REQUIRE(made);
  BOOST_REQUIRE_EQUAL(report->ranks.size(), 3u);
  int matrices = 0;
  std::vector<double> cost(3, 0.0);
  for (const auto& p : made->params)
    if (p.muon)
      cost[static_cast<size_t>(p.owner)] += ns_cost(p.rows, p.cols);
  double most = 0, sum = 0;
  for (const auto& t : report->ranks) {
    matrices += t.matrices;
    int groups = 0;
    for (const auto& c : make_ownership(*made, t.rank))
      groups += static_cast<int>(c.groups.size());
    BOOST_TEST(t.calls == groups);
    BOOST_TEST(t.predicted == cost[static_cast<size_t>(t.rank)]);
    BOOST_TEST((t.matrices == 0 ? t.ms >= 0.0 : t.ms > 0.0));
    most = std::max(most, t.predicted);
    sum += t.predicted;
  }
  BOOST_TEST(matrices == made->muon_count());
  BOOST_TEST(report->predicted_imbalance == most / (sum / 3.0),
             boost::test_tools::tolerance(1e-12));
  BOOST_TEST(report->measured_imbalance >= 1.0);
}

BOOST_AUTO_TEST_CASE(call_time_report_gives_per_step_means) {
  call_times sum;
  bench::add_call_times(sum, {{"newton_schulz", {2, 3.0, 2.0}}, {"add", {1, 0.5, 0.5}}});
  bench::add_call_times(sum, {{"newton_schulz", {2, 5.0, 4.0}}});
  BOOST_TEST(sum["newton_schulz"].calls == 4);
  BOOST_TEST(sum["newton_schulz"].busy_ms == 6.0);
  auto j = bench::report_call_times(sum, 2);
  BOOST_TEST(j["newton_schulz"]["calls"].get<double>() == 2.0);
  BOOST_TEST(j["newton_schulz"]["ms"].get<double>() == 4.0);
  BOOST_TEST(j["newton_schulz"]["busy_ms"].get<double>() == 3.0);
  BOOST_TEST(j["add"]["busy_ms"].get<double>() == 0.25);
}

BOOST_AUTO_TEST_CASE(timeline_summary_finds_the_gaps_and_the_newton_schulz_stretch) {
  // Main stream 10-11 and 11.5-12, lanes 11.75-13 and 12.5-14 (NS), main 14.25-14.5: nothing
  // runs 11-11.5 and 14-14.25.
  const std::vector<call_span> spans{{"scan", 0, 10.0, 11.0},
                                     {"momentum", 0, 11.5, 12.0},
                                     {"newton_schulz", 1, 11.75, 13.0},
                                     {"newton_schulz", 2, 12.5, 14.0},
                                     {"adamw", 0, 14.25, 14.5}};
  const auto t = bench::summarize_timeline(spans);
  BOOST_TEST(t.span_ms == 4.5);
  BOOST_TEST(t.idle_ms == 0.75);
  BOOST_TEST(t.longest_gap_ms == 0.5);
  BOOST_TEST(t.longest_gap_at == 1.0);
  BOOST_TEST(t.first_ns_ms == 1.75);
  BOOST_TEST(t.last_ns_end_ms == 4.0);
  const auto none = bench::summarize_timeline({{"adamw", 0, 3.0, 4.0}});
  BOOST_TEST(none.span_ms == 1.0);
  BOOST_TEST(none.idle_ms == 0.0);
  BOOST_TEST(none.first_ns_ms == -1.0);
}
