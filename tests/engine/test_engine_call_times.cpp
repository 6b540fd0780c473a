// engine::time_backend_calls and take_backend_call_times (zmuon/call_times.hpp) on the host
// backend: each rank's backend counts every call of a step under its name, exactly as often as
// the step protocol makes it (the counts follow from the plan); nothing is counted while timing
// is off, and a take starts new sums; backend_call_spans gives the calls of the period last
// taken, one span each, by start. The CUDA backend's event timing is tested on the GPU
// (test_cuda_kernels, `call_timing`). The sums themselves: count, summed spans and busy time (their
// union) from known spans.
#define BOOST_TEST_MODULE engine_call_times
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "kernels/compute.hpp"
#include "plan/ownership.hpp"
#include "plan/plan.hpp"
#include "support/engine_fixture.hpp"
#include "support/scratch_dir.hpp"

using namespace zmuon;
using namespace zmuon::test;

namespace {

std::vector<param_spec> test_table() {
  std::vector<param_spec> table;
  for (int i = 0; i < 5; ++i)  // two shapes: NS batches by shape within each chunk
    table.push_back({"w" + std::to_string(i), {32 + 16 * (i % 2), 40}, param_group::muon, 0});
  table.push_back({"bias", {70}, param_group::adamw, 0});
  table.push_back({"norm", {40}, param_group::adamw, 0});
  return table;
}

void run_step(engine& eng, const std::vector<param_spec>& table, int step) {
  for (int r = 0; r < eng.world(); ++r)
    BOOST_REQUIRE(!eng.reduce(r, random_grads(table, 3, step, r, 0)));
  auto info = eng.step();
  BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_step_counts_each_backend_call_as_often_as_the_protocol_makes_it) {
  const auto table = test_table();
  engine_options o = options(2);
  o.reduce_bucket_size = 2 * 48 * 40;  // several chunks
  auto eng = make_engine(o);
  auto early = eng->backend_call_spans(0);  // no backend before the engine starts
  BOOST_REQUIRE(!early);
  BOOST_TEST(early.err().to_string().find("backend_call_spans(): the engine has not started")
             != std::string::npos);
  register_table(*eng, table, 4);
  eng->time_backend_calls(true);  // before the engine starts: its backends get it when made
  run_step(*eng, table, 1);
  const plan& pl = *eng->layout();
  BOOST_REQUIRE_GE(pl.chunks.size(), 2u);
  for (int r = 0; r < o.world; ++r) {
    int64_t ns_calls = 0;  // one batched call per shape group of the matrices rank r owns
    for (const auto& own : make_ownership(pl, r))
      ns_calls += static_cast<int64_t>(own.groups.size());
    auto times = eng->take_backend_call_times(r);
    BOOST_REQUIRE_MESSAGE(times, (times ? "" : times.err().to_string()));
    BOOST_TEST_MESSAGE("rank " << r << ": newton_schulz " << (*times)["newton_schulz"].calls
                               << " calls, " << (*times)["newton_schulz"].ms << " ms");
    BOOST_TEST((*times)["newton_schulz"].calls == ns_calls);
    BOOST_TEST((*times)["newton_schulz"].ms > 0.0);
    BOOST_TEST((*times)["newton_schulz"].busy_ms <= (*times)["newton_schulz"].ms + 1e-9);
    BOOST_TEST((*times)["momentum"].calls == pl.muon_count());  // one per Muon shard
    BOOST_TEST((*times)["apply_update"].calls == pl.muon_count());
    BOOST_TEST((*times)["adamw"].calls == 2);  // one per AdamW shard
    for (const auto& [name, t] : *times)
      BOOST_TEST(t.ms >= 0.0, name << " has " << t.ms << " ms");
    // The same calls one by one: as many spans per name, each as long as its share of `ms`.
    auto spans = eng->backend_call_spans(r);
    BOOST_REQUIRE(spans);
    std::map<std::string, call_time> from_spans;
    std::map<std::string, int> engine_calls;  // the caller's thread: this rank's reduce, the step
    const call_span* step_span = nullptr;
    double last_start = 0.0;
    for (const call_span& s : *spans) {
      BOOST_TEST(s.start_ms >= last_start, s.name << " out of order");
      BOOST_TEST(s.end_ms >= s.start_ms);
      last_start = s.start_ms;
      if (s.track == call_span::kHostTrack) {
        ++engine_calls[s.name];
        if (s.name == "step")
          step_span = &s;
        continue;
      }
      BOOST_TEST(s.track == 0);  // the host backend: the calling thread
      ++from_spans[s.name].calls;
      from_spans[s.name].ms += s.end_ms - s.start_ms;
    }
    BOOST_TEST((engine_calls == std::map<std::string, int>{{"hand_over", 1}, {"step", 1}}));
    BOOST_REQUIRE(step_span != nullptr);
    for (const call_span& s : *spans)  // the step's calls ran while step() waited for them
      if (s.name == "momentum" || s.name == "newton_schulz" || s.name == "adamw")
        BOOST_TEST((s.start_ms >= step_span->start_ms && s.end_ms <= step_span->end_ms), s.name);
    BOOST_TEST(from_spans.size() == times->size());
    for (const auto& [name, t] : *times) {
      BOOST_TEST(from_spans[name].calls == t.calls, name);
      BOOST_TEST(std::abs(from_spans[name].ms - t.ms) <= 1e-9 * (1.0 + t.ms), name);
    }
    auto again = eng->take_backend_call_times(r);  // a take starts new sums
    BOOST_REQUIRE(again);
    BOOST_TEST(again->empty());
    BOOST_TEST(eng->backend_call_spans(r)->empty());  // and the last period's spans with them
  }
  eng->time_backend_calls(false);
  run_step(*eng, table, 2);
  for (int r = 0; r < o.world; ++r) {
    auto times = eng->take_backend_call_times(r);
    BOOST_REQUIRE(times);
    BOOST_TEST(times->empty());
  }
  BOOST_TEST(!eng->take_backend_call_times(o.world));  // not a rank of this engine
  BOOST_TEST(!eng->backend_call_spans(o.world));
}

BOOST_AUTO_TEST_CASE(busy_time_is_the_union_of_the_calls_spans) {
  std::vector<std::pair<double, double>> spans{
      {1.0, 3.0}, {0.0, 2.0}, {5.0, 6.5}, {5.5, 6.0}};  // the second and fourth overlap others
  call_time t;
  fold_call_spans(spans, t);
  BOOST_TEST(spans.empty());
  BOOST_TEST(t.calls == 4);
  BOOST_TEST(t.ms == 6.0);
  BOOST_TEST(t.busy_ms == 4.5);  // [0, 3] and [5, 6.5]
  std::vector<std::pair<double, double>> later{{7.0, 7.25}};
  fold_call_spans(later, t);  // a later batch adds to the sums
  BOOST_TEST(t.calls == 5);
  BOOST_TEST(t.busy_ms == 4.75);
}

BOOST_AUTO_TEST_CASE(write_call_timeline_takes_every_rank_and_writes_its_calls) {
  const auto table = test_table();
  auto eng = make_engine(options(2));
  register_table(*eng, table, 4);
  const scratch_dir dir;
  const std::string path = dir.file("timeline.json");
  run_step(*eng, table, 1);
  auto off = eng->write_call_timeline(path);  // timing is off: nothing to write
  BOOST_TEST((off.code() == errc::bad_state));
  BOOST_TEST(off.message().find("call timing is off") != std::string::npos);
  eng->time_backend_calls(true);
  run_step(*eng, table, 2);
  BOOST_REQUIRE(!eng->write_call_timeline(path));
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  std::map<int, int64_t> momentum_calls;  // by rank (pid)
  for (const auto& e : j.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("name") == "momentum")
      ++momentum_calls[e.at("pid").get<int>()];
  const plan& pl = *eng->layout();
  BOOST_TEST(momentum_calls.size() == 2u);  // both ranks, one call per Muon shard each
  BOOST_TEST(momentum_calls[0] == pl.muon_count());
  BOOST_TEST(momentum_calls[1] == pl.muon_count());
  BOOST_TEST(eng->take_backend_call_times(0)->empty());  // the period was taken
  auto bad = eng->write_call_timeline(dir.file("no/such/dir/timeline.json"));
  BOOST_TEST((bad.code() == errc::io_error));
  BOOST_TEST(bad.message().find("cannot write") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(timeline_is_chrome_trace_json_of_the_spans) {
  const std::map<int, std::vector<call_span>> by_rank{
      {0, {{"momentum", 0, 10.0, 10.5}, {"newton_schulz", 2, 10.25, 12.0}}},
      {3, {{"adamw", 0, 4.0, 4.125}}}};
  const auto j = nlohmann::json::parse(call_timeline_json(by_rank, true));
  std::map<std::pair<int, int>, std::string> threads;  // (pid, tid) -> name
  std::vector<nlohmann::json> slices;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      threads[{e.at("pid").get<int>(), e.at("tid").get<int>()}] = e.at("args").at("name");
    else if (e.at("ph") == "X")
      slices.push_back(e);
  }
  BOOST_TEST(threads.size() == 3u);
  BOOST_TEST(threads[std::make_pair(0, 0)] == "main stream");
  BOOST_TEST(threads[std::make_pair(0, 2)] == "NS lane 1");
  BOOST_TEST(threads[std::make_pair(3, 0)] == "main stream");
  BOOST_REQUIRE_EQUAL(slices.size(), 3u);
  // Microseconds from each rank's first call.
  BOOST_TEST(slices[1].at("name") == "newton_schulz");
  BOOST_TEST(slices[1].at("pid").get<int>() == 0);
  BOOST_TEST(slices[1].at("tid").get<int>() == 2);
  BOOST_TEST(slices[1].at("ts").get<double>() == 250.0);
  BOOST_TEST(slices[1].at("dur").get<double>() == 1750.0);
  BOOST_TEST(slices[2].at("pid").get<int>() == 3);
  BOOST_TEST(slices[2].at("ts").get<double>() == 0.0);
  BOOST_TEST(slices[2].at("dur").get<double>() == 125.0);
  const auto host =
      nlohmann::json::parse(call_timeline_json({{0, {{"adamw", 0, 1.0, 2.0}}}}, false));
  bool named = false;
  for (const auto& e : host.at("traceEvents"))
    named = named || (e.at("name") == "thread_name" && e.at("args").at("name") == "host calls");
  BOOST_TEST(named);
}
