// zmuon-bench-checkpoint: engine::save_checkpoint and load_checkpoint of a model's parameter
// table (zmuon-bench-step's tables) on the host backend, after one step so that every state
// (parameters, momentum, Adam moments) holds values: the time each takes, the bytes written, and
// the host memory each needs beyond what the process held when it began, i.e. the peak resident
// set during the call (VmHWM after resetting it through /proc/self/clear_refs) minus the resident
// set before it (VmRSS).
//
//   zmuon-bench-checkpoint [--table gpt2-124m] [--world 4] [--dir DIR]
//
// The directory is a fresh temporary one unless --dir is given; it is removed afterwards.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "bench/step/step_tables.hpp"
#include "zmuon/engine.hpp"

namespace {

namespace fs = std::filesystem;

/// A field of /proc/self/status in kB (VmRSS, VmHWM), or -1.
long status_kb(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  long value = -1;
  while (in >> key) {
    if (key == field + ":") {
      in >> value;
      return value;
    }
    in.ignore(1 << 16, '\n');
  }
  return -1;
}

/// Resets VmHWM to the current resident set (Linux: clear_refs 5); false where refused.
bool reset_peak() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  return static_cast<bool>(out.flush());
}

struct measured {
  double ms = 0;
  double extra_mb = 0;  // peak resident set during the call above the resident set before it
};

template <class Call>
measured measure(Call&& call) {
  const long before = status_kb("VmRSS");
  const bool peak_reset = reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  call();
  const auto t1 = std::chrono::steady_clock::now();
  measured m;
  m.ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  m.extra_mb = peak_reset ? static_cast<double>(status_kb("VmHWM") - before) / 1024.0 : -1.0;
  return m;
}

}  // namespace

int main(int argc, char* argv[]) {
  std::string table_name = "gpt2-124m";
  std::string dir;
  zmuon::engine_options opts;
  opts.world = 4;
  opts.compute = "host";
  opts.comm = "caf";
  opts.timeout_ms = 600'000;
  CLI::App app{"zmuon-bench-checkpoint: save and load a model's optimizer state"};
  app.add_option("--table", table_name)->check(CLI::IsMember({"gpt2-124m", "llama-1b", "tiny"}));
  app.add_option("--world", opts.world)->check(CLI::Range(1, 64));
  app.add_option("--dir", dir, "checkpoint directory (default: a fresh one under the temp dir)");
  CLI11_PARSE(app, argc, argv);
  const bool own_dir = dir.empty();
  if (own_dir)
    dir = (fs::temp_directory_path() / ("zmuon-bench-checkpoint." + std::to_string(::getpid())))
              .string();
  struct remove_dir {
    std::string path;
    bool on;
    ~remove_dir() {
      std::error_code ec;
      if (on)
        fs::remove_all(path, ec);
    }
  } clean{dir, own_dir};

  const auto fail = [](const zmuon::error& err) {
    std::fprintf(stderr, "zmuon-bench-checkpoint: %s\n", err.to_string().c_str());
    return 1;
  };
  auto made = zmuon::engine::create(opts);
  if (!made)
    return fail(made.err());
  auto eng = std::move(*made);
  const auto table = zmuon::bench::make_table(table_name);
  zmuon::tensor_map grads;
  const auto added = zmuon::bench::add_table(*eng, table, grads);
  if (!added)
    return fail(added.err());
  const int64_t total = *added;
  for (int r = 0; r < opts.world; ++r)
    if (auto err = eng->reduce(r, grads))
      return fail(err);
  grads.clear();
  if (auto done = eng->step(); !done)
    return fail(done.err());

  zmuon::error failed;
  const measured save = measure([&] { failed = eng->save_checkpoint(dir); });
  if (failed)
    return fail(failed);
  uint64_t bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file())
      bytes += entry.file_size();
  const measured load = measure([&] {
    auto loaded = eng->load_checkpoint(dir);
    if (!loaded)
      failed = loaded.err();
  });
  if (failed)
    return fail(failed);

  const double state_mb = static_cast<double>(bytes) / (1 << 20);
  std::printf("table %s: %zu parameters, %.1f M elements; world %d, compute host, comm caf\n",
              table_name.c_str(), table.size(), static_cast<double>(total) / 1e6, opts.world);
  std::printf("checkpoint files: %.1f MB (every rank's state)\n", state_mb);
  std::printf("%-6s %10s %10s %22s\n", "", "ms", "MB/s", "host memory above, MB");
  for (const auto& [name, m] : {std::pair<const char*, measured>{"save", save}, {"load", load}})
    std::printf("%-6s %10.1f %10.1f %22.1f\n", name, m.ms, state_mb / (m.ms / 1e3), m.extra_mb);
  return 0;
}
