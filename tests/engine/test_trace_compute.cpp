// The compute backend's calls in the message trace (docs/DESIGN.md §9, "spans for GPU phases"): a
// traced engine (host backend, 2 ranks, a skipped step) writes a `compute` span for every call
// its backend counts; each lies inside the handler that made it and carries that handler's
// step; `zmuon-trace check` fails a state-changing call in a skipped step; summary and perfetto
// show the calls. The recorder's step attribution is tested on its own. (The CUDA side, device
// events mapped onto the host's clock, is test_engine_cuda's `compute_spans_on_the_device`.)
#define BOOST_TEST_MODULE trace_compute
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "support/engine_fixture.hpp"
#include "support/run_launch.hpp"
#include "support/trace_files.hpp"
#include "trace/recorder.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace zmuon;
using test::read_jsonl;
using test::trace_file;

namespace {

const int world = 2;
const int steps = 3;
const int bad_step = 2;  // rank 1 hands over a NaN gradient: the step is skipped

bool is_compute(const json& r) {
  return r.value("ev", "") == "span" && r.value("actor", "") == "compute";
}

std::string tool(const std::string& args, int* status) {
  return test::run_command(std::string(ZMUON_TRACE_TOOL) + " " + args, status);
}

// The traced run, made once: its trace directory and each rank's call times over the whole run.
struct traced_run {
  std::string dir = "test_trace_compute_run";
  std::vector<call_times> times;

  traced_run() {
    fs::remove_all(dir);
    auto o = test::options(world);
    o.reduce_bucket_size = 300;  // several buckets and chunks
    o.trace_dir = dir;
    auto eng = test::make_engine(o);
    const std::vector<param_spec> t{
        {"a.weight", {24, 16}}, {"bias", {16}}, {"b.weight", {16, 24}}, {"c.weight", {12, 12}}};
    test::register_table(*eng, t, 5);
    eng->time_backend_calls(true);  // from the backends' first call, as the trace
    for (int s = 1; s <= steps; ++s) {
      for (int r = 0; r < world; ++r) {
        auto g = test::random_grads(t, 5, s, r, 0);
        if (s == bad_step && r == 1)
          g["bias"][2] = std::numeric_limits<float>::quiet_NaN();
        test::reduce_ok(*eng, r, g);
      }
      BOOST_REQUIRE(test::step_ok(*eng).skipped == (s == bad_step));
    }
    for (int r = 0; r < world; ++r) {
      auto ct = eng->take_backend_call_times(r);
      BOOST_REQUIRE(ct);
      times.push_back(*ct);
    }
  }
};

const traced_run& run() {
  static traced_run r;
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_backend_call_is_a_span_inside_its_handler_with_its_step) {
  const auto& r = run();
  for (int rank = 0; rank < world; ++rank) {
    auto recs = read_jsonl(trace_file(r.dir, rank));
    std::map<std::string, int64_t> calls;
    std::map<int64_t, std::map<std::string, int>> by_step;  // step -> call -> count
    int unenclosed = 0, ns_outside = 0;
    for (const auto& c : recs) {
      if (!is_compute(c))
        continue;
      const std::string name = c["phase"];
      const int64_t t0 = c["t"], t1 = t0 + c["dur"].get<int64_t>();
      const int64_t step = c["step"];
      BOOST_TEST(c["track"] == 0);  // the host backend runs on the calling thread
      ++calls[name];
      ++by_step[step][name];
      // The handler (or reply continuation) that made the call: same rank, around it, and of
      // the same step. Step 0: the engine's start (load_params), before any step's record.
      bool enclosed = false, in_ns = false;
      for (const auto& h : recs) {
        const std::string ev = h.value("ev", "");
        if ((ev == "recv" || ev == "reply") && h.contains("dur") && h["t"] <= t0
            && h["t"].get<int64_t>() + h["dur"].get<int64_t>() >= t1
            && h.value("step", int64_t{-1}) == step)
          enclosed = true;
        if (ev == "span" && h["phase"] == "ns" && h["t"] <= t0
            && h["t"].get<int64_t>() + h["dur"].get<int64_t>() >= t1 && h["step"] == step)
          in_ns = true;
      }
      if (!enclosed && ++unenclosed <= 3)
        BOOST_TEST_MESSAGE("rank " << rank << ": no handler of its step around " << c.dump());
      if (name == "newton_schulz" && !in_ns)
        ++ns_outside;
    }
    BOOST_TEST(unenclosed == 0, "rank " << rank);
    BOOST_TEST(ns_outside == 0, "rank " << rank);
    // Nothing lost or doubled: the trace's calls are the ones the backend counted.
    std::map<std::string, int64_t> counted;
    for (const auto& [name, ct] : r.times[rank])
      counted[name] = ct.calls;
    BOOST_TEST(calls == counted, "rank " << rank);
    BOOST_TEST(calls["newton_schulz"] > 0);
    // Every step has calls; the skipped one only those that change no state (the scans).
    for (int s = 1; s <= steps; ++s) {
      BOOST_TEST(by_step[s]["accumulate"] > 0, "rank " << rank << " step " << s);
      for (const char* update : {"momentum", "apply_update", "adamw"})
        BOOST_TEST((by_step[s][update] > 0) == (s != bad_step),
                   "rank " << rank << " step " << s << " " << update);
    }
    BOOST_TEST(by_step[bad_step]["newton_schulz"] == 0);
  }
}

BOOST_AUTO_TEST_CASE(trace_compute_calls_off_keeps_the_messages_only) {
  const std::string dir = "test_trace_compute_off";
  fs::remove_all(dir);
  {
    auto o = test::options(1);
    o.trace_dir = dir;
    o.trace_compute_calls = false;
    auto eng = test::make_engine(o);
    const std::vector<param_spec> t{{"w", {8, 8}}, {"b", {8}}};
    test::register_table(*eng, t, 2);
    test::reduce_ok(*eng, 0, test::random_grads(t, 2, 1, 0, 0));
    test::step_ok(*eng);
  }
  int compute = 0, messages = 0;
  for (const auto& r : read_jsonl(trace_file(dir, 0))) {
    compute += is_compute(r) ? 1 : 0;
    messages += r.value("ev", "") == "recv" ? 1 : 0;
  }
  BOOST_TEST(compute == 0);
  BOOST_TEST(messages > 0);
}

BOOST_AUTO_TEST_CASE(a_call_gets_the_step_whose_first_record_began_last_before_it) {
  const std::string dir = "test_trace_compute_recorder";
  fs::remove_all(dir);
  {
    auto rec = trace::recorder::open(dir, 0, 0, 1);
    BOOST_REQUIRE(rec);
    trace::fields f;
    f.type = "micro_grads";
    (*rec)->compute("copy", 0, 500, 10);  // before any step
    f.step = 1;
    (*rec)->send("host", 1000, f, "g1.0.0", false);
    (*rec)->recv("reducer", 900, 300, f, "g1.0.0");  // written later, began earlier
    (*rec)->compute("accumulate", 1, 950, 10);
    f.step = 2;
    (*rec)->send("host", 5000, f, "g2.0.0", false);
    (*rec)->compute("momentum", 0, 4999, 1);  // read late, ran in step 1
    (*rec)->compute("momentum", 0, 5000, 1);
    (*rec)->compute("scan", 0, 899, 1);
  }
  std::vector<std::pair<std::string, int64_t>> got;  // call and its step, in write order
  for (const auto& r : read_jsonl(trace_file(dir, 0)))
    if (is_compute(r)) {
      got.emplace_back(r["phase"], r["step"]);
      BOOST_TEST(r["dur"].get<int64_t>() > 0);
    }
  const std::vector<std::pair<std::string, int64_t>> want{
      {"copy", 0}, {"accumulate", 1}, {"momentum", 1}, {"momentum", 2}, {"scan", 0}};
  BOOST_TEST(got == want, "got " << json(got).dump());
}

// A copy of the run's traces with a momentum call added to `rank`'s file at time t in `step`;
// `zmuon-trace check` on it must fail with exactly one violation whose text contains `expected`.
void momentum_call_fails_check(const std::string& name, int rank, uint64_t step, int64_t t,
                               const std::string& expected) {
  const std::string dir = "test_trace_compute_" + name;
  fs::remove_all(dir);
  fs::copy(run().dir, dir);
  auto recs = read_jsonl(trace_file(dir, rank));
  recs.push_back({{"seq", 1000000},
                  {"ev", "span"},
                  {"t", t},
                  {"actor", "compute"},
                  {"dur", 50},
                  {"phase", "momentum"},
                  {"step", step},
                  {"track", 0}});
  std::ofstream f(trace_file(dir, rank), std::ios::trunc);
  for (const auto& c : recs)
    f << c.dump() << "\n";
  f.close();
  int status = 0;
  const auto out = tool("check " + dir, &status);
  BOOST_TEST(WEXITSTATUS(status) == 1, out);
  BOOST_TEST(out.find(expected) != std::string::npos, out);
  BOOST_TEST(out.find("check: 1 violation(s)") != std::string::npos, out);
}

BOOST_AUTO_TEST_CASE(check_fails_a_state_changing_call_skipped_or_before_the_report) {
  const auto& r = run();
  int status = 0;
  auto out = tool("check " + r.dir, &status);
  BOOST_TEST(status == 0, out);
  // The skipped step: any state-changing call in it.
  int64_t t = 0;
  for (const auto& c : read_jsonl(trace_file(r.dir, 1)))
    if (is_compute(c) && c["step"] == bad_step)
      t = c["t"];
  BOOST_REQUIRE(t > 0);
  momentum_call_fails_check(
      "skipped", 1, bad_step, t + 10,
      "[compute] rank 1, step 2: compute call momentum ran in skipped step 2");
  // An applied step: a momentum call 1 ms before the report reached the coordinator.
  int64_t report = 0;
  for (const auto& c : read_jsonl(trace_file(r.dir, 0)))
    if (c.value("ev", "") == "reply" && c.value("type", "") == "overflow_report" && c["step"] == 1)
      report = c["t"];
  BOOST_REQUIRE(report > 0);
  momentum_call_fails_check("early", 0, 1, report - 1'000'000,
                            "[compute] rank 0, step 1: compute call momentum of step 1 began "
                            "1.000 ms before the overflow report of that step");
}

BOOST_AUTO_TEST_CASE(summary_and_perfetto_show_the_calls) {
  const auto& r = run();
  // newton_schulz's busy time of rank 0 in step 1, from the records (the host's calls of one
  // rank run one after another, so busy is their sum).
  int64_t ns_busy = 0;
  int compute_records = 0;
  for (const auto& c : read_jsonl(trace_file(r.dir, 0)))
    if (is_compute(c)) {
      ++compute_records;
      if (c["phase"] == "newton_schulz" && c["step"] == 1)
        ns_busy += c["dur"].get<int64_t>();
    }
  int status = 0;
  auto out = tool("summary " + r.dir, &status);
  BOOST_REQUIRE_MESSAGE(status == 0, out);
  std::smatch m;
  const std::regex row(
      R"(step 1 \(applied\)[\s\S]*?compute calls, busy[^\n]*\n(?:  \S+ +\S+ +\S+ *\n)*?  newton_schulz +(\S+))");
  BOOST_REQUIRE_MESSAGE(std::regex_search(out, m, row), out);
  BOOST_TEST(std::abs(std::stod(m[1]) - ns_busy / 1e6) <= 0.0011, out);

  const std::string path = "test_trace_compute_perfetto.json";
  out = tool("perfetto " + r.dir + " -o " + path, &status);
  BOOST_REQUIRE_MESSAGE(status == 0, out);
  std::ifstream in(path);
  const json doc = json::parse(in);
  int slices = 0;
  bool named = false;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.value("pid", -1) != 0)
      continue;
    if (e["ph"] == "X" && e.value("cat", "") == "compute") {
      ++slices;
      BOOST_TEST(e["tid"] == 8);
    }
    if (e["ph"] == "M" && e["name"] == "thread_name" && e.value("tid", 0) == 8)
      named = e["args"]["name"] == "compute";
  }
  BOOST_TEST(slices == compute_records);
  BOOST_TEST(named);
}
