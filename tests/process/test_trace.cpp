// The message trace (docs/DESIGN.md §9) end to end: a traced engine run (3 in-process ranks, gas 2,
// a skipped step from a NaN gradient) passes `zmuon-trace check`; the record counts match what the
// plan and the engine's step results say; traces altered by the test fail the check with the
// right message; the Perfetto JSON has one process per rank with a slice per record and a flow
// per matched message; zmuon-launch --trace and ZMUON_TRACE write traces.
#define BOOST_TEST_MODULE trace
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "support/engine_fixture.hpp"

#include "plan/plan.hpp"
#include "support/run_launch.hpp"
#include "support/trace_files.hpp"
#include "zmuon-trace/reader.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace zmuon;
using test::read_jsonl;
using test::trace_file;

#define TRACE_RUN_PREFIX "test_trace_"
#include "support/trace_run.hpp"  // the traced run and its helpers (test_trace_input too)

BOOST_AUTO_TEST_CASE(traced_run_passes_check_and_counts_match) {
  const auto& r = run();
  BOOST_REQUIRE_EQUAL(r.infos.size(), static_cast<size_t>(steps));
  for (int s = 1; s <= steps; ++s)
    BOOST_TEST(r.infos[s - 1].skipped == (s == bad_step), "step " << s);
  BOOST_TEST_MESSAGE("buckets " << r.buckets << ", chunks " << r.chunks << ", Muon params "
                                << r.muon_params);
  BOOST_REQUIRE(r.buckets > 1);
  BOOST_REQUIRE(r.chunks > 1);

  int status = 0;
  auto out = tool("check " + r.dir, &status);
  BOOST_TEST_MESSAGE(out);
  BOOST_TEST(status == 0);
  BOOST_TEST(out.find("check: OK (3 rank files") != std::string::npos);

  // Independently of the tool: every rank's collectives as the plan says, NS spans as the
  // engine's step results count them, and the skipped step has neither NS nor momentum.
  std::map<uint64_t, int> ns_params;  // step -> parameters orthogonalized, all ranks
  for (int rank = 0; rank < world; ++rank) {
    auto recs = read_jsonl(trace_file(r.dir, rank));
    BOOST_REQUIRE(is(recs.at(0), "meta"));
    BOOST_TEST(recs[0]["rank"] == rank);
    BOOST_TEST(recs[0]["world"] == world);
    std::map<std::string, int> collectives;
    int momentum_on_bad = 0;
    for (const auto& rec : recs) {
      if (is(rec, "recv") && rec["actor"] == "caf_comm" && rec.contains("op")
          && rec["type"] != "peer_floats" && rec["type"] != "peer_doubles")
        ++collectives[rec["op"].get<std::string>()];
      if (is(rec, "span") && rec["phase"] == "ns")
        ns_params[rec["step"].get<uint64_t>()] +=
            static_cast<int>(rec.value("params", json::array()).size());
      if (is(rec, "recv") && rec["type"] == "muon_momentum" && rec["step"] == bad_step)
        ++momentum_on_bad;
    }
    BOOST_TEST(collectives["reduce_scatter"] == steps * gas * r.buckets, "rank " << rank);
    BOOST_TEST(collectives["vote"] == steps, "rank " << rank);
    BOOST_TEST(collectives.count("norm") == 0u, "rank " << rank);  // the norm is in the vote
    BOOST_TEST(collectives["gather"] == (steps - 1) * r.chunks, "rank " << rank);
    BOOST_TEST(collectives["scatter"] == (steps - 1) * r.chunks, "rank " << rank);
    BOOST_TEST(momentum_on_bad == 0);
  }
  for (int s = 1; s <= steps; ++s) {
    BOOST_TEST(ns_params[s] == r.infos[s - 1].ns_params,
               "step " << s << ": " << ns_params[s] << " vs " << r.infos[s - 1].ns_params);
    BOOST_TEST(ns_params[s] == (s == bad_step ? 0 : r.muon_params), "step " << s);
  }
}

BOOST_AUTO_TEST_CASE(duplicated_ns_fails) {
  auto dir = copy_of("dup_ns");
  for (int rank = 0; rank < world; ++rank) {
    auto recs = read_jsonl(trace_file(dir, rank));
    json plan;
    for (const auto& rec : recs)
      if (is(rec, "plan"))
        plan = rec;
    for (const auto& rec : recs)
      if (is(rec, "span") && rec["phase"] == "ns" && rec["step"] == 1) {
        int p = rec["params"][0];
        std::string name;
        for (const auto& mp : plan["muon_params"])
          if (mp[0] == p)
            name = mp[1];
        auto copy = rec;
        copy["t"] = rec["t"].get<int64_t>() + 1000;
        recs.push_back(copy);
        write_jsonl(trace_file(dir, rank), recs);
        fails_with(dir,
                   {"[ns_once] rank " + std::to_string(rank) + ", step 1: NS of Muon parameter "
                    + std::to_string(p) + " '" + name + "' ran 2 times"});
        return;
      }
  }
  BOOST_FAIL("no NS record in step 1");
}

BOOST_AUTO_TEST_CASE(dropped_collective_fails_with_first_divergence) {
  // On rank 2, and on rank 0 (the lowest rank): the majority says what was expected.
  for (int rank : {2, 0}) {
    auto dir = copy_of("drop" + std::to_string(rank));
    auto recs = read_jsonl(trace_file(dir, rank));
    auto it = std::find_if(recs.begin(), recs.end(), [](const json& rec) {
      return is(rec, "recv") && rec["actor"] == "caf_comm" && rec["type"] == "all_to_all_req"
             && rec["op"] == "gather" && rec["step"] == 2 && rec["index"] == 0;
    });
    BOOST_REQUIRE(it != recs.end());
    recs.erase(it);
    write_jsonl(trace_file(dir, rank), recs);
    fails_with(dir, {"[collectives] rank " + std::to_string(rank) + ", step 2: collective #",
                     "differs from 2 of 3 ranks: expected gather(step 2, chunk 0), found "});
  }
}

BOOST_AUTO_TEST_CASE(ns_before_the_overflow_report_fails) {
  auto dir = copy_of("early_ns");
  for (int rank = 0; rank < world; ++rank) {
    auto recs = read_jsonl(trace_file(dir, rank));
    int64_t report = -1;
    for (const auto& rec : recs)
      if (is(rec, "reply") && rec["type"] == "overflow_report" && rec["step"] == 2)
        report = rec["t"];
    BOOST_REQUIRE(report > 0);
    for (auto& rec : recs)
      if (is(rec, "span") && rec["phase"] == "ns" && rec["step"] == 2) {
        rec["t"] = report - 1000;
        write_jsonl(trace_file(dir, rank), recs);
        fails_with(dir, {"[after_report] rank " + std::to_string(rank)
                         + ", step 2: NS of step 2 before the overflow report of that step"});
        return;
      }
  }
  BOOST_FAIL("no NS record in step 2");
}

BOOST_AUTO_TEST_CASE(momentum_write_on_a_skipped_step_fails) {
  auto dir = copy_of("momentum");
  auto recs = read_jsonl(trace_file(dir, 0));
  int64_t report = -1;
  for (const auto& rec : recs)
    if (is(rec, "reply") && rec["type"] == "overflow_report" && rec["step"] == bad_step) {
      BOOST_TEST(rec["overflow"] == true);
      report = rec["t"];
    }
  BOOST_REQUIRE(report > 0);
  recs.push_back({{"seq", 1000000},
                  {"ev", "recv"},
                  {"t", report + 5000},
                  {"actor", "partition_store"},
                  {"dur", 100},
                  {"type", "muon_momentum"},
                  {"step", bad_step},
                  {"index", 0},
                  {"bytes", 256},
                  {"id", "r999.1"}});
  write_jsonl(trace_file(dir, 0), recs);
  fails_with(dir, {"[momentum] rank 0, step 3: momentum write (muon_momentum, chunk 0) on "
                   "skipped step 3"});
}

// A world-1 run whose Muon chunks go ahead of the vote (zmuon.momentum_before_vote): the
// momentum into the store's spare goes out before the report, also in the step the NaN
// refuses, and the check passes; a momentum written over the momentum in that step is a
// momentum write on a skipped step.
BOOST_AUTO_TEST_CASE(momentum_ahead_of_the_vote_passes_check_and_a_write_in_place_is_checked) {
  const std::string dir = TRACE_RUN_PREFIX "ahead";
  fs::remove_all(dir);
  {
    auto o = test::options(1);
    o.momentum_before_vote = "on";
    o.trace_dir = dir;
    auto eng = test::make_engine(o);
    auto t = table();
    test::register_table(*eng, t, 7);
    for (int s = 1; s <= steps; ++s) {
      auto g = test::random_grads(t, 7, s, 0, 0);
      if (s == bad_step)
        g["a.weight"][5] = std::numeric_limits<float>::quiet_NaN();
      test::reduce_ok(*eng, 0, g);
      BOOST_TEST(test::step_ok(*eng).skipped == (s == bad_step), "step " << s);
    }
  }
  auto recs = read_jsonl(trace_file(dir, 0));
  std::map<uint64_t, std::vector<std::string>> ops;  // step -> the store's momentum ops
  for (const auto& rec : recs)
    if (is(rec, "recv") && rec["type"] == "muon_momentum")
      ops[rec["step"].get<uint64_t>()].push_back(rec.value("op", "both"));
  for (int s = 1; s <= steps; ++s)  // every step's into the spare, the refused one's too
    BOOST_TEST((ops[s] == std::vector<std::string>{"spare"}), "step " << s);
  int status = 0;
  auto out = tool("check " + dir, &status);
  BOOST_TEST_MESSAGE(out);
  BOOST_TEST(status == 0, out);

  for (const auto& rec : recs)
    if (is(rec, "recv") && rec["type"] == "muon_momentum" && rec["step"] == bad_step) {
      auto in_place = rec;  // a momentum written over the momentum in the refused step
      in_place.erase("op");
      in_place["t"] = rec["t"].get<int64_t>() + 1000;
      in_place["seq"] = 1000000;
      recs.push_back(in_place);
      break;
    }
  write_jsonl(trace_file(dir, 0), recs);
  fails_with(dir, {"[momentum] rank 0, step 3: momentum write (muon_momentum, chunk 0) on "
                   "skipped step 3"});
}

BOOST_AUTO_TEST_CASE(unanswered_request_fails) {
  auto dir = copy_of("unanswered");
  auto recs = read_jsonl(trace_file(dir, 1));
  auto it = std::find_if(recs.begin(), recs.end(), [](const json& rec) {
    return is(rec, "reply") && rec["type"] == "flush_done" && rec["step"] == 4;
  });
  BOOST_REQUIRE(it != recs.end());
  std::string id = (*it)["id"];
  recs.erase(it);
  write_jsonl(trace_file(dir, 1), recs);
  fails_with(dir, {"[answered] rank 1, step 4: request flush (id " + id
                   + ") from muon_coordinator was never answered"});
}

BOOST_AUTO_TEST_CASE(perfetto_json_matches_the_records) {
  const auto& r = run();
  std::string out_path = "test_trace_perfetto.json";
  fs::remove(out_path);
  int status = 0;
  auto out = tool("perfetto " + r.dir + " -o " + out_path, &status);
  BOOST_TEST_MESSAGE(out);
  BOOST_REQUIRE(status == 0);
  std::ifstream in(out_path);
  json doc = json::parse(in);  // throws (fails the test) if it is not JSON
  const auto& events = doc.at("traceEvents");

  // Per rank, from the records: slices (send, recv, span), instants (reply), span phases.
  std::map<int, int> want_slices, want_instants, got_slices, got_instants;
  std::map<int, int> want_waits, got_begins, got_ends;
  std::map<int, std::map<std::string, int>> want_phase, got_phase;
  std::map<std::string, int> recv_ids;  // ids of received messages (all ranks)
  std::vector<std::pair<int, std::string>> send_ids;
  for (int rank = 0; rank < world; ++rank)
    for (const auto& rec : read_jsonl(trace_file(r.dir, rank))) {
      std::string ev = rec["ev"];
      bool wait = ev == "span" && rec.value("wait", false);
      if (ev == "send" || ev == "recv" || (ev == "span" && !wait))
        ++want_slices[rank];
      if (wait)
        ++want_waits[rank];
      if (ev == "reply")
        ++want_instants[rank];
      if (ev == "span" && rec["actor"] != "compute")  // compute calls: test_trace_compute
        ++want_phase[rank][rec["phase"].get<std::string>()];
      std::string id = rec.value("id", "");
      // One process: CAF request ids are unique; host->reducer ids are per rank.
      if (!id.empty() && id[0] == 'g')
        id += "@" + std::to_string(rank);
      if (ev == "recv")
        ++recv_ids[id];
      if (ev == "send")
        send_ids.emplace_back(rank, id);
    }
  int want_flows = 0;
  for (const auto& [rank, id] : send_ids)
    want_flows += recv_ids.count(id) ? 1 : 0;

  std::set<int> processes;
  std::map<int64_t, int> starts, finishes;
  for (const auto& e : events) {
    std::string ph = e.at("ph");
    if (ph == "M") {
      if (e["name"] == "process_name")
        processes.insert(e["pid"].get<int>());
      continue;
    }
    int pid = e.at("pid");
    BOOST_REQUIRE(e.contains("ts") && e.contains("tid"));
    if (ph == "X") {
      ++got_slices[pid];
      BOOST_TEST(e.at("dur").get<double>() >= 0);
      if (e["cat"] == "phase")
        ++got_phase[pid][e["name"].get<std::string>()];
    } else if (ph == "b") {
      BOOST_TEST(e.at("cat") == "wait");
      ++got_begins[pid];
      ++got_phase[pid][e["name"].get<std::string>()];
    } else if (ph == "e") {
      ++got_ends[pid];
    } else if (ph == "i") {
      ++got_instants[pid];
    } else if (ph == "s") {
      ++starts[e.at("id").get<int64_t>()];
    } else if (ph == "f") {
      BOOST_TEST(e.at("bp") == "e");
      ++finishes[e.at("id").get<int64_t>()];
    } else {
      BOOST_FAIL("unexpected event phase " << ph);
    }
  }
  BOOST_TEST(processes == (std::set<int>{0, 1, 2}));
  for (int rank = 0; rank < world; ++rank) {
    BOOST_TEST(got_slices[rank] == want_slices[rank], "rank " << rank);
    BOOST_TEST(got_instants[rank] == want_instants[rank], "rank " << rank);
    BOOST_TEST(got_begins[rank] == want_waits[rank], "rank " << rank);
    BOOST_TEST(got_ends[rank] == want_waits[rank], "rank " << rank);
    BOOST_TEST(got_phase[rank] == want_phase[rank], "rank " << rank);
    for (const char* p : {"reduce_scatter", "vote", "gather", "ns", "scatter", "apply", "step"})
      BOOST_TEST(got_phase[rank][p] > 0, "rank " << rank << " phase " << p);
  }
  BOOST_TEST(static_cast<int>(starts.size()) == want_flows);
  BOOST_TEST(starts == finishes);  // every arrow has one start and one end
  BOOST_TEST(want_flows > 100);
}

BOOST_AUTO_TEST_CASE(launcher_flag_and_environment_write_traces) {
  std::string dir = "test_trace_launch", env_dir = "test_trace_env";
  fs::remove_all(dir);
  fs::remove_all(env_dir);
  int status = 0;
  auto out = test::run_launch("--steps 2 --ranks 2 --trace " + dir, &status);
  BOOST_REQUIRE_MESSAGE(status == 0, out);
  BOOST_TEST(fs::exists(trace_file(dir, 0)));
  BOOST_TEST(fs::exists(trace_file(dir, 1)));
  BOOST_TEST(!fs::exists(trace_file(dir, 2)));
  out = tool("check " + dir, &status);
  BOOST_TEST(status == 0, out);
  out = tool("summary " + dir, &status);
  BOOST_TEST(status == 0, out);
  BOOST_TEST(out.find("step 2 (applied)  slowest rank ") != std::string::npos, out);
  // Its message table against the job: 2 steps x 2 ranks step requests; one bucket, gas 1, so as
  // many micro_grads; each reduce-scatter sends the other rank one piece of 1/2 of the bucket.
  std::smatch m;
  BOOST_TEST(std::regex_search(out, m, std::regex(R"(\n  step_request\s+(\d+)\s+0\n)")), out);
  if (!m.empty())
    BOOST_TEST(std::stoi(m[1]) == 4);
  BOOST_TEST(std::regex_search(out, m, std::regex(R"(\n  micro_grads\s+(\d+)\s+(\d+)\n)")), out);
  if (!m.empty()) {
    BOOST_TEST(std::stoi(m[1]) == 4);
    // micro_grads carries the whole (padded) gradient packed for 2 ranks
    int64_t numel = 0;
    for (const auto& rec : read_jsonl(trace_file(dir, 0)))
      if (is(rec, "send") && rec["type"] == "micro_grads")
        numel = rec["bytes"].get<int64_t>() / 4;
    BOOST_TEST(std::stoll(m[2]) == 4 * numel * 4);
  }

  out = test::run_command("ZMUON_TRACE=" + env_dir + " " + ZMUON_LAUNCH + " --steps 1 --ranks 2",
                          &status);
  BOOST_REQUIRE_MESSAGE(status == 0, out);
  BOOST_TEST(fs::exists(trace_file(env_dir, 1)));

  // An embedded engine made from a config takes the config's key: the trace holds its step.
  const std::string config_dir = dir + "/from_config";
  {
    auto made = engine::create_from_json(R"({"zmuon": {"ranks": 1, "trace": )"
                                         + json(config_dir).dump() + "}}");
    BOOST_REQUIRE_MESSAGE(made, (made ? "" : made.err().to_string()));
    auto& eng = **made;
    BOOST_REQUIRE(!eng.add_parameter(param_spec{"w", {4, 3}}, std::vector<float>(12, 0.5f)));
    BOOST_REQUIRE(!eng.reduce(0, {{"w", std::vector<float>(12, 0.25f)}}));
    BOOST_REQUIRE(eng.step());
  }
  int steps_traced = 0;
  for (const auto& rec : read_jsonl(trace_file(config_dir, 0)))
    steps_traced += is(rec, "recv") && rec["type"] == "step_request";
  BOOST_TEST(steps_traced == 1);

  // A trace directory that cannot be made is an error naming it.
  std::ofstream(dir + "/plain_file") << "x";
  out = test::run_launch("--steps 1 --trace " + dir + "/plain_file/sub", &status);
  BOOST_TEST(status != 0);
  BOOST_TEST(out.find("trace directory '" + dir + "/plain_file/sub'") != std::string::npos, out);
}

BOOST_AUTO_TEST_CASE(clocks_of_another_host_are_aligned_by_message_pairs) {
  // Rank 2 as if written on another host whose steady clock reads 5 s ahead: the reader must
  // find the shift from the peer messages' send/receive pairs, to within their delivery time.
  auto dir = copy_of("other_host");
  const int64_t shift = 5'000'000'000;
  auto recs = read_jsonl(trace_file(dir, 2));
  for (auto& rec : recs) {
    if (is(rec, "meta"))
      rec["host"] = "other-host";
    rec["t"] = rec["t"].get<int64_t>() + shift;
  }
  write_jsonl(trace_file(dir, 2), recs);
  auto ts = trace_tool::read_traces(dir);
  BOOST_REQUIRE_MESSAGE(ts, (ts ? "" : ts.err().message()));
  BOOST_REQUIRE_EQUAL(ts->ranks.size(), 3u);
  BOOST_TEST(ts->ranks[0].offset == 0);
  BOOST_TEST(ts->ranks[1].offset == 0);
  BOOST_TEST_MESSAGE("estimated offset " << ts->ranks[2].offset << " ns, true " << shift);
  BOOST_TEST(std::llabs(ts->ranks[2].offset - shift) < 20'000'000);  // 20 ms
  // After alignment every peer message is received after it was sent, give or take that bound.
  int64_t worst = 0;
  std::map<std::string, int64_t> sends;
  for (const auto& rt : ts->ranks)
    for (const auto& r : rt.records)
      if (r.ev == "send" && !r.id.empty() && r.id[0] == 'p')
        sends[r.id] = r.t;
  for (const auto& rt : ts->ranks)
    for (const auto& r : rt.records)
      if (r.ev == "recv" && sends.count(r.id))
        worst = std::min(worst, r.t - sends[r.id]);
  BOOST_TEST(worst > -20'000'000);
  // The checks read each rank on its own clock: the shifted trace still passes.
  int status = 0;
  auto out = tool("check " + dir, &status);
  BOOST_TEST(status == 0, out);
}
