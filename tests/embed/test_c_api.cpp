// The C ABI (zmuon/zmuon.h), driven from C (c_api_checks.c, compiled as C99): a job of 3 steps,
// 2 ranks, 2 micro-batches gives bit-identical parameters to the same job through the C++ API;
// wrong calls return the right status and a message naming what is wrong. Links only the shared
// libzmuon, so the C++ API is checked to be complete in it as well.
#define BOOST_TEST_MODULE c_api
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "support/c_api_data.h"
#include "support/scratch_dir.hpp"
#include "zmuon/engine.hpp"
#include "zmuon/zmuon.h"

extern "C" {
int cjob_run(float* out, zmuon_step_info* last_info);
struct cjob_outcome {
  int status;
  char message[512];
};
int cjob_bad_calls(cjob_outcome* o);
}

namespace {

int64_t total_numel() {
  int64_t n = 0;
  for (int p = 0; p < CJOB_PARAMS; ++p)
    n += cjob_numel(p);
  return n;
}

// The same job through the C++ API, with the options set by hand (not from the JSON text).
std::vector<float> run_cpp(zmuon::step_info& last) {
  zmuon::engine_options o;
  o.world = CJOB_WORLD;
  o.gradient_clipping = 1.0f;
  o.muon.lr = 0.02f;
  o.adamw.lr = 0.001f;
  o.muon.weight_decay = 0.1f;
  o.adamw.weight_decay = 0.1f;
  auto eng = zmuon::engine::create(o);
  BOOST_REQUIRE_MESSAGE(eng, (eng ? "" : eng.err().to_string()));
  for (int p = 0; p < CJOB_PARAMS; ++p) {
    std::vector<float> init(cjob_numel(p));
    for (int64_t i = 0; i < cjob_numel(p); ++i)
      init[i] = cjob_init(p, i);
    std::vector<int64_t> shape(cjob_shapes[p], cjob_shapes[p] + cjob_ndim[p]);
    auto err = (*eng)->add_parameter(
        {cjob_names[p], shape, zmuon::param_group::automatic, cjob_heads[p]}, init);
    BOOST_REQUIRE_MESSAGE(!err, err.to_string());
  }
  for (int s = 1; s <= CJOB_STEPS; ++s) {
    for (int k = 0; k < CJOB_GAS; ++k)
      for (int r = 0; r < CJOB_WORLD; ++r) {
        zmuon::tensor_map g;
        for (int p = 0; p < CJOB_PARAMS; ++p)
          for (int64_t i = 0; i < cjob_numel(p); ++i)
            g[cjob_names[p]].push_back(cjob_grad(s, r, k, p, i));
        auto err = (*eng)->reduce(r, g);
        BOOST_REQUIRE_MESSAGE(!err, err.to_string());
      }
    auto info = (*eng)->step();
    BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
    last = *info;
  }
  auto params = (*eng)->parameters();
  BOOST_REQUIRE(params);
  std::vector<float> out;
  for (int p = 0; p < CJOB_PARAMS; ++p)
    out.insert(out.end(), (*params)[cjob_names[p]].begin(), (*params)[cjob_names[p]].end());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(c_job_matches_cpp_job_bit_for_bit) {
  std::vector<float> from_c(total_numel(), -7.0f);
  zmuon_step_info c_info{};
  int st = cjob_run(from_c.data(), &c_info);
  BOOST_REQUIRE_MESSAGE(st == ZMUON_OK, zmuon_status_name(st) << ": " << zmuon_last_error());
  zmuon::step_info cpp_info;
  auto from_cpp = run_cpp(cpp_info);
  BOOST_REQUIRE_EQUAL(from_c.size(), from_cpp.size());
  BOOST_TEST(std::memcmp(from_c.data(), from_cpp.data(), from_c.size() * sizeof(float)) == 0);
  // The steps did something: far from the initial values.
  double moved = 0;
  int64_t offset = 0;
  for (int p = 0; p < CJOB_PARAMS; ++p)
    for (int64_t i = 0; i < cjob_numel(p); ++i, ++offset)
      moved = std::max(moved, double(std::abs(from_c[offset] - cjob_init(p, i))));
  BOOST_TEST_MESSAGE("largest parameter change over 3 steps: " << moved);
  BOOST_TEST(moved > 1e-3);
  BOOST_TEST(c_info.step == cpp_info.step);
  BOOST_TEST(c_info.grad_norm == cpp_info.grad_norm);
  BOOST_TEST(c_info.clip_coef == cpp_info.clip_coef);
  BOOST_TEST(c_info.clip_coef < 1.0f);  // clipping (max norm 1) was active
  BOOST_TEST(c_info.ns_matrices == cpp_info.ns_matrices);
  BOOST_TEST(c_info.ns_matrices == 3 + 1);  // qkv per head (3 blocks) + mlp
  BOOST_TEST(c_info.micro_batches == CJOB_GAS);
}

BOOST_AUTO_TEST_CASE(wrong_calls_return_their_status_and_message) {
  cjob_outcome o[9];
  std::memset(o, 0, sizeof o);
  int st = cjob_bad_calls(o);
  BOOST_REQUIRE_MESSAGE(st == ZMUON_OK, zmuon_last_error());
  struct expectation {
    int status;
    const char* says;
  };
  const expectation want[9] = {
      {ZMUON_INVALID_ARGUMENT,
       "unknown key 'optimizer.params.momentun' (did you mean 'momentum'?)"},
      {ZMUON_INVALID_ARGUMENT, "not valid JSON"},
      {ZMUON_INVALID_ARGUMENT, "zmuon.rank"},
      {ZMUON_INVALID_ARGUMENT, "group 7"},
      {ZMUON_DUPLICATE_PARAMETER, "'w' is registered twice"},
      {ZMUON_SHAPE_MISMATCH, "gradient of 'w' has 5 elements, expected 24"},
      {ZMUON_UNSUPPORTED, "cannot read"},
      {ZMUON_BAD_STATE, "step() before any gradient"},
      {ZMUON_UNKNOWN_PARAMETER, "buffer for 'v', which is not a registered parameter"},
  };
  for (int i = 0; i < 9; ++i) {
    BOOST_TEST_MESSAGE("call " << i << ": " << zmuon_status_name(o[i].status) << ": "
                               << o[i].message);
    BOOST_TEST(o[i].status == want[i].status, "call " << i);
    BOOST_TEST(std::strstr(o[i].message, want[i].says) != nullptr,
               "call " << i << " says '" << o[i].message << "'");
  }
}

BOOST_AUTO_TEST_CASE(null_arguments_are_errors_not_crashes) {
  BOOST_TEST(zmuon_engine_create(nullptr, nullptr, 0, nullptr) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "out is NULL") != nullptr);
  BOOST_TEST(zmuon_engine_step(nullptr, nullptr) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(zmuon_engine_reduce(nullptr, 0, nullptr, 0) == ZMUON_INVALID_ARGUMENT);
  zmuon_engine_destroy(nullptr);
  zmuon_engine* eng = nullptr;
  BOOST_REQUIRE(zmuon_engine_create(nullptr, nullptr, 0, &eng) == ZMUON_OK);
  int32_t world = 0;
  BOOST_TEST(zmuon_engine_world(eng, &world) == ZMUON_OK);
  BOOST_TEST(world == 4);  // the config's default zmuon.ranks
  BOOST_TEST(zmuon_engine_reduce(eng, 0, nullptr, 1) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(zmuon_engine_reduce_all(nullptr, nullptr, nullptr, 0) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(zmuon_engine_reduce_all(eng, nullptr, nullptr, 4) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "grads is NULL") != nullptr, zmuon_last_error());
  zmuon_tensor unnamed{nullptr, nullptr, 0, ZMUON_HOST};
  BOOST_TEST(zmuon_engine_gather_params(eng, &unnamed, 1) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "NULL name") != nullptr);
  BOOST_TEST(zmuon_engine_time_calls(nullptr, 1) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(zmuon_engine_write_call_timeline(eng, nullptr) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "path is NULL") != nullptr);
  // Timing off: a bad-state error that says so, and no file.
  BOOST_TEST(zmuon_engine_write_call_timeline(eng, "/nonexistent/timeline.json")
             == ZMUON_BAD_STATE);
  BOOST_TEST(std::strstr(zmuon_last_error(), "call timing is off") != nullptr);
  BOOST_TEST(zmuon_engine_time_calls(eng, 1) == ZMUON_OK);
  // On, but the engine has not run: nothing to take (rank 0 has no backend yet).
  BOOST_TEST(zmuon_engine_write_call_timeline(eng, "/nonexistent/timeline.json")
             == ZMUON_BAD_STATE);
  BOOST_TEST(std::strstr(zmuon_last_error(), "has not started") != nullptr);
  // Learning rates: NaN and infinities are refused (a negative one keeps the current rate).
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    BOOST_TEST(zmuon_engine_set_lr(eng, bad, -1.0f) == ZMUON_INVALID_ARGUMENT);
    BOOST_TEST(std::strstr(zmuon_last_error(), "learning rates must be finite") != nullptr);
    BOOST_TEST(zmuon_engine_set_lr(eng, -1.0f, bad) == ZMUON_INVALID_ARGUMENT);
  }
  BOOST_TEST(zmuon_engine_set_lr(eng, 0.01f, -1.0f) == ZMUON_OK);
  // init NULL means zeros: numel 0 or the shape's count; anything else is a caller's mix-up.
  const int64_t shape[2] = {4, 6};
  BOOST_TEST(zmuon_engine_add_parameter(eng, "z", shape, 2, ZMUON_GROUP_AUTO, 0, nullptr, 5)
             == ZMUON_SHAPE_MISMATCH);
  BOOST_TEST(std::string(zmuon_last_error())
             == "parameter 'z': init is NULL (zeros) but numel is 5, not 0 or 24");
  BOOST_TEST(zmuon_engine_add_parameter(eng, "z", shape, 2, ZMUON_GROUP_AUTO, 0, nullptr, 24)
             == ZMUON_OK);  // "z" was not registered by the refused call
  zmuon_engine_destroy(eng);
  // A NULL entry of `overrides` is named by its index, and no engine is made.
  const char* overrides[2] = {"zmuon.ranks=2", nullptr};
  eng = nullptr;
  BOOST_TEST(zmuon_engine_create(nullptr, overrides, 2, &eng) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::string(zmuon_last_error()) == "zmuon_engine_create: overrides[1] is NULL");
  BOOST_TEST(eng == nullptr);
  BOOST_TEST(zmuon_engine_create_from_file("c.json", overrides, 2, &eng) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::string(zmuon_last_error())
             == "zmuon_engine_create_from_file: overrides[1] is NULL");
}

// The C++ API's buffer calls (in libzmuon too): everything is checked before anything is
// handed over or written; a subset of the parameters can be gathered.
BOOST_AUTO_TEST_CASE(cpp_buffer_calls_check_everything_first) {
  auto made = zmuon::engine::create_from_json(R"({"zmuon": {"ranks": 2}})");
  BOOST_REQUIRE_MESSAGE(made, (made ? "" : made.err().to_string()));
  auto& eng = **made;
  std::vector<float> w0(24), b0(6);
  for (size_t i = 0; i < w0.size(); ++i)
    w0[i] = 0.01f * float(i);
  for (size_t i = 0; i < b0.size(); ++i)
    b0[i] = -0.5f * float(i);
  BOOST_REQUIRE(!eng.add_parameter({"w", {4, 6}}, w0));
  BOOST_REQUIRE(!eng.add_parameter({"b", {6}}, b0));
  std::vector<float> g(24, 1.0f), b(6, 9.0f), wrong(5, 7.0f);
  using views = std::vector<zmuon::tensor_view>;
  auto err = eng.reduce(0, views{{"w", g.data(), 24}, {"w", g.data(), 24}});
  BOOST_TEST(to_string(err.code()) == "invalid_argument");
  BOOST_TEST(err.message().find("'w' is given twice") != std::string::npos);
  err = eng.reduce(1, views{{"w", nullptr, 24}});
  BOOST_TEST(err.message().find("null pointer") != std::string::npos);
  // Nothing was handed over by the failed calls.
  auto st = eng.step();
  BOOST_REQUIRE(!st);
  BOOST_TEST(st.err().message().find("before any gradient") != std::string::npos);

  using spans = std::vector<zmuon::tensor_span>;
  err = eng.gather_params(spans{{"b", b.data(), 6}, {"w", wrong.data(), 5}});
  BOOST_TEST(to_string(err.code()) == "shape_mismatch");
  BOOST_TEST(b == std::vector<float>(6, 9.0f));  // not written
  err = eng.gather_params(spans{{"b", b.data(), 6, zmuon::memory_space::cuda, 1}});
  BOOST_TEST(to_string(err.code()) == "unsupported");
  BOOST_TEST(err.message().find("(device 1)") != std::string::npos);
  err = eng.gather_params(spans{{"b", b.data(), 6}});  // a subset: b alone
  BOOST_REQUIRE_MESSAGE(!err, err.to_string());
  BOOST_TEST(b == b0);
}

// The stream-ordered reduce() checks as the plain one does, and host buffers are read during the
// call either way (hand_over() kept until the step too: only device gradients are read in
// place); a stream-ordered step(stream) on the host backend is the plain step: the same steps
// give the same bits. zmuon_engine_hand_over names an unknown flag.
BOOST_AUTO_TEST_CASE(stream_ordered_reduce_of_host_buffers_is_the_plain_reduce) {
  using views = std::vector<zmuon::tensor_view>;
  std::vector<float> g(24), b(6);
  enum { plain_call, on_stream_call, kept_call };
  auto run = [&](int how) {
    auto made = zmuon::engine::create_from_json(R"({"zmuon": {"ranks": 2}})");
    BOOST_REQUIRE(made);
    auto& eng = **made;
    BOOST_REQUIRE(!eng.add_parameter({"w", {4, 6}}, std::vector<float>(24, 0.5f)));
    BOOST_REQUIRE(!eng.add_parameter({"b", {6}}));
    auto err = eng.reduce(0, views{{"w", g.data(), 24, zmuon::memory_space::cuda, 0}}, nullptr);
    BOOST_TEST(to_string(err.code()) == "unsupported");  // the host backend reads no device
    for (int step = 1; step <= 2; ++step) {
      for (int r = 0; r < 2; ++r) {
        for (size_t i = 0; i < g.size(); ++i)
          g[i] = std::sin(0.3f * float(i + 7 * r + 13 * step));
        for (size_t i = 0; i < b.size(); ++i)
          b[i] = 0.1f * float(i) - 0.2f * float(r + step);
        views v{{"w", g.data(), 24}, {"b", b.data(), 6}};
        err = how == plain_call       ? eng.reduce(r, v)
              : how == on_stream_call ? eng.reduce(r, v, nullptr)
                                      : eng.hand_over(r, v, nullptr, false, true);
        BOOST_REQUIRE_MESSAGE(!err, err.to_string());
        std::fill(g.begin(), g.end(), NAN);  // read during the call: this changes nothing
      }
      auto info = how == on_stream_call ? eng.step(nullptr) : eng.step();
      BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
      BOOST_TEST(!info->skipped);
    }
    auto p = eng.parameters();
    BOOST_REQUIRE(p);
    return *p;
  };
  auto plain = run(plain_call);
  auto ordered = run(on_stream_call);
  auto kept = run(kept_call);
  BOOST_TEST(plain.at("w") == ordered.at("w"));
  BOOST_TEST(plain.at("b") == ordered.at("b"));
  BOOST_TEST(plain.at("w") == kept.at("w"));
  BOOST_TEST(plain.at("b") == kept.at("b"));
  zmuon_engine* eng = nullptr;
  BOOST_REQUIRE_EQUAL(zmuon_engine_create(R"({"zmuon": {"ranks": 1}})", nullptr, 0, &eng),
                      ZMUON_OK);
  BOOST_TEST(zmuon_engine_hand_over(eng, 0, nullptr, 0, nullptr, 8u) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "unknown flags 8") != nullptr);
  zmuon_engine_destroy(eng);
  BOOST_TEST(plain.at("w") != std::vector<float>(24, 0.5f));  // the steps moved it
  BOOST_TEST(zmuon_engine_reduce_on_stream(nullptr, 0, nullptr, 0, nullptr)
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "zmuon_engine_reduce_on_stream") != nullptr);
  BOOST_TEST(zmuon_engine_step_on_stream(nullptr, nullptr, nullptr) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "zmuon_engine_step_on_stream") != nullptr);
}

// A hand-over ahead of the step (the host backend reads host gradients where they lie in a job
// of one rank): nothing reads the gradients before the step, so values written in place after
// the hand-over are what the step takes, bit for bit as a reduce() of them, with or without
// begin_step before the step; the rank's next hand-over withdraws it, begun or not (the step
// takes that one alone, as its one micro-batch), and so does a checkpoint's save. One after a plain
// hand-over of the step is refused, one whose gradients the step could not read where they lie (two
// ranks: a reduce-scatter) is unsupported, and neither hands anything over.
BOOST_AUTO_TEST_CASE(a_hand_over_ahead_of_the_step_is_read_when_the_step_begins) {
  using views = std::vector<zmuon::tensor_view>;
  auto values = [](int seed) {
    std::vector<float> g(30);
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = std::sin(0.37f * float(i) + 1.3f * float(seed));
    return g;
  };
  auto make = [](int ranks) {
    auto made =
        zmuon::engine::create_from_json(R"({"zmuon": {"ranks": )" + std::to_string(ranks) + "}}");
    BOOST_REQUIRE(made);
    BOOST_REQUIRE(!(*made)->add_parameter({"w", {4, 6}}, std::vector<float>(24, 0.5f)));
    BOOST_REQUIRE(!(*made)->add_parameter({"b", {6}}));
    return std::move(*made);
  };
  auto of = [](std::vector<float>& g) {
    return views{{"w", g.data(), 24}, {"b", g.data() + 24, 6}};
  };
  enum { reference, written_after, begun, withdrawn_by_the_next, begun_then_withdrawn };
  auto run = [&](int how) {
    auto eng = make(1);
    for (int step = 1; step <= 3; ++step) {
      auto g = values(step);
      auto early = values(step + 100);
      zmuon::error err;
      if (how == reference) {
        err = eng->reduce(0, of(g));
      } else if (how == written_after || how == begun) {
        auto kept = early;  // handed over ahead, then written in place with the step's values
        kept[3] = NAN;      // a scan taken at the hand-over would skip the step
        BOOST_REQUIRE(!eng->hand_over(0, of(kept), nullptr, false, true, true));
        std::copy(g.begin(), g.end(), kept.begin());
        if (how == begun)  // the reads start here, the step comes after
          BOOST_REQUIRE(!eng->begin_step(nullptr));
        g = kept;  // what the step reads: the same memory
        BOOST_REQUIRE(eng->handed_over(0));
        BOOST_TEST(*eng->handed_over(0) == 1);
        auto info = eng->step();
        BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
        BOOST_TEST(info->micro_batches == 1);
        BOOST_TEST(!info->skipped);
        BOOST_TEST(kept == g);  // read, not written
        continue;
      } else {
        BOOST_REQUIRE(!eng->hand_over(0, of(early), nullptr, false, true, true));
        if (how == begun_then_withdrawn)
          BOOST_REQUIRE(!eng->begin_step(nullptr));
        err = eng->hand_over(0, of(g), nullptr, false, true);
        std::fill(early.begin(), early.end(), NAN);  // withdrawn: never read
      }
      BOOST_REQUIRE_MESSAGE(!err, err.to_string());
      BOOST_TEST(*eng->handed_over(0) == 1);
      auto info = eng->step();
      BOOST_REQUIRE_MESSAGE(info, (info ? "" : info.err().to_string()));
      BOOST_TEST(info->micro_batches == 1);
      BOOST_TEST(!info->skipped);
    }
    auto p = eng->parameters();
    BOOST_REQUIRE(p);
    return *p;
  };
  const auto want = run(reference);
  BOOST_TEST(want.at("w") != std::vector<float>(24, 0.5f));  // the steps moved it
  for (int how : {written_after, begun, withdrawn_by_the_next, begun_then_withdrawn}) {
    const auto got = run(how);
    BOOST_TEST(got.at("w") == want.at("w"));
    BOOST_TEST(got.at("b") == want.at("b"));
  }

  auto eng = make(1);
  auto g = values(1);
  BOOST_REQUIRE(!eng->hand_over(0, of(g), nullptr, false, true, true));
  zmuon::test::scratch_dir dir;
  auto err = eng->save_checkpoint(dir.path().string());
  BOOST_REQUIRE_MESSAGE(!err, err.to_string());
  BOOST_TEST(*eng->handed_over(0) == 0);  // withdrawn
  auto info = eng->step();
  BOOST_REQUIRE(!info);
  BOOST_TEST(to_string(info.err().code()) == "bad_state");  // nothing handed over
  BOOST_REQUIRE(!eng->reduce(0, of(g)));
  err = eng->hand_over(0, of(g), nullptr, false, true, true);
  BOOST_TEST(to_string(err.code()) == "bad_state");
  BOOST_TEST(err.message().find("already handed over 1 micro-batch") != std::string::npos);
  BOOST_TEST(*eng->handed_over(0) == 1);
  err = eng->hand_over(0, of(g), nullptr, false, false, true);
  BOOST_TEST(to_string(err.code()) == "invalid_argument");

  auto two = make(2);
  err = two->hand_over(0, of(g), nullptr, false, true, true);
  BOOST_TEST(to_string(err.code()) == "unsupported");
  BOOST_TEST(err.message().find("ahead of the step") != std::string::npos);
  BOOST_TEST(*two->handed_over(0) == 0);
  BOOST_TEST(zmuon_engine_handed_over(nullptr, 0, nullptr) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(!two->begin_step(nullptr));  // nothing handed over ahead: nothing to begin
  BOOST_TEST(zmuon_engine_begin_step(nullptr, nullptr) == ZMUON_INVALID_ARGUMENT);
}

// zmuon_engine_master: in a job of one rank each parameter's master in the engine's own memory
// (what gather_params copies out, and a write there is where the next step starts); a process
// of several ranks, an unknown name and NULL arguments are named errors. (A process of one rank
// of a sharded job gets its shard: tests/python/test_torch_distributed.py under FSDP2.)
BOOST_AUTO_TEST_CASE(the_master_of_a_one_rank_job_is_the_engines_own_memory) {
  auto make = [](int ranks, zmuon_engine** eng) {
    const std::string json = R"({"zmuon": {"ranks": )" + std::to_string(ranks) + "}}";
    BOOST_REQUIRE_EQUAL(zmuon_engine_create(json.c_str(), nullptr, 0, eng), ZMUON_OK);
    const int64_t shape[2] = {4, 6};
    std::vector<float> init(24);
    for (size_t i = 0; i < init.size(); ++i)
      init[i] = 0.05f * float(i) - 0.4f;
    BOOST_REQUIRE_EQUAL(
        zmuon_engine_add_parameter(*eng, "w", shape, 2, ZMUON_GROUP_AUTO, 0, init.data(), 24),
        ZMUON_OK);
  };
  auto step = [](zmuon_engine* eng, float seed) {
    std::vector<float> g(24);
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = std::sin(seed + 0.3f * float(i));
    zmuon_tensor t{"w", g.data(), 24, ZMUON_HOST};
    BOOST_REQUIRE_EQUAL(zmuon_engine_reduce(eng, 0, &t, 1), ZMUON_OK);
    BOOST_REQUIRE_EQUAL(zmuon_engine_step(eng, nullptr), ZMUON_OK);
  };
  auto gathered = [](zmuon_engine* eng) {
    std::vector<float> w(24);
    zmuon_tensor t{"w", w.data(), 24, ZMUON_HOST};
    BOOST_REQUIRE_EQUAL(zmuon_engine_gather_params(eng, &t, 1), ZMUON_OK);
    return w;
  };
  zmuon_engine* eng = nullptr;
  make(1, &eng);
  step(eng, 1.0f);
  zmuon_tensor m{};
  BOOST_REQUIRE_EQUAL(zmuon_engine_master(eng, "w", &m), ZMUON_OK);
  BOOST_TEST(m.numel == 24);
  BOOST_TEST(m.device == ZMUON_HOST);
  BOOST_TEST(std::string(m.name) == "w");
  auto* master = static_cast<float*>(m.data);
  BOOST_TEST(std::vector<float>(master, master + 24) == gathered(eng));
  // A write into the master is the parameter's value: the next step starts from it, as a second
  // engine loaded with the same values.
  for (int i = 0; i < 24; ++i)
    master[i] = 0.5f * master[i] + 0.01f;
  const std::vector<float> written(master, master + 24);
  zmuon_engine* twin = nullptr;
  make(1, &twin);
  zmuon_tensor load{"w", const_cast<float*>(written.data()), 24, ZMUON_HOST};
  step(twin, 1.0f);  // the same state: moments of one step
  BOOST_REQUIRE_EQUAL(zmuon_engine_load_shard_params(twin, 0, &load, 1), ZMUON_OK);
  step(eng, 2.0f);
  step(twin, 2.0f);
  BOOST_TEST(gathered(eng) == gathered(twin));
  BOOST_TEST(gathered(eng) != written);  // the step moved it
  BOOST_TEST(zmuon_engine_master(eng, "nope", &m) == ZMUON_UNKNOWN_PARAMETER);
  BOOST_TEST(std::strstr(zmuon_last_error(), "'nope'") != nullptr);
  BOOST_TEST(zmuon_engine_master(eng, "w", nullptr) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "out") != nullptr);
  zmuon_engine_destroy(twin);
  zmuon_engine_destroy(eng);
  make(2, &eng);
  BOOST_TEST(zmuon_engine_master(eng, "w", &m) == ZMUON_UNSUPPORTED);
  BOOST_TEST(std::strstr(zmuon_last_error(), "runs 2 ranks") != nullptr);
  zmuon_engine_destroy(eng);
}

// One process of a multi-process job through the C ABI: bad arguments are named; a one-node job
// (its rendezvous on a free port) with two ranks runs the same steps as a plain two-rank engine,
// to the same bits, and its sums over the nodes are the values themselves.
BOOST_AUTO_TEST_CASE(a_node_process_through_the_c_abi) {
  zmuon_engine* eng = nullptr;
  BOOST_TEST(zmuon_engine_create_node(nullptr, nullptr, 0, 2, 0, 1, nullptr, &eng)
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "master is NULL") != nullptr);
  BOOST_TEST(zmuon_engine_create_node(nullptr, nullptr, 0, 2, 2, 1, "127.0.0.1:0", &eng)
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "node rank 2 is outside [0, 2)") != nullptr);
  BOOST_TEST(zmuon_engine_create_node(nullptr, nullptr, 0, 0, 0, 1, "127.0.0.1:0", &eng)
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "a job has at least one node (nodes is 0)")
             != nullptr);
  // Thousands of ranks in one process took minutes to start, past timeout_ms.
  BOOST_TEST(zmuon_engine_create_node(nullptr, nullptr, 0, 1, 0, 2000, "127.0.0.1:0", &eng)
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "a process runs 1 to 1024 ranks (got 2000)")
             != nullptr);
  BOOST_TEST(zmuon_engine_create_node(nullptr, nullptr, 0, 1, 0, 1, "nohost", &eng)
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(std::strstr(zmuon_last_error(), "expected HOST:PORT") != nullptr);
  BOOST_TEST(zmuon_engine_start(nullptr) == ZMUON_INVALID_ARGUMENT);

  const int64_t shape[] = {4, 6};
  std::vector<float> init(24, 0.5f);
  auto run = [&](bool node) {
    zmuon_engine* e = nullptr;
    const char* two = R"({"zmuon": {"ranks": 2}})";
    BOOST_REQUIRE((node ? zmuon_engine_create_node(nullptr, nullptr, 0, 1, 0, 2, "127.0.0.1:0", &e)
                        : zmuon_engine_create(two, nullptr, 0, &e))
                  == ZMUON_OK);
    BOOST_REQUIRE(zmuon_engine_add_parameter(e, "w", shape, 2, ZMUON_GROUP_AUTO, 0, init.data(), 24)
                  == ZMUON_OK);
    BOOST_REQUIRE(zmuon_engine_start(e) == ZMUON_OK);
    int32_t world = 0, first = -1;
    BOOST_TEST(zmuon_engine_world(e, &world) == ZMUON_OK);
    BOOST_TEST(zmuon_engine_first_rank(e, &first) == ZMUON_OK);
    BOOST_TEST(world == 2);
    BOOST_TEST(first == 0);
    std::vector<float> g(24);
    for (int step = 1; step <= 2; ++step) {
      for (int r = 0; r < 2; ++r) {
        for (size_t i = 0; i < g.size(); ++i)
          g[i] = std::sin(0.3f * float(i + 7 * r + 13 * step));
        zmuon_tensor t{"w", g.data(), 24, ZMUON_HOST};
        BOOST_REQUIRE(zmuon_engine_reduce(e, r, &t, 1) == ZMUON_OK);
      }
      BOOST_REQUIRE(zmuon_engine_step(e, nullptr) == ZMUON_OK);
    }
    double sums[2] = {1.5, -2.0};
    BOOST_TEST(zmuon_engine_sum_over_nodes(e, sums, 2) == ZMUON_OK);
    BOOST_TEST((sums[0] == 1.5 && sums[1] == -2.0));
    std::vector<float> w(24, NAN);
    zmuon_tensor out{"w", w.data(), 24, ZMUON_HOST};
    BOOST_REQUIRE(zmuon_engine_gather_params_on_stream(e, &out, 1, nullptr) == ZMUON_OK);
    zmuon_engine_destroy(e);
    return w;
  };
  const auto plain = run(false);
  const auto node = run(true);
  BOOST_TEST(node == plain);
  BOOST_TEST(plain != init);  // the steps moved it
}

// Bad JSON through the C ABI is ZMUON_INVALID_ARGUMENT naming what is wrong: deep nesting used
// to overflow the stack of the embedding process, a number out of a double's range came back as
// an internal error in nlohmann::json's words. A refused option leaves the old ones in place.
BOOST_AUTO_TEST_CASE(bad_json_is_an_invalid_argument_not_a_crash) {
  const auto says = [](const char* what) {
    return std::strstr(zmuon_last_error(), what) != nullptr;
  };
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  zmuon_engine* eng = nullptr;
  BOOST_TEST(zmuon_engine_create(deep.c_str(), nullptr, 0, &eng) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(says("the config is not valid JSON: nesting deeper than 100 levels at line 1, "
                  "column 101"),
             zmuon_last_error());
  BOOST_TEST(zmuon_engine_create(R"({"gradient_clipping": 1e309})", nullptr, 0, &eng)
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(says("the config is not valid JSON: number 1e309 is out of range at line 1, "
                  "column 23"),
             zmuon_last_error());
  const char* const sets[] = {"zmuon.timeout_ms=9300000000000"};
  BOOST_TEST(zmuon_engine_create(nullptr, sets, 1, &eng) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(says("zmuon.timeout_ms: expected an integer in [1, 2592000000], got 9300000000000"),
             zmuon_last_error());
  BOOST_TEST(zmuon_engine_create_from_file(".", nullptr, 0, &eng) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(says("config file '.' is a directory"), zmuon_last_error());
  BOOST_TEST(!eng);

  zmuon_orthogonalizer* ns = nullptr;
  BOOST_REQUIRE(zmuon_orthogonalizer_create("host", ZMUON_HOST, R"({"ns_steps": 5})", &ns)
                == ZMUON_OK);
  const std::string deep_options = R"({"ns_coefficients":)" + deep + "}";
  BOOST_TEST(zmuon_orthogonalizer_set_options(ns, deep_options.c_str()) == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(says("the Newton-Schulz options are not valid JSON: nesting deeper than 100 levels "
                  "at line 1, column 119"),
             zmuon_last_error());
  BOOST_TEST(zmuon_orthogonalizer_set_options(ns, R"({"ns_steps": 1e309})")
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(says("number 1e309 is out of range at line 1, column 14"), zmuon_last_error());
  BOOST_TEST(zmuon_orthogonalizer_set_options(ns, R"({"ns_steps": 1e9})")
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(says("ns_steps: expected an integer in [1, 100], got 1000000000.0"),
             zmuon_last_error());
  BOOST_TEST(zmuon_orthogonalizer_set_options(ns, R"({"ns_gram_restart": 1000})")
             == ZMUON_INVALID_ARGUMENT);
  BOOST_TEST(says("ns_gram_restart: expected an integer in [0, 100], got 1000"),
             zmuon_last_error());
  // The old options (5 steps) still run.
  std::vector<float> x = {1, 2, 3, 4, 5, 7};
  const int64_t shape[] = {2, 3};
  zmuon_array a{x.data(), ZMUON_FLOAT32, 2, shape, ZMUON_HOST};
  BOOST_TEST(zmuon_orthogonalize(ns, &a) == ZMUON_OK, zmuon_last_error());
  BOOST_TEST(std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); }));
  zmuon_orthogonalizer_destroy(ns);
}
