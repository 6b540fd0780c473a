// A buffer that the compute backend works on and the comm backend moves (DESIGN.md §4, §5).
//
// When both live in the same memory (host compute with caf comm; CUDA compute with nccl comm) it
// is one buffer and the copies are no-ops. When the comm reads host memory but compute runs on a
// GPU (the caf comm with the CUDA backend: several ranks sharing one GPU), it is a device buffer
// plus a host mirror, and `to_comm` / `to_compute` copy between them.
#pragma once

#include <string>
#include <vector>

#include "kernels/compute.hpp"

namespace zmuon {

/// Whether comm backend `comm` sends and receives host memory (caf) or device memory (nccl).
inline bool comm_on_host(const std::string& comm) {
  return comm != "nccl";
}

class staged_buffer {
public:
  staged_buffer() = default;
  /// n zero floats; mirrored on the host when `comm_on_host` and the backend's memory is not.
  staged_buffer(compute_backend& be, int64_t n, bool comm_on_host)
      : compute_(be.allocate(n)), staged_(comm_on_host && be.device_memory()) {
    if (staged_)
      host_.assign(n, 0.0f);
  }

  int64_t size() const { return compute_.size(); }
  /// Where kernels read and write.
  float* compute() { return compute_.data(); }
  /// What the comm backend sends from and receives into.
  float* comm() { return staged_ ? host_.data() : compute_.data(); }

  /// Makes the comm side hold what the compute side holds (waits for the backend's queued work).
  void to_comm(compute_backend& be) {
    if (staged_ && size() > 0)
      be.copy_to_host(host_.data(), compute_.data(), size());
  }
  /// Makes the compute side hold what the comm side received.
  void to_compute(compute_backend& be) {
    if (staged_ && size() > 0)
      be.copy_from_host(compute_.data(), host_.data(), size());
  }

private:
  device_buffer compute_;
  std::vector<float> host_;
  bool staged_ = false;
};

}  // namespace zmuon
