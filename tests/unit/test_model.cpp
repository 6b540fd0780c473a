// The example model: its backward pass against central finite differences, the determinism of
// its synthetic data, and the parameter table the engine registers.
#define BOOST_TEST_MODULE test_model
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>

#include "zmuon-launch/model.hpp"

using zmuon::tensor_map;
using namespace zmuon::example;

namespace {

/// A config small enough to check every gradient element.
model_config small_config() {
  return {6, 8, 12, 5, 2};
}

/// Non-zero biases, so that their effect on the ReLU pattern is exercised too.
tensor_map perturbed_params(const model_config& cfg, uint64_t seed) {
  tensor_map params = init_params(cfg, seed);
  for (auto* name : {"mlp.fc1.bias", "head.bias"}) {
    std::vector<float>& b = params[name];
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = 0.1f * std::sin(1.7f * static_cast<float>(i));
  }
  return params;
}

/// ||fd - analytic|| / ||fd|| over the checked elements of one tensor.
struct grad_check {
  double diff_sq = 0;
  double ref_sq = 0;
  double relative() const { return std::sqrt(diff_sq / std::max(ref_sq, 1e-300)); }
};

/// Central difference of the loss in element `i` of `name`. The step actually taken is the
/// difference of the two rounded fp32 values, so the fp32 storage adds no error of its own.
double central_difference(const model_config& cfg, tensor_map& params, const batch& b,
                          const std::string& name, size_t i, double h) {
  float original = params[name][i];
  float plus = static_cast<float>(original + h);
  float minus = static_cast<float>(original - h);
  params[name][i] = plus;
  double loss_plus = evaluate(cfg, params, b);
  params[name][i] = minus;
  double loss_minus = evaluate(cfg, params, b);
  params[name][i] = original;
  return (loss_plus - loss_minus) / (static_cast<double>(plus) - static_cast<double>(minus));
}

/// Checks up to `max_per_tensor` evenly spaced elements of every parameter; returns the worst
/// relative error.
double check_gradients(const model_config& cfg, tensor_map params, const batch& b,
                       size_t max_per_tensor) {
  const double h = 1e-4;
  loss_and_grads analytic = forward_backward(cfg, params, b);
  double worst = 0;
  for (const zmuon::param_spec& spec : param_table(cfg)) {
    const std::vector<float>& g = analytic.grads.at(spec.name);
    size_t stride = std::max<size_t>(1, g.size() / max_per_tensor);
    grad_check check;
    for (size_t i = stride / 2; i < g.size(); i += stride) {
      double fd = central_difference(cfg, params, b, spec.name, i, h);
      check.diff_sq += (fd - g[i]) * (fd - g[i]);
      check.ref_sq += fd * fd;
    }
    BOOST_TEST_MESSAGE(spec.name << ": relative error " << check.relative());
    BOOST_TEST(check.ref_sq > 0, spec.name << " has an all-zero gradient");
    worst = std::max(worst, check.relative());
  }
  return worst;
}

}  // namespace

BOOST_AUTO_TEST_CASE(gradients_match_finite_differences_everywhere_on_a_small_model) {
  model_config cfg = small_config();
  batch b = make_batch(cfg, 11, 3, 0, 8);
  double worst = check_gradients(cfg, perturbed_params(cfg, 5), b, SIZE_MAX);
  BOOST_TEST_MESSAGE("small model, every element: worst relative error " << worst);
  BOOST_TEST(worst <= 1e-4);
}

BOOST_AUTO_TEST_CASE(gradients_match_finite_differences_on_the_default_model) {
  model_config cfg;
  batch b = make_batch(cfg, 42, 0, 0, 4);
  double worst = check_gradients(cfg, perturbed_params(cfg, 9), b, 40);
  BOOST_TEST_MESSAGE("default model, 40 elements a tensor: worst relative error " << worst);
  BOOST_TEST(worst <= 1e-4);
}

BOOST_AUTO_TEST_CASE(gradients_are_of_the_mean_so_micro_batches_average) {
  model_config cfg;
  tensor_map params = init_params(cfg, 1);
  loss_and_grads whole = forward_backward(cfg, params, make_batch(cfg, 3, 7, 0, 8));
  loss_and_grads first = forward_backward(cfg, params, make_batch(cfg, 3, 7, 0, 4));
  loss_and_grads second = forward_backward(cfg, params, make_batch(cfg, 3, 7, 4, 4));
  BOOST_TEST(whole.loss == 0.5 * (first.loss + second.loss), boost::test_tools::tolerance(1e-12));
  for (const auto& [name, g] : whole.grads) {
    const std::vector<float>& a = first.grads.at(name);
    const std::vector<float>& c = second.grads.at(name);
    for (size_t i = 0; i < g.size(); ++i)
      BOOST_TEST(std::abs(g[i] - 0.5 * (a[i] + c[i])) <= 1e-6 * (1 + std::abs(g[i])),
                 name << "[" << i << "]");
  }
}

BOOST_AUTO_TEST_CASE(evaluate_gives_the_loss_of_forward_backward) {
  model_config cfg;
  tensor_map params = init_params(cfg, 2);
  batch b = make_batch(cfg, 2, 1, 0, 16);
  BOOST_TEST(evaluate(cfg, params, b) == forward_backward(cfg, params, b).loss);
  batch empty = make_batch(cfg, 2, 1, 0, 0);
  BOOST_TEST(evaluate(cfg, params, empty) == 0.0);
}

BOOST_AUTO_TEST_CASE(a_few_sgd_steps_reduce_the_loss) {
  model_config cfg;
  tensor_map params = init_params(cfg, 4);
  batch held_out = make_batch(cfg, 4, -1, 0, 256);
  double before = evaluate(cfg, params, held_out);
  for (int64_t step = 0; step < 100; ++step) {
    loss_and_grads lg = forward_backward(cfg, params, make_batch(cfg, 4, step, 0, 32));
    for (auto& [name, p] : params)
      for (size_t i = 0; i < p.size(); ++i)
        p[i] -= 0.05f * lg.grads[name][i];
  }
  double after = evaluate(cfg, params, held_out);
  BOOST_TEST_MESSAGE("held-out loss " << before << " -> " << after << " after 100 SGD steps");
  BOOST_TEST(after < 0.8 * before);
}

BOOST_AUTO_TEST_CASE(make_batch_is_a_pure_function_of_seed_step_and_index) {
  model_config cfg;
  batch a = make_batch(cfg, 17, 5, 0, 8);
  batch again = make_batch(cfg, 17, 5, 0, 8);
  BOOST_TEST(a.n == 8);
  BOOST_TEST(a.x == again.x);
  BOOST_TEST(a.y == again.y);
  for (int j = 0; j < 8; ++j) {
    batch one = make_batch(cfg, 17, 5, j, 1);
    BOOST_TEST(std::equal(one.x.begin(), one.x.end(), a.x.begin() + j * cfg.d_in), "x of " << j);
    BOOST_TEST(std::equal(one.y.begin(), one.y.end(), a.y.begin() + j * cfg.d_out), "y of " << j);
  }
  BOOST_TEST(make_batch(cfg, 17, 6, 0, 8).x != a.x);
  BOOST_TEST(make_batch(cfg, 18, 5, 0, 8).x != a.x);
}

BOOST_AUTO_TEST_CASE(inputs_are_standard_normal_and_targets_vary_across_samples) {
  model_config cfg;
  batch b = make_batch(cfg, 23, 0, 0, 256);
  double sum = 0, sum_sq = 0;
  for (float v : b.x) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  double mean = sum / b.x.size(), var = sum_sq / b.x.size() - mean * mean;
  BOOST_TEST_MESSAGE("x mean " << mean << ", variance " << var);
  BOOST_TEST(std::abs(mean) < 0.05);
  BOOST_TEST(std::abs(var - 1.0) < 0.05);
  double y_sq = 0;
  for (float v : b.y)
    y_sq += static_cast<double>(v) * v;
  BOOST_TEST_MESSAGE("mean y^2 " << y_sq / b.y.size());
  BOOST_TEST(y_sq / b.y.size() > 0.05);
  for (int i = 0; i < 16; ++i)
    for (int j = i + 1; j < 16; ++j)
      BOOST_TEST(!std::equal(b.y.begin() + i * cfg.d_out, b.y.begin() + (i + 1) * cfg.d_out,
                             b.y.begin() + j * cfg.d_out),
                 "targets of samples " << i << " and " << j << " coincide");
  // The student does not start at the teacher's answer.
  BOOST_TEST(evaluate(cfg, init_params(cfg, 23), b) > 0.1);
}

BOOST_AUTO_TEST_CASE(param_table_names_shapes_and_heads) {
  model_config cfg;
  std::vector<zmuon::param_spec> table = param_table(cfg);
  struct expect {
    const char* name;
    std::vector<int64_t> shape;
    int64_t heads;
  };
  std::vector<expect> expected = {
      {"embed.weight", {64, 32}, 0}, {"mlp.fc1.weight", {128, 64}, 0},
      {"mlp.fc1.bias", {128}, 0},    {"attn.q_proj.weight", {64, 128}, 4},
      {"head.weight", {16, 64}, 0},  {"head.bias", {16}, 0}};
  BOOST_TEST_REQUIRE(table.size() == expected.size());
  for (size_t i = 0; i < table.size(); ++i) {
    BOOST_TEST(table[i].name == expected[i].name);
    BOOST_TEST(table[i].shape == expected[i].shape);
    BOOST_TEST(table[i].heads == expected[i].heads);
    BOOST_TEST((table[i].group == zmuon::param_group::automatic));
  }
  // The default rule puts the three non-embedding matrices under Muon.
  zmuon::expected<zmuon::plan> plan = zmuon::make_plan(table, 2, 4096);
  BOOST_TEST_REQUIRE(static_cast<bool>(plan), (plan ? "" : plan.err().to_string()));
  BOOST_TEST(plan->muon_count() == 3);
  BOOST_TEST(!plan->params[plan->find("embed.weight")].muon);
  BOOST_TEST(plan->params[plan->find("attn.q_proj.weight")].heads == 4);
}

BOOST_AUTO_TEST_CASE(init_params_is_seeded_and_scaled_by_fan_in) {
  model_config cfg;
  tensor_map params = init_params(cfg, 8);
  BOOST_TEST(!check_params(cfg, params));
  BOOST_TEST(init_params(cfg, 8) == params);
  BOOST_TEST(init_params(cfg, 9).at("mlp.fc1.weight") != params.at("mlp.fc1.weight"));
  for (const char* bias : {"mlp.fc1.bias", "head.bias"})
    for (float v : params.at(bias))
      BOOST_TEST(v == 0.0f);
  const std::vector<float>& w = params.at("mlp.fc1.weight");
  double sum_sq = 0;
  for (float v : w)
    sum_sq += static_cast<double>(v) * v;
  double var = sum_sq / w.size();
  BOOST_TEST(std::abs(var * cfg.hidden - 1.0) < 0.1, "variance x fan_in " << var * cfg.hidden);
}

BOOST_AUTO_TEST_CASE(bad_configs_and_params_are_named) {
  model_config cfg;
  cfg.heads = 5;
  zmuon::error e = check_config(cfg);
  BOOST_TEST((e.code() == zmuon::errc::invalid_argument));
  BOOST_TEST(e.message().find("heads 5") != std::string::npos, e.message());
  cfg = model_config{};
  tensor_map params = init_params(cfg, 1);
  params.erase("head.bias");
  e = check_params(cfg, params);
  BOOST_TEST(e.message().find("head.bias") != std::string::npos, e.message());
  params = init_params(cfg, 1);
  params["mlp.fc1.weight"].pop_back();
  e = check_params(cfg, params);
  BOOST_TEST((e.code() == zmuon::errc::shape_mismatch));
  BOOST_TEST(e.message().find("mlp.fc1.weight") != std::string::npos, e.message());
  BOOST_CHECK_THROW(forward_backward(cfg, params, make_batch(cfg, 1, 0, 0, 2)),
                    std::invalid_argument);
}
