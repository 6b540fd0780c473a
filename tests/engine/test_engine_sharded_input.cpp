// Gradients and parameters that arrive already distributed, as DDP and FSDP2 hand them over
// (real actors, real caf comm, host backend): the row layout (zmuon.shard_layout "rows", FSDP2's
// Shard(0)), hand_over_reduced (a rank's part of an already averaged gradient, no reduce-scatter)
// against reduce() of the per-rank gradients, shard_params against the full parameters, and a
// checkpoint saved under rows loaded under the flat layout at another world size.
#define BOOST_TEST_MODULE engine_sharded_input
#include "support/engine_fixture.hpp"

#include <filesystem>

#include "plan/ownership.hpp"
#include "plan/plan.hpp"

using namespace zmuon;
using namespace zmuon::test;

namespace {

// Shapes whose dim 0 does not divide by 4 (the last ranks hold fewer rows, or none), a 3-row
// bias (rank 3 holds none of it at world 4), a conv-like 4-D weight and an embedding.
const std::vector<param_spec> kTable = {{"embed.weight", {10, 6}},
                                        {"fc1.weight", {9, 6}},
                                        {"fc1.bias", {3}},
                                        {"fc2.weight", {6, 9}},
                                        {"conv.weight", {5, 2, 2, 2}}};

engine_options rows_options(int world) {
  auto o = options(world);
  o.layout = shard_layout::rows;
  return o;
}

/// The mean over ranks of the per-rank gradients of (step, micro): what DDP's all-reduce gives.
tensor_map averaged(int world, int step, int micro) {
  tensor_map mean;
  for (int r = 0; r < world; ++r)
    for (auto& [name, g] : random_grads(kTable, 5, step, r, micro)) {
      auto& m = mean[name];
      m.resize(g.size(), 0.0f);
      for (size_t i = 0; i < g.size(); ++i)
        m[i] += g[i];
    }
  for (auto& [name, m] : mean)
    for (auto& x : m)
      x /= static_cast<float>(world);
  return mean;
}

/// Rank `rank`'s shard of every tensor of `full` under the engine's plan.
std::vector<std::vector<float>> shards_of(const plan& pl, const tensor_map& full, int rank) {
  std::vector<std::vector<float>> out;
  for (const auto& p : pl.params) {
    const auto& v = full.at(p.name);
    auto [b, e] = rank_slice(p.numel, p.shard_len, rank);
    out.emplace_back(v.begin() + b, v.begin() + e);
  }
  return out;
}

std::vector<tensor_view> views_of(const plan& pl, const std::vector<std::vector<float>>& shards) {
  std::vector<tensor_view> v;
  for (size_t i = 0; i < shards.size(); ++i)
    v.push_back({pl.params[i].name, shards[i].empty() ? nullptr : shards[i].data(),
                 static_cast<int64_t>(shards[i].size())});
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(rows_layout_cuts_whole_dim0_slices_as_fsdp2_does) {
  auto made = make_plan(kTable, 4, 1000, true, shard_layout::rows);
  BOOST_REQUIRE(made);
  for (const auto& p : made->params) {
    const int64_t inner = p.numel / p.shape[0];
    const int64_t rows = (p.shape[0] + 3) / 4;  // torch.chunk's: ceil(dim0 / world)
    BOOST_TEST(p.shard_len == rows * inner);
    int64_t covered = 0;
    for (int q = 0; q < 4; ++q) {
      BOOST_TEST(valid_len(p, q) % inner == 0);  // whole rows only
      const int64_t fsdp_rows = std::max<int64_t>(0, std::min(rows, p.shape[0] - q * rows));
      BOOST_TEST(valid_len(p, q) == fsdp_rows * inner);
      covered += valid_len(p, q);
    }
    BOOST_TEST(covered == p.numel);
  }
  const auto& bias = made->params[made->find("fc1.bias")];
  BOOST_TEST(valid_len(bias, 3) == 0);  // rank 3 holds no row of a 3-row bias
}

BOOST_AUTO_TEST_CASE(averaged_gradients_handed_over_equal_the_reduce_scatter) {
  // World 4, two micro-batches, three steps: reduce() of each rank's gradient (the engine's
  // mean over ranks) against hand_over_reduced() of the mean, whole on ranks 0 and 2 and as
  // the rank's shard alone on ranks 1 and 3. Both layouts.
  for (auto layout : {shard_layout::flat, shard_layout::rows}) {
    auto o = options(4);
    o.layout = layout;
    auto a = make_engine(o), b = make_engine(o);
    register_table(*a, kTable, 3);
    register_table(*b, kTable, 3);
    for (int step = 1; step <= 3; ++step)
      for (int micro = 0; micro < 2; ++micro) {
        for (int r = 0; r < 4; ++r)
          reduce_ok(*a, r, random_grads(kTable, 5, step, r, micro));
        const tensor_map mean = averaged(4, step, micro);
        if (step == 1 && micro == 0)
          BOOST_REQUIRE(!b->start());
        for (int r = 0; r < 4; ++r) {
          std::vector<std::vector<float>> own;
          std::vector<tensor_view> views;
          if (r % 2 == 0) {
            for (const auto& [name, g] : mean)
              views.push_back({name, g.data(), static_cast<int64_t>(g.size())});
          } else {
            own = shards_of(*b->layout(), mean, r);
            views = views_of(*b->layout(), own);
          }
          auto err = b->hand_over_reduced(r, views);
          BOOST_REQUIRE_MESSAGE(!err, err.to_string());
        }
        if (micro == 1) {
          step_ok(*a);
          step_ok(*b);
        }
      }
    const double d = rel_diff(params_of(*b), params_of(*a));
    BOOST_TEST_MESSAGE((layout == shard_layout::rows ? "rows" : "flat")
                       << ": averaged hand-over vs reduce-scatter, 3 steps: " << d);
    // The reduce-scatter's mean and the host's sum over ranks in another order: fp32 rounding.
    BOOST_TEST(d <= 1e-6);
  }
}

BOOST_AUTO_TEST_CASE(rows_layout_changes_nothing_numerically) {
  tensor_map flat, rows;
  for (auto layout : {shard_layout::flat, shard_layout::rows}) {
    auto o = options(4);
    o.layout = layout;
    auto eng = make_engine(o);
    register_table(*eng, kTable, 3);
    for (int step = 1; step <= 3; ++step) {
      for (int r = 0; r < 4; ++r)
        reduce_ok(*eng, r, random_grads(kTable, 5, step, r, 0));
      step_ok(*eng);
    }
    (layout == shard_layout::flat ? flat : rows) = params_of(*eng);
  }
  const double d = rel_diff(rows, flat);
  BOOST_TEST_MESSAGE("rows vs flat layout, world 4, 3 steps: " << d);
  BOOST_TEST(d <= 1e-6);
}

BOOST_AUTO_TEST_CASE(shard_params_give_each_rank_its_slice_of_the_parameters) {
  auto eng = make_engine(rows_options(4));
  register_table(*eng, kTable, 3);
  for (int r = 0; r < 4; ++r)
    reduce_ok(*eng, r, random_grads(kTable, 5, 1, r, 0));
  step_ok(*eng);
  const tensor_map full = params_of(*eng);
  const plan& pl = *eng->layout();
  for (int r = 0; r < 4; ++r) {
    auto want = shards_of(pl, full, r);
    std::vector<std::vector<float>> got(want.size());
    std::vector<tensor_span> spans;
    for (size_t i = 0; i < want.size(); ++i) {
      got[i].assign(want[i].size(), -1.0f);
      spans.push_back({pl.params[i].name, got[i].empty() ? nullptr : got[i].data(),
                       static_cast<int64_t>(got[i].size())});
    }
    auto err = eng->shard_params(r, spans);
    BOOST_REQUIRE_MESSAGE(!err, err.to_string());
    for (size_t i = 0; i < want.size(); ++i)
      BOOST_TEST(same_bits(got[i], want[i]), "rank " << r << " " << pl.params[i].name);
  }
  // A whole-size buffer for a parameter split over ranks is refused, naming it; so is a rank
  // this process does not run.
  std::vector<float> whole(9 * 6);
  auto err = eng->shard_params(1, {{"fc1.weight", whole.data(), 54}});
  BOOST_TEST((err.code() == errc::shape_mismatch));
  BOOST_TEST(err.message().find("fc1.weight") != std::string::npos);
  err = eng->shard_params(4, {});
  BOOST_TEST((err.code() == errc::invalid_argument));
  BOOST_TEST_MESSAGE(err.message());
}

BOOST_AUTO_TEST_CASE(a_wrong_size_names_both_sizes_and_hands_over_nothing) {
  auto eng = make_engine(rows_options(4));
  register_table(*eng, kTable, 3);
  BOOST_REQUIRE(!eng->start());
  std::vector<float> g(7, 1.0f);
  auto err = eng->hand_over_reduced(1, {{"fc1.weight", g.data(), 7}});
  BOOST_TEST((err.code() == errc::shape_mismatch));
  BOOST_TEST_MESSAGE(err.message());
  BOOST_TEST(err.message().find("54 (the whole tensor) or 18 (rank 1's shard)")
             != std::string::npos);
  auto s = eng->step();  // nothing was handed over
  BOOST_TEST(!s);
}

BOOST_AUTO_TEST_CASE(a_rows_checkpoint_loads_under_another_layout_and_world) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "zmuon_test_rows_checkpoint";
  fs::remove_all(dir);
  auto run = [&](engine& eng, int world, int first, int last) {
    for (int step = first; step <= last; ++step) {
      const tensor_map mean = averaged(3, step, 0);
      for (int r = 0; r < world; ++r) {
        std::vector<tensor_view> v;
        for (const auto& [name, g] : mean)
          v.push_back({name, g.data(), static_cast<int64_t>(g.size())});
        BOOST_REQUIRE(!eng.hand_over_reduced(r, v));
      }
      step_ok(eng);
    }
  };
  tensor_map straight;
  {  // the reference: flat layout, world 3, six steps without a break
    auto eng = make_engine(options(3));
    register_table(*eng, kTable, 3);
    run(*eng, 3, 1, 6);
    straight = params_of(*eng);
  }
  {  // rows, world 4: three steps, saved
    auto eng = make_engine(rows_options(4));
    register_table(*eng, kTable, 3);
    run(*eng, 4, 1, 3);
    auto err = eng->save_checkpoint(dir.string());
    BOOST_REQUIRE_MESSAGE(!err, err.to_string());
  }
  auto eng = make_engine(options(3));  // flat, world 3: loaded, three more steps
  register_table(*eng, kTable, 9);
  auto info = eng->load_checkpoint(dir.string());
  BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
  BOOST_TEST(info->world == 4);
  run(*eng, 3, 4, 6);
  const double d = rel_diff(params_of(*eng), straight);
  BOOST_TEST_MESSAGE("rows world 4 -> checkpoint -> flat world 3 vs straight: " << d);
  BOOST_TEST(d <= 1e-6);
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(no_rank_holds_a_whole_matrix_it_does_not_own) {
  // Four equal Muon matrices at world 4: each rank owns one. A rank's transient memory in the
  // step (what its backend holds beyond the shards and states it keeps) is bounded by the
  // matrix it owns plus its shards of u and of the update; a whole matrix it does not own
  // would add another 64 x 48 floats.
  std::vector<param_spec> table;
  for (int i = 0; i < 4; ++i)
    table.push_back({"m" + std::to_string(i), {64, 48}});
  auto eng = make_engine(rows_options(4));
  register_table(*eng, table, 3);
  for (int r = 0; r < 4; ++r)
    reduce_ok(*eng, r, random_grads(table, 5, 1, r, 0));
  std::vector<int64_t> kept;
  for (int r = 0; r < 4; ++r) {
    auto m = eng->memory(r);
    BOOST_REQUIRE(m);
    kept.push_back(m->in_use);
  }
  eng->reset_peak_memory();
  step_ok(*eng);
  const plan& pl = *eng->layout();
  const int64_t matrix = 64 * 48 * static_cast<int64_t>(sizeof(float));
  for (int r = 0; r < 4; ++r) {
    auto m = eng->memory(r);
    BOOST_REQUIRE(m);
    int64_t owned = 0;
    for (const auto& c : make_ownership(pl, r))
      owned += c.full_size * static_cast<int64_t>(sizeof(float));
    int64_t shards = 0;
    for (const auto& c : pl.chunks)
      shards += 2 * c.shard_len * static_cast<int64_t>(sizeof(float));  // u and the update
    const int64_t transient = m->peak - kept[r];
    BOOST_TEST_MESSAGE("rank " << r << ": transient " << transient << " bytes; owned matrices "
                               << owned << ", u and update shards " << shards << ", one matrix "
                               << matrix);
    BOOST_TEST(owned == matrix);
    BOOST_TEST(transient >= owned);
    BOOST_TEST(transient <= owned + shards);
  }
}

BOOST_AUTO_TEST_CASE(parameters_registered_without_values_load_per_shard) {
  // What an FSDP2 process does: register the shapes only, then each rank loads its own rows.
  // The engine then holds exactly the values registered whole would give, and steps alike.
  tensor_map whole;
  for (size_t i = 0; i < kTable.size(); ++i)
    whole[kTable[i].name] = random_values(numel(kTable[i]), 3000 + i, 0.1f);
  auto by_values = make_engine(rows_options(4));
  auto by_shards = make_engine(rows_options(4));
  for (const auto& spec : kTable) {
    BOOST_REQUIRE(!by_values->add_parameter(spec, whole.at(spec.name)));
    BOOST_REQUIRE(!by_shards->add_parameter(spec));
  }
  BOOST_REQUIRE(!by_shards->start());
  const plan& pl = *by_shards->layout();
  for (int r = 0; r < 4; ++r) {
    auto own = shards_of(pl, whole, r);
    auto err = by_shards->load_shard_params(r, views_of(pl, own));
    BOOST_REQUIRE_MESSAGE(!err, err.to_string());
  }
  const tensor_map loaded = params_of(*by_shards);
  for (const auto& [name, v] : whole)
    BOOST_TEST(same_bits(loaded.at(name), v), name);
  for (auto* eng : {by_values.get(), by_shards.get()}) {
    for (int r = 0; r < 4; ++r)
      reduce_ok(*eng, r, random_grads(kTable, 5, 1, r, 0));
    step_ok(*eng);
  }
  const tensor_map a = params_of(*by_shards), b = params_of(*by_values);
  for (const auto& [name, v] : b)
    BOOST_TEST(same_bits(a.at(name), v), name);
  // A wrong size is refused, naming the parameter, and loads nothing.
  std::vector<float> wrong(5, 9.0f);
  auto err = by_shards->load_shard_params(0, {{"fc2.weight", wrong.data(), 5}});
  BOOST_TEST((err.code() == errc::shape_mismatch));
  BOOST_TEST(err.message().find("fc2.weight") != std::string::npos);
  const tensor_map after = params_of(*by_shards);
  for (const auto& [name, v] : a)
    BOOST_TEST(same_bits(after.at(name), v), name);
}
