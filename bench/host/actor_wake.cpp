// zmuon-bench-actor-wake: the round trip of a request from a host thread through two actors
// and back (the engine's step request, its hand-over messages, a CUDA completion callback all
// enter the scheduler from outside it), after the scheduler sat idle for a while (the GPU's work
// between two of the engine's messages). zmuon's actor-system settings
// (configure_actor_system) against CAF's defaults (--caf-default); median and p90 of --reps
// round trips per idle gap.
//
//   zmuon-bench-actor-wake [--caf-default] [--threads 4] [--reps 2000] [--idle-us 200,1000,5000]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "caf/all.hpp"

#include "messages/registry.hpp"

namespace {

caf::behavior echo(caf::event_based_actor*) {
  return {[](int x) { return x + 1; }};
}

// One hop more inside the scheduler, as the engine's requests go on from actor to actor.
caf::behavior relay(caf::event_based_actor* self, const caf::actor& next) {
  return {[=](int x) { return self->delegate(next, x); }};
}

struct bench_config : caf::actor_system_config {
  bench_config(bool caf_default, size_t threads) {
    if (!caf_default)
      zmuon::configure_actor_system(*this);
    set("scheduler.max-threads", threads);
  }
};

std::vector<int> parse_list(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const int v = std::atoi(text.substr(at, comma - at).c_str());
    if (v < 0)
      return {};
    out.push_back(v);
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool caf_default = false;
  size_t threads = 4;  // an engine's own system at one local rank (scheduler_threads)
  int reps = 2000;
  std::vector<int> idle_us = {200, 1000, 5000};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--caf-default") {
      caf_default = true;
    } else if (a == "--threads" && has_value) {
      threads = static_cast<size_t>(std::max(1, std::atoi(argv[++i])));
    } else if (a == "--reps" && has_value) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--idle-us" && has_value) {
      idle_us = parse_list(argv[++i]);
      if (idle_us.empty()) {
        std::fprintf(stderr, "--idle-us takes microseconds, e.g. 200,1000,5000\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: zmuon-bench-actor-wake [--caf-default] [--threads N] [--reps N] "
                   "[--idle-us A,B,...]\n");
      return 2;
    }
  }
  bench_config cfg(caf_default, threads);
  caf::actor_system sys{cfg};
  auto last = sys.spawn(echo);
  auto first = sys.spawn(relay, last);
  caf::scoped_actor self{sys};
  std::printf("%s, %zu scheduler threads, %d round trips per idle gap\n",
              caf_default ? "CAF's defaults" : "zmuon's settings", threads, reps);
  for (int idle : idle_us) {
    std::vector<double> us;
    for (int r = 0; r < reps; ++r) {
      std::this_thread::sleep_for(std::chrono::microseconds(idle));
      const auto t0 = std::chrono::steady_clock::now();
      self->request(first, caf::infinite, r).receive([](int) {}, [](caf::error&) {});
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    std::printf("idle %6d us: round trip median %7.1f us, p90 %7.1f us\n", idle, us[us.size() / 2],
                us[us.size() * 9 / 10]);
  }
  return 0;
}
