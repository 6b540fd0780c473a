// Newton-Schulz on its own (zmuon/orthogonalize.hpp) through the C ABI (zmuon_orthogonalize) and
// the C++ API, on the host backend: results against an independent double-precision NS5
// (support/ns_accuracy.hpp) for square, wide, tall and batched matrices in fp32 and bf16, the
// options JSON against the same options set in C++, a NaN confined to its matrix, and wrong
// calls answered with a status and a message naming what is wrong. Links only libzmuon.
#define BOOST_TEST_MODULE orthogonalize
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/ns_variants.hpp"
#include "support/bf16_reference.hpp"
#include "support/ns_accuracy.hpp"
#include "zmuon/orthogonalize.hpp"
#include "zmuon/zmuon.h"

namespace {

using zmuon::ns_accuracy::ns5_reference;
using zmuon::test::reference_bf16;

/// fp32 NS on the host against the double reference, ||got - want||_F / ||want||_F, the worst
/// matrix of a batch. Measured (`./test_orthogonalize --log_level=message`, 2-core VM):
/// standard 1.19e-6..1.25e-6, gram (restart 3) up to 1.83e-6 (3x48x80); the bound is 10x that.
constexpr double kFp32Tolerance = 2e-5;
/// bf16 in and out against the double NS5 of the bf16 input: the output's rounding to bf16
/// (at most 2^-9 relative per element); measured 1.59e-3..1.67e-3, the bound is 3x that.
constexpr double kBf16Tolerance = 5e-3;

struct shape {
  int64_t batch, rows, cols;
  int ndim;  // 2: [rows, cols]; 3: [batch, rows, cols]
};

const std::vector<shape> kShapes = {
    {1, 64, 64, 2},  // square
    {1, 32, 96, 2},  // wide
    {1, 96, 32, 2},  // tall: orthogonalized as its transpose
    {3, 48, 80, 3},  // a batch of 3
};

std::string describe(const shape& s) {
  return std::to_string(s.batch) + "x" + std::to_string(s.rows) + "x" + std::to_string(s.cols);
}

float from_bf16(uint16_t b) {
  return zmuon::test::float_of_bits(uint32_t{b} << 16);
}

/// The reference of every matrix of the batch `x`, back to back.
std::vector<double> reference(const std::vector<float>& x, const shape& s, int steps = 5) {
  std::vector<double> out;
  const int64_t numel = s.rows * s.cols;
  for (int64_t k = 0; k < s.batch; ++k) {
    std::vector<double> g(x.begin() + k * numel, x.begin() + (k + 1) * numel);
    auto r = ns5_reference(g, s.rows, s.cols, steps);
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

/// Largest relative Frobenius distance over the batch's matrices.
template <class T>
double worst_distance(const std::vector<T>& got, const std::vector<double>& want, const shape& s) {
  double worst = 0;
  const int64_t numel = s.rows * s.cols;
  for (int64_t k = 0; k < s.batch; ++k) {
    double diff = 0, norm = 0;
    for (int64_t i = k * numel; i < (k + 1) * numel; ++i) {
      const double d = static_cast<double>(got[i]) - want[i];
      diff += d * d;
      norm += want[i] * want[i];
    }
    worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

/// Runs the C call on `data` with the options `json`; returns the status.
int c_call(const char* json, void* data, int32_t dtype, const shape& s) {
  zmuon_orthogonalizer* ns = nullptr;
  int st = zmuon_orthogonalizer_create("host", 0, json, &ns);
  BOOST_REQUIRE_MESSAGE(st == ZMUON_OK, zmuon_last_error());
  const int64_t dims3[3] = {s.batch, s.rows, s.cols};
  const int64_t* dims = s.ndim == 3 ? dims3 : dims3 + 1;
  zmuon_array x{data, dtype, s.ndim, dims, ZMUON_HOST};
  st = zmuon_orthogonalize(ns, &x);
  zmuon_orthogonalizer_destroy(ns);
  return st;
}

/// A wrong call's status and message.
struct outcome {
  int status;
  std::string message;
};

void expect(const outcome& o, int status, const std::string& names) {
  BOOST_TEST_MESSAGE("status " << o.status << ": " << o.message);
  BOOST_TEST(o.status == status);
  BOOST_TEST(o.message.find(names) != std::string::npos,
             "'" << o.message << "' should name '" << names << "'");
}

outcome created(const char* backend, int32_t device, const char* json) {
  zmuon_orthogonalizer* ns = nullptr;
  const int st = zmuon_orthogonalizer_create(backend, device, json, &ns);
  outcome o{st, st == ZMUON_OK ? "" : zmuon_last_error()};
  BOOST_TEST((st == ZMUON_OK) == (ns != nullptr));
  zmuon_orthogonalizer_destroy(ns);
  return o;
}

outcome called(zmuon_orthogonalizer* ns, void* data, int32_t dtype, int32_t ndim,
               const int64_t* dims, int32_t device = ZMUON_HOST) {
  zmuon_array x{data, dtype, ndim, dims, device};
  const int st = zmuon_orthogonalize(ns, &x);
  return {st, st == ZMUON_OK ? "" : zmuon_last_error()};
}

}  // namespace

BOOST_AUTO_TEST_CASE(fp32_matches_double_ns5_for_every_shape_and_variant) {
  for (const char* variant : {"standard", "gram", "auto"}) {
    const std::string json = std::string("{\"ns_variant\": \"") + variant + "\"}";
    for (const auto& s : kShapes) {
      auto x = zmuon::ns_accuracy::gaussian(static_cast<size_t>(s.batch * s.rows * s.cols), 11);
      const auto want = reference(x, s);
      BOOST_REQUIRE_EQUAL(c_call(json.c_str(), x.data(), ZMUON_FLOAT32, s), ZMUON_OK);
      const double d = worst_distance(x, want, s);
      BOOST_TEST_MESSAGE(variant << " " << describe(s) << ": relative distance to the double "
                                 << "NS5 " << d);
      BOOST_TEST(d < kFp32Tolerance, variant << " " << describe(s) << ": " << d);
    }
  }
}

BOOST_AUTO_TEST_CASE(bf16_matches_double_ns5_and_rounds_the_fp32_result) {
  for (const auto& s : kShapes) {
    const auto n = static_cast<size_t>(s.batch * s.rows * s.cols);
    const auto x = zmuon::ns_accuracy::gaussian(n, 12);
    std::vector<uint16_t> bits(n);
    std::vector<float> widened(n);
    for (size_t i = 0; i < n; ++i) {
      bits[i] = reference_bf16(x[i]);
      widened[i] = from_bf16(bits[i]);
    }
    const auto want = reference(widened, s);
    std::vector<float> fp32 = widened;
    BOOST_REQUIRE_EQUAL(c_call(nullptr, fp32.data(), ZMUON_FLOAT32, s), ZMUON_OK);
    BOOST_REQUIRE_EQUAL(c_call(nullptr, bits.data(), ZMUON_BFLOAT16, s), ZMUON_OK);
    std::vector<float> got(n);
    size_t unrounded = 0;  // bf16 results that are not the fp32 call's result rounded
    for (size_t i = 0; i < n; ++i) {
      got[i] = from_bf16(bits[i]);
      unrounded += bits[i] != reference_bf16(fp32[i]);
    }
    const double d = worst_distance(got, want, s);
    BOOST_TEST_MESSAGE("bf16 " << describe(s) << ": relative distance to the double NS5 " << d);
    BOOST_TEST(d < kBf16Tolerance, describe(s) << ": " << d);
    BOOST_TEST(unrounded == 0u, describe(s) << ": " << unrounded << " elements");
  }
}

BOOST_AUTO_TEST_CASE(options_json_equals_the_same_options_in_cpp) {
  const shape s{2, 40, 100, 3};
  const auto x = zmuon::ns_accuracy::gaussian(static_cast<size_t>(s.batch * s.rows * s.cols), 13);
  struct variant_case {
    const char* json;
    zmuon::ns_options ns;
  };
  zmuon::ns_options polar;
  polar.steps = 6;
  polar.schedule = zmuon::polar_express_schedule(6);
  polar.variant = zmuon::ns_variant::gram;
  polar.gram_restart = 2;
  zmuon::ns_options three;
  three.steps = 3;
  three.coefficients = {3.0f, -3.2f, 1.2f};
  const std::vector<variant_case> cases = {
      {"", zmuon::automatic_ns()},
      {R"({"ns_steps": 6, "ns_schedule": "polar_express", "ns_variant": "gram",
           "ns_gram_restart": 2})",
       polar},
      {R"({"ns_coefficients": [3.0, -3.2, 1.2], "ns_steps": 3, "ns_variant": "standard"})", three},
  };
  for (const auto& c : cases) {
    std::vector<float> from_c = x, from_cpp = x;
    BOOST_REQUIRE_EQUAL(c_call(c.json, from_c.data(), ZMUON_FLOAT32, s), ZMUON_OK);
    auto ortho = zmuon::orthogonalizer::create("host", 0, c.ns);
    BOOST_REQUIRE_MESSAGE(ortho, (ortho ? "" : ortho.err().to_string()));
    zmuon::matrix_batch batch{from_cpp.data(), zmuon::element_type::fp32, s.batch, s.rows, s.cols};
    auto err = ortho->run(batch);
    BOOST_REQUIRE_MESSAGE(!err, err.to_string());
    BOOST_TEST(std::memcmp(from_c.data(), from_cpp.data(), x.size() * sizeof(float)) == 0,
               "options " << c.json);
  }
  // The default is the engine's: the variant left to the backend (gram on the host).
  auto ortho = zmuon::orthogonalizer::create_from_json("host", 0, "");
  BOOST_REQUIRE(ortho);
  BOOST_TEST(static_cast<int>(ortho->options().variant)
             == static_cast<int>(zmuon::ns_variant::automatic));
  BOOST_TEST(ortho->options().steps == 5);
}

BOOST_AUTO_TEST_CASE(a_nan_makes_its_matrix_nan_and_leaves_the_others) {
  const shape s{3, 16, 24, 3};
  const auto x = zmuon::ns_accuracy::gaussian(static_cast<size_t>(s.batch * s.rows * s.cols), 14);
  std::vector<float> clean = x, poisoned = x;
  poisoned[s.rows * s.cols + 5] = std::nanf("");  // matrix 1
  BOOST_REQUIRE_EQUAL(c_call(nullptr, clean.data(), ZMUON_FLOAT32, s), ZMUON_OK);
  BOOST_REQUIRE_EQUAL(c_call(nullptr, poisoned.data(), ZMUON_FLOAT32, s), ZMUON_OK);
  const int64_t numel = s.rows * s.cols;
  size_t nan_in_1 = 0, differ_elsewhere = 0;
  for (int64_t i = 0; i < s.batch * numel; ++i) {
    if (i / numel == 1)
      nan_in_1 += std::isnan(poisoned[i]);
    else
      differ_elsewhere += std::memcmp(&poisoned[i], &clean[i], sizeof(float)) != 0;
  }
  BOOST_TEST(nan_in_1 == static_cast<size_t>(numel));
  BOOST_TEST(differ_elsewhere == 0u);
}

BOOST_AUTO_TEST_CASE(wrong_options_and_backends_are_named) {
  // The config's schema reads the options: a misspelled key names the nearest NS key.
  expect(created("host", 0, R"({"ns_step": 5})"), ZMUON_INVALID_ARGUMENT,
         "unknown key 'ns_step' (did you mean 'ns_steps'?)");
  expect(created("host", 0, R"({"momentum": 0.9})"), ZMUON_INVALID_ARGUMENT,
         "unknown key 'momentum' (valid keys: ns_steps, ns_coefficients");
  expect(created("host", 0, R"({"ns_variant": "gramm"})"), ZMUON_INVALID_ARGUMENT,
         "ns_variant: expected one of \"standard\", \"gram\", \"auto\", got string \"gramm\" "
         "(did you mean \"gram\"?)");
  expect(created("host", 0, R"({"ns_steps": 0})"), ZMUON_INVALID_ARGUMENT,
         "ns_steps: expected an integer in [1, 100], got 0");
  expect(created("host", 0, R"({"ns_steps": 3, "ns_schedule": [[1, 2, 3]]})"),
         ZMUON_INVALID_ARGUMENT, "ns_schedule: expected an array of 3 [a, b, c]");
  expect(created("host", 0, "{\"ns_steps\": 5,"), ZMUON_INVALID_ARGUMENT,
         "the Newton-Schulz options are not valid JSON");
  expect(created("host", 0, "[5]"), ZMUON_INVALID_ARGUMENT, "expected a JSON object of ns_steps");
  expect(created("cdua", 0, nullptr), ZMUON_INVALID_ARGUMENT,
         "unknown compute backend 'cdua' (valid: host, cuda)");
  expect(created("cuda", -2, nullptr), ZMUON_INVALID_ARGUMENT, "device -2");
  expect(created(nullptr, 0, nullptr), ZMUON_INVALID_ARGUMENT, "backend is NULL");
  // No GPU here (or no CUDA in the build): the backend says which.
  const outcome cuda = created("cuda", 0, nullptr);
  BOOST_TEST_MESSAGE("cuda backend: status " << cuda.status << " " << cuda.message);
  if (cuda.status != ZMUON_OK)
    BOOST_TEST(cuda.message.find("compute backend 'cuda'") != std::string::npos, cuda.message);

  // set_options: refused options leave the old ones.
  zmuon_orthogonalizer* ns = nullptr;
  BOOST_REQUIRE_EQUAL(zmuon_orthogonalizer_create("host", 0, R"({"ns_steps": 4})", &ns), ZMUON_OK);
  const int st = zmuon_orthogonalizer_set_options(ns, R"({"ns_gram_restrat": 2})");
  expect({st, zmuon_last_error()}, ZMUON_INVALID_ARGUMENT,
         "unknown key 'ns_gram_restrat' (did you mean 'ns_gram_restart'?)");
  const shape s{1, 8, 12, 2};
  auto a = zmuon::ns_accuracy::gaussian(96, 15), b = a;
  const int64_t dims[2] = {8, 12};
  BOOST_REQUIRE_EQUAL(called(ns, a.data(), ZMUON_FLOAT32, 2, dims).status, ZMUON_OK);
  BOOST_REQUIRE_EQUAL(c_call(R"({"ns_steps": 4})", b.data(), ZMUON_FLOAT32, s), ZMUON_OK);
  BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  zmuon_orthogonalizer_destroy(ns);
}

BOOST_AUTO_TEST_CASE(wrong_calls_are_named_and_change_nothing) {
  zmuon_orthogonalizer* ns = nullptr;
  BOOST_REQUIRE_EQUAL(zmuon_orthogonalizer_create("host", 0, nullptr, &ns), ZMUON_OK);
  std::vector<float> x(4 * 8 * 8, 1.5f);
  const std::vector<float> before = x;
  const int64_t dims[4] = {4, 8, 8, 1};
  const int64_t zero_rows[2] = {0, 8};
  const int64_t negative_batch[3] = {-1, 8, 8};
  expect(called(ns, x.data(), ZMUON_FLOAT32, 1, dims), ZMUON_INVALID_ARGUMENT,
         "x has 1 dimensions; Newton-Schulz takes [rows, cols] or [batch, rows, cols]");
  expect(called(ns, x.data(), ZMUON_FLOAT32, 4, dims), ZMUON_INVALID_ARGUMENT, "x has 4 dim");
  expect(called(ns, x.data(), ZMUON_FLOAT32, 2, zero_rows), ZMUON_INVALID_ARGUMENT,
         "batch, rows and cols must be >= 1, got batch 1, rows 0, cols 8");
  expect(called(ns, x.data(), ZMUON_FLOAT32, 3, negative_batch), ZMUON_INVALID_ARGUMENT,
         "got batch -1, rows 8, cols 8");
  expect(called(ns, nullptr, ZMUON_FLOAT32, 3, dims), ZMUON_INVALID_ARGUMENT,
         "data pointer is NULL");
  expect(called(ns, x.data(), ZMUON_FLOAT32, 3, nullptr), ZMUON_INVALID_ARGUMENT,
         "x->shape is NULL");
  expect(called(ns, x.data(), 7, 3, dims), ZMUON_INVALID_ARGUMENT,
         "x->dtype 7 is not ZMUON_FLOAT32 (0) or ZMUON_BFLOAT16 (1)");
  expect(called(ns, x.data(), ZMUON_FLOAT32, 3, dims, 0), ZMUON_UNSUPPORTED,
         "CUDA device buffer (device 0), which compute backend 'host' cannot read");
  expect(called(ns, x.data(), ZMUON_FLOAT32, 3, dims, -5), ZMUON_INVALID_ARGUMENT, "x->device -5");
  {
    const int st = zmuon_orthogonalize(ns, nullptr);
    expect({st, zmuon_last_error()}, ZMUON_INVALID_ARGUMENT, "x is NULL");
    zmuon_array arr{x.data(), ZMUON_FLOAT32, 3, dims, ZMUON_HOST};
    const int st2 = zmuon_orthogonalize(nullptr, &arr);
    expect({st2, zmuon_last_error()}, ZMUON_INVALID_ARGUMENT, "ns is NULL");
  }
  BOOST_TEST(std::memcmp(x.data(), before.data(), x.size() * sizeof(float)) == 0);
  // Still usable; the host backend ignores a stream.
  zmuon_array arr{x.data(), ZMUON_FLOAT32, 3, dims, ZMUON_HOST};
  BOOST_TEST(zmuon_orthogonalize_on_stream(ns, &arr, nullptr) == ZMUON_OK);
  BOOST_TEST(std::memcmp(x.data(), before.data(), x.size() * sizeof(float)) != 0);
  zmuon_orthogonalizer_destroy(ns);
}
