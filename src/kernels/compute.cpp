// make_compute_backend: picks a compute backend by name ("host", or "cuda" when built with it).

#include "kernels/compute.hpp"

#include <memory>
#include <string>
#include <vector>

#include "kernels/host/host_compute.hpp"

namespace zmuon {

#ifdef ZMUON_HAVE_CUDA
// Defined by the CUDA backend (kernels/cuda/); declared here so that this file needs none of its
// headers. Fails, with a message, when no usable GPU is present.
expected<std::unique_ptr<compute_backend>> make_cuda_compute_backend(int device);
int cuda_device_count();
std::vector<std::string> cuda_device_ids();
#endif

expected<std::unique_ptr<compute_backend>> make_compute_backend(const std::string& name) {
  return make_compute_backend(name, 0);
}

int compute_device_count(const std::string& name) {
#ifdef ZMUON_HAVE_CUDA
  if (name == "cuda")
    return cuda_device_count();
#endif
  return name == "host" ? 1 : 0;
}

std::vector<std::string> compute_device_ids(const std::string& name) {
#ifdef ZMUON_HAVE_CUDA
  if (name == "cuda")
    return cuda_device_ids();
#endif
  (void)name;
  return {};
}

expected<std::unique_ptr<compute_backend>> make_compute_backend(const std::string& name,
                                                                int device) {
  if (name == "host")
    return std::unique_ptr<compute_backend>(std::make_unique<host_compute>());
  if (name == "cuda") {
#ifdef ZMUON_HAVE_CUDA
    return make_cuda_compute_backend(device);
#else
    (void)device;
    return error(errc::invalid_argument,
                 "compute backend 'cuda' is not built in (configure with -DZMUON_CUDA=ON)");
#endif
  }
  return error(errc::invalid_argument,
               "unknown compute backend '" + name + "' (valid: host, cuda)");
}

}  // namespace zmuon
