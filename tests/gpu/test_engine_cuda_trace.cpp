// test_engine_cuda, continued: the backend's calls in the message trace on the device
// (compute_backend::trace_calls). Their times come from device events mapped onto the host's
// steady clock through an anchor event on an idle stream, so they must fall where the host saw
// the step, within the anchor's error (the few microseconds the device takes to reach an event
// on an idle stream; bound below: 50 us), and the device's Muon state writes after the overflow
// report.
#include "support/engine_fixture.hpp"

#include <map>
#include <string>

#include "support/scratch_dir.hpp"
#include "support/trace_files.hpp"
#include "zmuon-launch/train.hpp"

using namespace zmuon;
using namespace zmuon::test;

BOOST_AUTO_TEST_CASE(compute_spans_on_the_device) {
  const int64_t slack_ns = 50'000;
  scratch_dir dir;
  call_times times;
  {
    auto o = gpu_options(1, "nccl");
    o.trace_dir = dir.path().string();
    auto eng = make_engine(o);
    example::train_options t;
    t.steps = 3;
    t.seed = 4;
    BOOST_REQUIRE(!example::register_model(*eng, t));
    eng->time_backend_calls(true);
    auto rec = example::train(*eng, t, [](const example::step_record&) {});
    BOOST_REQUIRE_MESSAGE(rec, (rec ? "" : rec.err().to_string()));
    auto ct = eng->take_backend_call_times(0);
    BOOST_REQUIRE(ct);
    times = *ct;
  }  // the engine is gone: its backend handed the last calls to the trace
  const auto recs = read_jsonl(trace_file(dir.path().string(), 0));
  // The host's view of each step: from its first record to step()'s answer; and the start of
  // the coordinator's NS spans (the enqueue of NS's work).
  std::map<int64_t, std::pair<int64_t, int64_t>> host;  // step -> (first t, answered t)
  std::map<int64_t, int64_t> ns_enqueued;               // step -> first ns span's start
  std::map<int64_t, int64_t> reported;                  // step -> the overflow report's arrival
  for (const auto& r : recs) {
    const int64_t step = r.value("step", int64_t{0});
    if (step == 0 || r.value("actor", "") == "compute")
      continue;
    const int64_t t = r["t"];
    auto& h = host.try_emplace(step, t, t).first->second;
    h.first = std::min(h.first, t);
    if (r["ev"] == "span" && r["actor"] == "host" && r["phase"] == "step")
      h.second = t + r["dur"].get<int64_t>();
    if (r["ev"] == "span" && r["phase"] == "ns" && !ns_enqueued.count(step))
      ns_enqueued[step] = t;
    if (r["ev"] == "reply" && r.value("type", "") == "overflow_report" && !reported.count(step))
      reported[step] = t;
  }
  BOOST_REQUIRE_EQUAL(host.size(), 3u);
  std::map<std::string, int64_t> counted;
  int misplaced = 0;
  for (const auto& r : recs) {
    if (r.value("ev", "") != "span" || r.value("actor", "") != "compute")
      continue;
    const std::string name = r["phase"];
    const int64_t step = r["step"], t0 = r["t"], t1 = t0 + r["dur"].get<int64_t>();
    const int track = r["track"];
    ++counted[name];
    BOOST_TEST(t1 >= t0);
    if (name == "newton_schulz")
      BOOST_TEST((track >= 1 && track <= 3), "newton_schulz on track " << track);
    else
      BOOST_TEST(track == 0, name << " on track " << track);
    if (step == 0)
      continue;  // the engine's start
    const auto& [first, answered] = host.at(step);
    // A step's protocol work ends before step() answers; the host's own queries between steps
    // (parameters(): copy_to_host) come after it and count to the step before the next.
    const bool protocol = name != "copy_to_host" && name != "copy_from_host";
    bool ok = t0 >= first - slack_ns && (!protocol || t1 <= answered + slack_ns);
    if (name == "newton_schulz")
      ok = ok && t0 >= ns_enqueued.at(step) - slack_ns;
    // The device's state writes after the vote. Ahead of it (zmuon.momentum_before_vote, on
    // for cuda at world 1) the momentum into the spare and Newton-Schulz may start before.
    if (name == "momentum" || name == "apply_update")
      ok = ok && t0 >= reported.at(step) - slack_ns;
    if (!ok && ++misplaced <= 5)
      BOOST_TEST_MESSAGE(name << " of step " << step << " at [" << t0 - first << ", " << t1 - first
                              << "] ns from the step's first record, answered at "
                              << answered - first);
  }
  BOOST_TEST(misplaced == 0);
  std::map<std::string, int64_t> want;
  for (const auto& [name, ct] : times)
    want[name] = ct.calls;
  BOOST_TEST(counted == want);  // every timed call is in the trace, once
  BOOST_TEST(counted["newton_schulz"] > 0);
  // Every step went ahead of its vote: its momentum into the spare, none over the momentum.
  BOOST_TEST(counted["momentum_spare"] > 0);
  BOOST_TEST(counted.count("momentum") == 0u);
  // No collective to see at world 1: NS runs in place of the gather and the scatter
  // (world_one_step_issues_no_collective_and_its_calls_are_timed checks that).
}
