// GPU tests: random gradients for a parameter table in device memory, as the views reduce() takes.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "support/engine_fixture.hpp"

namespace zmuon::test {

/// Each parameter of `table` as a device buffer of random_values(numel, seed + its index), and
/// its view (device 0); freed with the object.
struct device_grads {
  device_grads(const std::vector<param_spec>& table, uint64_t seed) {
    for (const auto& p : table) {
      const auto v = random_values(numel(p), seed + data.size());
      float* d = nullptr;
      BOOST_REQUIRE(cudaMalloc(reinterpret_cast<void**>(&d), v.size() * sizeof(float))
                    == cudaSuccess);
      data.push_back(d);
      BOOST_REQUIRE(cudaMemcpy(d, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice)
                    == cudaSuccess);
      views.push_back({p.name, d, numel(p), memory_space::cuda, 0});
    }
  }
  device_grads(const device_grads&) = delete;
  device_grads& operator=(const device_grads&) = delete;
  ~device_grads() {
    for (float* d : data)
      cudaFree(d);
  }

  std::vector<float*> data;
  std::vector<tensor_view> views;
};

}  // namespace zmuon::test
