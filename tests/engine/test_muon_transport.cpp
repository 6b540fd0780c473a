// The Muon phase's transport in bf16 (zmuon.muon_transport, docs/DESIGN.md §3), end to end through
// the engine (real actors, caf comm, host backend): bf16 against the fp32 reference transport,
// world 4 against world 1 under bf16, and the trace's byte counts of the gather and scatter
// requests against the plan's element counts. The conversion kernel itself is checked in
// test_kernels (bf16_conversion_matches_reference_rounding).
//
// Tolerances (figures measured with `build/tests/test_muon_transport --log_level=message`):
// - the scatter rounds NS's output once: every element moves by <= 2^-9 relative, so the update
//   by <= 2^-9 in norm (ns_sensitivity_to_bf16_rounding, exact bound).
// - the gather rounds NS's input u once, and NS5 is not a contraction there: the rounding noise
//   fills the gradient's null space, whose singular values NS5 multiplies by up to a^5 ~ 487. For
//   a full-rank 128x64 matrix the output moves by ~1.6e-2, for a rank-8 one by ~0.25 (the same
//   stand-alone case). The CUDA NS rounds its normalized input to bf16 itself, so there this
//   noise is present whatever the transport.
// - one engine step of the example model (mlp.fc1.weight's gradient has rank <= 32 < 64): the
//   Muon update moves by 6.2e-2 (mlp.fc1 9e-2, the full-rank ones ~1e-2): bound 0.15, and
//   > 2^-10 (bf16 really was used). Weights after 5 steps: 1.9e-3, bound 5e-3, > 0.
// - world 4 vs world 1 under bf16: every shard is rounded the same way whatever its owner, so
//   only the gradient's summation order differs (fp32 transport: 1.6e-7). A u element next to a
//   bf16 rounding boundary may round the other way (2^-8 relative), amplified as above:
//   1.2e-4, bound 1e-3, and at least 5x closer than bf16 vs fp32 transport at world 1.
#define BOOST_TEST_MODULE muon_transport
#include "support/engine_fixture.hpp"
#include "support/trace_files.hpp"

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "actors/muon_coordinator.hpp"
#include "plan/ownership.hpp"
#include "zmuon-launch/train.hpp"

using namespace zmuon;
using namespace zmuon::test;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kUpdateBound = 0.15;  // one step's Muon update, bf16 vs fp32 transport
constexpr double kWeightBound = 5e-3;  // weights after 5 steps, bf16 vs fp32 transport
constexpr double kWorldBound = 1e-3;   // world 4 vs world 1, both bf16, 5 steps

engine_options transport_options(int world, muon_transport t) {
  auto o = options(world);
  o.muon.transport = t;
  return o;
}

example::train_options train_opts(int steps, int world) {
  example::train_options t;
  t.steps = steps;
  t.micro_batch = 32 / world;  // the same global batch at every world size
  t.seed = 7;
  return t;
}

tensor_map train_model(const engine_options& o, int steps) {
  auto eng = make_engine(o);
  auto t = train_opts(steps, o.world);
  BOOST_REQUIRE(!example::register_model(*eng, t));
  auto rec = example::train(*eng, t);
  BOOST_REQUIRE_MESSAGE(rec, (rec ? "" : rec.err().to_string()));
  return params_of(*eng);
}

// The change one step makes to the Muon parameters (the weights before minus after, / lr).
tensor_map muon_update(muon_transport transport) {
  auto o = transport_options(4, transport);
  auto eng = make_engine(o);
  auto t = train_opts(1, o.world);
  BOOST_REQUIRE(!example::register_model(*eng, t));
  auto before = params_of(*eng);
  BOOST_REQUIRE(example::train(*eng, t));
  auto after = params_of(*eng);
  tensor_map update;
  for (const auto& p : eng->layout()->params) {
    if (!p.muon)
      continue;
    auto& u = update[p.name];
    for (size_t i = 0; i < before[p.name].size(); ++i)
      u.push_back((before[p.name][i] - after[p.name][i]) / o.muon.lr);
  }
  return update;
}

}  // namespace

BOOST_AUTO_TEST_CASE(auto_transport_is_ns_precision) {
  engine_options o;
  BOOST_TEST((muon_wire_type(o) == wire_type::fp32));  // host: fp32 NS
  o.compute = "cuda";
  BOOST_TEST((muon_wire_type(o) == wire_type::bf16));  // cuda: bf16 NS
  o.muon.transport = muon_transport::fp32;
  BOOST_TEST((muon_wire_type(o) == wire_type::fp32));
  o.compute = "host";
  o.muon.transport = muon_transport::bf16;
  BOOST_TEST((muon_wire_type(o) == wire_type::bf16));
}

// Newton-Schulz (host, fp32) of a [128, 64] matrix of rank 8 and of full rank, with its input or
// its output rounded to bf16, against NS of the unrounded matrix.
BOOST_AUTO_TEST_CASE(ns_sensitivity_to_bf16_rounding) {
  auto be = make_compute_backend("host");
  BOOST_REQUIRE(be);
  const int64_t rows = 128, cols = 64;
  auto round = [&](std::vector<float> x) {
    std::vector<uint16_t> bits(x.size());
    (*be)->to_bf16(bits.data(), x.data(), static_cast<int64_t>(x.size()));
    (*be)->from_bf16(x.data(), bits.data(), static_cast<int64_t>(x.size()));
    return x;
  };
  auto ns = [&](std::vector<float> x) {
    (*be)->newton_schulz(x.data(), 1, rows, cols, ns_options{});
    return x;
  };
  std::map<int64_t, double> input_effect;
  for (int64_t rank : {int64_t{8}, cols}) {
    auto a = random_values(rows * rank, 11), b = random_values(rank * cols, 12);
    std::vector<float> g(rows * cols);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < rank; ++k)
          sum += static_cast<double>(a[i * rank + k]) * b[k * cols + j];
        g[i * cols + j] = static_cast<float>(sum);
      }
    auto exact = ns(g);
    double out = rel_diff(round(exact), exact);
    input_effect[rank] = rel_diff(ns(round(g)), exact);
    BOOST_TEST_MESSAGE("NS5 of a [128, 64] matrix of rank "
                       << rank << ": bf16 output rounding moves it by " << out
                       << ", bf16 input rounding by " << input_effect[rank]);
    BOOST_TEST(out <= 1.0 / 512);  // 2^-9 per element, so in norm
    BOOST_TEST(out > 0.0);
  }
  BOOST_TEST(input_effect[cols] <= 4e-2);                 // full rank: measured 1.6e-2
  BOOST_TEST(input_effect[8] >= 5 * input_effect[cols]);  // the null space amplifies it
  BOOST_TEST(input_effect[8] <= 0.5);                     // measured 0.25
}

BOOST_AUTO_TEST_CASE(bf16_transport_stays_within_bf16_bound_of_fp32) {
  auto u16 = muon_update(muon_transport::bf16), u32 = muon_update(muon_transport::fp32);
  double du = rel_diff(u16, u32);
  for (const auto& [name, v] : u32)
    BOOST_TEST_MESSAGE("  " << name << ": update differs by "
                            << rel_diff(tensor_map{{name, u16[name]}}, tensor_map{{name, v}}));
  auto w16 = train_model(transport_options(4, muon_transport::bf16), 5);
  auto w32 = train_model(transport_options(4, muon_transport::fp32), 5);
  double dw = rel_diff(w16, w32);
  BOOST_TEST_MESSAGE("bf16 vs fp32 transport, world 4: one step's Muon update differs by "
                     << du << " (relative), the weights after 5 steps by " << dw);
  BOOST_TEST(du <= kUpdateBound);
  BOOST_TEST(du > 1.0 / 1024);
  BOOST_TEST(dw <= kWeightBound);
  BOOST_TEST(dw > 0.0);
}

BOOST_AUTO_TEST_CASE(world_4_matches_world_1_under_bf16) {
  auto w1 = train_model(transport_options(1, muon_transport::bf16), 5);
  auto w4 = train_model(transport_options(4, muon_transport::bf16), 5);
  auto f1 = train_model(transport_options(1, muon_transport::fp32), 5);
  double d = rel_diff(w4, w1), d32 = rel_diff(train_model(options(4), 5), f1);
  BOOST_TEST_MESSAGE("world 4 vs world 1, 5 steps: bf16 transport " << d << ", fp32 transport "
                                                                    << d32);
  BOOST_TEST(d <= kWorldBound);
  // Both runs rounded in bf16: world 1 lies far closer to world 4 than to fp32 world 1.
  BOOST_TEST(d * 5 < rel_diff(w1, f1));
}

// A traced run at world 3 with several Muon chunks: every gather and scatter request carries
// `bytes` = bytes per element x the elements the plan says it moves, for bf16 (2) and fp32 (4);
// summed over ranks, a step's gather and scatter move 2 x 2 bytes per Muon parameter.
BOOST_AUTO_TEST_CASE(trace_bytes_of_gather_and_scatter_are_two_per_element) {
  const int world = 3, steps = 2;
  for (const auto& wire :
       {std::pair<muon_transport, int64_t>{muon_transport::bf16, 2}, {muon_transport::fp32, 4}}) {
    // Named copies, not a structured binding: lambdas below capture them (C++17).
    const muon_transport transport = wire.first;
    const int64_t per_element = wire.second;
    const std::string dir = "test_muon_transport_trace_" + std::to_string(per_element);
    fs::remove_all(dir);
    auto o = transport_options(world, transport);
    o.reduce_bucket_size = 3000;  // several Muon chunks
    o.trace_dir = dir;
    std::shared_ptr<const plan> pl;  // a copy: the engine's dies with it
    {
      auto eng = make_engine(o);
      auto t = train_opts(steps, world);
      BOOST_REQUIRE(!example::register_model(*eng, t));
      BOOST_REQUIRE(example::train(*eng, t));
      pl = std::make_shared<const plan>(*eng->layout());
    }  // the engine is gone: every trace file is complete
    BOOST_REQUIRE(pl->chunks.size() > 1);
    int64_t muon_elements = 0;
    for (const auto& p : pl->params)
      muon_elements += p.muon ? p.numel : 0;
    int64_t all_bytes = 0, requests = 0;
    for (int r = 0; r < world; ++r) {
      auto own = make_ownership(*pl, r);
      // Elements this rank sends in chunk c's gather (its shard of each matrix) and scatter
      // (every rank's shard of the matrices it owns).
      auto expected = [&](const std::string& op, int c) {
        int64_t n = 0;
        if (op == "gather")
          for (int i : pl->chunks[c].params)
            n += valid_len(pl->params[i], r);
        else
          for (const auto& m : own[c].owned)
            n += pl->params[m.param].numel;
        return n * per_element;
      };
      auto recs = read_jsonl(trace_file(dir, r));
      std::map<std::string, int64_t> peer_bytes;  // op -> bytes of the caf comm's peer pieces
      for (const auto& rec : recs) {
        const std::string type = rec.value("type", ""), ev = rec.value("ev", "");
        const std::string op = rec.value("op", ""), actor = rec.value("actor", "");
        const int64_t bytes = rec.value("bytes", int64_t{0});  // absent when 0
        if (ev != "send" || (op != "gather" && op != "scatter"))
          continue;
        if (type == "peer_floats")
          peer_bytes[op] += bytes;
        if (type != "all_to_all_req" || actor != "muon_coordinator")
          continue;
        const int c = rec.value("index", -1);
        BOOST_TEST(bytes == expected(op, c), "rank " << r << " " << op << " chunk " << c);
        all_bytes += bytes;
        ++requests;
      }
      // What crosses to the peers: the request's bytes less the rank's own shards.
      int64_t own_gather = 0, own_scatter = 0;
      for (size_t c = 0; c < pl->chunks.size(); ++c) {
        for (int i : pl->chunks[c].params)
          own_gather += pl->params[i].owner == r ? valid_len(pl->params[i], r) : 0;
        for (const auto& m : own[c].owned)
          own_scatter += valid_len(pl->params[m.param], r);
      }
      int64_t gather_total = 0, scatter_total = 0;
      for (size_t c = 0; c < pl->chunks.size(); ++c) {
        gather_total += expected("gather", static_cast<int>(c));
        scatter_total += expected("scatter", static_cast<int>(c));
      }
      BOOST_TEST(peer_bytes["gather"] == steps * (gather_total - own_gather * per_element));
      BOOST_TEST(peer_bytes["scatter"] == steps * (scatter_total - own_scatter * per_element));
    }
    BOOST_TEST(requests == world * steps * 2 * static_cast<int64_t>(pl->chunks.size()));
    // Per step, summed over ranks: one gather and one scatter of every Muon element.
    BOOST_TEST(all_bytes == steps * 2 * per_element * muon_elements);
    BOOST_TEST_MESSAGE(
        (per_element == 2 ? "bf16" : "fp32")
        << " transport, world " << world << ": Muon gather + scatter bytes per rank per step "
        << all_bytes / (steps * world) << " for " << muon_elements << " Muon parameters");
  }
}
