// The traced run that test_trace and test_trace_input check (3 in-process ranks, gas 2, a step
// skipped by a NaN gradient), made once per test module in TRACE_RUN_PREFIX + "run", and the
// helpers that alter copies of it and run the zmuon-trace tool on them. Each module defines
// TRACE_RUN_PREFIX (its own directories, so that ctest -j can run both) before including this.
#pragma once

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "plan/plan.hpp"
#include "support/engine_fixture.hpp"
#include "support/run_launch.hpp"

#ifndef TRACE_RUN_PREFIX
#error "define TRACE_RUN_PREFIX (the module's directory prefix) before including trace_run.hpp"
#endif

namespace {

const int world = 3;
const int gas = 2;
const int steps = 4;
const int bad_step = 3;  // rank 1 hands over a NaN gradient: the step is skipped

std::vector<param_spec> table() {
  return {{"a.weight", {24, 16}},
          {"bias", {16}},
          {"b.weight", {16, 24}},
          {"c.weight", {12, 12}},
          {"embed.weight", {10, 8}}};
}

void write_jsonl(const std::string& path, const std::vector<json>& recs) {
  std::ofstream out(path, std::ios::trunc);
  for (const auto& r : recs)
    out << r.dump() << "\n";
}

std::string tool(const std::string& args, int* status) {
  return test::run_command(std::string(ZMUON_TRACE_TOOL) + " " + args, status);
}

bool is(const json& r, const char* ev) {
  return r.value("ev", "") == ev;
}

// The traced run, made once for the whole module.
struct traced_run {
  std::string dir = TRACE_RUN_PREFIX "run";
  std::vector<step_info> infos;
  int buckets = 0;
  int chunks = 0;
  int muon_params = 0;

  traced_run() {
    fs::remove_all(dir);
    auto o = test::options(world);
    o.reduce_bucket_size = 300;  // several buckets and Muon chunks
    o.trace_dir = dir;
    auto eng = test::make_engine(o);
    auto t = table();
    test::register_table(*eng, t, 7);
    for (int s = 1; s <= steps; ++s) {
      for (int k = 0; k < gas; ++k)
        for (int r = 0; r < world; ++r) {
          auto g = test::random_grads(t, 7, s, r, k);
          if (s == bad_step && r == 1 && k == 0)
            g["bias"][3] = std::numeric_limits<float>::quiet_NaN();
          test::reduce_ok(*eng, r, g);
        }
      infos.push_back(test::step_ok(*eng));
    }
    buckets = static_cast<int>(eng->layout()->buckets.size());
    chunks = static_cast<int>(eng->layout()->chunks.size());
    for (const auto& p : eng->layout()->params)
      muon_params += p.muon ? 1 : 0;
  }  // the engine is gone here: every trace file is complete
};

const traced_run& run() {
  static traced_run r;
  return r;
}

// A copy of the run's traces to alter.
std::string copy_of(const std::string& name) {
  std::string dir = TRACE_RUN_PREFIX + name;
  fs::remove_all(dir);
  fs::copy(run().dir, dir);
  return dir;
}

// Runs check on `dir`: it must fail with exactly one violation whose text contains `expected`.
void fails_with(const std::string& dir, const std::vector<std::string>& expected) {
  int status = 0;
  auto out = tool("check " + dir, &status);
  BOOST_TEST_MESSAGE(out);
  BOOST_TEST(WEXITSTATUS(status) == 1);
  for (const auto& e : expected)
    BOOST_TEST(out.find(e) != std::string::npos, "missing '" << e << "' in:\n" << out);
  BOOST_TEST(out.find("check: 1 violation(s)") != std::string::npos, out);
}

}  // namespace
