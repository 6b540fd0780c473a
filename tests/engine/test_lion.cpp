// Lion (arXiv:2302.06675, Dion's scalar_opts.lion_update) as a group's non-Muon rule, end to end
// through the engine (real actors, caf comm, host backend): the weights against a double
// precision Lion written here, per hyperparameter group beside AdamW, and the Muon parameters
// untouched by the choice.
#define BOOST_TEST_MODULE lion
#include "support/engine_fixture.hpp"

#include <cmath>
#include <map>

using namespace zmuon;
using namespace zmuon::test;

namespace {

// Two Muon matrices and three non-Muon parameters (a bias, a gain, an embedding).
const std::vector<param_spec> kTable{{"wide", {12, 20}},
                                     {"tall", {24, 9}},
                                     {"bias", {20}},
                                     {"gain", {9}},
                                     {"embed", {16, 6}, param_group::adamw}};

const std::vector<std::string> kScalars{"bias", "gain", "embed"};

/// Lion in double, one element at a time: u = sign(beta1*m + (1-beta1)*g), m = beta2*m +
/// (1-beta2)*g, p = p*(1 - lr*wd) - lr*u (torch's sign: 0 at 0); cautious: the decay only
/// where p * u >= 0.
struct lion_reference {
  explicit lion_reference(const adamw_options& a)
      : lr(a.lr),
        beta1(a.beta1),
        beta2(a.beta2),
        wd(a.weight_decay),
        cautious(a.cautious_weight_decay) {}
  double lr, beta1, beta2, wd;
  bool cautious = false;
  std::map<std::string, std::vector<double>> p, m;

  void step(const std::map<std::string, std::vector<double>>& grads) {
    for (auto& [name, pv] : p) {
      const auto& g = grads.at(name);
      auto& mv = m[name];
      mv.resize(pv.size(), 0.0);
      for (size_t i = 0; i < pv.size(); ++i) {
        const double c = beta1 * mv[i] + (1 - beta1) * g[i];
        const double u = (c > 0) - (c < 0);
        mv[i] = beta2 * mv[i] + (1 - beta2) * g[i];
        const bool decays = !cautious || pv[i] * u >= 0;
        pv[i] = (decays ? pv[i] * (1 - lr * wd) : pv[i]) - lr * u;
      }
    }
  }
};

engine_options lion_options(int world, bool cautious) {
  engine_options o = options(world);
  o.muon.ns.variant = ns_variant::standard;
  o.muon.transport = muon_transport::fp32;
  o.adamw.algorithm = scalar_algorithm::lion;
  o.adamw.lr = 0.003f;
  o.adamw.beta1 = 0.9f;
  o.adamw.beta2 = 0.99f;
  o.adamw.weight_decay = 0.5f;  // large, so that the decay shows
  o.adamw.cautious_weight_decay = cautious;
  return o;
}

struct run_result {
  tensor_map engine, reference;  // the non-Muon weights
  tensor_map muon;               // the Muon weights
};

/// `steps` steps at `world` (one micro-batch a rank): the engine's weights and the reference's.
run_result run(const engine_options& o, int steps) {
  auto eng = make_engine(o);
  register_table(*eng, kTable, 7);
  const tensor_map init = params_of(*eng);
  lion_reference ref(o.adamw);
  for (const auto& name : kScalars)
    ref.p[name].assign(init.at(name).begin(), init.at(name).end());
  for (int s = 1; s <= steps; ++s) {
    const auto mean = reduce_random_mean(*eng, kTable, 7, s, o.world);
    BOOST_REQUIRE(!step_ok(*eng).skipped);
    ref.step(mean);
  }
  run_result out;
  const tensor_map all = params_of(*eng);
  for (const auto& name : kScalars) {
    out.engine[name] = all.at(name);
    out.reference[name] = std::vector<float>(ref.p[name].begin(), ref.p[name].end());
  }
  for (const auto& name : {"wide", "tall"})
    out.muon[name] = all.at(name);
  return out;
}

}  // namespace

// The engine's Lion against the double reference: the update is +-lr exactly, so the gap is
// float32 rounding of p (about 1e-7 relative a step); a sign that came out differently would
// move an element by 2*lr, 1e-2 relative to these weights (a hundred thousand times the bound).
BOOST_AUTO_TEST_CASE(lion_matches_a_double_precision_reference) {
  for (int world : {1, 2}) {
    for (bool cautious : {false, true}) {
      const auto r = run(lion_options(world, cautious), 4);
      const double d = rel_diff(r.engine, r.reference);
      BOOST_TEST_MESSAGE("Lion, world " << world << ", cautious " << cautious
                                        << ", 4 steps: engine vs double reference " << d);
      BOOST_TEST(d <= 1e-6);
    }
  }
}

// Lion reads its group's lr, betas and weight decay: another beta1 changes the weights, and
// AdamW with the same values gives other weights; the Muon parameters do not see the choice.
BOOST_AUTO_TEST_CASE(the_rule_changes_only_the_non_muon_parameters) {
  const auto lion = run(lion_options(2, false), 3);
  auto other = lion_options(2, false);
  other.adamw.beta1 = 0.5f;
  const auto lion_b1 = run(other, 3);
  auto adamw = lion_options(2, false);
  adamw.adamw.algorithm = scalar_algorithm::adamw;
  const auto adam = run(adamw, 3);
  BOOST_TEST(rel_diff(lion.engine, adam.engine) > 1e-3);
  BOOST_TEST(rel_diff(lion.engine, lion_b1.engine) > 1e-4);
  BOOST_TEST(rel_diff(lion_b1.engine, lion_b1.reference) <= 1e-6);
  for (const auto& name : {"wide", "tall"})
    BOOST_TEST(same_bits(lion.muon.at(name), adam.muon.at(name)), name);
}

// One engine, two groups: group 1 (bias, embed) runs Lion, group 0 (gain) AdamW; each steps its
// parameters as an engine running its rule for all, bit for bit.
BOOST_AUTO_TEST_CASE(each_group_steps_with_its_own_algorithm) {
  auto steps = [](engine& eng) {
    for (int s = 1; s <= 3; ++s) {
      for (int r = 0; r < 2; ++r)
        reduce_ok(eng, r, random_grads(kTable, 7, s, r, 0));
      step_ok(eng);
    }
    return params_of(eng);
  };
  auto adamw_opts = lion_options(2, false);
  adamw_opts.adamw.algorithm = scalar_algorithm::adamw;
  auto all_lion = make_engine(lion_options(2, false));
  register_table(*all_lion, kTable, 7);
  auto all_adamw = make_engine(adamw_opts);
  register_table(*all_adamw, kTable, 7);
  auto mixed = make_engine(adamw_opts);
  std::vector<param_spec> table = kTable;
  for (auto& s : table)
    s.hparam_group = (s.name == "bias" || s.name == "embed") ? 1 : 0;
  register_table(*mixed, table, 7);
  group_hparams lion{adamw_opts.muon, lion_options(2, false).adamw};
  BOOST_REQUIRE(!mixed->set_group_hparams(1, lion));
  const auto l = steps(*all_lion), a = steps(*all_adamw), m = steps(*mixed);
  BOOST_TEST(same_bits(m.at("bias"), l.at("bias")));
  BOOST_TEST(same_bits(m.at("embed"), l.at("embed")));
  BOOST_TEST(same_bits(m.at("gain"), a.at("gain")));
  BOOST_TEST(rel_diff(l.at("gain"), a.at("gain")) > 1e-3);
}
