// Helpers shared by the engine-level tests: engines with the defaults of a test, random
// gradients, relative differences.
#pragma once

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "zmuon/engine.hpp"

namespace zmuon::test {

inline engine_options options(int world) {
  engine_options o;
  o.world = world;
  o.timeout_ms = 30'000;
  return o;
}

/// options(world) on the cuda compute backend with `comm` (GPU tests).
inline engine_options gpu_options(int world, const std::string& comm) {
  auto o = options(world);
  o.compute = "cuda";
  o.comm = comm;
  return o;
}

inline std::unique_ptr<engine> make_engine(const engine_options& o) {
  auto eng = engine::create(o);
  BOOST_REQUIRE_MESSAGE(eng, (eng ? "" : eng.err().to_string()));
  return std::move(*eng);
}

inline std::vector<float> random_values(int64_t n, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v)
    x = dist(gen);
  return v;
}

inline int64_t numel(const param_spec& p) {
  int64_t n = 1;
  for (auto d : p.shape)
    n *= d;
  return n;
}

/// Registers `table` with random initial values drawn from `seed`.
inline void register_table(engine& eng, const std::vector<param_spec>& table, uint64_t seed) {
  for (size_t i = 0; i < table.size(); ++i) {
    auto err = eng.add_parameter(table[i], random_values(numel(table[i]), seed * 1000 + i, 0.1f));
    BOOST_REQUIRE_MESSAGE(!err, err.to_string());
  }
}

/// A gradient for every parameter of `table`, a pure function of (seed, step, rank, micro).
inline tensor_map random_grads(const std::vector<param_spec>& table, uint64_t seed, int step,
                               int rank, int micro, float stddev = 1.0f) {
  tensor_map g;
  for (size_t i = 0; i < table.size(); ++i)
    g[table[i].name] = random_values(
        numel(table[i]), ((seed * 131 + step) * 257 + rank) * 1031 + micro * 17 + i, stddev);
  return g;
}

/// ||a - b|| / ||b|| over all tensors of b (which a must hold too).
inline double rel_diff(const tensor_map& a, const tensor_map& b) {
  double num = 0, den = 0;
  for (const auto& [name, vb] : b) {
    const auto& va = a.at(name);
    BOOST_REQUIRE_EQUAL(va.size(), vb.size());
    for (size_t i = 0; i < vb.size(); ++i) {
      double d = static_cast<double>(va[i]) - vb[i];
      num += d * d;
      den += static_cast<double>(vb[i]) * vb[i];
    }
  }
  return std::sqrt(num / den);
}

inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_diff(tensor_map{{"x", a}}, tensor_map{{"x", b}});
}

inline tensor_map params_of(engine& eng) {
  auto p = eng.parameters();
  BOOST_REQUIRE_MESSAGE(p, (p ? "" : p.err().to_string()));
  return *p;
}

inline step_info step_ok(engine& eng) {
  auto s = eng.step();
  BOOST_REQUIRE_MESSAGE(s, (s ? "" : s.err().to_string()));
  return *s;
}

inline void reduce_ok(engine& eng, int rank, const tensor_map& g) {
  auto err = eng.reduce(rank, g);
  BOOST_REQUIRE_MESSAGE(!err, err.to_string());
}

/// Hands every rank of a `world`-rank engine its random_grads(table, seed, step, rank, 0) and
/// returns their mean in double: the gradient a reference optimizer steps with.
inline std::map<std::string, std::vector<double>> reduce_random_mean(
    engine& eng, const std::vector<param_spec>& table, uint64_t seed, int step, int world) {
  std::map<std::string, std::vector<double>> mean;
  for (int r = 0; r < world; ++r) {
    auto g = random_grads(table, seed, step, r, 0);
    reduce_ok(eng, r, g);
    for (const auto& [name, v] : g) {
      auto& m = mean[name];
      m.resize(v.size(), 0.0);
      for (size_t i = 0; i < v.size(); ++i)
        m[i] += static_cast<double>(v[i]) / world;
    }
  }
  return mean;
}

inline rank_state snapshot_of(engine& eng, int rank) {
  auto s = eng.snapshot(rank);
  BOOST_REQUIRE_MESSAGE(s, (s ? "" : s.err().to_string()));
  return *s;
}

/// A [*, cols] matrix `natural` (row-major) as `boxes` back to back, each row-major
/// (engine::set_box_order), and back.
inline std::vector<float> to_boxes(const std::vector<float>& natural, int64_t cols,
                                   const std::vector<matrix_box>& boxes) {
  std::vector<float> out;
  for (const auto& b : boxes)
    for (int64_t r = b.row0; r < b.row0 + b.rows; ++r)
      out.insert(out.end(), natural.begin() + r * cols + b.col0,
                 natural.begin() + r * cols + b.col0 + b.cols);
  return out;
}
inline std::vector<float> from_boxes(const std::vector<float>& packed, int64_t cols,
                                     const std::vector<matrix_box>& boxes) {
  std::vector<float> out(packed.size());
  auto it = packed.begin();
  for (const auto& b : boxes)
    for (int64_t r = b.row0; r < b.row0 + b.rows; ++r, it += b.cols)
      std::copy(it, it + b.cols, out.begin() + r * cols + b.col0);
  return out;
}

/// Bit-identical float vectors (NaN-safe: compares representations).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size()
         && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace zmuon::test
