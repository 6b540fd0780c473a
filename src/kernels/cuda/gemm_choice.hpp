// Which GEMM engine runs Newton-Schulz's symmetric products on a device, from the device's compute
// capability alone. Plain C++ (no CUDA headers), so that a unit test can ask for any device.
//
// The own Hopper GEMM (sm90/sm90_gemm.hpp) is compiled for sm_90a only: wgmma and the tensor
// memory accelerator exist there, and sm_90a code runs on compute capability 9.0 and nowhere
// else (not on 10.x or 12.x). Every other device runs all of NS on cuBLAS(Lt), whose kernels
// cover every architecture the fat binary does (cmake/cuda.cmake).
#pragma once

#include <cstdint>

namespace zmuon::gpu {

/// A device's compute capability (cudaDeviceProp::major and ::minor).
struct device_capability {
  int major = 0;
  int minor = 0;
};

enum class symmetric_gemm : uint8_t {
  cublas,     // every tile of the product on cuBLAS(Lt)
  own_sm90a,  // the upper tiles on zmuon's own kernel, where it measured faster
};

/// The engine for a device of capability `c`.
constexpr symmetric_gemm symmetric_gemm_for(device_capability c) {
  return c.major == 9 && c.minor == 0 ? symmetric_gemm::own_sm90a : symmetric_gemm::cublas;
}

}  // namespace zmuon::gpu
