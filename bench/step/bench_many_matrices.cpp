// zmuon-bench-many-matrices: the time to register, start and step a table of many small Muon
// matrices on the host backend, to show that each grows linearly with the matrix count.
//
//   zmuon-bench-many-matrices [--matrices 100000] [--rows 4] [--cols 4] [--world 2] [--steps 2]
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "zmuon/engine.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

double ms_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

// Processor time of the whole process (every thread), in ms: on a shared machine the wall clock
// counts others' work too.
double cpu_ms() {
  return 1000.0 * static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

}  // namespace

int main(int argc, char* argv[]) {
  int64_t matrices = 100'000;
  int64_t rows = 4;
  int64_t cols = 4;
  int steps = 2;
  zmuon::engine_options opts;
  opts.world = 2;
  opts.compute = "host";
  opts.comm = "caf";
  opts.timeout_ms = 600'000;
  CLI::App app{"zmuon-bench-many-matrices: register and step many small Muon matrices"};
  app.add_option("--matrices", matrices)->check(CLI::Range(int64_t{1}, int64_t{10'000'000}));
  app.add_option("--rows", rows)->check(CLI::Range(int64_t{2}, int64_t{4096}));
  app.add_option("--cols", cols)->check(CLI::Range(int64_t{2}, int64_t{4096}));
  app.add_option("--world", opts.world)->check(CLI::Range(1, 64));
  app.add_option("--steps", steps)->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  const auto fail = [](const zmuon::error& err) {
    std::fprintf(stderr, "zmuon-bench-many-matrices: %s\n", err.to_string().c_str());
    return 1;
  };
  auto made = zmuon::engine::create(opts);
  if (!made)
    return fail(made.err());
  auto eng = std::move(*made);
  const size_t elements = static_cast<size_t>(rows * cols);
  std::vector<float> init(elements, 0.5f);
  std::vector<std::vector<float>> grads(static_cast<size_t>(matrices));
  std::vector<zmuon::tensor_view> views;
  views.reserve(static_cast<size_t>(matrices));

  double c0 = cpu_ms();
  auto t0 = clock_type::now();
  for (int64_t i = 0; i < matrices; ++i) {
    const std::string name = "m" + std::to_string(i) + ".weight";
    if (auto err = eng->add_parameter({name, {rows, cols}}, init))
      return fail(err);
  }
  const double register_ms = ms_since(t0), register_cpu = cpu_ms() - c0;
  c0 = cpu_ms();
  t0 = clock_type::now();
  if (auto err = eng->start())
    return fail(err);
  const double start_ms = ms_since(t0), start_cpu = cpu_ms() - c0;
  for (int64_t i = 0; i < matrices; ++i) {
    auto& g = grads[static_cast<size_t>(i)];
    g.assign(elements, 0.0f);
    for (size_t e = 0; e < elements; ++e)
      g[e] = static_cast<float>((static_cast<size_t>(i) + e * 7) % 13) / 13.0f - 0.5f;
    views.push_back(
        {"m" + std::to_string(i) + ".weight", g.data(), static_cast<int64_t>(elements)});
  }
  std::vector<double> step_ms, step_cpu;
  for (int s = 0; s < steps; ++s) {
    c0 = cpu_ms();
    t0 = clock_type::now();
    for (int r = 0; r < opts.world; ++r)
      if (auto err = eng->reduce(r, views))
        return fail(err);
    if (auto done = eng->step(); !done)
      return fail(done.err());
    step_ms.push_back(ms_since(t0));
    step_cpu.push_back(cpu_ms() - c0);
  }
  std::printf("%lld matrices [%lld, %lld], world %d, compute host, comm caf\n",
              static_cast<long long>(matrices), static_cast<long long>(rows),
              static_cast<long long>(cols), opts.world);
  std::printf("wall (CPU) ms: register %.1f (%.1f), start %.1f (%.1f)", register_ms, register_cpu,
              start_ms, start_cpu);
  for (size_t s = 0; s < step_ms.size(); ++s)
    std::printf(", step %zu (reduce + step) %.1f (%.1f)", s + 1, step_ms[s], step_cpu[s]);
  std::printf("\n");
  return 0;
}
