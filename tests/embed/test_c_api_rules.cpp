// The update rules through the C ABI: zmuon_engine_set_group_rule (cautious weight decay,
// NorMuon) gives the weights of the C++ engine with the same options, bit for bit; NorMuon's row
// moments read out (zmuon_engine_read_row_moments) and back in (zmuon_engine_write_state_rows);
// bad rules and row-moment entries are errors naming what is wrong, and change nothing.
#define BOOST_TEST_MODULE c_api_rules
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "zmuon/engine.hpp"
#include "zmuon/zmuon.h"

namespace {

struct spec {
  const char* name;
  std::vector<int64_t> shape;
};
const std::vector<spec> kTable{{"w", {8, 12}}, {"v", {12, 6}}, {"b", {12}}};

int64_t numel_of(const spec& s) {
  int64_t n = 1;
  for (int64_t d : s.shape)
    n *= d;
  return n;
}

std::vector<float> values(const spec& s, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(numel_of(s)));
  for (auto& x : v)
    x = dist(gen);
  return v;
}

void ok(int status) {
  BOOST_REQUIRE_MESSAGE(status == ZMUON_OK, zmuon_status_name(status)
                                                << ": " << zmuon_last_error());
}

const char* kConfig =
    R"({"optimizer": {"params": {"muon_lr": 0.05, "adam_lr": 0.01, "weight_decay": 1.5,
                                 "ns_variant": "standard"}},
        "zmuon": {"ranks": 2, "muon_transport": "fp32"}})";

zmuon_group_hparams group_values() {
  zmuon_group_hparams g{};
  g.lr = 0.05f;
  g.weight_decay = 1.5f;
  g.momentum = 0.95f;
  g.nesterov = 1;
  g.beta1 = 0.9f;
  g.beta2 = 0.95f;
  g.eps = 1e-10f;
  g.ns_steps = 5;
  g.ns_coefficients[0] = 3.4445f;
  g.ns_coefficients[1] = -4.7750f;
  g.ns_coefficients[2] = 2.0315f;
  g.ns_eps = 1e-7f;
  g.ns_variant = ZMUON_NS_STANDARD;
  g.adjust_lr = ZMUON_ADJUST_LR_ORIGINAL;
  return g;
}

zmuon_update_rule both_rules() {
  return zmuon_update_rule{1, ZMUON_VARIANT_NORMUON, 0.9f, 1e-8f, ZMUON_ALGORITHM_ADAMW};
}

/// Two steps through the C ABI with the group rule set; the weights, in table order.
std::vector<float> run_c(zmuon_engine** keep = nullptr) {
  zmuon_engine* eng = nullptr;
  ok(zmuon_engine_create(kConfig, nullptr, 0, &eng));
  for (size_t p = 0; p < kTable.size(); ++p) {
    auto init = values(kTable[p], 10 + p, 0.2f);
    ok(zmuon_engine_add_parameter(eng, kTable[p].name, kTable[p].shape.data(),
                                  static_cast<int32_t>(kTable[p].shape.size()), ZMUON_GROUP_AUTO, 0,
                                  init.data(), numel_of(kTable[p])));
  }
  const zmuon_group_hparams g = group_values();
  const zmuon_update_rule rule = both_rules();
  ok(zmuon_engine_set_group_rule(eng, 0, &g, &rule));
  for (int s = 1; s <= 2; ++s) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::vector<float>> grads;
      std::vector<zmuon_tensor> t;
      for (size_t p = 0; p < kTable.size(); ++p)
        grads.push_back(values(kTable[p], 100 * s + 10 * r + p, 1.0f));
      for (size_t p = 0; p < kTable.size(); ++p)
        t.push_back(zmuon_tensor{kTable[p].name, grads[p].data(), numel_of(kTable[p]), ZMUON_HOST});
      ok(zmuon_engine_reduce(eng, r, t.data(), t.size()));
    }
    ok(zmuon_engine_step(eng, nullptr));
  }
  std::vector<std::vector<float>> out(kTable.size());
  std::vector<zmuon_tensor> t;
  for (size_t p = 0; p < kTable.size(); ++p) {
    out[p].resize(static_cast<size_t>(numel_of(kTable[p])));
    t.push_back(zmuon_tensor{kTable[p].name, out[p].data(), numel_of(kTable[p]), ZMUON_HOST});
  }
  ok(zmuon_engine_gather_params(eng, t.data(), t.size()));
  if (keep)
    *keep = eng;
  else
    zmuon_engine_destroy(eng);
  std::vector<float> flat;
  for (const auto& v : out)
    flat.insert(flat.end(), v.begin(), v.end());
  return flat;
}

/// The same job through the C++ API with the rules in engine_options.
std::vector<float> run_cpp() {
  zmuon::engine_options o;
  o.world = 2;
  o.muon.lr = 0.05f;
  o.adamw.lr = 0.05f;  // the group's lr is both algorithms'
  o.muon.weight_decay = o.adamw.weight_decay = 1.5f;
  o.muon.ns.variant = zmuon::ns_variant::standard;
  o.muon.transport = zmuon::muon_transport::fp32;
  o.muon.cautious_weight_decay = o.adamw.cautious_weight_decay = true;
  o.muon.variant = zmuon::muon_variant::normuon;
  o.muon.normuon_beta2 = 0.9f;
  auto eng = zmuon::engine::create(o);
  BOOST_REQUIRE_MESSAGE(eng, (eng ? "" : eng.err().to_string()));
  for (size_t p = 0; p < kTable.size(); ++p)
    BOOST_REQUIRE(
        !(*eng)->add_parameter({kTable[p].name, kTable[p].shape}, values(kTable[p], 10 + p, 0.2f)));
  for (int s = 1; s <= 2; ++s) {
    for (int r = 0; r < 2; ++r) {
      zmuon::tensor_map g;
      for (size_t p = 0; p < kTable.size(); ++p)
        g[kTable[p].name] = values(kTable[p], 100 * s + 10 * r + p, 1.0f);
      BOOST_REQUIRE(!(*eng)->reduce(r, g));
    }
    BOOST_REQUIRE((*eng)->step());
  }
  auto params = (*eng)->parameters();
  BOOST_REQUIRE(params);
  std::vector<float> flat;
  for (const auto& s : kTable)
    flat.insert(flat.end(), (*params)[s.name].begin(), (*params)[s.name].end());
  return flat;
}

}  // namespace

BOOST_AUTO_TEST_CASE(group_rule_through_c_matches_cpp_options_bit_for_bit) {
  const auto from_c = run_c();
  const auto from_cpp = run_cpp();
  BOOST_REQUIRE_EQUAL(from_c.size(), from_cpp.size());
  BOOST_TEST(std::memcmp(from_c.data(), from_cpp.data(), from_c.size() * sizeof(float)) == 0);
}

BOOST_AUTO_TEST_CASE(row_moments_read_out_and_written_back) {
  zmuon_engine* a = nullptr;
  run_c(&a);
  std::vector<float> w_rows(8, -1.0f), v_rows(12, -1.0f);
  std::vector<zmuon_row_moments> rows{{"w", w_rows.data(), 8}, {"v", v_rows.data(), 12}};
  ok(zmuon_engine_read_row_moments(a, rows.data(), rows.size()));
  double sum = 0;
  for (float x : w_rows)
    sum += x;
  BOOST_TEST(sum > 0.0);  // written by the NorMuon steps (means of squares)

  // Bad entries: named, nothing written.
  std::vector<float> untouched(8, -1.0f);
  zmuon_row_moments wrong{"w", untouched.data(), 7};
  BOOST_TEST(zmuon_engine_read_row_moments(a, &wrong, 1) == ZMUON_SHAPE_MISMATCH);
  BOOST_TEST(std::string(zmuon_last_error()).find("'w' has 8 row moments") != std::string::npos,
             zmuon_last_error());
  zmuon_row_moments bias{"b", untouched.data(), 12};
  BOOST_TEST(zmuon_engine_read_row_moments(a, &bias, 1) == ZMUON_INVALID_ARGUMENT);
  zmuon_row_moments nobody{"x", untouched.data(), 8};
  BOOST_TEST(zmuon_engine_read_row_moments(a, &nobody, 1) == ZMUON_UNKNOWN_PARAMETER);
  BOOST_TEST(untouched == std::vector<float>(8, -1.0f));
  zmuon_update_rule bad_rule = both_rules();
  bad_rule.variant = 7;
  const zmuon_group_hparams g = group_values();
  BOOST_TEST(zmuon_engine_set_group_rule(a, 0, &g, &bad_rule) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::string(zmuon_last_error()).find("variant must be 0 (muon) or 1 (normuon)")
             != std::string::npos);
  bad_rule = both_rules();
  bad_rule.normuon_beta2 = 1.0f;
  BOOST_TEST(zmuon_engine_set_group_rule(a, 0, &g, &bad_rule) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::string(zmuon_last_error()).find("normuon_beta2") != std::string::npos);
  bad_rule = both_rules();
  bad_rule.algorithm = 9;
  BOOST_TEST(zmuon_engine_set_group_rule(a, 0, &g, &bad_rule) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::string(zmuon_last_error()).find("algorithm must be in [0, 2)")
             != std::string::npos);

  // The whole state into a fresh engine with the row moments, then read back.
  std::vector<std::vector<float>> buf(kTable.size() * 4);
  std::vector<zmuon_param_state> st(kTable.size());
  for (size_t p = 0; p < kTable.size(); ++p) {
    const int64_t n = numel_of(kTable[p]);
    const bool muon = kTable[p].shape.size() == 2;
    for (size_t k = 0; k < 4; ++k)
      buf[p * 4 + k].resize(static_cast<size_t>(n));
    st[p] = zmuon_param_state{kTable[p].name,
                              0,
                              n,
                              buf[p * 4].data(),
                              muon ? buf[p * 4 + 1].data() : nullptr,
                              muon ? nullptr : buf[p * 4 + 2].data(),
                              muon ? nullptr : buf[p * 4 + 3].data(),
                              0};
  }
  zmuon_state_info info{};
  ok(zmuon_engine_read_state(a, ZMUON_STATE_FULL, st.data(), st.size(), &info));
  zmuon_engine* b = nullptr;
  ok(zmuon_engine_create(kConfig, nullptr, 0, &b));
  for (const auto& s : kTable) {
    std::vector<float> zeros(static_cast<size_t>(numel_of(s)), 0.0f);
    ok(zmuon_engine_add_parameter(b, s.name, s.shape.data(), static_cast<int32_t>(s.shape.size()),
                                  ZMUON_GROUP_AUTO, 0, zeros.data(), numel_of(s)));
  }
  zmuon_row_moments too_long{"w", w_rows.data(), 9};
  BOOST_TEST(zmuon_engine_write_state_rows(b, st.data(), st.size(), &info, &too_long, 1)
             == ZMUON_SHAPE_MISMATCH);
  ok(zmuon_engine_write_state_rows(b, st.data(), st.size(), &info, rows.data(), rows.size()));
  std::vector<float> w_back(8), v_back(12);
  std::vector<zmuon_row_moments> back{{"w", w_back.data(), 8}, {"v", v_back.data(), 12}};
  ok(zmuon_engine_read_row_moments(b, back.data(), back.size()));
  BOOST_TEST(w_back == w_rows);
  BOOST_TEST(v_back == v_rows);
  zmuon_engine_destroy(b);
  zmuon_engine_destroy(a);
}
