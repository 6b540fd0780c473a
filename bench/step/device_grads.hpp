// zmuon-bench-step --device-grads: one device copy of the table's gradients per GPU (at most one
// per rank), handed over by every rank on that GPU, freed with the object.
#pragma once

#include <string>
#include <vector>

#include "zmuon/status.hpp"
#include "zmuon/tensor.hpp"

namespace zmuon::bench {

class device_grads {
public:
  device_grads() = default;
  ~device_grads();
  device_grads(const device_grads&) = delete;
  device_grads& operator=(const device_grads&) = delete;

  /// Uploads `grads` to each of min(GPUs, world) devices. Errors: a build without CUDA, no
  /// device, a failed allocation or copy (naming the parameter).
  error upload(const tensor_map& grads, int world);

  /// The views rank `rank` hands over (its GPU's copy, rank mod the devices).
  const std::vector<tensor_view>& views_of(int rank) const {
    return views_[static_cast<size_t>(rank) % views_.size()];
  }

private:
  std::vector<std::vector<tensor_view>> views_;  // by device
  std::vector<float*> memory_;
};

}  // namespace zmuon::bench
