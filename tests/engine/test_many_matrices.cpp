// A table of 100,000 small Muon matrices registers and steps through the engine (world 2, host
// backend, caf comm: the all-to-all's copy to self sees every matrix), and each matrix's new
// values are those of the same matrix stepped alone. The time it takes is
// zmuon-bench-many-matrices' (docs/PERFORMANCE.md), not asserted here.
#define BOOST_TEST_MODULE many_matrices
#include "support/engine_fixture.hpp"

#include <cmath>
#include <string>
#include <vector>

using namespace zmuon;
using namespace zmuon::test;

namespace {

constexpr int64_t kMatrices = 100'000;
constexpr int kPatterns = 7;  // matrix i starts from and is stepped with pattern i % kPatterns
const std::vector<int64_t> kShape = {4, 6};

std::vector<float> pattern_values(int pattern) {
  return random_values(24, 100 + static_cast<uint64_t>(pattern), 0.5f);
}

std::vector<float> pattern_grad(int pattern) {
  return random_values(24, 200 + static_cast<uint64_t>(pattern));
}

std::string name_of(int64_t i) {
  return "block" + std::to_string(i) + ".weight";
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_hundred_thousand_matrices_step_as_each_alone) {
  // The reference: each pattern alone, one rank.
  std::vector<std::vector<float>> expected(kPatterns);
  for (int k = 0; k < kPatterns; ++k) {
    auto ref = make_engine(options(1));
    BOOST_REQUIRE(!ref->add_parameter({"alone.weight", kShape}, pattern_values(k)));
    reduce_ok(*ref, 0, {{"alone.weight", pattern_grad(k)}});
    step_ok(*ref);
    expected[k] = params_of(*ref).at("alone.weight");
    BOOST_REQUIRE(expected[k] != pattern_values(k));  // the step moved it
  }

  auto eng = make_engine(options(2));
  for (int64_t i = 0; i < kMatrices; ++i)
    BOOST_REQUIRE(
        !eng->add_parameter({name_of(i), kShape}, pattern_values(static_cast<int>(i % kPatterns))));
  std::vector<std::vector<float>> grads(kPatterns);
  for (int k = 0; k < kPatterns; ++k)
    grads[k] = pattern_grad(k);
  std::vector<tensor_view> views;
  views.reserve(kMatrices);
  for (int64_t i = 0; i < kMatrices; ++i)
    views.push_back({name_of(i), grads[i % kPatterns].data(), 24});
  // Both ranks bring the same gradient: the average is that gradient.
  for (int r = 0; r < 2; ++r)
    BOOST_REQUIRE(!eng->reduce(r, views));
  const auto info = step_ok(*eng);
  BOOST_TEST(info.ns_matrices == kMatrices);

  const auto params = params_of(*eng);
  BOOST_REQUIRE(params.size() == static_cast<size_t>(kMatrices));
  double worst = 0;
  int64_t worst_at = -1;
  for (int64_t i = 0; i < kMatrices; ++i) {
    const auto& got = params.at(name_of(i));
    const auto& want = expected[i % kPatterns];
    for (size_t e = 0; e < want.size(); ++e) {
      const double d = std::abs(static_cast<double>(got[e]) - want[e]);
      if (d > worst) {
        worst = d;
        worst_at = i;
      }
    }
  }
  BOOST_TEST_MESSAGE("largest difference from the matrix stepped alone: " << worst << " (matrix "
                                                                          << worst_at << ")");
  BOOST_TEST(worst <= 1e-6);
}
