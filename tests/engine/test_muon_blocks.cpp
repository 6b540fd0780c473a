// Muon on blocks of a parameter and MuonClip, end to end through the engine (real actors, caf
// comm, host backend, fp32 transport, standard NS5): expert stacks [E, rows, cols], fused
// matrices split by split_sizes (with heads inside a block), the adjust_lr rules, and the
// query/key clip of Kimi K2. Each is checked against a double-precision Muon written here.
#define BOOST_TEST_MODULE muon_blocks
#include "support/engine_fixture.hpp"

#include "plan/plan.hpp"
#include "zmuon-trace/check.hpp"
#include "zmuon-trace/reader.hpp"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>

using namespace zmuon;
using namespace zmuon::test;

namespace {

engine_options exact_options(int world) {
  auto o = options(world);
  o.muon.ns = ns_options{};  // standard NS5
  o.muon.transport = muon_transport::fp32;
  o.muon.weight_decay = 0.05f;
  return o;
}

// -- the reference: plain NS5, momentum and scale in double --------------------------------------

// NS5 (Keller Jordan's Muon: a, b, c = 3.4445, -4.7750, 2.0315) of one [rows, cols] matrix,
// iterated on the wide orientation.
std::vector<double> ns5(const std::vector<double>& g, int64_t rows, int64_t cols) {
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
  std::vector<double> x(m * n);
  double norm = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double v = g[i * cols + j];
      (tall ? x[j * n + i] : x[i * n + j]) = v;
      norm += v * v;
    }
  norm = std::sqrt(norm) + 1e-7;
  for (double& v : x)
    v /= norm;
  for (int it = 0; it < 5; ++it) {
    std::vector<double> a(m * m, 0), b(m * m, 0), next(m * n, 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < n; ++k)
          a[i * m + j] += x[i * n + k] * x[j * n + k];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) {
        double aa = 0;
        for (int64_t k = 0; k < m; ++k)
          aa += a[i * m + k] * a[k * m + j];
        b[i * m + j] = -4.7750 * a[i * m + j] + 2.0315 * aa;
      }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double bx = 0;
        for (int64_t k = 0; k < m; ++k)
          bx += b[i * m + k] * x[k * n + j];
        next[i * n + j] = 3.4445 * x[i * n + j] + bx;
      }
    x = next;
  }
  std::vector<double> out(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = tall ? x[j * n + i] : x[i * n + j];
  return out;
}

// The scale rules, from their sources (Keller Jordan's Muon; Moonlight arXiv:2502.16982 and
// Dion's adjust_lr_rms_norm; Dion's adjust_lr_spectral_norm).
double scale_of(adjust_lr_rule rule, double rows, double cols) {
  switch (rule) {
    case adjust_lr_rule::original:
      return std::sqrt(std::max(1.0, rows / cols));
    case adjust_lr_rule::match_rms_adamw:
    case adjust_lr_rule::rms:
      return 0.2 * std::sqrt(std::max(rows, cols));
    case adjust_lr_rule::spectral:
      return std::sqrt(rows / cols);
  }
  return 0;
}

// One NS matrix of a parameter: `rows` rows from row0 of its flat [*, cols] view.
struct ref_block {
  int64_t row0, rows;
};

// Muon in double on one parameter over `grads` (one mean gradient per step).
std::vector<double> reference_muon(const std::vector<float>& init,
                                   const std::vector<std::vector<double>>& grads,
                                   const std::vector<ref_block>& blocks, int64_t cols,
                                   const muon_options& mo) {
  std::vector<double> p(init.begin(), init.end()), m(p.size(), 0.0);
  const double beta = mo.momentum, lr = mo.lr, wd = mo.weight_decay;
  for (const auto& g : grads) {
    std::vector<double> u(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = beta * m[i] + (1 - beta) * g[i];
      u[i] = mo.nesterov ? (1 - beta) * g[i] + beta * m[i] : m[i];
    }
    for (size_t i = 0; i < p.size(); ++i)
      p[i] *= 1 - lr * wd;
    for (const auto& b : blocks) {
      std::vector<double> x(u.begin() + b.row0 * cols, u.begin() + (b.row0 + b.rows) * cols);
      auto o = ns5(x, b.rows, cols);
      const double s = scale_of(mo.adjust_lr, static_cast<double>(b.rows), cols);
      for (size_t i = 0; i < o.size(); ++i)
        p[b.row0 * cols + i] -= lr * s * o[i];
    }
  }
  return p;
}

// Hands over `steps` steps of random gradients (world ranks, gas micro-batches) and keeps the
// mean gradient of every parameter per step, in double.
std::map<std::string, std::vector<std::vector<double>>> run_steps(
    engine& eng, const std::vector<param_spec>& table, int world, int gas, int steps,
    uint64_t seed = 5, const std::function<void(int step)>& before_step = {}) {
  std::map<std::string, std::vector<std::vector<double>>> means;
  for (int s = 1; s <= steps; ++s) {
    std::map<std::string, std::vector<double>> sum;
    for (int r = 0; r < world; ++r)
      for (int k = 0; k < gas; ++k) {
        auto g = random_grads(table, seed, s, r, k);
        for (auto& [name, v] : g) {
          auto& acc = sum[name];
          acc.resize(v.size(), 0.0);
          for (size_t i = 0; i < v.size(); ++i)
            acc[i] += v[i];
        }
        reduce_ok(eng, r, g);
      }
    if (before_step)
      before_step(s);
    step_ok(eng);
    for (auto& [name, acc] : sum) {
      for (double& x : acc)
        x /= world * gas;
      means[name].push_back(std::move(acc));
    }
  }
  return means;
}

double rel_diff_d(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// The update's relative error against the reference (after - before in both).
double update_error(const std::vector<float>& before, const std::vector<float>& after,
                    const std::vector<double>& want) {
  std::vector<float> got(before.size());
  std::vector<double> ref(before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    got[i] = after[i] - before[i];
    ref[i] = want[i] - before[i];
  }
  return rel_diff_d(got, ref);
}

struct checked {
  double weights = 0;  // relative error of the weights
  double update = 0;   // relative error of the update (after - before)
};

checked check_param(const engine_options& o, const param_spec& spec,
                    const std::vector<ref_block>& blocks, int64_t cols, int steps = 2) {
  auto eng = make_engine(o);
  std::vector<param_spec> table{spec};
  register_table(*eng, table, 9);
  auto before = params_of(*eng);
  auto means = run_steps(*eng, table, o.world, 1, steps);
  auto after = params_of(*eng);
  auto want = reference_muon(before[spec.name], means[spec.name], blocks, cols, o.muon);
  return {rel_diff_d(after[spec.name], want),
          update_error(before[spec.name], after[spec.name], want)};
}

std::vector<ref_block> equal_blocks(int64_t count, int64_t rows) {
  std::vector<ref_block> out;
  for (int64_t e = 0; e < count; ++e)
    out.push_back({e * rows, rows});
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(expert_stack_is_one_muon_matrix_per_expert) {
  // 4 experts of [24, 40] at world 2 (shards cut through experts), 2 steps.
  param_spec spec{"moe.experts.w1", {4, 24, 40}};
  auto o = exact_options(2);
  auto c = check_param(o, spec, equal_blocks(4, 24), 40);
  BOOST_TEST_MESSAGE("expert stack [4, 24, 40] vs double reference, 2 steps: weights "
                     << c.weights << ", update " << c.update);
  BOOST_TEST(c.weights <= 1e-5);
  BOOST_TEST(c.update <= 1e-5);
  // The feature changes the result: the same tensor as one [4, 24*40] matrix is far off.
  spec.view = matrix_view::flatten;
  auto flat = check_param(o, spec, equal_blocks(4, 24), 40);
  BOOST_TEST_MESSAGE("the same tensor flattened to [4, 960] vs the per-expert reference: update "
                     << flat.update);
  BOOST_TEST(flat.update >= 1e-2);
}

BOOST_AUTO_TEST_CASE(expert_owners_are_balanced_per_expert) {
  auto eng = make_engine(exact_options(4));
  register_table(*eng, {{"experts", {8, 32, 32}}}, 3);
  BOOST_REQUIRE(!eng->start());
  const auto& p = eng->layout()->params[0];
  std::vector<int> per_rank(4, 0);
  for (const auto& b : p.blocks)
    ++per_rank[b.owner];
  BOOST_TEST_MESSAGE("8 experts over 4 ranks: " << per_rank[0] << " " << per_rank[1] << " "
                                                << per_rank[2] << " " << per_rank[3]);
  for (int n : per_rank)
    BOOST_TEST(n == 2);
}

BOOST_AUTO_TEST_CASE(split_sizes_orthogonalize_each_block_with_its_scale) {
  // A fused QKV [q 48 + k 16 + v 24, 32]: q as 3 heads of 16, k as 2 heads of 8, v whole, at
  // world 3 (shards cut through blocks). Under `spectral` each block's scale differs.
  param_spec spec{"attn.qkv", {88, 32}};
  spec.split_sizes = {48, 16, 24};
  spec.split_heads = {3, 2, 0};
  const std::vector<ref_block> blocks{{0, 16}, {16, 16}, {32, 16}, {48, 8}, {56, 8}, {64, 24}};
  for (auto rule : {adjust_lr_rule::original, adjust_lr_rule::spectral}) {
    auto o = exact_options(3);
    o.muon.adjust_lr = rule;
    auto c = check_param(o, spec, blocks, 32);
    BOOST_TEST_MESSAGE("split [48 (3 heads), 16 (2 heads), 24] x 32, adjust_lr "
                       << static_cast<int>(rule) << ", vs double reference: weights " << c.weights
                       << ", update " << c.update);
    BOOST_TEST(c.weights <= 1e-5);
    BOOST_TEST(c.update <= 1e-5);
  }
  // Without the split, the matrix is one block: far from the per-block reference.
  spec.split_sizes.clear();
  spec.split_heads.clear();
  auto whole = check_param(exact_options(3), spec, blocks, 32);
  BOOST_TEST(whole.update >= 1e-2);
}

BOOST_AUTO_TEST_CASE(split_blocks_keep_their_scales_under_bf16_transport) {
  // Under bf16 the receivers scale each parameter by its first block's scale; the owner folds
  // the other blocks' ratios in first. Spectral scales of [16, 32] heads and a [24, 32] block
  // differ by 1.22x, so a lost ratio would be off by far more than bf16's rounding (2^-8).
  param_spec spec{"attn.qkv", {88, 32}};
  spec.split_sizes = {48, 16, 24};
  spec.split_heads = {3, 2, 0};
  const std::vector<ref_block> blocks{{0, 16}, {16, 16}, {32, 16}, {48, 8}, {56, 8}, {64, 24}};
  auto o = exact_options(3);
  o.muon.adjust_lr = adjust_lr_rule::spectral;
  o.muon.transport = muon_transport::bf16;
  auto c = check_param(o, spec, blocks, 32);
  BOOST_TEST_MESSAGE("split blocks, spectral, bf16 transport vs double reference: update "
                     << c.update);
  BOOST_TEST(c.update <= 1e-2);
}

BOOST_AUTO_TEST_CASE(adjust_lr_spectral_and_rms_follow_their_formulas) {
  // Wide [24, 56] and tall [56, 24]: spectral is below 1 on the wide one (original is 1 there),
  // rms is 0.2 sqrt(max).
  for (auto rule : {adjust_lr_rule::spectral, adjust_lr_rule::rms}) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{24, 56}, std::vector<int64_t>{56, 24}}) {
      auto o = exact_options(2);
      o.muon.adjust_lr = rule;
      auto c = check_param(o, {"w", shape}, {{0, shape[0]}}, shape[1]);
      BOOST_TEST_MESSAGE("adjust_lr " << static_cast<int>(rule) << " on [" << shape[0] << ", "
                                      << shape[1] << "]: weights " << c.weights << ", update "
                                      << c.update);
      BOOST_TEST(c.weights <= 1e-5);
      BOOST_TEST(c.update <= 1e-5);
    }
  }
}

// -- MuonClip ------------------------------------------------------------------------------------

namespace {

const std::vector<param_spec> kAttention{{"q", {32, 24}}, {"k", {16, 24}}, {"o", {24, 32}}};

// One step of world ranks with rank r reporting logits[r] for query "q" (4 heads; key "k" has 2:
// GQA groups {0, 1} and {2, 3}); tau 0 switches MuonClip off.
tensor_map clip_step(int world, float tau, const std::vector<std::vector<float>>& logits,
                     bool nonfinite = false) {
  auto o = exact_options(world);
  o.muon.qk_clip_tau = tau;
  auto eng = make_engine(o);
  register_table(*eng, kAttention, 21);
  BOOST_REQUIRE(!eng->add_qk_clip("q", "k", 4, 2));
  for (int r = 0; r < world; ++r) {
    auto g = random_grads(kAttention, 21, 1, r, 0);
    if (nonfinite && r == world - 1)
      g["o"][3] = std::numeric_limits<float>::quiet_NaN();
    reduce_ok(*eng, r, g);
    if (r < static_cast<int>(logits.size()) && !logits[r].empty()) {  // {}: no report
      auto err = eng->report_qk_logits(r, "q", logits[r]);
      BOOST_REQUIRE_MESSAGE(!err, err.to_string());
    }
  }
  auto info = step_ok(*eng);
  BOOST_TEST(info.skipped == nonfinite);
  return params_of(*eng);
}

// Rows [r0, r1) of a [*, 24] tensor.
std::vector<float> rows_of(const std::vector<float>& v, int64_t r0, int64_t r1) {
  return {v.begin() + r0 * 24, v.begin() + r1 * 24};
}

}  // namespace

BOOST_AUTO_TEST_CASE(muon_clip_uses_the_max_over_ranks_and_leaves_other_heads_untouched) {
  // tau 10. Head 1: rank 0 saw 4, rank 1 saw 40 -> clipped by sqrt(10/40) on every rank's shard
  // (a rank whose own max is below tau still clips: q's rows 0-15 are rank 0's shard, rows 16-31
  // rank 1's, so head 1 lies in rank 0's shard and head 3 in rank 1's, each clipped by the
  // other rank's report). Head 3: 12 on rank 0 -> sqrt(10/12). Heads 0
  // and 2 stay below tau. Key head 0 (group {0, 1}) takes 40, key head 1 ({2, 3}) takes 12.
  const float tau = 10;
  const std::vector<std::vector<float>> logits{{1, 4, 9, 12}, {2, 40, 3, 5}};
  auto plain = clip_step(2, 0, logits);
  auto clipped = clip_step(2, tau, logits);
  const double f1 = std::sqrt(10.0 / 40), f3 = std::sqrt(10.0 / 12);
  // Query rows: heads of 8 rows; key rows: heads of 8 rows.
  auto expect_scaled = [&](const std::string& name, int64_t r0, int64_t r1, double f) {
    auto a = rows_of(plain[name], r0, r1), b = rows_of(clipped[name], r0, r1);
    std::vector<double> want(a.begin(), a.end());
    for (double& x : want)
      x *= f;
    double d = rel_diff_d(b, want);
    BOOST_TEST_MESSAGE(name << " rows [" << r0 << ", " << r1 << ") scaled by " << f
                            << ": relative error " << d);
    BOOST_TEST(d <= 1e-6);
  };
  expect_scaled("q", 8, 16, f1);
  expect_scaled("q", 24, 32, f3);
  expect_scaled("k", 0, 8, f1);
  expect_scaled("k", 8, 16, f3);
  // Heads below tau and the other parameter: bit for bit.
  BOOST_TEST(same_bits(rows_of(plain["q"], 0, 8), rows_of(clipped["q"], 0, 8)));
  BOOST_TEST(same_bits(rows_of(plain["q"], 16, 24), rows_of(clipped["q"], 16, 24)));
  BOOST_TEST(same_bits(plain["o"], clipped["o"]));
}

BOOST_AUTO_TEST_CASE(muon_clip_does_nothing_on_a_skipped_step) {
  const std::vector<std::vector<float>> logits{{100, 100, 100, 100}, {100, 100, 100, 100}};
  auto o = exact_options(2);
  auto eng = make_engine(o);
  register_table(*eng, kAttention, 21);
  auto before = params_of(*eng);
  auto after = clip_step(2, 10, logits, /*nonfinite=*/true);
  BOOST_TEST(same_bits(before["q"], after["q"]));
  BOOST_TEST(same_bits(before["k"], after["k"]));
}

BOOST_AUTO_TEST_CASE(muon_clip_rejects_bad_pairs_and_reports) {
  auto eng = make_engine(exact_options(2));
  register_table(*eng, kAttention, 21);
  BOOST_TEST((eng->add_qk_clip("q", "nope", 4, 2).code() == errc::unknown_parameter));
  BOOST_TEST((eng->add_qk_clip("q", "k", 4, 3).code() == errc::invalid_argument));
  BOOST_TEST((eng->add_qk_clip("q", "k", 5, 5).code() == errc::invalid_argument));
  BOOST_REQUIRE(!eng->add_qk_clip("q", "k", 4, 2));
  BOOST_TEST((eng->report_qk_logits(0, "q", {1, 2, 3}).code() == errc::shape_mismatch));
  BOOST_TEST((eng->report_qk_logits(0, "k", {1, 2}).code() == errc::invalid_argument));
  BOOST_TEST((eng->report_qk_logits(0, "q", {1, 2, NAN, 3}).code() == errc::invalid_argument));
  BOOST_TEST((eng->report_qk_logits(0, "q", {1, INFINITY, 2, 3}).code() == errc::invalid_argument));
  BOOST_TEST(!eng->report_qk_logits(0, "q", {1, -INFINITY, 2, 3}));  // a head not computed here
  BOOST_TEST((eng->report_qk_logits(2, "q", {1, 2, 3, 4}).code() == errc::invalid_argument));
}

// -- all features on: world and gas invariance ---------------------------------------------------

BOOST_AUTO_TEST_CASE(world_1_2_4_and_gas_1_4_give_the_same_weights_with_blocks_and_clip) {
  param_spec qkv{"qkv", {40, 24}};
  qkv.split_sizes = {16, 8, 16};
  qkv.split_heads = {2, 1, 0};
  const std::vector<param_spec> table{
      {"experts", {3, 16, 24}}, qkv, {"q", {32, 24}}, {"k", {16, 24}}, {"bias", {24}}};
  auto train = [&](int world) {
    auto o = exact_options(world);
    o.muon.adjust_lr = adjust_lr_rule::spectral;
    o.muon.qk_clip_tau = 5;
    auto eng = make_engine(o);
    register_table(*eng, table, 17);
    BOOST_REQUIRE(!eng->add_qk_clip("q", "k", 4, 2));
    // The same global batch for every world and gas: 4 micro-batches of one gradient each.
    for (int s = 1; s <= 3; ++s) {
      for (int b = 0; b < 4; ++b) {
        const int r = b * world / 4;  // rank r gets gas = 4 / world of them
        auto g = random_grads(table, 17, s, 0, b);
        BOOST_REQUIRE(!eng->reduce(r, g));
        // Head b's logit grows with the step; some heads pass tau.
        std::vector<float> logits{1.0f * s * (b + 1), 2, 3.0f * s, 0.5f};
        BOOST_REQUIRE(!eng->report_qk_logits(r, "q", logits));
      }
      // Every rank hands over the same number of micro-batches (4 / world).
      step_ok(*eng);
    }
    return params_of(*eng);
  };
  auto w1 = train(1);
  auto w2 = train(2);
  auto w4 = train(4);
  const double d2 = rel_diff(w2, w1), d4 = rel_diff(w4, w1);
  BOOST_TEST_MESSAGE(
      "experts + split + spectral + MuonClip, 3 steps: world 2 (gas 2) vs world 1 "
      "(gas 4): "
      << d2 << ", world 4 (gas 1): " << d4);
  BOOST_TEST(d2 <= 1e-6);
  BOOST_TEST(d4 <= 1e-6);
}

// -- the trace ---------------------------------------------------------------------------------

// A traced run (world 2, an expert stack, a split matrix and a MuonClip pair; step 2 skipped for
// a NaN, steps 1 and 3 clip) passes `zmuon-trace check`: NS once per parameter although its
// blocks run on both ranks, qk_clip spans on the clipping steps only. The same traces with a
// qk_clip span added on the skipped step fail the check's `qk_clip` rule.
BOOST_AUTO_TEST_CASE(
    traced_run_with_blocks_and_clip_passes_check_and_a_clip_on_a_skipped_step_fails) {
  namespace fs = std::filesystem;
  const std::string dir = "test_muon_blocks_trace";
  fs::remove_all(dir);
  param_spec qkv{"qkv", {40, 24}};
  qkv.split_sizes = {16, 8, 16};
  const std::vector<param_spec> table{
      {"experts", {4, 16, 24}}, qkv, {"q", {32, 24}}, {"k", {16, 24}}, {"bias", {24}}};
  {
    auto o = exact_options(2);
    o.trace_dir = dir;
    o.muon.qk_clip_tau = 1;
    auto eng = make_engine(o);
    register_table(*eng, table, 4);
    BOOST_REQUIRE(!eng->add_qk_clip("q", "k", 4, 2));
    for (int s = 1; s <= 3; ++s) {
      for (int r = 0; r < 2; ++r) {
        auto g = random_grads(table, 4, s, r, 0);
        if (s == 2 && r == 1)
          g["bias"][0] = std::numeric_limits<float>::infinity();
        reduce_ok(*eng, r, g);
        BOOST_REQUIRE(!eng->report_qk_logits(r, "q", {5, 0.5f, 0.5f, 0.5f}));
      }
      BOOST_TEST(step_ok(*eng).skipped == (s == 2));
    }
  }
  auto traces = trace_tool::read_traces(dir);
  BOOST_REQUIRE_MESSAGE(traces, (traces ? "" : traces.err().to_string()));
  auto violations = trace_tool::check(*traces);
  for (const auto& v : violations)
    BOOST_TEST_MESSAGE(trace_tool::format(*traces, v));
  BOOST_TEST(violations.empty());
  std::map<uint64_t, int> clip_spans;
  for (const auto& rt : traces->ranks)
    for (const auto& r : rt.records)
      if (r.ev == "span" && r.phase == "qk_clip")
        ++clip_spans[r.step];
  BOOST_TEST_MESSAGE("qk_clip spans by step: step 1 " << clip_spans[1] << ", step 2 "
                                                      << clip_spans[2] << ", step 3 "
                                                      << clip_spans[3]);
  BOOST_TEST(clip_spans[1] == 2);  // one per rank
  BOOST_TEST(clip_spans[2] == 0);
  BOOST_TEST(clip_spans[3] == 2);
  // Move rank 0's step-1 qk_clip span into the skipped step: the check must fail.
  for (auto& rt : traces->ranks)
    for (auto& r : rt.records)
      if (rt.rank == 0 && r.ev == "span" && r.phase == "qk_clip" && r.step == 1)
        r.step = 2;
  auto bad = trace_tool::check(*traces);
  BOOST_REQUIRE_EQUAL(bad.size(), 1u);
  const std::string text = trace_tool::format(*traces, bad.front());
  BOOST_TEST_MESSAGE(text);
  BOOST_TEST(text.find("[qk_clip] rank 0, step 2: MuonClip scaled query/key heads on skipped "
                       "step 2")
             != std::string::npos);
}
