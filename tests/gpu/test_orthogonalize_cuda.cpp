// zmuon::orthogonalizer on the cuda backend (label gpu): device matrices in fp32 and bf16 against
// the host backend's fp32 Newton-Schulz, returned synchronized and ordered on a caller's stream;
// host memory, another GPU's memory and a bad stream are refused by name. Without a usable GPU
// the executable exits with 77 (ctest: Skipped).
//
// Tolerance: the CUDA NS runs its GEMMs on bf16 operands; one NS5 differs from the host's fp32 by
// about 1-1.5e-2 relative (test_cuda_newton_schulz), the bound is cuda_test_env.hpp's kNs5ToHost.
#define BOOST_TEST_MODULE test_orthogonalize_cuda
#define BOOST_TEST_NO_MAIN
#define BOOST_TEST_ALTERNATIVE_INIT_API
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "support/bf16_reference.hpp"
#include "support/ns_accuracy.hpp"
#include "zmuon/orthogonalize.hpp"

namespace {

constexpr double kNs5ToHost = 3e-2;  // as support/cuda_test_env.hpp

struct shape {
  int64_t batch, rows, cols;
};
const std::vector<shape> kShapes = {{1, 256, 256}, {1, 128, 512}, {1, 512, 128}, {4, 96, 160}};

/// A device buffer of `bytes`, freed with the object.
struct device_memory {
  explicit device_memory(size_t bytes) { BOOST_REQUIRE(cudaMalloc(&data, bytes) == cudaSuccess); }
  device_memory(const device_memory&) = delete;
  device_memory& operator=(const device_memory&) = delete;
  ~device_memory() { cudaFree(data); }
  void* data = nullptr;
};

zmuon::orthogonalizer make(const std::string& backend) {
  auto o = zmuon::orthogonalizer::create(backend, 0);
  BOOST_REQUIRE_MESSAGE(o, (o ? "" : o.err().to_string()));
  return std::move(*o);
}

/// The host backend's fp32 result for x.
std::vector<float> on_host(std::vector<float> x, const shape& s) {
  auto host = make("host");
  auto err = host.run({x.data(), zmuon::element_type::fp32, s.batch, s.rows, s.cols});
  BOOST_REQUIRE_MESSAGE(!err, err.to_string());
  return x;
}

double worst_distance(const std::vector<float>& got, const std::vector<float>& want,
                      const shape& s) {
  double worst = 0;
  const int64_t numel = s.rows * s.cols;
  for (int64_t k = 0; k < s.batch; ++k) {
    double diff = 0, norm = 0;
    for (int64_t i = k * numel; i < (k + 1) * numel; ++i) {
      diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
      norm += static_cast<double>(want[i]) * want[i];
    }
    worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

std::string describe(const shape& s) {
  return std::to_string(s.batch) + "x" + std::to_string(s.rows) + "x" + std::to_string(s.cols);
}

}  // namespace

BOOST_AUTO_TEST_CASE(fp32_device_matrices_match_the_host) {
  auto gpu = make("cuda");
  for (const auto& s : kShapes) {
    const auto x = zmuon::ns_accuracy::gaussian(static_cast<size_t>(s.batch * s.rows * s.cols), 21);
    const auto want = on_host(x, s);
    device_memory d(x.size() * sizeof(float));
    BOOST_REQUIRE(cudaMemcpy(d.data, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice)
                  == cudaSuccess);
    auto err = gpu.run(
        {d.data, zmuon::element_type::fp32, s.batch, s.rows, s.cols, zmuon::memory_space::cuda, 0});
    BOOST_REQUIRE_MESSAGE(!err, err.to_string());
    std::vector<float> got(x.size());
    BOOST_REQUIRE(cudaMemcpy(got.data(), d.data, got.size() * sizeof(float), cudaMemcpyDeviceToHost)
                  == cudaSuccess);
    const double dist = worst_distance(got, want, s);
    BOOST_TEST_MESSAGE("fp32 " << describe(s) << ": relative distance to the host " << dist);
    BOOST_TEST(dist < kNs5ToHost, describe(s) << ": " << dist);
    BOOST_TEST(dist > 0.0, describe(s) << ": equal bits, the GPU never ran?");
  }
}

BOOST_AUTO_TEST_CASE(bf16_on_a_callers_stream_matches_the_host) {
  auto gpu = make("cuda");
  cudaStream_t stream = nullptr;
  BOOST_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  for (const auto& s : kShapes) {
    const auto n = static_cast<size_t>(s.batch * s.rows * s.cols);
    const auto x = zmuon::ns_accuracy::gaussian(n, 22);
    std::vector<uint16_t> bits(n);
    std::vector<float> widened(n);
    for (size_t i = 0; i < n; ++i) {
      bits[i] = zmuon::test::reference_bf16(x[i]);
      widened[i] = zmuon::test::float_of_bits(uint32_t{bits[i]} << 16);
    }
    const auto want = on_host(widened, s);
    device_memory d(n * sizeof(uint16_t));
    BOOST_REQUIRE(cudaMemset(d.data, 0, n * sizeof(uint16_t)) == cudaSuccess);
    // Copy in, orthogonalize and copy out on the caller's stream, with no wait in between: an
    // NS that ran before the copy landed would orthogonalize zeros.
    BOOST_REQUIRE(
        cudaMemcpyAsync(d.data, bits.data(), n * sizeof(uint16_t), cudaMemcpyHostToDevice, stream)
        == cudaSuccess);
    auto err = gpu.run(
        {d.data, zmuon::element_type::bf16, s.batch, s.rows, s.cols, zmuon::memory_space::cuda, 0},
        stream);
    BOOST_REQUIRE_MESSAGE(!err, err.to_string());
    std::vector<uint16_t> out(n);
    BOOST_REQUIRE(
        cudaMemcpyAsync(out.data(), d.data, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream)
        == cudaSuccess);
    BOOST_REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    std::vector<float> got(n);
    for (size_t i = 0; i < n; ++i)
      got[i] = zmuon::test::float_of_bits(uint32_t{out[i]} << 16);
    const double dist = worst_distance(got, want, s);
    BOOST_TEST_MESSAGE("bf16 on a stream " << describe(s) << ": relative distance to the host "
                                           << dist);
    BOOST_TEST(dist < kNs5ToHost, describe(s) << ": " << dist);
  }
  cudaStreamDestroy(stream);
}

BOOST_AUTO_TEST_CASE(memory_the_gpu_cannot_use_is_refused_by_name) {
  auto gpu = make("cuda");
  std::vector<float> host(64 * 64, 1.0f);
  auto err = gpu.run({host.data(), zmuon::element_type::fp32, 1, 64, 64});
  BOOST_TEST_MESSAGE(err.to_string());
  BOOST_TEST((err.code() == zmuon::errc::unsupported));
  BOOST_TEST(err.message().find("host memory") != std::string::npos);
  device_memory d(64 * 64 * sizeof(float));
  err = gpu.run({d.data, zmuon::element_type::fp32, 1, 64, 64, zmuon::memory_space::cuda, 1});
  BOOST_TEST_MESSAGE(err.to_string());
  BOOST_TEST((err.code() == zmuon::errc::invalid_argument));
  BOOST_TEST(err.message().find("on GPU 1") != std::string::npos);
  // Still usable.
  BOOST_TEST(
      !gpu.run({d.data, zmuon::element_type::fp32, 1, 64, 64, zmuon::memory_space::cuda, 0}));
}

/// Exits with 77 (ctest's SKIP_RETURN_CODE) when the CUDA backend cannot start here.
int main(int argc, char* argv[]) {
  auto gpu = zmuon::orthogonalizer::create("cuda", 0);
  if (!gpu) {
    std::cout << "test_orthogonalize_cuda: SKIPPED, no usable GPU: " << gpu.err().to_string()
              << std::endl;
    return 77;
  }
  return boost::unit_test::unit_test_main(&init_unit_test, argc, argv);
}
