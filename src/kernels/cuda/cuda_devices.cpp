// The visible GPUs: how many, and which (their UUIDs), for compute_device_count /
// compute_device_ids (kernels/compute.cpp).
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

namespace zmuon {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::vector<std::string> cuda_device_ids() {
  std::vector<std::string> ids;
  for (int d = 0, n = cuda_device_count(); d < n; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    // nvidia-smi's form: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
    std::string id = "GPU-";
    for (int i = 0; i < 16; ++i) {
      char hex[3];
      std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(prop.uuid.bytes[i]));
      id += hex;
      if (i == 3 || i == 5 || i == 7 || i == 9)
        id += "-";
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace zmuon
