// A buffer that the compute backend works on and the comm backend moves (DESIGN.md §4, §5).
//
// When both live in the same memory (host compute with caf comm; CUDA compute with nccl comm) it
// is one buffer and the copies are no-ops. When the comm reads host memory but compute runs on a
// GPU (the caf comm with the CUDA backend: several ranks sharing one GPU), it is a device buffer
// plus a host mirror, and `to_comm` / `to_compute` copy between them.
#pragma once

#include <string>

#include "kernels/compute.hpp"

namespace zmuon {

/// Whether comm backend `comm` sends and receives host memory (caf) or device memory (nccl).
inline bool comm_on_host(const std::string& comm) {
  return comm != "nccl";
}

class staged_buffer {
public:
  staged_buffer() = default;
  /// n zero floats; mirrored in the backend's host memory (pinned on CUDA) when `comm_on_host`
  /// and the backend's memory is not host memory.
  staged_buffer(compute_backend& be, int64_t n, bool comm_on_host)
      : compute_(be.allocate(n)), staged_(comm_on_host && be.device_memory()) {
    if (staged_)
      host_ = be.allocate_host(n);
  }

  int64_t size() const { return compute_.size(); }
  /// True when the two sides are different memory (the copies below do something).
  bool staged() const { return staged_; }
  /// Where kernels read and write.
  float* compute() { return compute_.data(); }
  /// What the comm backend sends from and receives into.
  float* comm() { return staged_ ? host_.data() : compute_.data(); }

  /// Enqueues the copy compute -> comm; it has landed once be.when_done() fires.
  void to_comm(compute_backend& be) {
    if (staged_ && size() > 0)
      be.copy_to_host_async(host_.data(), compute_.data(), size());
  }
  /// Enqueues the copy comm -> compute, ahead of the kernels enqueued after it.
  void to_compute(compute_backend& be) {
    if (staged_ && size() > 0)
      be.copy_from_host_async(compute_.data(), host_.data(), size());
  }

private:
  device_buffer compute_;
  device_buffer host_;
  bool staged_ = false;
};

}  // namespace zmuon
