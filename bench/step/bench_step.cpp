// zmuon-bench-step: the whole optimizer step through the engine for a model's parameter table
// (shapes only, random gradients), with the message trace on, and what the trace says about it.
//
//   zmuon-bench-step [--table gpt2-124m|llama-1b|moe|moe-unstacked|tiny] [--world N]
//                    [--compute host|cuda]
//                    [--comm caf|nccl] [--steps N] [--gas N] [--bucket-size N]
//                    [--buckets-in-flight N] [--trace DIR] [--json FILE] [--call-times]
//                    [--timeline FILE] [--cublas-only]
//
// Defaults: cuda compute with the nccl comm; --compute host alone takes the caf comm.
//
// Times, per step, on the host: reduce() of every micro-batch on every rank (host packing and
// hand-over; the reduce-scatters run behind it) and step() (waits for the reduce-scatters, then
// the vote with the norm, the Muon pipeline and AdamW; answered when the GPU work has finished).
// Medians over the steps after the first (warm-up). The trace (into --trace DIR, else a temporary
// directory that is removed) adds, per step (tools/zmuon-trace/step_stats.hpp has the exact
// definitions; medians over the same steps):
//
// - time per phase of the step protocol on the rank whose coordinator took longest, in the step
//   where that took the median time (so that the phases sum to it): the coordinator's step cut into
//   disjoint pieces, each going to the innermost span active then (flush, overflow_check, vote,
//   unscale_clip, momentum, gather, ns, scatter, apply, adamw, qk_clip, finish, reduce_scatter),
//   `other` where none is. On CUDA the spans end when the work is enqueued (ns is the enqueue
//   time) and waiting for the GPU falls into `other`.
// - bytes each rank sends per step by collective kind, read from the trace's `bytes` field (the
//   caf comm's peer pieces; real payload bytes), beside the plan's count at 4 bytes a float: the
//   two must agree under fp32 transport, else the bench fails (exit 3). The nccl comm records
//   nothing, so under nccl only the plan's count is printed. Beside them, what DeepSpeed's ZeRO-3
//   Muon scheme sends (by formula: 4 all-gathers of (W-1)/W of every Muon matrix) and the ratio.
// - actor plumbing: host time in the handlers and reply continuations of muon_coordinator,
//   loss_scaler and reducer, minus the backend work inside them (the `ns` and `buffers` spans:
//   NS, buffer allocation, staging copies, bucket packing; partition_store's and the comm's
//   handlers are backend and copy work, not plumbing), less the trace's own cost (records
//   written inside them x the cost of one record, measured at start-up: `record_ns`). As a
//   fraction of the step's wall time (first record of the step, i.e. reduce()'s start, to
//   step()'s answer): the largest rank's share (`plumbing max rank`) and all ranks together
//   (`plumbing all ranks`, CPU time over wall time). Target: <= 2 % for llama-1b.
//
// - peak transient memory: per rank, the most the compute backend held during step() above
//   what it held when step() started (engine::memory, zmuon/memory.hpp), the largest over ranks
//   (median over steps), beside one chunk's buffers on that rank (its u and result shards and
//   the matrices it owns) and the NS workspace; target: <= 2 chunks + the largest
//   matrix's NS workspace. Apart: the reduce() hand-over's peak above the state between steps
//   (its reduce buckets; --buckets-in-flight N bounds them per rank, engine option
//   max_buckets_in_flight, default 2, 0 = unbounded; applied at --world 1 only, where the engine
//   drives one local rank).
//
// MoE expert stacks against the same matrices one by one (GPU; 4 layers of 8 experts of
// [8192, 2048] and [2048, 8192] plus attention, about 1.1 G elements, some 20 GB a rank at
// --world 1 on one H100; --world 2 on two GPUs spreads the experts' owners):
//   zmuon-bench-step --table moe --world 1 --steps 5
//   zmuon-bench-step --table moe-unstacked --world 1 --steps 5
// The two tables have the same matrices and owners balanced per expert; the step times differ
// by the batching of same-shape NS calls and the collectives' segment counts.
//
// --call-times: the compute backends time their calls (engine::time_backend_calls; on CUDA two
// events around each call's work on its stream) and the bench prints, for the rank of the phase
// table, each call's busy time per step (mean over the timed steps: the time during which at
// least one call of that name ran, zmuon/call_times.hpp), its calls' summed spans and count: on
// CUDA the device time the phases above cannot show (their spans end at enqueue); then that
// step's timeline in one line (report.hpp, summarize_timeline): from its first call to its last,
// how long no call ran on any stream (and the longest such gap), and where Newton-Schulz began
// and ended. Off by default.
//
// --timeline FILE (implies --call-times): the backend calls of the step the phase table shows,
// every rank, as Chrome Trace Event JSON for Perfetto or chrome://tracing (report.hpp,
// zmuon::call_timeline_json): on CUDA a row for the main stream and one per Newton-Schulz lane, so
// that where the device idles, and what waits for what, can be seen.
//
// --device-grads (cuda): the gradients are uploaded to the GPU once and handed over as device
// buffers every step, as a training loop on the GPU does (host gradients add a pageable
// host-to-device copy to reduce(), and its tail to step()), stream-ordered on the default stream
// as zmuon.Muon does on PyTorch's (--reduce-waits: the plain reduce(), which waits for its reads).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/step/device_grads.hpp"
#include "bench/step/ns_owners.hpp"
#include "bench/step/report.hpp"
#include "bench/step/step_tables.hpp"
#ifdef ZMUON_HAVE_CUDA
#include "kernels/cuda/ns_tuning.hpp"  // --cublas-only
#endif
#include "plan/plan.hpp"
#include "trace/recorder.hpp"
#include "zmuon-trace/reader.hpp"
#include "zmuon-trace/step_stats.hpp"
#include "zmuon/engine.hpp"

namespace {

namespace fs = std::filesystem;
using zmuon::bench::human;
using zmuon::trace_tool::rank_step;
using zmuon::trace_tool::step_figures;

double median(std::vector<double> v) {
  if (v.empty())
    return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms(int64_t ns) {
  return static_cast<double>(ns) / 1e6;
}

// The rank whose coordinator's step took longest.
const rank_step& critical(const step_figures& s) {
  return *std::max_element(
      s.ranks.begin(), s.ranks.end(),
      [](const rank_step& a, const rank_step& b) { return a.window_ns < b.window_ns; });
}

const std::map<std::string, zmuon::ns_variant> kVariants = {
    {"standard", zmuon::ns_variant::standard},
    {"gram", zmuon::ns_variant::gram},
    {"auto", zmuon::ns_variant::automatic}};

const char* variant_name(zmuon::ns_variant v) {
  for (const auto& [name, value] : kVariants)
    if (value == v)
      return name.c_str();
  return "?";
}

}  // namespace

int main(int argc, char* argv[]) {
  std::string table_name = "gpt2-124m";
  zmuon::engine_options opts;
  opts.world = 1;
  opts.compute = "cuda";
  opts.comm = "nccl";
  opts.reduce_bucket_size = 50'000'000;
  opts.timeout_ms = 600'000;
  int steps = 5;
  int gas = 1;
  std::string trace_dir, json_out, timeline_out;
  CLI::App app{"zmuon-bench-step: the optimizer step for a model's parameter table"};
  app.add_option("--table", table_name)
      ->check(CLI::IsMember({"gpt2-124m", "llama-1b", "moe", "moe-unstacked", "tiny"}));
  app.add_option("--world", opts.world)->check(CLI::Range(1, 64));
  app.add_option("--compute", opts.compute)->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--comm", opts.comm, "default nccl, caf with --compute host")
      ->check(CLI::IsMember({"caf", "nccl"}));
  app.add_option("--steps", steps)->check(CLI::Range(2, 1000));
  app.add_option("--gas", gas)->check(CLI::Range(1, 64));
  app.add_option("--bucket-size", opts.reduce_bucket_size)->check(CLI::PositiveNumber);
  app.add_option("--buckets-in-flight", opts.max_buckets_in_flight,
                 "reduce buckets of a rank handed over and not yet landed (0: unbounded; applies "
                 "when the engine drives one local rank, i.e. --world 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--ns-variant", opts.muon.ns.variant,
                 "standard, gram or auto (the default: gram on the host, on cuda where the batch "
                 "pays)")
      ->transform(CLI::CheckedTransformer(kVariants));
  app.add_option("--trace", trace_dir,
                 "keep the trace in this directory (default: a temporary one)");
  app.add_option("--json", json_out, "also write the figures as JSON to this file");
  bool device_grads = false;
  app.add_flag("--device-grads", device_grads,
               "hand the gradients over as device buffers (cuda compute)");
  bool reduce_waits = false;
  app.add_flag("--reduce-waits", reduce_waits,
               "--device-grads through the plain reduce(), which waits for its copies");
  bool time_calls = false;
  bool host_threads = false;
  app.add_flag("--host-threads", host_threads,
               "hand over each rank's micro-batches on a thread of its own (reduce() for different "
               "ranks at once), not rank by rank on one thread");
  bool reduce_all = false;
  app.add_flag("--reduce-all", reduce_all,
               "hand over each micro-batch of every rank through one engine::reduce_all (a thread "
               "per rank inside the engine; the bound on buckets in flight applies with several "
               "ranks; device gradients through the plain, waiting read)")
      ->excludes("--host-threads");
  app.add_flag("--call-times", time_calls,
               "time the compute backends' calls (CUDA events) and print each call's time per "
               "step");
  app.add_option("--timeline", timeline_out,
                 "write the backend calls of the phase table's step as Chrome Trace Event JSON "
                 "(Perfetto) to this file; implies --call-times");
  bool ns_owners = false;
  app.add_flag("--ns-owners", ns_owners,
               "only time each rank's Newton-Schulz as the plan's owner of its matrices, one rank "
               "at a time on this process's backend (--steps repetitions each), and the load "
               "balance across ranks (bench/step/ns_owners.hpp)");
  bool cublas_only = false;
  app.add_flag("--cublas-only", cublas_only,
               "every Newton-Schulz GEMM on cuBLAS, as on a device without sm_90a (cuda compute; "
               "the own Hopper GEMM off)");
  CLI11_PARSE(app, argc, argv);
  if (cublas_only) {
#ifdef ZMUON_HAVE_CUDA
    zmuon::gpu::ns_tuning::set_own_gemm_for_new_backends(false);
#else
    std::fprintf(stderr, "zmuon-bench-step: --cublas-only needs the CUDA backend\n");
    return 2;
#endif
  }
  if (ns_owners) {
    auto report = zmuon::bench::time_ns_owners(zmuon::bench::make_table(table_name), opts, steps);
    if (!report) {
      std::fprintf(stderr, "zmuon-bench-step: %s\n", report.err().to_string().c_str());
      return 1;
    }
    std::printf(
        "command: zmuon-bench-step --ns-owners --table %s --world %d --compute %s "
        "--steps %d\n",
        table_name.c_str(), opts.world, opts.compute.c_str(), steps);
    return json_out.empty() || zmuon::bench::write_file(json_out, to_json(*report).dump(2)) ? 0 : 1;
  }
  time_calls = time_calls || !timeline_out.empty();
  if (app.count("--comm") == 0 && opts.compute == "host")
    opts.comm = "caf";  // nccl needs the cuda compute
  if (device_grads && opts.compute != "cuda") {
    std::fprintf(stderr, "zmuon-bench-step: --device-grads needs --compute cuda\n");
    return 2;
  }

  bool temp_trace = trace_dir.empty();
  if (!temp_trace && fs::is_directory(trace_dir)) {  // stale files of another run would be read
    for (const auto& e : fs::directory_iterator(trace_dir))
      if (e.path().filename().string().rfind("trace-node", 0) == 0) {
        std::fprintf(stderr,
                     "zmuon-bench-step: --trace %s already holds trace files (%s); give an empty "
                     "or new directory\n",
                     trace_dir.c_str(), e.path().filename().c_str());
        return 2;
      }
  }
  if (temp_trace) {
    std::string tmpl = (fs::temp_directory_path() / "zmuon-bench-step-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      std::fprintf(stderr, "zmuon-bench-step: cannot make a temporary trace directory\n");
      return 2;
    }
    trace_dir = tmpl;
  }
  struct cleanup {
    bool on;
    std::string dir;
    ~cleanup() {
      std::error_code ec;
      if (on)
        fs::remove_all(dir, ec);
    }
  } clean{temp_trace, trace_dir};
  const int64_t record_ns = zmuon::bench::trace_record_cost_ns(trace_dir);
  opts.trace_dir = trace_dir;
  // The backend's calls as trace spans would time every CUDA call with events: only when the
  // call times are on anyway.
  opts.trace_compute_calls = time_calls;

  const auto table = zmuon::bench::make_table(table_name);
  auto made = zmuon::engine::create(opts);
  if (!made) {
    std::fprintf(stderr, "zmuon-bench-step: %s\n", made.err().to_string().c_str());
    return 2;
  }
  auto eng = std::move(*made);
  zmuon::tensor_map grads;
  const auto added = zmuon::bench::add_table(*eng, table, grads);
  if (!added) {
    std::fprintf(stderr, "zmuon-bench-step: %s\n", added.err().to_string().c_str());
    return 2;
  }
  const int64_t total = *added;

  zmuon::bench::device_grads on_device;  // --device-grads
  if (device_grads)
    if (auto err = on_device.upload(grads, opts.world)) {
      std::fprintf(stderr, "zmuon-bench-step: %s\n", err.message().c_str());
      return 2;
    }
  const auto hand_over = [&](int r) {
    if (!device_grads)
      return eng->reduce(r, grads);
    const auto& views = on_device.views_of(r);
    return reduce_waits ? eng->reduce(r, views) : eng->reduce(r, views, nullptr);
  };

  std::vector<double> reduce_ms, step_ms, transient_bytes, handover_bytes;
  std::vector<zmuon::memory_stats> last_memory(static_cast<size_t>(opts.world));
  std::vector<zmuon::call_times> call_sums(static_cast<size_t>(opts.world));    // timed steps
  std::map<uint64_t, std::map<int, std::vector<zmuon::call_span>>> step_spans;  // timed steps
  eng->time_backend_calls(time_calls);
  int64_t ns_matrices = 0;
  for (int s = 0; s < steps; ++s) {
    std::vector<int64_t> before(static_cast<size_t>(opts.world), 0);
    for (int r = 0; s > 0 && r < opts.world; ++r)  // the engine starts at the first reduce()
      before[static_cast<size_t>(r)] = eng->memory(r)->in_use;
    if (s > 0)
      eng->reset_peak_memory();
    const auto t0 = std::chrono::steady_clock::now();
    // Micro-batch by micro-batch, rank by rank on this thread, or a thread per rank (as a host
    // loop with a thread per GPU would).
    std::vector<zmuon::error> handed_errors(static_cast<size_t>(opts.world));
    for (int k = 0; k < gas && reduce_all && !handed_errors[0]; ++k) {
      std::vector<std::vector<zmuon::tensor_view>> views;  // every rank hands over `grads`
      for (int r = 0; r < opts.world; ++r) {
        if (device_grads) {
          views.push_back(on_device.views_of(r));
          continue;
        }
        views.emplace_back();
        for (const auto& [name, v] : grads)
          views.back().push_back({name, v.data(), static_cast<int64_t>(v.size())});
      }
      handed_errors[0] = eng->reduce_all(views);
    }
    if (host_threads) {
      std::vector<std::thread> pool;
      for (int r = 0; r < opts.world; ++r)
        pool.emplace_back([&, r] {
          auto& err = handed_errors[static_cast<size_t>(r)];
          for (int k = 0; k < gas && !err; ++k)
            err = hand_over(r);
        });
      for (auto& t : pool)
        t.join();
    }
    bool failed = false;
    for (int k = 0; k < gas && !host_threads && !reduce_all && !failed; ++k)
      for (int r = 0; r < opts.world && !failed; ++r)
        failed = static_cast<bool>(handed_errors[static_cast<size_t>(r)] = hand_over(r));
    for (const auto& err : handed_errors)
      if (err) {
        std::fprintf(stderr, "zmuon-bench-step: %s\n", err.to_string().c_str());
        return 1;
      }
    const auto t1 = std::chrono::steady_clock::now();
    // The hand-over's own peak, then the step's from what is held when it starts.
    std::vector<int64_t> handed(static_cast<size_t>(opts.world), 0);
    double handover_most = 0;
    for (int r = 0; s > 0 && r < opts.world; ++r) {
      const zmuon::memory_stats m = *eng->memory(r);
      handed[static_cast<size_t>(r)] = m.in_use;
      handover_most =
          std::max(handover_most, static_cast<double>(m.peak - before[static_cast<size_t>(r)]));
    }
    if (s > 0)
      eng->reset_peak_memory();
    auto info = eng->step();
    const auto t2 = std::chrono::steady_clock::now();
    if (!info) {
      std::fprintf(stderr, "zmuon-bench-step: %s\n", info.err().to_string().c_str());
      return 1;
    }
    ns_matrices = info->ns_matrices;
    for (int r = 0; time_calls && r < opts.world; ++r) {  // step() answers once the GPU is done
      auto taken = eng->take_backend_call_times(r);
      if (!taken) {
        std::fprintf(stderr, "zmuon-bench-step: %s\n", taken.err().to_string().c_str());
        return 1;
      }
      if (s > 0)  // the warm-up step's are dropped
        zmuon::bench::add_call_times(call_sums[static_cast<size_t>(r)], *taken);
      if (s > 0)
        step_spans[info->step][r] = *eng->backend_call_spans(r);  // the rank was just taken
    }
    if (s > 0) {
      reduce_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      step_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      double most = 0;
      for (int r = 0; r < opts.world; ++r) {
        last_memory[static_cast<size_t>(r)] = *eng->memory(r);
        most = std::max(most, static_cast<double>(last_memory[static_cast<size_t>(r)].peak
                                                  - handed[static_cast<size_t>(r)]));
      }
      transient_bytes.push_back(most);
      handover_bytes.push_back(handover_most);
    }
  }
  // The plan outlives the engine (the trace files are complete only once its actors are gone).
  const zmuon::plan pl = *eng->layout();
  eng.reset();

  auto ts = zmuon::trace_tool::read_traces(trace_dir);
  if (!ts) {
    std::fprintf(stderr, "zmuon-bench-step: reading the trace: %s\n", ts.err().message().c_str());
    return 2;
  }
  auto figures = zmuon::trace_tool::step_stats(*ts);
  if (!figures.empty())
    figures.erase(figures.begin());  // the warm-up step
  if (figures.empty()) {
    std::fprintf(stderr, "zmuon-bench-step: the trace has no step after the warm-up\n");
    return 2;
  }

  // Phases of the critical rank, medians over steps; the window and the step's wall time.
  std::map<std::string, std::vector<double>> phase;
  std::vector<double> window, wall, plumb_max, plumb_all, plumb_raw_all, overhead_all, records;
  std::set<std::string> names;
  for (const auto& s : figures)
    for (const auto& r : s.ranks)
      for (const auto& [p, ns] : r.phase_ns)
        names.insert(p);
  // Phases: those of the step whose slowest coordinator took the median time (so that they
  // sum to its step; medians taken phase by phase would not).
  std::vector<const step_figures*> by_window;
  for (const auto& s : figures)
    by_window.push_back(&s);
  std::sort(by_window.begin(), by_window.end(), [](const step_figures* a, const step_figures* b) {
    return critical(*a).window_ns < critical(*b).window_ns;
  });
  const rank_step& mid = critical(*by_window[by_window.size() / 2]);
  const uint64_t mid_step = by_window[by_window.size() / 2]->step;
  for (const auto& p : names)
    phase[p].push_back(mid.phase_ns.count(p) ? ms(mid.phase_ns.at(p)) : 0.0);
  for (const auto& s : figures) {
    const auto& c = critical(s);
    window.push_back(ms(c.window_ns));
    wall.push_back(ms(s.wall_ns));
    double mx = 0, all = 0, raw = 0, over = 0;
    for (const auto& r : s.ranks) {
      double net = ms(r.plumbing_net_ns(record_ns));
      mx = std::max(mx, net);
      all += net;
      raw += ms(r.plumbing_ns);
      over += ms(r.plumbing_ns) - net;
    }
    plumb_max.push_back(s.wall_ns > 0 ? mx / ms(s.wall_ns) : 0);
    plumb_all.push_back(s.wall_ns > 0 ? all / ms(s.wall_ns) : 0);
    plumb_raw_all.push_back(raw);
    int64_t n = 0;
    for (const auto& r : s.ranks)
      n += r.records;
    records.push_back(static_cast<double>(n));
    overhead_all.push_back(over);
  }

  // The engine bounds them where it drives one local rank (zmuon/options.hpp).
  const std::string in_flight =
      opts.world > 1 ? "unbounded (" + std::to_string(opts.world) + " local ranks)"
      : opts.max_buckets_in_flight == 0 ? std::string("unbounded")
                                        : std::to_string(opts.max_buckets_in_flight);
  const char* variant = variant_name(opts.muon.ns.variant);
  std::printf(
      "table %s: %zu parameters, %.1f M elements, %d Muon matrices; world %d, compute "
      "%s, comm %s, gas %d, bucket %lld, buckets in flight %s, ns_variant %s\n",
      table_name.c_str(), table.size(), static_cast<double>(total) / 1e6, pl.muon_count(),
      opts.world, opts.compute.c_str(), opts.comm.c_str(), gas,
      static_cast<long long>(opts.reduce_bucket_size), in_flight.c_str(), variant);
  std::printf(
      "median of %d steps after a warm-up step (tracing on): reduce() hand-over %.2f ms, "
      "step() %.2f ms; NS matrices per step %lld\n",
      steps - 1, median(reduce_ms), median(step_ms), static_cast<long long>(ns_matrices));
  std::printf(
      "trace: step wall (reduce() start to step() answer) %.2f ms; slowest coordinator's step "
      "%.2f ms; that of step %llu (rank %d, the median) by phase (exclusive: ms, %% of it%s):\n",
      median(wall), median(window), static_cast<unsigned long long>(mid_step), mid.rank,
      opts.compute == "cuda" ? "; CUDA: spans are enqueue times, GPU waits are in 'other'" : "");
  std::vector<std::string> order{"reduce_scatter", "flush",    "overflow_check", "vote",
                                 "unscale_clip",   "momentum", "gather",         "ns",
                                 "scatter",        "apply",    "adamw",          "qk_clip",
                                 "finish",         "discard"};
  for (const auto& p : names)
    if (std::find(order.begin(), order.end(), p) == order.end() && p != "other")
      order.push_back(p);
  order.push_back("other");
  for (const auto& p : order)
    if (names.count(p))
      std::printf("  %-16s %10.3f  %5.1f %%\n", p.c_str(), median(phase[p]),
                  100 * median(phase[p]) / std::max(ms(mid.window_ns), 1e-9));
  nlohmann::json jcalls = nlohmann::json::object();
  nlohmann::json jtimeline = nlohmann::json::object();
  if (time_calls) {  // per timed step, the phase table's rank
    std::printf("backend calls of rank %d, %s", mid.rank,
                opts.compute == "cuda" ? "device time from CUDA events (nccl collectives: on the "
                                         "stream, including waits for peers): "
                                       : "host time: ");
    jcalls = zmuon::bench::report_call_times(call_sums[static_cast<size_t>(mid.rank)], steps - 1);
    std::printf("timeline of step %llu, rank %d (its calls, %s):\n",
                static_cast<unsigned long long>(mid_step), mid.rank,
                opts.compute == "cuda" ? "device clock" : "host clock");
    jtimeline = zmuon::bench::report_timeline(
        zmuon::bench::summarize_timeline(step_spans[mid_step][mid.rank]));
  }
  std::printf(
      "actor plumbing: %.2f %% of the step wall (largest rank), %.2f %% all ranks together "
      "(CPU/wall); raw %.3f ms/step all ranks, trace cost taken out %.3f ms (%lld ns a record)\n",
      100 * median(plumb_max), 100 * median(plumb_all), median(plumb_raw_all), median(overhead_all),
      static_cast<long long>(record_ns));
  if (table_name == "llama-1b")
    std::printf("  the target for llama-1b, <= 2 %% (largest rank): %s\n",
                median(plumb_max) <= 0.02 ? "met" : "NOT met");
  {  // where the plumbing time goes: the largest activation kinds, all ranks, all timed steps
    std::map<std::string, int64_t> by;
    for (const auto& s : figures)
      for (const auto& r : s.ranks)
        for (const auto& [k, ns] : r.plumbing_by)
          by[k] += ns;
    std::vector<std::pair<int64_t, std::string>> top;
    for (const auto& [k, ns] : by)
      top.emplace_back(ns, k);
    std::sort(top.rbegin(), top.rend());
    std::printf("  largest plumbing activations (ms per step, all ranks, trace cost included):");
    for (size_t i = 0; i < top.size() && i < 5; ++i)
      std::printf("%s %s %.3f", i ? ";" : "", top[i].second.c_str(),
                  ms(top[i].first) / static_cast<double>(figures.size()));
    std::printf("\n");
  }
  std::printf(
      "trace cost: %.0f records per step (all ranks) x %lld ns = %.3f ms of host time per step "
      "(inside the timings above)\n",
      median(records), static_cast<long long>(record_ns), median(records) * record_ns / 1e6);
  // One chunk's buffers per rank (u and result shards, the matrices the rank owns), the largest.
  double chunk_bytes = 0;
  for (int r = 0; r < opts.world; ++r)
    for (const auto& c : pl.chunks) {
      int64_t owned = 0;
      for (int i : c.params)
        owned += pl.params[static_cast<size_t>(i)].owner == r
                     ? pl.params[static_cast<size_t>(i)].numel
                     : 0;
      chunk_bytes = std::max(chunk_bytes, 4.0 * static_cast<double>(2 * c.shard_len + owned));
    }
  double workspace = 0;
  for (const auto& m : last_memory)
    workspace = std::max(workspace, static_cast<double>(m.workspace));
  const double transient = median(transient_bytes);
  const double handover = median(handover_bytes);
  std::printf(
      "peak transient memory (largest rank): step() %s above what it holds when step() starts "
      "= %.2f chunks of %s (%zu chunks, bucket %lld elements); NS workspace %s; the reduce() "
      "hand-over %s above the state between steps (= %.2f chunks); state %s\n",
      human(transient).c_str(), transient / std::max(chunk_bytes, 1.0), human(chunk_bytes).c_str(),
      pl.chunks.size(), static_cast<long long>(opts.reduce_bucket_size), human(workspace).c_str(),
      human(handover).c_str(), handover / std::max(chunk_bytes, 1.0),
      human(static_cast<double>(last_memory[0].in_use)).c_str());

  // Bytes: trace against plan, by rank and kind (the last step's; every step sends the same).
  const bool traced_bytes = opts.comm == "caf";
  const bool bf16_wire =
      opts.muon.transport == zmuon::muon_transport::bf16
      || (opts.muon.transport == zmuon::muon_transport::automatic && opts.compute == "cuda");
  std::vector<std::map<std::string, int64_t>> sent(static_cast<size_t>(opts.world));
  for (const auto& rs : figures.back().ranks)
    sent.at(static_cast<size_t>(rs.rank)) = rs.sent_bytes;
  const auto bytes = zmuon::bench::report_bytes(pl, sent, gas, bf16_wire ? 2 : 4, traced_bytes);

  using zmuon::bench::write_file;
  if (!timeline_out.empty()) {
    if (!write_file(timeline_out,
                    zmuon::call_timeline_json(step_spans[mid_step], opts.compute == "cuda")))
      return 2;
    std::printf("timeline of step %llu (every rank's backend calls): %s\n",
                static_cast<unsigned long long>(mid_step), timeline_out.c_str());
  }
  if (!json_out.empty()) {
    nlohmann::json j;
    j["table"] = table_name;
    j["world"] = opts.world;
    j["compute"] = opts.compute;
    j["comm"] = opts.comm;
    j["gas"] = gas;
    j["max_buckets_in_flight"] = opts.max_buckets_in_flight;
    j["ns_variant"] = variant;
    j["steps_timed"] = steps - 1;
    j["muon_matrices"] = pl.muon_count();
    j["ns_matrices"] = ns_matrices;
    j["reduce_ms"] = median(reduce_ms);
    j["step_ms"] = median(step_ms);
    j["trace_wall_ms"] = median(wall);
    j["coordinator_ms"] = median(window);
    j["phase_step"] = mid_step;
    j["phase_rank"] = mid.rank;
    j["phase_window_ms"] = ms(mid.window_ns);
    nlohmann::json jp;
    for (const auto& p : names)
      jp[p] = median(phase[p]);
    j["phase_ms"] = jp;
    j["phases_are_enqueue_times"] = opts.compute == "cuda";
    j["plumbing_fraction_max_rank"] = median(plumb_max);
    j["plumbing_fraction_all_ranks"] = median(plumb_all);
    j["plumbing_raw_ms_all_ranks"] = median(plumb_raw_all);
    j["trace_cost_ms_all_ranks"] = median(overhead_all);
    j["record_ns"] = record_ns;
    j["records_per_step"] = median(records);
    j["bytes_from_trace"] = traced_bytes;
    j["ranks"] = bytes.ranks;
    j["peak_transient_device_bytes"] = transient;
    j["handover_transient_device_bytes"] = handover;
    j["chunk_bytes"] = chunk_bytes;
    j["ns_workspace_bytes"] = workspace;
    j["device_grads"] = device_grads;
    if (time_calls) {
      j["call_ms_rank"] = mid.rank;
      j["call_ms"] = jcalls;      // per timed step: calls and ms by backend call
      j["timeline"] = jtimeline;  // the phase table's step and rank
    }
    if (!write_file(json_out, j.dump(2)))
      return 2;
  }
  if (bytes.mismatch) {
    std::fprintf(stderr, "zmuon-bench-step: trace and plan disagree on the bytes sent (above)\n");
    return 3;
  }
  return 0;
}
