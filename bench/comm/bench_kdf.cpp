// zmuon-bench-kdf: what one guess at the job's secret costs an attacker who holds a node's
// certificate: one derivation of the CA key (scrypt with the job's salt, kScryptCost), timed on
// one thread and on --threads at once, and the memory each needs.
//
//   zmuon-bench-kdf [--reps 20] [--threads 0 (the cores)]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "node/tls_credentials.hpp"

int main(int argc, char* argv[]) {
  int reps = 20;
  int threads = 0;
  CLI::App app{"zmuon-bench-kdf: the cost of one guess at the job's secret"};
  app.add_option("--reps", reps, "derivations per thread")->check(CLI::Range(1, 10000));
  app.add_option("--threads", threads, "threads at once (0: the cores)")
      ->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);
  if (threads == 0)
    threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::string salt = zmuon::job_salt(2, "node0.example");
  using clock = std::chrono::steady_clock;
  // One thread: the median derivation.
  std::vector<double> ms;
  const std::clock_t cpu0 = std::clock();
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock::now();
    if (zmuon::derive_ca_public_key("guess-" + std::to_string(i), salt).empty()) {
      std::fprintf(stderr, "zmuon-bench-kdf: the derivation failed\n");
      return 1;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
  }
  // Processor time too: on a shared machine the wall clock also counts other work.
  const double cpu_ms = 1000.0 * static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC / reps;
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  // Every thread at once: guesses a second on this machine.
  std::atomic<bool> failed{false};
  const auto t0 = clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < reps; ++i)
        if (zmuon::derive_ca_public_key("guess-" + std::to_string(t) + "-" + std::to_string(i),
                                        salt)
                .empty())
          failed = true;
    });
  for (auto& th : pool)
    th.join();
  const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
  if (failed) {
    std::fprintf(stderr, "zmuon-bench-kdf: a derivation failed\n");
    return 1;
  }
  const auto cost = zmuon::kScryptCost;
  std::printf("scrypt N=%llu r=%u p=%u: %.0f MiB per derivation\n",
              static_cast<unsigned long long>(cost.n), cost.r, cost.p,
              static_cast<double>(cost.memory()) / (1 << 20));
  std::printf("one thread: median %.1f ms per derivation (%.1f guesses/s), %.1f ms of CPU time\n",
              median, 1000.0 / median, cpu_ms);
  std::printf("%d threads: %.1f guesses/s\n", threads, threads * reps / seconds);
  return 0;
}
