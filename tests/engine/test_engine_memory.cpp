// Memory a rank's compute backend holds (engine::memory, zmuon/memory.hpp): the per-buffer
// accounting itself, no growth from step to step, and the step's transient peak within the
// pipeline's bound of two chunks in flight (peak transient memory <= 2 chunks + the largest
// matrix's NS workspace; the workspace is counted apart).
#define BOOST_TEST_MODULE engine_memory
#include <boost/test/unit_test.hpp>

#include <algorithm>

#include "kernels/compute.hpp"
#include "plan/plan.hpp"
#include "support/engine_fixture.hpp"

using namespace zmuon;
using namespace zmuon::test;

BOOST_AUTO_TEST_CASE(host_backend_counts_every_buffer) {
  auto be = make_compute_backend("host");
  BOOST_REQUIRE(be);
  compute_backend& b = **be;
  const int64_t base = b.memory().in_use;
  {
    device_buffer x = b.allocate(1000);
    device_buffer y = b.allocate(24);
    BOOST_TEST(b.memory().in_use == base + 4096);
    BOOST_TEST(b.memory().peak >= base + 4096);
  }
  BOOST_TEST(b.memory().in_use == base);
  b.reset_peak_memory();
  BOOST_TEST(b.memory().peak == base);
  { device_buffer z = b.allocate(10); }
  BOOST_TEST(b.memory().peak == base + 40);
  // The Newton-Schulz workspace appears once NS ran, and is not counted as buffers.
  device_buffer m = b.allocate(6 * 8);
  b.newton_schulz(m.data(), 1, 6, 8, ns_options{});
  BOOST_TEST(b.memory().workspace >= int64_t{4} * (2 * 6 * 8 + 2 * 6 * 6));
  BOOST_TEST(b.memory().in_use == base + 4 * 48);
}

BOOST_AUTO_TEST_CASE(step_transient_peak_is_at_most_two_chunks) {
  // Eight Muon matrices and an AdamW vector; buckets (and chunks) of two or three matrices.
  std::vector<param_spec> table;
  for (int i = 0; i < 8; ++i)
    table.push_back({"w" + std::to_string(i), {48 + 8 * (i % 3), 80}, param_group::muon, 0});
  table.push_back({"bias", {300}, param_group::adamw, 0});
  engine_options o = options(2);
  o.reduce_bucket_size = 3 * 64 * 80;
  auto eng = make_engine(o);
  register_table(*eng, table, 5);

  std::vector<int64_t> steady(o.world, -1);
  for (int step = 1; step <= 3; ++step) {
    for (int r = 0; r < o.world; ++r)
      BOOST_REQUIRE(!eng->reduce(r, random_grads(table, 9, step, r, 0)));
    const plan& pl = *eng->layout();
    BOOST_REQUIRE(pl.chunks.size() >= 3);  // the bound is about a pipeline of chunks
    std::vector<int64_t> before(o.world);
    for (int r = 0; r < o.world; ++r) {
      // The hand-over landed first (snapshot() waits for it): its first bucket allocates the
      // store's gradient buffer, which is not the step's.
      BOOST_REQUIRE(eng->snapshot(r));
      before[r] = eng->memory(r)->in_use;
    }
    eng->reset_peak_memory();
    auto info = eng->step();
    BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
    for (int r = 0; r < o.world; ++r) {
      // One chunk in flight on rank r: its u and result shards and the matrices it owns.
      int64_t chunk_bytes = 0;
      for (const auto& c : pl.chunks) {
        int64_t owned = 0;
        for (int i : c.params)
          owned += pl.params[i].owner == r ? pl.params[i].numel : 0;
        chunk_bytes = std::max(chunk_bytes, int64_t{4} * (2 * c.shard_len + owned));
      }
      const memory_stats m = *eng->memory(r);
      const int64_t transient = m.peak - before[r];
      BOOST_TEST_MESSAGE("step " << step << " rank " << r << ": in use " << m.in_use
                                 << " B, transient peak " << transient << " B, one chunk "
                                 << chunk_bytes << " B, NS workspace " << m.workspace << " B");
      BOOST_TEST(transient > 0);  // the accounting sees the step's buffers
      BOOST_TEST(transient <= 2 * chunk_bytes);
      if (steady[r] >= 0)
        BOOST_TEST(m.in_use == steady[r]);  // nothing kept from step to step
      steady[r] = m.in_use;
    }
  }
  BOOST_TEST(!eng->memory(o.world));  // a rank outside the engine is an error, not a crash
}
