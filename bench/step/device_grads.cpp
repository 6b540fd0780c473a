#include "bench/step/device_grads.hpp"

#ifdef ZMUON_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>

namespace zmuon::bench {

device_grads::~device_grads() {
#ifdef ZMUON_HAVE_CUDA
  for (float* p : memory_)
    (void)cudaFree(p);
#endif
}

error device_grads::upload(const tensor_map& grads, int world) {
#ifdef ZMUON_HAVE_CUDA
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    return {errc::invalid_argument, "--device-grads: no CUDA device"};
  views_.resize(static_cast<size_t>(std::min(devices, world)));
  for (size_t d = 0; d < views_.size(); ++d) {
    (void)cudaSetDevice(static_cast<int>(d));
    for (const auto& [name, values] : grads) {
      float* p = nullptr;
      const size_t bytes = values.size() * sizeof(float);
      if (cudaMalloc(reinterpret_cast<void**>(&p), bytes) != cudaSuccess)
        return {errc::device_failure, "--device-grads: cannot allocate '" + name + "'"};
      memory_.push_back(p);
      if (cudaMemcpy(p, values.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        return {errc::device_failure, "--device-grads: cannot upload '" + name + "'"};
      views_[d].push_back(tensor_view{name, p, static_cast<int64_t>(values.size()),
                                      memory_space::cuda, static_cast<int>(d)});
    }
  }
  return {};
#else
  (void)grads;
  (void)world;
  return {errc::invalid_argument, "--device-grads needs a build with CUDA"};
#endif
}

}  // namespace zmuon::bench
