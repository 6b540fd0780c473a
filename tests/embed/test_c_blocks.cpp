// The C ABI of Muon's blocks, box orders and MuonClip (zmuon_engine_set_muon_blocks,
// zmuon_engine_set_box_order, zmuon_engine_add_qk_clip, zmuon_engine_report_qk_logits, the
// adjust_lr names and qk_clip_tau): a job through the C ABI
// gives the same parameters, bit for bit, as the same job through the C++ API, and wrong calls
// return their status. Links only the shared libzmuon.
#define BOOST_TEST_MODULE c_blocks
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "zmuon/engine.hpp"
#include "zmuon/zmuon.h"

namespace {

struct param {
  std::string name;
  std::vector<int64_t> shape;
};

const std::vector<param> kTable{
    {"experts", {4, 8, 12}}, {"qkv", {24, 12}}, {"q", {8, 12}}, {"k", {4, 12}}, {"rows", {8, 12}}};

// "rows" held as four [4, 6] boxes, out of order: (row0, rows, col0, cols) each.
const int64_t kBoxes[] = {4, 4, 6, 6, 0, 4, 0, 6, 0, 4, 6, 6, 4, 4, 0, 6};

int64_t numel(const param& p) {
  int64_t n = 1;
  for (auto d : p.shape)
    n *= d;
  return n;
}

// Small integers over 8: exact in float, different per parameter, rank, step and element.
std::vector<float> values(size_t p, int rank, int step, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(((i * 7 + p * 5 + rank * 3 + step * 11) % 17) - 8) / 8.0f;
  return v;
}

const char* kConfig = R"({"zmuon": {"ranks": 2, "muon_transport": "fp32"},
  "optimizer": {"type": "Muon", "params": {"lr": 0.02, "ns_variant": "standard",
  "adjust_lr": "spectral", "qk_clip_tau": 0.5}}})";

std::vector<float> logits(int rank, int step) {
  return {0.1f * step, 0.9f + rank, 0.2f, 0.4f + 0.3f * rank};  // heads 1 and 3 pass tau
}

std::map<std::string, std::vector<float>> run_c() {
  zmuon_engine* eng = nullptr;
  BOOST_REQUIRE_EQUAL(zmuon_engine_create(kConfig, nullptr, 0, &eng), ZMUON_OK);
  for (size_t p = 0; p < kTable.size(); ++p) {
    auto init = values(p, 9, 0, numel(kTable[p]));
    BOOST_REQUIRE_EQUAL(
        zmuon_engine_add_parameter(eng, kTable[p].name.c_str(), kTable[p].shape.data(),
                                   static_cast<int32_t>(kTable[p].shape.size()), ZMUON_GROUP_AUTO,
                                   0, init.data(), numel(kTable[p])),
        ZMUON_OK);
  }
  const int64_t sizes[] = {12, 4, 8}, heads[] = {2, 1, 0};
  BOOST_REQUIRE_EQUAL(zmuon_engine_set_muon_blocks(eng, "qkv", sizes, heads, 3, ZMUON_VIEW_AUTO),
                      ZMUON_OK);
  BOOST_REQUIRE_EQUAL(zmuon_engine_add_qk_clip(eng, "q", "k", 4, 2), ZMUON_OK);
  BOOST_REQUIRE_EQUAL(zmuon_engine_set_box_order(eng, "rows", kBoxes, 4), ZMUON_OK);
  for (int step = 1; step <= 2; ++step) {
    for (int r = 0; r < 2; ++r) {
      std::vector<std::vector<float>> g;
      std::vector<zmuon_tensor> t;
      for (size_t p = 0; p < kTable.size(); ++p)
        g.push_back(values(p, r, step, numel(kTable[p])));
      for (size_t p = 0; p < kTable.size(); ++p)
        t.push_back({kTable[p].name.c_str(), g[p].data(), numel(kTable[p]), ZMUON_HOST});
      BOOST_REQUIRE_EQUAL(zmuon_engine_reduce(eng, r, t.data(), t.size()), ZMUON_OK);
      auto l = logits(r, step);
      BOOST_REQUIRE_EQUAL(zmuon_engine_report_qk_logits(eng, r, "q", l.data(), l.size()), ZMUON_OK);
    }
    BOOST_REQUIRE_EQUAL(zmuon_engine_step(eng, nullptr), ZMUON_OK);
  }
  std::map<std::string, std::vector<float>> out;
  std::vector<zmuon_tensor> t;
  for (const auto& p : kTable)
    out[p.name].resize(static_cast<size_t>(numel(p)));
  for (const auto& p : kTable)
    t.push_back({p.name.c_str(), out[p.name].data(), numel(p), ZMUON_HOST});
  BOOST_REQUIRE_EQUAL(zmuon_engine_gather_params(eng, t.data(), t.size()), ZMUON_OK);
  zmuon_engine_destroy(eng);
  return out;
}

std::map<std::string, std::vector<float>> run_cpp(bool blocks) {
  auto made = zmuon::engine::create_from_json(kConfig);
  BOOST_REQUIRE(made);
  auto& eng = **made;
  for (size_t p = 0; p < kTable.size(); ++p) {
    zmuon::param_spec spec{kTable[p].name, kTable[p].shape};
    if (blocks && spec.name == "qkv") {
      spec.split_sizes = {12, 4, 8};
      spec.split_heads = {2, 1, 0};
    }
    if (blocks && spec.name == "rows")
      for (int k = 0; k < 4; ++k)
        spec.boxes.push_back(
            {kBoxes[4 * k], kBoxes[4 * k + 1], kBoxes[4 * k + 2], kBoxes[4 * k + 3]});
    BOOST_REQUIRE(!eng.add_parameter(spec, values(p, 9, 0, numel(kTable[p]))));
  }
  BOOST_REQUIRE(!eng.add_qk_clip("q", "k", 4, 2));
  for (int step = 1; step <= 2; ++step) {
    for (int r = 0; r < 2; ++r) {
      zmuon::tensor_map g;
      for (size_t p = 0; p < kTable.size(); ++p)
        g[kTable[p].name] = values(p, r, step, numel(kTable[p]));
      BOOST_REQUIRE(!eng.reduce(r, g));
      BOOST_REQUIRE(!eng.report_qk_logits(r, "q", logits(r, step)));
    }
    BOOST_REQUIRE(eng.step());
  }
  auto params = eng.parameters();
  BOOST_REQUIRE(params);
  return {params->begin(), params->end()};
}

}  // namespace

BOOST_AUTO_TEST_CASE(c_job_with_blocks_and_clip_matches_the_cpp_job_bit_for_bit) {
  auto c = run_c();
  auto cpp = run_cpp(true);
  for (const auto& p : kTable) {
    BOOST_TEST_INFO(p.name);
    BOOST_TEST(c[p.name] == cpp[p.name], boost::test_tools::per_element());
  }
  // The split and the boxes change the result (so the C calls reached the plan).
  auto whole = run_cpp(false);
  BOOST_TEST(whole["qkv"] != cpp["qkv"]);
  BOOST_TEST(whole["rows"] != cpp["rows"]);
}

BOOST_AUTO_TEST_CASE(wrong_block_and_clip_calls_return_their_status) {
  zmuon_engine* eng = nullptr;
  BOOST_REQUIRE_EQUAL(zmuon_engine_create(kConfig, nullptr, 0, &eng), ZMUON_OK);
  const int64_t shape[] = {24, 12};
  BOOST_REQUIRE_EQUAL(
      zmuon_engine_add_parameter(eng, "qkv", shape, 2, ZMUON_GROUP_AUTO, 0, nullptr, 0), ZMUON_OK);
  const int64_t bad[] = {12, 4, 4};  // sums to 20, not 24
  BOOST_TEST(zmuon_engine_set_muon_blocks(eng, "qkv", bad, nullptr, 3, ZMUON_VIEW_AUTO)
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::string(zmuon_last_error()).find("sum to 20") != std::string::npos);
  BOOST_TEST(zmuon_engine_set_muon_blocks(eng, "qkv", nullptr, nullptr, 0, 7)
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(zmuon_engine_set_muon_blocks(eng, "nope", nullptr, nullptr, 0, ZMUON_VIEW_FLATTEN)
             == ZMUON_UNKNOWN_PARAMETER);
  BOOST_TEST(zmuon_engine_set_muon_blocks(eng, "qkv", nullptr, nullptr, 2, ZMUON_VIEW_AUTO)
             == ZMUON_INVALID_ARGUMENT);  // null split_sizes with n > 0
  BOOST_TEST(zmuon_engine_set_box_order(eng, "qkv", nullptr, 2) == ZMUON_INVALID_ARGUMENT);
  const int64_t overlapping[] = {0, 24, 0, 6, 0, 12, 3, 6, 12, 12, 6, 6};
  BOOST_TEST(zmuon_engine_set_box_order(eng, "qkv", overlapping, 3) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::string(zmuon_last_error()).find("overlap") != std::string::npos);
  BOOST_TEST(zmuon_engine_set_box_order(eng, "nope", kBoxes, 0) == ZMUON_UNKNOWN_PARAMETER);
  BOOST_TEST(zmuon_engine_add_qk_clip(eng, "qkv", nullptr, 2, 2) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(zmuon_engine_add_qk_clip(eng, "qkv", "nope", 2, 2) == ZMUON_UNKNOWN_PARAMETER);
  const float l[] = {1, 2};
  BOOST_TEST(zmuon_engine_report_qk_logits(eng, 0, "qkv", l, 2) == ZMUON_INVALID_ARGUMENT);
  zmuon_group_hparams h{};
  h.lr = 0.01f;
  h.momentum = 0.9f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.ns_steps = 5;
  h.ns_coefficients[0] = 3.4445f;
  h.ns_coefficients[1] = -4.7750f;
  h.ns_coefficients[2] = 2.0315f;
  h.adjust_lr = ZMUON_ADJUST_LR_RMS;
  h.qk_clip_tau = 2.0f;
  BOOST_TEST(zmuon_engine_set_group_hparams(eng, 0, &h) == ZMUON_OK);
  h.adjust_lr = 4;
  BOOST_TEST(zmuon_engine_set_group_hparams(eng, 0, &h) == ZMUON_INVALID_ARGUMENT);
  h.adjust_lr = ZMUON_ADJUST_LR_SPECTRAL;
  h.qk_clip_tau = -1.0f;
  BOOST_TEST(zmuon_engine_set_group_hparams(eng, 0, &h) == ZMUON_INVALID_ARGUMENT);
  zmuon_engine_destroy(eng);
}
