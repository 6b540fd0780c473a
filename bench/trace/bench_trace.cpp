// bench_trace: what the message trace costs (docs/DESIGN.md §9: near-zero when off).
//
// 1. Messages per second between two actors of one process, request/answer pairs with 64 in
//    flight, three ways: plain CAF (self->request, no trace helpers), the trace helpers with
//    tracing off (one branch per message), and with tracing on (records written to a file).
// 2. The default zmuon-launch job (the example model, 4 in-process ranks, gas 1, micro-batch 8)
//    for --steps steps, tracing off and on: steps per second, messages per step (counted from
//    the trace), and the trace's size per step.
// Each figure is the median of --reps runs.
//
//   bench_trace [--messages N] [--steps N] [--reps N] [--dir DIR]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "caf/all.hpp"

#include "messages/registry.hpp"
#include "trace/trace.hpp"
#include "zmuon-launch/train.hpp"

namespace {

using namespace zmuon;
namespace fs = std::filesystem;

enum class mode { plain, off, on };

const char* name(mode m) {
  return m == mode::plain ? "plain CAF (no trace helpers)"
                          : (m == mode::off ? "trace helpers, tracing off" : "tracing on");
}

// Wall time and the process's CPU time (all threads), in seconds.
struct timing {
  double wall = 0;
  double cpu = 0;
};

double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// -- 1. two actors ------------------------------------------------------------------------------

using pong_actor = caf::typed_actor<caf::replies_to<flush>::with<flush_done>>;
using ping_actor = caf::typed_actor<caf::replies_to<step_request>::with<step_result>>;

struct pong_state {
  trace::track tr;
  static const char* name;
};
const char* pong_state::name = "pong";

pong_actor::behavior_type pong(pong_actor::stateful_pointer<pong_state> self,
                               std::shared_ptr<trace::recorder> rec, mode m) {
  self->state.tr = trace::track(std::move(rec), "pong");
  if (m == mode::plain)
    return {[=](flush& msg) { return flush_done{msg.step, 1}; }};
  return {[=](flush& msg) {
    ZMUON_TRACE_RECV(self, msg);
    return flush_done{msg.step, 1};
  }};
}

struct ping_state {
  trace::track tr;
  uint64_t sent = 0;
  uint64_t answered = 0;
  uint64_t total = 0;
  caf::typed_response_promise<step_result> done;
  static const char* name;
};
const char* ping_state::name = "ping";

using ping_pointer = ping_actor::stateful_pointer<ping_state>;

void next(ping_pointer self, const pong_actor& dest, mode m) {
  auto& st = self->state;
  if (st.sent == st.total)
    return;
  flush msg{++st.sent};
  auto on_answer = [=](flush_done&) {
    if (++self->state.answered == self->state.total)
      self->state.done.deliver(step_result{});
    else
      next(self, dest, m);
  };
  auto on_error = [=](caf::error& err) { self->state.done.deliver(std::move(err)); };
  if (m == mode::plain)
    self->request(dest, caf::infinite, msg).then(on_answer, on_error);
  else
    trace::request(self, st.tr, dest, msg).then(on_answer, on_error);
}

ping_actor::behavior_type ping(ping_pointer self, pong_actor dest,
                               std::shared_ptr<trace::recorder> rec, mode m) {
  self->state.tr = trace::track(std::move(rec), "ping");
  return {[=](step_request& req) -> caf::result<step_result> {
    auto& st = self->state;
    st.total = req.step;
    st.done = self->make_response_promise<step_result>();
    for (int i = 0; i < 64; ++i)
      next(self, dest, m);
    return st.done;
  }};
}

struct bench_config : caf::actor_system_config {
  bench_config() { register_messages(*this); }
};

// Seconds for `n` request/answer pairs.
timing ping_pong(mode m, uint64_t n, const std::string& dir) {
  bench_config cfg;
  caf::actor_system sys{cfg};
  std::shared_ptr<trace::recorder> rec;
  if (m == mode::on) {
    auto r = trace::recorder::open(dir, 0, 0, 1);
    if (!r) {
      std::fprintf(stderr, "bench_trace: %s\n", r.err().to_string().c_str());
      std::exit(2);
    }
    rec = *r;
  }
  auto po = sys.spawn(pong, rec, m);
  auto pi = sys.spawn(ping, po, rec, m);
  caf::scoped_actor self{sys};
  auto t0 = std::chrono::steady_clock::now();
  double c0 = cpu_now();
  bool ok = false;
  self->request(pi, std::chrono::seconds(600), step_request{n})
      .receive([&](step_result&) { ok = true; }, [&](caf::error&) {});
  auto t1 = std::chrono::steady_clock::now();
  double c1 = cpu_now();
  if (!ok) {
    std::fprintf(stderr, "bench_trace: ping-pong failed\n");
    std::exit(2);
  }
  self->send_exit(pi, caf::exit_reason::user_shutdown);
  self->send_exit(po, caf::exit_reason::user_shutdown);
  return {std::chrono::duration<double>(t1 - t0).count(), c1 - c0};
}

// -- 2. the default job -------------------------------------------------------------------------

struct job_figures {
  double seconds = 0;
  double cpu = 0;
  uint64_t trace_bytes = 0;
  uint64_t messages = 0;  // recv and reply records: messages and answers that arrived
};

job_figures default_job(bool traced, int steps, const std::string& dir) {
  engine_options o;  // zmuon-launch's defaults: 4 ranks; AdamW lr 3e-3 as the launcher sets it
  o.adamw.lr = 3e-3f;
  if (traced) {
    fs::remove_all(dir);
    o.trace_dir = dir;
  }
  example::train_options t;
  t.steps = steps;
  job_figures f;
  {
    auto eng = engine::create(o);
    if (!eng || example::register_model(**eng, t)) {
      std::fprintf(stderr, "bench_trace: engine setup failed\n");
      std::exit(2);
    }
    auto t0 = std::chrono::steady_clock::now();
    double c0 = cpu_now();
    auto rec = example::train(**eng, t);
    f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    f.cpu = cpu_now() - c0;
    if (!rec) {
      std::fprintf(stderr, "bench_trace: %s\n", rec.err().to_string().c_str());
      std::exit(2);
    }
  }
  if (traced)
    for (const auto& e : fs::directory_iterator(dir)) {
      f.trace_bytes += fs::file_size(e.path());
      std::ifstream in(e.path());
      std::string line;
      while (std::getline(in, line))
        f.messages += line.find("\"ev\":\"recv\"") != std::string::npos
                      || line.find("\"ev\":\"reply\"") != std::string::npos;
    }
  return f;
}

// ns per recorded receive, without actors: the guard of ZMUON_TRACE_RECV on a one-way message.
// `with_guard` false: the same loop without the guard (the baseline).
double guard_ns(bool on, int64_t n, const std::string& dir, bool with_guard = true) {
  trace::track tr;
  if (on) {
    auto r = trace::recorder::open(dir, 0, 0, 1);
    if (!r)
      std::exit(2);
    tr = trace::track(*r, "bench");
  }
  micro_grads msg{1, 0, 0, nullptr};
  caf::local_actor* self = nullptr;  // not used for a message with a content id
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    msg.bucket = static_cast<int32_t>(i);
    asm volatile("" : : "r"(&msg) : "memory");  // the loop is not optimized away
    if (with_guard)
      trace::receiving guard(self, tr, msg);
  }
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count()
         / static_cast<double>(n);
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t messages = 200000;
  int steps = 30;
  int reps = 5;
  std::string dir = "bench_trace_out";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--messages")
      messages = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--steps")
      steps = std::atoi(argv[i + 1]);
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (a == "--dir")
      dir = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_trace: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (messages < 64 || steps < 1 || reps < 1) {
    std::fprintf(stderr, "bench_trace: --messages >= 64, --steps >= 1, --reps >= 1\n");
    return 2;
  }
  std::printf("bench_trace --messages %llu --steps %d --reps %d  (median of %d runs)\n\n",
              static_cast<unsigned long long>(messages), steps, reps, reps);
  std::vector<double> g_off, g_on, g_none;
  for (int r = 0; r < reps; ++r) {
    g_none.push_back(guard_ns(false, 20'000'000, dir + "/guard", false));
    g_off.push_back(guard_ns(false, 20'000'000, dir + "/guard"));
    g_on.push_back(guard_ns(true, 1'000'000, dir + "/guard"));
  }
  fs::remove_all(dir + "/guard");
  std::printf("0. one recorded receive (the ZMUON_TRACE_RECV guard alone, no actors)\n");
  std::printf("   loop alone:  %8.2f ns per iteration\n", median_of(g_none));
  std::printf("   tracing off: %8.2f ns per message\n", median_of(g_off));
  std::printf("   tracing on:  %8.2f ns per message (format + lock + buffered write)\n\n",
              median_of(g_on));

  std::printf("1. two actors, request/answer, 64 in flight, %llu requests (%llu messages)\n",
              static_cast<unsigned long long>(messages),
              static_cast<unsigned long long>(2 * messages));
  // The modes take turns within each repetition, so that a slow spell of a shared machine hits
  // all of them alike; the table shows the median and the range.
  const mode modes[] = {mode::plain, mode::off, mode::on};
  std::vector<double> rates[3], cpu_rates[3];
  for (int r = 0; r < reps; ++r)
    for (int k = 0; k < 3; ++k) {
      mode m = modes[(k + r) % 3];
      auto t = ping_pong(m, messages, dir + "/pingpong");
      rates[static_cast<int>(m)].push_back(2.0 * static_cast<double>(messages) / t.wall);
      cpu_rates[static_cast<int>(m)].push_back(2.0 * static_cast<double>(messages) / t.cpu);
    }
  fs::remove_all(dir + "/pingpong");
  std::printf("   %-30s %12s %9s %25s %16s %9s\n", "", "messages/s", "vs plain",
              "range (min .. max)", "msgs/CPU-second", "vs plain");
  double plain = median_of(rates[0]);
  double cpu_plain = median_of(cpu_rates[0]);
  for (mode m : modes) {
    auto& v = rates[static_cast<int>(m)];
    double med = median_of(v);
    double cpu = median_of(cpu_rates[static_cast<int>(m)]);
    std::printf("   %-30s %12.0f %8.3fx %12.0f .. %-12.0f %16.0f %8.3fx\n", name(m), med,
                med / plain, *std::min_element(v.begin(), v.end()),
                *std::max_element(v.begin(), v.end()), cpu, cpu / cpu_plain);
  }

  std::printf("\n2. default job (example model, 4 ranks, gas 1, micro-batch 8), %d steps\n", steps);
  job_figures on;
  std::vector<double> off_s, on_s, off_cpu, on_cpu;
  for (int r = 0; r < reps; ++r) {
    auto off = default_job(false, steps, dir + "/job");
    off_s.push_back(off.seconds);
    off_cpu.push_back(off.cpu);
    on = default_job(true, steps, dir + "/job");
    on_s.push_back(on.seconds);
    on_cpu.push_back(on.cpu);
  }
  double per_step = static_cast<double>(on.messages) / steps;
  std::printf("   %-16s %10s %14s %18s\n", "", "steps/s", "messages/s", "CPU ms per step");
  std::printf("   %-16s %10.1f %14.0f %18.3f\n", "tracing off", steps / median_of(off_s),
              per_step * steps / median_of(off_s), 1e3 * median_of(off_cpu) / steps);
  std::printf("   %-16s %10.1f %14.0f %18.3f\n", "tracing on", steps / median_of(on_s),
              per_step * steps / median_of(on_s), 1e3 * median_of(on_cpu) / steps);
  std::printf("   messages and answers per step (all ranks): %.0f\n", per_step);
  std::printf("   trace size: %llu bytes for %d steps = %.0f bytes per step (all 4 ranks)\n",
              static_cast<unsigned long long>(on.trace_bytes), steps,
              static_cast<double>(on.trace_bytes) / steps);
  return 0;
}
