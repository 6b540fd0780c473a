// A buffer that the compute backend works on and the comm backend moves (DESIGN.md §4, §5).
//
// When both live in the same memory (host compute with caf comm; CUDA compute with nccl comm) it
// is one buffer and the copies are no-ops. When the comm reads host memory but compute runs on a
// GPU (the caf comm with the CUDA backend: several ranks sharing one GPU), it is a device buffer
// plus a host mirror, and `to_comm` / `to_compute` copy between them.
//
// A wire_buffer adds the element type a collective moves: the Muon phase's gather and scatter
// may carry bf16 (DESIGN.md §3), converted from and to the fp32 values the kernels work on.
#pragma once

#include <string>

#include "kernels/compute.hpp"
#include "messages/messages.hpp"

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

/// n fp32 values that kernels work on, moved by the comm backend as `type`. For fp32 the values
/// are what the comm moves (one staged_buffer, no conversion). For bf16 the comm moves a bf16
/// copy: to_wire rounds every element (to nearest even) and from_wire widens it back, for the
/// rank's own segments as for remote ones, so the result does not depend on the world size.
class wire_buffer {
public:
  wire_buffer() = default;
  /// n zero values; the comm's side in host memory when `comm_on_host` (staged_buffer).
  wire_buffer(compute_backend& be, int64_t n, wire_type type, bool comm_on_host)
      : type_(type), size_(n) {
    if (type == wire_type::fp32) {
      values_ = staged_buffer(be, n, comm_on_host);
    } else {
      values_ = staged_buffer(be, n, false);
      bits_ = staged_buffer(be, (n + 1) / 2, comm_on_host);  // two bf16 per float of storage
    }
  }

  int64_t size() const { return size_; }
  wire_type type() const { return type_; }
  /// True when the comm's side is a host mirror: to_wire has landed only once be.when_done fires.
  bool staged() const { return type_ == wire_type::fp32 ? values_.staged() : bits_.staged(); }
  /// The fp32 values, where kernels read and write.
  float* compute() { return values_.compute(); }
  /// Elements [offset, offset + n) on the comm's side, as a collective's segment of type().
  segment at(int64_t offset, int64_t n) {
    if (type_ == wire_type::fp32)
      return segment{values_.comm() + offset, n};
    return segment{nullptr, n, bits(bits_.comm()) + offset};
  }

  /// Enqueues compute -> comm (rounding to bf16 on the compute side first).
  void to_wire(compute_backend& be) {
    if (type_ == wire_type::bf16 && size_ > 0)
      be.to_bf16(bits(bits_.compute()), values_.compute(), size_);
    (type_ == wire_type::fp32 ? values_ : bits_).to_comm(be);
  }
  /// Enqueues comm -> compute (widening bf16 on the compute side), ahead of later kernels.
  void from_wire(compute_backend& be) {
    (type_ == wire_type::fp32 ? values_ : bits_).to_compute(be);
    if (type_ == wire_type::bf16 && size_ > 0)
      be.from_bf16(values_.compute(), bits(bits_.compute()), size_);
  }

private:
  static uint16_t* bits(float* storage) { return reinterpret_cast<uint16_t*>(storage); }

  wire_type type_ = wire_type::fp32;
  int64_t size_ = 0;
  staged_buffer values_;
  staged_buffer bits_;  // bf16 only
};

}  // namespace zmuon
