// Every update rule at once through the engine (real actors, caf comm, host backend, fp32
// transport, standard NS5): an expert stack, a fused QKV split by split_sizes with heads inside
// its blocks, a query/key pair under MuonClip, adjust_lr spectral, cautious weight decay (Muon
// and AdamW) and NorMuon. World 1/2/4 and gas 1/4 give the same weights, and a skipped
// (non-finite) step leaves every rank's state bit for bit as it was.
#define BOOST_TEST_MODULE all_rules
#include "support/engine_fixture.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

using namespace zmuon;
using namespace zmuon::test;

namespace {

param_spec fused_qkv() {
  param_spec qkv{"qkv", {40, 24}};
  qkv.split_sizes = {16, 8, 16};
  qkv.split_heads = {2, 1, 0};
  return qkv;
}

const std::vector<param_spec> kTable{{"experts", {4, 16, 24}}, fused_qkv(),     {"q", {32, 24}},
                                     {"k", {16, 24}},          {"o", {24, 32}}, {"bias", {24}}};

constexpr int kPieces = 16;  // gradient pieces of a step, split over ranks and micro-batches

engine_options all_rules(int world) {
  auto o = options(world);
  o.muon.ns = ns_options{};  // standard NS5
  o.muon.transport = muon_transport::fp32;
  o.muon.lr = 0.05f;
  o.muon.weight_decay = 0.5f;
  o.muon.adjust_lr = adjust_lr_rule::spectral;
  o.muon.cautious_weight_decay = true;
  o.muon.variant = muon_variant::normuon;
  o.muon.normuon_beta2 = 0.9f;
  o.muon.qk_clip_tau = 5.0f;
  o.adamw.lr = 0.01f;
  o.adamw.weight_decay = 0.5f;
  o.adamw.cautious_weight_decay = true;
  return o;
}

/// Rank `rank`'s micro-batch `micro` of step `step`: the mean of its share of the step's
/// integer-valued pieces (so that every split sums exactly), and the max of their query logits.
std::pair<tensor_map, std::vector<float>> micro_batch(int step, int world, int gas, int rank,
                                                      int micro) {
  const int share = kPieces / (world * gas);
  const int first = (rank * gas + micro) * share;
  tensor_map g;
  std::vector<float> logits(4, 0.0f);
  for (size_t t = 0; t < kTable.size(); ++t) {
    auto& v = g[kTable[t].name];
    v.assign(static_cast<size_t>(numel(kTable[t])), 0.0f);
    for (int k = first; k < first + share; ++k) {
      auto piece = random_values(static_cast<int64_t>(v.size()), (step * kPieces + k) * 11 + t, 3);
      for (size_t i = 0; i < v.size(); ++i)
        v[i] += std::round(piece[i]);
    }
    for (float& x : v)
      x /= static_cast<float>(share);  // a power of 2: exact
  }
  for (int k = first; k < first + share; ++k)  // heads 0 and 2 pass tau in some steps
    for (int h = 0; h < 4; ++h)
      logits[h] =
          std::max(logits[h], static_cast<float>(((k + h * 3 + step) % 7) * (h % 2 ? 0.5 : 1.2)));
  return {g, logits};
}

/// Hands over step `step` at world/gas; `poison` puts a NaN into the last rank's last micro-batch.
void hand_over(engine& eng, int step, int world, int gas, bool poison = false) {
  for (int r = 0; r < world; ++r)
    for (int k = 0; k < gas; ++k) {
      auto [g, logits] = micro_batch(step, world, gas, r, k);
      if (poison && r == world - 1 && k == gas - 1)
        g["experts"][7] = std::numeric_limits<float>::quiet_NaN();
      reduce_ok(eng, r, g);
      auto err = eng.report_qk_logits(r, "q", logits);
      BOOST_REQUIRE_MESSAGE(!err, err.to_string());
    }
}

std::unique_ptr<engine> make_all_rules(int world, float tau = 5.0f) {
  auto o = all_rules(world);
  o.muon.qk_clip_tau = tau;
  auto eng = make_engine(o);
  register_table(*eng, kTable, 23);
  auto err = eng->add_qk_clip("q", "k", 4, 2);
  BOOST_REQUIRE_MESSAGE(!err, err.to_string());
  return eng;
}

tensor_map train(int world, int gas, int steps, float tau = 5.0f) {
  auto eng = make_all_rules(world, tau);
  for (int s = 1; s <= steps; ++s) {
    hand_over(*eng, s, world, gas);
    BOOST_REQUIRE(!step_ok(*eng).skipped);
  }
  return params_of(*eng);
}

void same_state(const rank_state& a, const rank_state& b, int rank) {
  BOOST_TEST(same_bits(a.params, b.params), "params of rank " << rank);
  BOOST_TEST(same_bits(a.momentum, b.momentum), "momentum of rank " << rank);
  BOOST_TEST(same_bits(a.exp_avg, b.exp_avg), "exp_avg of rank " << rank);
  BOOST_TEST(same_bits(a.exp_avg_sq, b.exp_avg_sq), "exp_avg_sq of rank " << rank);
  BOOST_TEST(same_bits(a.row_moments, b.row_moments), "row moments of rank " << rank);
  BOOST_TEST(a.adam_steps == b.adam_steps);
  BOOST_TEST(a.adam_param_steps == b.adam_param_steps);
}

}  // namespace

BOOST_AUTO_TEST_CASE(world_1_2_4_and_gas_1_4_give_the_same_weights_with_every_rule_on) {
  const int steps = 4;
  const auto base = train(1, 1, steps);
  // The features act: plain Muon on the same gradients is far away.
  {
    auto o = options(1);
    o.muon.ns = ns_options{};
    o.muon.transport = muon_transport::fp32;
    o.muon.lr = 0.05f;
    o.adamw.lr = 0.01f;
    auto eng = make_engine(o);
    register_table(*eng, kTable, 23);
    for (int s = 1; s <= steps; ++s) {
      reduce_ok(*eng, 0, micro_batch(s, 1, 1, 0, 0).first);
      step_ok(*eng);
    }
    const double apart = rel_diff(params_of(*eng), base);
    BOOST_TEST_MESSAGE("every rule vs plain Muon + AdamW, " << steps << " steps: " << apart);
    BOOST_TEST(apart >= 1e-3);
  }
  // MuonClip acts: without it q ends elsewhere, while the experts, which it never touches, stay
  // bit for bit.
  const auto unclipped = train(1, 1, steps, 0.0f);
  const double clip_effect = rel_diff(unclipped.at("q"), base.at("q"));
  BOOST_TEST_MESSAGE("MuonClip on vs off, q after " << steps << " steps: " << clip_effect);
  BOOST_TEST(clip_effect >= 1e-3);
  BOOST_TEST(same_bits(unclipped.at("experts"), base.at("experts")));
  double worst = 0;
  for (auto [world, gas] :
       std::vector<std::pair<int, int>>{{1, 4}, {2, 1}, {2, 4}, {4, 1}, {4, 4}}) {
    const double d = rel_diff(train(world, gas, steps), base);
    BOOST_TEST_MESSAGE("every rule, world " << world << " gas " << gas << " vs world 1 gas 1, "
                                            << steps << " steps: " << d);
    BOOST_TEST(d <= 1e-6);
    worst = std::max(worst, d);
  }
  BOOST_TEST_MESSAGE("worst: " << worst);
}

BOOST_AUTO_TEST_CASE(a_skipped_step_leaves_every_state_bit_identical_with_every_rule_on) {
  for (int world : {1, 2, 4}) {
    const int gas = 4 / world;
    auto a = make_all_rules(world);
    auto b = make_all_rules(world);
    for (int s = 1; s <= 2; ++s) {
      hand_over(*a, s, world, gas);
      hand_over(*b, s, world, gas);
      step_ok(*a);
      step_ok(*b);
    }
    std::vector<rank_state> before;
    for (int r = 0; r < world; ++r)
      before.push_back(snapshot_of(*a, r));
    auto state_before = a->read_state();
    BOOST_REQUIRE(state_before);
    // Logits above tau and a NaN: nothing of the step may happen, the clip neither.
    hand_over(*a, 3, world, gas, /*poison=*/true);
    BOOST_TEST(step_ok(*a).skipped);
    for (int r = 0; r < world; ++r)
      same_state(snapshot_of(*a, r), before[r], r);
    auto state_after = a->read_state();
    BOOST_REQUIRE(state_after);
    for (size_t j = 0; j < kTable.size(); ++j)
      BOOST_TEST(
          same_bits(state_after->params[j].row_moments, state_before->params[j].row_moments));
    // The next clean step is the one a run without the skipped step takes, bit for bit.
    hand_over(*a, 3, world, gas);
    hand_over(*b, 3, world, gas);
    BOOST_TEST(!step_ok(*a).skipped);
    BOOST_TEST(!step_ok(*b).skipped);
    auto pa = params_of(*a), pb = params_of(*b);
    for (const auto& [name, v] : pa)
      BOOST_TEST(same_bits(v, pb.at(name)), name << " at world " << world << " after the skip");
    BOOST_TEST_MESSAGE("world " << world << " gas " << gas
                                << ": a skipped step changed no state bit; the next step equals "
                                   "the run without it");
  }
}
