// Cautious weight decay (arXiv:2510.12402) and NorMuon (arXiv:2510.05491) end to end through the
// engine (real actors, caf comm, host backend, fp32 transport, standard NS): each against a
// double-precision reference written here, world and gas invariance with both on, a skipped
// step leaving NorMuon's row moments alone, and their checkpoint round trip and resharding.
#define BOOST_TEST_MODULE cautious_normuon
#include "support/engine_fixture.hpp"

#include <cmath>
#include <map>

#include <filesystem>
#include <fstream>

#include "support/ns_accuracy.hpp"
#include "support/scratch_dir.hpp"
#include "support/trace_files.hpp"
#include "zmuon-trace/check.hpp"
#include "zmuon-trace/reader.hpp"

using namespace zmuon;
using namespace zmuon::test;

namespace {

// -- the reference: the optimizer in double, one parameter at a time ---------------------------

struct ref_param {
  param_spec spec;
  bool muon = true;
  int64_t rows = 0, cols = 0, heads = 1;
  std::vector<double> p, m, v, rows_v;  // params; momentum or Adam m; Adam v; NorMuon's rows
};

struct ref_optimizer {
  muon_options muon;
  adamw_options adamw;
  int64_t adam_steps = 0;
  std::map<std::string, ref_param> params;

  void add(const param_spec& s, const std::vector<float>& init) {
    ref_param r;
    r.spec = s;
    r.muon = s.shape.size() >= 2;
    r.rows = s.shape[0];
    r.cols = static_cast<int64_t>(init.size()) / r.rows;
    r.heads = s.heads > 0 ? s.heads : 1;
    r.p.assign(init.begin(), init.end());
    r.m.assign(init.size(), 0.0);
    r.v.assign(init.size(), 0.0);
    r.rows_v.assign(static_cast<size_t>(r.rows), 0.0);
    params[s.name] = r;
  }

  // Dion's muon_update_post_orthogonalize / scalar_opts.adamw_update: the decay where
  // p * update >= 0 (the update before the learning rate), else none.
  static double decayed(double p, double update, double lr, double wd, bool cautious) {
    if (!cautious)
      return p * (1 - lr * wd);
    return p * update >= 0 ? p - lr * wd * p : p;
  }

  /// One step with the averaged gradient g (by name).
  void step(const std::map<std::string, std::vector<double>>& grads) {
    ++adam_steps;
    for (auto& [name, r] : params) {
      const auto& g = grads.at(name);
      if (r.muon) {
        const double beta = muon.momentum;
        std::vector<double> u(g.size());
        for (size_t i = 0; i < g.size(); ++i) {
          r.m[i] = beta * r.m[i] + (1 - beta) * g[i];
          u[i] = muon.nesterov ? (1 - beta) * g[i] + beta * r.m[i] : r.m[i];
        }
        const int64_t rows = r.rows / r.heads, block = rows * r.cols;
        std::vector<double> o(g.size());
        for (int64_t h = 0; h < r.heads; ++h) {
          std::vector<double> part(u.begin() + h * block, u.begin() + (h + 1) * block);
          auto ortho = ns_accuracy::ns5_reference(part, rows, r.cols);
          if (muon.variant == muon_variant::normuon)
            ns_accuracy::normuon_reference(ortho.data(), r.rows_v.data() + h * rows, rows, r.cols,
                                           muon.normuon_beta2, muon.normuon_eps);
          std::copy(ortho.begin(), ortho.end(), o.begin() + h * block);
        }
        const double scale = std::sqrt(std::max(1.0, static_cast<double>(rows) / r.cols));
        for (size_t i = 0; i < g.size(); ++i) {
          const double update = scale * o[i];
          r.p[i] = decayed(r.p[i], update, muon.lr, muon.weight_decay, muon.cautious_weight_decay)
                   - muon.lr * update;
        }
      } else {
        const double b1 = adamw.beta1, b2 = adamw.beta2, t = static_cast<double>(adam_steps);
        for (size_t i = 0; i < g.size(); ++i) {
          r.m[i] = b1 * r.m[i] + (1 - b1) * g[i];
          r.v[i] = b2 * r.v[i] + (1 - b2) * g[i] * g[i];
          const double mhat = r.m[i] / (1 - std::pow(b1, t));
          const double vhat = r.v[i] / (1 - std::pow(b2, t));
          const double dir = mhat / (std::sqrt(vhat) + adamw.eps);
          r.p[i] = decayed(r.p[i], dir, adamw.lr, adamw.weight_decay, adamw.cautious_weight_decay)
                   - adamw.lr * dir;
        }
      }
    }
  }

  tensor_map weights() const {
    tensor_map out;
    for (const auto& [name, r] : params)
      out[name] = std::vector<float>(r.p.begin(), r.p.end());
    return out;
  }
};

// A wide and a tall matrix, a per-head one (3 heads of [4, 10]) and an AdamW bias.
const std::vector<param_spec> kTable{{"wide", {12, 20}},
                                     {"tall", {24, 9}},
                                     {"attn", {12, 10}, param_group::automatic, 3},
                                     {"bias", {20}}};

engine_options with_features(int world, bool cautious, bool normuon) {
  engine_options o = options(world);
  o.muon.ns.variant = ns_variant::standard;
  o.muon.transport = muon_transport::fp32;
  o.muon.lr = 0.05f;
  o.adamw.lr = 0.01f;
  // A large decay, so that where it applies shows.
  o.muon.weight_decay = 2.0f;
  o.adamw.weight_decay = 2.0f;
  o.muon.cautious_weight_decay = cautious;
  o.adamw.cautious_weight_decay = cautious;
  if (normuon) {
    o.muon.variant = muon_variant::normuon;
    o.muon.normuon_beta2 = 0.9f;
  }
  return o;
}

/// The engine's weights after `steps` steps at world `world` (one micro-batch a rank) and the
/// double reference's, both from the same initial values and gradients.
std::pair<tensor_map, tensor_map> engine_and_reference(const engine_options& o, int steps) {
  auto eng = make_engine(o);
  register_table(*eng, kTable, 5);
  ref_optimizer ref;
  ref.muon = o.muon;
  ref.adamw = o.adamw;
  const tensor_map init = params_of(*eng);
  for (const auto& s : kTable)
    ref.add(s, init.at(s.name));
  for (int s = 1; s <= steps; ++s) {
    const auto mean = reduce_random_mean(*eng, kTable, 5, s, o.world);
    BOOST_REQUIRE(!step_ok(*eng).skipped);
    ref.step(mean);
  }
  return {params_of(*eng), ref.weights()};
}

/// The fraction of elements whose weights differ between two runs.
double held_back_fraction(const tensor_map& with, const tensor_map& without) {
  size_t differ = 0, total = 0;
  for (const auto& [name, v] : with)
    for (size_t i = 0; i < v.size(); ++i, ++total)
      differ += v[i] != without.at(name)[i];
  return static_cast<double>(differ) / static_cast<double>(total);
}

}  // namespace

BOOST_AUTO_TEST_CASE(cautious_weight_decay_matches_a_double_precision_reference) {
  auto [got, want] = engine_and_reference(with_features(2, true, false), 3);
  auto [plain, plain_want] = engine_and_reference(with_features(2, false, false), 3);
  const double d = rel_diff(got, want);
  const double effect = rel_diff(want, plain_want);
  BOOST_TEST_MESSAGE("cautious weight decay, world 2, 3 steps: engine vs double reference "
                     << d << "; cautious vs plain decay (reference) " << effect
                     << "; weights that differ from plain decay's: "
                     << held_back_fraction(got, plain));
  BOOST_TEST(d <= 1e-5);
  BOOST_TEST(rel_diff(plain, plain_want) <= 1e-5);
  BOOST_TEST(effect >= 1e-3);  // the feature changes the weights far beyond the tolerance
}

BOOST_AUTO_TEST_CASE(normuon_matches_a_double_precision_reference) {
  auto [got, want] = engine_and_reference(with_features(2, false, true), 3);
  auto [muon, muon_want] = engine_and_reference(with_features(2, false, false), 3);
  const double d = rel_diff(got, want);
  const double effect = rel_diff(want, muon_want);
  BOOST_TEST_MESSAGE(
      "NorMuon, world 2, 3 steps (per-head matrix included): engine vs double "
      "reference "
      << d << "; NorMuon vs Muon (reference) " << effect);
  BOOST_TEST(d <= 1e-5);
  BOOST_TEST(effect >= 1e-3);
  // Both features together.
  auto [both, both_want] = engine_and_reference(with_features(4, true, true), 3);
  const double d_both = rel_diff(both, both_want);
  BOOST_TEST_MESSAGE("NorMuon with cautious weight decay, world 4: engine vs reference " << d_both);
  BOOST_TEST(d_both <= 1e-5);
}

namespace {

/// Integer-valued gradient pieces (16 a step and parameter), so that every split of them over
/// ranks and micro-batches sums exactly: rank r's micro k gets the mean of its share.
tensor_map integer_piece(int step, int world, int gas, int rank, int micro) {
  const int share = 16 / (world * gas);
  const int first = (rank * gas + micro) * share;
  tensor_map out;
  for (size_t t = 0; t < kTable.size(); ++t) {
    auto& v = out[kTable[t].name];
    v.assign(static_cast<size_t>(numel(kTable[t])), 0.0f);
    for (int k = first; k < first + share; ++k) {
      auto piece = random_values(static_cast<int64_t>(v.size()), (step * 16 + k) * 7 + t, 3.0f);
      for (size_t i = 0; i < v.size(); ++i)
        v[i] += std::round(piece[i]);
    }
    for (float& x : v)
      x /= static_cast<float>(share);  // a power of 2: exact
  }
  return out;
}

tensor_map train_split(int world, int gas, int steps) {
  auto eng = make_engine(with_features(world, true, true));
  register_table(*eng, kTable, 9);
  for (int s = 1; s <= steps; ++s) {
    for (int r = 0; r < world; ++r)
      for (int k = 0; k < gas; ++k)
        reduce_ok(*eng, r, integer_piece(s, world, gas, r, k));
    BOOST_REQUIRE(!step_ok(*eng).skipped);
  }
  return params_of(*eng);
}

}  // namespace

BOOST_AUTO_TEST_CASE(world_1_2_4_and_gas_1_4_give_the_same_weights_with_both_on) {
  const auto base = train_split(1, 1, 4);
  double worst = 0;
  const std::vector<std::pair<int, int>> splits{{1, 4}, {2, 1}, {2, 4}, {4, 1}, {4, 4}};
  for (auto [world, gas] : splits) {
    const double d = rel_diff(train_split(world, gas, 4), base);
    BOOST_TEST_MESSAGE("cautious + NorMuon, world " << world << " gas " << gas
                                                    << " vs world 1 gas 1, 4 steps: " << d);
    BOOST_TEST(d <= 1e-6);
    worst = std::max(worst, d);
  }
  BOOST_TEST_MESSAGE("worst: " << worst);
}

BOOST_AUTO_TEST_CASE(a_skipped_step_leaves_the_row_moments_bit_identical) {
  const int world = 2;
  auto eng = make_engine(with_features(world, true, true));
  register_table(*eng, kTable, 3);
  for (int r = 0; r < world; ++r)
    reduce_ok(*eng, r, random_grads(kTable, 3, 1, r, 0));
  step_ok(*eng);
  std::vector<rank_state> before;
  bool any_moment = false;
  for (int r = 0; r < world; ++r) {
    before.push_back(snapshot_of(*eng, r));
    for (float v : before.back().row_moments)
      any_moment = any_moment || v != 0.0f;
  }
  BOOST_TEST(any_moment);  // the applied step wrote them
  for (int r = 0; r < world; ++r) {
    auto g = random_grads(kTable, 3, 2, r, 0);
    if (r == 1)
      g["attn"][5] = NAN;
    reduce_ok(*eng, r, g);
  }
  BOOST_TEST(step_ok(*eng).skipped);
  for (int r = 0; r < world; ++r) {
    auto after = snapshot_of(*eng, r);
    BOOST_TEST(!after.row_moments.empty());
    BOOST_TEST(same_bits(after.row_moments, before[r].row_moments), "row moments of rank " << r);
    BOOST_TEST(same_bits(after.params, before[r].params), "params of rank " << r);
    BOOST_TEST(same_bits(after.momentum, before[r].momentum), "momentum of rank " << r);
    BOOST_TEST(same_bits(after.exp_avg_sq, before[r].exp_avg_sq), "exp_avg_sq of rank " << r);
  }
}

namespace {

void train_range(engine& eng, int world, int first, int last) {
  for (int s = first; s <= last; ++s) {
    for (int r = 0; r < world; ++r)
      for (int k = 0; k < 2; ++k)
        reduce_ok(eng, r, integer_piece(s, world, 2, r, k));
    step_ok(eng);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(checkpoint_round_trip_keeps_the_row_moments_bit_for_bit) {
  scratch_dir dir;
  auto a = make_engine(with_features(4, true, true));
  register_table(*a, kTable, 4);
  train_range(*a, 4, 1, 3);
  BOOST_REQUIRE(!a->save_checkpoint(dir.path().string()));
  auto b = make_engine(with_features(4, true, true));
  register_table(*b, kTable, 4);
  auto info = b->load_checkpoint(dir.path().string());
  BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
  for (int r = 0; r < 4; ++r) {
    auto sa = snapshot_of(*a, r), sb = snapshot_of(*b, r);
    BOOST_TEST(same_bits(sa.row_moments, sb.row_moments), "row moments of rank " << r);
  }
  train_range(*a, 4, 4, 6);
  train_range(*b, 4, 4, 6);
  auto pa = params_of(*a), pb = params_of(*b);
  for (const auto& [name, v] : pa)
    BOOST_TEST(same_bits(v, pb.at(name)), name << " after the resumed steps");
  // read_state carries them too, and write_state puts them back.
  auto state = a->read_state();
  BOOST_REQUIRE(state);
  size_t with_rows = 0;
  for (const auto& ps : state->params)
    with_rows += ps.row_moments.empty() ? 0 : 1;
  BOOST_TEST(with_rows == 3u);  // the three Muon matrices
  auto c = make_engine(with_features(2, true, true));
  register_table(*c, kTable, 4);
  BOOST_REQUIRE(!c->write_state(*state));
  auto back = c->read_state();
  BOOST_REQUIRE(back);
  for (size_t j = 0; j < state->params.size(); ++j)
    BOOST_TEST(same_bits(back->params[j].row_moments, state->params[j].row_moments));
}

BOOST_AUTO_TEST_CASE(resharding_4_to_2_resumes_as_an_uninterrupted_run) {
  scratch_dir dir;
  auto a = make_engine(with_features(4, true, true));
  register_table(*a, kTable, 6);
  train_range(*a, 4, 1, 3);
  BOOST_REQUIRE(!a->save_checkpoint(dir.path().string()));
  train_range(*a, 4, 4, 6);
  const auto uninterrupted = params_of(*a);

  auto b = make_engine(with_features(2, true, true));
  register_table(*b, kTable, 6);
  auto info = b->load_checkpoint(dir.path().string());
  BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
  auto loaded = b->read_state();
  BOOST_REQUIRE(loaded);
  // Continue at world 2 with the same gradients (integer pieces: every split sums exactly).
  auto resume = [](engine& eng) {
    for (int s = 4; s <= 6; ++s) {
      for (int r = 0; r < 2; ++r)
        for (int k = 0; k < 4; ++k)
          reduce_ok(eng, r, integer_piece(s, 2, 4, r, k));
      step_ok(eng);
    }
  };
  resume(*b);
  const double d = rel_diff(params_of(*b), uninterrupted);
  // The same resume with the row moments dropped (zeros): the check can fail.
  for (auto& ps : loaded->params)
    ps.row_moments.clear();
  auto c = make_engine(with_features(2, true, true));
  register_table(*c, kTable, 6);
  BOOST_REQUIRE(!c->write_state(*loaded));
  resume(*c);
  const double d_dropped = rel_diff(params_of(*c), uninterrupted);
  BOOST_TEST_MESSAGE("saved at world 4 after 3 steps, resumed at world 2 for 3: vs uninterrupted "
                     << d << "; with the row moments dropped " << d_dropped);
  BOOST_TEST(d <= 1e-6);
  BOOST_TEST(d_dropped >= 1e-4);
}

namespace {

/// The violations `zmuon-trace check` finds in the traces of `dir`, formatted.
std::vector<std::string> violations_in(const std::string& dir) {
  auto ts = trace_tool::read_traces(dir);
  BOOST_REQUIRE_MESSAGE(ts, (ts ? "" : ts.err().to_string()));
  std::vector<std::string> out;
  for (const auto& v : trace_tool::check(*ts))
    out.push_back(trace_tool::format(*ts, v));
  return out;
}

}  // namespace

// NorMuon's row-moment writes are messages in the trace (normuon_step to the store): in every
// applied step, none in the skipped one, and `zmuon-trace check` flags one placed there.
BOOST_AUTO_TEST_CASE(trace_shows_row_moment_writes_and_check_flags_one_in_a_skipped_step) {
  namespace fs = std::filesystem;
  const std::string dir = "test_cautious_normuon_trace";
  fs::remove_all(dir);
  const int world = 2, steps = 3, bad_step = 2;
  {
    auto o = with_features(world, true, true);
    o.trace_dir = dir;
    auto eng = make_engine(o);
    register_table(*eng, kTable, 8);
    for (int s = 1; s <= steps; ++s) {
      for (int r = 0; r < world; ++r) {
        auto g = random_grads(kTable, 8, s, r, 0);
        if (s == bad_step && r == 0)
          g["wide"][3] = NAN;
        reduce_ok(*eng, r, g);
      }
      BOOST_REQUIRE(step_ok(*eng).skipped == (s == bad_step));
    }
  }
  auto clean = violations_in(dir);
  for (const auto& v : clean)
    BOOST_TEST_MESSAGE(v);
  BOOST_TEST(clean.empty());
  std::map<int, int> writes;  // step -> normuon_step received, all ranks
  for (int r = 0; r < world; ++r)
    for (const auto& rec : read_jsonl(trace_file(dir, r)))
      if (rec.value("ev", "") == "recv" && rec.value("type", "") == "normuon_step")
        ++writes[rec["step"].get<int>()];
  BOOST_TEST_MESSAGE("normuon_step messages per step: 1: " << writes[1] << ", 2 (skipped): "
                                                           << writes[2] << ", 3: " << writes[3]);
  BOOST_TEST(writes[1] > 0);
  BOOST_TEST(writes[bad_step] == 0);
  BOOST_TEST(writes[3] == writes[1]);

  auto recs = read_jsonl(trace_file(dir, 0));
  int64_t report = -1;
  for (const auto& rec : recs)
    if (rec.value("ev", "") == "reply" && rec.value("type", "") == "overflow_report"
        && rec["step"] == bad_step)
      report = rec["t"];
  BOOST_REQUIRE(report > 0);
  recs.push_back({{"seq", 1000000},
                  {"ev", "recv"},
                  {"t", report + 5000},
                  {"actor", "partition_store"},
                  {"dur", 100},
                  {"type", "normuon_step"},
                  {"step", bad_step},
                  {"index", 0},
                  {"bytes", 256},
                  {"id", "r999.1"}});
  {
    std::ofstream f(trace_file(dir, 0), std::ios::trunc);
    for (const auto& rec : recs)
      f << rec.dump() << "\n";
  }
  auto found = violations_in(dir);
  BOOST_REQUIRE_EQUAL(found.size(), 1u);
  BOOST_TEST_MESSAGE(found[0]);
  BOOST_TEST(found[0].find("[normuon] rank 0, step 2: NorMuon row-moment write (normuon_step, "
                           "chunk 0) on skipped step 2")
             != std::string::npos);
  fs::remove_all(dir);
}

// Per hyperparameter group: a group with both rules steps its parameters as an engine with the
// rules on for all, the other group as one with them off, bit for bit.
BOOST_AUTO_TEST_CASE(each_group_steps_with_its_own_rule) {
  auto run = [](bool cautious, bool normuon, bool mixed) {
    auto eng = make_engine(with_features(2, cautious, normuon));
    std::vector<param_spec> table = kTable;
    if (mixed) {
      for (auto& s : table)
        s.hparam_group = (s.name == "wide" || s.name == "bias") ? 1 : 0;
    }
    register_table(*eng, table, 12);
    if (mixed) {
      group_hparams on{with_features(2, true, true).muon, with_features(2, true, true).adamw};
      BOOST_REQUIRE(!eng->set_group_hparams(1, on));
      group_hparams bad = on;
      bad.muon.normuon_beta2 = 1.5f;
      const auto err = eng->set_group_hparams(1, bad);
      BOOST_TEST(err.message().find("normuon_beta2 must be in [0, 1)") != std::string::npos,
                 err.message());
    }
    for (int s = 1; s <= 3; ++s) {
      for (int r = 0; r < 2; ++r)
        reduce_ok(*eng, r, random_grads(kTable, 12, s, r, 0));
      step_ok(*eng);
    }
    return params_of(*eng);
  };
  const auto on = run(true, true, false), off = run(false, false, false);
  const auto mixed = run(false, false, true);
  BOOST_TEST(same_bits(mixed.at("wide"), on.at("wide")));
  BOOST_TEST(same_bits(mixed.at("bias"), on.at("bias")));
  BOOST_TEST(same_bits(mixed.at("tall"), off.at("tall")));
  BOOST_TEST(same_bits(mixed.at("attn"), off.at("attn")));
  BOOST_TEST(rel_diff(on.at("wide"), off.at("wide")) > 1e-3);
}

// Under bf16 transport the owner normalizes NS's bf16 output through an fp32 copy and the
// stores widen the update for the cautious decay. NorMuon stays as close to the fp32 transport
// as plain Muon does (within 3x). Cautious decay is a step function of sign(p * o): where |o|
// is below its bf16 rounding the decision may flip, and with this test's large decay (10% a
// step) such elements move by 0.1 * p. That alone makes the gap ~1e-2 (bound 3e-2).
BOOST_AUTO_TEST_CASE(bf16_transport_follows_fp32_with_both_on) {
  auto run = [](bool cautious, bool normuon, muon_transport transport) {
    auto o = with_features(2, cautious, normuon);
    o.muon.transport = transport;
    auto eng = make_engine(o);
    register_table(*eng, kTable, 13);
    for (int s = 1; s <= 3; ++s) {
      for (int r = 0; r < 2; ++r)
        reduce_ok(*eng, r, random_grads(kTable, 13, s, r, 0));
      step_ok(*eng);
    }
    return std::make_pair(params_of(*eng), snapshot_of(*eng, 0).row_moments);
  };
  auto gap = [&](bool cautious, bool normuon) {
    return rel_diff(run(cautious, normuon, muon_transport::bf16).first,
                    run(cautious, normuon, muon_transport::fp32).first);
  };
  const double plain = gap(false, false), normuon = gap(false, true), both = gap(true, true);
  const double rows = rel_diff(run(true, true, muon_transport::bf16).second,
                               run(true, true, muon_transport::fp32).second);
  BOOST_TEST_MESSAGE("bf16 vs fp32 transport, 3 steps: plain Muon "
                     << plain << ", NorMuon " << normuon << ", both " << both << "; row moments "
                     << rows);
  BOOST_TEST(normuon > 0.0);  // the bf16 path ran
  BOOST_TEST(normuon <= 3 * plain);
  BOOST_TEST(both <= 3e-2);
  BOOST_TEST(rows <= 1e-2);
}
