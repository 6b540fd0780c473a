// bench_caf_comm: bytes/s of the caf comm backend's collectives between two processes on this
// machine (CAF's network layer over loopback), as the engine issues them: a reduce-scatter (mean)
// and an all-to-all, one rank per process. The parent is node 0 and starts node 1 as a child
// process; both join through the rendezvous (node/node.hpp), as zmuon-launch --nodes does.
// nccl-tests' conventions: size = bytes of each rank's input; algbw = size / time;
// busbw = algbw * (n-1)/n (reduce-scatter), which is also what each rank sends per second.
//
// The all-to-all runs twice: fp32, and bf16 on the same elements (the Muon transport's
// zmuon.muon_transport=bf16); "size" is the fp32 input, the bandwidths count the bytes moved.
//
//   bench_caf_comm [--sizes-mb 1,16,64] [--reps 5]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include "caf/all.hpp"

#include "messages/errors.hpp"
#include "node/node.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct result {
  double seconds = 0;  // median
  bool correct = true;
};

template <class Req>
bool run_once(caf::actor_system& sys, const zmuon::comm_actor& comm, Req req) {
  caf::scoped_actor self{sys};
  bool ok = false;
  self->request(comm, std::chrono::minutes(5), std::move(req))
      .receive([&](zmuon::comm_done&) { ok = true; },
               [&](caf::error& err) {
                 std::fprintf(stderr, "bench_caf_comm: %s\n",
                              zmuon::from_caf_error(err).to_string().c_str());
               });
  return ok;
}

// Rank r's input: value (r + 1) * (i % 7), so every reduced element is exactly predictable.
result reduce_scatter(caf::actor_system& sys, const zmuon::node_setup& s, int world, int64_t bytes,
                      int reps, int32_t index) {
  int rank = s.first_rank;
  int64_t count = bytes / static_cast<int64_t>(sizeof(float)) / world;
  std::vector<float> in(count * world), out(count);
  for (int64_t i = 0; i < count * world; ++i)
    in[i] = static_cast<float>((rank + 1) * (i % 7));
  std::vector<double> times;
  result res;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms up
    zmuon::reduce_scatter_req req{
        {zmuon::collective_kind::reduce_scatter, static_cast<uint64_t>(rep), 0, index},
        in.data(),
        out.data(),
        count};
    auto t0 = clock_type::now();
    if (!run_once(sys, s.comms[0], req))
      std::exit(1);
    if (rep > 0)
      times.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  double mean_factor = 0;  // mean over ranks of (q + 1)
  for (int q = 0; q < world; ++q)
    mean_factor += (q + 1.0) / world;
  for (int64_t i = 0; i < count; ++i)
    if (std::fabs(out[i] - mean_factor * ((rank * count + i) % 7)) > 1e-5)
      res.correct = false;
  std::sort(times.begin(), times.end());
  res.seconds = times[times.size() / 2];
  return res;
}

zmuon::segment segment_of(float* data, int64_t n) {
  return {data, n};
}
zmuon::segment segment_of(uint16_t* data, int64_t n) {
  return {nullptr, n, data};
}

// Each rank sends bytes/world of fp32 elements to every other rank (the gather/scatter of the
// Muon pipeline); with `bf16`, the same elements as bf16 (T = uint16_t: half the bytes).
template <class T = float>
result all_to_all(caf::actor_system& sys, const zmuon::node_setup& s, int world, int64_t bytes,
                  int reps, int32_t index) {
  constexpr bool bf16 = std::is_same<T, uint16_t>::value;
  int rank = s.first_rank;
  int64_t count = bytes / static_cast<int64_t>(sizeof(float)) / world;
  std::vector<T> in(count * world), out(count * world);
  for (int64_t i = 0; i < count * world; ++i)
    in[i] = static_cast<T>(rank * 1000 + i % 997);
  std::vector<double> times;
  result res;
  for (int rep = 0; rep <= reps; ++rep) {
    zmuon::all_to_all_req req{
        {zmuon::collective_kind::gather, static_cast<uint64_t>(rep), 0, index},
        std::vector<std::vector<zmuon::segment>>(world),
        std::vector<std::vector<zmuon::segment>>(world),
        bf16 ? zmuon::wire_type::bf16 : zmuon::wire_type::fp32};
    for (int q = 0; q < world; ++q) {
      req.sends[q].push_back(segment_of(in.data() + q * count, count));
      req.recvs[q].push_back(segment_of(out.data() + q * count, count));
    }
    auto t0 = clock_type::now();
    if (!run_once(sys, s.comms[0], req))
      std::exit(1);
    if (rep > 0)
      times.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  for (int q = 0; q < world; ++q)  // from rank q: its block for this rank
    for (int64_t i = 0; i < count; ++i)
      if (out[q * count + i] != static_cast<T>(q * 1000 + (rank * count + i) % 997))
        res.correct = false;
  std::sort(times.begin(), times.end());
  res.seconds = times[times.size() / 2];
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes_mb{1, 16, 64};
  int reps = 5;
  int node_rank = 0;
  std::string master = "127.0.0.1:0";
  std::string file = "/tmp/bench_caf_comm-" + std::to_string(::getpid());
  CLI::App app{"bench_caf_comm: caf comm collectives between two processes"};
  app.add_option("--sizes-mb", sizes_mb, "input bytes per rank, MiB")->delimiter(',');
  app.add_option("--reps", reps, "timed repetitions (median reported)")->check(CLI::Range(1, 100));
  app.add_option("--node-rank", node_rank)->group("");
  app.add_option("--master", master)->group("");
  CLI11_PARSE(app, argc, argv);

  pid_t child = -1;
  if (node_rank == 0) {
    // TLS with a fresh secret for the two processes, unless the caller gave one or asked for
    // plain TCP (ZMUON_INSECURE=1): the two figures docs/SECURITY.md compares.
    if (std::getenv("ZMUON_JOB_SECRET") == nullptr && std::getenv("ZMUON_INSECURE") == nullptr)
      ::setenv("ZMUON_JOB_SECRET", zmuon::random_secret().c_str(), 1);
    std::remove(file.c_str());
    child = ::fork();
    if (child == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (std::string m; m.empty(); std::this_thread::sleep_for(std::chrono::milliseconds(10)))
        std::getline(std::ifstream(file), m), master = m;
      std::string reps_text = std::to_string(reps);
      std::string sizes;
      for (int s : sizes_mb)
        sizes += (sizes.empty() ? "" : ",") + std::to_string(s);
      ::execl("/proc/self/exe", "bench_caf_comm", "--node-rank", "1", "--master", master.c_str(),
              "--reps", reps_text.c_str(), "--sizes-mb", sizes.c_str(),
              static_cast<char*>(nullptr));
      std::_Exit(127);
    }
  }
  auto hp = zmuon::parse_host_port(master);
  if (!hp) {
    std::fprintf(stderr, "%s\n", hp.err().message().c_str());
    return 2;
  }
  zmuon::node_options opts;
  opts.nodes = 2;
  opts.node_rank = node_rank;
  opts.master_host = hp->first;
  opts.master_port = hp->second;
  opts.ranks = 1;
  opts.rendezvous_file = node_rank == 0 ? file : "";
  opts.heartbeat_timeout_ms = 120'000;
  opts.quiet = true;
  auto nd = zmuon::node::join(opts, {"bench"}, "{}");
  if (!nd) {
    std::fprintf(stderr, "bench_caf_comm: %s\n", nd.err().message().c_str());
    return 1;
  }
  std::remove(file.c_str());
  auto setup = (*nd)->setup();
  auto& sys = *setup.system;
  int world = (*nd)->world();
  if (node_rank == 0) {
    std::printf(
        "bench_caf_comm: 2 processes x 1 rank, CAF %s middleman over 127.0.0.1, median "
        "of %d\n",
        "0.17", reps);
    std::printf(
        "| collective | size (MiB/rank) | time (ms) | algbw (MB/s) | busbw = sent/rank "
        "(MB/s) | correct |\n|---|---|---|---|---|---|\n");
  }
  int32_t index = 0;
  for (int mb : sizes_mb) {
    int64_t bytes = static_cast<int64_t>(mb) << 20;
    for (int which = 0; which < 3; ++which) {
      auto r = which == 0   ? reduce_scatter(sys, setup, world, bytes, reps, index++)
               : which == 1 ? all_to_all(sys, setup, world, bytes, reps, index++)
                            : all_to_all<uint16_t>(sys, setup, world, bytes, reps, index++);
      int64_t moved = which == 2 ? bytes / 2 : bytes;  // bf16: the same elements, half the bytes
      double algbw = moved / r.seconds / 1e6;
      double busbw = algbw * (world - 1) / world;
      const char* names[] = {"reduce-scatter", "all-to-all", "all-to-all bf16 (same elements)"};
      if (node_rank == 0)
        std::printf("| %s | %d | %.1f | %.0f | %.0f | %s |\n", names[which], mb, r.seconds * 1e3,
                    algbw, busbw, r.correct ? "yes" : "NO");
      std::fflush(stdout);
      if (!r.correct)
        return 1;
    }
  }
  if (auto err = (*nd)->finish()) {
    std::fprintf(stderr, "bench_caf_comm: %s\n", err.message().c_str());
    return 1;
  }
  if (child > 0) {
    int status = 0;
    ::waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return 1;
  }
  return 0;
}
